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
// The finite check of LoadTokensT: absmax collects the |x| bits of the tile.
inline void FoldAbsBits(const VU* out, VU& absmax) {
  const __m512i mask = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m = (__m512i)absmax;
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) m = _mm512_max_epu32(m, _mm512_and_si512((__m512i)out[i], mask));
  absmax = (VU)m;
}
inline void LoadTransposed(const float* src, int64_t stride, VU* out, VU& absmax) {
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
  FoldAbsBits(out, absmax);
}
// The same from fp16 rows, transposed as 16-bit elements before widening (a 16 x 16 tile of
// halves fills 8 registers, not 16): register i holds rows i and i + 8; three rounds of unpacks
// transpose each 128-bit block's 8 x 8, after which register j's blocks hold channels j and j + 8
// of tokens 0-7 and 8-15; one block permute puts channel j in the low half and channel j + 8 in
// the high half, and vcvtph2ps widens each. The finite check runs on the halves too: Inf and NaN
// are the halves with |h| >= 0x7C00, and the absmax lanes whose two halves hold one become all
// ones (LoadTokensT's contract; the scalar check then names the element). About 100 vector
// operations per tile, where gathering 8-byte pieces, transposing the widened floats and
// checking them took about 145 (AVX-512 runs them on two ports): QuaRot 2-bit 5.3 -> 6.1 GB/s
// with the clamp skipped too (docs/kvbench_quant.md, session 48).
inline void LoadTransposed(const uint16_t* src, int64_t stride, VU* out, VU& absmax) {
  __m512i z[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * stride));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (i + 8) * stride));
    z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  const __m512i abs_mask = _mm512_set1_epi16(0x7FFF);
  __m512i h = _mm512_and_si512(z[0], abs_mask);
#pragma GCC unroll 8
  for (int i = 1; i < 8; ++i) h = _mm512_max_epu16(h, _mm512_and_si512(z[i], abs_mask));
  // |h| + 0x0400 has bit 15 set iff |h| >= 0x7C00 (no carry leaves the 16 bits).
  const __mmask16 bad = _mm512_test_epi32_mask(_mm512_add_epi16(h, _mm512_set1_epi16(0x0400)),
                                               _mm512_set1_epi32(static_cast<int>(0x80008000u)));
  absmax = (VU)_mm512_mask_mov_epi32((__m512i)absmax, bad, _mm512_set1_epi32(-1));
  __m512i a[8], b[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm512_unpacklo_epi16(z[2 * i], z[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi16(z[2 * i], z[2 * i + 1]);
  }
  // b[0..3] from rows 0-3 (a[0..3]), b[4..7] from rows 4-7 (a[4..7]): b[4h + q] holds channels
  // 2q and 2q + 1 of four rows.
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512i* p = a + 4 * h;
    b[4 * h + 0] = _mm512_unpacklo_epi32(p[0], p[2]);
    b[4 * h + 1] = _mm512_unpackhi_epi32(p[0], p[2]);
    b[4 * h + 2] = _mm512_unpacklo_epi32(p[1], p[3]);
    b[4 * h + 3] = _mm512_unpackhi_epi32(p[1], p[3]);
  }
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m512i c[2] = {_mm512_unpacklo_epi64(b[q], b[4 + q]),
                          _mm512_unpackhi_epi64(b[q], b[4 + q])};
#pragma GCC unroll 2
    for (int e = 0; e < 2; ++e) {
      const int j = 2 * q + e;
      const __m512i m = _mm512_shuffle_i64x2(c[e], c[e], _MM_SHUFFLE(3, 1, 2, 0));
      out[j] = (VU)_mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(m)));
      out[j + 8] = (VU)_mm512_castps_si512(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(m, 1)));
    }
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
