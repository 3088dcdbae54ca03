// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/calib_profile.h
// The calibration profile kvcalib writes and the daemon and the joint planner read: the RateQuant
// fit (policies/ratequant_fit.h, a [ratequant] table) plus the ReasonAlloc-like layer demand
// (policies/reasonalloc.h, a [reasonalloc] table), in one TOML file. Also the layer-demand pass
// that fills the second table from calibration queries and keys. It lives in policies/ (not in
// tools/) so the daemon loads profiles with the same parser kvcalib uses.
//
// Layer demand [ours, docs/algorithms.md §13.1]: for every sequence, layer and KV head, at
// `queries` positions p evenly spaced over the second half of the sequence, the causal softmax
// attention softmax(q_p k_j / sqrt(D)), j <= p, of each query head of the KV head's GQA group;
// the group is reduced to one distribution by the element-wise max (default: the tokens any head
// of the group needs) or the mean; LayerDemandCalibrator adds CoverageSize(., tau) (or the entropy
// size) of it. A layer's demand is the mean over its (sequence, head, position) samples, in tokens.
//
// The [reasonalloc] table (all keys required, unknown keys are errors):
//   version = 1, layers, kv_heads, measure = "coverage" | "entropy", tau, group_reduce = "max" |
//   "mean", queries_per_sequence, sequences, samples = [per layer], demand = [per layer]
//
// Thread safety: pure functions.
//
//   KVCTL_ASSIGN_OR_RETURN(LayerDemandProfile d, ComputeLayerDemand(data.set, {.tau = 0.9}));
//   std::string text = FormatCalibProfile({fit, d});
//   KVCTL_ASSIGN_OR_RETURN(CalibProfile p, ReadCalibProfile("profile.toml"));
#ifndef KVCTL_POLICIES_CALIB_PROFILE_H_
#define KVCTL_POLICIES_CALIB_PROFILE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "policies/ratequant.h"
#include "policies/ratequant_fit.h"
#include "policies/reasonalloc.h"

namespace kvctl {

enum class GroupReduce : uint8_t { kMax = 0, kMean = 1 };
std::string_view GroupReduceName(GroupReduce reduce);       // "max", "mean".
std::string_view DemandMeasureName(DemandMeasure measure);  // "coverage", "entropy".

struct LayerDemandOptions {
  double tau = 0.9;
  DemandMeasure measure = DemandMeasure::kCoverage;
  GroupReduce reduce = GroupReduce::kMax;
  int queries = 8;  // Query positions per sequence, 1..4096.
};

struct LayerDemandProfile {
  int layers = 0;
  int kv_heads = 0;
  DemandMeasure measure = DemandMeasure::kCoverage;
  double tau = 0.9;
  GroupReduce reduce = GroupReduce::kMax;
  int queries_per_sequence = 0;
  int64_t sequences = 0;
  std::vector<int64_t> samples;  // Per layer.
  std::vector<double> demand;    // Per layer, mean coverage (or entropy) size in tokens.

  bool operator==(const LayerDemandProfile&) const = default;
};

// The query positions of a sequence of `tokens` tokens: `queries` values evenly spaced over
// [tokens / 2, tokens - 1] (fewer when the range is shorter), ascending, distinct.
std::vector<int64_t> DemandQueryPositions(int64_t tokens, int queries);

// The attention of query row `q_rows` ([g, D] floats, the group's heads) over `keys` ([n, D]
// floats, the first n tokens), each head a softmax of q k / sqrt(D) over the n keys, reduced over
// the g heads. REQUIRES: n, g, D >= 1.
std::vector<double> GroupAttention(std::span<const float> keys, std::span<const float> q_rows,
                                   int64_t n, int64_t g, int64_t head_dim, GroupReduce reduce);

// The demand pass. INVALID_ARGUMENT for bad options, empty data, or data without queries
// ("data[0][0].q: missing, expected queries for the layer demand").
StatusOr<LayerDemandProfile> ComputeLayerDemand(const CalibrationSet& data,
                                                const LayerDemandOptions& options);

struct CalibProfile {
  RateQuantFit fit;
  std::optional<LayerDemandProfile> demand;

  bool operator==(const CalibProfile&) const = default;
};

// FormatRateQuantProfile(fit), then the [reasonalloc] table when `demand` is set; doubles with 17
// significant digits, so ParseCalibProfile gives back an equal profile.
std::string FormatCalibProfile(const CalibProfile& profile);

// Parses a profile; errors are prefixed with `name` and name the key
// ("p.toml: reasonalloc.demand[2]: got -1, expected a finite number > 0"). Root keys other than
// ratequant and reasonalloc are errors, and so is a [reasonalloc] whose layers or kv_heads differ
// from the [ratequant] table's.
StatusOr<CalibProfile> ParseCalibProfile(std::string_view text, std::string_view name);

// Reads and parses `path`; NOT_FOUND when it cannot be opened.
StatusOr<CalibProfile> ReadCalibProfile(const std::string& path);

}  // namespace kvctl

#endif  // KVCTL_POLICIES_CALIB_PROFILE_H_
