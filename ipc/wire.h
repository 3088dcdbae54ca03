// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: ipc/wire.h
// Internal to ipc/: little-endian field writer and bounds-checked reader for message bodies,
// UTF-8 checks. Size arithmetic is common/checked_math.h's. Readers never read past the frame:
// every read checks the remaining length first and fails with a message naming the field.
//
// Thread safety: values; one thread per object.
//
//   WireReader r(frame.data(), frame.size(), kHeaderBytes);
//   uint64_t session; KVCTL_RETURN_IF_ERROR(r.U64("session_id", &session));
//   KVCTL_RETURN_IF_ERROR(r.Finish());
#ifndef KVCTL_IPC_WIRE_H_
#define KVCTL_IPC_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

#include "common/checked_math.h"  // Size arithmetic on client numbers goes through it.
#include "common/status.h"

namespace kvctl::ipc {

// True if `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF) without NUL bytes.
bool IsValidUtf8(std::string_view s);

// Cuts `s` to at most max_bytes on a code-point boundary and replaces invalid bytes with '?'.
std::string SanitizeUtf8(std::string_view s, size_t max_bytes);

class WireWriter {
 public:
  void U8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  // u32 length, then the bytes.
  void Str(std::string_view s);
  // Exactly `n` raw bytes, no length.
  void Bytes(const uint8_t* data, size_t n) { buf_.append(reinterpret_cast<const char*>(data), n); }
  void U16Array(const std::vector<uint16_t>& a);
  void U32Array(const std::vector<uint32_t>& a);
  void U64Array(const std::vector<uint64_t>& a);
  size_t size() const { return buf_.size(); }
  void Reserve(size_t bytes) { buf_.reserve(bytes); }
  zmq::message_t ToFrame() const { return zmq::message_t(buf_.data(), buf_.size()); }

 private:
  void Le(uint64_t v, int bytes);
  template <typename T>
  void Array(const std::vector<T>& a);
  std::string buf_;
};

class WireReader {
 public:
  // Reads data[offset, size). Error messages name the field; callers prefix the message type.
  WireReader(const void* data, size_t size, size_t offset)
      : data_(static_cast<const uint8_t*>(data)), size_(size), pos_(offset) {}

  Status U8(std::string_view field, uint8_t* out);
  Status U16(std::string_view field, uint16_t* out);
  Status U32(std::string_view field, uint32_t* out);
  Status U64(std::string_view field, uint64_t* out);
  // u32 length <= max_bytes, then that many bytes of valid UTF-8.
  Status Str(std::string_view field, size_t max_bytes, std::string* out);
  // Exactly `n` raw bytes into out[0, n).
  Status Bytes(std::string_view field, size_t n, uint8_t* out);
  // `count` elements; fails before allocating if the frame is too short.
  Status U16Array(std::string_view field, uint64_t count, std::vector<uint16_t>* out);
  Status U32Array(std::string_view field, uint64_t count, std::vector<uint32_t>* out);
  Status U64Array(std::string_view field, uint64_t count, std::vector<uint64_t>* out);
  // OK only if every byte was consumed.
  Status Finish() const;

  size_t remaining() const { return size_ - pos_; }
  size_t offset() const { return pos_; }
  // Back to an offset read before (REQUIRES: offset <= offset()), to read the same bytes again.
  void Rewind(size_t offset) { pos_ = offset; }

 private:
  Status Need(std::string_view field, uint64_t bytes) const;
  Status TooShortForArray(std::string_view field, uint64_t count, int elem_bytes) const;
  uint64_t Le(int bytes);
  template <typename T>
  void Array(uint64_t count, std::vector<T>* out);

  const uint8_t* data_;
  size_t size_;
  size_t pos_;
};

}  // namespace kvctl::ipc

#endif  // KVCTL_IPC_WIRE_H_
