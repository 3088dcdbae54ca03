// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// The joint planner's input from a calibration profile (docs/joint_planner.md).
#include <algorithm>
#include <cmath>

#include "policies/joint_planner.h"

namespace kvctl {

double Fp16Bytes(const JointPlanInput& input) {
  double total = 0;
  for (const JointHeadInput& h : input.heads) {
    total += static_cast<double>(h.tokens) * 4.0 * input.spec.head_dim;
  }
  return total;
}

StatusOr<JointPlanInput> MakeJointInput(const CalibProfile& profile, const JointProfileOptions& o) {
  const RateQuantFit& fit = profile.fit;
  KVCTL_RETURN_IF_ERROR(ValidateRateQuantFit(fit));
  if (o.tokens < 1 || o.tokens > (int64_t{1} << 40)) {
    return InvalidArgument("tokens: got ", o.tokens, ", expected 1..2^40");
  }
  if (o.sinks < -1) return InvalidArgument("sinks: got ", o.sinks, ", expected -1 or >= 0");
  if (o.window < 0) return InvalidArgument("window: got ", o.window, ", expected >= 0");
  if (o.flush_tokens < 0) {
    return InvalidArgument("flush_tokens: got ", o.flush_tokens, ", expected >= 0");
  }
  if (o.budget_bytes < 0) {
    return InvalidArgument("budget_bytes: got ", o.budget_bytes, ", expected >= 0");
  }
  if (o.budget_bytes == 0 && !(o.budget_fraction > 0 && o.budget_fraction <= 1)) {
    return InvalidArgument("budget_fraction: got ", o.budget_fraction,
                           ", expected (0, 1] when budget_bytes is 0");
  }
  if (!(std::isfinite(o.coverage_exponent) && o.coverage_exponent >= 0 &&
        o.coverage_exponent <= 1)) {
    return InvalidArgument("coverage_exponent: got ", o.coverage_exponent, ", expected 0..1");
  }
  if (o.beta_override != 0 && !(std::isfinite(o.beta_override) && o.beta_override > 1)) {
    return InvalidArgument("beta_override: got ", o.beta_override, ", expected 0 or > 1");
  }
  JointPlanInput in;
  in.spec = fit.spec;
  in.layers = fit.layers;
  in.kv_heads = fit.kv_heads;
  in.beta_k = o.beta_override > 1 ? o.beta_override : fit.beta_k;
  in.beta_v = o.beta_override > 1 ? o.beta_override : fit.beta_v;
  in.bits = fit.bits;
  in.min_bits = o.min_bits;
  in.max_bits = o.max_bits;
  in.evict_k_bits = o.evict_k_bits;
  in.evict_v_bits = o.evict_v_bits;
  in.token_quantum = o.token_quantum;
  in.min_tokens = o.min_tokens;
  in.eviction_scale = o.eviction_scale;
  in.kept_levels = o.kept_levels;
  const int64_t sinks = o.sinks >= 0 ? o.sinks : TraitsOf(fit.spec.method).streaming.sink_tokens;
  const int64_t fixed = std::min(o.tokens, sinks + o.window);
  // The fp16 rows a head can hold at once: its sinks and an unflushed tail of up to flush - 1.
  const int64_t flush =
      o.flush_tokens > 0 ? o.flush_tokens : TraitsOf(fit.spec.method).streaming.flush_tokens;
  const int64_t tail = std::max<int64_t>(0, std::min(o.tokens, sinks + flush - 1) - fixed);
  const double calib_len = fit.sequences > 0 && fit.tokens > 0
                               ? static_cast<double>(fit.tokens) / fit.sequences
                               : static_cast<double>(o.tokens);
  const double scale = std::pow(static_cast<double>(o.tokens) / calib_len, o.coverage_exponent);
  for (int l = 0; l < fit.layers; ++l) {
    for (int h = 0; h < fit.kv_heads; ++h) {
      JointHeadInput hi;
      hi.layer = l;
      hi.head = h;
      const RateQuantUnit& k = fit.Unit(l, h, UnitKind::kKey);
      const RateQuantUnit& v = fit.Unit(l, h, UnitKind::kValue);
      hi.alpha_k = k.alpha;
      hi.alpha_v = v.alpha;
      hi.importance_k = o.uniform_importance ? 1.0 : k.importance;
      hi.importance_v = o.uniform_importance ? 1.0 : v.importance;
      hi.tokens = o.tokens;
      hi.fixed_tokens = fixed;
      hi.tail_tokens = tail;
      if (profile.demand) {
        const LayerDemandProfile& d = *profile.demand;
        double size = std::max(1.0, d.demand[static_cast<size_t>(l)] * scale);
        hi.eviction.tau = std::min(d.tau, 0.999999);  // tau = 1: "all of the mass".

        // exp(entropy) of an exponential profile with scale s is about e * s.
        if (d.measure == DemandMeasure::kEntropy) {
          size = size / std::exp(1.0) * std::log(1.0 / (1.0 - d.tau));
        }
        hi.eviction.coverage_tokens = size;
      }
      in.heads.push_back(hi);
    }
  }
  in.budget_bytes = o.budget_bytes > 0
                        ? o.budget_bytes
                        : static_cast<int64_t>(std::floor(o.budget_fraction * Fp16Bytes(in)));
  if (in.budget_bytes < 1) in.budget_bytes = 1;
  return in;
}

}  // namespace kvctl
