// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/budget_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <tuple>

#include "policies/calib_profile.h"
#include "policies/joint_planner.h"
#include "policies/ratequant.h"
#include "policies/reasonalloc.h"

namespace kvctl {
namespace {

using internal::StrCat;

int64_t EffectiveObsWindow(const EvictConfig& e) {
  if (e.obs_window > 0) return e.obs_window;
  return e.policy == EvictPolicy::kSnapKV ? 32 : 8;
}

int64_t EffectiveWindow(const EvictConfig& e) {
  return e.window > 0 ? e.window : std::max<int64_t>(8, EffectiveObsWindow(e));
}

// The kvcalib profile, with errors naming the key that pointed at it. One OPEN reads it for the
// widths, the layer demand and the pressure curves, and every OPEN reads it again, so the last
// one parsed is kept, keyed by path, size and modification time (an edited file is read again).
StatusOr<CalibProfile> LoadProfile(const std::string& path) {
  using Key = std::tuple<std::string, int64_t, int64_t, int64_t>;
  static std::mutex mu;
  static Key cached_key;
  static CalibProfile cached;
  struct stat st {};
  const bool have_key = stat(path.c_str(), &st) == 0;
  Key key;
  if (have_key) {
    key = {path, static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
           static_cast<int64_t>(st.st_mtim.tv_nsec)};
    std::lock_guard<std::mutex> lock(mu);
    if (key == cached_key) return cached;
  }
  StatusOr<CalibProfile> profile = ReadCalibProfile(path);
  if (!profile.ok()) {
    return Status(profile.status().code(),
                  StrCat("budget.profile: \"", path, "\": ", profile.status().message()));
  }
  if (have_key) {
    std::lock_guard<std::mutex> lock(mu);
    cached_key = key;
    cached = *profile;
  }
  return profile;
}

double QuantOnlyBits(const BudgetConfig& b) {
  return b.avg_bits > 0 ? b.avg_bits : 16.0 * b.fp16_fraction;
}

// [evict] keys and the quantizers eviction runs with: shared by evict-only and joint.
Status ValidateEvictKeys(const Config& c) {
  const EvictConfig& e = c.evict;
  const int64_t obs = EffectiveObsWindow(e), window = EffectiveWindow(e);
  if ((e.policy == EvictPolicy::kSnapKV || e.policy == EvictPolicy::kRKV) && obs > window) {
    return InvalidArgument("evict.obs_window: got ", obs, ", expected at most evict.window ",
                           window, " (observing queries must belong to never-evicted tokens)");
  }
  if (e.kernel != 0 && e.kernel % 2 == 0) {
    return InvalidArgument("evict.kernel: got ", e.kernel,
                           ", expected an odd number (0 = the "
                           "policy's default)");
  }
  // OScaR divides each token's K by one norm taken over every head of the layer, stored once per
  // token: heads that keep different tokens cannot share it.
  const char* mode = c.budget.mode == BudgetMode::kJoint ? "joint" : "evict-only";
  auto refuse_oscar = [&](const QuantSettings& q, std::string_view where) -> Status {
    if (q.lossless || q.method != QuantMethod::kOscar) return OkStatus();
    return InvalidArgument(
        "evict.policy: budget.mode = \"", mode, "\" cannot run with quant.method = \"oscar\"",
        where,
        ": OScaR's token norm spans every KV head of a layer, so one head cannot drop a token "
        "alone; expected kivi, quarot, kvarn, fp16, quant.lossless = true, or budget.mode = "
        "\"none\"");
  };
  KVCTL_RETURN_IF_ERROR(refuse_oscar(c.quant, ""));
  for (const ModelConfig& m : c.models) {
    KVCTL_RETURN_IF_ERROR(
        refuse_oscar(EffectiveQuantSettings(c, &m), StrCat(" (model \"", m.name, "\")")));
  }
  return OkStatus();
}

Status ValidateJoint(const Config& c) {
  const BudgetConfig& b = c.budget;
  if ((b.bytes > 0) == (b.fp16_fraction > 0)) {
    return InvalidArgument("budget.bytes: got ", FormatByteSize(b.bytes),
                           " and budget.fp16_fraction ", b.fp16_fraction,
                           ", expected exactly one of them > 0 with budget.mode = \"joint\"");
  }
  if (b.plan_tokens == 0) {
    return InvalidArgument(
        "budget.plan_tokens: got 0, expected the sequence length (tokens per head) the joint "
        "plan is made for, > 0");
  }
  if (b.realloc_period != 0) {
    return InvalidArgument("budget.realloc_period: got ", b.realloc_period,
                           ", expected 0 with budget.mode = \"joint\" (the joint plan fixes "
                           "every head's budget)");
  }
  if (b.profile.empty()) {
    return InvalidArgument(
        "budget.profile: got \"\", expected a kvcalib profile for budget.mode = "
        "\"joint\"");
  }
  KVCTL_RETURN_IF_ERROR(LoadProfile(b.profile).status());
  return ValidateEvictKeys(c);
}

Status ValidateEvictOnly(const Config& c) {
  const BudgetConfig& b = c.budget;
  const EvictConfig& e = c.evict;
  if (b.tokens_per_head == 0 && b.token_fraction == 0) {
    return InvalidArgument(
        "budget.tokens_per_head: got 0 and budget.token_fraction 0, expected one of them > 0 "
        "with budget.mode = \"evict-only\"");
  }
  if (b.tokens_per_head > 0 && b.token_fraction > 0) {
    return InvalidArgument("budget.token_fraction: got ", b.token_fraction,
                           " with budget.tokens_per_head ", b.tokens_per_head,
                           " also set, expected only one of them");
  }
  const int64_t window = EffectiveWindow(e);
  if (b.tokens_per_head > 0 && b.tokens_per_head < e.sinks + window) {
    return InvalidArgument("budget.tokens_per_head: got ", b.tokens_per_head,
                           ", expected at least evict.sinks + evict.window = ", e.sinks + window);
  }
  if (b.floor > 0 && b.tokens_per_head > 0 && b.floor > b.tokens_per_head) {
    return InvalidArgument("budget.floor: got ", b.floor,
                           ", expected at most budget.tokens_per_head ", b.tokens_per_head);
  }
  if (b.realloc_period > 0 && e.policy == EvictPolicy::kStreaming) {
    return InvalidArgument("budget.realloc_period: got ", b.realloc_period,
                           ", expected 0 with evict.policy = \"streaming\" (it has no attention "
                           "scores to re-allocate by; use h2o, snapkv or rkv)");
  }
  if (b.layer_profile == LayerProfile::kDemand) {
    if (b.profile.empty()) {
      return InvalidArgument(
          "budget.layer_profile: got \"demand\", expected budget.profile to "
          "name a kvcalib profile with a [reasonalloc] table");
    }
    KVCTL_RETURN_IF_ERROR(LoadLayerDemand(b.profile).status());
  }
  return ValidateEvictKeys(c);
}

// Per-head minimum kept tokens: budget.floor or the starvation floor, never below the protected
// sinks + window. The joint planner plans with the same floor, so no cap is raised after planning.
int64_t EvictionFloor(const Config& c, int64_t sinks) {
  const int64_t window = EffectiveWindow(c.evict);
  const int64_t floor =
      c.budget.floor > 0 ? c.budget.floor : StarvationFloor(window, c.budget.tokens_per_head);
  return std::max<int64_t>(floor, sinks + window);
}

}  // namespace

StatusOr<std::vector<double>> LoadLayerDemand(const std::string& path) {
  KVCTL_ASSIGN_OR_RETURN(CalibProfile profile, LoadProfile(path));
  if (!profile.demand) {
    return InvalidArgument("budget.profile: \"", path,
                           "\" has no [reasonalloc] table, expected a kvcalib fit profile made "
                           "with queries (not --no-demand)");
  }
  return profile.demand->demand;
}

Status ValidateBudgetConfig(const Config& c) {
  const BudgetConfig& b = c.budget;
  if (b.pressure == PressurePolicy::kRequantize && c.quant.lossless) {
    return InvalidArgument(
        "budget.pressure: got \"requantize\", expected \"fail\" with quant.lossless = true "
        "(lossless layers store rows, there are no code widths to lower)");
  }
  if (b.pressure_scope == PressureScope::kPool && b.pressure != PressurePolicy::kRequantize) {
    return InvalidArgument(
        "budget.pressure_scope: got \"pool\", expected \"sequence\" unless budget.pressure = "
        "\"requantize\" (nothing is lowered with \"fail\")");
  }
  if (b.mode == BudgetMode::kJoint) return ValidateJoint(c);
  if (b.bytes != 0) {
    return InvalidArgument("budget.bytes: got ", FormatByteSize(b.bytes),
                           ", expected 0 unless budget.mode = \"joint\" (evict-only budgets "
                           "tokens: budget.tokens_per_head or budget.token_fraction; quant-only "
                           "budgets bits: budget.avg_bits or budget.fp16_fraction)");
  }
  if (b.mode == BudgetMode::kEvictOnly) return ValidateEvictOnly(c);
  if (b.mode == BudgetMode::kQuantOnly) {
    if ((b.avg_bits > 0) == (b.fp16_fraction > 0)) {
      return InvalidArgument("budget.avg_bits: got ", b.avg_bits, " and budget.fp16_fraction ",
                             b.fp16_fraction,
                             ", expected exactly one of them > 0 with budget.mode = "
                             "\"quant-only\"");
    }
    if (b.profile.empty()) {
      return InvalidArgument(
          "budget.profile: got \"\", expected a kvcalib profile with a "
          "[ratequant] table for budget.mode = \"quant-only\"");
    }
    KVCTL_RETURN_IF_ERROR(LoadProfile(b.profile).status());
  }
  return OkStatus();
}

StatusOr<PressureSettings> ResolvePressure(const Config& c, const SequenceShape& shape,
                                           const JointPlanInput* joint_input) {
  PressureSettings s;
  if (c.budget.pressure != PressurePolicy::kRequantize) return s;
  s.lower_widths = true;
  s.min_bits = c.budget.pressure_min_bits;
  if (c.budget.mode == BudgetMode::kJoint && joint_input != nullptr) {
    s.joint = std::make_shared<const JointPlanInput>(*joint_input);
  }
  if (c.budget.profile.empty()) return s;
  KVCTL_ASSIGN_OR_RETURN(CalibProfile profile, LoadProfile(c.budget.profile));
  const RateQuantFit& fit = profile.fit;
  // A profile of another geometry (e.g. one made for a different model) leaves the default model.
  if (fit.layers != shape.layers || fit.kv_heads != shape.kv_heads ||
      fit.spec.head_dim != shape.head_dim) {
    return s;
  }
  for (int l = 0; l < shape.layers; ++l) {
    for (int h = 0; h < shape.kv_heads; ++h) {
      const RateQuantUnit& k = fit.Unit(l, h, UnitKind::kKey);
      const RateQuantUnit& v = fit.Unit(l, h, UnitKind::kValue);
      s.curves.push_back({.k_scale = k.importance * k.alpha,
                          .beta_k = fit.beta_k,
                          .v_scale = v.importance * v.alpha,
                          .beta_v = fit.beta_v});
    }
  }
  return s;
}

StatusOr<EvictionSettings> ResolveEviction(const Config& c, const SequenceShape& shape,
                                           const std::vector<int64_t>& head_caps) {
  EvictionSettings s;
  if (c.budget.mode != BudgetMode::kEvictOnly && c.budget.mode != BudgetMode::kJoint) return s;
  const BudgetConfig& b = c.budget;
  const EvictConfig& e = c.evict;
  s.enabled = true;
  s.policy = e.policy;
  s.obs_window = EffectiveObsWindow(e);
  s.window = EffectiveWindow(e);
  s.sinks = std::max<int64_t>(e.sinks, shape.quant_sinks);
  s.snapkv.obs_window = s.obs_window;
  s.snapkv.kernel = e.kernel > 0 ? e.kernel : 5;
  s.snapkv.pool = e.pooling == EvictPooling::kMax ? PoolKind::kMax : PoolKind::kAvg;
  s.rkv.obs_window = s.obs_window;
  s.rkv.kernel = e.kernel > 0 ? e.kernel : 7;
  s.rkv.pool = e.pooling == EvictPooling::kAvg ? PoolKind::kAvg : PoolKind::kMax;
  s.rkv.lambda = static_cast<float>(e.lambda);
  KVCTL_RETURN_IF_ERROR(ValidateSnapKvParams(s.snapkv));
  KVCTL_RETURN_IF_ERROR(ValidateRkvParams(s.rkv));
  s.compression_period = e.compression_period;
  s.tokens_per_head = b.tokens_per_head;
  s.token_fraction = b.token_fraction;
  s.layer_profile = b.layer_profile;
  s.realloc_period = b.realloc_period;
  s.realloc_ema = b.realloc_ema;
  if (s.layer_profile == LayerProfile::kDemand) {
    KVCTL_ASSIGN_OR_RETURN(s.demand, LoadLayerDemand(b.profile));
    if (static_cast<int>(s.demand.size()) != shape.layers) {
      return InvalidArgument("budget.profile: its [reasonalloc] demand has ", s.demand.size(),
                             " layers, expected ", shape.layers, " (the session's layers)");
    }
  }
  s.floor = EvictionFloor(c, s.sinks);
  if (c.budget.mode == BudgetMode::kJoint) {
    if (head_caps.size() != static_cast<size_t>(shape.layers) * shape.kv_heads) {
      return Internal("joint: ", head_caps.size(), " head caps for ", shape.layers, " x ",
                      shape.kv_heads, " heads");
    }
    s.head_caps = head_caps;
    for (int64_t& cap : s.head_caps) cap = std::max(cap, s.floor);
  } else if (b.tokens_per_head > 0 && b.tokens_per_head < s.floor) {
    return InvalidArgument("budget.tokens_per_head: got ", b.tokens_per_head,
                           ", expected at least ", s.floor, " for this session: the floor is max(",
                           "budget.floor or the starvation floor, sinks ", s.sinks, " + window ",
                           s.window, "), and quant.sink_tokens keeps ", shape.quant_sinks,
                           " fp16 sink tokens that are never evicted");
  }
  if (s.NeedsQ() && shape.q_heads == 0) {
    return InvalidArgument("q_heads: got 0 in HELLO, but evict.policy = \"",
                           EvictPolicyName(s.policy),
                           "\" scores tokens from the queries sent with APPEND; send q_heads > 0 "
                           "and Q with every APPEND");
  }
  return s;
}

Status ApplyBudgetWidths(const Config& c, const SequenceShape& shape, std::vector<LayerPlan>* plans,
                         std::vector<int64_t>* head_caps, JointPlanInput* joint_input) {
  const BudgetMode mode = c.budget.mode;
  if (mode != BudgetMode::kQuantOnly && mode != BudgetMode::kJoint) return OkStatus();
  KVCTL_ASSIGN_OR_RETURN(CalibProfile profile, LoadProfile(c.budget.profile));
  const RateQuantFit& fit = profile.fit;
  if (fit.layers != shape.layers || fit.kv_heads != shape.kv_heads ||
      fit.spec.head_dim != shape.head_dim) {
    return InvalidArgument("budget.profile: fitted for ", fit.layers, " layers x ", fit.kv_heads,
                           " KV heads x head_dim ", fit.spec.head_dim, ", expected the session's ",
                           shape.layers, " x ", shape.kv_heads, " x ", shape.head_dim);
  }
  for (const LayerPlan& lp : *plans) {
    if (!lp.lossless && lp.head_specs[0].method != fit.spec.method) {
      return InvalidArgument("budget.profile: fitted for ", QuantMethodName(fit.spec.method),
                             ", expected the session's quantizer ",
                             QuantMethodName(lp.head_specs[0].method));
    }
  }
  // Widths (and, for joint, kept tokens) per (layer, head), in (layer, head) order.
  std::vector<std::pair<int, int>> widths;
  if (mode == BudgetMode::kQuantOnly) {
    RateQuantPlanOptions options;
    options.budget_bpe = QuantOnlyBits(c.budget);
    StatusOr<RateQuantPlan> plan = PlanRateQuant(fit, options);
    if (!plan.ok()) return InvalidArgument("budget.avg_bits: ", plan.status().message());
    for (const HeadPlan& hp : plan->heads) widths.emplace_back(hp.k_bits, hp.v_bits);
  } else {
    JointProfileOptions o;
    o.tokens = c.budget.plan_tokens;
    o.sinks = std::max<int64_t>(c.evict.sinks, shape.quant_sinks);
    o.window = EffectiveWindow(c.evict);
    o.budget_bytes = static_cast<int64_t>(c.budget.bytes);
    o.budget_fraction = c.budget.fp16_fraction;
    o.min_tokens = EvictionFloor(c, o.sinks);
    // Every head is charged the worst-case fp16 tail of its layer (flush_tokens - 1 rows).
    for (const LayerPlan& lp : *plans) {
      if (!lp.lossless) o.flush_tokens = std::max<int64_t>(o.flush_tokens, lp.rules.flush_tokens);
    }
    StatusOr<JointPlanInput> input = MakeJointInput(profile, o);
    if (!input.ok()) return InvalidArgument("budget (joint): ", input.status().message());
    StatusOr<JointPlan> plan = PlanJoint(*input, JointMode::kJoint);
    if (!plan.ok()) {
      return Status(plan.status().code(),
                    StrCat("budget.bytes / budget.fp16_fraction (joint plan for ",
                           c.budget.plan_tokens, " tokens): ", plan.status().message()));
    }
    for (const JointHeadPlan& hp : plan->heads) {
      widths.emplace_back(hp.k_bits, hp.v_bits);
      if (head_caps != nullptr) head_caps->push_back(hp.kept);
    }
    if (joint_input != nullptr) *joint_input = std::move(*input);
  }
  for (size_t i = 0; i < widths.size(); ++i) {
    LayerPlan& lp = (*plans)[i / shape.kv_heads];
    if (lp.lossless) continue;
    QuantSpec& spec = lp.head_specs[i % shape.kv_heads];
    spec.k_bits = widths[i].first;
    spec.v_bits = widths[i].second;
    KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  }
  return OkStatus();
}

}  // namespace kvctl
