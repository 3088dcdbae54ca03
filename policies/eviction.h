// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/eviction.h
// Token-eviction scorers for one KV head, as pure functions: StreamingLLM, H2O, SnapKV and R-KV,
// a SelectKeep that turns scores into the kept token indices, and the "attention mass retained"
// metric that telemetry and the joint planner use as the eviction loss.
//
// The model. The daemon holds, per (layer, KV head), T resident tokens in arrival order (oldest
// first). Two regions are never evicted: the first `sinks` tokens (attention sinks) and the last
// `recent` tokens (the recent window). Everything between is a candidate. A scorer returns one
// float per resident token, higher = more worth keeping; protected tokens score +infinity so the
// vector reads correctly on its own. SelectKeep keeps every protected token plus the best
// candidates up to the budget. Keys are the dequantized fp32 rows the daemon already has (a
// rotation applied to both K and Q leaves every dot product unchanged). Queries are the Q rows the
// engine sent with APPEND for the same tokens, [tokens, q_heads, D]; QueryGroup() cuts out the g
// query heads that share one KV head (GQA, query head j reads KV head j / g).
//
// What each scorer computes, and where it departs from its paper, is written out at the top of
// eviction.cc and in docs/eviction.md. Short version: R-KV and SnapKV follow the R-KV code
// (GQA = max of the logits over the group, then softmax over the non-window keys); SnapKV is R-KV
// with lambda = 1 and its own pooling; H2O accumulates softmax mass summed over the group;
// StreamingLLM keeps sinks and the most recent tokens.
//
// Thread safety: every function is reentrant. H2OState is a plain value: one writer at a time.
//
//   const ProtectedRegions regions{.sinks = 4, .recent = 8};
//   KVCTL_ASSIGN_OR_RETURN(KvTensorView group, QueryGroup(q_obs, kv_heads, h));
//   KVCTL_ASSIGN_OR_RETURN(auto scores, ScoreRKV({keys, T, D}, group, regions));
//   KVCTL_ASSIGN_OR_RETURN(auto kept, SelectKeep(scores, 128, ProtectedMask(T, regions)));
#ifndef KVCTL_POLICIES_EVICTION_H_
#define KVCTL_POLICIES_EVICTION_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "policies/redundancy.h"

namespace kvctl {

// Dense row-major fp32 keys of one KV head: row t (head_dim floats) is resident token t.
struct KeyRows {
  const float* data = nullptr;
  int64_t tokens = 0;
  int64_t head_dim = 0;
};

// The never-evicted regions of a head's T resident tokens: [0, sinks) and [T - recent, T). They
// may overlap (then every token is protected).
struct ProtectedRegions {
  int64_t sinks = 0;
  int64_t recent = 0;
};

// 1-D pooling of the importance curve (stride 1, zero "same" padding as PyTorch's
// max_pool1d/avg_pool1d with padding = kernel / 2; avg counts the padding, as PyTorch does).
enum class PoolKind : uint8_t { kMax = 0, kAvg = 1 };

// How the g query heads of a GQA group become one importance curve. kMaxLogit (R-KV's code): the
// max of the g logits per key, then one softmax. kMeanProb (SnapKV's code and kvpress): a softmax
// per query head, then the mean of the g probabilities.
enum class GqaReduce : uint8_t { kMaxLogit = 0, kMeanProb = 1 };

// Which keys an observation query's softmax normalises over. kCandidates (R-KV): the keys before
// the protected recent window only. kCausal (SnapKV's code and kvpress): every key the query sees,
// the recent window included; the window's columns are dropped afterwards, so a query that looks
// mostly at the window adds little to the candidates' importance.
enum class SoftmaxScope : uint8_t { kCandidates = 0, kCausal = 1 };

// The most keys R-KV's redundancy term (lambda < 1) takes: O(T^2) work beyond it is far past any
// real budget (and its int64 column sums, at most T * 2^28, stay far below 2^63; its row indices
// in int32). More is INVALID_ARGUMENT.
inline constexpr int64_t kMaxRedundancyTokens = int64_t{1} << 22;

// R-KV (arXiv 2505.24133, repo Zefan-Cai/R-KV defaults). score = lambda*a - (1-lambda)*r.
struct RkvParams {
  int64_t obs_window = 8;  // Observation queries: the last obs_window query tokens given.
  int kernel = 7;          // Odd, 1..63. 1 = no pooling.
  PoolKind pool = PoolKind::kMax;
  float lambda = 0.07f;               // In [0, 1]. 1 skips the O(T^2 D) redundancy term.
  float similarity_threshold = 0.5f;  // Cosine above which two keys are near-duplicates.
  GqaReduce group = GqaReduce::kMaxLogit;
  SoftmaxScope softmax = SoftmaxScope::kCandidates;
};

// SnapKV (arXiv 2404.14469, repo FasterDecoding/SnapKV defaults), run as R-KV with lambda = 1.
struct SnapKvParams {
  int64_t obs_window = 32;
  int kernel = 5;
  PoolKind pool = PoolKind::kAvg;
  GqaReduce group = GqaReduce::kMaxLogit;
  SoftmaxScope softmax = SoftmaxScope::kCandidates;
};

Status ValidateRkvParams(const RkvParams& params);
Status ValidateSnapKvParams(const SnapKvParams& params);

// One flag per resident token: 1 where `regions` protects it. REQUIRES: tokens >= 0.
std::vector<uint8_t> ProtectedMask(int64_t tokens, ProtectedRegions regions);

// The [tokens, g, D] view of the g = q.heads / kv_heads query heads that read KV head `kv_head`.
// INVALID_ARGUMENT when q is not a valid view, kv_heads does not divide q.heads, or kv_head is out
// of range.
StatusOr<KvTensorView> QueryGroup(const KvTensorView& q, int64_t kv_heads, int64_t kv_head);

// StreamingLLM: candidate j scores j, so SelectKeep with budget sinks + recent keeps exactly the
// sinks and the recent window, and a larger budget keeps the newest candidates (FIFO eviction).
StatusOr<std::vector<float>> ScoreStreaming(int64_t tokens, ProtectedRegions regions);

// SnapKV / R-KV scores of every resident key. `group_queries` is [n, g, D] (any dtype), the query
// rows of the last n resident tokens in order; the last min(n, obs_window) of them observe.
// INVALID_ARGUMENT on empty or non-finite keys or queries, head_dim mismatch, more observation
// queries than keys, bad regions or parameters.
StatusOr<std::vector<float>> ScoreSnapKV(const KeyRows& keys, const KvTensorView& group_queries,
                                         ProtectedRegions regions, const SnapKvParams& params = {});
// ScoreRKV's `redundancy` (optional): the head's state from its previous scoring, compacted by
// CompactRedundancy after the eviction that followed (policies/redundancy.h); the scan then skips
// what it still knows (the scores are the same). Replaced by the state of these keys (emptied when
// lambda = 1 skips the redundancy); left as it was on an error or when every key is protected.
StatusOr<std::vector<float>> ScoreRKV(const KeyRows& keys, const KvTensorView& group_queries,
                                      ProtectedRegions regions, const RkvParams& params = {},
                                      RedundancyState* redundancy = nullptr);

// H2O accumulated attention, one entry per resident token (oldest first). Unnormalised, as in the
// paper: old tokens have had more steps to accumulate.
struct H2OState {
  std::vector<double> acc;
};

// Adds the attention of the n query tokens in `group_queries` ([n, g, D], the queries of the last
// n resident tokens, in order) to `state`: acc_j += sum over queries and group heads of the
// causal softmax over all resident keys. Tokens that arrived since the last update (acc shorter
// than keys.tokens) start at 0. FAILED_PRECONDITION when the state tracks more tokens than `keys`
// holds (it was not compacted after an eviction); INVALID_ARGUMENT as for ScoreRKV.
Status UpdateH2O(H2OState* state, const KeyRows& keys, const KvTensorView& group_queries);

// acc_j for candidates, +infinity for protected tokens. INVALID_ARGUMENT on an empty state or
// negative regions.
StatusOr<std::vector<float>> ScoreH2O(const H2OState& state, ProtectedRegions regions);

// Keeps acc at the `kept` indices (strictly increasing, in range) after an eviction.
Status CompactH2O(H2OState* state, std::span<const int64_t> kept);

// The kept token indices, ascending: every protected token, then the highest-scoring candidates
// until min(budget, T) tokens are kept. Ties go to the newer token. INVALID_ARGUMENT when scores is
// empty, protected_mask has another size, a candidate score is NaN, or budget is below the number
// of protected tokens.
StatusOr<std::vector<int64_t>> SelectKeep(std::span<const float> scores, int64_t budget,
                                          std::span<const uint8_t> protected_mask);

// Per-token attention mass of the observation queries: the mean over the n query tokens of
// `group_queries` (the last n resident tokens) and the g heads of the causal softmax over all T
// keys, window and sinks included. Sums to 1. Errors as for ScoreRKV.
StatusOr<std::vector<double>> TokenAttentionMass(const KeyRows& keys,
                                                 const KvTensorView& group_queries);

// Sum of `mass` over `kept` (strictly increasing, in range): the attention mass retained after an
// eviction, in [0, 1]; 1 - it is the eviction loss.
StatusOr<double> RetainedMass(std::span<const double> mass, std::span<const int64_t> kept);

// Retained mass for every legal budget at once, in SelectKeep's order, so a planner can price
// budgets without re-scoring: retained[b - min_budget] = RetainedMass(mass, SelectKeep(scores, b,
// mask)) for b in [min_budget, T], where min_budget is the number of protected tokens.
struct RetainedMassCurve {
  int64_t min_budget = 0;
  std::vector<double> retained;
  // The value at `budget` clamped to [min_budget, T]. REQUIRES: retained is not empty.
  double At(int64_t budget) const;
};
StatusOr<RetainedMassCurve> ComputeRetainedMassCurve(std::span<const double> mass,
                                                     std::span<const float> scores,
                                                     std::span<const uint8_t> protected_mask);

}  // namespace kvctl

#endif  // KVCTL_POLICIES_EVICTION_H_
