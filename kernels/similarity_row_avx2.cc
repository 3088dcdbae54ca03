// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX2 instances of LastAbove and SimilarityRow (kernels/similarity_row.h). LastAbove: 64
// elements at a time from the end, every compare into one mask and its highest bit.
// SimilarityRow: eight similarities per step, widened to int64 four at a time for the column and
// row sums (exact, so the order does not matter), and the threshold as a compare mask that blends
// the partner and value arrays.
#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "kernels/similarity_row.h"

#pragma GCC push_options
#pragma GCC target("avx2")

namespace kvctl::simd {

namespace {

// Bit k set where s[k] > threshold, for k < n <= 64.
__attribute__((always_inline)) inline uint64_t AboveMask(const int32_t* s, int64_t n, __m256i thr,
                                                         int32_t threshold) {
  uint64_t mask = 0;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k));
    const auto bits =
        static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(x, thr))));
    mask |= uint64_t{bits} << k;
  }
  for (; k < n; ++k) mask |= uint64_t{s[k] > threshold} << k;
  return mask;
}

}  // namespace

// 64 elements at a time from the end, each chunk's compares in one mask and one test, instead of
// a data-dependent branch per 8: a scan step (64 keys or fewer) is one chunk. It took 3 % off
// R-KV's scan over SmolLM2's 8K keys (docs/eviction.md "Timings").
int64_t LastAboveAvx2(const int32_t* s, int64_t n, int32_t threshold, int64_t skip) {
  const __m256i thr = _mm256_set1_epi32(threshold);
  // The newest element of chunk [begin, begin + len) above the threshold, skip excluded; -1: none.
  auto chunk = [&](int64_t begin, int64_t len) -> int64_t {
    uint64_t mask = AboveMask(s + begin, len, thr, threshold);
    // Unsigned: a skip outside the chunk (negative ones wrap) clears nothing.
    const auto at = static_cast<uint64_t>(skip - begin);
    if (at < static_cast<uint64_t>(len)) mask &= ~(uint64_t{1} << at);
    return mask == 0 ? -1 : begin + 63 - std::countl_zero(mask);
  };
  int64_t end = n;
  for (; end > 64; end -= 64) {
    if (const int64_t k = chunk(end - 64, 64); k >= 0) return k;
  }
  return chunk(0, end);  // The oldest chunk, and all of a row of 64 or fewer.
}

SimilarityRowSums SimilarityRowAvx2(const int32_t* s, int64_t n, int32_t threshold, int32_t row,
                                    int64_t* col, int32_t* partner, int32_t* value) {
  SimilarityRowSums out;
  const __m256i thr = _mm256_set1_epi32(threshold);
  const __m256i row_v = _mm256_set1_epi32(row);
  __m256i sum = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k));
    const __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(x));
    const __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(x, 1));
    auto* c = reinterpret_cast<__m256i*>(col + k);
    _mm256_storeu_si256(c, _mm256_add_epi64(_mm256_loadu_si256(c), lo));
    _mm256_storeu_si256(c + 1, _mm256_add_epi64(_mm256_loadu_si256(c + 1), hi));
    sum = _mm256_add_epi64(sum, _mm256_add_epi64(lo, hi));
    const __m256i above = _mm256_cmpgt_epi32(x, thr);
    const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(above));
    if (mask == 0) continue;
    auto* p = reinterpret_cast<__m256i*>(partner + k);
    _mm256_storeu_si256(p, _mm256_blendv_epi8(_mm256_loadu_si256(p), row_v, above));
    auto* v = reinterpret_cast<__m256i*>(value + k);
    _mm256_storeu_si256(v, _mm256_blendv_epi8(_mm256_loadu_si256(v), x, above));
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
