// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/fuzz/fuzz_input.h
// The byte format the request-path fuzzer (request_path_fuzz.cc) reads: one input is a SCRIPT of
// steps run against one Controller, so a single input can say HELLO, OPEN, stage bytes, APPEND,
// FETCH... and reach states a single request never could. The seed generator (make_seeds.cc)
// writes scripts with ScriptWriter; the harness reads them with ScriptReader. Every byte string is
// a valid script: fields cut short by the end of the input read as zero or as shorter payloads.
//
// A script is a list of steps; the first byte of a step is its kind (low 2 bits) and flags:
//   kind 0  REQUEST  u8 n (1 + n % 4 frames), then per frame: u16 length, that many bytes.
//                    Flag 0x04: the APPEND's staging_offset is relative to its session's slot
//                    (added, wrapping, so every 64-bit offset is still reachable).
//   kind 1  STAGE    u8 session, u16 offset, u16 length, bytes: copied into that session's staging
//                    slot in the shm pool (clipped to the slot), as a client writes it.
//   kind 2  CLOCK    u16 milliseconds: the daemon's clock moves on, then leases are expired.
//   kind 3  RELOAD   u8 variant: the config is reloaded with budget/evict variant (variant % n).
// Integers are little-endian. In a decoded request, a session_id of 1..kMaxScriptSessions names
// the session that the script's HELLO number session_id created (live or not), since real ids
// are random; any other value is sent unchanged.
//
// Thread safety: plain values.
#ifndef KVCTL_TESTS_FUZZ_FUZZ_INPUT_H_
#define KVCTL_TESTS_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvctl::fuzz {

enum class StepKind : uint8_t { kRequest = 0, kStage = 1, kClock = 2, kReload = 3 };
inline constexpr uint8_t kRelativeStagingFlag = 0x04;
inline constexpr uint64_t kMaxScriptSessions = 8;

// Reads a script from the front; every read past the end yields zeros / empty payloads.
class ScriptReader {
 public:
  explicit ScriptReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  bool done() const { return pos_ >= bytes_.size(); }
  uint8_t U8() { return done() ? 0 : bytes_[pos_++]; }
  uint16_t U16() {
    const uint16_t lo = U8();
    return static_cast<uint16_t>(lo | (U8() << 8));
  }
  // Up to `n` bytes (fewer at the end of the input).
  std::span<const uint8_t> Bytes(size_t n) {
    n = std::min(n, bytes_.size() - std::min(pos_, bytes_.size()));
    std::span<const uint8_t> out = bytes_.subspan(pos_, n);
    pos_ += n;
    return out;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

// Builds scripts (the seed generator and the regression tests).
class ScriptWriter {
 public:
  // One request message given as its frames (frame 0 = header + body).
  ScriptWriter& Request(const std::vector<std::string>& frames, bool relative_staging = false) {
    U8(static_cast<uint8_t>(StepKind::kRequest) | (relative_staging ? kRelativeStagingFlag : 0));
    U8(static_cast<uint8_t>(frames.size() - 1));
    for (const std::string& f : frames) {
      U16(static_cast<uint16_t>(f.size()));
      out_ += f;
    }
    return *this;
  }
  ScriptWriter& Stage(uint8_t session, uint16_t offset, std::string_view bytes) {
    U8(static_cast<uint8_t>(StepKind::kStage));
    U8(session);
    U16(offset);
    U16(static_cast<uint16_t>(bytes.size()));
    out_ += bytes;
    return *this;
  }
  ScriptWriter& Clock(uint16_t ms) {
    U8(static_cast<uint8_t>(StepKind::kClock));
    U16(ms);
    return *this;
  }
  ScriptWriter& Reload(uint8_t variant) {
    U8(static_cast<uint8_t>(StepKind::kReload));
    U8(variant);
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) {
    U8(static_cast<uint8_t>(v));
    U8(static_cast<uint8_t>(v >> 8));
  }
  std::string out_;
};

}  // namespace kvctl::fuzz

#endif  // KVCTL_TESTS_FUZZ_FUZZ_INPUT_H_
