// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The override tables a RateQuant plan writes go through the daemon's own config loader and
// resolve, per (layer, head), to the planned widths.
#include <catch2/catch.hpp>
#include <cmath>

#include "controller/config/config.h"
#include "policies/ratequant.h"

namespace kvctl {
namespace {

TEST_CASE("RateQuant config: the daemon accepts the plan's overrides", "[policies][config]") {
  RateQuantFit fit;
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kOscar, 64, 2, 2);
  REQUIRE(spec.ok());
  fit.spec = *spec;
  fit.layers = 5;
  fit.kv_heads = 3;
  fit.bits = {2, 3, 4, 8};
  fit.beta = fit.beta_k = fit.beta_v = 4.2;
  for (int i = 0; i < 2 * 5 * 3; ++i) {
    RateQuantUnit u;
    u.layer = i / 6;
    u.head = i / 2 % 3;
    u.kind = i % 2 ? UnitKind::kValue : UnitKind::kKey;
    u.alpha = std::pow(1.7, i % 11);
    fit.units.push_back(u);
  }
  StatusOr<RateQuantPlan> plan = PlanRateQuant(fit, {.budget_bpe = 4.6});
  REQUIRE(plan.ok());
  bool mixed = false;
  for (const HeadPlan& h : plan->heads) mixed |= h.k_bits != plan->heads[0].k_bits;
  REQUIRE(mixed);

  Config config;
  const std::string text =
      "[quant]\nmethod = \"oscar\"\nk_bits = 2\nv_bits = 2\n\n" + FormatOverridesToml(*plan);
  Status applied = ApplyToml(config, text, "plan.toml");
  INFO(applied.ToString());
  REQUIRE(applied.ok());
  REQUIRE(ValidateConfig(config).ok());
  REQUIRE(config.quant_overrides.size() == plan->heads.size());
  for (const HeadPlan& h : plan->heads) {
    StatusOr<QuantSpec> s = ResolveQuantSpec(config, "any-model", 64, h.layer, h.head);
    REQUIRE(s.ok());
    CHECK(s->method == QuantMethod::kOscar);
    CHECK(s->k_bits == h.k_bits);
    CHECK(s->v_bits == h.v_bits);
    CHECK(s->block_tokens == plan->spec.block_tokens);
  }
}

}  // namespace
}  // namespace kvctl
