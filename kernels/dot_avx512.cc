// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX-512 VNNI instance of kernels/dot.h's int16 dot products (DotRowsManyI16). vpdpwssd adds 32
// int16 products, summed in pairs, into sixteen int32 lanes in one instruction (AVX2 needs a
// vpmaddwd and a vpaddd), and 32 vector registers hold a 4 x 4 block of accumulators with its
// four rows of keys. Integer sums in any order equal DotI16Ref's (the lanes wrap modulo 2^32
// like the reference's sum; the true total fits int32 by the caller's requirement). Only called
// when the CPU has AVX-512F/BW/VL and VNNI; rows whose length is not a multiple of 32, and the
// last count % 4 rows, go to the AVX2 path.
#include <immintrin.h>

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

}  // namespace

void DotRowsManyI16Avx512Vnni(const int16_t* a, int64_t a_stride, int64_t a_count,
                              const int16_t* rows, int64_t stride, int64_t count, int64_t n,
                              int32_t* out, int64_t out_stride) {
  if (n % 32 != 0) {
    DotRowsManyI16Avx2(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
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
