// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Token-eviction scorers for one KV head.
//
// Every scorer answers the same question for a head holding T resident tokens: which candidates
// (tokens outside the protected sinks [0, s) and recent window [T - r, T)) are worth keeping?
// Notation: keys k_j in R^D, j < T, oldest first; the observation queries are the query rows of
// the last m resident tokens, query token i sitting at position p_i = T - m + i; the KV head is
// read by g query heads (GQA). Logits are q.k / sqrt(D). Tags: [paper] = the method's paper or
// reference code as summarised in docs/algorithms.md §12; [ours] = a choice made here.
//
// StreamingLLM [paper: keep 4 sinks + the recent W, evict FIFO]. Candidate j scores j, so any
// budget keeps the sinks, the window and then the newest candidates. Positions are not re-indexed:
// the daemon stores post-RoPE keys, so this is the "no re-indexing" variant [ours].
//
// H2O [paper]. At every decode step each query head of the group puts a softmax over all resident
// keys; acc_j adds that probability, summed over the g heads and over the steps, unnormalised. The
// lowest-acc candidate goes first. [ours] A batch of n query tokens (a prefill chunk) is applied
// causally: query token i sees keys [0, p_i]. Tokens that arrived without queries start at 0.
//
// R-KV [paper, code rkv/compression/r1_kv.py and rkv/utils.py]. Importance: for each observation
// query, the group's logits are reduced by a max over the g heads FIRST, then a softmax runs over
// the non-window keys [0, T - r) only; a_j is the mean over the m queries, then a 1-D max pool of
// kernel 7 with padding 3. (R-KV's description leaves the order of "softmax" and "max over the
// group" open; the code takes the max of the logits, and so do we. A test pins it.) Redundancy:
// unit keys u_j = k_j / (|k_j| + 1e-8), S = U U^T over ALL T keys with a zero diagonal; in each
// row i the largest j with S_ij > 0.5 (the most recent near-duplicate) has S_ij set to 0, which
// spares that copy; r = softmax_j(mean_i S_ij) over all T columns, and only then are the window
// columns dropped. Score s_j = lambda a_j - (1 - lambda) r_j, lambda = 0.07.
//   Departures, all [ours]: (1) the reference zeroes S_i0 when row i has no near-duplicate (its max
//   over an all-zero index row is 0); we zero nothing in that case, as docs/algorithms.md §12.4
//   states it. Column 0 is a sink in practice, so only the shared softmax normaliser moves. (2)
//   R-KV ties the protected window to the observation window (both w = 8). Here the window r comes
//   from the daemon and m from the policy; when r >= m every observation query follows every
//   importance key and the math is the reference's; when r < m we apply the causal mask (query i
//   sees keys j <= p_i), which the reference never needs. (3) The reference has no sinks; ours sit
//   inside the softmax and the pooling like any key, and only SelectKeep treats them differently.
//   With s = 0 and r = m the scores are the reference's.
//
// SnapKV [paper: prefill-only, w = 32, kernel 5, avg pool]. Used at decode time as R-KV with
// lambda = 1 (docs/algorithms.md §12.5, [ours]), with SnapKV's own window and pooling. Versus the
// original this sums -> means the queries (same ranking), leaves the window out of the softmax
// denominator (the original includes it under a causal mask) and reduces the group by a max of
// logits (the original scores each query head on its own). lambda = 1 makes the redundancy term
// exactly zero, so it is not computed.
//
// Cost per head: importance O(m g T D); redundancy O(T D) plus one dot product per key each row
// scans back to its newest near-duplicate (policies/redundancy.h: a few keys on the model's keys;
// keys with few near-duplicates fall back to the upper triangle, O(T^2 D / 2)), O(T) memory.
// Every softmax is kernels/exp.h's SoftmaxNumerators: exponentials in float by ExpRef (within 2
// ulp of exp, the same bits on every CPU and C library) and their sum in one fixed order.
// [ours] Logits of R-KV and SnapKV come from the same int16 unit rows as the redundancy: the keys'
// and the (scaled) observation queries' (kernels/dot.h UnitRowsI16), logit = float(dot) *
// ((|q| |k|) * 2^-28) with dot their exact int32 product. Off from q.k by at most
// |q| |k| (2 sqrt(D) 2^-15 + D 2^-30) (about |q| |k| 3e-5 typically), below the fp16 rounding of
// the keys themselves (2^-11 relative per element), so a softmax probability moves by a factor
// within e^(+-2 eps); for that, the logits run on integer SIMD at about twice the float rate with
// half the bytes of keys. H2O and the mass metric keep float logits (kernels/dot.h DotRef's order,
// the same bits on every CPU): one query token per step would not pay for the unit rows.
// [ours] The unit keys are rounded to int16, round(k * (2^14 / norm)), and S_ij is their exact
// int32 dot product times 2^-28: a cosine off by at most sqrt(D) 2^-14 + D 2^-30 (5e-4 at D = 64;
// about 3e-5 typically, the rounding errors of 2^-15 or less per element having random signs), in
// exchange for integer SIMD (half the loads and half the vector operations of float products) and
// exact column sums in int64, which any order of the additions gives with the same bits, so they
// vectorise, and a sum kept between compressions and updated for the rows that changed would equal
// a recomputed one. The mean is then col * 2^-28 / T in double.
#include "policies/eviction.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/convert.h"
#include "kernels/dot.h"
#include "kernels/exp.h"
#include "policies/redundancy.h"

namespace kvctl {
namespace {

constexpr float kProtectedScore = std::numeric_limits<float>::infinity();
// R-KV's unit keys are rounded to multiples of 1 / kUnitScale (int16; see Redundancy).
constexpr double kUnitScale = 0x1p14;

Status CheckKeys(const KeyRows& keys) {
  if (keys.tokens <= 0) return InvalidArgument("keys: tokens must be > 0, got ", keys.tokens);
  if (keys.head_dim <= 0) {
    return InvalidArgument("keys: head_dim must be > 0, got ", keys.head_dim);
  }
  if (keys.data == nullptr) return InvalidArgument("keys: data pointer is null");
  // The rows are back to back: one SIMD scan (kernels/convert.h) over all of them.
  const size_t bad =
      FirstNonFinite(DType::kF32, keys.data, static_cast<size_t>(keys.tokens * keys.head_dim));
  if (bad == static_cast<size_t>(keys.tokens * keys.head_dim)) return OkStatus();
  const int64_t t = static_cast<int64_t>(bad) / keys.head_dim;
  const int64_t d = static_cast<int64_t>(bad) % keys.head_dim;
  return InvalidArgument("keys: element (token ", t, ", channel ", d, ") is ", keys.data[bad],
                         ", expected a finite value");
}

Status CheckRegions(ProtectedRegions regions) {
  if (regions.sinks < 0) return InvalidArgument("sinks: got ", regions.sinks, ", expected >= 0");
  if (regions.recent < 0) {
    return InvalidArgument("recent: got ", regions.recent, ", expected >= 0");
  }
  return OkStatus();
}

// Candidates are [lo, hi); empty when lo >= hi.
struct CandidateRange {
  int64_t lo;
  int64_t hi;
};
CandidateRange Candidates(int64_t tokens, ProtectedRegions regions) {
  return {std::min(regions.sinks, tokens), std::max<int64_t>(tokens - regions.recent, 0)};
}

Status CheckKernel(const char* field, int kernel) {
  if (kernel < 1 || kernel > 63 || kernel % 2 == 0) {
    return InvalidArgument(field, ": got ", kernel, ", expected an odd value in 1..63");
  }
  return OkStatus();
}

// The last m query tokens of a [n, g, D] view, pre-scaled by 1/sqrt(D), as fp32 [m][g][D].
struct ObsQueries {
  int64_t m = 0;
  int64_t g = 0;
  int64_t d = 0;
  std::vector<float> rows;
  const float* Row(int64_t i, int64_t h) const { return rows.data() + (i * g + h) * d; }
};

StatusOr<ObsQueries> LoadQueries(const KvTensorView& q, int64_t use_last, const KeyRows& keys) {
  KVCTL_RETURN_IF_ERROR(q.Validate("queries"));
  if (q.head_dim != keys.head_dim) {
    return InvalidArgument("queries: head_dim ", q.head_dim, " does not match keys head_dim ",
                           keys.head_dim);
  }
  ObsQueries out;
  out.m = std::min(use_last, q.tokens);
  out.g = q.heads;
  out.d = q.head_dim;
  if (out.m > keys.tokens) {
    return InvalidArgument("queries: ", out.m, " observation query tokens but only ", keys.tokens,
                           " keys; expected the queries of the last resident tokens");
  }
  out.rows.resize(static_cast<size_t>(out.m * out.g * out.d));
  const float scale = 1.0f / std::sqrt(static_cast<float>(out.d));
  const int64_t first = q.tokens - out.m;
  for (int64_t i = 0; i < out.m; ++i) {
    for (int64_t h = 0; h < out.g; ++h) {
      float* row = out.rows.data() + (i * out.g + h) * out.d;
      q.LoadRow(first + i, h, row);
      for (int64_t c = 0; c < out.d; ++c) {
        if (!std::isfinite(row[c])) {
          return InvalidArgument("queries: element (token ", first + i, ", head ", h, ", channel ",
                                 c, ") is ", row[c], ", expected a finite value");
        }
        row[c] *= scale;
      }
    }
  }
  return out;
}

// Rows as int16 unit vectors and their norms (kernels/dot.h UnitRowsI16 at scale 2^14): any two
// unit rows have an exact int32 dot product, and x.y is approximated by dot * 2^-28 * norm_x *
// norm_y (the essay above). The vectors are a thread's scratch, kept between calls (ScoreScratch).
struct UnitRows {
  int64_t d = 0;
  std::vector<int16_t> unit;
  std::vector<float> norm;
  const int16_t* Row(int64_t r) const { return unit.data() + r * d; }

  void Set(const float* rows, int64_t n, int64_t head_dim) {
    d = head_dim;
    unit.resize(static_cast<size_t>(n * d));
    norm.resize(static_cast<size_t>(n));
    UnitRowsI16(rows, d, n, d, static_cast<float>(kUnitScale), unit.data(), norm.data());
  }
};

// A thread's buffers for ScoreAttention, kept between calls: fresh ones were faulted in (and their
// zeroing paid) at every scoring of every head. Released after a call that grew them past
// kKeptBytes, so one huge head does not pin its buffers in every worker for good.
struct ScoreScratch {
  static constexpr size_t kKeptBytes = size_t{16} << 20;
  UnitRows keys;
  UnitRows queries;
  std::vector<int32_t> dots;
  std::vector<float> logits;

  size_t Bytes() const {
    return keys.unit.capacity() * 2 + queries.unit.capacity() * 2 + dots.capacity() * 4 +
           (keys.norm.capacity() + queries.norm.capacity() + logits.capacity()) * 4;
  }
  void TrimIfLarge() {
    if (Bytes() > kKeptBytes) *this = ScoreScratch{};
  }
};

// One per thread, shared by the scorers and the mass metric (never nested).
ScoreScratch& ThreadScoreScratch() {
  thread_local ScoreScratch scratch;
  return scratch;
}

// Where ForEachQueryLogits takes its logits from. Both fill out[r * ld + j] for query row
// r < rows (rows back to back from `first`) and key j in [key_begin, key_begin + count).
// Float rows: DotRef(q, k_j), every bit (SnapKV's and R-KV's logits before, H2O's now; the mass
// metric's until session 50).
struct FloatLogits {
  const KeyRows& keys;
  const ObsQueries& q;
  void Fill(int64_t first, int64_t rows, int64_t key_begin, int64_t count, float* out,
            int64_t ld) const {
    const int64_t d = keys.head_dim;
    DotRowsMany(q.rows.data() + first * d, d, rows, keys.data + key_begin * d, d, count, d,
                out + key_begin, ld);
  }
};
// Unit rows (R-KV and SnapKV): the exact int32 dot of the unit rows, then
// float(dot) * (norm_q * (norm_k * 2^-28)) in float (kernels/dot.h LogitsFromUnitDots).
// norm_k * 2^-28 is exact (norms are >= 1e-8, far from float's subnormals), so the product is the
// one rounding of norm_q norm_k 2^-28, and it overflows only where that value does (multiplying
// the norms first would overflow for huge finite queries).
struct UnitLogits {
  const UnitRows& keys;
  const UnitRows& q;
  std::vector<int32_t>* dots;
  void Fill(int64_t first, int64_t rows, int64_t key_begin, int64_t count, float* out,
            int64_t ld) const {
    const int64_t d = keys.d;
    dots->resize(static_cast<size_t>(rows * ld));
    int32_t* dot = dots->data();
    DotRowsManyI16(q.Row(first), d, rows, keys.Row(key_begin), d, count, d, dot + key_begin, ld);
    for (int64_t r = 0; r < rows; ++r) {
      LogitsFromUnitDots(dot + r * ld + key_begin, q.norm[first + r], keys.norm.data() + key_begin,
                         count, out + r * ld + key_begin);
    }
  }
};

// Calls visit(i, logits, ld) for each observation query token i < m in order, where
// logits[h * ld + j] is the logit of query row (i, h) and key j for head h < g and key
// j < counts[i] (counts non-decreasing in i), from `source`. Tokens go in chunks whose rows (g per
// token) fill the dot kernels' blocks of four, so the keys are read once per four rows: the keys
// a whole chunk sees in one call, each token's later keys in one call for its g rows. Every logit
// is the source's whichever call computes it; the buffer is O(lcm(4, g) T).
template <typename Source, typename Visit>
void ForEachQueryLogits(const Source& source, int64_t m, int64_t g,
                        const std::vector<int64_t>& counts, std::vector<float>& chunk,
                        Visit visit) {
  // The fewest tokens whose g rows each make whole blocks of four (4 / gcd(g, 4) tokens): a row
  // left over would go through a one-row call and read every key once more.
  const int64_t chunk_tokens = 4 / std::gcd<int64_t>(g, 4);
  for (int64_t i0 = 0; i0 < m; i0 += chunk_tokens) {
    const int64_t i1 = std::min(m, i0 + chunk_tokens);
    const int64_t ld = std::max<int64_t>(counts[i1 - 1], 0);
    const int64_t common = std::max<int64_t>(counts[i0], 0);
    chunk.resize(static_cast<size_t>((i1 - i0) * g * ld));
    source.Fill(i0 * g, (i1 - i0) * g, 0, common, chunk.data(), ld);
    for (int64_t i = i0; i < i1; ++i) {
      float* rows = chunk.data() + (i - i0) * g * ld;
      const int64_t extra = counts[i] - common;
      if (extra > 0) source.Fill(i * g, g, common, extra, rows, ld);
      visit(i, rows, ld);
    }
  }
}

// For each query token i and head h: the causal softmax over keys [0, p_i] of `tokens`, each
// probability times `weight` added to out[j]. One softmax per head (H2O with float logits, the
// mass metric with unit rows' ones).
template <typename Source>
void AccumulatePerHeadSoftmax(const Source& source, int64_t tokens, const ObsQueries& q,
                              double weight, double* out) {
  std::vector<int64_t> counts(static_cast<size_t>(q.m));
  for (int64_t i = 0; i < q.m; ++i) counts[i] = tokens - q.m + i + 1;
  std::vector<float> z(static_cast<size_t>(tokens));
  std::vector<float> chunk;
  ForEachQueryLogits(source, q.m, q.g, counts, chunk,
                     [&](int64_t i, const float* rows, int64_t ld) {
                       const int64_t n = counts[i];
                       for (int64_t h = 0; h < q.g; ++h) {
                         const double w = weight / SoftmaxNumerators(rows + h * ld, z.data(), n);
                         AddScaled(z.data(), n, w, out);
                       }
                     });
}

// Importance before pooling over keys [0, n_imp) of `tokens`: per observation query (the m x g
// rows of `logits`), the group reduced by `group` and a softmax over `scope`'s keys; the mean over
// the m query tokens.
std::vector<double> Importance(const UnitLogits& logits, int64_t tokens, const ObsQueries& q,
                               int64_t n_imp, GqaReduce group, SoftmaxScope scope,
                               std::vector<float>& chunk) {
  std::vector<double> a(static_cast<size_t>(n_imp), 0.0);
  std::vector<float> z(static_cast<size_t>(tokens));
  // Softmax of x[0, n) (into z) added to a[0, min(n, n_imp)) with weight w.
  auto add_softmax = [&](const float* x, int64_t n, double w) {
    const double scale = w / SoftmaxNumerators(x, z.data(), n);
    AddScaled(z.data(), std::min(n, n_imp), scale, a.data());
  };
  // Query i sees keys [0, seen) (causal), and the softmax runs over its first n of them.
  std::vector<int64_t> counts(static_cast<size_t>(q.m));
  for (int64_t i = 0; i < q.m; ++i) {
    const int64_t seen = tokens - q.m + i + 1;
    counts[i] = scope == SoftmaxScope::kCausal ? seen : std::min(n_imp, seen);
  }
  ForEachQueryLogits(logits, q.m, q.g, counts, chunk,
                     [&](int64_t i, const float* rows, int64_t ld) {
                       const int64_t n = counts[i];
                       if (n <= 0 || std::min(n, n_imp) <= 0) return;
                       if (group == GqaReduce::kMaxLogit) {
                         std::copy(rows, rows + n, z.begin());
                         for (int64_t h = 1; h < q.g; ++h) {
                           const float* other = rows + h * ld;
                           for (int64_t j = 0; j < n; ++j) z[j] = std::max(z[j], other[j]);
                         }
                         add_softmax(z.data(), n, 1.0 / static_cast<double>(q.m));
                       } else {
                         for (int64_t h = 0; h < q.g; ++h) {
                           add_softmax(rows + h * ld, n, 1.0 / static_cast<double>(q.m * q.g));
                         }
                       }
                     });
  return a;
}

std::vector<double> Pool(const std::vector<double>& a, int kernel, PoolKind kind) {
  const int64_t n = static_cast<int64_t>(a.size());
  const int64_t half = kernel / 2;
  std::vector<double> out(a.size());
  for (int64_t j = 0; j < n; ++j) {
    const int64_t lo = std::max<int64_t>(j - half, 0);
    const int64_t hi = std::min<int64_t>(j + half + 1, n);
    if (kind == PoolKind::kMax) {
      out[j] = *std::max_element(a.begin() + lo, a.begin() + hi);
    } else {
      // PyTorch's avg_pool1d default (count_include_pad=True): padding zeros count.
      out[j] = std::accumulate(a.begin() + lo, a.begin() + hi, 0.0) / kernel;
    }
  }
  return out;
}

// R-KV redundancy r_j over all t_n keys (see the essay above), from their unit rows:
// |u| <= 1 (to a float rounding), so S_ij = dot * 2^-28.
std::vector<double> Redundancy(const UnitRows& unit, int64_t t_n, float threshold,
                               RedundancyState* state) {
  const int64_t d_n = unit.d;
  // S_ij > threshold <=> dot > threshold * 2^28 <=> dot > floor(threshold * 2^28) (dot is an
  // integer; threshold * 2^28 is exact in double and, for |threshold| <= 1, in int32's range).
  const auto fixed_threshold =
      static_cast<int32_t>(std::floor(static_cast<double>(threshold) * kUnitScale * kUnitScale));
  const std::vector<int64_t> col =
      RedundancyColumnSums(unit.Row(0), t_n, d_n, fixed_threshold, RedundancyPass::kAuto, state);
  // The mean cosines (rounded to float for the softmax, like the logits), then their softmax.
  std::vector<float> z(static_cast<size_t>(t_n));
  for (int64_t j = 0; j < t_n; ++j) {
    z[j] = static_cast<float>(static_cast<double>(col[j]) * 0x1p-28 / static_cast<double>(t_n));
  }
  const double sum = SoftmaxNumerators(z.data(), t_n);
  std::vector<double> r(static_cast<size_t>(t_n));
  for (int64_t j = 0; j < t_n; ++j) r[j] = static_cast<double>(z[j]) / sum;
  return r;
}

StatusOr<std::vector<float>> ScoreAttention(const KeyRows& keys, const KvTensorView& group_queries,
                                            ProtectedRegions regions, int64_t obs_window,
                                            int kernel, PoolKind pool, GqaReduce group,
                                            SoftmaxScope scope, float lambda, float threshold,
                                            RedundancyState* state) {
  KVCTL_RETURN_IF_ERROR(CheckKeys(keys));
  // Bounds the O(T^2) work far past any real budget (and the column sums far below 2^63).
  if (lambda < 1.0f && keys.tokens > kMaxRedundancyTokens) {
    return InvalidArgument("keys: tokens ", keys.tokens, " is more than R-KV's redundancy takes (",
                           kMaxRedundancyTokens, ")");
  }
  KVCTL_RETURN_IF_ERROR(CheckRegions(regions));
  KVCTL_ASSIGN_OR_RETURN(ObsQueries q, LoadQueries(group_queries, obs_window, keys));
  std::vector<float> scores(static_cast<size_t>(keys.tokens), kProtectedScore);
  const CandidateRange c = Candidates(keys.tokens, regions);
  if (c.lo >= c.hi) return scores;
  // One set of unit keys serves the logits and the redundancy.
  ScoreScratch& scratch = ThreadScoreScratch();
  scratch.keys.Set(keys.data, keys.tokens, keys.head_dim);
  scratch.queries.Set(q.rows.data(), q.m * q.g, q.d);
  const UnitRows& unit_keys = scratch.keys;
  const UnitLogits logits{unit_keys, scratch.queries, &scratch.dots};
  // The pooling runs over every non-window key, sinks included, as in R-KV and SnapKV.
  const std::vector<double> pooled =
      Pool(Importance(logits, keys.tokens, q, c.hi, group, scope, scratch.logits), kernel, pool);
  std::vector<double> r;
  if (lambda < 1.0f) {
    r = Redundancy(unit_keys, keys.tokens, threshold, state);
  } else if (state != nullptr) {
    *state = RedundancyState{};  // Nothing scored: no partners known for these keys.
  }
  scratch.TrimIfLarge();
  for (int64_t j = c.lo; j < c.hi; ++j) {
    double s = static_cast<double>(lambda) * pooled[j];
    if (!r.empty()) s -= (1.0 - static_cast<double>(lambda)) * r[j];
    scores[j] = static_cast<float>(s);
  }
  return scores;
}

// True when candidate a ranks before b: higher score, then the newer token.
struct Better {
  std::span<const float> scores;
  bool operator()(int64_t a, int64_t b) const {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a > b);
  }
};

// Protected count and the candidate indices; validates the SelectKeep inputs.
Status SplitCandidates(std::span<const float> scores, std::span<const uint8_t> protected_mask,
                       int64_t* protected_count, std::vector<int64_t>* candidates) {
  if (scores.empty()) {
    return InvalidArgument("scores: empty, expected one score per resident token");
  }
  if (protected_mask.size() != scores.size()) {
    return InvalidArgument("protected_mask: got ", protected_mask.size(), " entries, expected ",
                           scores.size(), " (one per score)");
  }
  *protected_count = 0;
  candidates->clear();
  for (size_t j = 0; j < scores.size(); ++j) {
    if (protected_mask[j] != 0) {
      ++*protected_count;
    } else if (std::isnan(scores[j])) {
      return InvalidArgument("scores[", j, "]: got nan, expected a number");
    } else {
      candidates->push_back(static_cast<int64_t>(j));
    }
  }
  return OkStatus();
}

Status CheckKept(std::span<const int64_t> kept, size_t tokens) {
  for (size_t i = 0; i < kept.size(); ++i) {
    if (kept[i] < 0 || static_cast<size_t>(kept[i]) >= tokens) {
      return InvalidArgument("kept[", i, "]: got ", kept[i], ", expected 0..", tokens - 1);
    }
    if (i > 0 && kept[i] <= kept[i - 1]) {
      return InvalidArgument("kept[", i, "]: got ", kept[i], " after ", kept[i - 1],
                             ", expected strictly increasing indices");
    }
  }
  return OkStatus();
}

}  // namespace

Status ValidateRkvParams(const RkvParams& params) {
  if (params.obs_window < 1) {
    return InvalidArgument("rkv.obs_window: got ", params.obs_window, ", expected >= 1");
  }
  KVCTL_RETURN_IF_ERROR(CheckKernel("rkv.kernel", params.kernel));
  if (params.pool != PoolKind::kMax && params.pool != PoolKind::kAvg) {
    return InvalidArgument("rkv.pool: got ", static_cast<int>(params.pool),
                           ", expected max or avg");
  }
  if (params.group != GqaReduce::kMaxLogit && params.group != GqaReduce::kMeanProb) {
    return InvalidArgument("rkv.group: got ", static_cast<int>(params.group),
                           ", expected max or mean");
  }
  if (params.softmax != SoftmaxScope::kCandidates && params.softmax != SoftmaxScope::kCausal) {
    return InvalidArgument("rkv.softmax: got ", static_cast<int>(params.softmax),
                           ", expected candidates or causal");
  }
  if (!(params.lambda >= 0.0f && params.lambda <= 1.0f)) {
    return InvalidArgument("rkv.lambda: got ", params.lambda, ", expected 0..1");
  }
  if (!(params.similarity_threshold >= -1.0f && params.similarity_threshold <= 1.0f)) {
    return InvalidArgument("rkv.similarity_threshold: got ", params.similarity_threshold,
                           ", expected -1..1");
  }
  return OkStatus();
}

Status ValidateSnapKvParams(const SnapKvParams& params) {
  if (params.obs_window < 1) {
    return InvalidArgument("snapkv.obs_window: got ", params.obs_window, ", expected >= 1");
  }
  KVCTL_RETURN_IF_ERROR(CheckKernel("snapkv.kernel", params.kernel));
  if (params.pool != PoolKind::kMax && params.pool != PoolKind::kAvg) {
    return InvalidArgument("snapkv.pool: got ", static_cast<int>(params.pool),
                           ", expected max or avg");
  }
  if (params.group != GqaReduce::kMaxLogit && params.group != GqaReduce::kMeanProb) {
    return InvalidArgument("snapkv.group: got ", static_cast<int>(params.group),
                           ", expected max or mean");
  }
  if (params.softmax != SoftmaxScope::kCandidates && params.softmax != SoftmaxScope::kCausal) {
    return InvalidArgument("snapkv.softmax: got ", static_cast<int>(params.softmax),
                           ", expected candidates or causal");
  }
  return OkStatus();
}

std::vector<uint8_t> ProtectedMask(int64_t tokens, ProtectedRegions regions) {
  std::vector<uint8_t> mask(static_cast<size_t>(std::max<int64_t>(tokens, 0)), 1);
  const CandidateRange c = Candidates(
      tokens, {std::max<int64_t>(regions.sinks, 0), std::max<int64_t>(regions.recent, 0)});
  for (int64_t j = c.lo; j < c.hi; ++j) mask[j] = 0;
  return mask;
}

StatusOr<KvTensorView> QueryGroup(const KvTensorView& q, int64_t kv_heads, int64_t kv_head) {
  KVCTL_RETURN_IF_ERROR(q.Validate("queries"));
  if (kv_heads <= 0 || q.heads % kv_heads != 0) {
    return InvalidArgument("kv_heads: got ", kv_heads, ", expected a divisor of the ", q.heads,
                           " query heads");
  }
  if (kv_head < 0 || kv_head >= kv_heads) {
    return InvalidArgument("kv_head: got ", kv_head, ", expected 0..", kv_heads - 1);
  }
  const int64_t g = q.heads / kv_heads;
  KvTensorView group = q;
  group.data =
      static_cast<const char*>(q.data) + static_cast<ptrdiff_t>(kv_head * g * q.head_stride) *
                                             static_cast<ptrdiff_t>(DTypeSize(q.dtype));
  group.heads = g;
  return group;
}

StatusOr<std::vector<float>> ScoreStreaming(int64_t tokens, ProtectedRegions regions) {
  if (tokens <= 0) return InvalidArgument("tokens: got ", tokens, ", expected > 0");
  KVCTL_RETURN_IF_ERROR(CheckRegions(regions));
  std::vector<float> scores(static_cast<size_t>(tokens), kProtectedScore);
  const CandidateRange c = Candidates(tokens, regions);
  for (int64_t j = c.lo; j < c.hi; ++j) scores[j] = static_cast<float>(j);
  return scores;
}

StatusOr<std::vector<float>> ScoreSnapKV(const KeyRows& keys, const KvTensorView& group_queries,
                                         ProtectedRegions regions, const SnapKvParams& params) {
  KVCTL_RETURN_IF_ERROR(ValidateSnapKvParams(params));
  return ScoreAttention(keys, group_queries, regions, params.obs_window, params.kernel, params.pool,
                        params.group, params.softmax, 1.0f, 0.5f, nullptr);
}

StatusOr<std::vector<float>> ScoreRKV(const KeyRows& keys, const KvTensorView& group_queries,
                                      ProtectedRegions regions, const RkvParams& params,
                                      RedundancyState* redundancy) {
  KVCTL_RETURN_IF_ERROR(ValidateRkvParams(params));
  return ScoreAttention(keys, group_queries, regions, params.obs_window, params.kernel, params.pool,
                        params.group, params.softmax, params.lambda, params.similarity_threshold,
                        redundancy);
}

Status UpdateH2O(H2OState* state, const KeyRows& keys, const KvTensorView& group_queries) {
  KVCTL_RETURN_IF_ERROR(CheckKeys(keys));
  if (state->acc.size() > static_cast<size_t>(keys.tokens)) {
    return FailedPrecondition("h2o state: tracks ", state->acc.size(), " tokens but keys hold ",
                              keys.tokens, "; expected CompactH2O after each eviction");
  }
  KVCTL_ASSIGN_OR_RETURN(ObsQueries q,
                         LoadQueries(group_queries, std::numeric_limits<int64_t>::max(), keys));
  state->acc.resize(static_cast<size_t>(keys.tokens), 0.0);
  AccumulatePerHeadSoftmax(FloatLogits{keys, q}, keys.tokens, q, 1.0, state->acc.data());
  return OkStatus();
}

StatusOr<std::vector<float>> ScoreH2O(const H2OState& state, ProtectedRegions regions) {
  if (state.acc.empty()) return InvalidArgument("h2o state: empty, expected UpdateH2O first");
  KVCTL_RETURN_IF_ERROR(CheckRegions(regions));
  const int64_t tokens = static_cast<int64_t>(state.acc.size());
  std::vector<float> scores(state.acc.size(), kProtectedScore);
  const CandidateRange c = Candidates(tokens, regions);
  for (int64_t j = c.lo; j < c.hi; ++j) scores[j] = static_cast<float>(state.acc[j]);
  return scores;
}

Status CompactH2O(H2OState* state, std::span<const int64_t> kept) {
  KVCTL_RETURN_IF_ERROR(CheckKept(kept, state->acc.size()));
  for (size_t i = 0; i < kept.size(); ++i) state->acc[i] = state->acc[kept[i]];
  state->acc.resize(kept.size());
  return OkStatus();
}

StatusOr<std::vector<int64_t>> SelectKeep(std::span<const float> scores, int64_t budget,
                                          std::span<const uint8_t> protected_mask) {
  int64_t protected_count = 0;
  std::vector<int64_t> candidates;
  KVCTL_RETURN_IF_ERROR(SplitCandidates(scores, protected_mask, &protected_count, &candidates));
  if (budget < protected_count) {
    return InvalidArgument("budget: got ", budget, ", expected >= ", protected_count,
                           " (the protected tokens)");
  }
  const int64_t take =
      std::min<int64_t>(budget - protected_count, static_cast<int64_t>(candidates.size()));
  std::nth_element(candidates.begin(), candidates.begin() + take, candidates.end(), Better{scores});
  // The kept set in index order: marks and one pass, O(T) where sorting the indices was
  // O(T log T).
  std::vector<uint8_t> keep(protected_mask.begin(), protected_mask.end());
  for (int64_t i = 0; i < take; ++i) keep[static_cast<size_t>(candidates[i])] = 1;
  std::vector<int64_t> kept;
  kept.reserve(static_cast<size_t>(take + protected_count));
  for (size_t j = 0; j < keep.size(); ++j) {
    if (keep[j] != 0) kept.push_back(static_cast<int64_t>(j));
  }
  return kept;
}

StatusOr<std::vector<double>> TokenAttentionMass(const KeyRows& keys,
                                                 const KvTensorView& group_queries) {
  KVCTL_RETURN_IF_ERROR(CheckKeys(keys));
  KVCTL_ASSIGN_OR_RETURN(ObsQueries q,
                         LoadQueries(group_queries, std::numeric_limits<int64_t>::max(), keys));
  std::vector<double> mass(static_cast<size_t>(keys.tokens), 0.0);
  // The logits of the unit rows, as SnapKV's and R-KV's: this telemetry is measured on every
  // head's first compression, the prefill's, and at 8K keys with 32 x 3 observation rows it took
  // 2.0 ms a head instead of 5.0 (docs/eviction.md "Attention mass retained").
  ScoreScratch& scratch = ThreadScoreScratch();
  scratch.keys.Set(keys.data, keys.tokens, keys.head_dim);
  scratch.queries.Set(q.rows.data(), q.m * q.g, q.d);
  AccumulatePerHeadSoftmax(UnitLogits{scratch.keys, scratch.queries, &scratch.dots}, keys.tokens, q,
                           1.0 / static_cast<double>(q.m * q.g), mass.data());
  scratch.TrimIfLarge();
  return mass;
}

StatusOr<double> RetainedMass(std::span<const double> mass, std::span<const int64_t> kept) {
  if (mass.empty()) return InvalidArgument("mass: empty, expected one value per resident token");
  KVCTL_RETURN_IF_ERROR(CheckKept(kept, mass.size()));
  double sum = 0;
  for (int64_t j : kept) sum += mass[j];
  return sum;
}

double RetainedMassCurve::At(int64_t budget) const {
  const int64_t last = static_cast<int64_t>(retained.size()) - 1;
  return retained[std::clamp<int64_t>(budget - min_budget, 0, last)];
}

StatusOr<RetainedMassCurve> ComputeRetainedMassCurve(std::span<const double> mass,
                                                     std::span<const float> scores,
                                                     std::span<const uint8_t> protected_mask) {
  int64_t protected_count = 0;
  std::vector<int64_t> candidates;
  KVCTL_RETURN_IF_ERROR(SplitCandidates(scores, protected_mask, &protected_count, &candidates));
  if (mass.size() != scores.size()) {
    return InvalidArgument("mass: got ", mass.size(), " entries, expected ", scores.size(),
                           " (one per score)");
  }
  std::sort(candidates.begin(), candidates.end(), Better{scores});
  RetainedMassCurve curve;
  curve.min_budget = protected_count;
  double sum = 0;
  for (size_t j = 0; j < mass.size(); ++j) {
    if (protected_mask[j] != 0) sum += mass[j];
  }
  curve.retained.reserve(candidates.size() + 1);
  curve.retained.push_back(sum);
  for (int64_t j : candidates) curve.retained.push_back(sum += mass[j]);
  return curve;
}

}  // namespace kvctl
