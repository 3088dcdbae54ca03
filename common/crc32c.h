// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/crc32c.h
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF),
// the checksum the daemon keeps per pool page (docs/reliability.md "Page checksums").
// Crc32c() picks the SSE4.2 crc32 instruction when the CPU has it (checked once, at run time)
// and the table-driven reference otherwise; both give the same value for every input.
//
// Checksums chain: Crc32cExtend(Crc32c(a), b) == Crc32c(a followed by b), so a page whose
// checksummed prefix grows only needs the new bytes checksummed.
//
// Thread safety: pure functions.
//
//   uint32_t c = Crc32c(page, used_bytes);            // "123456789" -> 0xE3069283
//   c = Crc32cExtend(c, page + used_bytes, more);      // the same as Crc32c(page, used + more)
#ifndef KVCTL_COMMON_CRC32C_H_
#define KVCTL_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace kvctl {

// The checksum of `bytes` bytes at `data` (data may be null when bytes is 0).
uint32_t Crc32c(const void* data, size_t bytes);
// The checksum of (the bytes `crc` is the checksum of) followed by `bytes` bytes at `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t bytes);

// out[r] = Crc32c(data + r * row_bytes, row_bytes) for r < rows: the checksums of equal rows one
// after another (R-KV's unit keys, policies/redundancy.h). The hardware path runs three rows'
// chains side by side, which a row of a few hundred bytes is too short to do on its own.
void Crc32cRows(const void* data, size_t row_bytes, size_t rows, uint32_t* out);

// The two implementations, for tests and benchmarks. Crc32cExtendHardware REQUIRES
// Crc32cHardwareAvailable(); so does Crc32cRowsHardware.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t bytes);
uint32_t Crc32cExtendHardware(uint32_t crc, const void* data, size_t bytes);
void Crc32cRowsHardware(const void* data, size_t row_bytes, size_t rows, uint32_t* out);
bool Crc32cHardwareAvailable();

}  // namespace kvctl

#endif  // KVCTL_COMMON_CRC32C_H_
