// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX2 instance of SimilarityRow (kernels/similarity_row.h): eight similarities per step, the
// fixed-point conversion four at a time in double lanes (the same magic-number rounding as the
// reference), integer sums in four int64 lanes (exact, so the order does not matter), and the
// threshold as a compare mask that blends the partner and value arrays.
#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "kernels/similarity_row.h"

#pragma GCC push_options
#pragma GCC target("avx2")

namespace kvctl::simd {
namespace {

// FixedSimilarity of four floats, as int64 lanes.
inline __m256i Fixed4(__m128 s) {
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
  const __m256d v = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtps_pd(s), _mm256_set1_pd(0x1p40)), magic);
  return _mm256_sub_epi64(_mm256_castpd_si256(v), _mm256_castpd_si256(magic));
}

}  // namespace

SimilarityRowSums SimilarityRowAvx2(const float* s, int64_t n, float threshold, int32_t row,
                                    int64_t* col, int32_t* partner, float* value) {
  SimilarityRowSums out;
  const __m256 thr = _mm256_set1_ps(threshold);
  const __m256 row_v = _mm256_castsi256_ps(_mm256_set1_epi32(row));
  __m256i sum = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 x = _mm256_loadu_ps(s + k);
    const __m256i lo = Fixed4(_mm256_castps256_ps128(x));
    const __m256i hi = Fixed4(_mm256_extractf128_ps(x, 1));
    auto* c = reinterpret_cast<__m256i*>(col + k);
    _mm256_storeu_si256(c, _mm256_add_epi64(_mm256_loadu_si256(c), lo));
    _mm256_storeu_si256(c + 1, _mm256_add_epi64(_mm256_loadu_si256(c + 1), hi));
    sum = _mm256_add_epi64(sum, _mm256_add_epi64(lo, hi));
    const __m256 above = _mm256_cmp_ps(x, thr, _CMP_GT_OQ);
    const int mask = _mm256_movemask_ps(above);
    if (mask == 0) continue;
    auto* p = reinterpret_cast<float*>(partner + k);
    _mm256_storeu_ps(p, _mm256_blendv_ps(_mm256_loadu_ps(p), row_v, above));
    _mm256_storeu_ps(value + k, _mm256_blendv_ps(_mm256_loadu_ps(value + k), x, above));
    out.last_above = k + 31 - std::countl_zero(static_cast<uint32_t>(mask));
  }
  alignas(32) int64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  out.row_sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  const SimilarityRowSums tail =
      SimilarityRowRef(s + k, n - k, threshold, row, col + k, partner + k, value + k);
  out.row_sum += tail.row_sum;
  if (tail.last_above >= 0) out.last_above = k + tail.last_above;
  return out;
}

}  // namespace kvctl::simd

#pragma GCC pop_options
