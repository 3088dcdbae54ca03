// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/quantize_simd.h (internal to kernels/)
// Entry points of the SIMD record codecs, one set per instruction set. They take the same
// arguments as block::EncodeRecord / block::DecodeRecord and produce the same bytes and floats.
// Each is compiled for its ISA in its own file; callers must check the CPU first (quantize.cc).
#ifndef KVCTL_KERNELS_QUANTIZE_SIMD_H_
#define KVCTL_KERNELS_QUANTIZE_SIMD_H_

#include <cstdint>

#include "kernels/quant_types.h"

namespace kvctl::simd {

// Floats of scratch the SIMD codecs need for one record.
int64_t ScratchFloats(const QuantSpec& s);

#define KVCTL_DECLARE_SIMD_CODEC(Suffix)                                                        \
  bool EncodeRecord##Suffix(const QuantSpec& s, const BlockLayout& l, const float* k,           \
                            const float* v, int64_t stride, const float* norms, float* scratch, \
                            uint8_t* rec);                                                      \
  void DecodeRecord##Suffix(const QuantSpec& s, const BlockLayout& l, const uint8_t* rec,       \
                            const float* norms, float* scratch, float* k_out, float* v_out);    \
  void FwhtRows##Suffix(float* rows, int64_t n, int d);

KVCTL_DECLARE_SIMD_CODEC(Avx2)
KVCTL_DECLARE_SIMD_CODEC(Avx512)
#undef KVCTL_DECLARE_SIMD_CODEC

}  // namespace kvctl::simd

#endif  // KVCTL_KERNELS_QUANTIZE_SIMD_H_
