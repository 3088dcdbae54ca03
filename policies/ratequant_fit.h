// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/ratequant_fit.h
// RateQuant calibration: fit the distortion model D_i(b) = alpha_i * beta^-b of one quantizer
// for every unit i = (layer, KV head, K or V) from calibration K/V (and optionally Q), and keep
// the fit as a small TOML profile that kvcalib writes and the planner reads back.
//
// The algorithm, and what is whose:
//  * [paper, abstract] Run the actual quantizer on a small calibration set at each allowed width
//    and fit an exponential in b; beta belongs to the quantizer. We run QuantizeBlock and
//    DequantizeBlock (kernels/quantize.h) with MakeQuantSpec(method, head_dim, b, b) on every full
//    block of every head, after the method's permanent sink tokens (they stay fp16 in the daemon,
//    so quantizing them would fit errors the daemon never makes) [ours].
//  * Distortion measured two ways: per-element MSE of the unit's K or V; and, with queries, the
//    squared attention-output error ||o - o^||^2 of the unit's query heads (GQA: the KV head's
//    group), with only that unit quantized, averaged over probe positions. Probes are
//    `probe_queries` positions evenly spaced over the second half of each sequence, causal
//    softmax(q k^T / sqrt(D)) [ours; the paper's exact metric was not retrieved].
//  * [ours, docs/algorithms.md §11.5] One pooled slope per quantizer: least squares on
//    ln D_ij = ln alpha_i - b_j ln beta with a free intercept per unit, which has the closed form
//    ln beta = -sum (b - mean_i b)(ln D - mean_i ln D) / sum (b - mean_i b)^2. Zero measurements
//    (an exactly representable head) are left out of the regression; a unit with none left gets
//    alpha = 0. Slopes pooled over K units only and V units only are reported as diagnostics, and
//    `per_kind_beta` makes the model use them.
//  * Importance [ours, docs/algorithms.md §11.6]. An attention-weighted proxy for K,
//    E_t[sum_j a_tj ||q_t||^2], collapses to E||q||^2 because attention weights sum to one, so
//    we use the first-order attention-output error instead. For iid noise of variance s^2 per
//    element on the quantized tokens Q of a unit:
//      V:  E||do_t||^2 = s^2 * D * sum_{j in Q} a_tj^2                      -> w_V = E[D sum a^2]
//      K:  do_t = sum_j a_tj ds_tj (v_j - o_t), Var ds_tj = ||q_t||^2 s^2 / D
//          E||do_t||^2 = s^2 * (||q_t||^2 / D) sum_{j in Q} a_tj^2 ||v_j - o_t||^2  -> w_K
//    summed over the group's query heads and averaged over probes. Q is what a decoding query
//    at the probe reads quantized (`decode_flush_tokens`): the flushed keys, not its fp16 tail.
//    Then w_i * MSE_i estimates the attention-output error the unit causes, so K and V units share
//    one scale. With the attention target the measured error already carries that weight, so
//    importance must be uniform there. Both are divided by the layer's mean ||o||^2 at the probes
//    (`relative_to_output`), so units of layers whose activations differ in scale by orders of
//    magnitude compare by relative error.
//
// Thread safety: pure functions over their arguments; FitRateQuant uses one thread.
//
//   CalibrationSet data = ...;  // data[s][l] = {k, v, q} views of sequence s at layer l
//   KVCTL_ASSIGN_OR_RETURN(RateQuantFit fit, FitRateQuant(data, {.method = QuantMethod::kKivi}));
//   std::string profile = FormatRateQuantProfile(fit);  // ParseRateQuantProfile reads it back
#ifndef KVCTL_POLICIES_RATEQUANT_FIT_H_
#define KVCTL_POLICIES_RATEQUANT_FIT_H_

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "policies/ratequant.h"

namespace kvctl {

// One calibration sequence at one layer.
struct CalibrationLayer {
  KvTensorView k;  // [T, H, D]
  KvTensorView v;  // [T, H, D]
  KvTensorView q;  // [T, Hq, D], Hq a multiple of H; q.data == nullptr: no queries.
};
// data[s][l]: sequence s at layer l. Every sequence has the same layers, H and D; lengths may
// differ. Queries are given for every (s, l) or for none.
using CalibrationSet = std::vector<std::vector<CalibrationLayer>>;

// What one FitRateQuant did, counted as it runs: the fit's cost is linear in these, and a test
// bounds them exactly (one quantize + dequantize per (sequence, layer, head, width, full block
// after the sinks), one attention-error softmax per (sequence, layer, width, probe, query head)),
// so a fit that repeats work, or a planner loop inside it, fails a test instead of a stopwatch.
struct RateQuantFitWork {
  int64_t blocks_quantized = 0;     // QuantizeBlock + DequantizeBlock pairs (K and V of one block).
  int64_t attention_softmaxes = 0;  // Softmaxes of the K-quantized attention error.
};

struct RateQuantFitOptions {
  QuantMethod method = QuantMethod::kKivi;
  std::vector<int> bits = {2, 3, 4, 8};  // Ascending, each allowed by the method.
  // Spec fields on top of the registry defaults; 0 keeps the default.
  int block_tokens = 0;
  int k_group_tokens = 0;
  int v_group_channels = 0;
  int sinkhorn_iters = 0;
  DistortionTarget target = DistortionTarget::kMse;      // kAttention needs queries.
  ImportanceMode importance = ImportanceMode::kUniform;  // kAttention needs queries.
  bool per_kind_beta = false;
  bool measure_attention = true;  // With queries, also record attention errors (for scoring).
  int probe_queries = 8;          // Probe positions per sequence for attention and importance.
  // Which keys a probe at position t sees quantized. Decode-time (> 0): only those a streaming
  // head has flushed by then, sinks + whole multiples of this many tokens after them; the newer
  // ones are still fp16 tail rows when a decoding query reads the cache, and they carry most of a
  // local head's attention, so counting them overweights local heads. -1: the method's registry
  // flush (StreamingRules). 0: every key before the probe (prefill-time, the weights before
  // issue #18).
  int decode_flush_tokens = -1;
  // Importance and attention errors divided by their layer's mean exact attention-output energy
  // (||o||^2 of one GQA group at one probe): relative errors. SmolLM2's V norms grow ~1000x from
  // layer 0 to 29, so absolute errors rank every early layer as negligible, and a plan starves
  // it (the joint planner kept 16 of 1024 tokens in layer 0). false: absolute errors.
  bool relative_to_output = true;
  RateQuantFitWork* work = nullptr;  // When set, receives the work counts (added to it).
};

// Runs the quantizer at every width on every unit and fits the model. INVALID_ARGUMENT naming
// the field ("data[2][5].q: head_dim: got 32, expected 64 as k") for inconsistent or non-finite
// input, sequences shorter than the sinks plus one block, options the method rejects, or
// queries missing for the target or importance asked; FAILED_PRECONDITION when the data give no
// slope > 1 (distortion does not fall with bits).
StatusOr<RateQuantFit> FitRateQuant(const CalibrationSet& data, const RateQuantFitOptions& options);

// The pooled regression alone. measured[i * bits.size() + j] = D of unit i at bits[j]; values
// <= 0 are left out. FAILED_PRECONDITION when no unit has two positive points or the slope is not
// > 1; INVALID_ARGUMENT for malformed input.
struct CurveFit {
  double beta = 0;
  std::vector<double> alpha;  // Per unit; 0 for a unit without a positive point.
  double rms_log_residual = 0;
  int64_t points = 0;  // Points used.
};
StatusOr<CurveFit> FitDistortionCurves(const std::vector<int>& bits,
                                       const std::vector<double>& measured, size_t units);

// The fit as TOML: a [ratequant] table (version 1, method and spec, geometry, widths, target,
// importance mode, slopes, calibration size) and one [[ratequant.units]] per unit with layer, head,
// kind, alpha, importance and the measured mse / attention arrays. Doubles are written with 17
// significant digits, so ParseRateQuantProfile gives back an equal RateQuantFit.
std::string FormatRateQuantProfile(const RateQuantFit& fit);

// Parses a profile; `name` (usually the path) prefixes errors, which name the key:
// "p.toml: ratequant.units[3].alpha: got -1, expected finite >= 0". Unknown keys are errors. The
// result passes ValidateRateQuantFit.
StatusOr<RateQuantFit> ParseRateQuantProfile(std::string_view text, std::string_view name);

// Reads and parses `path`; NOT_FOUND when it cannot be opened.
StatusOr<RateQuantFit> ReadRateQuantProfile(const std::string& path);

}  // namespace kvctl

#endif  // KVCTL_POLICIES_RATEQUANT_FIT_H_
