// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/scatter.h
// Packing scattered byte ranges into one buffer and scattering them back out: how the device pool
// (controller/cuda_arena) publishes many small changed slots with one host-to-device copy. The
// pack runs on the host; ScatterRef is the scalar reference (the spec) of the CUDA scatter kernel
// (kernels/cuda/scatter_cuda.h), which its [cuda] test is compared with.
//
// Thread safety: pure functions.
//
//   std::vector<CopyRange> table(n);
//   const uint64_t packed_bytes = PackRanges(base, wanted.data(), n, packed, table.data());
//   ScatterRef(packed, table.data(), n, destination);   // destination + wanted[i].dst == ...
#ifndef KVCTL_KERNELS_SCATTER_H_
#define KVCTL_KERNELS_SCATTER_H_

#include <cstdint>

namespace kvctl {

// Copy `bytes` bytes from offset `src` of a source buffer to offset `dst` of a destination.
struct CopyRange {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
};

// Bytes PackRanges writes for these ranges.
uint64_t PackedBytes(const CopyRange* wanted, int n);

// Copies base + wanted[i].src (i in order) back to back into `packed` and writes the table that
// scatters them: table[i] = {offset in packed, wanted[i].dst, wanted[i].bytes}. Returns the bytes
// written. REQUIRES: packed holds PackedBytes(wanted, n) bytes, table holds n entries.
uint64_t PackRanges(const uint8_t* base, const CopyRange* wanted, int n, uint8_t* packed,
                    CopyRange* table);

// dst_base + table[i].dst <- packed + table[i].src, table[i].bytes bytes, for every i.
// REQUIRES: the destinations do not overlap.
void ScatterRef(const uint8_t* packed, const CopyRange* table, int n, uint8_t* dst_base);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_SCATTER_H_
