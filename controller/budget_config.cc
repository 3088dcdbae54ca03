// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/budget_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>

#include "common/file_util.h"
#include "policies/ratequant.h"
#include "policies/ratequant_fit.h"
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

// kvcalib writes [ratequant] and [reasonalloc] in one file; the RateQuant reader refuses foreign
// tables, so it gets the text with the [reasonalloc] part blanked (line numbers stay right).
StatusOr<RateQuantFit> LoadRateQuantFit(const std::string& path) {
  KVCTL_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "budget.profile"));
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    if (std::string_view(text).substr(at, end - at).rfind("[reasonalloc]", 0) == 0) {
      for (size_t i = at; i < text.size(); ++i) {
        if (text[i] != '\n') text[i] = ' ';
      }
      break;
    }
    at = end + 1;
  }
  StatusOr<RateQuantFit> fit = ParseRateQuantProfile(text, path);
  if (!fit.ok()) return InvalidArgument("budget.profile: ", fit.status().message());
  return fit;
}

double QuantOnlyBits(const BudgetConfig& b) {
  return b.avg_bits > 0 ? b.avg_bits : 16.0 * b.fp16_fraction;
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
  // OScaR divides each token's K by one norm taken over every head of the layer, stored once per
  // token: heads that keep different tokens cannot share it.
  auto refuse_oscar = [&](const QuantSettings& q, std::string_view where) -> Status {
    if (q.lossless || q.method != QuantMethod::kOscar) return OkStatus();
    return InvalidArgument(
        "evict.policy: budget.mode = \"evict-only\" cannot run with quant.method = \"oscar\"",
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

}  // namespace

StatusOr<std::vector<double>> LoadLayerDemand(const std::string& path) {
  KVCTL_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "budget.profile"));
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    return InvalidArgument("budget.profile: ", path, ":", e.source().begin.line, ": ",
                           e.description());
  }
  const toml::array* demand = root["reasonalloc"]["demand"].as_array();
  if (demand == nullptr || demand->empty()) {
    return InvalidArgument("budget.profile: ", path,
                           " has no [reasonalloc] demand array, expected a kvcalib fit profile "
                           "made with queries (not --no-demand)");
  }
  std::vector<double> out;
  for (const toml::node& n : *demand) {
    const std::optional<double> v = n.value<double>();
    if (!v || !std::isfinite(*v) || *v <= 0) {
      return InvalidArgument("budget.profile: ", path, ": reasonalloc.demand[", out.size(),
                             "]: expected a finite number > 0");
    }
    out.push_back(*v);
  }
  return out;
}

Status ValidateBudgetConfig(const Config& c) {
  const BudgetConfig& b = c.budget;
  if (b.mode == BudgetMode::kJoint) {
    return InvalidArgument(
        "budget.mode: got \"joint\", expected none, quant-only or evict-only: this daemon has no "
        "joint bytes -> (tokens, bits) planner yet");
  }
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
    KVCTL_RETURN_IF_ERROR(LoadRateQuantFit(b.profile).status());
  }
  return OkStatus();
}

StatusOr<EvictionSettings> ResolveEviction(const Config& c, const SequenceShape& shape) {
  EvictionSettings s;
  if (c.budget.mode != BudgetMode::kEvictOnly) return s;
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
  const int64_t protect = s.sinks + s.window;
  s.floor = std::max<int64_t>(b.floor > 0 ? b.floor : StarvationFloor(s.window, b.tokens_per_head),
                              protect);
  if (b.tokens_per_head > 0 && b.tokens_per_head < s.floor) {
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

Status ApplyQuantOnlyBits(const Config& c, const SequenceShape& shape,
                          std::vector<LayerPlan>* plans) {
  if (c.budget.mode != BudgetMode::kQuantOnly) return OkStatus();
  KVCTL_ASSIGN_OR_RETURN(RateQuantFit fit, LoadRateQuantFit(c.budget.profile));
  if (fit.layers != shape.layers || fit.kv_heads != shape.kv_heads ||
      fit.spec.head_dim != shape.head_dim) {
    return InvalidArgument("budget.profile: fitted for ", fit.layers, " layers x ", fit.kv_heads,
                           " KV heads x head_dim ", fit.spec.head_dim, ", expected the session's ",
                           shape.layers, " x ", shape.kv_heads, " x ", shape.head_dim);
  }
  RateQuantPlanOptions options;
  options.budget_bpe = QuantOnlyBits(c.budget);
  StatusOr<RateQuantPlan> plan = PlanRateQuant(fit, options);
  if (!plan.ok()) return InvalidArgument("budget.avg_bits: ", plan.status().message());
  for (const HeadPlan& hp : plan->heads) {
    LayerPlan& lp = (*plans)[hp.layer];
    if (lp.lossless) continue;
    QuantSpec& spec = lp.head_specs[hp.head];
    if (spec.method != fit.spec.method) {
      return InvalidArgument("budget.profile: fitted for ", QuantMethodName(fit.spec.method),
                             ", expected the session's quantizer ", QuantMethodName(spec.method));
    }
    spec.k_bits = hp.k_bits;
    spec.v_bits = hp.v_bits;
    KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  }
  return OkStatus();
}

}  // namespace kvctl
