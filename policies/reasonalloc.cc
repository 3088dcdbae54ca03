// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// ReasonAlloc-like token budgets.
//
// What the paper says [paper: arXiv 2606.11164, abstract and secondary summaries only]: eviction
// under a total budget is hierarchical. Layers get budgets offline from a per-architecture demand
// curve (the "Reasoning Wave": shallow and deep layers need many tokens, middle layers few; not
// monotone, unlike PyramidKV). Inside a layer, budget moves online between heads towards those
// whose tokens have high "utility", with a guard against starvation loops (a head that loses
// budget sees less, scores lower and shrinks further). Token scoring is plugged in (R-KV, SnapKV).
// The utility, the refresh interval, the floor and the demand measurement were not published; all
// of what follows is ours (docs/algorithms.md §13) and must be validated by experiment.
//
// Layer demand [ours]. For sampled decode steps t of calibration traces run with the full cache,
// and each KV head h of layer l, take the attention distribution a over cached tokens (the caller
// reduces the group; the mean over the group is TokenAttentionMass with one query). Its coverage
// size c = min{k : top-k mass >= tau}, tau = 0.9, counts how many tokens that head needs right
// now; d_l = mean over (t, h) of c. exp(entropy) is offered as a smoother alternative. A coverage
// size is a property of the distribution only, so traces of different lengths mix: a long trace
// can need more tokens, which is the point.
//
// Layer budgets [ours]. The pool holds L*H*B tokens (B = average per head). Layer l gets H*B_l with
// B_l proportional to d_l and at least the floor (docs/algorithms.md §13.2). A simple reading is
// "max(floor, proportional), then renormalise"; we make it exact with water-filling: give every
// layer its proportional share of what is left, pin the layers below the floor to the floor,
// re-share the rest among the others, and repeat until no share is below the floor (at most L
// rounds). Shares are then rounded by largest remainder (ties to the lower layer), so the total is
// exactly L*H*B and no layer falls below H*floor, because an integer floor is kept by rounding down
// a share at or above it. Budgets are kept at token granularity per layer, not per head: the head
// reallocator splits a layer total that need not be a multiple of H.
//
// Baselines [paper: PyramidKV code, docs/algorithms.md §13.4]: uniform, and PyramidKV's linear
// schedule from 2*base - base/beta (bottom) to base/beta (top), base = C - w. Published versions of
// that code divide the span by L - 1 or by L; we use L - 1. Its integer division makes the sum
// drift above L*C by up to (L - 1) * L / 2 tokens per head; we return the formula's numbers rather
// than correcting them, since it is a baseline.
//
// Head reallocation [ours, docs/algorithms.md §13.3]. Every P = 128 decode steps (R-KV's buffer, so
// reallocation lands on the step where eviction runs), each head reports a utility u_h >= 0. The
// one we provide, HeadUtility, is the attention mass of the observation queries that the head would
// win back by keeping Delta = B/4 more tokens in its own score order: a difference on the
// retained-mass curve. u is smoothed by an EMA (weight 0.5 on the newest) so one noisy window
// cannot swing a budget. Budgets are b_h = b_min + (H*B_l - H*b_min) * u_h / sum u, rounded by
// largest remainder to sum exactly to the layer budget; sum u = 0 splits the excess evenly. The
// starvation floor b_min = max(window + 8, B/4) is the guard: a head always keeps its window plus 8
// scored tokens (so it can still observe and earn utility back) and at least a quarter of the
// average. Shrinking takes effect at the next eviction; growth only as new tokens arrive (the
// daemon's business).
#include "policies/reasonalloc.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvctl {
namespace {

// Non-empty, finite, non-negative, positive total. Returns the total.
StatusOr<double> CheckDistribution(std::span<const double> attention) {
  if (attention.empty()) return InvalidArgument("attention: empty, expected one value per token");
  double total = 0;
  for (size_t j = 0; j < attention.size(); ++j) {
    if (!std::isfinite(attention[j]) || attention[j] < 0) {
      return InvalidArgument("attention[", j, "]: got ", attention[j],
                             ", expected a finite value >= 0");
    }
    total += attention[j];
  }
  if (!(total > 0)) return InvalidArgument("attention: all zero, expected a positive total");
  return total;
}

Status CheckTau(double tau) {
  if (!(tau > 0 && tau <= 1)) return InvalidArgument("tau: got ", tau, ", expected (0, 1]");
  return OkStatus();
}

// Integers that sum to `total`, each the floor of its share plus one unit for the largest
// fractional parts (ties to the lower index). REQUIRES: shares >= 0 summing to total up to
// rounding error.
std::vector<int64_t> LargestRemainder(const std::vector<double>& shares, int64_t total) {
  const size_t n = shares.size();
  std::vector<int64_t> out(n);
  int64_t assigned = 0;
  for (size_t i = 0; i < n; ++i) assigned += (out[i] = static_cast<int64_t>(std::floor(shares[i])));
  const int64_t deficit = total - assigned;
  KVCTL_CHECK(deficit >= 0 && deficit <= static_cast<int64_t>(n));
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return shares[a] - std::floor(shares[a]) > shares[b] - std::floor(shares[b]);
  });
  for (int64_t k = 0; k < deficit; ++k) ++out[order[k]];
  return out;
}

}  // namespace

StatusOr<int64_t> CoverageSize(std::span<const double> attention, double tau) {
  KVCTL_RETURN_IF_ERROR(CheckTau(tau));
  KVCTL_ASSIGN_OR_RETURN(const double total, CheckDistribution(attention));
  std::vector<double> sorted(attention.begin(), attention.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  // A relative slack of 1e-12 keeps a sum that is tau up to rounding from costing one more token.
  const double target = tau * total * (1 - 1e-12);
  double mass = 0;
  for (size_t k = 0; k < sorted.size(); ++k) {
    mass += sorted[k];
    if (mass >= target) return static_cast<int64_t>(k + 1);
  }
  return static_cast<int64_t>(sorted.size());
}

StatusOr<double> EntropySize(std::span<const double> attention) {
  KVCTL_ASSIGN_OR_RETURN(const double total, CheckDistribution(attention));
  double entropy = 0;
  for (double a : attention) {
    if (a > 0) entropy -= (a / total) * std::log(a / total);
  }
  return std::exp(entropy);
}

StatusOr<LayerDemandCalibrator> LayerDemandCalibrator::Create(int64_t layers, double tau,
                                                              DemandMeasure measure) {
  if (layers < 1) return InvalidArgument("layers: got ", layers, ", expected >= 1");
  KVCTL_RETURN_IF_ERROR(CheckTau(tau));
  if (measure != DemandMeasure::kCoverage && measure != DemandMeasure::kEntropy) {
    return InvalidArgument("measure: got ", static_cast<int>(measure),
                           ", expected coverage or entropy");
  }
  return LayerDemandCalibrator(layers, tau, measure);
}

Status LayerDemandCalibrator::AddAttention(int64_t layer, std::span<const double> attention) {
  const int64_t layers = static_cast<int64_t>(sum_.size());
  if (layer < 0 || layer >= layers) {
    return InvalidArgument("layer: got ", layer, ", expected 0..", layers - 1);
  }
  double size = 0;
  if (measure_ == DemandMeasure::kCoverage) {
    KVCTL_ASSIGN_OR_RETURN(const int64_t k, CoverageSize(attention, tau_));
    size = static_cast<double>(k);
  } else {
    KVCTL_ASSIGN_OR_RETURN(size, EntropySize(attention));
  }
  sum_[layer] += size;
  ++count_[layer];
  return OkStatus();
}

StatusOr<std::vector<double>> LayerDemandCalibrator::Demand() const {
  std::vector<double> demand(sum_.size());
  for (size_t l = 0; l < sum_.size(); ++l) {
    if (count_[l] == 0) {
      return FailedPrecondition("layer ", l, ": no calibration samples, expected at least one");
    }
    demand[l] = sum_[l] / static_cast<double>(count_[l]);
  }
  return demand;
}

StatusOr<std::vector<int64_t>> DemandLayerBudgets(std::span<const double> demand, int64_t heads,
                                                  int64_t avg_budget, int64_t floor) {
  if (demand.empty()) return InvalidArgument("demand: empty, expected one value per layer");
  if (heads < 1) return InvalidArgument("heads: got ", heads, ", expected >= 1");
  if (avg_budget < 1) return InvalidArgument("avg_budget: got ", avg_budget, ", expected >= 1");
  if (floor < 0 || floor > avg_budget) {
    return InvalidArgument("floor: got ", floor, ", expected 0..", avg_budget, " (avg_budget)");
  }
  double demand_total = 0;
  for (size_t l = 0; l < demand.size(); ++l) {
    if (!std::isfinite(demand[l]) || demand[l] < 0) {
      return InvalidArgument("demand[", l, "]: got ", demand[l], ", expected a finite value >= 0");
    }
    demand_total += demand[l];
  }
  if (!(demand_total > 0)) return InvalidArgument("demand: all zero, expected a positive total");

  const size_t layers = demand.size();
  const int64_t total = static_cast<int64_t>(layers) * heads * avg_budget;
  const double layer_floor = static_cast<double>(heads * floor);
  std::vector<double> shares(layers, 0.0);
  std::vector<bool> pinned(layers, false);
  // Water-filling: each round pins at least one more layer or ends, so at most L rounds. Free
  // shares end >= the integer layer floor, so rounding them down keeps the floor.
  for (bool changed = true; changed;) {
    changed = false;
    double free_demand = 0, left = static_cast<double>(total);
    for (size_t l = 0; l < layers; ++l) {
      if (pinned[l]) {
        left -= layer_floor;
      } else {
        free_demand += demand[l];
      }
    }
    // Pinned layers all sit at the floor and total >= L * layer_floor, so whenever a layer is
    // still free, one with positive demand is (a zero-demand share is 0 < floor, or floor is 0).
    KVCTL_CHECK(free_demand > 0);
    for (size_t l = 0; l < layers; ++l) {
      if (pinned[l]) continue;
      shares[l] = left * demand[l] / free_demand;
      if (shares[l] < layer_floor) {
        pinned[l] = true;
        changed = true;
      }
    }
  }
  for (size_t l = 0; l < layers; ++l) {
    if (pinned[l]) shares[l] = layer_floor;
  }
  return LargestRemainder(shares, total);
}

Status CapLayerBudgets(std::span<const double> weight, int64_t cap, std::vector<int64_t>* budgets) {
  if (weight.size() != budgets->size()) {
    return InvalidArgument("weight: got ", weight.size(), " values, expected ", budgets->size(),
                           " (one per layer)");
  }
  if (cap < 0) return InvalidArgument("cap: got ", cap, ", expected >= 0");
  for (size_t l = 0; l < weight.size(); ++l) {
    if (!std::isfinite(weight[l]) || weight[l] < 0) {
      return InvalidArgument("weight[", l, "]: got ", weight[l], ", expected a finite value >= 0");
    }
  }
  std::vector<int64_t>& b = *budgets;
  // Each round caps at least one more layer or ends, so it stops within L rounds.
  for (size_t round = 0; round <= b.size(); ++round) {
    int64_t surplus = 0;
    double free_weight = 0;
    std::vector<size_t> free;
    for (size_t l = 0; l < b.size(); ++l) {
      if (b[l] >= cap) {
        surplus += b[l] - cap;
        b[l] = cap;
      } else {
        free.push_back(l);
        free_weight += weight[l];
      }
    }
    if (surplus == 0 || free.empty()) break;
    std::vector<double> shares(free.size());
    for (size_t i = 0; i < free.size(); ++i) {
      shares[i] = free_weight > 0 ? surplus * weight[free[i]] / free_weight
                                  : static_cast<double>(surplus) / static_cast<double>(free.size());
    }
    const std::vector<int64_t> extra = LargestRemainder(shares, surplus);
    for (size_t i = 0; i < free.size(); ++i) b[free[i]] += extra[i];
  }
  return OkStatus();
}

StatusOr<std::vector<int64_t>> UniformLayerBudgets(int64_t layers, int64_t heads,
                                                   int64_t avg_budget) {
  if (layers < 1) return InvalidArgument("layers: got ", layers, ", expected >= 1");
  if (heads < 1) return InvalidArgument("heads: got ", heads, ", expected >= 1");
  if (avg_budget < 1) return InvalidArgument("avg_budget: got ", avg_budget, ", expected >= 1");
  return std::vector<int64_t>(static_cast<size_t>(layers), heads * avg_budget);
}

StatusOr<std::vector<int64_t>> PyramidLayerBudgets(const PyramidParams& p) {
  if (p.layers < 1) return InvalidArgument("pyramid.layers: got ", p.layers, ", expected >= 1");
  if (p.heads < 1) return InvalidArgument("pyramid.heads: got ", p.heads, ", expected >= 1");
  if (p.window < 0) return InvalidArgument("pyramid.window: got ", p.window, ", expected >= 0");
  if (p.capacity <= p.window) {
    return InvalidArgument("pyramid.capacity: got ", p.capacity, ", expected > window ", p.window);
  }
  if (p.seq_len < 1) return InvalidArgument("pyramid.seq_len: got ", p.seq_len, ", expected >= 1");
  if (p.beta < 1) return InvalidArgument("pyramid.beta: got ", p.beta, ", expected >= 1");
  std::vector<int64_t> budgets(static_cast<size_t>(p.layers));
  if (p.seq_len <= p.capacity) {
    std::fill(budgets.begin(), budgets.end(), p.heads * p.seq_len);
    return budgets;
  }
  if (p.layers == 1) {
    budgets[0] = p.heads * p.capacity;
    return budgets;
  }
  // All quantities are >= 0 here (seq_len > capacity), so C++ division matches Python's //.
  const int64_t base = p.capacity - p.window;
  int64_t min_b = base / p.beta;
  int64_t max_b = 2 * base - min_b;
  if (max_b >= p.seq_len - p.window) {
    max_b = p.seq_len - p.window;
    min_b = 2 * base - max_b;
  }
  const int64_t step = (max_b - min_b) / (p.layers - 1);
  for (int64_t l = 0; l < p.layers; ++l) budgets[l] = p.heads * (max_b - l * step + p.window);
  return budgets;
}

int64_t StarvationFloor(int64_t window, int64_t avg_budget) {
  return std::max(window + 8, avg_budget / 4);
}

double HeadUtility(const RetainedMassCurve& curve, int64_t budget, int64_t delta) {
  return curve.At(budget + delta) - curve.At(budget);
}

StatusOr<std::vector<int64_t>> GreedyHeadBudgets(std::span<const RetainedMassCurve> curves,
                                                 int64_t layer_budget, int64_t floor, int64_t step,
                                                 std::span<const int64_t> reach) {
  if (curves.empty()) return InvalidArgument("curves: empty, expected one per head");
  if (!reach.empty() && reach.size() != curves.size()) {
    return InvalidArgument("reach: got ", reach.size(), " values, expected ", curves.size(),
                           " (one per head)");
  }
  if (floor < 0) return InvalidArgument("floor: got ", floor, ", expected >= 0");
  if (step < 1) return InvalidArgument("step: got ", step, ", expected >= 1");
  const auto heads = static_cast<int64_t>(curves.size());
  if (layer_budget < heads * floor) {
    return InvalidArgument("layer_budget: got ", layer_budget, ", expected >= ", heads * floor,
                           " (heads * floor)");
  }
  for (size_t h = 0; h < curves.size(); ++h) {
    if (curves[h].retained.empty()) {
      return InvalidArgument("curves[", h, "]: empty, expected a retained-mass curve");
    }
  }
  // Mass of `s` more tokens above budget b: read off the curve while it lasts, then at the rate
  // of the head's last s kept tokens.
  auto gain = [](const RetainedMassCurve& c, int64_t b, int64_t s) {
    const int64_t end = c.min_budget + static_cast<int64_t>(c.retained.size()) - 1;
    if (b + s <= end) return c.At(b + s) - c.At(b);
    const double inside = c.At(end) - c.At(b);
    const int64_t last = std::max(c.min_budget, end - s);
    const double rate = end > last ? (c.At(end) - c.At(last)) / static_cast<double>(end - last) : 0;
    return inside + rate * static_cast<double>(b + s - std::max(b, end));
  };
  std::vector<int64_t> budgets(curves.size(), floor);
  int64_t left = layer_budget - heads * floor;
  while (left > 0) {
    const int64_t s = std::min(step, left);
    int64_t best = 0;
    double best_gain = -1;
    for (int64_t h = 0; h < heads; ++h) {
      // Tokens past the head's reach are worth nothing to it.
      const int64_t usable = reach.empty() ? s : std::clamp<int64_t>(reach[h] - budgets[h], 0, s);
      const double g = usable > 0 ? gain(curves[h], budgets[h], usable) : 0.0;
      // Equal gains (flat curves) go to the smaller budget, so nothing piles onto one head.
      if (g > best_gain || (g == best_gain && budgets[h] < budgets[best])) best = h, best_gain = g;
    }
    budgets[best] += s;
    left -= s;
  }
  return budgets;
}

StatusOr<HeadReallocator> HeadReallocator::Create(const HeadReallocParams& params) {
  if (params.heads < 1) return InvalidArgument("heads: got ", params.heads, ", expected >= 1");
  if (params.floor < 0) return InvalidArgument("floor: got ", params.floor, ", expected >= 0");
  if (params.layer_budget < params.heads * params.floor) {
    return InvalidArgument("layer_budget: got ", params.layer_budget,
                           ", expected >= ", params.heads * params.floor, " (heads * floor)");
  }
  if (!(params.ema > 0 && params.ema <= 1)) {
    return InvalidArgument("ema: got ", params.ema, ", expected (0, 1]");
  }
  if (params.period < 1) return InvalidArgument("period: got ", params.period, ", expected >= 1");
  HeadReallocator r(params);
  r.utility_.assign(static_cast<size_t>(params.heads), 0.0);
  r.Recompute();
  return r;
}

Status HeadReallocator::Update(std::span<const double> utility) {
  if (utility.size() != utility_.size()) {
    return InvalidArgument("utility: got ", utility.size(), " values, expected ", utility_.size(),
                           " (one per head)");
  }
  for (size_t h = 0; h < utility.size(); ++h) {
    if (!std::isfinite(utility[h]) || utility[h] < 0) {
      return InvalidArgument("utility[", h, "]: got ", utility[h],
                             ", expected a finite value >= 0");
    }
  }
  for (size_t h = 0; h < utility.size(); ++h) {
    utility_[h] =
        has_utility_ ? params_.ema * utility[h] + (1 - params_.ema) * utility_[h] : utility[h];
  }
  has_utility_ = true;
  Recompute();
  return OkStatus();
}

void HeadReallocator::Recompute() {
  const size_t heads = utility_.size();
  const double excess = static_cast<double>(params_.layer_budget - params_.heads * params_.floor);
  const double total_utility = std::accumulate(utility_.begin(), utility_.end(), 0.0);
  std::vector<double> shares(heads);
  for (size_t h = 0; h < heads; ++h) {
    const double part =
        total_utility > 0 ? utility_[h] / total_utility : 1.0 / static_cast<double>(heads);
    shares[h] = static_cast<double>(params_.floor) + excess * part;
  }
  budgets_ = LargestRemainder(shares, params_.layer_budget);
}

}  // namespace kvctl
