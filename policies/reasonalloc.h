// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/reasonalloc.h
// ReasonAlloc-like token budgets: how many tokens each (layer, KV head) may keep, as pure
// functions. "-like" because ReasonAlloc (arXiv 2606.11164) publishes no code and we could read
// only its abstract: the hierarchy (total -> layers offline -> heads online, with a starvation
// guard) is the paper's; every formula here is ours (docs/algorithms.md §13), spelled out at
// the top of reasonalloc.cc and in docs/eviction.md.
//
//  1. Offline: LayerDemandCalibrator turns calibration attention into a demand per layer (mean
//     coverage size at tau = 0.9), and DemandLayerBudgets splits L*H*B_avg tokens over the layers
//     in proportion to it, above a floor, summing exactly. Uniform and Pyramid (PyramidKV's
//     schedule, docs/algorithms.md §13.4) are the baselines.
//  2. Online: a HeadReallocator per layer splits the layer's budget over its H heads from a
//     per-head utility smoothed by an EMA, never below the starvation floor, summing exactly.
//
// Budgets are token counts that include the protected sinks and window; a layer budget is the
// sum over that layer's heads. SelectKeep (policies/eviction.h) applies a head's budget.
//
// Thread safety: functions are reentrant; LayerDemandCalibrator and HeadReallocator are plain
// values (one writer at a time).
//
//   KVCTL_ASSIGN_OR_RETURN(auto layers, DemandLayerBudgets(demand, heads, 256, 64));
//   KVCTL_ASSIGN_OR_RETURN(auto realloc, HeadReallocator::Create({heads, layers[l], floor}));
//   KVCTL_RETURN_IF_ERROR(realloc.Update(utility));  // realloc.budgets()[h] tokens for head h
#ifndef KVCTL_POLICIES_REASONALLOC_H_
#define KVCTL_POLICIES_REASONALLOC_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "policies/eviction.h"

namespace kvctl {

// The smallest k such that the k largest entries of `attention` hold at least tau of its total
// (the input need not be normalised). INVALID_ARGUMENT when empty, negative, non-finite or all
// zero, or when tau is outside (0, 1].
StatusOr<int64_t> CoverageSize(std::span<const double> attention, double tau = 0.9);

// exp(entropy) of the normalised distribution: the "effective number of tokens". Same errors.
StatusOr<double> EntropySize(std::span<const double> attention);

enum class DemandMeasure : uint8_t { kCoverage = 0, kEntropy = 1 };

// Offline demand per layer: the mean, over every (step, head) sample added, of the coverage (or
// entropy) size of that sample's attention over the cached tokens. A sample's distribution is
// whatever the caller reduces the group to; TokenAttentionMass(keys, one query token) gives the
// mean over the group.
class LayerDemandCalibrator {
 public:
  // INVALID_ARGUMENT unless layers >= 1 and tau in (0, 1].
  static StatusOr<LayerDemandCalibrator> Create(int64_t layers, double tau = 0.9,
                                                DemandMeasure measure = DemandMeasure::kCoverage);

  // One sample of `layer`. Errors as CoverageSize, or a layer out of range.
  Status AddAttention(int64_t layer, std::span<const double> attention);

  // Mean size per layer. FAILED_PRECONDITION naming the first layer without samples.
  StatusOr<std::vector<double>> Demand() const;

  int64_t samples(int64_t layer) const { return count_[layer]; }

 private:
  LayerDemandCalibrator(int64_t layers, double tau, DemandMeasure measure)
      : tau_(tau), measure_(measure), sum_(layers, 0.0), count_(layers, 0) {}

  double tau_;
  DemandMeasure measure_;
  std::vector<double> sum_;
  std::vector<int64_t> count_;
};

// ReasonAlloc-like layer budgets (tokens summed over the H heads of each layer): proportional to
// demand, each at least heads * floor, summing to exactly L * heads * avg_budget (water-filling
// for the floor, then largest-remainder rounding). INVALID_ARGUMENT when demand is empty, negative,
// non-finite or all zero, heads or avg_budget < 1, or floor outside 0..avg_budget.
StatusOr<std::vector<int64_t>> DemandLayerBudgets(std::span<const double> demand, int64_t heads,
                                                  int64_t avg_budget, int64_t floor);

// Caps every layer at `cap` tokens (what it can hold: heads * tokens seen) and gives what the
// capped layers could not use to the others in proportion to `weight` (largest remainder, repeated
// until no layer is over), so a demand split keeps its total whenever the layers can hold it.
// Without this a layer whose share passes its tokens would keep everything and the surplus would
// be memory nobody uses. INVALID_ARGUMENT when sizes differ, a weight is negative or non-finite,
// or cap < 0.
Status CapLayerBudgets(std::span<const double> weight, int64_t cap, std::vector<int64_t>* budgets);

// Every layer heads * avg_budget. INVALID_ARGUMENT unless all three are >= 1.
StatusOr<std::vector<int64_t>> UniformLayerBudgets(int64_t layers, int64_t heads,
                                                   int64_t avg_budget);

// PyramidKV's schedule (docs/algorithms.md §13.4), per head: base = C - w, min = base / beta,
// max = 2 base - min, clamped when max >= T - w; step = (max - min) / (L - 1);
// cap_l = max - l * step (l = 0 the bottom layer); the layer budget is heads * (cap_l + w).
// Integer division as in the reference, so the sum can exceed L * heads * C slightly. When
// T <= C every layer keeps all T tokens (the reference does not compress); L = 1 gets C [ours].
struct PyramidParams {
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t capacity = 0;  // C: average tokens per head, window included.
  int64_t window = 0;    // w: protected recent tokens.
  int64_t seq_len = 0;   // T: resident tokens per head now.
  int64_t beta = 20;
};
StatusOr<std::vector<int64_t>> PyramidLayerBudgets(const PyramidParams& params);

// b_min = max(window + 8, avg_budget / 4) [ours, docs/algorithms.md §13.3].
int64_t StarvationFloor(int64_t window, int64_t avg_budget);

// A head's utility for the reallocator [ours]: the attention mass it would win back with
// `delta` more tokens, curve.At(budget + delta) - curve.At(budget). Delta = avg_budget / 4 in
// docs/algorithms.md §13.3. REQUIRES: curve.retained is not empty.
double HeadUtility(const RetainedMassCurve& curve, int64_t budget, int64_t delta);

// Head budgets of one layer that maximise the observation window's retained attention mass
// [ours]: every head starts at `floor`, then the rest of `layer_budget` goes `step` tokens at a
// time to the head whose next `step` tokens, in its own score order, hold the most mass (ties to
// the lower head). Past a head's resident tokens (its curve ends there) a step is worth the mass
// of its last `step` kept tokens: the value of tokens not seen yet is guessed from the head's
// margin, so a head that holds all it has can still grow, but only up to reach[h] (its resident
// tokens plus those that arrive before the next re-split: evicted tokens never come back, so a
// budget above that is memory nobody uses while other heads are cut). Once every head is at its
// reach the rest is split evenly. Sums to layer_budget exactly. `reach` empty = unlimited.
// INVALID_ARGUMENT when curves is empty or has an empty curve, reach has another size, floor < 0,
// step < 1 or layer_budget < curves.size() * floor.
StatusOr<std::vector<int64_t>> GreedyHeadBudgets(std::span<const RetainedMassCurve> curves,
                                                 int64_t layer_budget, int64_t floor, int64_t step,
                                                 std::span<const int64_t> reach = {});

struct HeadReallocParams {
  int64_t heads = 0;
  int64_t layer_budget = 0;  // Tokens for the whole layer (a DemandLayerBudgets entry).
  int64_t floor = 0;         // Per-head starvation floor b_min.
  double ema = 0.5;          // Weight of the newest utility.
  int64_t period = 128;      // Decode steps between reallocations (R-KV's buffer).
};

// Online head reallocation inside one layer: b_h = floor + (layer_budget - H floor) u_h / sum u,
// u the EMA-smoothed utility, rounded by largest remainder so that the budgets sum exactly to
// layer_budget. Starts (and stays, while all utilities are 0) at an even split.
class HeadReallocator {
 public:
  // INVALID_ARGUMENT unless heads >= 1, floor >= 0, layer_budget >= heads * floor,
  // ema in (0, 1] and period >= 1.
  static StatusOr<HeadReallocator> Create(const HeadReallocParams& params);

  // Folds one utility per head (finite, >= 0) into the EMA (the first update takes it as is) and
  // recomputes budgets(). INVALID_ARGUMENT on a wrong size or a bad value; state is unchanged.
  Status Update(std::span<const double> utility);

  // True at the decode steps where the daemon should score, call Update and evict.
  bool RefreshDue(int64_t step) const { return step > 0 && step % params_.period == 0; }

  const std::vector<int64_t>& budgets() const { return budgets_; }
  const std::vector<double>& smoothed_utility() const { return utility_; }
  const HeadReallocParams& params() const { return params_; }

 private:
  explicit HeadReallocator(const HeadReallocParams& params) : params_(params) {}
  void Recompute();

  HeadReallocParams params_;
  bool has_utility_ = false;
  std::vector<double> utility_;
  std::vector<int64_t> budgets_;
};

}  // namespace kvctl

#endif  // KVCTL_POLICIES_REASONALLOC_H_
