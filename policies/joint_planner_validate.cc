// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// The joint planner's input checks and mode names (docs/joint_planner.md): every error names the
// field, the value and what was expected.
#include <algorithm>
#include <cmath>

#include "policies/joint_planner.h"
#include "policies/joint_planner_internal.h"

namespace kvctl {

namespace joint_internal {

std::vector<int> BoundedBits(const JointPlanInput& in) {
  std::vector<int> out;
  for (int b : in.bits) {
    if (b >= in.min_bits && (in.max_bits == 0 || b <= in.max_bits)) out.push_back(b);
  }
  return out;
}

}  // namespace joint_internal

namespace {

using internal::StrCat;
using joint_internal::BoundedBits;

bool AllowedWidth(QuantMethod method, int b) {
  return b >= 1 && b < 32 && (TraitsOf(method).allowed_bits & (1u << b));
}

Status ValidateHead(const JointPlanInput& in, size_t i) {
  const JointHeadInput& h = in.heads[i];
  // The prefix is built only on error: formatting it for every head costs more than planning.
  auto f = [i] { return StrCat("heads[", i, "]."); };
  const int want_layer = static_cast<int>(i / static_cast<size_t>(in.kv_heads));
  const int want_head = static_cast<int>(i % static_cast<size_t>(in.kv_heads));
  if (h.layer != want_layer) {
    return InvalidArgument(f(), "layer: got ", h.layer, ", expected ", want_layer,
                           " ((layer, head) order)");
  }
  if (h.head != want_head) {
    return InvalidArgument(f(), "head: got ", h.head, ", expected ", want_head,
                           " ((layer, head) order)");
  }
  const std::pair<const char*, double> nonneg[] = {{"alpha_k", h.alpha_k},
                                                   {"alpha_v", h.alpha_v},
                                                   {"importance_k", h.importance_k},
                                                   {"importance_v", h.importance_v}};
  for (const auto& [name, v] : nonneg) {
    if (!std::isfinite(v) || v < 0) {
      return InvalidArgument(f(), name, ": got ", v, ", expected a finite value >= 0");
    }
  }
  if (h.tokens < 1 || h.tokens > (int64_t{1} << 40)) {
    return InvalidArgument(f(), "tokens: got ", h.tokens, ", expected 1..2^40");
  }
  if (h.fixed_tokens < 0 || h.fixed_tokens > h.tokens) {
    return InvalidArgument(f(), "fixed_tokens: got ", h.fixed_tokens, ", expected 0..", h.tokens,
                           " (tokens)");
  }
  if (h.tail_tokens < 0 || h.tail_tokens > h.tokens - h.fixed_tokens) {
    return InvalidArgument(f(), "tail_tokens: got ", h.tail_tokens, ", expected 0..",
                           h.tokens - h.fixed_tokens, " (tokens - fixed_tokens)");
  }
  const EvictionCurve& c = h.eviction;
  if (!c.table.retained.empty()) {
    const int64_t n = static_cast<int64_t>(c.table.retained.size());
    if (c.table.min_budget < 0 || c.table.min_budget > h.fixed_tokens ||
        c.table.min_budget + n - 1 != h.tokens) {
      return InvalidArgument(f(), "eviction.table: covers ", c.table.min_budget, "..",
                             c.table.min_budget + n - 1, " tokens, expected min_budget 0..",
                             h.fixed_tokens, " (fixed_tokens) up to ", h.tokens, " (tokens)");
    }
    double prev = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double v = c.table.retained[static_cast<size_t>(j)];
      if (!std::isfinite(v) || v < prev - 1e-12 || v > 1 + 1e-9) {
        return InvalidArgument(f(), "eviction.table.retained[", j, "]: got ", v,
                               ", expected nondecreasing values in [0, 1]");
      }
      prev = v;
    }
  } else {
    if (!std::isfinite(c.coverage_tokens) || c.coverage_tokens < 0) {
      return InvalidArgument(f(), "eviction.coverage_tokens: got ", c.coverage_tokens,
                             ", expected a finite value >= 0");
    }
    if (!(c.tau > 0 && c.tau < 1)) {
      return InvalidArgument(f(), "eviction.tau: got ", c.tau, ", expected (0, 1)");
    }
  }
  return OkStatus();
}

}  // namespace

std::string_view JointModeName(JointMode mode) {
  switch (mode) {
    case JointMode::kQuantOnly:
      return "quant-only";
    case JointMode::kEvictOnly:
      return "evict-only";
    case JointMode::kJoint:
      return "joint";
  }
  return "?";
}

StatusOr<JointMode> ParseJointMode(std::string_view name) {
  for (JointMode m : {JointMode::kJoint, JointMode::kQuantOnly, JointMode::kEvictOnly}) {
    if (name == JointModeName(m)) return m;
  }
  return InvalidArgument("mode: got '", name, "', expected joint, quant-only or evict-only");
}

Status ValidateJointInput(const JointPlanInput& in) {
  {
    Status s = ValidateQuantSpec(in.spec);
    if (!s.ok()) return InvalidArgument("spec.", s.message());
  }
  if (in.layers < 1 || in.layers > 4096) {
    return InvalidArgument("layers: got ", in.layers, ", expected 1..4096");
  }
  if (in.kv_heads < 1 || in.kv_heads > 4096) {
    return InvalidArgument("kv_heads: got ", in.kv_heads, ", expected 1..4096");
  }
  if (!(std::isfinite(in.beta_k) && in.beta_k > 1)) {
    return InvalidArgument("beta_k: got ", in.beta_k, ", expected a finite value > 1");
  }
  if (!(std::isfinite(in.beta_v) && in.beta_v > 1)) {
    return InvalidArgument("beta_v: got ", in.beta_v, ", expected a finite value > 1");
  }
  if (in.bits.empty()) return InvalidArgument("bits: empty, expected at least one width");
  for (size_t j = 0; j < in.bits.size(); ++j) {
    const int b = in.bits[j];
    if (!AllowedWidth(in.spec.method, b) || (j > 0 && b <= in.bits[j - 1])) {
      return InvalidArgument("bits[", j, "]: got ", b, ", expected ascending widths allowed by ",
                             QuantMethodName(in.spec.method));
    }
  }
  if (in.min_bits < 0) return InvalidArgument("min_bits: got ", in.min_bits, ", expected >= 0");
  if (in.max_bits < 0) return InvalidArgument("max_bits: got ", in.max_bits, ", expected >= 0");
  const std::vector<int> bits = BoundedBits(in);
  if (bits.empty()) {
    return InvalidArgument("min_bits/max_bits: got ", in.min_bits, "/", in.max_bits,
                           ", expected a range holding one of bits");
  }
  const std::pair<const char*, int> evict[] = {{"evict_k_bits", in.evict_k_bits},
                                               {"evict_v_bits", in.evict_v_bits}};
  for (const auto& [name, b] : evict) {
    if (b != 0 && std::find(bits.begin(), bits.end(), b) == bits.end()) {
      return InvalidArgument(name, ": got ", b, ", expected 0 or one of the allowed widths ",
                             bits.front(), "..", bits.back());
    }
  }
  if (in.budget_bytes < 1) {
    return InvalidArgument("budget_bytes: got ", in.budget_bytes, ", expected >= 1");
  }
  if (in.token_quantum < 0 || in.token_quantum > (1 << 20)) {
    return InvalidArgument("token_quantum: got ", in.token_quantum, ", expected 0..2^20");
  }
  if (in.min_tokens < 0) {
    return InvalidArgument("min_tokens: got ", in.min_tokens, ", expected >= 0");
  }
  if (!(std::isfinite(in.eviction_scale) && in.eviction_scale > 0)) {
    return InvalidArgument("eviction_scale: got ", in.eviction_scale,
                           ", expected a finite value > 0");
  }
  if (in.kept_levels < 2 || in.kept_levels > 4096) {
    return InvalidArgument("kept_levels: got ", in.kept_levels, ", expected 2..4096");
  }
  const size_t want = static_cast<size_t>(in.layers) * static_cast<size_t>(in.kv_heads);
  if (in.heads.size() != want) {
    return InvalidArgument("heads: got ", in.heads.size(),
                           " entries, expected layers x kv_heads = ", want);
  }
  for (size_t i = 0; i < in.heads.size(); ++i) KVCTL_RETURN_IF_ERROR(ValidateHead(in, i));
  return OkStatus();
}

}  // namespace kvctl
