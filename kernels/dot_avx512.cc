// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX-512 VNNI instance of kernels/dot.h's int16 dot products (DotRowsManyI16). vpdpwssd adds 32
// int16 products, summed in pairs, into sixteen int32 lanes in one instruction (AVX2 needs a
// vpmaddwd and a vpaddd). Integer sums in any order equal DotI16Ref's (the lanes wrap modulo 2^32
// like the reference's sum; the true total fits int32 by the caller's requirement). Only called
// when the CPU has AVX-512F/BW/VL and VNNI; rows whose length is not a multiple of 32 go to the
// AVX2 path.
//
// Two layouts. With a few rows of `a` (fewer than kMinRowsLanesOverKeys), lanes over elements: a
// 4 x 4 block of accumulators, each dot product summed across its lanes at the end. With more,
// lanes over keys: 32 keys at a time are transposed into pairs (vector p holds elements 2p and
// 2p + 1 of sixteen keys), and each row of `a` broadcasts its pairs against them, so a vector
// of sixteen totals comes out with no sum across lanes. At D = 64 that sum was most of the
// first layout's instructions: the second takes 0.5 ns a dot product against 1.3-1.4 with 1,024
// rows x 32 keys, and is still ahead at 8 rows; at 4 rows the transposes cost more than they
// save (D = 128). docs/eviction.md "Timings" has the table.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/dot.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2")
// GCC 12 flags its own _mm512_undefined_*() inside avx512fintrin.h as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kvctl::simd {
namespace {

// out[i * out_stride + j] = a_i . b_j for A rows of `a` and the four rows b, b + stride, ...;
// n is a multiple of 32. The four totals of a row of `a` are adjacent in `out`: one store.
template <int A>
__attribute__((always_inline)) inline void BlockVnni(const int16_t* a, int64_t a_stride,
                                                     const int16_t* b, int64_t stride, int64_t n,
                                                     int32_t* out, int64_t out_stride) {
  __m512i acc[A][4];
  for (int i = 0; i < A; ++i) {
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_si512();
  }
  for (int64_t d = 0; d < n; d += 32) {
    __m512i y[4];
    for (int j = 0; j < 4; ++j) y[j] = _mm512_loadu_si512(b + j * stride + d);
    for (int i = 0; i < A; ++i) {
      const __m512i x = _mm512_loadu_si512(a + i * a_stride + d);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_dpwssd_epi32(acc[i][j], x, y[j]);
    }
  }
  for (int i = 0; i < A; ++i) {
    __m256i half[4];
    for (int j = 0; j < 4; ++j) {
      half[j] = _mm256_add_epi32(_mm512_castsi512_si256(acc[i][j]),
                                 _mm512_extracti64x4_epi64(acc[i][j], 1));
    }
    // hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7]: lane j of the
    // result is row j's total.
    const __m256i h =
        _mm256_hadd_epi32(_mm256_hadd_epi32(half[0], half[1]), _mm256_hadd_epi32(half[2], half[3]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i * out_stride),
                     _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
  }
}

// The lanes-over-keys layout (see the top; kernels/dot_lanes_over_keys.inc). Fewer keys leave
// most lanes of a vector idle (R-KV's first scan step has 8).
constexpr int64_t kMinKeysLanesOverKeys = 16;

// 16 x 16 int32 transpose in registers: r[i] lane j -> r[j] lane i.
__attribute__((always_inline)) inline void Transpose16(__m512i* r) {
  // v[k][m], block L: element 4L + m of rows 4k..4k+3.
  __m512i v[4][4];
  for (int k = 0; k < 4; ++k) {
    const __m512i lo01 = _mm512_unpacklo_epi32(r[4 * k], r[4 * k + 1]);
    const __m512i hi01 = _mm512_unpackhi_epi32(r[4 * k], r[4 * k + 1]);
    const __m512i lo23 = _mm512_unpacklo_epi32(r[4 * k + 2], r[4 * k + 3]);
    const __m512i hi23 = _mm512_unpackhi_epi32(r[4 * k + 2], r[4 * k + 3]);
    v[k][0] = _mm512_unpacklo_epi64(lo01, lo23);
    v[k][1] = _mm512_unpackhi_epi64(lo01, lo23);
    v[k][2] = _mm512_unpacklo_epi64(hi01, hi23);
    v[k][3] = _mm512_unpackhi_epi64(hi01, hi23);
  }
  // Row 4L + m of the result: block L of v[0][m], v[1][m], v[2][m], v[3][m]. 0x88 takes blocks
  // 0 and 2 of each source, 0xDD blocks 1 and 3.
  for (int m = 0; m < 4; ++m) {
    const __m512i x0 = _mm512_shuffle_i32x4(v[0][m], v[1][m], 0x88);
    const __m512i x1 = _mm512_shuffle_i32x4(v[0][m], v[1][m], 0xDD);
    const __m512i x2 = _mm512_shuffle_i32x4(v[2][m], v[3][m], 0x88);
    const __m512i x3 = _mm512_shuffle_i32x4(v[2][m], v[3][m], 0xDD);
    r[m] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    r[8 + m] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    r[4 + m] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
}

// The primitives kernels/dot_lanes_over_keys.inc builds on, sixteen int32 lanes.
using VecI = __m512i;
constexpr int64_t kLanes = 16;
inline VecI ZeroI() { return _mm512_setzero_si512(); }
inline VecI LoadI(const void* p) { return _mm512_loadu_si512(p); }
inline VecI LoadAlignedI(const int32_t* p) { return _mm512_load_si512(p); }
inline void StoreAlignedI(int32_t* p, VecI v) { _mm512_store_si512(p, v); }
inline VecI SplatI(int32_t x) { return _mm512_set1_epi32(x); }
// acc + the products of x's and k's int16 pairs, summed in pairs (vpdpwssd).
inline VecI AddPairProducts(VecI acc, VecI x, VecI k) { return _mm512_dpwssd_epi32(acc, x, k); }
// The first n <= kLanes lanes of v to out.
inline void StoreFirstI(int32_t* out, VecI v, int64_t n) {
  _mm512_mask_storeu_epi32(out, static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1), v);
}
inline void TransposeLanes(VecI* r) { Transpose16(r); }

#include "kernels/dot_lanes_over_keys.inc"

}  // namespace

void DotRowsManyI16Avx512Vnni(const int16_t* a, int64_t a_stride, int64_t a_count,
                              const int16_t* rows, int64_t stride, int64_t count, int64_t n,
                              int32_t* out, int64_t out_stride) {
  if (n % 32 != 0) {
    DotRowsManyI16Avx2(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
    return;
  }
  if (TakesLanesOverKeys(n, a_count, count)) {
    LanesOverKeys(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
    return;
  }
  // Four rows of `rows` at a time (in registers for the whole pass), every row of `a` over them:
  // each row of `rows` is read once per call.
  int64_t r = 0;
  for (; r + 4 <= count; r += 4) {
    const int16_t* b = rows + r * stride;
    int64_t q = 0;
    for (; q + 4 <= a_count; q += 4) {
      BlockVnni<4>(a + q * a_stride, a_stride, b, stride, n, out + q * out_stride + r, out_stride);
    }
    for (; q < a_count; ++q) {
      BlockVnni<1>(a + q * a_stride, a_stride, b, stride, n, out + q * out_stride + r, out_stride);
    }
  }
  if (r < count) {
    DotRowsManyI16Avx2(a, a_stride, a_count, rows + r * stride, stride, count - r, n, out + r,
                       out_stride);
  }
}

}  // namespace kvctl::simd

#pragma GCC pop_options
