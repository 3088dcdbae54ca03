// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvcalib_joint.h
// `kvcalib plan --mode joint|quant-only|evict-only`: one byte budget for a sequence of `tokens`
// tokens per head -> per (layer, KV head) tokens kept, K/V widths and predicted distortion, from
// a calibration profile through the joint planner (policies/joint_planner.h), with an independent
// check of the totals:
//  * bytes are recomputed here from each head's kept tokens and widths with the registry's
//    BitsPerElement (fixed tokens at fp16; the worst-case fp16 tail rows, tail_tokens per head,
//    at fp16 minus the narrowest allowed widths' rate), not taken from the planner, and must
//    satisfy 0 <= requested - achieved <= one allocation unit (JointPlan::unit_bytes: a token
//    quantum at the widest width, or one width step of a head's quantized tokens), unless the plan
//    is saturated (every head at its best option: a larger budget cannot lower the distortion);
//  * every head keeps at least its fixed (sink + window) tokens and at most the tokens seen.
//
// Thread safety: pure functions.
//
//   KVCTL_ASSIGN_OR_RETURN(CalibProfile p, ReadCalibProfile("profile.toml"));
//   KVCTL_ASSIGN_OR_RETURN(KvcalibJointPlan plan, BuildKvcalibJointPlan(p, JointMode::kJoint,
//                          {.tokens = 4096, .window = 64, .budget_fraction = 0.25}));
//   std::string json = FormatJointPlanJson(plan, {});
#ifndef KVCTL_TOOLS_KVCALIB_JOINT_H_
#define KVCTL_TOOLS_KVCALIB_JOINT_H_

#include <string>

#include "common/status.h"
#include "policies/calib_profile.h"
#include "policies/joint_planner.h"
#include "tools/kvcalib_plan.h"

namespace kvctl {

struct JointBudgetCheck {
  double requested_bytes = 0;
  double achieved_bytes = 0;  // Recomputed from the heads' kept tokens and widths.
  double slack_bytes = 0;     // requested - achieved.
  double unit_bytes = 0;
  double fp16_bytes = 0;  // Every token seen at fp16: the --budget-fraction denominator.
  bool saturated = false;
  bool ok = false;
};

// Recomputes and checks a plan's totals. INVALID_ARGUMENT when the plan has another number of
// heads than the input, or a head keeps fewer than its fixed tokens or more than it has seen.
StatusOr<JointBudgetCheck> CheckJointBudget(const JointPlanInput& input, const JointPlan& plan);

struct KvcalibJointPlan {
  JointPlanInput input;
  JointPlan plan;
  JointBudgetCheck check;
  bool uniform_curves = false;  // The profile had no [reasonalloc]: flat attention assumed.
  double fixed_tokens = 0;      // Per head (sinks + window, at most the tokens).

  bool ok() const { return check.ok; }
};

// MakeJointInput + PlanJoint + CheckJointBudget. Errors name the kvcalib flag where one maps
// (--tokens, --budget-bytes, --budget-fraction, ...); RESOURCE_EXHAUSTED when the budget is below
// the mode's cheapest plan. A plan whose check fails is returned with ok() == false.
StatusOr<KvcalibJointPlan> BuildKvcalibJointPlan(const CalibProfile& profile, JointMode mode,
                                                 const JointProfileOptions& options);

// One JSON object: mode, what won, geometry, the budget check, totals, one entry per head
// (tokens, kept, k_bits, v_bits, bytes, retained mass, distortions), timings and "ok".
std::string FormatJointPlanJson(const KvcalibJointPlan& plan, const PlanReportInfo& info);
// The same as text: totals and the check first, then one line per (layer, head).
std::string FormatJointPlanTable(const KvcalibJointPlan& plan, const PlanReportInfo& info);

}  // namespace kvctl

#endif  // KVCTL_TOOLS_KVCALIB_JOINT_H_
