// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/sequence/eviction_driver.h
// The daemon side of token eviction: the settings one sequence was opened with (resolved from
// [budget] and [evict] by controller/sequence/budget_resolve.h), the per-head token budget schedule
// (average -> layers -> heads, ReasonAlloc-like) and the scorer dispatch over the pure policies of
// policies/eviction.h. KvSequence calls these during APPEND; nothing here touches the pool.
//
// Thread safety: pure functions over their arguments; EvictionSettings is a value.
//
//   const int64_t avg = AverageBudget(settings, tokens_seen);
//   KVCTL_ASSIGN_OR_RETURN(auto layers, LayerBudgets(settings, L, H, avg, tokens_seen));
//   KVCTL_ASSIGN_OR_RETURN(auto scores, ScoreHead(settings, keys, &group, &h2o, regions));
#ifndef KVCTL_CONTROLLER_SEQUENCE_EVICTION_DRIVER_H_
#define KVCTL_CONTROLLER_SEQUENCE_EVICTION_DRIVER_H_

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "controller/config/config.h"
#include "policies/eviction.h"

namespace kvctl {

// Everything a sequence needs to evict, fixed when it is opened (a SIGHUP reaches new sequences
// only). `enabled` false = keep every token (budget.mode none or quant-only).
struct EvictionSettings {
  bool enabled = false;
  EvictPolicy policy = EvictPolicy::kStreaming;
  int64_t sinks = 0;   // Protected first tokens: max(evict.sinks, the layer's fp16 sink count).
  int64_t window = 8;  // Protected newest tokens.
  int64_t obs_window = 8;
  SnapKvParams snapkv;
  RkvParams rkv;
  int64_t compression_period = 1;
  // evict.stagger_layers: layer l is also compressed at the appends where tokens + phase(l)
  // crosses a multiple of StaggerInterval (CompressionDue), whenever it holds more than its
  // compressed size; layers then take turns instead of all overflowing on the same step.
  bool stagger_layers = false;
  // evict.whole_records: streaming evicts up to a record boundary rather than re-pack records.
  bool whole_records = false;
  int64_t tokens_per_head = 0;  // Fixed average budget; 0 = token_fraction of the tokens seen.
  double token_fraction = 0;
  // Subtracted from ceil(token_fraction x tokens seen). A memory budget (evict-only with
  // budget.fp16_fraction, AimEvictionAtMemory) keeps token_fraction = m x fp16 row bytes / record
  // bytes per token and pays the fp16 rows every head holds anyway (sinks, mean tail) here.
  int64_t fraction_offset = 0;
  LayerProfile layer_profile = LayerProfile::kUniform;
  std::vector<double> demand;  // Per layer, for kDemand.
  int64_t realloc_period = 0;  // 0 = heads split each layer's budget evenly.
  double realloc_ema = 0.5;
  bool realloc_greedy = false;  // budget.realloc_split: greedy, else proportional.
  int64_t floor = 0;            // Per-head minimum budget, >= sinks + window.
  // joint: fixed per-(layer, head) caps from the joint plan, (layer, head) order; when set they
  // replace the average / layer profile / re-allocation schedule.
  std::vector<int64_t> head_caps;
  // evict.full_heads: per (layer, head), (layer, head) order, 1 = never evicted (it keeps every
  // token and the other heads' average budget pays for it: FullHeadsAverage); empty = none.
  // evict-only with a uniform layer profile and no re-allocation (ValidateBudgetConfig).
  std::vector<uint8_t> full_head;
  // evict.max_deferred_tokens: tokens an APPEND_CONTINUES prefill may store before its end
  // without eviction; an APPEND past it evicts as if the flag were absent. 0 = never defer.
  int64_t max_deferred_tokens = 0;

  // Scorers that read the queries engines send with APPEND.
  bool NeedsQ() const { return enabled && policy != EvictPolicy::kStreaming; }
};

// evict.stagger_layers: whether layer `layer` of `layers` is due for a scheduled compression at
// an append that takes the sequence from `tokens_before` to `tokens_after` appended tokens: its
// phase layer * period / layers plus the token count crosses a multiple of the period.
bool CompressionDue(int64_t period, int layer, int layers, int64_t tokens_before,
                    int64_t tokens_after);

// The period CompressionDue staggers compressions by, after `tokens_seen` appended tokens. A head
// compressed to budget - P + 1 tokens reaches its budget again after P new tokens when the budget
// is fixed, but only after about P / (1 - f) when it grows as a fraction f of the tokens seen:
// compressing every P tokens regardless would make, at f = 0.98, fifty times as many compressions
// as overflows, each scoring every key and re-packing every record behind an evicted token to
// drop one token or none. So with a growing budget the interval is max(P, P / (2 (1 - f))): a
// layer compresses when about P / 2 tokens are due to go, before it can overflow (P = period).
int64_t StaggerInterval(const EvictionSettings& s, int64_t tokens_seen);

std::string_view EvictPolicyName(EvictPolicy policy);  // "streaming", "h2o", "snapkv", "rkv".

// The average per-head budget after `tokens_seen` appended tokens: tokens_per_head, or
// ceil(token_fraction * tokens_seen) - fraction_offset, never below the floor.
int64_t AverageBudget(const EvictionSettings& s, int64_t tokens_seen);

// evict.full_heads: how many (layer, head) pairs s.full_head names.
int64_t FullHeadCount(const EvictionSettings& s);

// evict.full_heads: the average budget of the heads that are not full, so that `pairs` heads keep
// pairs x avg tokens in all while the R pairs s.full_head sets keep all `tokens_seen`:
// (pairs x avg - R x tokens_seen) / (pairs - R), never below the floor. `avg` when there are none.
int64_t FullHeadsAverage(const EvictionSettings& s, int64_t pairs, int64_t avg,
                         int64_t tokens_seen);

// Tokens per layer (summed over its `heads` heads) for average `avg`, by the layer profile; every
// layer gets at least heads * floor. Uniform and demand sum to exactly layers * heads * avg;
// pyramid follows PyramidKV's integer schedule (then the floor), so it may differ slightly.
StatusOr<std::vector<int64_t>> LayerBudgets(const EvictionSettings& s, int64_t layers,
                                            int64_t heads, int64_t avg, int64_t seq_len);

// Scores of every resident token of one head (policies/eviction.h conventions: higher = keep,
// protected = +inf). `group_queries` ([m, g, D], the last m resident tokens' query rows) is
// required by snapkv and rkv; `h2o` (already updated with every query so far) by h2o. rkv reads
// and replaces `redundancy` when given (ScoreRKV).
StatusOr<std::vector<float>> ScoreHead(const EvictionSettings& s, const KeyRows& keys,
                                       const KvTensorView* group_queries, const H2OState* h2o,
                                       ProtectedRegions regions,
                                       RedundancyState* redundancy = nullptr);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SEQUENCE_EVICTION_DRIVER_H_
