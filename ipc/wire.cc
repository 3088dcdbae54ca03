// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "ipc/wire.h"

#include <bit>
#include <cstring>

namespace kvctl::ipc {

static_assert(std::endian::native == std::endian::little,
              "WireWriter and WireReader copy little-endian values as they lie in memory");

namespace {

// Length of the UTF-8 sequence starting at s[i], or 0 if it is malformed (RFC 3629 table 3-7).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 == 0) return 0;
  if (b0 < 0x80) return 1;
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // Allowed range of the second byte.
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // Overlong.
    if (b0 == 0xED) hi = 0x9F;  // Surrogates.
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // Overlong.
    if (b0 == 0xF4) hi = 0x8F;  // > U+10FFFF.
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return len;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = Utf8SequenceLength(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t len = Utf8SequenceLength(s, i);
    const bool bad = len == 0;
    if (bad) len = 1;
    if (out.size() + (bad ? 1 : len) > max_bytes) break;
    if (bad) {
      out.push_back('?');
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  return out;
}

// The wire is little-endian and so is every host kvctl builds for (static_assert above): values
// and arrays are copied as they lie in memory, one append per field or array.
void WireWriter::Le(uint64_t v, int bytes) {
  buf_.append(reinterpret_cast<const char*>(&v), bytes);
}

template <typename T>
void WireWriter::Array(const std::vector<T>& a) {
  if (!a.empty()) buf_.append(reinterpret_cast<const char*>(a.data()), a.size() * sizeof(T));
}

void WireWriter::Str(std::string_view s) {
  U32(static_cast<uint32_t>(s.size()));
  buf_.append(s);
}

void WireWriter::U16Array(const std::vector<uint16_t>& a) { Array(a); }
void WireWriter::U32Array(const std::vector<uint32_t>& a) { Array(a); }
void WireWriter::U64Array(const std::vector<uint64_t>& a) { Array(a); }

Status WireReader::Need(std::string_view field, uint64_t bytes) const {
  if (bytes > remaining()) {
    return InvalidArgument("truncated at ", field, ": need ", bytes, " bytes at offset ", pos_,
                           ", frame has ", remaining(), " left");
  }
  return OkStatus();
}

Status WireReader::TooShortForArray(std::string_view field, uint64_t count, int elem_bytes) const {
  return InvalidArgument("truncated at ", field, ": ", count, " elements of ", elem_bytes,
                         " bytes at offset ", pos_, ", frame has ", remaining(), " bytes left");
}

uint64_t WireReader::Le(int bytes) {
  uint64_t v = 0;
  std::memcpy(&v, data_ + pos_, bytes);  // Little-endian host: the low `bytes` bytes of v.
  pos_ += bytes;
  return v;
}

// REQUIRES: count elements of T fit in the frame (the callers check first).
template <typename T>
void WireReader::Array(uint64_t count, std::vector<T>* out) {
  out->resize(count);
  if (count > 0) std::memcpy(out->data(), data_ + pos_, count * sizeof(T));
  pos_ += count * sizeof(T);
}

Status WireReader::U8(std::string_view field, uint8_t* out) {
  KVCTL_RETURN_IF_ERROR(Need(field, 1));
  *out = static_cast<uint8_t>(Le(1));
  return OkStatus();
}

Status WireReader::U16(std::string_view field, uint16_t* out) {
  KVCTL_RETURN_IF_ERROR(Need(field, 2));
  *out = static_cast<uint16_t>(Le(2));
  return OkStatus();
}

Status WireReader::U32(std::string_view field, uint32_t* out) {
  KVCTL_RETURN_IF_ERROR(Need(field, 4));
  *out = static_cast<uint32_t>(Le(4));
  return OkStatus();
}

Status WireReader::U64(std::string_view field, uint64_t* out) {
  KVCTL_RETURN_IF_ERROR(Need(field, 8));
  *out = Le(8);
  return OkStatus();
}

Status WireReader::Str(std::string_view field, size_t max_bytes, std::string* out) {
  uint32_t len;
  KVCTL_RETURN_IF_ERROR(U32(field, &len));
  if (len > max_bytes) {
    return InvalidArgument(field, ": length ", len, " bytes, expected at most ", max_bytes);
  }
  KVCTL_RETURN_IF_ERROR(Need(field, len));
  std::string_view s(reinterpret_cast<const char*>(data_ + pos_), len);
  if (!IsValidUtf8(s)) {
    return InvalidArgument(field, ": not valid UTF-8 (or contains NUL)");
  }
  out->assign(s);
  pos_ += len;
  return OkStatus();
}

Status WireReader::Bytes(std::string_view field, size_t n, uint8_t* out) {
  KVCTL_RETURN_IF_ERROR(Need(field, n));
  std::memcpy(out, data_ + pos_, n);
  pos_ += n;
  return OkStatus();
}

Status WireReader::U16Array(std::string_view field, uint64_t count, std::vector<uint16_t>* out) {
  if (count > remaining() / 2) return TooShortForArray(field, count, 2);
  Array(count, out);
  return OkStatus();
}

Status WireReader::U32Array(std::string_view field, uint64_t count, std::vector<uint32_t>* out) {
  if (count > remaining() / 4) return TooShortForArray(field, count, 4);
  Array(count, out);
  return OkStatus();
}

Status WireReader::U64Array(std::string_view field, uint64_t count, std::vector<uint64_t>* out) {
  if (count > remaining() / 8) return TooShortForArray(field, count, 8);
  Array(count, out);
  return OkStatus();
}

Status WireReader::Finish() const {
  if (pos_ != size_) {
    return InvalidArgument(remaining(), " unexpected trailing bytes after the body (",
                           "body ends at offset ", pos_, ", frame has ", size_, " bytes)");
  }
  return OkStatus();
}

}  // namespace kvctl::ipc
