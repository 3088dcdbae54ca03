// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// RateQuant allocation: the integer solvers and water-filling against brute force, budgets and
// bounds, monotonicity, the registry cost table, plans, mismatch and the override TOML.
#include "policies/ratequant.h"

#include <toml++/toml.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

namespace kvctl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct BruteForce {
  double distortion = kInf;
  double cost = 0;
};

// Enumerates every assignment of levels to units.
BruteForce Enumerate(const AllocationProblem& p) {
  BruteForce best;
  std::vector<int> level(static_cast<size_t>(p.units), 0);
  while (true) {
    double cost = 0, distortion = 0;
    for (int i = 0; i < p.units; ++i) {
      cost += p.cost[static_cast<size_t>(i) * p.levels + level[static_cast<size_t>(i)]];
      distortion += p.distortion[static_cast<size_t>(i) * p.levels + level[static_cast<size_t>(i)]];
    }
    if (cost <= p.budget + 1e-9 && distortion < best.distortion) best = {distortion, cost};
    int i = 0;
    while (i < p.units && ++level[static_cast<size_t>(i)] == p.levels)
      level[static_cast<size_t>(i++)] = 0;
    if (i == p.units) break;
  }
  return best;
}

// A problem shaped like a plan: units alternate K and V costs of a real registry spec, distortion
// w * alpha * beta^-b with per-unit slopes (or an arbitrary decreasing table).
AllocationProblem RandomProblem(std::mt19937_64& rng, int units, const std::vector<int>& bits,
                                const UnitCosts& costs, bool arbitrary_tables) {
  std::uniform_real_distribution<double> u01(0, 1);
  AllocationProblem p;
  p.units = units;
  p.levels = static_cast<int>(bits.size());
  double lo = 0, hi = 0;
  for (int i = 0; i < units; ++i) {
    const std::vector<double>& c = i % 2 == 0 ? costs.k : costs.v;
    const double alpha = std::pow(10.0, -3 + 4 * u01(rng));
    const double beta = 1.5 + 4.5 * u01(rng);
    const double w = std::pow(10.0, -1 + 2 * u01(rng));
    double d = w * alpha;
    for (int l = 0; l < p.levels; ++l) {
      p.cost.push_back(c[static_cast<size_t>(l)]);
      if (arbitrary_tables) {
        d *= 0.05 + 0.9 * u01(rng);  // Decreasing, not convex.
        p.distortion.push_back(d);
      } else {
        p.distortion.push_back(w * alpha * std::pow(beta, -bits[static_cast<size_t>(l)]));
      }
    }
    lo += c.front();
    hi += c.back();
  }
  p.budget = lo + (hi - lo) * u01(rng);
  return p;
}

UnitCosts Costs(QuantMethod method, int head_dim, int heads, const std::vector<int>& bits) {
  StatusOr<QuantSpec> spec = MakeQuantSpec(method, head_dim, bits[0], bits[0]);
  REQUIRE(spec.ok());
  StatusOr<UnitCosts> c = UnitCostTable(*spec, heads, bits);
  REQUIRE(c.ok());
  return *c;
}

TEST_CASE("RateQuant: exact integer allocation equals brute force on gapped bit sets",
          "[policies]") {
  std::mt19937_64 rng(7);
  const std::vector<std::vector<int>> sets = {{2, 3, 4, 8}, {2, 4, 8}, {2, 3, 4}, {3, 8}};
  const QuantMethod methods[] = {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn,
                                 QuantMethod::kOscar};
  int greedy_misses = 0, refined = 0, cases = 0;
  for (const auto& bits : sets) {
    for (QuantMethod m : methods) {
      const UnitCosts costs = Costs(m, 64, 3, bits);
      for (int trial = 0; trial < 60; ++trial) {
        const bool arbitrary = trial % 3 == 2;
        const AllocationProblem p = RandomProblem(rng, 6, bits, costs, arbitrary);
        const BruteForce best = Enumerate(p);
        StatusOr<IntegerAllocation> exact = SolveIntegerAllocation(p, IntegerSolver::kExact);
        StatusOr<IntegerAllocation> greedy = SolveIntegerAllocation(p, IntegerSolver::kGreedy);
        REQUIRE(exact.ok());
        REQUIRE(greedy.ok());
        INFO("bits " << bits.size() << " method " << QuantMethodName(m) << " trial " << trial);
        CHECK(exact->exact);
        CHECK(exact->distortion == Approx(best.distortion).epsilon(1e-12));
        CHECK(exact->cost <= p.budget + 1e-9);
        // The greedy answer is feasible, never better than the optimum, and its certified bound
        // really is below the optimum.
        CHECK(greedy->cost <= p.budget + 1e-9);
        CHECK(greedy->distortion >= best.distortion * (1 - 1e-12));
        CHECK(greedy->lower_bound <= best.distortion * (1 + 1e-12));
        if (greedy->distortion > best.distortion * (1 + 1e-9)) ++greedy_misses;
        if (exact->free_units > 0) ++refined;
        ++cases;
      }
    }
  }
  // The instances must exercise the DP: greedy alone misses the optimum on a good share of them.
  INFO("greedy missed " << greedy_misses << " of " << cases << ", DP ran on " << refined);
  CHECK(greedy_misses > cases / 20);
  CHECK(refined >= greedy_misses);
}

TEST_CASE("RateQuant: greedy is optimal when steps cost one bit and curves are convex",
          "[policies]") {
  // Allowed {2, 3, 4}: every step costs exactly one bit for every unit, the curves are convex,
  // so the greedy heap is exact for any budget on the bit grid.
  std::mt19937_64 rng(11);
  const std::vector<int> bits = {2, 3, 4};
  const UnitCosts costs = Costs(QuantMethod::kKivi, 128, 8, bits);
  for (int trial = 0; trial < 100; ++trial) {
    AllocationProblem p = RandomProblem(rng, 6, bits, costs, false);
    p.budget = 6 * 3.0 + std::floor((p.budget - 6 * 3.0));  // Whole bits above the minimum.
    StatusOr<IntegerAllocation> greedy = SolveIntegerAllocation(p, IntegerSolver::kGreedy);
    REQUIRE(greedy.ok());
    CHECK(greedy->distortion == Approx(Enumerate(p).distortion).epsilon(1e-12));
  }
}

TEST_CASE("RateQuant: exact solver falls back to the certified greedy when the DP is too big",
          "[policies]") {
  // 20000 identical units: at the critical multiplier every unit is indifferent between 4 and 8
  // bits, so reduced-cost fixing frees them all and the DP would need 20000 x 1501 cells (one
  // quantum = the 4-bit step).
  const int n = 20000;
  AllocationProblem p;
  p.units = n;
  p.levels = 4;
  for (int i = 0; i < n; ++i) {
    for (int b : {2, 3, 4, 8}) {
      p.cost.push_back(b + 1.0);
      p.distortion.push_back(std::pow(4.33, -b));
    }
  }
  p.budget = 5.3 * n + 2;  // Two bits more than a whole number of 4 -> 8 steps.
  StatusOr<IntegerAllocation> a = SolveIntegerAllocation(p, IntegerSolver::kExact);
  REQUIRE(a.ok());
  CHECK_FALSE(a->exact);
  CHECK(a->free_units == n);
  CHECK(a->cost == 5.3 * n);
  CHECK(a->lower_bound <= a->distortion);
  CHECK(a->distortion - a->lower_bound < 1e-4 * a->distortion);  // Certified near-optimal.
}

TEST_CASE("RateQuant: integer allocation spends the budget and respects levels", "[policies]") {
  std::mt19937_64 rng(3);
  const std::vector<int> bits = {2, 3, 4, 8};
  const UnitCosts costs = Costs(QuantMethod::kOscar, 128, 8, bits);
  for (int trial = 0; trial < 50; ++trial) {
    const AllocationProblem p = RandomProblem(rng, 40, bits, costs, false);
    StatusOr<IntegerAllocation> a = SolveIntegerAllocation(p, IntegerSolver::kExact);
    REQUIRE(a.ok());
    CHECK(a->exact);
    CHECK(a->cost <= p.budget + 1e-9);
    // Maximal: no unit can move up one level within what is left.
    for (int i = 0; i < p.units; ++i) {
      const int l = a->level[static_cast<size_t>(i)];
      REQUIRE(l >= 0);
      REQUIRE(l < p.levels);
      if (l + 1 < p.levels) {
        const size_t at = static_cast<size_t>(i) * p.levels + l;
        CHECK(a->cost + p.cost[at + 1] - p.cost[at] > p.budget - 1e-9);
      }
    }
  }
}

TEST_CASE("RateQuant: more budget never raises the distortion", "[policies]") {
  std::mt19937_64 rng(5);
  const std::vector<int> bits = {2, 3, 4, 8};
  const UnitCosts costs = Costs(QuantMethod::kKivi, 64, 3, bits);
  AllocationProblem p = RandomProblem(rng, 24, bits, costs, false);
  std::vector<ContinuousUnit> cont;
  for (int i = 0; i < p.units; ++i) {
    const double* d = &p.distortion[static_cast<size_t>(i) * p.levels];
    const double beta = std::pow(d[0] / d[1], 1.0 / (bits[1] - bits[0]));
    cont.push_back(
        {d[0] * std::pow(beta, bits[0]), beta, p.cost[static_cast<size_t>(i) * p.levels] - 2});
  }
  double prev_int = kInf, prev_cont = kInf;
  for (double bpe = 3.0; bpe <= 9.0; bpe += 0.0625) {
    p.budget = bpe * p.units;
    StatusOr<IntegerAllocation> a = SolveIntegerAllocation(p, IntegerSolver::kExact);
    StatusOr<ContinuousAllocation> c = SolveWaterFilling(cont, p.budget, 2, 8);
    REQUIRE(a.ok());
    REQUIRE(c.ok());
    CHECK(a->distortion <= prev_int);
    CHECK(c->distortion <= prev_cont * (1 + 1e-12));
    // The relaxation is a lower bound on the integer optimum (same linear costs).
    CHECK(c->distortion <= a->distortion * (1 + 1e-9));
    prev_int = a->distortion;
    prev_cont = c->distortion;
  }
}

TEST_CASE("RateQuant: water-filling matches the closed form without active bounds", "[policies]") {
  // b_i = b_mean + log_beta(s_i / GM(s)) when no bound binds (docs/algorithms.md §11.3).
  const std::vector<double> scales = {1.0, 3.0, 0.2, 10.0, 0.7};
  const double beta = 4.0, mean = 5.0;
  std::vector<ContinuousUnit> units;
  double log_gm = 0;
  for (double s : scales) {
    units.push_back({s, beta, 0.5});
    log_gm += std::log(s) / static_cast<double>(scales.size());
  }
  StatusOr<ContinuousAllocation> c = SolveWaterFilling(units, (mean + 0.5) * 5, 0, 16);
  REQUIRE(c.ok());
  for (size_t i = 0; i < scales.size(); ++i) {
    CHECK(c->bits[i] ==
          Approx(mean + (std::log(scales[i]) - log_gm) / std::log(beta)).margin(1e-9));
  }
  CHECK(c->cost == Approx(5 * 5.5).epsilon(1e-12));
  CHECK(c->cost <= 5 * 5.5 + 1e-9);
}

TEST_CASE("RateQuant: water-filling equals a brute-force grid search with bounds", "[policies]") {
  // Three units with different slopes; bounds [2, 8] bind. Grid over (b1, b2), b3 from the
  // budget; the continuous optimum is at most the grid's best and within its resolution.
  const std::vector<ContinuousUnit> units = {{50.0, 3.0, 1.0}, {0.5, 5.0, 1.0}, {4.0, 2.0, 1.0}};
  for (double mean : {2.5, 3.3, 4.0, 6.0, 7.5}) {
    const double budget = (mean + 1.0) * 3;
    StatusOr<ContinuousAllocation> c = SolveWaterFilling(units, budget, 2, 8);
    REQUIRE(c.ok());
    double grid = kInf;
    const double step = 0.004;
    for (double b1 = 2; b1 <= 8 + 1e-12; b1 += step) {
      for (double b2 = 2; b2 <= 8 + 1e-12; b2 += step) {
        const double b3 = mean * 3 - b1 - b2;
        if (b3 < 2 || b3 > 8) continue;
        const double d =
            50 * std::pow(3.0, -b1) + 0.5 * std::pow(5.0, -b2) + 4 * std::pow(2.0, -b3);
        grid = std::min(grid, d);
      }
    }
    INFO("mean " << mean);
    CHECK(c->distortion <= grid * (1 + 1e-12));
    CHECK(c->distortion >= grid * (1 - 2e-3));
    CHECK(c->cost <= budget + 1e-9);
    for (double b : c->bits) {
      CHECK(b >= 2);
      CHECK(b <= 8);
    }
  }
}

TEST_CASE("RateQuant: water-filling satisfies the KKT conditions", "[policies]") {
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u01(0, 1);
  std::vector<ContinuousUnit> units;
  for (int i = 0; i < 200; ++i) {
    units.push_back({i % 17 == 0 ? 0.0 : std::pow(10.0, -4 + 6 * u01(rng)), 1.5 + 4 * u01(rng),
                     i % 2 ? 1.0 : 1.03125});
  }
  StatusOr<ContinuousAllocation> c = SolveWaterFilling(units, 200 * 4.2, 2, 8);
  REQUIRE(c.ok());
  const double lambda = std::exp(c->log_lambda);
  int free = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const double b = c->bits[i];
    const double marginal = units[i].scale * std::log(units[i].beta) * std::pow(units[i].beta, -b);
    if (units[i].scale == 0) {
      CHECK(b == 2);
    } else if (b <= 2 + 1e-12) {
      CHECK(marginal <= lambda * (1 + 1e-9));
    } else if (b >= 8 - 1e-12) {
      CHECK(marginal >= lambda * (1 - 1e-9));
    } else {
      CHECK(marginal == Approx(lambda).epsilon(1e-9));
      ++free;
    }
  }
  CHECK(free > 50);
  CHECK(c->cost == Approx(200 * 4.2).epsilon(1e-9));
}

TEST_CASE("RateQuant: cost table is the registry's bits per element", "[policies]") {
  const std::vector<int> bits = {2, 3, 4, 8};
  for (int d : {64, 128}) {
    for (int h : {1, 3, 8}) {
      for (QuantMethod m :
           {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn, QuantMethod::kOscar}) {
        const UnitCosts c = Costs(m, d, h, bits);
        for (size_t j = 0; j < bits.size(); ++j) {
          StatusOr<QuantSpec> s = MakeQuantSpec(m, d, bits[j], bits[j]);
          REQUIRE(s.ok());
          CHECK(c.k[j] == BitsPerElement(*s, h).k);
          CHECK(c.v[j] == BitsPerElement(*s, h).v);
          CHECK(c.k[j] > bits[j]);  // Metadata is paid for.
        }
      }
    }
  }
  // KIVI G=32: b + 1 (fp16 scale and min per 32 elements).
  CHECK(Costs(QuantMethod::kKivi, 128, 8, bits).k[3] == 9.0);
  StatusOr<QuantSpec> s = MakeQuantSpec(QuantMethod::kKivi, 64, 2, 2);
  REQUIRE(s.ok());
  StatusOr<UnitCosts> bad = UnitCostTable(*s, 3, {2, 5});
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("bits[1]") != std::string::npos);
}

// A hand-built fit: kivi D=64, `alphas` per unit in (layer, head, K, V) order.
RateQuantFit HandFit(int layers, int heads, const std::vector<double>& alphas, double beta) {
  RateQuantFit fit;
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kKivi, 64, 2, 2);
  REQUIRE(spec.ok());
  fit.spec = *spec;
  fit.layers = layers;
  fit.kv_heads = heads;
  fit.bits = {2, 3, 4, 8};
  fit.beta = fit.beta_k = fit.beta_v = beta;
  for (int i = 0; i < 2 * layers * heads; ++i) {
    RateQuantUnit u;
    u.layer = i / 2 / heads;
    u.head = i / 2 % heads;
    u.kind = i % 2 ? UnitKind::kValue : UnitKind::kKey;
    u.alpha = alphas[static_cast<size_t>(i) % alphas.size()];
    for (int b : fit.bits) u.mse.push_back(u.alpha * std::pow(beta, -b));
    fit.units.push_back(u);
  }
  REQUIRE(ValidateRateQuantFit(fit).ok());
  return fit;
}

TEST_CASE("RateQuant: plan gives more bits to larger alpha and stays within budget", "[policies]") {
  const RateQuantFit fit =
      HandFit(4, 2, {1, 2, 4, 8, 16, 32, 64, 128, 0.5, 0.25, 3, 5, 7, 9, 11, 13}, 4.0);
  for (double budget : {3.0, 3.5, 4.0, 4.75, 6.0, 9.0}) {
    StatusOr<RateQuantPlan> plan = PlanRateQuant(fit, {.budget_bpe = budget});
    REQUIRE(plan.ok());
    INFO("budget " << budget);
    CHECK(plan->exact);
    CHECK(plan->cost_bpe <= budget + 1e-12);
    // Within one allocation step (at most 4 bits on one of 16 units) of the budget.
    CHECK(plan->cost_bpe > std::min(budget, 9.0) - 4.0 / 16 - 1e-12);
    CHECK(plan->continuous_distortion <= plan->predicted_distortion * (1 + 1e-9));
    CHECK(plan->lower_bound <= plan->predicted_distortion * (1 + 1e-12));
    double sum = 0;
    for (const HeadPlan& h : plan->heads) sum += h.k_distortion + h.v_distortion;
    CHECK(sum == Approx(plan->predicted_distortion).epsilon(1e-12));
    // Sorted: a unit with a larger alpha never has fewer bits.
    for (size_t i = 0; i < fit.units.size(); ++i) {
      for (size_t j = 0; j < fit.units.size(); ++j) {
        const int bi = i % 2 ? plan->heads[i / 2].v_bits : plan->heads[i / 2].k_bits;
        const int bj = j % 2 ? plan->heads[j / 2].v_bits : plan->heads[j / 2].k_bits;
        if (fit.units[i].alpha > fit.units[j].alpha) CHECK(bi >= bj);
      }
    }
  }
  // Bounds restrict the widths.
  StatusOr<RateQuantPlan> bounded =
      PlanRateQuant(fit, {.budget_bpe = 4.5, .min_bits = 3, .max_bits = 4});
  REQUIRE(bounded.ok());
  for (const HeadPlan& h : bounded->heads) {
    CHECK(h.k_bits >= 3);
    CHECK(h.k_bits <= 4);
    CHECK(h.v_bits >= 3);
    CHECK(h.v_bits <= 4);
    CHECK(h.k_bits_continuous >= 3);
    CHECK(h.v_bits_continuous <= 4);
  }
}

TEST_CASE("RateQuant: at 2.5 bits with {2, 3} the larger half of w*alpha gets 3 bits",
          "[policies]") {
  // docs/algorithms.md §11.4's example, with metadata: kivi costs b + 1, so 3.5 b/e.
  const RateQuantFit fit = HandFit(2, 2, {5, 1, 7, 2, 8, 3, 6, 4}, 4.0);
  StatusOr<RateQuantPlan> plan = PlanRateQuant(fit, {.budget_bpe = 3.5, .max_bits = 3});
  REQUIRE(plan.ok());
  CHECK(plan->cost_bpe == 3.5);
  for (size_t i = 0; i < fit.units.size(); ++i) {
    const int b = i % 2 ? plan->heads[i / 2].v_bits : plan->heads[i / 2].k_bits;
    CHECK(b == (fit.units[i].alpha > 4.5 ? 3 : 2));
  }
}

TEST_CASE("RateQuant: allocating with the wrong beta does worse, even worse than uniform",
          "[policies]") {
  // True slope 5; alphas spread over 128x. A slope of 1.5 believes bits are cheap to trade,
  // pushes the largest units to 8 bits and starves the rest: worse than uniform 3-bit, while the
  // right slope more than halves uniform's distortion.
  const RateQuantFit fit = HandFit(2, 4, {1, 2, 4, 8, 16, 32, 64, 128}, 5.0);
  StatusOr<RateQuantPlan> uniform = UniformPlan(fit, 3, 3);
  REQUIRE(uniform.ok());
  const double budget = uniform->cost_bpe;  // 4.0 b/e
  StatusOr<RateQuantPlan> right = PlanRateQuant(fit, {.budget_bpe = budget});
  StatusOr<RateQuantPlan> wrong = PlanRateQuant(fit, {.budget_bpe = budget, .beta_override = 1.5});
  REQUIRE(right.ok());
  REQUIRE(wrong.ok());
  CHECK(wrong->beta_k == 1.5);
  StatusOr<PlanScore> s_uniform = ScorePlan(fit, *uniform);
  StatusOr<PlanScore> s_right = ScorePlan(fit, *right);
  StatusOr<PlanScore> s_wrong = ScorePlan(fit, *wrong);
  REQUIRE(s_uniform.ok());
  REQUIRE(s_right.ok());
  REQUIRE(s_wrong.ok());
  INFO("uniform " << s_uniform->model << " right " << s_right->model << " wrong "
                  << s_wrong->model);
  CHECK(s_right->model < 0.5 * s_uniform->model);
  CHECK(s_wrong->model > s_uniform->model);
  CHECK(s_wrong->model > 3 * s_right->model);
  // What the allocator believed differs from the truth.
  CHECK(wrong->predicted_distortion != Approx(s_wrong->model));
  // The measured table equals the model here, so the measured score agrees.
  CHECK(s_wrong->measured == Approx(s_wrong->model).epsilon(1e-12));
  CHECK(wrong->cost_bpe <= budget);
}

TEST_CASE("RateQuant: override TOML lists every head and parses back", "[policies]") {
  const RateQuantFit fit = HandFit(3, 2, {1, 9, 3, 27, 2, 5}, 4.0);
  StatusOr<RateQuantPlan> plan = PlanRateQuant(fit, {.budget_bpe = 4.25});
  REQUIRE(plan.ok());
  const std::string text = FormatOverridesToml(*plan);
  CHECK(text.find("# RateQuant plan") == 0);
  CHECK(text.find("method = \"kivi\"") != std::string::npos);
  toml::table root = toml::parse(text);
  const toml::array* list = root["quant"]["override"].as_array();
  REQUIRE(list);
  REQUIRE(list->size() == plan->heads.size());
  for (size_t i = 0; i < list->size(); ++i) {
    const toml::table& t = *list->get(i)->as_table();
    CHECK(t.size() == 4);
    CHECK(t["layer"].value<int>() == plan->heads[i].layer);
    CHECK(t["head"].value<int>() == plan->heads[i].head);
    CHECK(t["k_bits"].value<int>() == plan->heads[i].k_bits);
    CHECK(t["v_bits"].value<int>() == plan->heads[i].v_bits);
  }
  const std::string model = FormatOverridesToml(*plan, "model.override");
  CHECK(model.find("[[model.override]]") != std::string::npos);
}

TEST_CASE("RateQuant: bad input errors name the field", "[policies]") {
  RateQuantFit fit = HandFit(1, 2, {1, 2}, 4.0);
  auto message = [](const Status& s) { return s.message(); };
  CHECK_THAT(message(PlanRateQuant(fit, {.budget_bpe = 2.5}).status()),
             Catch::Contains("budget_bpe: got 2.5, expected >= 3"));
  CHECK_THAT(message(PlanRateQuant(fit, {.budget_bpe = 0}).status()),
             Catch::Contains("budget_bpe: got 0"));
  CHECK_THAT(message(PlanRateQuant(fit, {.budget_bpe = 4, .beta_override = 0.9}).status()),
             Catch::Contains("beta_override: got 0.9"));
  CHECK_THAT(message(PlanRateQuant(fit, {.budget_bpe = 4, .min_bits = 5, .max_bits = 7}).status()),
             Catch::Contains("min_bits/max_bits: got 5/7"));
  CHECK_THAT(message(PlanRateQuant(fit, {.budget_bpe = 4, .min_bits = 5, .max_bits = 4}).status()),
             Catch::Contains("min_bits/max_bits"));
  CHECK_THAT(message(UniformPlan(fit, 5, 2).status()), Catch::Contains("k_bits: got 5"));
  RateQuantFit bad = fit;
  bad.units[1].alpha = -1;
  CHECK_THAT(message(ValidateRateQuantFit(bad)), Catch::Contains("units[1].alpha: got -1"));
  bad = fit;
  bad.beta_v = 1.0;
  CHECK_THAT(message(ValidateRateQuantFit(bad)), Catch::Contains("beta_v: got 1"));
  bad = fit;
  bad.bits = {2, 5};
  CHECK_THAT(message(ValidateRateQuantFit(bad)), Catch::Contains("bits[1]"));
  bad = fit;
  bad.units[2].head = 0;
  CHECK_THAT(message(ValidateRateQuantFit(bad)),
             Catch::Contains("units[2]: got (layer 0, head 0, k)"));
  bad = fit;
  bad.units[0].mse.pop_back();
  CHECK_THAT(message(ValidateRateQuantFit(bad)), Catch::Contains("units[0].mse: got 3 values"));

  AllocationProblem p{
      .units = 2, .levels = 2, .cost = {1, 2, 1, 1}, .distortion = {2, 1, 2, 1}, .budget = 3};
  CHECK_THAT(message(SolveIntegerAllocation(p, IntegerSolver::kExact).status()),
             Catch::Contains("unit 1 level 1: cost 1, expected > level 0's 1"));
  p.cost = {1, 2, 1, 2};
  p.budget = 1.5;
  CHECK_THAT(message(SolveIntegerAllocation(p, IntegerSolver::kExact).status()),
             Catch::Contains("budget: got 1.5, expected >= 2"));
  CHECK_THAT(message(SolveWaterFilling({{1, 0.5, 0}}, 3, 2, 8).status()),
             Catch::Contains("units[0]: scale 1, beta 0.5"));
  CHECK_THAT(message(SolveWaterFilling({{1, 4, 0}}, 1, 2, 8).status()),
             Catch::Contains("budget: got 1, expected >= 2"));
}

}  // namespace
}  // namespace kvctl
