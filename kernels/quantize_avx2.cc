// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX2 instance of the SIMD record codecs (8 lanes). Only called when the CPU has AVX2 and F16C.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/block_codec.h"
#include "kernels/prefetch.h"
#include "kernels/quantize_simd.h"
#include "kernels/simd_lookup.h"

// Everything below is compiled for AVX2; the headers above stay generic. No "fma" target
// (VFma below is explicit): the codecs must not contract (the project also builds with
// -ffp-contract=off).
#pragma GCC push_options
#pragma GCC target("avx2,f16c")

namespace kvctl::simd {
namespace {
typedef float VF __attribute__((vector_size(32)));
typedef int32_t VI __attribute__((vector_size(32)));
typedef uint32_t VU __attribute__((vector_size(32)));
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT;

inline VF Splat(float x) { return (VF)_mm256_set1_ps(x); }
inline VU SplatU(uint32_t x) { return (VU)_mm256_set1_epi32(static_cast<int>(x)); }
inline VF VRint(VF v) { return (VF)_mm256_round_ps((__m256)v, kRne | _MM_FROUND_NO_EXC); }
// Rounds per MXCSR, which this process leaves at nearest-even: the mode rintf uses too.
inline VU VCvtRound(VF v) { return (VU)_mm256_cvtps_epi32((__m256)v); }
inline VF VSqrt(VF v) { return (VF)_mm256_sqrt_ps((__m256)v); }
// a * b + c with one rounding (FMA3, which DetectSimdLevel requires). Inline assembly, not
// the "fma" target: with that target the compiler could contract other expressions of this
// file when built without -ffp-contract=off, and the codecs' bytes rest on it not doing so.
inline VF VFma(VF a, VF b, VF c) {
  asm("vfmadd231ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
  return c;
}
inline VF VMax(VF a, VF b) { return (VF)_mm256_max_ps((__m256)a, (__m256)b); }
inline VF VMin(VF a, VF b) { return (VF)_mm256_min_ps((__m256)a, (__m256)b); }
inline VF RoundHalf(VF v) { return (VF)_mm256_cvtph_ps(_mm256_cvtps_ph((__m256)v, kRne)); }
inline VU HalfBits(VF v) { return (VU)_mm256_cvtepu16_epi32(_mm256_cvtps_ph((__m256)v, kRne)); }
inline VF HalfToFloat(VU h) {
  const __m256i x = (__m256i)h;
  return (VF)_mm256_cvtph_ps(
      _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
}
inline void StoreHalves(uint8_t* p, VF v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph((__m256)v, kRne));
}
inline VF LoadHalves(const uint8_t* p) {
  return (VF)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// table[code] per lane, code < 16 (kernels/simd_lookup.h).
inline VF Lookup16(const float* table, VU code) {
  return (VF)simd_lookup::Lookup16Avx2(simd_lookup::LoadTable16Avx2(table), (__m256i)code);
}
// 8 rows of 8 floats (row i at src + i * stride) transposed: out[j] lane i = row i, element j.
// The exchange of 128-bit halves between rows is done by the loads (vinsertf128 from memory);
// only the 4 x 4 transposes inside the halves take shuffles (16 in-lane unpacks instead of the
// register transpose's cross-lane permutes and blends).
#define KVCTL_LOAD_TRANSPOSED 1
// a[il]'s half b holds row 4b + il, elements 4jb..4jb+3: transposes each half's 4 x 4 into
// out[4jb..4jb+3].
inline void TransposeHalves4(const __m256* a, int jb, VU* out) {
  const __m256 t0 = _mm256_unpacklo_ps(a[0], a[1]), t1 = _mm256_unpackhi_ps(a[0], a[1]);
  const __m256 t2 = _mm256_unpacklo_ps(a[2], a[3]), t3 = _mm256_unpackhi_ps(a[2], a[3]);
  const __m256d d0 = _mm256_castps_pd(t0), d1 = _mm256_castps_pd(t1);
  const __m256d d2 = _mm256_castps_pd(t2), d3 = _mm256_castps_pd(t3);
  out[4 * jb + 0] = (VU)_mm256_castpd_si256(_mm256_unpacklo_pd(d0, d2));
  out[4 * jb + 1] = (VU)_mm256_castpd_si256(_mm256_unpackhi_pd(d0, d2));
  out[4 * jb + 2] = (VU)_mm256_castpd_si256(_mm256_unpacklo_pd(d1, d3));
  out[4 * jb + 3] = (VU)_mm256_castpd_si256(_mm256_unpackhi_pd(d1, d3));
}
// The finite check of LoadTokensT: absmax collects the |x| bits of the tile.
inline void FoldAbsBits(const VU* out, VU& absmax) {
  const __m256i mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i a = (__m256i)absmax;
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) a = _mm256_max_epu32(a, _mm256_and_si256((__m256i)out[i], mask));
  absmax = (VU)a;
}
inline void LoadTransposed(const float* src, int64_t stride, VU* out, VU& absmax) {
#pragma GCC unroll 2
  for (int jb = 0; jb < 2; ++jb) {
    __m256 a[4];
#pragma GCC unroll 4
    for (int il = 0; il < 4; ++il) {
      const float* p = src + il * stride + 4 * jb;
      a[il] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)),
                                   _mm_loadu_ps(p + 4 * stride), 1);
    }
    TransposeHalves4(a, jb, out);
  }
  FoldAbsBits(out, absmax);
}
// The same from fp16 rows: the 4 halves (8 bytes) of rows il and il + 4 go into one 128-bit
// register, which vcvtph2ps widens into the layout above; the transposes are the same.
inline void LoadTransposed(const uint16_t* src, int64_t stride, VU* out, VU& absmax) {
#pragma GCC unroll 2
  for (int jb = 0; jb < 2; ++jb) {
    __m256 a[4];
#pragma GCC unroll 4
    for (int il = 0; il < 4; ++il) {
      const uint16_t* p = src + il * stride + 4 * jb;
      const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 4 * stride));
      a[il] = _mm256_cvtph_ps(_mm_unpacklo_epi64(lo, hi));
    }
    TransposeHalves4(a, jb, out);
  }
  FoldAbsBits(out, absmax);
}
}  // namespace

#define KVCTL_W 8
#define KVCTL_SUFFIXED(name) name##Avx2
#include "kernels/quantize_simd_impl.inc"
#undef KVCTL_SUFFIXED
#undef KVCTL_W

}  // namespace kvctl::simd

#pragma GCC pop_options
