// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// How [budget] and [evict] resolve into a sequence's EvictionSettings (ResolveEviction): the
// scorers' reductions, the layer split by demand and its power, and the checks that name a bad
// key, its value and what was expected.
#include "controller/sequence/budget_resolve.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "controller/config/config.h"
#include "controller/sequence/eviction_driver.h"
#include "tests/controller/sequence/evict_test_util.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl {
namespace {

using testing::WithToml;

TEST_CASE("Eviction: demand layer budgets never exceed what a layer holds", "[controller][evict]") {
  // Demand (1, 1, 8), 2 heads, average 100 after 150 tokens: the third layer's proportional 480
  // passes the 300 its two heads hold; the surplus goes to the others and the total stays 600.
  EvictionSettings s;
  s.enabled = true;
  s.layer_profile = LayerProfile::kDemand;
  s.demand = {1, 1, 8};
  s.floor = 10;
  auto b = LayerBudgets(s, 3, 2, 100, 150);
  REQUIRE(b.ok());
  CHECK(*b == std::vector<int64_t>{150, 150, 300});
  // Early on (30 tokens) every layer is capped at 60: nothing is evicted yet anyway.
  auto early = LayerBudgets(s, 3, 2, 100, 30);
  REQUIRE(early.ok());
  CHECK(*early == std::vector<int64_t>{60, 60, 60});
}

TEST_CASE("Eviction: budget.demand_power softens or sharpens the demand split",
          "[controller][evict]") {
  // Demand (1, 4, 16): power 1 keeps it, 0.5 takes square roots (1, 2, 4), 0 makes it uniform.
  const std::string path = testing::WriteTwoHeadDemandProfile({1, 4, 16});
  const SequenceShape shape{.layers = 3, .kv_heads = 2, .q_heads = 4, .head_dim = 32};
  for (auto [power, want] :
       {std::pair{1.0, std::vector<double>{1, 4, 16}}, std::pair{0.5, std::vector<double>{1, 2, 4}},
        std::pair{0.0, std::vector<double>{1, 1, 1}}}) {
    INFO("power " << power);
    Config c;
    c.budget.mode = BudgetMode::kEvictOnly;
    c.budget.tokens_per_head = 100;
    c.budget.layer_profile = LayerProfile::kDemand;
    c.budget.profile = path;
    c.budget.demand_power = power;
    c.evict.policy = EvictPolicy::kSnapKV;
    StatusOr<EvictionSettings> s = ResolveEviction(c, shape);
    INFO(s.status().message());
    REQUIRE(s.ok());
    CHECK(s->demand == want);
    // Square roots: layer shares 1 : 2 : 4 of 600 tokens past the floors, none capped at 1000
    // tokens seen.
    if (power == 0.5) {
      auto b = LayerBudgets(*s, 3, 2, 100, 1000);
      REQUIRE(b.ok());
      CHECK((*b)[0] < (*b)[1]);
      CHECK((*b)[1] < (*b)[2]);
      CHECK((*b)[0] + (*b)[1] + (*b)[2] == 600);
    }
  }
  std::remove(path.c_str());
  // A power that rounds a demand to 0 (1e-200^2; the profile bounds demand to (0, 1e18], so no
  // power up to 4 overflows one) is refused at load, naming the key, not at the first APPEND.
  {
    const std::string extreme = testing::WriteTwoHeadDemandProfile({1e-200, 1, 1});
    Config c = WithToml(
        "[budget]\nmode = \"evict-only\"\ntokens_per_head = 100\nlayer_profile = "
        "\"demand\"\ndemand_power = 2.0\nprofile = \"" +
        extreme + "\"\n[evict]\npolicy = \"snapkv\"\n");
    const Status invalid = ValidateConfig(c);
    INFO(invalid.message());
    CHECK(invalid.code() == StatusCode::kInvalidArgument);
    CHECK(invalid.message().find("budget.demand_power: got 2, which takes layer 0's demand") !=
          std::string::npos);
    CHECK(ResolveEviction(c, shape).status().code() == StatusCode::kInvalidArgument);
    std::remove(extreme.c_str());
  }
}

TEST_CASE("Eviction: snapkv resolves to SnapKV's reduction, rkv to R-KV's, both switchable",
          "[controller][evict]") {
  Config c;
  c.budget.mode = BudgetMode::kEvictOnly;
  c.budget.tokens_per_head = 256;
  c.evict.policy = EvictPolicy::kSnapKV;
  const SequenceShape shape{.layers = 2, .kv_heads = 2, .q_heads = 4, .head_dim = 32};
  auto s = ResolveEviction(c, shape);
  REQUIRE(s.ok());
  CHECK(s->snapkv.group == GqaReduce::kMeanProb);
  CHECK(s->snapkv.softmax == SoftmaxScope::kCausal);
  CHECK(s->rkv.group == GqaReduce::kMaxLogit);
  CHECK(s->rkv.softmax == SoftmaxScope::kCandidates);
  CHECK(!s->realloc_greedy);
  c.evict.group = EvictGroup::kMax;
  c.evict.softmax = EvictSoftmax::kCandidates;
  c.budget.realloc_split = ReallocSplit::kGreedy;
  s = ResolveEviction(c, shape);
  REQUIRE(s.ok());
  CHECK(s->snapkv.group == GqaReduce::kMaxLogit);
  CHECK(s->snapkv.softmax == SoftmaxScope::kCandidates);
  CHECK(s->realloc_greedy);
  c.evict.group = EvictGroup::kMean;
  c.evict.softmax = EvictSoftmax::kCausal;
  s = ResolveEviction(c, shape);
  REQUIRE(s.ok());
  CHECK(s->rkv.group == GqaReduce::kMeanProb);
  CHECK(s->rkv.softmax == SoftmaxScope::kCausal);
}

TEST_CASE("Budget config: bad combinations name the key, the value and what was expected",
          "[controller][config][evict]") {
  for (const auto& [toml, part] : std::vector<std::pair<std::string, std::string>>{
           {"[budget]\nmode = \"evict-only\"\n", "budget.tokens_per_head: got 0"},
           {"[budget]\nmode = \"evict-only\"\ntokens_per_head = 64\ntoken_fraction = 0.5\n",
            "budget.token_fraction 0.5 and budget.fp16_fraction 0, expected exactly one"},
           {"[budget]\nmode = \"evict-only\"\ntoken_fraction = 0.5\nfp16_fraction = 0.125\n",
            "budget.fp16_fraction 0.125, expected exactly one of them > 0"},
           {"[budget]\nmode = \"evict-only\"\nfp16_fraction = 0.125\navg_bits = 3.0\n",
            "expected 0 with budget.mode = \"evict-only\" (its widths are [quant]'s"},
           {"[budget]\nmode = \"joint\"\n", "budget.bytes: got 0B and budget.fp16_fraction 0"},
           {"[budget]\nmode = \"joint\"\nbytes = \"1MiB\"\n", "budget.plan_tokens: got 0"},
           {"[budget]\nmode = \"joint\"\nbytes = \"1MiB\"\nplan_tokens = 512\n",
            "budget.profile: got \"\""},
           {"[budget]\nbytes = \"1MiB\"\n", "budget.bytes: got 1MiB, expected 0 unless"},
           {"[budget]\nmode = \"evict-only\"\ntokens_per_head = 64\n[quant]\nmethod = \"oscar\"\n",
            "cannot run with quant.method = \"oscar\""},
           {"[budget]\nmode = \"evict-only\"\ntokens_per_head = 64\n[evict]\npolicy = "
            "\"snapkv\"\nwindow = 16\n",
            "evict.obs_window: got 32, expected at most evict.window 16"},
           {"[budget]\nmode = \"evict-only\"\ntokens_per_head = 64\n[evict]\nkernel = 4\n",
            "evict.kernel: got 4, expected an odd number"},
           {"[budget]\nmode = \"evict-only\"\ntokens_per_head = 10\n",
            "budget.tokens_per_head: got 10, expected at least evict.sinks + evict.window = 12"},
           {"[budget]\nmode = \"evict-only\"\ntokens_per_head = 64\nrealloc_period = 16\n",
            "budget.realloc_period: got 16, expected 0 with evict.policy = \"streaming\""},
           {"[budget]\nmode = \"evict-only\"\ntokens_per_head = 64\nlayer_profile = \"demand\"\n",
            "budget.layer_profile: got \"demand\", expected budget.profile"},
           {"[budget]\nmode = \"evict-only\"\ntokens_per_head = 64\nlayer_profile = "
            "\"demand\"\nprofile = \"/nonexistent/p.toml\"\n",
            "/nonexistent/p.toml"},
           {"[budget]\nmode = \"quant-only\"\n", "budget.avg_bits: got 0"},
           {"[budget]\nmode = \"quant-only\"\navg_bits = 3.0\n", "budget.profile: got \"\""},
           {"[evict]\npolicy = \"lru\"\n", "evict.policy: got \"lru\", expected one of streaming"},
       }) {
    INFO(toml);
    Config c;
    Status s = ApplyToml(c, toml, "t.toml");
    if (s.ok()) s = ValidateConfig(c);
    CHECK(!s.ok());  // INVALID_ARGUMENT, or NOT_FOUND for a profile file that is not there.
    CHECK(s.message().find(part) != std::string::npos);
  }
  // A good evict-only config resolves against a session; kvarn's 128 fp16 sinks raise the floor.
  Config c = WithToml(
      "[budget]\nmode = \"evict-only\"\ntokens_per_head = 64\n[evict]\npolicy = "
      "\"h2o\"\n");
  REQUIRE(ValidateConfig(c).ok());
  StatusOr<EvictionSettings> s = ResolveEviction(c, {2, 2, 4, 64, 0});
  REQUIRE(s.ok());
  CHECK(s->enabled);
  CHECK(s->sinks == 4);
  CHECK(s->window == 8);
  CHECK(s->floor == 16);  // max(window + 8, 64 / 4).
  const Status kvarn = ResolveEviction(c, {2, 2, 4, 64, 128}).status();
  CHECK(kvarn.message().find("budget.tokens_per_head: got 64, expected at least 136") !=
        std::string::npos);
  const Status no_q = ResolveEviction(c, {2, 2, 0, 64, 0}).status();
  CHECK(no_q.message().find("q_heads: got 0") != std::string::npos);
  // Defaults keep today's behaviour: nothing evicts.
  StatusOr<EvictionSettings> none = ResolveEviction(Config(), {2, 2, 0, 64, 0});
  REQUIRE(none.ok());
  CHECK(!none->enabled);
}

TEST_CASE("Eviction: budget.fp16_fraction aims evict-only at a share of fp16 memory",
          "[controller][evict]") {
  // TurboQuant K4/V3, head_dim 64, 32-token records: 1,024 + 64 bytes of K and 768 + 64 of V per
  // record, 60 bytes a token against 256 for the fp16 K and V rows. At 1/8: a kept token costs
  // 60, so f = 0.125 x 256 / 60 = 0.5333; the mean fp16 tail of a 64-token flush (32 rows) costs
  // 32 x (256 - 60) = 6,272 bytes more than as records, 105 kept tokens (rounded up).
  Config c = WithToml(
      "[quant]\nmethod = \"turbo\"\nk_bits = 4\nv_bits = 3\nflush_tokens = 64\n[budget]\nmode = "
      "\"evict-only\"\nfp16_fraction = 0.125\n[evict]\npolicy = \"rkv\"\n");
  REQUIRE(ValidateConfig(c).ok());
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kTurbo, 64, 4, 3);
  REQUIRE(spec.ok());
  REQUIRE(BlockLayoutOf(*spec).record_bytes == 1920);
  std::vector<LayerPlan> plans(3);
  for (LayerPlan& p : plans) {
    p.head_specs.assign(2, *spec);
    p.rules = {.sink_tokens = 0, .flush_tokens = 64};
  }
  StatusOr<EvictionSettings> s = ResolveEviction(c, {3, 2, 6, 64, 0});
  REQUIRE(s.ok());
  CHECK(s->token_fraction == 0);  // Nothing until the plans are known.
  AimEvictionAtMemory(c, plans, 64, DType::kF16, &*s);
  CHECK(s->token_fraction == Approx(0.125 * 256.0 / 60.0));
  CHECK(s->fraction_offset == 105);
  CHECK(AverageBudget(*s, 2048) == 1093 - 105);
  CHECK(AverageBudget(*s, 8192) == 4370 - 105);
  // What those budgets hold: records for all but the mean tail, the tail as fp16 rows, against
  // 1/8 of the fp16 rows of every token seen (within one token's bytes).
  for (int64_t t : {2048, 8192, 65536}) {
    const double held = (AverageBudget(*s, t) - 32) * 60.0 + 32 * 256.0;
    CHECK(std::abs(held - 0.125 * 256.0 * static_cast<double>(t)) <= 256.0);
  }
  // Early on the floor rules (a short sequence keeps its protected tokens).
  CHECK(AverageBudget(*s, 64) == s->floor);
  // Lossless layers keep rows in the session dtype: their kept tokens cost those rows.
  for (LayerPlan& p : plans) p.lossless = true;
  EvictionSettings lossless = *ResolveEviction(c, {3, 2, 6, 64, 0});
  AimEvictionAtMemory(c, plans, 64, DType::kF16, &lossless);
  CHECK(lossless.token_fraction == Approx(0.125));
  CHECK(lossless.fraction_offset == 0);
  // Other modes and budgets are left alone.
  Config by_tokens = WithToml(
      "[budget]\nmode = \"evict-only\"\ntoken_fraction = 0.5\n[evict]\npolicy = \"rkv\"\n");
  EvictionSettings fraction = *ResolveEviction(by_tokens, {3, 2, 6, 64, 0});
  AimEvictionAtMemory(by_tokens, plans, 64, DType::kF16, &fraction);
  CHECK(fraction.token_fraction == 0.5);
  CHECK(fraction.fraction_offset == 0);
}

}  // namespace
}  // namespace kvctl
