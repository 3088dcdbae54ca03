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
#include "kernels/prefetch.h"
#include "kernels/quantize_simd.h"
#include "kernels/simd_lookup.h"

// Everything below is compiled for AVX-512; the headers above stay generic. No "fma" target
// (VFma below is explicit): the codecs must not contract (the project also builds with
// -ffp-contract=off).
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
// a * b + c with one rounding (FMA3, which DetectSimdLevel requires). Inline assembly, not
// the "fma" target: with that target the compiler could contract other expressions of this
// file when built without -ffp-contract=off, and the codecs' bytes rest on it not doing so.
inline VF VFma(VF a, VF b, VF c) {
  asm("vfmadd231ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
  return c;
}
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
// table[code] per lane, code < 16 (kernels/simd_lookup.h).
inline VF Lookup16(const float* table, VU code) {
  return (VF)simd_lookup::Lookup16Avx512(simd_lookup::LoadTable16Avx512(table), (__m512i)code);
}
// 16 rows of 16 floats (row i at src + i * stride) transposed: out[j] lane i = row i, element j.
// The exchange of 128-bit blocks between rows is done by the loads (vinsertf32x4 from memory runs
// on the load ports and either vector port); only the 4 x 4 transposes inside the blocks take
// shuffles: 32 one-port permutes instead of the 64 of a register transpose.
#define KVCTL_LOAD_TRANSPOSED 1
// a[il]'s block b holds row 4b + il, elements 4jb..4jb+3: transposes each block's 4 x 4 into
// out[4jb..4jb+3].
inline void TransposeBlocks4(const __m512* a, int jb, VU* out) {
  const __m512 t0 = _mm512_unpacklo_ps(a[0], a[1]), t1 = _mm512_unpackhi_ps(a[0], a[1]);
  const __m512 t2 = _mm512_unpacklo_ps(a[2], a[3]), t3 = _mm512_unpackhi_ps(a[2], a[3]);
  const __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
  const __m512d d2 = _mm512_castps_pd(t2), d3 = _mm512_castps_pd(t3);
  out[4 * jb + 0] = (VU)_mm512_castpd_si512(_mm512_unpacklo_pd(d0, d2));
  out[4 * jb + 1] = (VU)_mm512_castpd_si512(_mm512_unpackhi_pd(d0, d2));
  out[4 * jb + 2] = (VU)_mm512_castpd_si512(_mm512_unpacklo_pd(d1, d3));
  out[4 * jb + 3] = (VU)_mm512_castpd_si512(_mm512_unpackhi_pd(d1, d3));
}
inline void LoadTransposed(const float* src, int64_t stride, VU* out) {
#pragma GCC unroll 4
  for (int jb = 0; jb < 4; ++jb) {
    __m512 a[4];
#pragma GCC unroll 4
    for (int il = 0; il < 4; ++il) {
      const float* p = src + il * stride + 4 * jb;
      __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(p));
      v = _mm512_insertf32x4(v, _mm_loadu_ps(p + 4 * stride), 1);
      v = _mm512_insertf32x4(v, _mm_loadu_ps(p + 8 * stride), 2);
      a[il] = _mm512_insertf32x4(v, _mm_loadu_ps(p + 12 * stride), 3);
    }
    TransposeBlocks4(a, jb, out);
  }
}
// The same from fp16 rows: the 4 halves (8 bytes) of rows il, il + 4, il + 8 and il + 12 go into
// one 256-bit register, which vcvtph2ps widens into the layout above.
inline __m128i LoadHalfPair(const uint16_t* p, int64_t stride) {
  return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)),
                            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + stride)));
}
inline void LoadTransposed(const uint16_t* src, int64_t stride, VU* out) {
#pragma GCC unroll 4
  for (int jb = 0; jb < 4; ++jb) {
    __m512 a[4];
#pragma GCC unroll 4
    for (int il = 0; il < 4; ++il) {
      const uint16_t* p = src + il * stride + 4 * jb;
      const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(LoadHalfPair(p, 4 * stride)),
                                                LoadHalfPair(p + 8 * stride, 4 * stride), 1);
      a[il] = _mm512_cvtph_ps(h);
    }
    TransposeBlocks4(a, jb, out);
  }
}
}  // namespace

#define KVCTL_W 16
#define KVCTL_SUFFIXED(name) name##Avx512
#include "kernels/quantize_simd_impl.inc"
#undef KVCTL_SUFFIXED
#undef KVCTL_W

}  // namespace kvctl::simd

#pragma GCC pop_options
