// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/npy.h"

#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/file_util.h"
#include "common/half.h"

namespace kvctl {
namespace {

// We memcpy little-endian payloads straight into floats.
static_assert(std::endian::native == std::endian::little, "npy.cc assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// No real K/V dump needs a header this large; the cap keeps a corrupt length from allocating.
constexpr uint32_t kMaxHeaderLen = 1u << 20;
// 2^40 elements: far above any K/V dump, far below int64 overflow once multiplied by 8 bytes.
constexpr int64_t kMaxElements = int64_t{1} << 40;

size_t ItemSize(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kF32:
      return 4;
    case NpyDType::kF16:
      return 2;
    case NpyDType::kF64:
      return 8;
  }
  return 4;
}

// The header is a Python dict literal with exactly the keys descr, fortran_order and shape, e.g.
// "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }". This is a strict parser of the
// subset numpy writes (plus either quote style and Python 2's "3L" integers).
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view name) : s_(text), name_(name) {}

  Status Parse(std::string* descr, bool* fortran_order, std::vector<int64_t>* shape) {
    SkipSpace();
    if (!Eat('{')) return Error("expected '{' to open the header dict");
    bool have_descr = false, have_order = false, have_shape = false;
    SkipSpace();
    while (!Peek('}')) {
      std::string key;
      KVCTL_RETURN_IF_ERROR(ParseString(&key, "a quoted key"));
      SkipSpace();
      if (!Eat(':')) return Error("expected ':' after key '", key, "'");
      SkipSpace();
      if (key == "descr") {
        if (have_descr) return Error("duplicate key 'descr'");
        have_descr = true;
        if (!Peek('\'') && !Peek('"')) {
          return Field("descr",
                       "got a non-string value, expected a simple dtype such as '<f4' "
                       "(structured dtypes are not supported)");
        }
        KVCTL_RETURN_IF_ERROR(ParseString(descr, "a quoted dtype"));
      } else if (key == "fortran_order") {
        if (have_order) return Error("duplicate key 'fortran_order'");
        have_order = true;
        if (EatWord("True")) {
          *fortran_order = true;
        } else if (EatWord("False")) {
          *fortran_order = false;
        } else {
          return Field("fortran_order", "got '", Token(), "', expected True or False");
        }
      } else if (key == "shape") {
        if (have_shape) return Error("duplicate key 'shape'");
        have_shape = true;
        KVCTL_RETURN_IF_ERROR(ParseShape(shape));
      } else {
        return Error("unexpected key '", key, "', expected only descr, fortran_order, shape");
      }
      SkipSpace();
      if (Eat(',')) {
        SkipSpace();
      } else if (!Peek('}')) {
        return Error("expected ',' or '}' after the value of '", key, "'");
      }
    }
    Eat('}');
    SkipSpace();
    if (pos_ != s_.size()) return Error("unexpected text after the header dict");
    if (!have_descr) return Field("descr", "missing from the header dict");
    if (!have_order) return Field("fortran_order", "missing from the header dict");
    if (!have_shape) return Field("shape", "missing from the header dict");
    return OkStatus();
  }

 private:
  template <typename... Args>
  Status Error(const Args&... args) const {
    return InvalidArgument(name_, ": header: ", args..., " (at offset ", pos_, " of \"", s_, "\")");
  }
  template <typename... Args>
  Status Field(std::string_view field, const Args&... args) const {
    return InvalidArgument(name_, ": ", field, ": ", args...);
  }

  bool Peek(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool Eat(char c) {
    if (!Peek(c)) return false;
    ++pos_;
    return true;
  }
  bool EatWord(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    const size_t end = pos_ + w.size();
    if (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_')) {
      return false;
    }
    pos_ = end;
    return true;
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  // The next few characters, for messages.
  std::string Token() const {
    size_t end = pos_;
    while (end < s_.size() && end - pos_ < 16 && s_[end] != ',' && s_[end] != '}') ++end;
    return std::string(s_.substr(pos_, end - pos_));
  }

  Status ParseString(std::string* out, std::string_view what) {
    if (!Peek('\'') && !Peek('"')) return Error("expected ", what);
    const char quote = s_[pos_++];
    const size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) return Error("unterminated string");
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return OkStatus();
  }

  Status ParseShape(std::vector<int64_t>* shape) {
    shape->clear();
    if (!Eat('(')) return Field("shape", "got '", Token(), "', expected a tuple such as (4, 128)");
    SkipSpace();
    while (!Peek(')')) {
      const size_t start = pos_;
      if (Peek('-')) {
        return Field("shape", "got a negative dimension '", Token(), "', expected sizes >= 0");
      }
      int64_t dim = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        if (dim > kMaxElements) return Field("shape", "dimension too large: '", Token(), "'");
        dim = dim * 10 + (s_[pos_++] - '0');
      }
      if (pos_ == start) {
        return Field("shape", "got '", Token(), "', expected an integer dimension");
      }
      Eat('L');  // Python 2 long literal.
      shape->push_back(dim);
      SkipSpace();
      if (Eat(',')) {
        SkipSpace();
      } else if (!Peek(')')) {
        return Field("shape", "expected ',' or ')' after dimension ", dim);
      }
    }
    Eat(')');
    return OkStatus();
  }

  std::string_view s_;
  std::string_view name_;
  size_t pos_ = 0;
};

std::optional<NpyDType> DTypeFromDescr(std::string_view descr) {
  if (descr == "<f4") return NpyDType::kF32;
  if (descr == "<f2") return NpyDType::kF16;
  if (descr == "<f8") return NpyDType::kF64;
  return std::nullopt;
}

uint32_t ReadLe(std::string_view bytes, size_t offset, size_t width) {
  uint32_t v = 0;
  for (size_t i = 0; i < width; ++i) {
    v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[offset + i])) << (8 * i);
  }
  return v;
}

}  // namespace

std::string_view NpyDescr(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kF32:
      return "<f4";
    case NpyDType::kF16:
      return "<f2";
    case NpyDType::kF64:
      return "<f8";
  }
  return "?";
}

int64_t NpyArray::ElementCount() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string FormatNpyShape(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out << ", ";
    if (shape[i] < 0) {
      out << "*";
    } else {
      out << shape[i];
    }
  }
  if (shape.size() == 1) out << ",";
  out << ")";
  return out.str();
}

StatusOr<NpyArray> ParseNpy(std::string_view bytes, std::string_view name) {
  if (bytes.size() < kMagicLen ||
      bytes.substr(0, kMagicLen) != std::string_view(kMagic, kMagicLen)) {
    return InvalidArgument(name, ": magic: not an .npy file (expected the 6 bytes \\x93NUMPY, got ",
                           bytes.size() < kMagicLen ? "a shorter file" : "other bytes", ")");
  }
  if (bytes.size() < kMagicLen + 2) {
    return InvalidArgument(name, ": version: file truncated after the magic string");
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  const int minor = static_cast<uint8_t>(bytes[7]);
  if ((major < 1 || major > 3) || minor != 0) {
    return InvalidArgument(name, ": version: got ", major, ".", minor,
                           ", expected 1.0, 2.0 or 3.0");
  }
  const size_t len_width = major == 1 ? 2 : 4;
  const size_t header_start = kMagicLen + 2 + len_width;
  if (bytes.size() < header_start) {
    return InvalidArgument(name, ": header_len: file truncated (", bytes.size(),
                           " bytes, expected at least ", header_start, ")");
  }
  const uint32_t header_len = ReadLe(bytes, kMagicLen + 2, len_width);
  if (header_len > kMaxHeaderLen) {
    return InvalidArgument(name, ": header_len: got ", header_len, ", expected at most ",
                           kMaxHeaderLen);
  }
  if (bytes.size() < header_start + header_len) {
    return InvalidArgument(name, ": header: file truncated (header_len ", header_len, " but only ",
                           bytes.size() - header_start, " bytes follow)");
  }

  std::string descr;
  bool fortran_order = false;
  NpyArray array;
  HeaderParser parser(bytes.substr(header_start, header_len), name);
  KVCTL_RETURN_IF_ERROR(parser.Parse(&descr, &fortran_order, &array.shape));
  const std::optional<NpyDType> dtype = DTypeFromDescr(descr);
  if (!dtype) {
    return InvalidArgument(name, ": descr: got '", descr,
                           "', expected one of '<f4', '<f2', '<f8' (little-endian float)");
  }
  array.dtype = *dtype;
  if (fortran_order) {
    return InvalidArgument(name,
                           ": fortran_order: got True, expected False (C order; save with "
                           "np.ascontiguousarray)");
  }
  int64_t count = 1;
  for (int64_t d : array.shape) {
    if (d != 0 && count > kMaxElements / d) {
      return InvalidArgument(name, ": shape: got ", FormatNpyShape(array.shape),
                             ", expected at most ", kMaxElements, " elements");
    }
    count *= d;
  }
  const size_t item = ItemSize(array.dtype);
  const size_t want = static_cast<size_t>(count) * item;
  const size_t have = bytes.size() - header_start - header_len;
  if (have != want) {
    return InvalidArgument(name, ": data: got ", have, " bytes, expected ", want, " for shape ",
                           FormatNpyShape(array.shape), " of '", descr, "'",
                           have < want ? " (file truncated)" : " (trailing bytes)");
  }

  const char* src = bytes.data() + header_start + header_len;
  array.data.resize(static_cast<size_t>(count));
  switch (array.dtype) {
    case NpyDType::kF32:
      if (count > 0) std::memcpy(array.data.data(), src, want);
      break;
    case NpyDType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + i * 2, 2);
        array.data[i] = HalfToFloat(h);
      }
      break;
    case NpyDType::kF64:
      for (int64_t i = 0; i < count; ++i) {
        double d;
        std::memcpy(&d, src + i * 8, 8);
        array.data[i] = static_cast<float>(d);
      }
      break;
  }
  return array;
}

StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) {
    return NotFound(path, ": no such file");
  }
  if (!std::filesystem::is_regular_file(st)) {
    return InvalidArgument(path, ": not a regular file");
  }
  KVCTL_ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(path, "the .npy file"));
  return ParseNpy(bytes, path);
}

StatusOr<std::string> EncodeNpy(const std::vector<int64_t>& shape, const float* data,
                                NpyDType dtype, int version) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return InvalidArgument("shape: got ", FormatNpyShape(shape), ", expected sizes >= 0");
    count *= d;
  }
  if (version < 0 || version > 3) {
    return InvalidArgument("version: got ", version, ", expected 0 (auto), 1, 2 or 3");
  }
  std::string dict = "{'descr': '" + std::string(NpyDescr(dtype)) +
                     "', 'fortran_order': False, 'shape': " + FormatNpyShape(shape) + ", }";
  // numpy pads magic + version + length + header to a multiple of 64 and ends with '\n'.
  auto padded = [&](size_t preamble) {
    const size_t raw = preamble + dict.size() + 1;
    return dict.size() + 1 + (64 - raw % 64) % 64;
  };
  if (version == 0) version = padded(10) <= 65535 ? 1 : 2;
  const size_t preamble = version == 1 ? 10 : 12;
  const size_t header_len = padded(preamble);
  if (version == 1 && header_len > 65535) {
    return InvalidArgument("version: 1.0 cannot hold a header of ", header_len, " bytes");
  }
  std::string out(kMagic, kMagicLen);
  out.push_back(static_cast<char>(version));
  out.push_back(0);
  for (size_t i = 0; i < preamble - 8; ++i) out.push_back(static_cast<char>(header_len >> (8 * i)));
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out.push_back('\n');

  const size_t start = out.size();
  out.resize(start + static_cast<size_t>(count) * ItemSize(dtype));
  char* dst = out.data() + start;
  for (int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case NpyDType::kF32:
        std::memcpy(dst + i * 4, &data[i], 4);
        break;
      case NpyDType::kF16: {
        const uint16_t h = FloatToHalf(data[i]);
        std::memcpy(dst + i * 2, &h, 2);
        break;
      }
      case NpyDType::kF64: {
        const double d = data[i];
        std::memcpy(dst + i * 8, &d, 8);
        break;
      }
    }
  }
  return out;
}

Status WriteNpy(const std::string& path, const std::vector<int64_t>& shape, const float* data,
                NpyDType dtype, int version) {
  KVCTL_ASSIGN_OR_RETURN(std::string bytes, EncodeNpy(shape, data, dtype, version));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Internal(path, ": cannot open for writing: ", std::strerror(errno));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return Internal(path, ": write failed");
  return OkStatus();
}

Status ExpectNpyShape(const NpyArray& array, std::string_view name,
                      const std::vector<int64_t>& expected) {
  bool match = array.shape.size() == expected.size();
  for (size_t i = 0; match && i < expected.size(); ++i) {
    match = expected[i] < 0 || expected[i] == array.shape[i];
  }
  if (!match) {
    return InvalidArgument(name, ": shape: got ", FormatNpyShape(array.shape), ", expected ",
                           FormatNpyShape(expected));
  }
  return OkStatus();
}

}  // namespace kvctl
