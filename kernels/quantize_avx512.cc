// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX-512 instance of the SIMD record codecs (16 lanes). Only called when the CPU has
// AVX-512F/BW/VL.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/block_codec.h"
#include "kernels/quantize_simd.h"

// Everything below is compiled for AVX-512; the headers above stay generic.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2")
// GCC 12 flags its own _mm512_undefined_ps() inside avx512fintrin.h as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kvctl::simd {
namespace {
typedef float VF16 __attribute__((vector_size(64)));
inline VF16 VRint(VF16 v) {
  return (VF16)_mm512_roundscale_ps((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline VF16 VSqrt(VF16 v) { return (VF16)_mm512_sqrt_ps((__m512)v); }
}  // namespace

#define KVCTL_W 16
#define KVCTL_SUFFIXED(name) name##Avx512
#include "kernels/quantize_simd_impl.inc"
#undef KVCTL_SUFFIXED
#undef KVCTL_W

}  // namespace kvctl::simd

#pragma GCC pop_options
