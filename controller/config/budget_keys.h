// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/config/budget_keys.h
// [budget] and [evict] beyond single keys: the cross-key checks ValidateConfig runs (mode against
// the keys it needs, the OScaR refusal, the profile file), and the derived values both the checks
// and a new sequence's settings (controller/sequence/budget_resolve.h) are computed from.
// docs/budgets.md describes the modes.
//
// Thread safety: safe to call from any thread. The profile file (read at config load, SIGHUP and
// OPEN) goes through a one-entry cache keyed by path, size and modification time.
//
//   KVCTL_RETURN_IF_ERROR(ValidateBudgetConfig(config));
#ifndef KVCTL_CONTROLLER_CONFIG_BUDGET_KEYS_H_
#define KVCTL_CONTROLLER_CONFIG_BUDGET_KEYS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/config/config.h"
#include "policies/calib_profile.h"

namespace kvctl {

// Checks the [budget]/[evict] keys against each other and against every quantizer scope ([quant]
// and each [[model]]). Errors name the key, its value and what was expected.
Status ValidateBudgetConfig(const Config& config);

// The kvcalib profile budget.profile names, with errors naming that key. Every OPEN reads it, so
// the last one parsed is kept (an edited file is read again).
StatusOr<CalibProfile> LoadBudgetProfile(const std::string& path);

// The per-layer demand of the [reasonalloc] table of budget.profile, each raised to
// budget.demand_power. INVALID_ARGUMENT naming budget.demand_power when a tempered demand is not
// finite and > 0.
StatusOr<std::vector<double>> LoadLayerDemand(const BudgetConfig& b);

// evict.obs_window and evict.window with their 0 = "the policy's default" resolved.
int64_t EffectiveObsWindow(const EvictConfig& evict);
int64_t EffectiveWindow(const EvictConfig& evict);

// evict.full_heads parsed: "layer:head" entries separated by commas (spaces around them allowed),
// layer 0..4095, head 0..1023, none repeated; "" = none. INVALID_ARGUMENT naming the key, the
// entry and what was expected. Whether they exist in a session's geometry is checked at OPEN.
struct FullHead {
  int layer = 0;
  int head = 0;
};
StatusOr<std::vector<FullHead>> ParseFullHeads(std::string_view text);

// quant-only's average bits per element: budget.avg_bits, or 16 x budget.fp16_fraction.
double QuantOnlyBits(const BudgetConfig& budget);

// Per-head minimum kept tokens: budget.floor or the starvation floor, never below the protected
// sinks + window. The joint planner plans with the same floor, so no cap is raised after planning.
int64_t EvictionFloor(const Config& config, int64_t sinks);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_CONFIG_BUDGET_KEYS_H_
