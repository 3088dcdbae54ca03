// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvcalib_plan.h
// `kvcalib plan`: from a calibration profile (policies/calib_profile.h) and a b/e budget, the
// RateQuant widths of every (layer, KV head) (PlanRateQuant), optionally per-layer token budgets
// (ReasonAlloc-like demand, uniform or PyramidKV schedule), and an independent check that the
// totals meet the budget:
//  * bits: the achieved average b/e is recomputed from the planned widths with the registry's
//    BitsPerElement (not taken from the planner) and must satisfy
//    0 <= requested - achieved <= one allocation unit, where an allocation unit is the largest
//    single width step one unit (K or V of one head) can take, spread over all units
//    (e.g. KIVI 4 -> 8 bits over 2 x 80 x 8 units: 4 / 1280 b/e);
//  * tokens: demand and uniform schedules must sum to exactly layers x kv_heads x avg tokens;
//    PyramidKV's integer division may overshoot by at most kv_heads x L (L - 2) / 2 tokens
//    (reasonalloc.h), and keeps every token when the sequence is shorter than the average.
// The JSON and table reports print requested against achieved; callers exit non-zero when a
// check fails.
//
// Thread safety: pure functions.
//
//   KVCTL_ASSIGN_OR_RETURN(CalibProfile p, ReadCalibProfile("profile.toml"));
//   KVCTL_ASSIGN_OR_RETURN(KvcalibPlan plan, BuildKvcalibPlan(p, {.quant = {.budget_bpe = 3.5}}));
//   if (!plan.ok()) ...;  std::string json = FormatPlanJson(plan, {});
#ifndef KVCTL_TOOLS_KVCALIB_PLAN_H_
#define KVCTL_TOOLS_KVCALIB_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "policies/calib_profile.h"
#include "policies/ratequant.h"

namespace kvctl {

enum class LayerSchedule : uint8_t { kDemand = 0, kUniform = 1, kPyramid = 2 };
std::string_view LayerScheduleName(LayerSchedule schedule);  // "demand", "uniform", "pyramid".
StatusOr<LayerSchedule> ParseLayerSchedule(std::string_view name);

struct KvcalibPlanOptions {
  RateQuantPlanOptions quant;
  int64_t layer_budget_tokens = 0;  // Average tokens per (layer, head); 0: no token budgets.
  LayerSchedule schedule = LayerSchedule::kDemand;
  int64_t window = 8;   // Protected recent tokens per head (pyramid; default floor).
  int64_t floor = -1;   // Per-head floor of the demand schedule; -1: StarvationFloor.
  int64_t seq_len = 0;  // Pyramid's T; 0: longer than any budget (no clamping).
  int64_t pyramid_beta = 20;
};

// The widths' b/e range for `fit` within [min_bits, max_bits] (0 = no bound), metadata included.
struct BudgetRange {
  std::vector<int> bits;     // The allowed widths, ascending.
  double min_bpe = 0;        // Every unit at bits.front().
  double max_bpe = 0;        // Every unit at bits.back().
  double unit_step_bpe = 0;  // One allocation unit (see the file comment).
};
// INVALID_ARGUMENT naming --min-bits/--max-bits when no fitted width is left; UNIMPLEMENTED as
// UnitCostTable.
StatusOr<BudgetRange> ComputeBudgetRange(const RateQuantFit& fit, int min_bits, int max_bits);

struct BitBudgetCheck {
  double requested_bpe = 0;
  double achieved_bpe = 0;  // Recomputed from the planned widths.
  double slack_bpe = 0;     // requested - achieved.
  double unit_step_bpe = 0;
  int64_t units = 0;  // 2 x layers x kv_heads.
  bool ok = false;
};
// Recomputes and checks a plan's total. INVALID_ARGUMENT when the plan's geometry differs from
// the fit's or a head uses a width outside the range.
StatusOr<BitBudgetCheck> CheckBitBudget(const RateQuantFit& fit, const BudgetRange& range,
                                        const RateQuantPlan& plan, double requested_bpe);

struct LayerTokenPlan {
  LayerSchedule schedule = LayerSchedule::kDemand;
  int64_t avg_tokens_per_head = 0;
  int64_t window = 0;
  int64_t floor = 0;             // Demand schedule only.
  int64_t seq_len = 0;           // Pyramid only (as passed to PyramidLayerBudgets).
  std::vector<double> demand;    // Per layer, from the profile (empty without [reasonalloc]).
  std::vector<int64_t> tokens;   // Per layer, summed over its kv_heads heads.
  std::vector<double> bpe;       // Per layer: mean over its heads of the planned K/V b/e.
  std::vector<double> bytes;     // Per layer: tokens x head_dim x 2 x bpe / 8 (quantized region).
  int64_t requested_tokens = 0;  // layers x kv_heads x avg_tokens_per_head.
  int64_t achieved_tokens = 0;
  int64_t tolerance_tokens = 0;  // Allowed overshoot (pyramid only).
  bool ok = false;
};

struct KvcalibPlan {
  RateQuantPlan quant;
  BudgetRange range;
  BitBudgetCheck bits;
  std::optional<LayerTokenPlan> tokens;

  bool ok() const { return bits.ok && (!tokens || tokens->ok); }
};

// INVALID_ARGUMENT naming the flag for a budget outside [min_bpe, max_bpe]
// ("--budget-bpe: got 9, expected 3.5..8.5 for kivi at widths 2..8, metadata included"), bad
// token options, or the demand schedule on a profile without [reasonalloc]; errors of
// PlanRateQuant and the layer-budget functions otherwise. A plan whose checks fail is returned
// with ok() == false, not as an error.
StatusOr<KvcalibPlan> BuildKvcalibPlan(const CalibProfile& profile,
                                       const KvcalibPlanOptions& options);

struct PlanReportInfo {
  std::string profile;  // Path shown in the report.
  double read_ms = -1;  // Reading and parsing the profile; < 0: not shown.
  double plan_ms = -1;  // BuildKvcalibPlan.
};
// One JSON object: geometry, the bit check, totals, one entry per (layer, head), the token plan
// (null without one), timings and "ok".
std::string FormatPlanJson(const KvcalibPlan& plan, const PlanReportInfo& info);
// A text report: totals and checks first, then one line per (layer, head), then the layers.
std::string FormatPlanTable(const KvcalibPlan& plan, const PlanReportInfo& info);

}  // namespace kvctl

#endif  // KVCTL_TOOLS_KVCALIB_PLAN_H_
