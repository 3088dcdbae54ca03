// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/similarity_row.h"

#include "kernels/quantize.h"

namespace kvctl {

SimilarityRowSums SimilarityRowRef(const int32_t* s, int64_t n, int32_t threshold, int32_t row,
                                   int64_t* col, int32_t* partner, int32_t* value) {
  SimilarityRowSums out;
  for (int64_t k = 0; k < n; ++k) {
    col[k] += s[k];
    out.row_sum += s[k];
    if (s[k] > threshold) {
      partner[k] = row;
      value[k] = s[k];
      out.last_above = k;
    }
  }
  return out;
}

int64_t LastAboveRef(const int32_t* s, int64_t n, int32_t threshold, int64_t skip) {
  for (int64_t k = n - 1; k >= 0; --k) {
    if (s[k] > threshold && k != skip) return k;
  }
  return -1;
}

int64_t LastAbove(const int32_t* s, int64_t n, int32_t threshold, int64_t skip) {
  if (ActiveSimdLevel() != SimdLevel::kScalar) return simd::LastAboveAvx2(s, n, threshold, skip);
  return LastAboveRef(s, n, threshold, skip);
}

SimilarityRowSums SimilarityRow(const int32_t* s, int64_t n, int32_t threshold, int32_t row,
                                int64_t* col, int32_t* partner, int32_t* value) {
  if (ActiveSimdLevel() != SimdLevel::kScalar) {
    return simd::SimilarityRowAvx2(s, n, threshold, row, col, partner, value);
  }
  return SimilarityRowRef(s, n, threshold, row, col, partner, value);
}

}  // namespace kvctl
