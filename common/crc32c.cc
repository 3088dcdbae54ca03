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

namespace {

// Crc32cRows on the table, one row after another.
void RowsPortable(const void* data, size_t row_bytes, size_t rows, uint32_t* out) {
  for (size_t r = 0; r < rows; ++r) {
    out[r] = Crc32cExtendPortable(0, static_cast<const uint8_t*>(data) + r * row_bytes, row_bytes);
  }
}

}  // namespace

#if defined(__x86_64__)
namespace {

// The hardware path runs three independent crc32 chains over adjacent chunks of L bytes (the
// instruction has a 3-cycle latency and a 1-cycle throughput, so one chain leaves two thirds of
// it idle) and joins them: the CRC register is linear over GF(2), so the register after chunks
// A then B is Shift_L(reg after A) ^ (reg after B started from 0), where Shift_L feeds L zero
// bytes. Shift_L is a fixed 32x32 bit matrix, applied with four 256-entry tables.
//
// Rounds of 3 x L bytes are taken with the largest L that fits what is left, from a few fixed
// sizes: 2048 for long buffers, 1360 so that a 4 KiB pool chunk (what FETCH and the scrubber
// check, docs/reliability.md) is one round plus 16 bytes instead of a single chain, and 256 for
// what is left of other lengths. Below 3 x 256 bytes one chain finishes.
constexpr size_t kStreamSizes[] = {2048, 1360, 256};
constexpr int kLevels = 3;

__attribute__((target("sse4.2"))) uint32_t FeedZeros(uint32_t reg, size_t bytes) {
  uint64_t c = reg;
  for (size_t i = 0; i < bytes; i += 8) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

struct ShiftTables {
  uint32_t byte[4][256];
};

// Shift tables of every stream size, built once.
const ShiftTables* StreamShifts() {
  static const ShiftTables* tables = [] {
    auto* t = new ShiftTables[kLevels]{};
    for (int level = 0; level < kLevels; ++level) {
      for (int k = 0; k < 4; ++k) {
        for (uint32_t b = 0; b < 256; ++b) {
          t[level].byte[k][b] = FeedZeros(b << (8 * k), kStreamSizes[level]);
        }
      }
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

// One round: the register after `c` followed by 3 x L bytes at p. L is a multiple of 8.
template <size_t L>
__attribute__((target("sse4.2"))) inline uint64_t Round(uint64_t c, const uint8_t* p,
                                                        const ShiftTables& shift) {
  uint64_t c1 = 0, c2 = 0;
  for (size_t i = 0; i < L; i += 8) {
    c = Step(c, p + i);
    c1 = Step(c1, p + L + i);
    c2 = Step(c2, p + 2 * L + i);
  }
  return Shift(shift, Shift(shift, static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1)) ^
         static_cast<uint32_t>(c2);
}

static_assert(kStreamSizes[0] % 8 == 0 && kStreamSizes[1] % 8 == 0 && kStreamSizes[2] % 8 == 0);

}  // namespace

// The crc32 instruction computes the same reflected CRC-32C register update as the table, 8 bytes
// at a time.
__attribute__((target("sse4.2"))) uint32_t Crc32cExtendHardware(uint32_t crc, const void* data,
                                                                size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  if (bytes >= 3 * kStreamSizes[kLevels - 1]) {
    const ShiftTables* shifts = StreamShifts();
    for (; bytes >= 3 * kStreamSizes[0]; p += 3 * kStreamSizes[0], bytes -= 3 * kStreamSizes[0]) {
      c = Round<kStreamSizes[0]>(c, p, shifts[0]);
    }
    for (; bytes >= 3 * kStreamSizes[1]; p += 3 * kStreamSizes[1], bytes -= 3 * kStreamSizes[1]) {
      c = Round<kStreamSizes[1]>(c, p, shifts[1]);
    }
    for (; bytes >= 3 * kStreamSizes[2]; p += 3 * kStreamSizes[2], bytes -= 3 * kStreamSizes[2]) {
      c = Round<kStreamSizes[2]>(c, p, shifts[2]);
    }
  }
  for (; bytes >= 8; p += 8, bytes -= 8) c = Step(c, p);
  auto c32 = static_cast<uint32_t>(c);
  for (; bytes > 0; ++p, --bytes) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

__attribute__((target("sse4.2"))) void Crc32cRowsHardware(const void* data, size_t row_bytes,
                                                          size_t rows, uint32_t* out) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t r = 0;
  for (; r + 3 <= rows; r += 3) {
    const uint8_t* a = p + r * row_bytes;
    const uint8_t* b = a + row_bytes;
    const uint8_t* c = b + row_bytes;
    uint64_t ca = ~uint32_t{0}, cb = ca, cc = ca;
    size_t i = 0;
    for (; i + 8 <= row_bytes; i += 8) {
      ca = Step(ca, a + i);
      cb = Step(cb, b + i);
      cc = Step(cc, c + i);
    }
    auto ra = static_cast<uint32_t>(ca), rb = static_cast<uint32_t>(cb);
    auto rc = static_cast<uint32_t>(cc);
    for (; i < row_bytes; ++i) {
      ra = _mm_crc32_u8(ra, a[i]);
      rb = _mm_crc32_u8(rb, b[i]);
      rc = _mm_crc32_u8(rc, c[i]);
    }
    out[r] = ~ra;
    out[r + 1] = ~rb;
    out[r + 2] = ~rc;
  }
  for (; r < rows; ++r) out[r] = Crc32cExtendHardware(0, p + r * row_bytes, row_bytes);
}

bool Crc32cHardwareAvailable() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}
#else
uint32_t Crc32cExtendHardware(uint32_t crc, const void* data, size_t bytes) {
  return Crc32cExtendPortable(crc, data, bytes);
}
void Crc32cRowsHardware(const void* data, size_t row_bytes, size_t rows, uint32_t* out) {
  RowsPortable(data, row_bytes, rows, out);
}
bool Crc32cHardwareAvailable() { return false; }
#endif

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t bytes) {
  return Crc32cHardwareAvailable() ? Crc32cExtendHardware(crc, data, bytes)
                                   : Crc32cExtendPortable(crc, data, bytes);
}

uint32_t Crc32c(const void* data, size_t bytes) { return Crc32cExtend(0, data, bytes); }

void Crc32cRows(const void* data, size_t row_bytes, size_t rows, uint32_t* out) {
  if (Crc32cHardwareAvailable()) {
    Crc32cRowsHardware(data, row_bytes, rows, out);
  } else {
    RowsPortable(data, row_bytes, rows, out);
  }
}

}  // namespace kvctl
