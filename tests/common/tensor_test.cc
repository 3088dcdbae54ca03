#include "common/tensor.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/half.h"

namespace kvctl {
namespace {

TEST_CASE("KvTensorView: strided rows and dtype conversion", "[common]") {
  // [H=2, T=3, D=4] storage viewed as [T, H, D].
  std::vector<uint16_t> data(2 * 3 * 4);
  for (size_t i = 0; i < data.size(); ++i) data[i] = FloatToHalf(static_cast<float>(i));
  KvTensorView v{data.data(), DType::kF16, 3, 2, 4, /*token_stride=*/4, /*head_stride=*/12};
  REQUIRE(v.Validate("k").ok());
  float row[4];
  v.LoadRow(2, 1, row);
  CHECK(row[0] == 20.0f);
  CHECK(row[3] == 23.0f);
  KvTensorView tail = v.Tokens(1, 2);
  tail.LoadRow(0, 0, row);
  CHECK(row[0] == 4.0f);
}

TEST_CASE("KvTensorView: validation names the problem", "[common]") {
  float x[8] = {};
  KvTensorView v = KvTensorView::Contiguous(x, DType::kF32, 2, 1, 0);
  Status s = v.Validate("k");
  CHECK(s.message() == "k: head_dim must be > 0, got 0");
  v = KvTensorView::Contiguous(nullptr, DType::kF32, 2, 1, 4);
  CHECK(v.Validate("v").message() == "v: data pointer is null");
  v = KvTensorView{x, DType::kF32, 2, 2, 4, 2, 4};
  CHECK(v.Validate("q").code() == StatusCode::kInvalidArgument);
}

TEST_CASE("KvTensorView: CheckFinite finds the first bad element", "[common]") {
  std::vector<float> x(2 * 2 * 4, 1.0f);
  x[1 * 8 + 1 * 4 + 2] = std::nanf("");
  KvTensorView v = KvTensorView::Contiguous(x.data(), DType::kF32, 2, 2, 4);
  Status s = v.CheckFinite("k");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("token 1, head 1, channel 2") != std::string::npos);
  CHECK(ParseDType("bf16").value() == DType::kBF16);
  CHECK(ParseDType("int8").status().message().find("int8") != std::string::npos);
}

TEST_CASE("KvTensorView: RowOutside tests bits at the edges of each dtype", "[common]") {
  // One row of 8 elements; element 5 is set to each case. Expected: (finite test, fp16 range).
  struct Case {
    DType dtype;
    uint32_t bits;  // fp32 bits, or fp16/bf16 bits in the low half.
    bool bad_finite, bad_half;
  };
  const Case cases[] = {
      {DType::kF32, 0x477fe000u, false, false},  // 65504: fp16's largest.
      {DType::kF32, 0xc77fe000u, false, false},  // -65504.
      {DType::kF32, 0x477fe001u, false, true},   // The next float above it.
      {DType::kF32, 0x7f7fffffu, false, true},   // FLT_MAX.
      {DType::kF32, 0x7f800000u, true, true},    // +inf.
      {DType::kF32, 0xff800000u, true, true},    // -inf.
      {DType::kF32, 0x7fc00000u, true, true},    // NaN.
      {DType::kF32, 0x00000001u, false, false},  // Smallest subnormal.
      {DType::kF16, 0x7bffu, false, false},      // 65504.
      {DType::kF16, 0xfbffu, false, false},      // -65504.
      {DType::kF16, 0x7c00u, true, true},        // +inf.
      {DType::kF16, 0xfe00u, true, true},        // NaN.
      {DType::kBF16, 0x477fu, false, false},     // 65280, below 65504.
      {DType::kBF16, 0x4780u, false, true},      // 65536, above it.
      {DType::kBF16, 0xc780u, false, true},      // -65536.
      {DType::kBF16, 0x7f7fu, false, true},      // Largest finite bf16.
      {DType::kBF16, 0x7f80u, true, true},       // +inf.
      {DType::kBF16, 0x7fc1u, true, true},       // NaN.
  };
  for (const Case& c : cases) {
    INFO("dtype " << DTypeName(c.dtype) << " bits 0x" << std::hex << c.bits);
    std::vector<uint8_t> row(8 * DTypeSize(c.dtype), 0);
    std::memcpy(row.data() + 5 * DTypeSize(c.dtype), &c.bits, DTypeSize(c.dtype));
    const KvTensorView v = KvTensorView::Contiguous(row.data(), c.dtype, 1, 1, 8);
    CHECK(v.RowOutside(0, 0, /*half_range=*/false) == c.bad_finite);
    CHECK(v.RowOutside(0, 0, /*half_range=*/true) == c.bad_half);
    CHECK(v.CheckFinite("k").ok() == !c.bad_finite);
  }
}

}  // namespace
}  // namespace kvctl
