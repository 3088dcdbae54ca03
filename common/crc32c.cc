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
// The crc32 instruction computes the same reflected CRC-32C register update as the table, 8 bytes
// at a time; unaligned loads are fine on x86.
__attribute__((target("sse4.2"))) uint32_t Crc32cExtendHardware(uint32_t crc, const void* data,
                                                                size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  for (; bytes >= 8; p += 8, bytes -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
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
