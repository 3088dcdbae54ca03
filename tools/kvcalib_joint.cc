// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvcalib plan --mode: the joint planner from a profile, checked totals, reports.
#include "tools/kvcalib_joint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "common/json_text.h"

namespace kvctl {
namespace {

using internal::StrCat;

// MakeJointInput names its option fields; kvcalib users know the flags.
Status ToFlag(const Status& s) {
  static constexpr std::pair<const char*, const char*> kFlags[] = {
      {"tokens:", "--tokens:"},
      {"sinks:", "--sinks:"},
      {"window:", "--window:"},
      {"budget_bytes:", "--budget-bytes:"},
      {"budget_fraction:", "--budget-fraction:"},
      {"coverage_exponent:", "--coverage-exponent:"},
      {"beta_override:", "--beta-override:"},
      {"min_bits/max_bits:", "--min-bits/--max-bits:"},
      {"evict_k_bits:", "--evict-k-bits:"},
      {"evict_v_bits:", "--evict-v-bits:"},
      {"token_quantum:", "--token-quantum:"},
      {"min_tokens:", "--min-tokens:"},
      {"eviction_scale:", "--eviction-scale:"},
      {"kept_levels:", "--kept-levels:"},
  };
  const std::string& m = s.message();
  for (const auto& [field, flag] : kFlags) {
    if (m.rfind(field, 0) == 0) return Status(s.code(), flag + m.substr(std::string(field).size()));
  }
  return s;
}

double BytesPerToken(const JointPlanInput& in, int k_bits, int v_bits) {
  QuantSpec s = in.spec;
  s.k_bits = k_bits;
  s.v_bits = v_bits;
  return BitsPerElement(s, in.kv_heads).average * 2.0 * in.spec.head_dim / 8.0;
}

// The cheapest allowed (K, V) widths' bytes per token: the worst-case fp16 tail rows are charged
// fp16 minus this (docs/joint_planner.md, "The fp16 tail").
double NarrowestBytesPerToken(const JointPlanInput& in) {
  double out = std::numeric_limits<double>::infinity();
  auto allowed = [&](int b) {
    return (in.min_bits == 0 || b >= in.min_bits) && (in.max_bits == 0 || b <= in.max_bits);
  };
  for (int kb : in.bits) {
    for (int vb : in.bits) {
      if (allowed(kb) && allowed(vb)) out = std::min(out, BytesPerToken(in, kb, vb));
    }
  }
  return out;
}

double HeadBytes(const JointPlanInput& in, const JointHeadPlan& h, const JointHeadInput& hi,
                 double narrowest_bpt) {
  const double fp16_bpt = 4.0 * in.spec.head_dim;
  return static_cast<double>(hi.fixed_tokens) * fp16_bpt +
         static_cast<double>(h.kept - hi.fixed_tokens) * BytesPerToken(in, h.k_bits, h.v_bits) +
         static_cast<double>(hi.tail_tokens) * (fp16_bpt - narrowest_bpt);
}

}  // namespace

StatusOr<JointBudgetCheck> CheckJointBudget(const JointPlanInput& in, const JointPlan& plan) {
  if (plan.heads.size() != in.heads.size()) {
    return InvalidArgument("plan.heads: got ", plan.heads.size(), " entries, expected ",
                           in.heads.size());
  }
  JointBudgetCheck c;
  const double narrowest_bpt = NarrowestBytesPerToken(in);
  for (size_t i = 0; i < in.heads.size(); ++i) {
    const JointHeadPlan& h = plan.heads[i];
    const JointHeadInput& hi = in.heads[i];
    if (h.kept < hi.fixed_tokens || h.kept > hi.tokens) {
      return InvalidArgument("plan.heads[", i, "].kept: got ", h.kept, ", expected ",
                             hi.fixed_tokens, "..", hi.tokens, " (fixed..seen)");
    }
    c.achieved_bytes += HeadBytes(in, h, hi, narrowest_bpt);
  }
  c.requested_bytes = static_cast<double>(in.budget_bytes);
  c.slack_bytes = c.requested_bytes - c.achieved_bytes;
  c.unit_bytes = plan.unit_bytes;
  c.fp16_bytes = Fp16Bytes(in);
  c.saturated = plan.saturated;
  const double tol = 1e-9 * std::max(1.0, c.requested_bytes);
  c.ok = c.slack_bytes >= -tol && (c.saturated || c.slack_bytes <= c.unit_bytes + tol);
  return c;
}

StatusOr<KvcalibJointPlan> BuildKvcalibJointPlan(const CalibProfile& profile, JointMode mode,
                                                 const JointProfileOptions& options) {
  KvcalibJointPlan out;
  StatusOr<JointPlanInput> in = MakeJointInput(profile, options);
  if (!in.ok()) return ToFlag(in.status());
  out.input = std::move(*in);
  out.uniform_curves = !profile.demand.has_value();
  out.fixed_tokens = static_cast<double>(out.input.heads.front().fixed_tokens);
  StatusOr<JointPlan> plan = PlanJoint(out.input, mode);
  if (!plan.ok()) return ToFlag(plan.status());
  out.plan = std::move(*plan);
  KVCTL_ASSIGN_OR_RETURN(out.check, CheckJointBudget(out.input, out.plan));
  return out;
}

std::string FormatJointPlanJson(const KvcalibJointPlan& jp, const PlanReportInfo& info) {
  const JointPlanInput& in = jp.input;
  const JointPlan& p = jp.plan;
  const JointBudgetCheck& c = jp.check;
  std::ostringstream o;
  o << "{\n  \"command\": \"plan\",\n  \"mode\": " << JsonQuoted(JointModeName(p.mode))
    << ",\n  \"source\": " << JsonQuoted(p.source)
    << ",\n  \"profile\": " << JsonQuoted(info.profile)
    << ",\n  \"method\": " << JsonQuoted(QuantMethodName(in.spec.method))
    << ",\n  \"head_dim\": " << in.spec.head_dim << ",\n  \"layers\": " << in.layers
    << ",\n  \"kv_heads\": " << in.kv_heads << ",\n  \"bits\": [";
  for (size_t i = 0; i < in.bits.size(); ++i) o << (i ? ", " : "") << in.bits[i];
  o << "],\n  \"beta_k\": " << JsonNumber(in.beta_k) << ",\n  \"beta_v\": " << JsonNumber(in.beta_v)
    << ",\n  \"tokens_per_head\": " << in.heads.front().tokens
    << ",\n  \"fixed_tokens_per_head\": " << JsonNumber(jp.fixed_tokens)
    << ",\n  \"fp16_tail_tokens_per_head\": " << in.heads.front().tail_tokens
    << ",\n  \"eviction_curve\": "
    << JsonQuoted(jp.uniform_curves ? "uniform (no [reasonalloc] in the profile)"
                                    : "exponential from the layer demand")
    << ",\n  \"budget\": {\"requested_bytes\": " << JsonNumber(c.requested_bytes)
    << ", \"achieved_bytes\": " << JsonNumber(c.achieved_bytes)
    << ", \"slack_bytes\": " << JsonNumber(c.slack_bytes)
    << ", \"unit_bytes\": " << JsonNumber(c.unit_bytes)
    << ", \"min_bytes\": " << JsonNumber(p.min_bytes)
    << ", \"max_bytes\": " << JsonNumber(p.max_bytes)
    << ", \"fp16_bytes\": " << JsonNumber(c.fp16_bytes)
    << ", \"fraction_of_fp16\": " << JsonNumber(c.achieved_bytes / c.fp16_bytes)
    << ", \"saturated\": " << (c.saturated ? "true" : "false")
    << ", \"ok\": " << (c.ok ? "true" : "false") << "},\n"
    << "  \"predicted_distortion\": " << JsonNumber(p.distortion)
    << ",\n  \"quant_distortion\": " << JsonNumber(p.quant_distortion)
    << ",\n  \"eviction_distortion\": " << JsonNumber(p.eviction_distortion)
    << ",\n  \"lower_bound\": " << JsonNumber(p.lower_bound) << ",\n  \"tokens_seen\": " << p.tokens
    << ",\n  \"tokens_kept\": " << p.kept << ",\n  \"heads\": [";
  for (size_t i = 0; i < p.heads.size(); ++i) {
    const JointHeadPlan& h = p.heads[i];
    o << (i ? ",\n" : "\n") << "    {\"layer\": " << h.layer << ", \"head\": " << h.head
      << ", \"tokens\": " << h.tokens << ", \"kept\": " << h.kept << ", \"k_bits\": " << h.k_bits
      << ", \"v_bits\": " << h.v_bits << ", \"bytes\": " << JsonNumber(h.bytes)
      << ", \"retained_mass\": " << JsonNumber(h.retained_mass)
      << ", \"quant_distortion\": " << JsonNumber(h.quant_distortion)
      << ", \"eviction_distortion\": " << JsonNumber(h.eviction_distortion)
      << ", \"distortion\": " << JsonNumber(h.distortion) << "}";
  }
  o << "\n  ],\n  \"timing_ms\": {\"read_profile\": "
    << (info.read_ms < 0 ? "null" : JsonNumber(info.read_ms))
    << ", \"plan\": " << (info.plan_ms < 0 ? "null" : JsonNumber(info.plan_ms)) << "},\n"
    << "  \"ok\": " << (jp.ok() ? "true" : "false") << "\n}\n";
  return o.str();
}

std::string FormatJointPlanTable(const KvcalibJointPlan& jp, const PlanReportInfo& info) {
  const JointPlanInput& in = jp.input;
  const JointPlan& p = jp.plan;
  const JointBudgetCheck& c = jp.check;
  std::ostringstream o;
  char line[320];
  o << "kvcalib plan --mode " << JointModeName(p.mode) << " (" << p.source
    << " won): " << info.profile << ": " << QuantMethodName(in.spec.method) << ", head_dim "
    << in.spec.head_dim << ", " << in.layers << " layers x " << in.kv_heads << " KV heads, "
    << in.heads.front().tokens << " tokens per head (" << jp.fixed_tokens << " fixed fp16, "
    << in.heads.front().tail_tokens << " more as the worst-case fp16 tail)"
    << (jp.uniform_curves ? ", flat attention (no [reasonalloc])" : "") << "\n";
  std::snprintf(line, sizeof line,
                "budget: requested %.0f B (%.4g of fp16), achieved %.0f B, slack %.0f B "
                "(one unit %.0f B)%s: %s\n",
                c.requested_bytes, c.requested_bytes / c.fp16_bytes, c.achieved_bytes,
                c.slack_bytes, c.unit_bytes, c.saturated ? ", saturated" : "",
                c.ok ? "ok" : "VIOLATED");
  o << line;
  std::snprintf(line, sizeof line,
                "predicted distortion %.6g (quantization %.6g + eviction %.6g; hull bound %.6g), "
                "kept %lld of %lld tokens\n",
                p.distortion, p.quant_distortion, p.eviction_distortion, p.lower_bound,
                static_cast<long long>(p.kept), static_cast<long long>(p.tokens));
  o << line
    << "\nlayer  head    kept  k_bits  v_bits        bytes  retained   quant_dist   evict_dist\n";
  for (const JointHeadPlan& h : p.heads) {
    std::snprintf(line, sizeof line, "%5d  %4d  %6lld  %6d  %6d  %11.0f  %8.5f  %11.5g  %11.5g\n",
                  h.layer, h.head, static_cast<long long>(h.kept), h.k_bits, h.v_bits, h.bytes,
                  h.retained_mass, h.quant_distortion, h.eviction_distortion);
    o << line;
  }
  if (info.read_ms >= 0 && info.plan_ms >= 0) {
    std::snprintf(line, sizeof line, "time: read profile %.3f ms, plan %.3f ms\n", info.read_ms,
                  info.plan_ms);
    o << line;
  }
  return o.str();
}

}  // namespace kvctl
