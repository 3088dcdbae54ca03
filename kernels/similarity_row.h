// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/similarity_row.h
// One row of R-KV's key-similarity pass (policies/eviction.cc, docs/algorithms.md §12.4): the
// column sums of S in fixed point and the near-duplicate bookkeeping, for the similarities s[k] of
// key i with the keys after it (k < n, key i + 1 + k).
//
// Fixed point: FixedSimilarity(s) = round(s * 2^40) to nearest, ties to even. The sums are exact
// integer sums, so any order of the additions gives the same bits: the AVX2 path is free to
// reorder them and agrees with the scalar reference (a GPU pass, not written, would too).
//
// Thread safety: reentrant, no state (the SIMD level is the process-wide one of
// kernels/quantize.h).
#ifndef KVCTL_KERNELS_SIMILARITY_ROW_H_
#define KVCTL_KERNELS_SIMILARITY_ROW_H_

#include <bit>
#include <cstdint>

namespace kvctl {

// round(s * 2^40), ties to even, for |s| < 2^11. s * 2^40 + 1.5 * 2^52 lies in [2^52, 2^53), where
// doubles are 1 apart: the addition is the rounding, and the bits minus those of 1.5 * 2^52 are
// the integer. Exact for any finite s in range (s * 2^40 is a power-of-two scaling).
inline int64_t FixedSimilarity(float s) {
  constexpr double kMagic = 0x1.8p52;
  const double v = static_cast<double>(s) * 0x1p40 + kMagic;
  return std::bit_cast<int64_t>(v) - std::bit_cast<int64_t>(kMagic);
}

// What a row pass returns: the row's own sum (column i's share of the upper triangle) and the
// largest k with s[k] > threshold (-1 when none: key i's newest later near-duplicate).
struct SimilarityRowSums {
  int64_t row_sum = 0;
  int64_t last_above = -1;
};

// The reference. For every k < n: q = FixedSimilarity(s[k]); col[k] += q; the row sum adds q;
// when s[k] > threshold (false for NaN), partner[k] = row and value[k] = s[k] (key i + 1 + k's
// latest earlier near-duplicate so far, when rows are passed in increasing order). n >= 0; the
// arrays hold n elements each and do not overlap.
SimilarityRowSums SimilarityRowRef(const float* s, int64_t n, float threshold, int32_t row,
                                   int64_t* col, int32_t* partner, float* value);

// The same results on the active SIMD level (AVX2 when the CPU has it, the reference otherwise).
SimilarityRowSums SimilarityRow(const float* s, int64_t n, float threshold, int32_t row,
                                int64_t* col, int32_t* partner, float* value);

namespace simd {
// SimilarityRow on AVX2 (kernels/similarity_row_avx2.cc); only called when the CPU has it.
SimilarityRowSums SimilarityRowAvx2(const float* s, int64_t n, float threshold, int32_t row,
                                    int64_t* col, int32_t* partner, float* value);
}  // namespace simd

}  // namespace kvctl

#endif  // KVCTL_KERNELS_SIMILARITY_ROW_H_
