// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/similarity_row.h
// Rows of R-KV's key similarities (policies/redundancy.h, docs/algorithms.md §12.4). SimilarityRow:
// the full pass's column sums of S and near-duplicate bookkeeping, for the similarities s[k] of
// key i with the keys after it (k < n, key i + 1 + k). LastAbove: the newest-first scan's search
// for the newest similarity above the threshold in one step of keys.
//
// The similarities are exact int32 dot products of the int16 unit keys (kernels/dot.h,
// DotRowsManyI16), so S is in fixed point already (a unit of 2^-28 for keys scaled by 2^14) and
// the column sums are exact int64 sums: any order of the additions gives the same bits, and the
// AVX2 path agrees with the scalar reference (a GPU pass, not written, would too).
//
// Thread safety: reentrant, no state (the SIMD level is the process-wide one of
// kernels/quantize.h).
#ifndef KVCTL_KERNELS_SIMILARITY_ROW_H_
#define KVCTL_KERNELS_SIMILARITY_ROW_H_

#include <cstdint>

namespace kvctl {

// What a row pass returns: the row's own sum (column i's share of the upper triangle) and the
// largest k with s[k] > threshold (-1 when none: key i's newest later near-duplicate).
struct SimilarityRowSums {
  int64_t row_sum = 0;
  int64_t last_above = -1;
};

// The reference. For every k < n: col[k] += s[k]; the row sum adds s[k]; when s[k] > threshold,
// partner[k] = row and value[k] = s[k] (key i + 1 + k's latest earlier near-duplicate so far, when
// rows are passed in increasing order). n >= 0; the arrays hold n elements each and do not
// overlap; the sums stay in int64 (n * 2^31 does for n < 2^32).
SimilarityRowSums SimilarityRowRef(const int32_t* s, int64_t n, int32_t threshold, int32_t row,
                                   int64_t* col, int32_t* partner, int32_t* value);

// The same results on the active SIMD level (AVX2 when the CPU has it, the reference otherwise).
SimilarityRowSums SimilarityRow(const int32_t* s, int64_t n, int32_t threshold, int32_t row,
                                int64_t* col, int32_t* partner, int32_t* value);

// The largest k < n with s[k] > threshold and k != skip (-1 when none): a row's newest
// near-duplicate among n keys, itself excluded (skip < 0 or >= n excludes nothing). n >= 0.
int64_t LastAboveRef(const int32_t* s, int64_t n, int32_t threshold, int64_t skip);

// The same on the active SIMD level.
int64_t LastAbove(const int32_t* s, int64_t n, int32_t threshold, int64_t skip);

namespace simd {
// LastAbove on AVX2: 64 elements at a time from the end in one mask, stopping at the first chunk
// with one.
int64_t LastAboveAvx2(const int32_t* s, int64_t n, int32_t threshold, int64_t skip);

// SimilarityRow on AVX2 (kernels/similarity_row_avx2.cc); only called when the CPU has it.
SimilarityRowSums SimilarityRowAvx2(const int32_t* s, int64_t n, int32_t threshold, int32_t row,
                                    int64_t* col, int32_t* partner, int32_t* value);
}  // namespace simd

}  // namespace kvctl

#endif  // KVCTL_KERNELS_SIMILARITY_ROW_H_
