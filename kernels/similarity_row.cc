// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/similarity_row.h"

#include "kernels/quantize.h"

namespace kvctl {

SimilarityRowSums SimilarityRowRef(const float* s, int64_t n, float threshold, int32_t row,
                                   int64_t* col, int32_t* partner, float* value) {
  SimilarityRowSums out;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t q = FixedSimilarity(s[k]);
    col[k] += q;
    out.row_sum += q;
    if (s[k] > threshold) {
      partner[k] = row;
      value[k] = s[k];
      out.last_above = k;
    }
  }
  return out;
}

SimilarityRowSums SimilarityRow(const float* s, int64_t n, float threshold, int32_t row,
                                int64_t* col, int32_t* partner, float* value) {
  if (ActiveSimdLevel() != SimdLevel::kScalar) {
    return simd::SimilarityRowAvx2(s, n, threshold, row, col, partner, value);
  }
  return SimilarityRowRef(s, n, threshold, row, col, partner, value);
}

}  // namespace kvctl
