// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/npy.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/half.h"
#include "tests/tools/tools_test_util.h"

namespace kvctl {
namespace {

using Catch::Matchers::Contains;
using testing::TempDir;

// An .npy image with the given version and raw header text (padded by the caller or not).
std::string Image(int major, const std::string& header, const std::string& payload) {
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  const size_t width = major == 1 ? 2 : 4;
  for (size_t i = 0; i < width; ++i) out.push_back(static_cast<char>(header.size() >> (8 * i)));
  return out + header + payload;
}

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string ErrorOf(const std::string& bytes) {
  StatusOr<NpyArray> a = ParseNpy(bytes, "x.npy");
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().code() == StatusCode::kInvalidArgument);
  return a.status().message();
}

TEST_CASE("Npy: writer produces numpy's exact header", "[tools]") {
  const std::vector<float> data = {1, 2, 3, 4, 5, 6};
  StatusOr<std::string> img = EncodeNpy({2, 3}, data.data());
  REQUIRE(img.ok());
  // np.save(np.zeros((2, 3), np.float32)) writes version 1.0 and header_len 118 (0x76): 10 bytes
  // of preamble + 118 = 128, a multiple of 64.
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  REQUIRE(img->size() == 128 + 24);
  CHECK(img->substr(0, 10) == std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  CHECK(img->substr(10, dict.size()) == dict);
  CHECK(img->substr(10 + dict.size(), 118 - dict.size() - 1) ==
        std::string(118 - dict.size() - 1, ' '));
  CHECK((*img)[127] == '\n');
  CHECK(img->substr(128) == Floats(data));
  // One-dimensional and 0-d shapes are Python tuples: "(5,)" and "()".
  CHECK_THAT(*EncodeNpy({5}, data.data()), Contains("'shape': (5,), }"));
  CHECK_THAT(*EncodeNpy({}, data.data()), Contains("'shape': (), }"));
  // Version 2.0 and 3.0 use a 4-byte length; the total stays 64-aligned.
  for (int version : {2, 3}) {
    StatusOr<std::string> v = EncodeNpy({2, 3}, data.data(), NpyDType::kF32, version);
    REQUIRE(v.ok());
    CHECK((*v)[6] == static_cast<char>(version));
    CHECK((v->size() - 24) % 64 == 0);
  }
  CHECK_FALSE(EncodeNpy({2, -1}, data.data()).ok());
  CHECK_FALSE(EncodeNpy({2}, data.data(), NpyDType::kF32, 4).ok());
}

TEST_CASE("Npy: round trip f4, f2, f8 over versions and shapes", "[tools]") {
  const std::vector<float> values = {0.0f, -1.5f, 3.14159f, 65504.0f, 1e-7f, -2.0e5f, 0.333f, 7.0f};
  const std::vector<std::vector<int64_t>> shapes = {{2, 2, 2}, {8}, {}, {0, 3}, {1, 8, 1}};
  for (NpyDType dtype : {NpyDType::kF32, NpyDType::kF16, NpyDType::kF64}) {
    for (int version : {1, 2, 3}) {
      for (const std::vector<int64_t>& shape : shapes) {
        StatusOr<std::string> img = EncodeNpy(shape, values.data(), dtype, version);
        REQUIRE(img.ok());
        StatusOr<NpyArray> a = ParseNpy(*img, "rt.npy");
        REQUIRE(a.ok());
        CHECK(a->shape == shape);
        CHECK(a->dtype == dtype);
        REQUIRE(static_cast<int64_t>(a->data.size()) == a->ElementCount());
        for (size_t i = 0; i < a->data.size(); ++i) {
          const float want = dtype == NpyDType::kF16 ? RoundToHalf(values[i]) : values[i];
          CHECK(a->data[i] == want);
        }
      }
    }
  }
}

TEST_CASE("Npy: f2 payload decodes exact bit patterns", "[tools]") {
  // 1.0, -2.0, smallest subnormal 2^-24, 65504, +inf.
  const uint16_t halves[] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x7C00};
  std::string payload(reinterpret_cast<const char*>(halves), sizeof(halves));
  std::string header = "{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }\n";
  StatusOr<NpyArray> a = ParseNpy(Image(1, header, payload), "h.npy");
  REQUIRE(a.ok());
  CHECK(a->data[0] == 1.0f);
  CHECK(a->data[1] == -2.0f);
  CHECK(a->data[2] == std::ldexp(1.0f, -24));
  CHECK(a->data[3] == 65504.0f);
  CHECK(std::isinf(a->data[4]));
}

TEST_CASE("Npy: hand-built headers in other spellings parse", "[tools]") {
  const std::string payload = Floats({1, 2, 3, 4, 5, 6});
  // Double quotes, keys reordered, no trailing comma, no padding, no newline.
  StatusOr<NpyArray> a = ParseNpy(
      Image(1, R"({"shape": (3, 2), "fortran_order": False, "descr": "<f4"})", payload), "a.npy");
  REQUIRE(a.ok());
  CHECK(a->shape == std::vector<int64_t>{3, 2});
  CHECK(a->data[5] == 6.0f);
  // Python 2 numpy wrote long integers with an L suffix; version 2.0 length field.
  a = ParseNpy(Image(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (6L,), }  \n", payload),
               "b.npy");
  REQUIRE(a.ok());
  CHECK(a->shape == std::vector<int64_t>{6});
  // Version 3.0 (utf8 header) with spaces inside the tuple.
  a = ParseNpy(Image(3, "{'descr':'<f4','fortran_order':False,'shape':( 1 , 6 )}\n", payload),
               "c.npy");
  REQUIRE(a.ok());
  CHECK(a->shape == std::vector<int64_t>{1, 6});
}

TEST_CASE("Npy: malformed files give errors naming file, field and value", "[tools]") {
  const std::string ok_header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
  const std::string payload = Floats({1, 2});
  REQUIRE(ParseNpy(Image(1, ok_header, payload), "x.npy").ok());

  CHECK_THAT(ErrorOf("PK\x03\x04 zip file"), Contains("x.npy: magic"));
  CHECK_THAT(ErrorOf(""), Contains("magic"));
  CHECK_THAT(ErrorOf(std::string("\x93NUMPY", 6)), Contains("version"));
  std::string v4 = Image(1, ok_header, payload);
  v4[6] = 4;
  CHECK_THAT(ErrorOf(v4), Contains("version: got 4.0, expected 1.0, 2.0 or 3.0"));
  CHECK_THAT(ErrorOf(Image(1, ok_header, payload).substr(0, 9)), Contains("header_len"));
  CHECK_THAT(ErrorOf(Image(1, ok_header, payload).substr(0, 40)),
             Contains("header: file truncated"));
  std::string huge = Image(2, ok_header, payload);
  huge[8] = huge[9] = huge[10] = huge[11] = '\x7f';
  CHECK_THAT(ErrorOf(huge), Contains("header_len: got"));

  CHECK_THAT(ErrorOf(Image(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", payload)),
             Contains("x.npy: fortran_order: got True, expected False"));
  CHECK_THAT(
      ErrorOf(Image(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", payload)),
      Contains("x.npy: descr: got '<i4', expected one of '<f4', '<f2', '<f8'"));
  CHECK_THAT(
      ErrorOf(Image(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", payload)),
      Contains("descr: got '>f4'"));
  CHECK_THAT(ErrorOf(Image(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}",
                           payload)),
             Contains("structured dtypes are not supported"));
  CHECK_THAT(ErrorOf(Image(1, "{'descr': '<f4', 'fortran_order': False}", payload)),
             Contains("shape: missing"));
  CHECK_THAT(ErrorOf(Image(1, "{'descr': '<f4', 'shape': (2,)}", payload)),
             Contains("fortran_order: missing"));
  CHECK_THAT(
      ErrorOf(Image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", payload)),
      Contains("unexpected key 'x'"));
  CHECK_THAT(ErrorOf(Image(1,
                           "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                           "'shape': (2,)}",
                           payload)),
             Contains("duplicate key 'descr'"));
  CHECK_THAT(ErrorOf(Image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", payload)),
             Contains("shape: got a negative dimension"));
  CHECK_THAT(ErrorOf(Image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", payload)),
             Contains("shape: got '[2]', expected a tuple"));
  CHECK_THAT(
      ErrorOf(Image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x)}", payload)),
      Contains("expected an integer dimension"));
  CHECK_THAT(ErrorOf(Image(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", payload)),
             Contains("header"));
  CHECK_THAT(ErrorOf(Image(1, "{'descr': '<f4', 'fortran_order': Nope, 'shape': (2,)}", payload)),
             Contains("fortran_order: got 'Nope', expected True or False"));
  CHECK_THAT(
      ErrorOf(Image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", payload)),
      Contains("unexpected text after the header dict"));
  CHECK_THAT(ErrorOf(Image(1, "'descr': '<f4'", payload)), Contains("expected '{'"));
  CHECK_THAT(ErrorOf(Image(1,
                           "{'descr': '<f4', 'fortran_order': False, 'shape': "
                           "(100000000, 100000000, 100000000)}",
                           payload)),
             Contains("shape: got (100000000, 100000000, 100000000), expected at most"));

  // Data shorter or longer than the shape says.
  CHECK_THAT(ErrorOf(Image(1, ok_header, payload.substr(0, 7))),
             Contains("x.npy: data: got 7 bytes, expected 8 for shape (2,) of '<f4' (file "
                      "truncated)"));
  CHECK_THAT(ErrorOf(Image(1, ok_header, payload + "xx")), Contains("(trailing bytes)"));
}

TEST_CASE("Npy: files on disk: write, read, missing, directory, shape check", "[tools]") {
  TempDir dir;
  const std::string path = dir.Path("a.npy");
  const std::vector<float> data = {1, 2, 3, 4, 5, 6};
  REQUIRE(WriteNpy(path, {1, 2, 3}, data.data(), NpyDType::kF16).ok());
  StatusOr<NpyArray> a = ReadNpy(path);
  REQUIRE(a.ok());
  CHECK(a->dtype == NpyDType::kF16);
  CHECK(a->data == data);
  CHECK(ExpectNpyShape(*a, path, {1, -1, 3}).ok());
  const Status bad = ExpectNpyShape(*a, path, {1, 2, 128});
  CHECK_THAT(bad.message(), Contains(path + ": shape: got (1, 2, 3), expected (1, 2, 128)"));
  CHECK_FALSE(ExpectNpyShape(*a, path, {1, 2}).ok());
  CHECK(FormatNpyShape({-1, 8}) == "(*, 8)");

  StatusOr<NpyArray> missing = ReadNpy(dir.Path("nope.npy"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Contains("nope.npy: no such file"));
  StatusOr<NpyArray> directory = ReadNpy(dir.Path(""));
  REQUIRE_FALSE(directory.ok());
  CHECK_THAT(directory.status().message(), Contains("not a regular file"));
  CHECK_FALSE(WriteNpy(dir.Path("no/such/dir/a.npy"), {1}, data.data()).ok());

  // A truncated file on disk is reported with its path.
  {
    std::ofstream out(dir.Path("cut.npy"), std::ios::binary);
    const std::string img = *EncodeNpy({6}, data.data());
    out.write(img.data(), static_cast<std::streamsize>(img.size() - 3));
  }
  StatusOr<NpyArray> cut = ReadNpy(dir.Path("cut.npy"));
  REQUIRE_FALSE(cut.ok());
  CHECK_THAT(cut.status().message(), Contains("cut.npy: data: got 21 bytes, expected 24"));
}

}  // namespace
}  // namespace kvctl
