// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// evict.full_heads: the named (layer, head) pairs keep every token, and the other heads share what
// is left of the same total (FullHeadsAverage); the key's parsing and the checks that refuse it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "controller/config/budget_keys.h"
#include "controller/config/config.h"
#include "controller/sequence/budget_resolve.h"
#include "controller/sequence/kv_sequence.h"
#include "tests/controller/sequence/evict_test_util.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl {
namespace {

using testing::Stream;

std::vector<LayerPlan> KiviPlans(int layers, int heads, int d) {
  std::vector<LayerPlan> plans(static_cast<size_t>(layers));
  for (LayerPlan& p : plans) {
    StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kKivi, d, 2, 2);
    REQUIRE(spec.ok());
    spec->block_tokens = spec->k_group_tokens = 8;
    REQUIRE(ValidateQuantSpec(*spec).ok());
    p.head_specs.assign(static_cast<size_t>(heads), *spec);
    p.rules = testing::PinnedRules(QuantMethod::kKivi);
    p.rules.flush_tokens = 16;
    p.rules.sink_tokens = 0;
  }
  return plans;
}

TEST_CASE("Full heads: parsed from \"layer:head\" lists, bad entries named",
          "[controller][evict]") {
  StatusOr<std::vector<FullHead>> got = ParseFullHeads(" 17:1, 20:2 ,0:0");
  REQUIRE(got.ok());
  REQUIRE(got->size() == 3);
  CHECK(((*got)[0].layer == 17 && (*got)[0].head == 1));
  CHECK(((*got)[1].layer == 20 && (*got)[1].head == 2));
  CHECK(((*got)[2].layer == 0 && (*got)[2].head == 0));
  CHECK(ParseFullHeads("").value().empty());
  CHECK(ParseFullHeads("  ").value().empty());
  for (const char* bad : {"17", "17:", ":1", "a:1", "1:b", "-1:0", "1:-1", "4096:0", "0:1024",
                          "99999:0", "1:1,", "1:1,,2:2", "1:1;2:2", "1:1:1", "+1:0"}) {
    INFO(bad);
    const Status s = ParseFullHeads(bad).status();
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("evict.full_heads") != std::string::npos);
  }
  const Status twice = ParseFullHeads("3:1,4:0,3:1").status();
  CHECK(twice.message().find("twice") != std::string::npos);
}

TEST_CASE(
    "Full heads: refused outside evict-only, with re-allocation or layer profiles, and past "
    "the session's geometry",
    "[controller][evict]") {
  Config c;
  c.budget.mode = BudgetMode::kEvictOnly;
  c.budget.token_fraction = 0.5;
  c.evict.policy = EvictPolicy::kSnapKV;
  c.evict.full_heads = "1:0";
  CHECK(ValidateBudgetConfig(c).ok());
  c.evict.full_heads = "1:x";
  CHECK(ValidateBudgetConfig(c).message().find("\"1:x\"") != std::string::npos);
  c.evict.full_heads = "1:0";
  c.budget.realloc_period = 32;
  CHECK(ValidateBudgetConfig(c).message().find("budget.realloc_period 32") != std::string::npos);
  c.budget.realloc_period = 0;
  c.budget.layer_profile = LayerProfile::kPyramid;
  CHECK(ValidateBudgetConfig(c).message().find("\"pyramid\"") != std::string::npos);
  c.budget.layer_profile = LayerProfile::kUniform;
  c.budget.mode = BudgetMode::kQuantOnly;
  CHECK(ValidateBudgetConfig(c).message().find("evict.full_heads") != std::string::npos);
  c.budget.mode = BudgetMode::kEvictOnly;

  const SequenceShape shape{.layers = 2, .kv_heads = 2, .q_heads = 4, .head_dim = 32};
  StatusOr<EvictionSettings> s = ResolveEviction(c, shape);
  REQUIRE(s.ok());
  CHECK(s->full_head == std::vector<uint8_t>{0, 0, 1, 0});
  c.evict.full_heads = "2:0";
  CHECK(ResolveEviction(c, shape).status().message().find("layer < 2") != std::string::npos);
  c.evict.full_heads = "1:2";
  CHECK(ResolveEviction(c, shape).status().message().find("head < 2") != std::string::npos);
  c.evict.full_heads = "0:0,0:1,1:0,1:1";
  CHECK(ResolveEviction(c, shape).status().message().find("at least one left") !=
        std::string::npos);
}

TEST_CASE("Full heads: the average left to the others keeps the total, never below the floor",
          "[controller][evict]") {
  EvictionSettings s;
  s.floor = 12;
  CHECK(FullHeadsAverage(s, 90, 500, 1000) == 500);  // None named.
  s.full_head.assign(90, 0);
  std::fill(s.full_head.begin(), s.full_head.begin() + 9, uint8_t{1});
  // 90 x 500 = 45,000 in all; 9 x 1,000 kept whole leave 36,000 for 81 heads.
  CHECK(FullHeadsAverage(s, 90, 500, 1000) == 444);
  CHECK(FullHeadsAverage(s, 90, 100, 1000) == 12);  // 9,000 - 9,000: the floor.
  CHECK(FullHeadsAverage(s, 90, int64_t{1} << 40, int64_t{1} << 62) == 12);  // No overflow.
}

TEST_CASE("Full heads: named heads keep every token, the others share the rest of the budget",
          "[controller][evict]") {
  // The appends below add up to 166 tokens (a stream of 160 read past its end).
  const int layers = 2, kv_heads = 2, q_heads = 4, d = 32, total = 166;
  const Stream s(layers, total, kv_heads, q_heads, d, 11);
  auto pool = testing::MakeTestPool(8 << 20, 4096);
  for (EvictPolicy policy : {EvictPolicy::kSnapKV, EvictPolicy::kStreaming, EvictPolicy::kRKV}) {
    for (bool stagger : {false, true}) {
      INFO("policy " << EvictPolicyName(policy) << ", stagger_layers " << stagger);
      EvictionSettings settings = testing::EvictOn(policy, 4, 8, 8);
      settings.tokens_per_head = 48;
      settings.compression_period = 4;
      // The daemon's default: a layer's scheduled turn must not cut its full head either.
      settings.stagger_layers = stagger;
      settings.full_head = {0, 0, 0, 1};  // Layer 1, head 1.
      KvSequence seq(pool.get(),
                     {.layers = layers,
                      .kv_heads = kv_heads,
                      .head_dim = d,
                      .dtype = DType::kF32,
                      .q_heads = q_heads},
                     KiviPlans(layers, kv_heads, d), settings);
      int t = 0;
      for (int n : {40, 1, 1, 1, 30, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                    1,  1, 1, 1, 1,  1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 50}) {
        REQUIRE(s.Append(seq, t, n, policy != EvictPolicy::kStreaming).ok());
        t += n;
        INFO("after token " << t);
        // The full head holds every token; the three others share 4 x 48 - t.
        const HeadUsage full = seq.HeadUsageOf(1, 1);
        CHECK(full.tokens == t);
        CHECK(full.compressions == 0);  // Never scored either.
        const int64_t others = FullHeadsAverage(settings, 4, 48, t);
        CHECK(others == std::max<int64_t>(12, (4 * 48 - t) / 3));
        int64_t kept = 0;
        for (int pair = 0; pair < 3; ++pair) {
          const HeadUsage u = seq.HeadUsageOf(pair / 2, pair % 2);
          CHECK(u.tokens <= u.budget);
          CHECK(u.budget == others);
          kept += u.tokens;
        }
        CHECK(seq.LayerBudget(0) == 2 * others);
        CHECK(seq.LayerBudget(1) == others);
        if (4 * 48 - t >= 3 * 12) CHECK(kept + full.tokens <= 4 * 48);
      }
      CHECK(seq.Usage().evicted_tokens > 0);
    }
  }
}

}  // namespace
}  // namespace kvctl
