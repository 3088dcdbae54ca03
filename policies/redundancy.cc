// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "policies/redundancy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/crc32c.h"
#include "kernels/dot.h"
#include "kernels/similarity_row.h"

namespace kvctl {
namespace {

// The full pass, O(T^2 D / 2) with O(T) memory: column sums from the upper triangle of S; row i's
// newest partner is the last one above the threshold right of the diagonal, or else the latest
// earlier row that had i above it. *partner (-1: none) gets each row's.
std::vector<int64_t> FullPass(const int16_t* unit, int64_t t_n, int64_t d_n, int32_t threshold,
                              std::vector<int32_t>* partner) {
  partner->assign(static_cast<size_t>(t_n), -1);
  std::vector<int64_t> col(static_cast<size_t>(t_n), 0);
  // The newest partner of row i: right of the diagonal from row i's own pass; left of it (the
  // latest earlier row above the threshold) from the passes before, a select per element.
  std::vector<int32_t> left_partner(static_cast<size_t>(t_n), -1);
  std::vector<int32_t> left_value(static_cast<size_t>(t_n), 0);
  // Rows of S right of the diagonal, 32 at a time: the keys after the block are read once for
  // the 32 (DotRowsManyI16, which on AVX-512 VNNI transposes each 32 keys once for all the rows),
  // the pairs inside the block one row at a time. Row q of the block is at rows[q * t_n], its
  // element k the similarity with key i + q + 1 + k.
  constexpr int64_t kBlock = 32;
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
        (*partner)[row] = static_cast<int32_t>(row + 1 + sums.last_above);
        col[row + 1 + sums.last_above] -= s[sums.last_above];
      }
    }
  }
  for (int64_t i = 0; i < t_n; ++i) {
    if ((*partner)[i] < 0 && left_partner[i] >= 0) {
      (*partner)[i] = left_partner[i];
      col[left_partner[i]] -= left_value[i];
    }
  }
  return col;
}

// Keys per step of the newest-first scan: the step's keys (64 x D int16, 8 KiB at D = 64) stay in
// L1 while every pending row passes over them. Each step also gathers the pending rows and
// searches each row's similarities, so longer steps pay that less often, for dot products past a
// row's partner. A fresh scan (a prefill's first scoring: many rows pending for long) takes 64:
// over SmolLM2's 8K keys (90 heads) 21.8 % of the full pass's dot products against 32 keys' 21.6 %,
// and 14 % less time; 96 and 128 gave up into the full pass on a second head. A scoring that
// carries the state of the last one scans the few keys added since and the rows whose partner
// went, most of which find one at once: there 64 keys took 11 % more time than 32 (the 1/8
// recipe's steady state), so it keeps 32 (docs/eviction.md "Timings").
constexpr int64_t kFreshScanKeys = 64;
constexpr int64_t kScanKeys = 32;
// A fresh scan's first step is shorter: it decides whether the keys have near-duplicates at all,
// and on keys without them (the full pass follows) its 8 T dot products are the whole overhead.
constexpr int64_t kFirstScanKeys = 8;

// The widest head whose totals' pieces keep every dot product below 2^30 (see below).
constexpr int64_t kMaxPiecesHeadDim = 256;

// Σ_{i≠j} S_ij = ũ_j · t − ũ_j · ũ_j for every column j, with t = Σ_i ũ_i (S is linear in the
// keys), exactly in int64. t's elements reach T (2^15 − 8) < 2^37 (T <= 2^22), far past int16, so t
// is cut into four int16 pieces, t = 2^33 t3 + 2^22 t2 + 2^11 t1 + t0 (t0, t1, t2 in [0, 2^11),
// |t3| <= 16), and ũ_j · t is four exact int32 dot products per key (DotRowsManyI16): a piece has
// norm below 2^11 √D <= 2^15 at D <= 256 and a key at most 2^15 − 8, so every product and partial
// sum stays below 2^30. Wider heads take the double loop, also exact: every product and partial
// sum is an integer of magnitude at most T 2^30 <= 2^52.
std::vector<int64_t> ColumnSumsWithoutPartners(const int16_t* unit, int64_t t_n, int64_t d_n) {
  std::vector<int64_t> total(static_cast<size_t>(d_n), 0);
  // int32 sums over at most 2^15 rows (each element below 2^15 in magnitude) cannot overflow,
  // and vectorise where int64 ones do not.
  std::vector<int32_t> part(static_cast<size_t>(d_n));
  for (int64_t t0 = 0; t0 < t_n; t0 += int64_t{1} << 15) {
    std::fill(part.begin(), part.end(), 0);
    for (int64_t t = t0; t < std::min(t_n, t0 + (int64_t{1} << 15)); ++t) {
      const int16_t* u = unit + t * d_n;
      for (int64_t c = 0; c < d_n; ++c) part[c] += u[c];
    }
    for (int64_t c = 0; c < d_n; ++c) total[c] += part[c];
  }
  std::vector<int32_t> self(static_cast<size_t>(t_n));
  std::vector<int32_t> rows(static_cast<size_t>(t_n));  // Each key with itself.
  std::iota(rows.begin(), rows.end(), 0);
  DotPairsI16(unit, d_n, rows.data(), rows.data(), t_n, self.data());
  std::vector<int64_t> col(static_cast<size_t>(t_n));
  if (d_n > kMaxPiecesHeadDim) {
    for (int64_t j = 0; j < t_n; ++j) {
      const int16_t* u = unit + j * d_n;
      double dot = 0;
      for (int64_t c = 0; c < d_n; ++c) dot += u[c] * static_cast<double>(total[c]);
      col[j] = static_cast<int64_t>(dot) - self[j];
    }
    return col;
  }
  constexpr int kPieces = 4, kPieceBits = 11;
  std::vector<int16_t> pieces(static_cast<size_t>(kPieces * d_n));
  for (int64_t c = 0; c < d_n; ++c) {
    int64_t rest = total[c];
    // Row 0 holds t3 and row 3 holds t0 (the order the sum below takes them in).
    for (int k = kPieces - 1; k > 0; --k) {
      pieces[k * d_n + c] = static_cast<int16_t>(rest & ((1 << kPieceBits) - 1));
      rest >>= kPieceBits;  // Arithmetic: floor division, so the lower pieces are >= 0.
    }
    pieces[c] = static_cast<int16_t>(rest);
  }
  std::vector<int32_t> dots(static_cast<size_t>(kPieces * t_n));
  DotRowsManyI16(pieces.data(), d_n, kPieces, unit, d_n, t_n, d_n, dots.data(), t_n);
  for (int64_t j = 0; j < t_n; ++j) {
    int64_t dot = 0;
    for (int k = 0; k < kPieces; ++k) dot = dot * (int64_t{1} << kPieceBits) + dots[k * t_n + j];
    col[j] = dot - self[j];
  }
  return col;
}

// A row of a newest-first scan and the keys it looks at: [floor, hi) of the scan, itself excluded.
struct ScanRow {
  int32_t row;
  int32_t hi;
};

// What a scan found: partner[row] and value[row] (S of the pair) for the rows that have one among
// their keys; `work` counts dot products.
struct ScanResult {
  std::vector<int32_t>& partner;
  std::vector<int32_t>& value;
  int64_t work = 0;
};

// The unit keys of `rows`, in order, to `out`. The common head sizes copy with a size known at
// compile time (a few vector moves in line): a library call per row of 128 bytes took a tenth of
// the scan over SmolLM2's 8K keys.
void GatherRows(const int16_t* unit, int64_t d_n, const std::vector<ScanRow>& rows, int16_t* out) {
  auto gather = [&](auto width) {
    for (size_t p = 0; p < rows.size(); ++p) {
      std::memcpy(out + p * width, unit + int64_t{rows[p].row} * width, width * sizeof(int16_t));
    }
  };
  if (d_n == 64) return gather(std::integral_constant<int64_t, 64>());
  if (d_n == 128) return gather(std::integral_constant<int64_t, 128>());
  gather(d_n);
}

// Gives up when, after the first step, more than 90 % of all the rows are still pending (keys
// without near-duplicates: a scan would cost T^2), or once work passes `budget` with rows pending.
struct GiveUp {
  bool probe_first = false;
  int64_t budget = std::numeric_limits<int64_t>::max();
};

// The newest-first scan over the keys [floor, ...) of `rows` (sorted by hi, descending): steps of
// step_keys keys from the highest hi down, each pending row dropping out at its newest key above
// the threshold. Rows that reach floor without one are left in *rows. false: gave up (see GiveUp).
bool ScanNewestFirst(const int16_t* unit, int64_t t_n, int64_t d_n, int32_t threshold,
                     int64_t floor, int64_t step_keys, GiveUp give_up, std::vector<ScanRow>* rows,
                     ScanResult* out) {
  std::vector<ScanRow> active;
  active.reserve(rows->size());
  size_t next = 0;  // (*rows)[next...] have not joined yet: their keys start lower.
  std::vector<int16_t> gathered;
  std::vector<int32_t> s;
  bool first = true;
  for (int64_t hi = rows->empty() ? floor : (*rows)[0].hi; hi > floor;) {
    if (active.empty() && next < rows->size()) hi = std::min<int64_t>(hi, (*rows)[next].hi);
    if (active.empty() && (next == rows->size() || hi <= floor)) break;
    const int64_t step = first && give_up.probe_first ? kFirstScanKeys : step_keys;
    const int64_t lo = std::max<int64_t>(hi - step, floor), width = hi - lo;
    while (next < rows->size() && (*rows)[next].hi > lo) active.push_back((*rows)[next++]);
    const auto n = static_cast<int64_t>(active.size());
    const int16_t* a = unit;
    // Every row in order (a fresh scan's first step) reads the keys in place; later steps
    // gather the few rows still pending.
    bool in_place = n == t_n;
    for (int64_t p = 0; in_place && p < n; ++p) in_place = active[p].row == p;
    if (!in_place) {
      gathered.resize(static_cast<size_t>(n * d_n));
      GatherRows(unit, d_n, active, gathered.data());
      a = gathered.data();
    }
    s.resize(static_cast<size_t>(n * width));
    DotRowsManyI16(a, d_n, n, unit + lo * d_n, d_n, width, d_n, s.data(), width);
    out->work += n * width;
    size_t still = 0;
    for (int64_t p = 0; p < n; ++p) {
      const ScanRow r = active[p];
      const int32_t* sp = s.data() + p * width;
      // A row that joined in this step looks at its own keys only; a row is not its own partner.
      const int64_t k = LastAbove(sp, std::min<int64_t>(r.hi, hi) - lo, threshold, r.row - lo);
      if (k >= 0) {
        out->partner[r.row] = static_cast<int32_t>(lo + k);
        out->value[r.row] = sp[k];
      } else {
        active[still++] = r;
      }
    }
    active.resize(still);
    const auto left = static_cast<int64_t>(still + (rows->size() - next));
    if (left > 0 &&
        ((first && give_up.probe_first && 10 * left > 9 * t_n) || out->work > give_up.budget)) {
      return false;
    }
    first = false;
    hi = lo;
  }
  active.insert(active.end(), rows->begin() + static_cast<int64_t>(next), rows->end());
  *rows = std::move(active);
  return true;
}

// The partners `state` gives these rows: those of its rows up to the first whose unit key changed
// (hash mismatch: its record was quantized again, e.g. flushed from fp16 rows), which is a prefix
// of these rows as they are; empty when the threshold changed. A partner or bound in the changed
// part says nothing about the prefix: that row's bound becomes the prefix's end (it scans the
// prefix). The state is our own cache, but checked rather than trusted: anything out of range, and
// it is not used.
std::vector<int32_t> UsablePrefix(const RedundancyState& state, const std::vector<uint32_t>& hash,
                                  int32_t threshold) {
  const int64_t rows = state.rows();
  if (state.threshold != threshold || rows > static_cast<int64_t>(hash.size()) ||
      static_cast<int64_t>(state.key_hash.size()) != rows) {
    return {};
  }
  const auto prefix = static_cast<int32_t>(
      std::mismatch(state.key_hash.begin(), state.key_hash.end(), hash.begin()).first -
      state.key_hash.begin());
  std::vector<int32_t> partner(state.partner.begin(), state.partner.begin() + prefix);
  for (int32_t i = 0; i < prefix; ++i) {
    int32_t& p = partner[i];
    if (p == i || p >= rows || (p < 0 && -int64_t{p} - 1 > rows)) return {};
    if (p >= prefix || -int64_t{p} - 1 > prefix) p = -(prefix + 1);
  }
  return partner;
}

// Each row's newest partner (-1: none) and S of the pair, by the newest-first scan: fresh, or
// from the partners `prior` of the first rows (UsablePrefix). false: gave up (the caller runs the
// full pass).
bool FindPartners(const int16_t* unit, int64_t t_n, int64_t d_n, int32_t threshold,
                  std::span<const int32_t> prior, bool may_give_up, ScanResult* out) {
  const auto old_rows = static_cast<int64_t>(prior.size());
  GiveUp give_up{.probe_first = may_give_up && old_rows == 0,
                 .budget = may_give_up ? t_n * (t_n - 1) / 4  // Half the full pass.
                                       : std::numeric_limits<int64_t>::max()};
  // Every row looks at the keys past the prior's rows (all of them when fresh).
  std::vector<ScanRow> rows(static_cast<size_t>(t_n));
  for (int64_t i = 0; i < t_n; ++i) {
    rows[i] = {static_cast<int32_t>(i), static_cast<int32_t>(t_n)};
  }
  const int64_t step_keys = old_rows == 0 ? kFreshScanKeys : kScanKeys;
  if (!ScanNewestFirst(unit, t_n, d_n, threshold, old_rows, step_keys, give_up, &rows, out)) {
    return false;
  }
  if (old_rows == 0) return true;
  // Then an old row keeps its partner, or scans on below the one it had; a new row scans the
  // old keys.
  std::vector<ScanRow> below;
  std::vector<int32_t> kept_rows, kept_partners;  // Old rows that keep their partner.
  for (const ScanRow& r : rows) {
    if (r.row >= old_rows) {
      below.push_back({r.row, static_cast<int32_t>(old_rows)});
      continue;
    }
    const int32_t p = prior[r.row];
    if (p >= 0) {
      kept_rows.push_back(r.row);
      kept_partners.push_back(p);
    } else if (p < -1) {
      below.push_back({r.row, -(p + 1)});
    }
  }
  std::vector<int32_t> kept_values(kept_rows.size());
  DotPairsI16(unit, d_n, kept_rows.data(), kept_partners.data(),
              static_cast<int64_t>(kept_rows.size()), kept_values.data());
  for (size_t k = 0; k < kept_rows.size(); ++k) {
    out->partner[kept_rows[k]] = kept_partners[k];
    out->value[kept_rows[k]] = kept_values[k];
  }
  std::stable_sort(below.begin(), below.end(),
                   [](const ScanRow& a, const ScanRow& b) { return a.hi > b.hi; });
  return ScanNewestFirst(unit, t_n, d_n, threshold, 0, step_keys, give_up, &below, out);
}

}  // namespace

uint32_t UnitKeyChecksum(const int16_t* unit, int64_t head_dim) {
  return Crc32c(unit, static_cast<size_t>(head_dim) * sizeof(int16_t));
}

std::vector<int64_t> RedundancyColumnSums(const int16_t* unit, int64_t tokens, int64_t head_dim,
                                          int32_t threshold, RedundancyPass pass,
                                          RedundancyState* state) {
  const int64_t t_n = tokens, d_n = head_dim;
  std::vector<uint32_t> hash;
  std::vector<int32_t> prior;
  if (state != nullptr) {
    hash.resize(static_cast<size_t>(t_n));
    Crc32cRows(unit, static_cast<size_t>(d_n) * sizeof(int16_t), static_cast<size_t>(t_n),
               hash.data());  // UnitKeyChecksum of every row.
    if (pass == RedundancyPass::kAuto) prior = UsablePrefix(*state, hash, threshold);
    // Under half the rows: a fresh scan, whose first step can tell keys without near-duplicates
    // (the full pass) for 8 T dot products; scanning the new keys cannot stop that early.
    if (static_cast<int64_t>(prior.size()) * 2 < t_n) prior.clear();
  }
  std::vector<int32_t> partner(static_cast<size_t>(t_n), -1), value(static_cast<size_t>(t_n), 0);
  ScanResult found{partner, value};
  std::vector<int64_t> col;
  bool full_pass = false;
  if (pass != RedundancyPass::kFull &&
      FindPartners(unit, t_n, d_n, threshold, prior, pass == RedundancyPass::kAuto, &found)) {
    col = ColumnSumsWithoutPartners(unit, t_n, d_n);
    for (int64_t i = 0; i < t_n; ++i) {
      if (partner[i] >= 0) col[partner[i]] -= value[i];
    }
  } else {
    col = FullPass(unit, t_n, d_n, threshold, &partner);
    found.work += t_n * (t_n - 1) / 2;
    prior.clear();  // The partners are the full pass's.
    full_pass = true;
  }
  if (state != nullptr) {
    state->partner = std::move(partner);
    state->key_hash = std::move(hash);
    state->threshold = threshold;
    state->reused_rows = static_cast<int64_t>(prior.size());
    state->full_pass = full_pass;
    state->dot_products = found.work;
  }
  return col;
}

Status CompactRedundancy(RedundancyState* state, std::span<const int64_t> kept) {
  const int64_t rows = state->rows();
  for (size_t j = 0; j < kept.size(); ++j) {
    if (kept[j] < 0 || kept[j] >= rows || (j > 0 && kept[j] <= kept[j - 1])) {
      return InvalidArgument("kept[", j, "]: ", kept[j], ", expected strictly increasing indices ",
                             "below the ", rows, " rows of the redundancy state");
    }
  }
  // A partner or bound at old row r becomes the number of kept rows below r: the kept row's new
  // index when r is kept, else the first kept row above it (none at or above r stays none).
  std::vector<int32_t> kept_below(static_cast<size_t>(rows) + 1);
  size_t next = 0;
  for (int64_t r = 0; r <= rows; ++r) {
    kept_below[r] = static_cast<int32_t>(next);
    if (next < kept.size() && kept[next] == r) ++next;
  }
  RedundancyState out;
  out.threshold = state->threshold;
  // Still the state that scoring made: what it spent stays (KvSequence::RedundancyStateOf).
  out.reused_rows = state->reused_rows;
  out.full_pass = state->full_pass;
  out.dot_products = state->dot_products;
  out.partner.reserve(kept.size());
  out.key_hash.reserve(kept.size());
  for (int64_t i : kept) {
    const int32_t p = state->partner[i];
    const int64_t at = p >= 0 ? p : -(int64_t{p} + 1);
    if (at > rows || (p >= 0 && at == rows)) {
      return InvalidArgument("redundancy state: row ", i, " holds ", p,
                             ", expected a partner below ", rows, " or a bound at most ", rows);
    }
    const bool p_kept = p >= 0 && kept_below[at + 1] > kept_below[at];
    out.partner.push_back(p_kept ? kept_below[at] : -(kept_below[at] + 1));
    out.key_hash.push_back(state->key_hash[i]);
  }
  *state = std::move(out);
  return OkStatus();
}

}  // namespace kvctl
