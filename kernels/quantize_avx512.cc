// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX-512 instance of the SIMD record codecs (16 lanes). Only called when the CPU has
// AVX-512F/BW/VL.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/block_codec.h"
#include "kernels/quantize_simd.h"

// Everything below is compiled for AVX-512; the headers above stay generic. No "fma": the codecs
// must not contract (the project also builds with -ffp-contract=off).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,f16c")
// GCC 12 flags its own _mm512_undefined_*() inside avx512fintrin.h as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kvctl::simd {
namespace {
typedef float VF __attribute__((vector_size(64)));
typedef int32_t VI __attribute__((vector_size(64)));
typedef uint32_t VU __attribute__((vector_size(64)));
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT;

inline VF Splat(float x) { return (VF)_mm512_set1_ps(x); }
inline VU SplatU(uint32_t x) { return (VU)_mm512_set1_epi32(static_cast<int>(x)); }
inline VF VRint(VF v) { return (VF)_mm512_roundscale_ps((__m512)v, kRne | _MM_FROUND_NO_EXC); }
inline VU VCvtRound(VF v) {
  return (VU)_mm512_cvt_roundps_epi32((__m512)v, kRne | _MM_FROUND_NO_EXC);
}
inline VF VSqrt(VF v) { return (VF)_mm512_sqrt_ps((__m512)v); }
inline VF VMax(VF a, VF b) { return (VF)_mm512_max_ps((__m512)a, (__m512)b); }
inline VF VMin(VF a, VF b) { return (VF)_mm512_min_ps((__m512)a, (__m512)b); }
inline VF RoundHalf(VF v) { return (VF)_mm512_cvtph_ps(_mm512_cvtps_ph((__m512)v, kRne)); }
inline VU HalfBits(VF v) { return (VU)_mm512_cvtepu16_epi32(_mm512_cvtps_ph((__m512)v, kRne)); }
inline VF HalfToFloat(VU h) { return (VF)_mm512_cvtph_ps(_mm512_cvtepi32_epi16((__m512i)h)); }
inline void StoreHalves(uint8_t* p, VF v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph((__m512)v, kRne));
}
inline VF LoadHalves(const uint8_t* p) {
  return (VF)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// table[code] per lane, code < 16.
inline VF Lookup16(const float* table, VU code) {
  return (VF)_mm512_permutexvar_ps((__m512i)code, _mm512_loadu_ps(table));
}
}  // namespace

#define KVCTL_W 16
#define KVCTL_SUFFIXED(name) name##Avx512
#include "kernels/quantize_simd_impl.inc"
#undef KVCTL_SUFFIXED
#undef KVCTL_W

}  // namespace kvctl::simd

#pragma GCC pop_options
