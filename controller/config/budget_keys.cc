// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/config/budget_keys.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "common/thread_annotations.h"
#include "policies/reasonalloc.h"

namespace kvctl {
namespace {

using internal::StrCat;

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
        "alone; expected kivi, quarot, kvarn, turbo, fp16, quant.lossless = true, or budget.mode = "
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
  KVCTL_RETURN_IF_ERROR(LoadBudgetProfile(b.profile).status());
  return ValidateEvictKeys(c);
}

Status ValidateEvictOnly(const Config& c) {
  const BudgetConfig& b = c.budget;
  const EvictConfig& e = c.evict;
  const int budgets = (b.tokens_per_head > 0) + (b.token_fraction > 0) + (b.fp16_fraction > 0);
  if (budgets != 1) {
    return InvalidArgument("budget.tokens_per_head: got ", b.tokens_per_head,
                           ", budget.token_fraction ", b.token_fraction,
                           " and budget.fp16_fraction ", b.fp16_fraction,
                           ", expected exactly one of them > 0 with budget.mode = \"evict-only\" "
                           "(a token count, a share of the tokens, or a share of fp16 memory)");
  }
  if (b.avg_bits > 0) {
    return InvalidArgument("budget.avg_bits: got ", b.avg_bits,
                           ", expected 0 with budget.mode = \"evict-only\" (its widths are "
                           "[quant]'s; budget.fp16_fraction budgets memory)");
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
  if (!e.full_heads.empty() &&
      (b.realloc_period != 0 || b.layer_profile != LayerProfile::kUniform)) {
    KVCTL_ASSIGN_OR_RETURN(const std::string profile,
                           GetConfigValueText(c, "budget.layer_profile"));  // Quoted.
    return InvalidArgument("evict.full_heads: got \"", e.full_heads,
                           "\", expected \"\" with budget.realloc_period ", b.realloc_period,
                           " and budget.layer_profile ", profile,
                           " (heads that keep every token need budget.realloc_period = 0 and "
                           "budget.layer_profile = \"uniform\")");
  }
  if (b.layer_profile == LayerProfile::kDemand) {
    if (b.profile.empty()) {
      return InvalidArgument(
          "budget.layer_profile: got \"demand\", expected budget.profile to "
          "name a kvcalib profile with a [reasonalloc] table");
    }
    KVCTL_RETURN_IF_ERROR(LoadLayerDemand(b).status());
  }
  return ValidateEvictKeys(c);
}

}  // namespace

StatusOr<std::vector<FullHead>> ParseFullHeads(std::string_view text) {
  std::vector<FullHead> out;
  auto trim = [](std::string_view v) {
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
    return v;
  };
  // Digits only, at most 4 of them: no sign, no overflow.
  auto number = [](std::string_view v, int max, int* n) {
    if (v.empty() || v.size() > 4) return false;
    *n = 0;
    for (char ch : v) {
      if (ch < '0' || ch > '9') return false;
      *n = *n * 10 + (ch - '0');
    }
    return *n <= max;
  };
  if (trim(text).empty()) return out;
  size_t begin = 0;
  for (;;) {
    const size_t comma = text.find(',', begin);
    const std::string_view entry = trim(
        text.substr(begin, comma == std::string_view::npos ? text.size() - begin : comma - begin));
    const size_t colon = entry.find(':');
    FullHead h;
    if (colon == std::string_view::npos || !number(trim(entry.substr(0, colon)), 4095, &h.layer) ||
        !number(trim(entry.substr(colon + 1)), 1023, &h.head)) {
      return InvalidArgument("evict.full_heads: got entry \"", entry, "\" in \"", text,
                             "\", expected \"layer:head\" with layer 0..4095 and head 0..1023, "
                             "entries separated by commas");
    }
    for (const FullHead& seen : out) {
      if (seen.layer == h.layer && seen.head == h.head) {
        return InvalidArgument("evict.full_heads: got \"", entry, "\" twice in \"", text,
                               "\", expected each (layer, head) at most once");
      }
    }
    out.push_back(h);
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return out;
}

int64_t EffectiveObsWindow(const EvictConfig& e) {
  if (e.obs_window > 0) return e.obs_window;
  return e.policy == EvictPolicy::kSnapKV ? 32 : 8;
}

int64_t EffectiveWindow(const EvictConfig& e) {
  return e.window > 0 ? e.window : std::max<int64_t>(8, EffectiveObsWindow(e));
}

// The last kvcalib profile parsed, keyed by path, size and modification time.
struct ProfileCache {
  using Key = std::tuple<std::string, int64_t, int64_t, int64_t>;
  Mutex mu;
  Key key KVCTL_GUARDED_BY(mu);
  CalibProfile profile KVCTL_GUARDED_BY(mu);
};

// The kvcalib profile, with errors naming the key that pointed at it. One OPEN reads it for the
// widths, the layer demand and the pressure curves, and every OPEN reads it again, so the last
// one parsed is kept (an edited file is read again).
StatusOr<CalibProfile> LoadBudgetProfile(const std::string& path) {
  static ProfileCache cache;
  struct stat st {};
  const bool have_key = stat(path.c_str(), &st) == 0;
  ProfileCache::Key key;
  if (have_key) {
    key = {path, static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
           static_cast<int64_t>(st.st_mtim.tv_nsec)};
    MutexLock lock(&cache.mu);
    if (key == cache.key) return cache.profile;
  }
  StatusOr<CalibProfile> profile = ReadCalibProfile(path);
  if (!profile.ok()) {
    return Status(profile.status().code(),
                  StrCat("budget.profile: \"", path, "\": ", profile.status().message()));
  }
  if (have_key) {
    MutexLock lock(&cache.mu);
    cache.key = key;
    cache.profile = *profile;
  }
  return profile;
}

double QuantOnlyBits(const BudgetConfig& b) {
  return b.avg_bits > 0 ? b.avg_bits : 16.0 * b.fp16_fraction;
}

// Per-head minimum kept tokens: budget.floor or the starvation floor, never below the protected
// sinks + window. The joint planner plans with the same floor, so no cap is raised after planning.
int64_t EvictionFloor(const Config& c, int64_t sinks) {
  const int64_t window = EffectiveWindow(c.evict);
  const int64_t floor =
      c.budget.floor > 0 ? c.budget.floor : StarvationFloor(window, c.budget.tokens_per_head);
  return std::max<int64_t>(floor, sinks + window);
}

StatusOr<std::vector<double>> LoadLayerDemand(const BudgetConfig& b) {
  KVCTL_ASSIGN_OR_RETURN(CalibProfile profile, LoadBudgetProfile(b.profile));
  if (!profile.demand) {
    return InvalidArgument("budget.profile: \"", b.profile,
                           "\" has no [reasonalloc] table, expected a kvcalib fit profile made "
                           "with queries (not --no-demand)");
  }
  // The profile's demand is in (0, 1e18] (ParseCalibProfile checks), so no power up to 4
  // overflows it, but one can round a small demand to 0, which the split would refuse only at
  // the first APPEND.
  std::vector<double> demand = profile.demand->demand;
  for (size_t l = 0; l < demand.size(); ++l) {
    const double tempered = std::pow(demand[l], b.demand_power);
    if (!std::isfinite(tempered) || tempered <= 0) {
      return InvalidArgument("budget.demand_power: got ", b.demand_power, ", which takes layer ", l,
                             "'s demand ", demand[l], " of \"", b.profile, "\" to ", tempered,
                             "; expected a power that keeps every demand finite and > 0");
    }
    demand[l] = tempered;
  }
  return demand;
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
  KVCTL_ASSIGN_OR_RETURN(const std::vector<FullHead> full, ParseFullHeads(c.evict.full_heads));
  if (!full.empty() && b.mode != BudgetMode::kEvictOnly) {
    return InvalidArgument("evict.full_heads: got \"", c.evict.full_heads,
                           "\", expected \"\" unless budget.mode = \"evict-only\" (joint fixes "
                           "every head's budget; the other modes do not evict)");
  }
  if (b.mode == BudgetMode::kJoint) return ValidateJoint(c);
  if (b.bytes != 0) {
    return InvalidArgument("budget.bytes: got ", FormatByteSize(b.bytes),
                           ", expected 0 unless budget.mode = \"joint\" (evict-only budgets "
                           "tokens or memory: budget.tokens_per_head, budget.token_fraction or "
                           "budget.fp16_fraction; quant-only "
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
    KVCTL_RETURN_IF_ERROR(LoadBudgetProfile(b.profile).status());
  }
  return OkStatus();
}

}  // namespace kvctl
