// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/convert_simd.h (internal to kernels/)
// The SIMD bodies of kernels/convert.h, one set per instruction set, each compiled for its ISA in
// its own file (convert_avx2.cc, convert_avx512.cc); callers check the CPU first (convert.cc).
// They handle whole vectors and finish the last n % lanes elements with the scalar reference, so
// any n (also 0) is fine. Bytes are little-endian element bit patterns at any alignment.
//
// Thread safety: reentrant, no state.
#ifndef KVCTL_KERNELS_CONVERT_SIMD_H_
#define KVCTL_KERNELS_CONVERT_SIMD_H_

#include <cstddef>
#include <cstdint>

namespace kvctl::simd {

#define KVCTL_DECLARE_SIMD_CONVERT(Suffix)                                   \
  void F32ToF16##Suffix(const uint8_t* src, size_t n, uint8_t* dst);         \
  void F16ToF32##Suffix(const uint8_t* src, size_t n, uint8_t* dst);         \
  void F32ToBf16##Suffix(const uint8_t* src, size_t n, uint8_t* dst);        \
  void Bf16ToF32##Suffix(const uint8_t* src, size_t n, uint8_t* dst);        \
  /* First index whose |bits| (sign cleared) exceeds limit, or n. */         \
  size_t FirstAbove32##Suffix(const uint8_t* src, size_t n, uint32_t limit); \
  size_t FirstAbove16##Suffix(const uint8_t* src, size_t n, uint32_t limit);

KVCTL_DECLARE_SIMD_CONVERT(Avx2)
KVCTL_DECLARE_SIMD_CONVERT(Avx512)

#undef KVCTL_DECLARE_SIMD_CONVERT

}  // namespace kvctl::simd

#endif  // KVCTL_KERNELS_CONVERT_SIMD_H_
