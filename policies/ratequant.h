// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/ratequant.h
// RateQuant per-head bit allocation (arXiv 2605.06675; docs/algorithms.md §11): given a fitted
// distortion model D_i(b) = alpha_i * beta^-b for every unit i = (layer, KV head, K or V) and an
// importance w_i, choose each unit's code width so the average bits per element, metadata
// included, stays within a budget and sum_i w_i D_i(b_i) is as small as possible.
//
// The algorithm, and what is whose:
//  * [paper, abstract] Distortion falls exponentially in the bit width with a slope beta that is a
//    property of the quantizer (3.6 to 5.3), alpha_i is per unit; allocating with another
//    quantizer's model ("distortion-model mismatch") can invert the allocation and do worse than
//    uniform. Units are attention heads, K and V separately [2nd, VeloxQuant].
//  * [ours, docs/algorithms.md §11.2] The objective min sum w_i alpha_i beta^-b_i s.t. sum
//    cost_i(b_i) <= N * budget. The cost of a width is NOT b: it is the registry's BitsPerElement
//    of the spec at that width (K part or V part), so metadata and OScaR's side record are paid
//    for. The paper appears to count code bits only.
//  * Continuous relaxation (reverse water-filling): with cost b + m_i (m_i = metadata, which the
//    registry keeps independent of b), stationarity gives w_i alpha_i ln(beta_i) beta_i^-b_i =
//    lambda for every unclamped unit; we bisect on ln(lambda) with b clamped to [min, max]. Exact
//    up to the bisection tolerance; it is a lower bound on what integer widths can reach.
//  * Integer allocation over an allowed set with gaps ({2, 3, 4, 8}). Greedy on each unit's lower
//    convex hull of (cost, weighted distortion) points, largest distortion drop per bit of cost
//    first, is the Lagrangian solution: optimal whenever it spends the budget exactly, otherwise
//    possibly short of the optimum by less than one step. [ours] To make it exact we take the
//    critical multiplier lambda* of the first step that did not fit, compute the Lagrangian lower
//    bound L(lambda*), and use reduced-cost fixing: a better allocation y satisfies
//    sum_i r_i(y_i) < U - L, where U is the greedy value and r_i(b) >= 0 is the unit's reduced
//    cost, so every level with r_i(b) >= U - L is ruled out. The few units left with more than one
//    level are solved exactly by a dynamic program over the remaining budget in cost quanta (the
//    gcd of the level cost differences). When that DP would be too large the greedy answer is
//    returned with exact = false and the certified lower bound.
//
// Thread safety: pure functions over their arguments.
//
//   KVCTL_ASSIGN_OR_RETURN(RateQuantFit fit, ReadRateQuantProfile("smollm2-kivi.toml"));
//   KVCTL_ASSIGN_OR_RETURN(RateQuantPlan plan, PlanRateQuant(fit, {.budget_bpe = 3.5}));
//   std::string toml = FormatOverridesToml(plan);  // [[quant.override]] per (layer, head)
#ifndef KVCTL_POLICIES_RATEQUANT_H_
#define KVCTL_POLICIES_RATEQUANT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/quant_types.h"

namespace kvctl {

enum class UnitKind : uint8_t { kKey = 0, kValue = 1 };
std::string_view UnitKindName(UnitKind kind);  // "k", "v".

// What the fitted D(b) measures (see policies/ratequant_fit.h).
enum class DistortionTarget : uint8_t {
  kMse = 0,        // Mean squared error per element of the unit's K or V.
  kAttention = 1,  // Squared attention-output error of the unit's query heads (needs Q).
};
enum class ImportanceMode : uint8_t {
  kUniform = 0,    // w_i = 1.
  kAttention = 1,  // First-order attention-output sensitivity from calibration queries.
};
std::string_view DistortionTargetName(DistortionTarget target);  // "mse", "attention".
std::string_view ImportanceModeName(ImportanceMode mode);        // "uniform", "attention".

// One allocation unit: K or V of one (layer, KV head).
struct RateQuantUnit {
  int layer = 0;
  int head = 0;
  UnitKind kind = UnitKind::kKey;
  double alpha = 0;       // D(b) = alpha * beta^-b; 0 for a unit that never shows an error.
  double importance = 1;  // w_i, multiplies D(b) in the objective.
  // Measured at RateQuantFit::bits[j] (empty when the profile carried none): per-element MSE, and
  // the attention-output error when calibration queries were given.
  std::vector<double> mse;
  std::vector<double> attention;

  bool operator==(const RateQuantUnit&) const = default;
};

// A fitted model for one quantizer on one model geometry.
struct RateQuantFit {
  QuantSpec spec;  // Method, head_dim, block and group sizes; k_bits = v_bits = bits[0].
  int layers = 0;
  int kv_heads = 0;
  std::vector<int> bits;  // Widths measured, ascending; the allocation picks among them.
  DistortionTarget target = DistortionTarget::kMse;
  ImportanceMode importance = ImportanceMode::kUniform;
  bool per_kind_beta = false;  // The model uses beta_k for K units and beta_v for V units.
  double beta = 0;             // Pooled slope over all units (per bit).
  double beta_k = 0;           // Slope of K units in the model (== beta unless per_kind_beta).
  double beta_v = 0;
  double beta_k_only = 0;  // Diagnostics: slope pooled over K units only, and V units only.
  double beta_v_only = 0;
  double rms_log_residual = 0;       // RMS of ln D - ln model over the points fitted.
  int64_t sequences = 0;             // Calibration size.
  int64_t tokens = 0;                // Tokens per sequence summed over sequences.
  std::vector<RateQuantUnit> units;  // 2 * layers * kv_heads: (layer, head) order, K then V.

  double Beta(UnitKind kind) const { return kind == UnitKind::kKey ? beta_k : beta_v; }
  // REQUIRES: indices in range and units laid out as documented (ValidateRateQuantFit).
  const RateQuantUnit& Unit(int layer, int head, UnitKind kind) const {
    return units[(static_cast<size_t>(layer) * kv_heads + head) * 2 + static_cast<size_t>(kind)];
  }
  bool operator==(const RateQuantFit&) const = default;
};

// Checks everything PlanRateQuant relies on; the error names the field ("units[3].alpha: got -1,
// expected a finite value >= 0").
Status ValidateRateQuantFit(const RateQuantFit& fit);

// The cost in bits per element (metadata, padding and side record included) of K or V at each
// width of `bits`, from BitsPerElement of `spec` with k_bits = v_bits = b. UNIMPLEMENTED when the
// registry's K and V costs are not separable (padding couples them) or the metadata depends on b.
struct UnitCosts {
  std::vector<double> k, v;  // Per entry of `bits`.
};
StatusOr<UnitCosts> UnitCostTable(const QuantSpec& spec, int kv_heads,
                                  const std::vector<int>& bits);

// ---- Generic solvers (tested against brute force) -------------------------------------------

// N units, each with the same number of levels; costs strictly increase along levels.
struct AllocationProblem {
  int units = 0;
  int levels = 0;
  std::vector<double> cost;        // [units * levels]
  std::vector<double> distortion;  // [units * levels], already weighted by importance.
  double budget = 0;               // Total cost allowed, summed over units.
};

enum class IntegerSolver : uint8_t {
  kGreedy = 0,  // Convex-hull greedy and a fill pass: fast, certified bound, may miss the optimum.
  kExact = 1,   // Greedy, then reduced-cost fixing and a DP over the units left free.
};

struct IntegerAllocation {
  std::vector<int> level;  // Per unit, an index into the levels.
  double cost = 0;         // Sum of the chosen costs, <= budget.
  double distortion = 0;
  double lower_bound = 0;  // No allocation within the budget has a lower distortion.
  bool exact = false;      // distortion is proven optimal.
  int free_units = 0;      // Units the DP had to decide (0: the greedy answer was proven).
};

// INVALID_ARGUMENT for malformed tables (naming unit and level) or a budget below the cheapest
// allocation ("budget: got 2.9, expected >= 3 (every unit at its lowest level)").
StatusOr<IntegerAllocation> SolveIntegerAllocation(const AllocationProblem& problem,
                                                   IntegerSolver solver);

// Continuous unit: D(b) = scale * beta^-b, cost(b) = b + overhead.
struct ContinuousUnit {
  double scale = 0;  // w_i * alpha_i >= 0.
  double beta = 0;   // > 1.
  double overhead = 0;
};
struct ContinuousAllocation {
  std::vector<double> bits;
  double cost = 0;  // sum bits + overhead, <= budget (within 1e-9 relative).
  double distortion = 0;
  // ln of the water level lambda. When every unit is clamped (or has scale 0) it is the edge of
  // the bracket, not a unique value.
  double log_lambda = 0;
};
// Reverse water-filling by bisection on ln(lambda). INVALID_ARGUMENT for bad units or bounds, or a
// budget below sum(min_bits + overhead).
StatusOr<ContinuousAllocation> SolveWaterFilling(const std::vector<ContinuousUnit>& units,
                                                 double budget, double min_bits, double max_bits);

// ---- Plans ----------------------------------------------------------------------------------

struct RateQuantPlanOptions {
  double budget_bpe = 0;  // Average bits per element over all K and V elements, metadata included.
  int min_bits = 0;       // Restrict fit.bits to [min_bits, max_bits]; 0 = no bound.
  int max_bits = 0;
  // > 1: allocate as if every unit's slope were this (another quantizer's beta), keeping the fit's
  // alphas: the distortion-model mismatch experiment. 0: the fit's own slopes.
  double beta_override = 0;
  bool uniform_importance = false;  // Ignore the fit's importance weights.
  IntegerSolver solver = IntegerSolver::kExact;
};

struct HeadPlan {
  int layer = 0;
  int head = 0;
  int k_bits = 0;
  int v_bits = 0;
  double k_distortion = 0;  // w * alpha * beta^-b under the allocation's model.
  double v_distortion = 0;
  double k_bits_continuous = 0;  // Water-filling widths (the relaxation), for reports.
  double v_bits_continuous = 0;
};

struct RateQuantPlan {
  QuantSpec spec;  // Of the fit; every head uses it with its own k_bits / v_bits.
  int layers = 0;
  int kv_heads = 0;
  double budget_bpe = 0;
  double cost_bpe = 0;  // Achieved average of BitsPerElement over heads, <= budget_bpe.
  double beta_k = 0;    // Slopes the allocation used (beta_override when set).
  double beta_v = 0;
  double predicted_distortion = 0;  // sum over units under the allocation's model.
  double lower_bound = 0;           // Certified bound on the integer optimum (same model).
  bool exact = false;
  double continuous_cost_bpe = 0;  // The relaxation, same model and bounds.
  double continuous_distortion = 0;
  std::vector<HeadPlan> heads;  // layers * kv_heads, (layer, head) order.
};

// Allocates fit.bits (within the options' bounds) to every unit. INVALID_ARGUMENT naming the
// option for a bad budget or bounds, or for an invalid fit.
StatusOr<RateQuantPlan> PlanRateQuant(const RateQuantFit& fit, const RateQuantPlanOptions& options);

// Every head at (k_bits, v_bits), scored under the fit's own model: the uniform baseline.
StatusOr<RateQuantPlan> UniformPlan(const RateQuantFit& fit, int k_bits, int v_bits);

// An allocation re-scored under `fit` (its own slopes and alphas, and its measurements): what the
// allocation really costs in distortion. Sums over units of w_i * value.
struct PlanScore {
  double model = 0;      // w * alpha * beta^-b with the fit's slopes.
  double measured = 0;   // w * measured target (mse or attention, as fitted) at the chosen widths.
  double attention = 0;  // Unweighted measured attention error; 0 without calibration queries.
  bool has_measurements = false;
  bool has_attention = false;
};
// INVALID_ARGUMENT when the plan's geometry or widths do not match the fit.
StatusOr<PlanScore> ScorePlan(const RateQuantFit& fit, const RateQuantPlan& plan);

// The plan as TOML the daemon accepts: a comment header, then one `[[<table>]]` per (layer, head)
// with layer, head, k_bits, v_bits. `table` is "quant.override" or "model.override".
std::string FormatOverridesToml(const RateQuantPlan& plan,
                                std::string_view table = "quant.override");

}  // namespace kvctl

#endif  // KVCTL_POLICIES_RATEQUANT_H_
