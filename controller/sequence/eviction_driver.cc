// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/sequence/eviction_driver.h"

#include <algorithm>
#include <cmath>

#include "policies/reasonalloc.h"

namespace kvctl {

bool CompressionDue(int64_t period, int layer, int layers, int64_t tokens_before,
                    int64_t tokens_after) {
  if (period <= 1) return true;
  const int64_t phase = static_cast<int64_t>(layer) * period / std::max(layers, 1);
  return (tokens_after + phase) / period != (tokens_before + phase) / period;
}

int64_t StaggerInterval(const EvictionSettings& s, int64_t tokens_seen) {
  const int64_t period = s.compression_period;
  // Fixed budgets (tokens_per_head, joint caps, or the floor while it exceeds the fraction) grow
  // by nothing.
  if (period <= 1 || s.tokens_per_head > 0 || !s.head_caps.empty() ||
      AverageBudget(s, tokens_seen) <= s.floor) {
    return period;
  }
  // The most the interval grows to (f near 1): a head then keeps nearly every token anyway.
  constexpr int64_t kMostPeriods = 1024;
  const double room = 2.0 * (1.0 - s.token_fraction);
  // Rounded, not truncated: 2 x (1 - 0.98) is 0.04 plus an ulp.
  if (room <= 1.0 / kMostPeriods) return period * kMostPeriods;
  return std::max<int64_t>(period, std::llround(static_cast<double>(period) / room));
}

std::string_view EvictPolicyName(EvictPolicy policy) {
  switch (policy) {
    case EvictPolicy::kStreaming:
      return "streaming";
    case EvictPolicy::kH2O:
      return "h2o";
    case EvictPolicy::kSnapKV:
      return "snapkv";
    case EvictPolicy::kRKV:
      return "rkv";
  }
  return "unknown";
}

int64_t AverageBudget(const EvictionSettings& s, int64_t tokens_seen) {
  int64_t avg = s.tokens_per_head;
  if (avg == 0) {
    avg = static_cast<int64_t>(std::ceil(s.token_fraction * static_cast<double>(tokens_seen))) -
          s.fraction_offset;
  }
  return std::max(avg, s.floor);
}

int64_t FullHeadCount(const EvictionSettings& s) {
  return std::count(s.full_head.begin(), s.full_head.end(), uint8_t{1});
}

int64_t FullHeadsAverage(const EvictionSettings& s, int64_t pairs, int64_t avg,
                         int64_t tokens_seen) {
  const int64_t full = FullHeadCount(s);
  if (full <= 0 || full >= pairs) return avg;
  // In 128-bit: pairs x avg and full x tokens_seen each fit int64, their difference may not.
  const __int128 rest =
      static_cast<__int128>(pairs) * avg - static_cast<__int128>(full) * tokens_seen;
  if (rest <= static_cast<__int128>(pairs - full) * s.floor) return s.floor;
  return static_cast<int64_t>(rest / (pairs - full));
}

StatusOr<std::vector<int64_t>> LayerBudgets(const EvictionSettings& s, int64_t layers,
                                            int64_t heads, int64_t avg, int64_t seq_len) {
  std::vector<int64_t> out;
  switch (s.layer_profile) {
    case LayerProfile::kUniform: {
      KVCTL_ASSIGN_OR_RETURN(out, UniformLayerBudgets(layers, heads, avg));
      break;
    }
    case LayerProfile::kDemand: {
      if (static_cast<int64_t>(s.demand.size()) != layers) {
        return InvalidArgument("budget.profile: the [reasonalloc] demand has ", s.demand.size(),
                               " layers, expected ", layers, " (the session's layers)");
      }
      KVCTL_ASSIGN_OR_RETURN(out, DemandLayerBudgets(s.demand, heads, avg, s.floor));
      // A layer cannot keep more than it holds; what it could not use goes to the others.
      KVCTL_RETURN_IF_ERROR(CapLayerBudgets(s.demand, heads * std::max<int64_t>(seq_len, 1), &out));
      break;
    }
    case LayerProfile::kPyramid: {
      if (avg <= s.window) {
        // PyramidKV needs room above the window; with none every layer keeps the average.
        KVCTL_ASSIGN_OR_RETURN(out, UniformLayerBudgets(layers, heads, avg));
        break;
      }
      KVCTL_ASSIGN_OR_RETURN(out, PyramidLayerBudgets({.layers = layers,
                                                       .heads = heads,
                                                       .capacity = avg,
                                                       .window = s.window,
                                                       .seq_len = std::max<int64_t>(seq_len, 1)}));
      break;
    }
  }
  for (int64_t& b : out) b = std::max(b, heads * s.floor);
  return out;
}

StatusOr<std::vector<float>> ScoreHead(const EvictionSettings& s, const KeyRows& keys,
                                       const KvTensorView* group_queries, const H2OState* h2o,
                                       ProtectedRegions regions, RedundancyState* redundancy) {
  switch (s.policy) {
    case EvictPolicy::kStreaming:
      return ScoreStreaming(keys.tokens, regions);
    case EvictPolicy::kH2O:
      if (h2o == nullptr) return FailedPrecondition("h2o: no accumulated attention");
      return ScoreH2O(*h2o, regions);
    case EvictPolicy::kSnapKV:
      if (group_queries == nullptr) return InvalidArgument("q: snapkv needs query rows");
      return ScoreSnapKV(keys, *group_queries, regions, s.snapkv);
    case EvictPolicy::kRKV:
      if (group_queries == nullptr) return InvalidArgument("q: rkv needs query rows");
      return ScoreRKV(keys, *group_queries, regions, s.rkv, redundancy);
  }
  return InvalidArgument("evict.policy: unknown");
}

}  // namespace kvctl
