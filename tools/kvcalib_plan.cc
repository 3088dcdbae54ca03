// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvcalib plan: RateQuant widths and layer token budgets from a profile, checked totals, reports.
#include "tools/kvcalib_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "common/json_text.h"

namespace kvctl {
namespace {

using internal::StrCat;

// Relative tolerance of b/e comparisons: costs are sums of dyadic fractions.
constexpr double kTol = 1e-9;

template <typename T>
std::string JsonList(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    s += i ? ", " : "";
    if constexpr (std::is_floating_point_v<T>) {
      s += JsonNumber(v[i]);
    } else {
      s += std::to_string(v[i]);
    }
  }
  return s + "]";
}

double HeadBpe(const QuantSpec& spec, int kv_heads, int k_bits, int v_bits) {
  QuantSpec s = spec;
  s.k_bits = k_bits;
  s.v_bits = v_bits;
  return BitsPerElement(s, kv_heads).average;
}

StatusOr<LayerTokenPlan> PlanLayerTokens(const CalibProfile& profile, const KvcalibPlanOptions& o,
                                         const RateQuantPlan& quant) {
  const RateQuantFit& fit = profile.fit;
  const int64_t b = o.layer_budget_tokens;
  if (b < 1 || b > (int64_t{1} << 32)) {
    return InvalidArgument("--layer-budget-tokens: got ", b, ", expected 1..2^32 tokens per head");
  }
  if (o.window < 0 || o.window >= b) {
    return InvalidArgument("--window: got ", o.window, ", expected 0..", b - 1,
                           " (below --layer-budget-tokens)");
  }
  LayerTokenPlan t;
  t.schedule = o.schedule;
  t.avg_tokens_per_head = b;
  t.window = o.window;
  if (profile.demand) t.demand = profile.demand->demand;
  const int64_t layers = fit.layers, heads = fit.kv_heads;
  t.requested_tokens = layers * heads * b;
  switch (o.schedule) {
    case LayerSchedule::kDemand: {
      if (!profile.demand) {
        return InvalidArgument(
            "--schedule demand: the profile has no [reasonalloc] table (fit "
            "with queries, without --no-demand), expected one");
      }
      t.floor = o.floor >= 0 ? o.floor : StarvationFloor(o.window, b);
      if (t.floor > b) {
        return InvalidArgument(
            "--layer-budget-tokens: got ", b, ", expected >= the floor ", t.floor,
            o.floor >= 0 ? " (--floor)" : " (max(window + 8, B/4); set --floor)");
      }
      KVCTL_ASSIGN_OR_RETURN(t.tokens,
                             DemandLayerBudgets(profile.demand->demand, heads, b, t.floor));
      break;
    }
    case LayerSchedule::kUniform: {
      KVCTL_ASSIGN_OR_RETURN(t.tokens, UniformLayerBudgets(layers, heads, b));
      break;
    }
    case LayerSchedule::kPyramid: {
      if (o.seq_len < 0) return InvalidArgument("--seq-len: got ", o.seq_len, ", expected >= 0");
      // 0: so long that PyramidKV's clamp to T - w never applies.
      t.seq_len = o.seq_len > 0 ? o.seq_len : std::numeric_limits<int64_t>::max() / 4;
      KVCTL_ASSIGN_OR_RETURN(t.tokens, PyramidLayerBudgets({.layers = layers,
                                                            .heads = heads,
                                                            .capacity = b,
                                                            .window = o.window,
                                                            .seq_len = t.seq_len,
                                                            .beta = o.pyramid_beta}));
      if (layers >= 2) t.tolerance_tokens = heads * layers * (layers - 2) / 2;
      break;
    }
  }
  for (int64_t l = 0; l < layers; ++l) {
    double bpe = 0;
    for (int64_t h = 0; h < heads; ++h) {
      const HeadPlan& hp = quant.heads[static_cast<size_t>(l * heads + h)];
      bpe += HeadBpe(fit.spec, fit.kv_heads, hp.k_bits, hp.v_bits);
    }
    bpe /= static_cast<double>(heads);
    t.bpe.push_back(bpe);
    t.bytes.push_back(static_cast<double>(t.tokens[l]) * fit.spec.head_dim * 2 * bpe / 8);
    t.achieved_tokens += t.tokens[l];
  }
  if (o.schedule == LayerSchedule::kPyramid && t.seq_len <= b) {
    t.ok = t.achieved_tokens <= t.requested_tokens;  // Short sequence: nothing is evicted.
  } else {
    t.ok = t.achieved_tokens >= t.requested_tokens &&
           t.achieved_tokens <= t.requested_tokens + t.tolerance_tokens;
  }
  return t;
}

}  // namespace

std::string_view LayerScheduleName(LayerSchedule schedule) {
  switch (schedule) {
    case LayerSchedule::kDemand:
      return "demand";
    case LayerSchedule::kUniform:
      return "uniform";
    case LayerSchedule::kPyramid:
      return "pyramid";
  }
  return "?";
}

StatusOr<LayerSchedule> ParseLayerSchedule(std::string_view name) {
  for (LayerSchedule s :
       {LayerSchedule::kDemand, LayerSchedule::kUniform, LayerSchedule::kPyramid}) {
    if (name == LayerScheduleName(s)) return s;
  }
  return InvalidArgument("--schedule: got '", name, "', expected demand, uniform or pyramid");
}

StatusOr<BudgetRange> ComputeBudgetRange(const RateQuantFit& fit, int min_bits, int max_bits) {
  BudgetRange r;
  for (int b : fit.bits) {
    if (b >= min_bits && (max_bits == 0 || b <= max_bits)) r.bits.push_back(b);
  }
  if (r.bits.empty()) {
    return InvalidArgument("--min-bits/--max-bits: got ", min_bits, "/", max_bits,
                           ", expected a range holding one of the fitted widths ",
                           JsonList(fit.bits));
  }
  KVCTL_ASSIGN_OR_RETURN(UnitCosts c, UnitCostTable(fit.spec, fit.kv_heads, r.bits));
  r.min_bpe = (c.k.front() + c.v.front()) / 2;
  r.max_bpe = (c.k.back() + c.v.back()) / 2;
  double step = 0;
  for (size_t j = 1; j < r.bits.size(); ++j) {
    step = std::max({step, c.k[j] - c.k[j - 1], c.v[j] - c.v[j - 1]});
  }
  r.unit_step_bpe = step / (2.0 * fit.layers * fit.kv_heads);
  return r;
}

StatusOr<BitBudgetCheck> CheckBitBudget(const RateQuantFit& fit, const BudgetRange& range,
                                        const RateQuantPlan& plan, double requested_bpe) {
  const size_t heads = static_cast<size_t>(fit.layers) * fit.kv_heads;
  if (plan.layers != fit.layers || plan.kv_heads != fit.kv_heads || plan.heads.size() != heads) {
    return InvalidArgument("plan: ", plan.layers, " x ", plan.kv_heads, " heads (",
                           plan.heads.size(), " entries), expected ", fit.layers, " x ",
                           fit.kv_heads);
  }
  auto allowed = [&](int b) {
    return std::find(range.bits.begin(), range.bits.end(), b) != range.bits.end();
  };
  double sum = 0;
  for (size_t i = 0; i < heads; ++i) {
    const HeadPlan& h = plan.heads[i];
    if (!allowed(h.k_bits) || !allowed(h.v_bits)) {
      return InvalidArgument("plan.heads[", i, "]: k_bits ", h.k_bits, ", v_bits ", h.v_bits,
                             ", expected widths in ", JsonList(range.bits));
    }
    sum += HeadBpe(fit.spec, fit.kv_heads, h.k_bits, h.v_bits);
  }
  BitBudgetCheck c;
  c.requested_bpe = requested_bpe;
  c.achieved_bpe = sum / static_cast<double>(heads);
  c.slack_bpe = requested_bpe - c.achieved_bpe;
  c.unit_step_bpe = range.unit_step_bpe;
  c.units = 2 * static_cast<int64_t>(heads);
  const double tol = kTol * std::max(1.0, requested_bpe);
  c.ok = c.slack_bpe >= -tol && c.slack_bpe <= c.unit_step_bpe + tol;
  return c;
}

StatusOr<KvcalibPlan> BuildKvcalibPlan(const CalibProfile& profile, const KvcalibPlanOptions& o) {
  const RateQuantFit& fit = profile.fit;
  KvcalibPlan plan;
  KVCTL_ASSIGN_OR_RETURN(plan.range, ComputeBudgetRange(fit, o.quant.min_bits, o.quant.max_bits));
  const double b = o.quant.budget_bpe;
  const double tol = kTol * std::max(1.0, std::fabs(b));
  if (!std::isfinite(b) || b < plan.range.min_bpe - tol || b > plan.range.max_bpe + tol) {
    return InvalidArgument("--budget-bpe: got ", b, ", expected ", plan.range.min_bpe, "..",
                           plan.range.max_bpe, " for ", QuantMethodName(fit.spec.method),
                           " at widths ", plan.range.bits.front(), "..", plan.range.bits.back(),
                           ", head_dim ", fit.spec.head_dim, ", metadata included");
  }
  KVCTL_ASSIGN_OR_RETURN(plan.quant, PlanRateQuant(fit, o.quant));
  KVCTL_ASSIGN_OR_RETURN(plan.bits, CheckBitBudget(fit, plan.range, plan.quant, b));
  if (o.layer_budget_tokens != 0) {
    KVCTL_ASSIGN_OR_RETURN(plan.tokens, PlanLayerTokens(profile, o, plan.quant));
  }
  return plan;
}

std::string FormatPlanJson(const KvcalibPlan& plan, const PlanReportInfo& info) {
  const RateQuantPlan& q = plan.quant;
  const BitBudgetCheck& c = plan.bits;
  std::ostringstream o;
  o << "{\n  \"command\": \"plan\",\n  \"profile\": " << JsonQuoted(info.profile) << ",\n"
    << "  \"method\": " << JsonQuoted(QuantMethodName(q.spec.method)) << ",\n"
    << "  \"head_dim\": " << q.spec.head_dim << ",\n  \"block_tokens\": " << q.spec.block_tokens
    << ",\n  \"layers\": " << q.layers << ",\n  \"kv_heads\": " << q.kv_heads << ",\n"
    << "  \"bits\": " << JsonList(plan.range.bits) << ",\n"
    << "  \"budget\": {\"requested_bpe\": " << JsonNumber(c.requested_bpe)
    << ", \"achieved_bpe\": " << JsonNumber(c.achieved_bpe)
    << ", \"slack_bpe\": " << JsonNumber(c.slack_bpe)
    << ", \"unit_step_bpe\": " << JsonNumber(c.unit_step_bpe) << ", \"units\": " << c.units
    << ", \"min_bpe\": " << JsonNumber(plan.range.min_bpe)
    << ", \"max_bpe\": " << JsonNumber(plan.range.max_bpe)
    << ", \"ok\": " << (c.ok ? "true" : "false") << "},\n"
    << "  \"beta_k\": " << JsonNumber(q.beta_k) << ",\n  \"beta_v\": " << JsonNumber(q.beta_v)
    << ",\n"
    << "  \"predicted_distortion\": " << JsonNumber(q.predicted_distortion) << ",\n"
    << "  \"lower_bound\": " << JsonNumber(q.lower_bound) << ",\n"
    << "  \"exact\": " << (q.exact ? "true" : "false") << ",\n"
    << "  \"continuous\": {\"cost_bpe\": " << JsonNumber(q.continuous_cost_bpe)
    << ", \"distortion\": " << JsonNumber(q.continuous_distortion) << "},\n  \"heads\": [";
  for (size_t i = 0; i < q.heads.size(); ++i) {
    const HeadPlan& h = q.heads[i];
    o << (i ? ",\n" : "\n") << "    {\"layer\": " << h.layer << ", \"head\": " << h.head
      << ", \"k_bits\": " << h.k_bits << ", \"v_bits\": " << h.v_bits
      << ", \"bpe\": " << JsonNumber(HeadBpe(q.spec, q.kv_heads, h.k_bits, h.v_bits))
      << ", \"k_distortion\": " << JsonNumber(h.k_distortion)
      << ", \"v_distortion\": " << JsonNumber(h.v_distortion) << "}";
  }
  o << "\n  ],\n  \"layer_budgets\": ";
  if (!plan.tokens) {
    o << "null";
  } else {
    const LayerTokenPlan& t = *plan.tokens;
    double bytes = 0;
    o << "{\n    \"schedule\": " << JsonQuoted(LayerScheduleName(t.schedule))
      << ",\n    \"avg_tokens_per_head\": " << t.avg_tokens_per_head
      << ",\n    \"window\": " << t.window << ",\n    \"floor\": " << t.floor
      << ",\n    \"requested_tokens\": " << t.requested_tokens
      << ",\n    \"achieved_tokens\": " << t.achieved_tokens
      << ",\n    \"tolerance_tokens\": " << t.tolerance_tokens << ",\n    \"layers\": [";
    for (size_t l = 0; l < t.tokens.size(); ++l) {
      bytes += t.bytes[l];
      o << (l ? ",\n" : "\n") << "      {\"layer\": " << l << ", \"tokens\": " << t.tokens[l]
        << ", \"demand\": " << (t.demand.empty() ? "null" : JsonNumber(t.demand[l]))
        << ", \"bpe\": " << JsonNumber(t.bpe[l]) << ", \"bytes\": " << JsonNumber(t.bytes[l])
        << "}";
    }
    o << "\n    ],\n    \"bytes\": " << JsonNumber(bytes)
      << ",\n    \"ok\": " << (t.ok ? "true" : "false") << "\n  }";
  }
  o << ",\n  \"timing_ms\": {\"read_profile\": "
    << (info.read_ms < 0 ? "null" : JsonNumber(info.read_ms))
    << ", \"plan\": " << (info.plan_ms < 0 ? "null" : JsonNumber(info.plan_ms)) << "},\n"
    << "  \"ok\": " << (plan.ok() ? "true" : "false") << "\n}\n";
  return o.str();
}

std::string FormatPlanTable(const KvcalibPlan& plan, const PlanReportInfo& info) {
  const RateQuantPlan& q = plan.quant;
  const BitBudgetCheck& c = plan.bits;
  std::ostringstream o;
  char line[256];
  o << "kvcalib plan: " << info.profile << ": " << QuantMethodName(q.spec.method) << ", head_dim "
    << q.spec.head_dim << ", " << q.layers << " layers x " << q.kv_heads << " KV heads, widths "
    << JsonList(plan.range.bits) << "\n";
  std::snprintf(line, sizeof line,
                "budget: requested %.6g b/e, achieved %.6g b/e, slack %.3g (one unit %.3g): %s\n",
                c.requested_bpe, c.achieved_bpe, c.slack_bpe, c.unit_step_bpe,
                c.ok ? "ok" : "VIOLATED");
  o << line;
  std::snprintf(line, sizeof line,
                "predicted distortion %.6g (%s; bound %.6g), beta_k %.4g, beta_v %.4g; "
                "water-filling %.6g at %.6g b/e\n",
                q.predicted_distortion, q.exact ? "proven optimal" : "not proven", q.lower_bound,
                q.beta_k, q.beta_v, q.continuous_distortion, q.continuous_cost_bpe);
  o << line << "\nlayer  head  k_bits  v_bits     b/e   k_distortion   v_distortion\n";
  for (const HeadPlan& h : q.heads) {
    std::snprintf(line, sizeof line, "%5d  %4d  %6d  %6d  %6.4f  %13.6g  %13.6g\n", h.layer, h.head,
                  h.k_bits, h.v_bits, HeadBpe(q.spec, q.kv_heads, h.k_bits, h.v_bits),
                  h.k_distortion, h.v_distortion);
    o << line;
  }
  if (plan.tokens) {
    const LayerTokenPlan& t = *plan.tokens;
    o << "\nlayer token budgets (" << LayerScheduleName(t.schedule) << ", " << t.avg_tokens_per_head
      << " tokens per head on average, window " << t.window;
    if (t.schedule == LayerSchedule::kDemand) o << ", floor " << t.floor;
    o << "): requested " << t.requested_tokens << ", achieved " << t.achieved_tokens
      << (t.tolerance_tokens ? StrCat(" (pyramid may overshoot by ", t.tolerance_tokens, ")") : "")
      << ": " << (t.ok ? "ok" : "VIOLATED") << "\nlayer   tokens      demand     b/e       bytes\n";
    for (size_t l = 0; l < t.tokens.size(); ++l) {
      std::snprintf(line, sizeof line, "%5zu  %7lld  %10.4g  %6.4f  %10.0f\n", l,
                    static_cast<long long>(t.tokens[l]), t.demand.empty() ? NAN : t.demand[l],
                    t.bpe[l], t.bytes[l]);
      o << line;
    }
  }
  if (info.read_ms >= 0 && info.plan_ms >= 0) {
    std::snprintf(line, sizeof line, "time: read profile %.3f ms, plan %.3f ms\n", info.read_ms,
                  info.plan_ms);
    o << line;
  }
  return o.str();
}

}  // namespace kvctl
