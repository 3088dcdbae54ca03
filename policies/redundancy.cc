// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "policies/redundancy.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <utility>

#include "kernels/dot.h"
#include "kernels/similarity_row.h"

namespace kvctl {
namespace {

// The full pass, O(T^2 D / 2) with O(T) memory: column sums from the upper triangle of S; row i's
// newest partner is the last one above the threshold right of the diagonal, or else the latest
// earlier row that had i above it.
std::vector<int64_t> FullPass(const int16_t* unit, int64_t t_n, int64_t d_n, int32_t threshold) {
  std::vector<int64_t> col(static_cast<size_t>(t_n), 0);
  // The newest partner of row i: right of the diagonal from row i's own pass; left of it (the
  // latest earlier row above the threshold) from the passes before, a select per element.
  std::vector<uint8_t> has_right_partner(static_cast<size_t>(t_n), 0);
  std::vector<int32_t> left_partner(static_cast<size_t>(t_n), -1);
  std::vector<int32_t> left_value(static_cast<size_t>(t_n), 0);
  // Rows of S right of the diagonal, four at a time: the keys after the block are read once for
  // the four (DotRowsManyI16), the pairs inside the block one row at a time. Row q of the block is
  // at rows[q * t_n], its element k the similarity with key i + q + 1 + k.
  constexpr int64_t kBlock = 4;
  std::vector<int32_t> rows(static_cast<size_t>(kBlock * t_n));
  for (int64_t i = 0; i < t_n; i += kBlock) {
    const int64_t nb = std::min(kBlock, t_n - i);
    const int16_t* block = unit + i * d_n;
    DotRowsManyI16(block, d_n, nb, block + nb * d_n, d_n, t_n - i - nb, d_n, rows.data() + nb - 1,
                   t_n - 1);
    for (int64_t q = 0; q + 1 < nb; ++q) {
      DotRowsManyI16(block + q * d_n, d_n, 1, block + (q + 1) * d_n, d_n, nb - 1 - q, d_n,
                     rows.data() + q * t_n, t_n);
    }
    for (int64_t q = 0; q < nb; ++q) {
      const int64_t row = i + q;
      const int32_t* s = rows.data() + q * t_n;
      const SimilarityRowSums sums = SimilarityRow(
          s, t_n - row - 1, threshold, static_cast<int32_t>(row), col.data() + row + 1,
          left_partner.data() + row + 1, left_value.data() + row + 1);
      col[row] += sums.row_sum;
      if (sums.last_above >= 0) {
        has_right_partner[row] = 1;
        col[row + 1 + sums.last_above] -= s[sums.last_above];
      }
    }
  }
  for (int64_t i = 0; i < t_n; ++i) {
    if (!has_right_partner[i] && left_partner[i] >= 0) col[left_partner[i]] -= left_value[i];
  }
  return col;
}

// Keys per step of the newest-first scan: the step's keys (32 x D int16, 4 KiB at D = 64) stay in
// L1 while every pending row passes over them.
constexpr int64_t kScanKeys = 32;
// The first step is shorter: it decides whether the keys have near-duplicates at all, and on keys
// without them (the full pass follows) its 8 T dot products are the whole overhead.
constexpr int64_t kFirstScanKeys = 8;

// The newest-first way (see the header). With may_give_up, nullopt (the caller runs the full pass)
// when more than 90 % of the rows have no partner among the newest kFirstScanKeys keys (keys
// without near-duplicates: the scan would cost T^2), or when the scan has used half of the full
// pass's dot products and rows are still pending.
std::optional<std::vector<int64_t>> NewestFirst(const int16_t* unit, int64_t t_n, int64_t d_n,
                                                int32_t threshold, bool may_give_up) {
  // Σ_{i≠j} S_ij = ũ_j · Σ_i ũ_i − ũ_j · ũ_j. In double, exactly: every element of the sum and
  // every product is an integer below 2^53, and so is every partial sum of ũ_j · Σ_i ũ_i, bounded
  // by |ũ_j| |Σ_i ũ_i| <= T |ũ|² (Cauchy-Schwarz; |ũ| is 2^14 to within √D / 2), about T 2^28:
  // far below 2^53 for T <= 2^22 (eviction.h's kMaxRedundancyTokens). Doubles vectorise where
  // int64 products do not.
  std::vector<double> total(static_cast<size_t>(d_n), 0.0);
  for (int64_t t = 0; t < t_n; ++t) {
    const int16_t* u = unit + t * d_n;
    for (int64_t c = 0; c < d_n; ++c) total[c] += u[c];
  }
  std::vector<int64_t> col(static_cast<size_t>(t_n));
  for (int64_t j = 0; j < t_n; ++j) {
    const int16_t* u = unit + j * d_n;
    // Exact, so any order: eight running sums, which vectorise (one serial chain of additions
    // was a third of this function's time).
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t c = 0;
    for (; c + 8 <= d_n; c += 8) {
      for (int l = 0; l < 8; ++l) acc[l] += u[c + l] * total[c + l];
    }
    for (; c < d_n; ++c) acc[0] += u[c] * total[c];
    const double dot =
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    col[j] = static_cast<int64_t>(dot) - DotI16Ref(u, u, d_n);
  }
  // Rows whose newest partner is not found yet, ascending; the keys [lo, hi) are the next step.
  std::vector<int32_t> pending(static_cast<size_t>(t_n));
  std::iota(pending.begin(), pending.end(), 0);
  std::vector<int16_t> gathered;
  std::vector<int32_t> s;
  const int64_t budget = t_n * (t_n - 1) / 4;  // Dot products: half of the full pass's.
  int64_t work = 0;
  for (int64_t hi = t_n; hi > 0 && !pending.empty();) {
    const int64_t step = hi == t_n ? kFirstScanKeys : kScanKeys;
    const int64_t lo = std::max<int64_t>(hi - step, 0), width = hi - lo;
    const auto n = static_cast<int64_t>(pending.size());
    const int16_t* rows = unit;
    if (n < t_n) {  // Gather the pending rows: after the first step they are few.
      gathered.resize(static_cast<size_t>(n * d_n));
      for (int64_t p = 0; p < n; ++p) {
        std::copy_n(unit + pending[p] * d_n, d_n, gathered.data() + p * d_n);
      }
      rows = gathered.data();
    }
    s.resize(static_cast<size_t>(n * width));
    DotRowsManyI16(rows, d_n, n, unit + lo * d_n, d_n, width, d_n, s.data(), width);
    work += n * width;
    size_t still = 0;
    for (int64_t p = 0; p < n; ++p) {
      const int32_t row = pending[p];
      const int32_t* sp = s.data() + p * width;
      // A row is not its own partner.
      const int64_t k = LastAbove(sp, width, threshold, row - lo);
      if (k >= 0) {
        col[lo + k] -= sp[k];
      } else {
        pending[still++] = row;
      }
    }
    pending.resize(still);
    const auto left = static_cast<int64_t>(still);
    if (may_give_up && left > 0 && ((hi == t_n && 10 * left > 9 * t_n) || work > budget)) {
      return std::nullopt;
    }
    hi = lo;
  }
  return col;
}

}  // namespace

std::vector<int64_t> RedundancyColumnSums(const int16_t* unit, int64_t tokens, int64_t head_dim,
                                          int32_t threshold, RedundancyPass pass) {
  switch (pass) {
    case RedundancyPass::kFull:
      return FullPass(unit, tokens, head_dim, threshold);
    case RedundancyPass::kNewestFirst:
      return *NewestFirst(unit, tokens, head_dim, threshold, /*may_give_up=*/false);
    case RedundancyPass::kAuto:
      break;
  }
  std::optional<std::vector<int64_t>> col =
      NewestFirst(unit, tokens, head_dim, threshold, /*may_give_up=*/true);
  return col ? std::move(*col) : FullPass(unit, tokens, head_dim, threshold);
}

}  // namespace kvctl
