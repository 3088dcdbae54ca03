// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/sequence/budget_resolve.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "controller/config/budget_keys.h"
#include "policies/calib_profile.h"
#include "policies/joint_planner.h"
#include "policies/ratequant.h"
#include "policies/reasonalloc.h"

namespace kvctl {

using internal::StrCat;

namespace {

// The average budget of the heads that evict.full_heads does not name (every head when it names
// none), of `pairs` in all, after `t` tokens.
int64_t EvictedHeadsAverage(const EvictionSettings& ev, int64_t pairs, int64_t t) {
  return FullHeadsAverage(ev, pairs, AverageBudget(ev, t), t);
}

// The share of their tokens the heads evict.full_heads does not name keep under the token
// fraction f: with R of the P pairs named, (P f - R) / (P - R); f itself when none are. <= 0 when
// the named heads take the whole fraction.
double OtherHeadsFraction(const EvictionSettings& ev, int64_t pairs) {
  const double r = static_cast<double>(FullHeadCount(ev)), p = static_cast<double>(pairs);
  return (p * ev.token_fraction - r) / (p - r);
}

// How a message names the token fraction: its key, or the memory budget that aims at it.
std::string FractionSource(const Config& c, double f) {
  return c.budget.fp16_fraction > 0
             ? StrCat("the token fraction ", f, " that budget.fp16_fraction ",
                      c.budget.fp16_fraction, " aims at")
             : StrCat("budget.token_fraction ", f);
}

// Smallest sequence length T at which a head at the evicted heads' average budget (a
// token_fraction > 0) holds `need` rows; never below `need` itself; -1 when it never does (the
// full heads take the whole fraction, so the others stay at their floor).
int64_t FractionOnset(const EvictionSettings& ev, int64_t pairs, int64_t need) {
  if (ev.floor >= need) return need;
  // With R full heads of P the others keep T (P f - R) / (P - R) less P offset / (P - R) tokens.
  const double full = static_cast<double>(FullHeadCount(ev));
  const double p = static_cast<double>(pairs);
  const double f = OtherHeadsFraction(ev, pairs);
  if (f <= 0) return -1;
  const double offset = p * static_cast<double>(ev.fraction_offset) / (p - full);
  const double estimate = std::ceil((static_cast<double>(need) + offset) / f);
  // A fraction the full heads all but fill puts the onset past any sequence a pool could hold
  // (and past int64 as f nears 0).
  constexpr double kNeverTokens = 0x1p40;
  if (!(estimate < kNeverTokens)) return -1;
  int64_t t = static_cast<int64_t>(estimate);
  t = std::max(t, need);
  while (t > need && EvictedHeadsAverage(ev, pairs, t - 1) >= need) --t;
  while (EvictedHeadsAverage(ev, pairs, t) < need) ++t;
  return t;
}

// evict.full_heads whose R heads keep so much that the other P - R fall to their floor, where
// the sequence holds more than its budget: with budget.tokens_per_head B from the T at which
// P B - R T leaves them the floor (every such config, for long enough sequences); with a
// token_fraction f from the start when R >= P f.
std::optional<CompressionWarning> FullHeadsOverBudget(const Config& c, const EvictionSettings& ev,
                                                      int64_t pairs) {
  const int64_t full = FullHeadCount(ev);
  if (full == 0) return std::nullopt;
  const std::string heads =
      StrCat("evict.full_heads names ", full, " of the ", pairs, " (layer, head) pairs");
  const std::string then = StrCat("the other heads keep only their floor of ", ev.floor,
                                  " tokens and the sequence holds more than its budget; name "
                                  "fewer heads or raise the budget");
  if (ev.tokens_per_head > 0) {
    const __int128 spare = static_cast<__int128>(pairs) * ev.tokens_per_head -
                           static_cast<__int128>(pairs - full) * ev.floor;
    // At most pairs x B: HELLO caps layers and kv_heads at 1024 each, the schema B at 2^24.
    const int64_t starve = static_cast<int64_t>((spare + full - 1) / full);
    return CompressionWarning{"full_heads_over_budget",
                              StrCat(heads, ", which keep every token while all ", pairs,
                                     " share budget.tokens_per_head ", ev.tokens_per_head, " x ",
                                     pairs, " tokens: from ", starve, " tokens on ", then)};
  }
  if (ev.token_fraction > 0 &&
      static_cast<double>(full) >= ev.token_fraction * static_cast<double>(pairs)) {
    return CompressionWarning{
        "full_heads_over_budget",
        StrCat(heads, ", at least ", FractionSource(c, ev.token_fraction), " of them: ", then)};
  }
  return std::nullopt;
}

// evict.full_heads under a token fraction f that leaves the P - R other heads (P f - R) / (P - R)
// of their tokens, less than half of f (and more than nothing: FullHeadsOverBudget covers that).
// Measured on SmolLM2 (docs/quality.md, session 44): nine whole heads of 90 at f = 0.125 left
// the others 2.8 % and cost 15 % perplexity against 1.3 % without them; at shares of two thirds
// of f and more they did not hurt (and at 1/8 and 1/16 they helped).
std::optional<CompressionWarning> FullHeadsStarveOthers(const Config& c, const EvictionSettings& ev,
                                                        int64_t pairs) {
  const int64_t full = FullHeadCount(ev);
  const double f = ev.token_fraction;
  if (full == 0 || full >= pairs || f <= 0) return std::nullopt;
  const double others = OtherHeadsFraction(ev, pairs);
  if (others <= 0 || others >= f / 2) return std::nullopt;
  return CompressionWarning{"full_heads_starve_others",
                            StrCat("evict.full_heads names ", full, " of the ", pairs,
                                   " (layer, head) pairs, which keep every token of ",
                                   FractionSource(c, f), "; the other heads keep ", others,
                                   " of theirs, under half of it, and evict what "
                                   "they need; name fewer heads or raise the budget")};
}

}  // namespace

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
  KVCTL_ASSIGN_OR_RETURN(CalibProfile profile, LoadBudgetProfile(c.budget.profile));
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
  // SnapKV's code: a softmax per query head over every key a query sees, averaged over the group;
  // R-KV's code: the max of the group's logits, a softmax over the candidates only.
  s.snapkv.group = e.group == EvictGroup::kMax ? GqaReduce::kMaxLogit : GqaReduce::kMeanProb;
  s.snapkv.softmax =
      e.softmax == EvictSoftmax::kCandidates ? SoftmaxScope::kCandidates : SoftmaxScope::kCausal;
  s.rkv.group = e.group == EvictGroup::kMean ? GqaReduce::kMeanProb : GqaReduce::kMaxLogit;
  s.rkv.softmax =
      e.softmax == EvictSoftmax::kCausal ? SoftmaxScope::kCausal : SoftmaxScope::kCandidates;
  KVCTL_RETURN_IF_ERROR(ValidateSnapKvParams(s.snapkv));
  KVCTL_RETURN_IF_ERROR(ValidateRkvParams(s.rkv));
  s.compression_period = e.compression_period;
  s.stagger_layers = e.stagger_layers;
  s.whole_records = e.whole_records;
  s.max_deferred_tokens = e.max_deferred_tokens;
  s.tokens_per_head = b.tokens_per_head;
  s.token_fraction = b.token_fraction;
  s.layer_profile = b.layer_profile;
  s.realloc_period = b.realloc_period;
  s.realloc_ema = b.realloc_ema;
  s.realloc_greedy = b.realloc_split == ReallocSplit::kGreedy;
  if (s.layer_profile == LayerProfile::kDemand) {
    KVCTL_ASSIGN_OR_RETURN(s.demand, LoadLayerDemand(b));  // Tempered by demand_power.
    if (static_cast<int>(s.demand.size()) != shape.layers) {
      return InvalidArgument("budget.profile: its [reasonalloc] demand has ", s.demand.size(),
                             " layers, expected ", shape.layers, " (the session's layers)");
    }
  }
  s.floor = EvictionFloor(c, s.sinks);
  KVCTL_ASSIGN_OR_RETURN(const std::vector<FullHead> full, ParseFullHeads(e.full_heads));
  if (!full.empty()) {
    s.full_head.assign(static_cast<size_t>(shape.layers) * shape.kv_heads, 0);
    for (const FullHead& h : full) {
      if (h.layer >= shape.layers || h.head >= shape.kv_heads) {
        return InvalidArgument("evict.full_heads: got \"", h.layer, ":", h.head,
                               "\", expected layer < ", shape.layers, " and head < ",
                               shape.kv_heads, " (the session's geometry)");
      }
      s.full_head[static_cast<size_t>(h.layer) * shape.kv_heads + h.head] = 1;
    }
    if (full.size() == s.full_head.size()) {  // ParseFullHeads refuses repeats.
      return InvalidArgument("evict.full_heads: got all ", full.size(),
                             " (layer, head) pairs of the session, expected at least one left "
                             "to evict (budget.mode = \"none\" keeps every token)");
    }
  }
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

void AimEvictionAtMemory(const Config& c, const std::vector<LayerPlan>& plans, int head_dim,
                         DType dtype, EvictionSettings* s) {
  if (!s->enabled || c.budget.mode != BudgetMode::kEvictOnly || c.budget.fp16_fraction <= 0) {
    return;
  }
  // Per (layer, head) stream and token: fp16 row bytes (K and V), what kept tokens cost as
  // records (or as rows, lossless), and the fp16 rows a quantized head holds whatever its budget:
  // its sinks and, on average over the steps, half a flush of tail.
  const double fp16_row = 2.0 * head_dim * 2;
  double kept_bytes = 0, fixed_bytes = 0;
  int64_t streams = 0;
  for (const LayerPlan& lp : plans) {
    for (const QuantSpec& spec : lp.head_specs) {
      ++streams;
      if (lp.lossless || spec.method == QuantMethod::kFp16) {
        kept_bytes += 2.0 * head_dim * static_cast<double>(DTypeSize(dtype));
        continue;
      }
      const double record = static_cast<double>(BlockLayoutOf(spec).record_bytes) /
                            static_cast<double>(spec.block_tokens);
      kept_bytes += record;
      const double rows = lp.rules.sink_tokens + 0.5 * lp.rules.flush_tokens;
      fixed_bytes += rows * (fp16_row - record);
    }
  }
  if (streams == 0 || kept_bytes <= 0) return;
  // Bytes of K tokens kept by every stream: K x kept_bytes + fixed_bytes = m x T x fp16_row x
  // streams, so K = (m x fp16_row x streams / kept_bytes) T - fixed_bytes / kept_bytes.
  s->token_fraction = c.budget.fp16_fraction * fp16_row * static_cast<double>(streams) / kept_bytes;
  s->fraction_offset = static_cast<int64_t>(std::ceil(std::max(0.0, fixed_bytes) / kept_bytes));
}

Status ApplyBudgetWidths(const Config& c, const SequenceShape& shape, std::vector<LayerPlan>* plans,
                         std::vector<int64_t>* head_caps, JointPlanInput* joint_input) {
  const BudgetMode mode = c.budget.mode;
  if (mode != BudgetMode::kQuantOnly && mode != BudgetMode::kJoint) return OkStatus();
  KVCTL_ASSIGN_OR_RETURN(CalibProfile profile, LoadBudgetProfile(c.budget.profile));
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
    o.eviction_scale = c.budget.eviction_scale;
    // Every head is charged the worst-case fp16 tail of its layer (flush_tokens - 1 rows). A
    // spread flush (quant.flush_spread_steps) holds some tails longer but never raises the
    // sequence's total past that: docs/budgets.md.
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

CompressionOutlook CompressionOutlookOf(const Config& c, const SequenceShape& shape,
                                        const std::vector<LayerPlan>& plans,
                                        const EvictionSettings& ev) {
  CompressionOutlook out;
  bool quantizes = false;
  for (const LayerPlan& lp : plans) {
    for (const QuantSpec& spec : lp.head_specs) {
      quantizes |= !lp.lossless && spec.method != QuantMethod::kFp16;
    }
  }
  const int64_t pairs = int64_t{shape.layers} * shape.kv_heads;
  bool over_budget = false;
  if (ev.enabled) {
    if (std::optional<CompressionWarning> w = FullHeadsOverBudget(c, ev, pairs)) {
      out.warnings.push_back(*std::move(w));
      over_budget = true;
    }
    if (std::optional<CompressionWarning> w = FullHeadsStarveOthers(c, ev, pairs)) {
      out.warnings.push_back(*std::move(w));
    }
  }
  if (!quantizes) return out;  // Lossless or fp16 rows: nothing was asked to be quantized.
  const StreamingRules& r = plans[0].rules;
  const int64_t need = static_cast<int64_t>(r.sink_tokens) + r.flush_tokens;
  const std::string rows =
      StrCat("a head holds quant.sink_tokens ", r.sink_tokens, " + quant.flush_tokens ",
             r.flush_tokens, " = ", need, " rows in fp16 before it quantizes any");
  const std::string fix = "lower quant.sink_tokens / quant.flush_tokens or raise the budget";
  out.onset_tokens = need;
  std::string source = rows;
  // Per-head caps that do not grow with the sequence: joint's plan, evict-only's tokens_per_head
  // (each layer's budget split evenly over its heads).
  std::vector<int64_t> caps;
  std::string what;
  if (ev.enabled && c.budget.mode == BudgetMode::kJoint) {
    caps = ev.head_caps;
    what = StrCat("budget (joint plan for budget.plan_tokens ", c.budget.plan_tokens, ")");
  } else if (ev.enabled && ev.tokens_per_head > 0) {
    StatusOr<std::vector<int64_t>> layers =
        LayerBudgets(ev, shape.layers, shape.kv_heads, AverageBudget(ev, 0), 0);
    if (layers.ok()) {
      for (int64_t b : *layers) caps.insert(caps.end(), shape.kv_heads, b / shape.kv_heads);
    }
    what = StrCat("budget.tokens_per_head ", ev.tokens_per_head);
  }
  if (!caps.empty()) {
    const auto below = std::count_if(caps.begin(), caps.end(), [&](int64_t t) { return t < need; });
    const int64_t largest = *std::max_element(caps.begin(), caps.end());
    if (below == static_cast<std::ptrdiff_t>(caps.size())) {
      out.onset_tokens = -1;
      out.warnings.push_back(
          {"never_quantized", StrCat(what, " keeps at most ", largest, " tokens per head, but ",
                                     rows, ": no row is ever quantized (16 b/e); ", fix)});
      return out;
    }
    // Joint plans price a head's fp16 rows themselves (a head capped below sinks + flush is a
    // deliberate choice that stays within the byte budget), so only evict-only warns for some.
    if (below > 0 && c.budget.mode != BudgetMode::kJoint) {
      out.warnings.push_back(
          {"never_quantized",
           StrCat(what, ": ", below, " of ", caps.size(), " heads keep fewer tokens than the ",
                  need, " rows (", rows, "), so those heads are never quantized; ", fix)});
    }
  } else if (ev.enabled && ev.token_fraction > 0) {
    out.onset_tokens = FractionOnset(ev, pairs, need);
    source = c.budget.fp16_fraction > 0
                 ? StrCat("budget.fp16_fraction ", c.budget.fp16_fraction, " keeps ",
                          ev.token_fraction, " of the tokens less ", ev.fraction_offset,
                          " (at least ", ev.floor, " per head) and ", rows)
                 : StrCat("budget.token_fraction ", ev.token_fraction,
                          " keeps that share of the tokens (at least ", ev.floor, " per head) and ",
                          rows);
    if (const int64_t full = FullHeadCount(ev); full > 0) {
      source += StrCat(" (the onset of the heads evict.full_heads does not name: they keep what ",
                       "its ", full, " heads leave of the fraction)");
    }
  }
  if (out.onset_tokens < 0) {
    // Only with evict.full_heads (FractionOnset): unless FullHeadsOverBudget said why already
    // (a starve warning says less: the others still keep some tokens, just never enough).
    if (!over_budget) {
      const std::string never = StrCat(source, ": the heads it does not name never hold that many");
      out.warnings.push_back({"never_quantized", StrCat(never, "; ", fix)});
    }
  } else if (c.budget.mode == BudgetMode::kJoint && c.budget.plan_tokens < out.onset_tokens) {
    out.warnings.push_back(
        {"never_quantized", StrCat("budget.plan_tokens ", c.budget.plan_tokens, " is below the ",
                                   out.onset_tokens, " tokens before the first quantization (",
                                   rows, "): a sequence of the planned length stays fp16; ", fix)});
  } else if (out.onset_tokens > kShortSequenceTokens) {
    out.warnings.push_back(
        {"late_quantization",
         StrCat(source, ": nothing is quantized before a sequence reaches ", out.onset_tokens,
                " tokens, so sequences shorter than that stay fp16 (16 b/e); ", fix)});
  }
  return out;
}

}  // namespace kvctl
