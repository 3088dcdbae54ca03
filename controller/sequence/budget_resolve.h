// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/sequence/budget_resolve.h
// The [budget] and [evict] keys (checked by controller/config/budget_keys.h) resolved into what
// one new sequence runs with: EvictionSettings for evict-only and joint, per-head bit widths for
// quant-only (a RateQuant allocation of budget.profile at budget.avg_bits) and joint (the joint
// plan), the pressure settings. docs/budgets.md describes the modes.
//
// Thread safety: safe to call from any thread (the profile is read through LoadBudgetProfile's
// cache).
//
//   KVCTL_ASSIGN_OR_RETURN(EvictionSettings s, ResolveEviction(config, model, shape));
#ifndef KVCTL_CONTROLLER_SEQUENCE_BUDGET_RESOLVE_H_
#define KVCTL_CONTROLLER_SEQUENCE_BUDGET_RESOLVE_H_

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/config/config.h"
#include "controller/sequence/eviction_driver.h"
#include "controller/sequence/kv_sequence.h"

namespace kvctl {

struct SequenceShape {
  int layers = 0;
  int kv_heads = 0;
  int q_heads = 0;
  int head_dim = 0;
  int quant_sinks = 0;  // fp16 sink rows of the layers (0 when lossless).
};

// Eviction settings of a new sequence (enabled in evict-only and joint). `head_caps` (joint only):
// the per-head kept-token caps ApplyBudgetWidths returned. INVALID_ARGUMENT when the session
// cannot run them: no q_heads for a scorer that reads Q, a demand profile of another layer count,
// or a token budget below the floor the fp16 sinks and window impose.
StatusOr<EvictionSettings> ResolveEviction(const Config& config, const SequenceShape& shape,
                                           const std::vector<int64_t>& head_caps = {});

// evict-only with budget.fp16_fraction m (a memory budget instead of a token count): sets the
// settings' token_fraction and fraction_offset from the layers' plans so that the average budget
// K(T) = ceil(f T) - offset keeps each head's records plus its fp16 rows (sinks, and half a
// flush of tail: the mean over the steps) at m x the fp16 bytes of the T tokens seen:
// f = m x fp16 row bytes / kept bytes per token, offset = the fp16 rows' extra bytes over the
// same tokens as records, in kept tokens. The pool's page slack is not counted. No-op otherwise.
void AimEvictionAtMemory(const Config& config, const std::vector<LayerPlan>& plans, int head_dim,
                         DType dtype, EvictionSettings* settings);

// What APPENDs of a new sequence do when the pool is full (budget.pressure): lower widths only
// with "requantize", pricing each head by the RateQuant curves of budget.profile when it was
// fitted for this geometry, else by the default model (policies/width_relief.h).
// joint: `joint_input` (the planner input ApplyBudgetWidths returned) lets the relief compare
// lowering widths with evicting (AdviseShortfall) and take the cheaper.
StatusOr<PressureSettings> ResolvePressure(const Config& config, const SequenceShape& shape,
                                           const JointPlanInput* joint_input = nullptr);

// quant-only: replaces every head's k_bits / v_bits in `plans` with the RateQuant allocation of
// budget.profile at the configured average bits. joint: with the widths of the joint plan
// (PlanJoint of budget.profile for budget.plan_tokens tokens at budget.bytes or
// budget.fp16_fraction), and appends each head's kept-token cap to *head_caps (may be null).
// No-op in other modes. INVALID_ARGUMENT when the profile's geometry or method differs from the
// sequence's; RESOURCE_EXHAUSTED when the byte budget is below the cheapest joint plan.
// joint_input (may be null) receives the planner input of a joint plan.
Status ApplyBudgetWidths(const Config& config, const SequenceShape& shape,
                         std::vector<LayerPlan>* plans, std::vector<int64_t>* head_caps,
                         JointPlanInput* joint_input = nullptr);

// Whether a new sequence's settings can compress at all: a head's rows stay fp16 until it holds
// sinks + flush rows (quant.sink_tokens fp16 sinks, then quant.flush_tokens of fp16 tail), so an
// eviction budget at or below that keeps every row fp16 (16 b/e) however long the sequence.
// configs/README.md "When nothing is quantized".
struct CompressionWarning {
  // "full_heads_over_budget", "full_heads_starve_others", "never_quantized" or
  // "late_quantization" (the STATS value).
  std::string cause;
  std::string message;  // One log line naming the keys, their values and a fix.
};
struct CompressionOutlook {
  // Tokens a sequence must reach before any head quantizes a row: sinks + flush without
  // eviction, later when a token_fraction holds the heads below it (the heads evict.full_heads
  // does not name, when it names some); 0 when the settings never quantize by design (lossless,
  // fp16); -1 when no head (no such head) ever will.
  int64_t onset_tokens = 0;
  std::vector<CompressionWarning> warnings;  // Empty when the settings compress.
};
// Sequences shorter than this are "short" (a prompt and an answer: the demo's is 374 tokens);
// an onset past it warns (late_quantization).
inline constexpr int64_t kShortSequenceTokens = 512;

// The outlook of a new sequence from its plans (after ApplyBudgetWidths) and eviction settings
// (ResolveEviction). Warns never_quantized when every head (evict-only with
// budget.tokens_per_head: every layer's even per-head share; joint: every head's cap, or
// budget.plan_tokens itself) stays below sinks + flush, or in evict-only when some do (the
// message counts them; a joint plan prices such heads' fp16 rows itself, so that is no warning);
// late_quantization when the onset passes kShortSequenceTokens (with evict.full_heads, the onset
// of the other heads, which keep less); full_heads_over_budget when evict.full_heads leaves the
// other heads only their floor, so the sequence outgrows its budget (with budget.tokens_per_head
// from some length on, always; with a token fraction f when the named heads are >= f of all);
// full_heads_starve_others when, under a token fraction f, the named heads leave the others
// less than f / 2 of their tokens.
CompressionOutlook CompressionOutlookOf(const Config& config, const SequenceShape& shape,
                                        const std::vector<LayerPlan>& plans,
                                        const EvictionSettings& eviction);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SEQUENCE_BUDGET_RESOLVE_H_
