// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "policies/reasonalloc.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace kvctl {
namespace {

using Catch::Matchers::Contains;

int64_t Sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), 0LL); }

TEST_CASE("ReasonAlloc: coverage and entropy sizes", "[policies]") {
  const std::vector<double> a = {0.1, 0.5, 0.05, 0.3, 0.05};
  // Sorted 0.5, 0.3, 0.1, ...: 0.8 after two, 0.9 after three.
  CHECK(*CoverageSize(a) == 3);
  CHECK(*CoverageSize(a, 0.8) == 2);
  CHECK(*CoverageSize(a, 0.5) == 1);
  CHECK(*CoverageSize(a, 1.0) == 5);
  // Unnormalised input gives the same answer.
  CHECK(*CoverageSize(std::vector<double>{1, 5, 0.5, 3, 0.5}) == 3);
  // 0.5 + 0.4 is 0.9 up to rounding: two tokens, not three.
  CHECK(*CoverageSize(std::vector<double>{0.5, 0.4, 0.1}) == 2);
  CHECK(*EntropySize(std::vector<double>{1, 1, 1, 1}) == Approx(4));
  CHECK(*EntropySize(std::vector<double>{0.5, 0.5, 0, 0}) == Approx(2));

  CHECK_THAT(CoverageSize({}).status().ToString(), Contains("attention: empty"));
  CHECK_THAT(CoverageSize(std::vector<double>{0, 0}).status().ToString(),
             Contains("attention: all zero"));
  CHECK_THAT(CoverageSize(std::vector<double>{1, -1}).status().ToString(),
             Contains("attention[1]: got -1"));
  CHECK_THAT(CoverageSize(a, 0).status().ToString(), Contains("tau: got 0"));
}

TEST_CASE("ReasonAlloc: layer demand is the mean coverage per layer", "[policies]") {
  auto cal = LayerDemandCalibrator::Create(2);
  REQUIRE(cal.ok());
  REQUIRE(cal->AddAttention(0, std::vector<double>{0.5, 0.4, 0.1}).ok());  // 2
  REQUIRE(cal->AddAttention(0, std::vector<double>{1, 0, 0}).ok());        // 1
  CHECK(cal->Demand().status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(cal->Demand().status().message(), Contains("layer 1: no calibration samples"));
  REQUIRE(cal->AddAttention(1, std::vector<double>(10, 0.1)).ok());  // 9
  auto demand = cal->Demand();
  REQUIRE(demand.ok());
  CHECK(*demand == std::vector<double>{1.5, 9});
  CHECK(cal->samples(0) == 2);
  CHECK_THAT(cal->AddAttention(2, std::vector<double>{1}).ToString(),
             Contains("layer: got 2, expected 0..1"));

  auto ent = LayerDemandCalibrator::Create(1, 0.9, DemandMeasure::kEntropy);
  REQUIRE(ent.ok());
  REQUIRE(ent->AddAttention(0, std::vector<double>{1, 1}).ok());
  REQUIRE(ent->AddAttention(0, std::vector<double>{1, 1, 1, 1}).ok());
  CHECK((*ent->Demand())[0] == Approx(3));
}

TEST_CASE("ReasonAlloc: layer budgets are proportional, floored and sum exactly", "[policies]") {
  // L = 4, H = 2, B = 100, floor 50: 800 tokens over demand (1, 2, 3, 10), layer floor 100.
  // Round 1: shares (50, 100, 150, 500): layer 0 < 100 is pinned. Round 2: 700 over (2, 3, 10):
  // (93.3, 140, 466.7): layer 1 pinned. Round 3: 600 over (3, 10): (138.46, 461.54), both free.
  // Largest remainder: 138 + 462 (0.54 > 0.46).
  auto b = DemandLayerBudgets(std::vector<double>{1, 2, 3, 10}, 2, 100, 50);
  REQUIRE(b.ok());
  CHECK(*b == std::vector<int64_t>{100, 100, 138, 462});
  CHECK(Sum(*b) == 4 * 2 * 100);
  // Floor 0 is plain proportional; zero demand gets zero.
  auto p = DemandLayerBudgets(std::vector<double>{0, 1, 1, 2}, 3, 10, 0);
  REQUIRE(p.ok());
  CHECK(*p == std::vector<int64_t>{0, 30, 30, 60});

  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t layers = 1 + rng() % 40, heads = 1 + rng() % 8, avg = 1 + rng() % 600;
    const int64_t floor = rng() % (avg + 1);
    std::vector<double> demand(layers);
    for (double& d : demand) d = rng() % 5 == 0 ? 0.0 : std::pow(u(rng), 3) * 500;
    demand[rng() % layers] += 1;
    auto budgets = DemandLayerBudgets(demand, heads, avg, floor);
    REQUIRE(budgets.ok());
    REQUIRE(Sum(*budgets) == layers * heads * avg);
    for (int64_t v : *budgets) REQUIRE(v >= heads * floor);
  }

  CHECK(*UniformLayerBudgets(3, 2, 64) == std::vector<int64_t>{128, 128, 128});
  CHECK_THAT(DemandLayerBudgets(std::vector<double>{1, 1}, 2, 100, 101).status().ToString(),
             Contains("floor: got 101, expected 0..100"));
  CHECK_THAT(DemandLayerBudgets(std::vector<double>{0, 0}, 2, 100, 10).status().ToString(),
             Contains("demand: all zero"));
  CHECK_THAT(DemandLayerBudgets({}, 2, 100, 10).status().ToString(), Contains("demand: empty"));
  CHECK_THAT(UniformLayerBudgets(0, 2, 64).status().ToString(), Contains("layers: got 0"));
}

TEST_CASE("ReasonAlloc: a layer cannot keep more than it holds", "[policies]") {
  // Demand (1, 1, 8) over 3 layers of 2 heads at 100 tokens each: the last layer's share 480 is
  // over what 2 heads x 150 tokens seen hold (300); its 180 surplus goes to the others evenly.
  const std::vector<double> demand = {1, 1, 8};
  auto b = DemandLayerBudgets(demand, 2, 100, 10);
  REQUIRE(b.ok());
  CHECK(*b == std::vector<int64_t>{60, 60, 480});
  REQUIRE(CapLayerBudgets(demand, 300, &*b).ok());
  CHECK(*b == std::vector<int64_t>{150, 150, 300});
  // A cascade: the surplus pushes a second layer over its cap; the total is kept while it fits.
  std::vector<int64_t> c = {10, 200, 390};
  REQUIRE(CapLayerBudgets(std::vector<double>{1, 3, 6}, 250, &c).ok());
  CHECK(c == std::vector<int64_t>{100, 250, 250});
  // More than every layer can hold: all capped, the rest is not kept anywhere.
  std::vector<int64_t> d = {400, 400};
  REQUIRE(CapLayerBudgets(std::vector<double>{1, 1}, 300, &d).ok());
  CHECK(d == std::vector<int64_t>{300, 300});
  CHECK_THAT(CapLayerBudgets(std::vector<double>{1}, 300, &d).ToString(),
             Contains("weight: got 1"));
  CHECK_THAT(CapLayerBudgets(std::vector<double>{1, -1}, 300, &d).ToString(),
             Contains("weight[1]: got -1"));
}

TEST_CASE("ReasonAlloc: greedy head budgets follow the retained mass", "[policies]") {
  // Two heads, 4 protected tokens each (min_budget 4), masses in 64ths so every gain is exact.
  // Head 0 holds its mass in few tokens (increments 16, 4, 1, 1, 1, 1), head 1 spreads it (4 each).
  auto curve = [](std::vector<double> in64) {
    for (double& v : in64) v /= 64;
    return RetainedMassCurve{.min_budget = 4, .retained = in64};
  };
  const std::vector<RetainedMassCurve> curves = {curve({32, 48, 52, 53, 54, 55, 56}),
                                                 curve({8, 12, 16, 20, 24, 28, 32})};
  // Floor 4, layer budget 14: 6 tokens placed one at a time. h0 (16); tie 4/4 to the smaller
  // budget h1; tie at equal budgets to the lower head h0; then h1 (4 > 1) three times.
  auto b = GreedyHeadBudgets(curves, 14, 4, 1);
  REQUIRE(b.ok());
  CHECK(Sum(*b) == 14);
  CHECK(*b == std::vector<int64_t>{6, 8});
  // Past the curve's end (budget 10) a head is worth the rate of its last kept tokens: head 1's
  // 4/64 beats head 0's 1/64, so the surplus goes to head 1.
  auto far = GreedyHeadBudgets(curves, 30, 4, 1);
  REQUIRE(far.ok());
  CHECK(Sum(*far) == 30);
  CHECK((*far)[1] > 20);
  // With a reach (resident tokens + the next period's arrivals) head 1 stops at 12 and the rest
  // goes to head 0: a budget past what a head can hold would be memory nobody uses.
  auto reached = GreedyHeadBudgets(curves, 30, 4, 1, std::vector<int64_t>{40, 12});
  REQUIRE(reached.ok());
  CHECK(*reached == std::vector<int64_t>{18, 12});
  CHECK_THAT(GreedyHeadBudgets(curves, 30, 4, 1, std::vector<int64_t>{1}).status().ToString(),
             Contains("reach: got 1 values, expected 2"));
  // Flat curves (no mass anywhere) split evenly instead of piling onto one head.
  RetainedMassCurve none{.min_budget = 2, .retained = {1.0, 1.0, 1.0}};
  auto even = GreedyHeadBudgets(std::vector<RetainedMassCurve>{none, none, none}, 30, 2, 2);
  REQUIRE(even.ok());
  CHECK(*even == std::vector<int64_t>{10, 10, 10});
  CHECK_THAT(GreedyHeadBudgets(curves, 7, 4, 1).status().ToString(),
             Contains("layer_budget: got 7, expected >= 8"));
  CHECK_THAT(GreedyHeadBudgets(curves, 14, 4, 0).status().ToString(), Contains("step: got 0"));
  CHECK_THAT(GreedyHeadBudgets({}, 14, 4, 1).status().ToString(), Contains("curves: empty"));
}

TEST_CASE("ReasonAlloc: the Pyramid schedule matches the PyramidKV formula", "[policies]") {
  // C = 64, w = 8, beta = 20, L = 4: base 56, min 56/20 = 2, max 112 - 2 = 110, step 108/3 = 36,
  // caps (110, 74, 38, 2); budgets per head cap + 8, times H = 2.
  auto b =
      PyramidLayerBudgets({.layers = 4, .heads = 2, .capacity = 64, .window = 8, .seq_len = 1000});
  REQUIRE(b.ok());
  CHECK(*b == std::vector<int64_t>{236, 164, 92, 20});
  // T = 100: max 110 >= T - w = 92, so max = 92, min = 112 - 92 = 20, step 72/3 = 24:
  // caps (92, 68, 44, 20).
  auto clamped =
      PyramidLayerBudgets({.layers = 4, .heads = 1, .capacity = 64, .window = 8, .seq_len = 100});
  REQUIRE(clamped.ok());
  CHECK(*clamped == std::vector<int64_t>{100, 76, 52, 28});
  // Integer step: C = 40, w = 4: base 36, min 1, max 71, step 70/3 = 23, caps (71, 48, 25, 2)
  // sum 146 > 4 * 36 = 144.
  CHECK(*PyramidLayerBudgets(
            {.layers = 4, .heads = 1, .capacity = 40, .window = 4, .seq_len = 1000}) ==
        std::vector<int64_t>{75, 52, 29, 6});
  // Short sequences are not compressed; a single layer gets C.
  CHECK(
      *PyramidLayerBudgets({.layers = 2, .heads = 2, .capacity = 64, .window = 8, .seq_len = 50}) ==
      std::vector<int64_t>{100, 100});
  CHECK(*PyramidLayerBudgets(
            {.layers = 1, .heads = 2, .capacity = 64, .window = 8, .seq_len = 500}) ==
        std::vector<int64_t>{128});
  CHECK_THAT(
      PyramidLayerBudgets({.layers = 2, .heads = 1, .capacity = 8, .window = 8, .seq_len = 50})
          .status()
          .ToString(),
      Contains("pyramid.capacity: got 8, expected > window 8"));
}

TEST_CASE("ReasonAlloc: head reallocation sums exactly and respects the floor", "[policies]") {
  // H = 4, B = 100, window 8: floor max(16, 25) = 25, excess 400 - 100 = 300.
  CHECK(StarvationFloor(8, 100) == 25);
  CHECK(StarvationFloor(32, 100) == 40);
  auto r = HeadReallocator::Create({.heads = 4, .layer_budget = 400, .floor = 25});
  REQUIRE(r.ok());
  CHECK(r->budgets() == std::vector<int64_t>{100, 100, 100, 100});
  // Utility (1, 0, 0, 3): 25 + 300 * (1/4, 0, 0, 3/4).
  REQUIRE(r->Update(std::vector<double>{1, 0, 0, 3}).ok());
  CHECK(r->budgets() == std::vector<int64_t>{100, 25, 25, 250});
  // EMA 0.5 with (3, 1, 0, 0): u = (2, 0.5, 0, 1.5), shares 25 + 300 u / 4 =
  // (175, 62.5, 25, 137.5); the tied remainder goes to the lower head.
  REQUIRE(r->Update(std::vector<double>{3, 1, 0, 0}).ok());
  CHECK(r->smoothed_utility() == std::vector<double>{2, 0.5, 0, 1.5});
  CHECK(r->budgets() == std::vector<int64_t>{175, 63, 25, 137});

  // Starvation: a head that never earns utility stays at the floor, never below, and the layer
  // total is exact under any utilities.
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  auto s = HeadReallocator::Create({.heads = 7, .layer_budget = 7 * 128 + 3, .floor = 40});
  REQUIRE(s.ok());
  for (int step = 0; step < 200; ++step) {
    std::vector<double> util(7);
    for (double& x : util) x = std::pow(u(rng), 4) * 1e6;
    util[2] = 0;
    REQUIRE(s->Update(util).ok());
    REQUIRE(Sum(s->budgets()) == 7 * 128 + 3);
    for (int64_t b : s->budgets()) REQUIRE(b >= 40);
  }
  CHECK(s->budgets()[2] == 40);

  // A rejected update leaves the state alone.
  const auto before = r->budgets();
  CHECK_THAT(r->Update(std::vector<double>{1, 2}).ToString(),
             Contains("utility: got 2 values, expected 4"));
  CHECK_THAT(r->Update(std::vector<double>{1, -2, 0, 0}).ToString(),
             Contains("utility[1]: got -2"));
  CHECK(r->budgets() == before);
  CHECK_THAT(
      HeadReallocator::Create({.heads = 4, .layer_budget = 99, .floor = 25}).status().ToString(),
      Contains("layer_budget: got 99, expected >= 100"));
  CHECK(r->RefreshDue(256));
  CHECK_FALSE(r->RefreshDue(100));
}

TEST_CASE("ReasonAlloc: head utility is the mass won back by delta more tokens", "[policies]") {
  RetainedMassCurve curve{.min_budget = 2, .retained = {0.5, 0.7, 0.8, 0.85, 0.9}};
  CHECK(HeadUtility(curve, 3, 2) == Approx(0.85 - 0.7));
  CHECK(HeadUtility(curve, 5, 4) == Approx(0.9 - 0.85));  // Clamped at T.
  CHECK(HeadUtility(curve, 6, 4) == 0.0);
}

}  // namespace
}  // namespace kvctl
