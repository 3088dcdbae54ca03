// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace kvctl {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // 0x1EDC6F41 bit-reversed.

// The byte-at-a-time table of the reflected polynomial: the specification, not a fast path.
constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < bytes; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
namespace {

// The hardware path runs three independent crc32 chains over adjacent kStreamBytes chunks (the
// instruction has a 3-cycle latency and a 1-cycle throughput, so one chain leaves two thirds of
// it idle) and joins them: the CRC register is linear over GF(2), so the register after chunks
// A then B is Shift(reg after A) ^ (reg after B started from 0), where Shift feeds kStreamBytes
// zero bytes. Shift is a fixed 32x32 bit matrix, applied with four 256-entry tables.
constexpr size_t kStreamBytes = 2048;

__attribute__((target("sse4.2"))) uint32_t FeedZeros(uint32_t reg, size_t bytes) {
  uint64_t c = reg;
  for (size_t i = 0; i < bytes; i += 8) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

struct ShiftTables {
  uint32_t byte[4][256];
};

const ShiftTables& StreamShift() {
  static const ShiftTables tables = [] {
    ShiftTables t{};
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) t.byte[k][b] = FeedZeros(b << (8 * k), kStreamBytes);
    }
    return t;
  }();
  return tables;
}

uint32_t Shift(const ShiftTables& t, uint32_t reg) {
  return t.byte[0][reg & 0xFF] ^ t.byte[1][(reg >> 8) & 0xFF] ^ t.byte[2][(reg >> 16) & 0xFF] ^
         t.byte[3][reg >> 24];
}

__attribute__((target("sse4.2"))) inline uint64_t Step(uint64_t c, const uint8_t* p) {
  uint64_t word;
  std::memcpy(&word, p, 8);  // Unaligned loads are fine on x86.
  return _mm_crc32_u64(c, word);
}

}  // namespace

// The crc32 instruction computes the same reflected CRC-32C register update as the table, 8 bytes
// at a time.
__attribute__((target("sse4.2"))) uint32_t Crc32cExtendHardware(uint32_t crc, const void* data,
                                                                size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  if (bytes >= 3 * kStreamBytes) {
    const ShiftTables& shift = StreamShift();
    for (; bytes >= 3 * kStreamBytes; p += 3 * kStreamBytes, bytes -= 3 * kStreamBytes) {
      uint64_t c1 = 0, c2 = 0;
      for (size_t i = 0; i < kStreamBytes; i += 8) {
        c = Step(c, p + i);
        c1 = Step(c1, p + kStreamBytes + i);
        c2 = Step(c2, p + 2 * kStreamBytes + i);
      }
      c = Shift(shift, Shift(shift, static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1)) ^
          static_cast<uint32_t>(c2);
    }
  }
  for (; bytes >= 8; p += 8, bytes -= 8) c = Step(c, p);
  auto c32 = static_cast<uint32_t>(c);
  for (; bytes > 0; ++p, --bytes) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

bool Crc32cHardwareAvailable() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}
#else
uint32_t Crc32cExtendHardware(uint32_t crc, const void* data, size_t bytes) {
  return Crc32cExtendPortable(crc, data, bytes);
}
bool Crc32cHardwareAvailable() { return false; }
#endif

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t bytes) {
  return Crc32cHardwareAvailable() ? Crc32cExtendHardware(crc, data, bytes)
                                   : Crc32cExtendPortable(crc, data, bytes);
}

uint32_t Crc32c(const void* data, size_t bytes) { return Crc32cExtend(0, data, bytes); }

}  // namespace kvctl
