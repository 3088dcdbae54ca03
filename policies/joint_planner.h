// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/joint_planner.h
// The joint planner (issue #4): one byte budget for a sequence (or a pool share) -> per (layer,
// KV head) the tokens kept and the K/V code widths that minimise predicted distortion. It prices
// both levers, quantization (RateQuant curves, policies/ratequant.h) and eviction (retained
// attention mass, policies/eviction.h), in one model, so it can trade bits against tokens.
//
// The model is ours (docs/joint_planner.md; no paper has it). Per head h with T tokens seen, F of
// them fixed fp16 (sinks + window, never evicted), k kept (F <= k <= T), widths p = (b_k, b_v):
//   R(k)  retained attention mass when the k best tokens are kept (R(T) = 1, protected first);
//   q(p)  = w_k alpha_k beta_k^-b_k + w_v alpha_v beta_v^-b_v   (fitted, per element, weighted);
//   q0    = rho * (w_k alpha_k + w_v alpha_v)                   (a dropped token = 0 bits, x rho);
//   D(k, p)     = T * [ (R(k) - R(F)) * q(p) + (1 - R(k)) * q0 ]
//   bytes(k, p) = F * 4 * head_dim + (k - F) * bytes_per_token(p)
//                 + E * (4 * head_dim - bytes_per_token(narrowest allowed widths))
// E (`tail_tokens`): fp16 tail rows the store can hold beyond the F fixed ones (a streaming head
// keeps up to flush_tokens - 1 unflushed rows), so bytes(k, p) bounds the head's payload at every
// moment, not only right after a flush.
// Each unit of attention mass is served by a quantized token (q), an fp16 token (0) or nothing
// (q0). With nothing evicted, D = T (1 - R(F)) q(p): RateQuant's objective times the tokens.
// bytes_per_token comes from the registry: BitsPerElement(spec at p, kv_heads) * 2 * head_dim / 8,
// so metadata, padding and OScaR's side record are counted.
//
// The algorithm: per head, the lower convex hull of (bytes, D) over the option grid (widths on
// the head's own quantization hull x kept counts on a grid of at most kept_levels points), then
// the greedy over every head's hull segments by distortion saved per byte (the Lagrangian
// solution), then a fill pass of single token-quantum or width steps (over the head's
// non-dominated widths) while they fit. The joint
// result is compared with the quant-only and evict-only plans at the same budget and the best is
// returned (`source` says which). Optimal up to the last segment; `lower_bound` is the hull
// relaxation's value (a true bound over the option grid).
//
// Thread safety: pure functions over their arguments, safe to call from several threads.
// PlanJoint keeps its large scratch arrays per thread between calls (a few MB for 80 x 8 heads).
//
//   KVCTL_ASSIGN_OR_RETURN(CalibProfile p, ReadCalibProfile("smollm2-kivi.toml"));
//   KVCTL_ASSIGN_OR_RETURN(JointPlanInput in, MakeJointInput(p, {.tokens = 4096, .window = 64,
//                                                                .budget_fraction = 0.2}));
//   KVCTL_ASSIGN_OR_RETURN(JointPlan plan, PlanJoint(in, JointMode::kJoint));
#ifndef KVCTL_POLICIES_JOINT_PLANNER_H_
#define KVCTL_POLICIES_JOINT_PLANNER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/quant_types.h"
#include "policies/calib_profile.h"
#include "policies/eviction.h"

namespace kvctl {

enum class JointMode : uint8_t {
  kQuantOnly = 0,  // Keep every token; choose widths.
  kEvictOnly = 1,  // Fixed widths (evict_k_bits, evict_v_bits); choose tokens kept.
  kJoint = 2,      // Choose both.
};
std::string_view JointModeName(JointMode mode);  // "quant-only", "evict-only", "joint".
// INVALID_ARGUMENT "mode: got 'x', expected joint, quant-only or evict-only".
StatusOr<JointMode> ParseJointMode(std::string_view name);

// Retained attention mass of one head as a function of the tokens kept.
struct EvictionCurve {
  // Tabulated, when not empty: ComputeRetainedMassCurve over the head's `tokens` resident tokens
  // (retained.size() == tokens - min_budget + 1, nondecreasing, in [0, 1]).
  RetainedMassCurve table;
  // Parametric fallback [ours]: the sorted attention decays exponentially with a scale s such that
  // the top `coverage_tokens` tokens hold `tau` of the mass: R(k) = (1 - e^(-k/s)) / (1 -
  // e^(-T/s)), s = coverage / ln(1 / (1 - tau)). From the profile's layer demand. 0: uniform
  // attention, R(k) = k / T (no concentration: the most expensive eviction).
  double coverage_tokens = 0;
  double tau = 0.9;
};

struct JointHeadInput {
  int layer = 0;
  int head = 0;
  double alpha_k = 0;  // Fitted D(b) = alpha * beta^-b per element (>= 0).
  double alpha_v = 0;
  double importance_k = 1;  // Weights (>= 0), as RateQuant's w_i.
  double importance_v = 1;
  int64_t tokens = 0;        // T: tokens seen (resident before eviction), >= 1.
  int64_t fixed_tokens = 0;  // F: fp16 sinks + window, never evicted, 0..T.
  // E: worst-case fp16 rows beyond F (the streaming tail), 0..T - F. Bytes only: distortion
  // treats them as the quantized tokens they become at the next flush.
  int64_t tail_tokens = 0;
  EvictionCurve eviction;
};

struct JointPlanInput {
  QuantSpec spec;  // Method, head_dim, block and group sizes; k_bits / v_bits are ignored.
  int layers = 0;
  int kv_heads = 0;   // Per layer: OScaR's side record is shared by a layer's heads.
  double beta_k = 0;  // Slopes (> 1) of the fitted curves.
  double beta_v = 0;
  std::vector<int> bits;  // Allowed widths, ascending, each allowed by the method.
  int min_bits = 0;       // Restrict `bits` to [min_bits, max_bits]; 0 = no bound.
  int max_bits = 0;
  int evict_k_bits = 0;  // Widths of evict-only (and its comparison); 0 = widest allowed.
  int evict_v_bits = 0;
  int64_t budget_bytes = 0;           // For all heads together.
  int64_t token_quantum = 0;          // Kept counts move in steps of this; 0 = spec.block_tokens.
  int64_t min_tokens = 0;             // Starvation floor: every head keeps >= min(T, max(F, this)).
  double eviction_scale = 1;          // rho, > 0: distortion of a dropped token relative to 0 bits.
  int kept_levels = 16;               // Kept counts per head in the hull grid, 2..4096.
  std::vector<JointHeadInput> heads;  // layers * kv_heads, (layer, head) order.
};

// Checks everything PlanJoint relies on; the error names the field ("heads[3].fixed_tokens: got
// 9, expected 0..8 (tokens)").
Status ValidateJointInput(const JointPlanInput& input);

struct JointHeadPlan {
  int layer = 0;
  int head = 0;
  int64_t tokens = 0;  // Seen.
  int64_t kept = 0;    // Kept (fixed included).
  int k_bits = 0;
  int v_bits = 0;
  double bytes = 0;
  double retained_mass = 0;        // R(kept).
  double quant_distortion = 0;     // T (R(kept) - R(F)) q(p).
  double eviction_distortion = 0;  // T (1 - R(kept)) q0.
  double distortion = 0;           // Sum of the two.
};

struct JointPlan {
  JointMode mode = JointMode::kJoint;
  std::string source;  // What won: "joint", "quant-only" or "evict-only" (joint mode compares).
  int64_t budget_bytes = 0;
  double bytes = 0;        // Sum over heads, <= budget_bytes.
  double min_bytes = 0;    // The cheapest plan of this mode (every head at its floor / min widths).
  double max_bytes = 0;    // The most this mode can spend usefully.
  double unit_bytes = 0;   // One allocation unit: the largest single step a head can take.
  bool saturated = false;  // Every head at its best option: more budget cannot help.
  double distortion = 0;   // Predicted, sum over heads.
  double quant_distortion = 0;
  double eviction_distortion = 0;
  double lower_bound = 0;  // Hull relaxation of this mode: no grid plan within budget is lower.
  int64_t tokens = 0;      // Seen, summed.
  int64_t kept = 0;        // Kept, summed.
  std::vector<JointHeadPlan> heads;  // Input order.
};

// Plans `mode` for input.budget_bytes. INVALID_ARGUMENT naming the field for bad input;
// RESOURCE_EXHAUSTED "budget_bytes: got N, expected >= M (...)" when the mode's cheapest plan does
// not fit. Postconditions: bytes <= budget_bytes, and budget_bytes - bytes <= unit_bytes unless
// saturated.
StatusOr<JointPlan> PlanJoint(const JointPlanInput& input, JointMode mode);

// Predicted distortion and bytes of one head at (kept, k_bits, v_bits) under the model above
// (what PlanJoint sums). INVALID_ARGUMENT for a head index, count or width outside the input.
StatusOr<JointHeadPlan> EvaluateJointHead(const JointPlanInput& input, size_t head, int64_t kept,
                                          int k_bits, int v_bits);

// Under memory pressure: free at least `shortfall_bytes` from `current` either by lowering the
// widths of already-quantized tokens (requantize, e.g. 4 -> 2 bits, in token quanta, oldest
// records first) or by evicting token quanta, whichever adds less predicted distortion. Both are
// planned greedily by distortion added per byte freed, each head walking down its own hull.
struct ShortfallStep {
  int layer = 0;
  int head = 0;
  bool evict = false;  // true: evict `tokens`; false: requantize `tokens` to (to_k, to_v) bits.
  int64_t tokens = 0;
  int from_k_bits = 0, from_v_bits = 0;
  int to_k_bits = 0, to_v_bits = 0;
  double bytes_freed = 0;
  double distortion_added = 0;
};
struct ShortfallOption {
  bool feasible = false;  // Frees >= the shortfall.
  double bytes_freed = 0;
  double distortion_added = 0;
  std::vector<ShortfallStep> steps;
};
struct ShortfallAdvice {
  bool requantize = false;  // The recommendation: requantize first (true) or evict.
  ShortfallOption by_requantize;
  ShortfallOption by_eviction;
};
// INVALID_ARGUMENT when `current` does not match `input` (head count, kept outside [floor, T],
// widths not allowed) or shortfall_bytes < 1; RESOURCE_EXHAUSTED when neither lever frees enough.
// Ties go to requantization.
StatusOr<ShortfallAdvice> AdviseShortfall(const JointPlanInput& input, const JointPlan& current,
                                          int64_t shortfall_bytes);

// From a calibration profile (policies/calib_profile.h): per-head alphas and importances of the
// RateQuant fit, the parametric eviction curve from the layer demand, and the byte budget.
struct JointProfileOptions {
  int64_t tokens = 0;          // Tokens seen per head, >= 1.
  int64_t sinks = -1;          // fp16 sinks per head; -1 = the method's StreamingRules sinks.
  int64_t window = 0;          // fp16 recent window per head.
  int64_t flush_tokens = 0;    // StreamingRules::flush_tokens; 0 = the method's. See below.
  int64_t budget_bytes = 0;    // > 0: the budget; else:
  double budget_fraction = 0;  // of the fp16 bytes of every token seen, in (0, 1].
  int min_bits = 0, max_bits = 0;
  int evict_k_bits = 0, evict_v_bits = 0;
  int64_t min_tokens = 0;
  int64_t token_quantum = 0;
  double eviction_scale = 1;
  int kept_levels = 16;
  bool uniform_importance = false;
  double beta_override = 0;  // > 1: plan with this slope for K and V (mismatch experiments).
  // Layer demand (coverage at tau, tokens of a calibration sequence of length Tc) scales to T
  // tokens as demand * (T / Tc)^exponent: 1 = the same fraction of the sequence, 0 = fixed.
  double coverage_exponent = 1;
};
// Each head gets fixed_tokens = min(tokens, sinks + window) and the worst-case fp16 tail
// tail_tokens = max(0, min(tokens, sinks + flush_tokens - 1) - fixed_tokens).
// INVALID_ARGUMENT naming the option. A profile without [reasonalloc] gets uniform-attention
// curves (coverage_tokens = 0); an entropy-size demand n is read as the exponential whose
// exp(entropy) is n (s = n / e).
StatusOr<JointPlanInput> MakeJointInput(const CalibProfile& profile,
                                        const JointProfileOptions& options);

// fp16 bytes of every token seen, summed over heads (the budget_fraction denominator).
double Fp16Bytes(const JointPlanInput& input);

}  // namespace kvctl

#endif  // KVCTL_POLICIES_JOINT_PLANNER_H_
