// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX2 instance of the SIMD record codecs (8 lanes). Only called when the CPU has AVX2.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/block_codec.h"
#include "kernels/quantize_simd.h"

// Everything below is compiled for AVX2; the headers above stay generic.
#pragma GCC push_options
#pragma GCC target("avx2")

namespace kvctl::simd {
namespace {
typedef float VF8 __attribute__((vector_size(32)));
inline VF8 VRint(VF8 v) {
  return (VF8)_mm256_round_ps((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline VF8 VSqrt(VF8 v) { return (VF8)_mm256_sqrt_ps((__m256)v); }
}  // namespace

#define KVCTL_W 8
#define KVCTL_SUFFIXED(name) name##Avx2
#include "kernels/quantize_simd_impl.inc"
#undef KVCTL_SUFFIXED
#undef KVCTL_W

}  // namespace kvctl::simd

#pragma GCC pop_options
