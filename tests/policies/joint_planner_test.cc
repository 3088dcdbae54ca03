// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The joint planner: budgets and their allocation unit, monotonicity, joint against the single
// levers, brute force on tiny instances, bounds, the shortfall advice, profiles and bad input.
#include "policies/joint_planner.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "tests/policies/joint_planner_test_reference.h"

namespace kvctl {
namespace {

using Catch::Matchers::Contains;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Shape {
  QuantMethod method = QuantMethod::kKivi;
  int layers = 2;
  int heads = 2;
  int head_dim = 64;
  int64_t min_tokens = 64;
  int64_t max_tokens = 512;
  bool tables = false;  // Tabulated retained-mass curves instead of the parametric one.
};

// The shape of trial `trial` of a sweep: OSCAR every `oscar_every`-th trial (KIVI otherwise),
// 1..`layer_cycle` layers and 1..`head_cycle` heads in turn, tabulated curves on odd trials.
Shape SweepShape(int trial, int oscar_every, int layer_cycle, int head_cycle) {
  Shape s;
  s.method = trial % oscar_every == 0 ? QuantMethod::kOscar : QuantMethod::kKivi;
  s.layers = 1 + trial % layer_cycle;
  s.heads = 1 + trial % head_cycle;
  s.tables = trial % 2 == 1;
  return s;
}

// A retained-mass table for T tokens with `fixed` protected ones: a random descending mass
// profile, protected tokens first.
RetainedMassCurve RandomTable(std::mt19937_64& rng, int64_t T, int64_t fixed) {
  std::uniform_real_distribution<double> u01(0, 1);
  const double decay = std::pow(10.0, -3 + 2.5 * u01(rng));
  std::vector<double> mass(static_cast<size_t>(T));
  double sum = 0;
  for (int64_t j = 0; j < T; ++j) {
    mass[j] = std::exp(-decay * j) * (0.5 + u01(rng));
    sum += mass[j];
  }
  std::sort(mass.begin() + fixed, mass.end(), std::greater<>());
  RetainedMassCurve c;
  c.min_budget = fixed;
  double acc = 0;
  for (int64_t j = 0; j < fixed; ++j) acc += mass[j] / sum;
  c.retained.push_back(acc);
  for (int64_t j = fixed; j < T; ++j) {
    acc += mass[j] / sum;
    c.retained.push_back(std::min(1.0, acc));
  }
  c.retained.back() = 1.0;
  return c;
}

JointPlanInput RandomInput(std::mt19937_64& rng, const Shape& s) {
  std::uniform_real_distribution<double> u01(0, 1);
  JointPlanInput in;
  StatusOr<QuantSpec> spec = MakeQuantSpec(s.method, s.head_dim, 4, 4);
  REQUIRE(spec.ok());
  in.spec = *spec;
  in.layers = s.layers;
  in.kv_heads = s.heads;
  in.beta_k = 2.5 + 3 * u01(rng);
  in.beta_v = 2.5 + 3 * u01(rng);
  in.bits =
      s.method == QuantMethod::kKivi ? std::vector<int>{2, 3, 4, 8} : std::vector<int>{2, 3, 4};
  for (int l = 0; l < s.layers; ++l) {
    for (int h = 0; h < s.heads; ++h) {
      JointHeadInput hi;
      hi.layer = l;
      hi.head = h;
      hi.alpha_k = std::pow(10.0, -2 + 3 * u01(rng));
      hi.alpha_v = std::pow(10.0, -2 + 3 * u01(rng));
      hi.importance_k = std::pow(10.0, -1 + 2 * u01(rng));
      hi.importance_v = std::pow(10.0, -1 + 2 * u01(rng));
      hi.tokens = s.min_tokens + static_cast<int64_t>(u01(rng) * (s.max_tokens - s.min_tokens));
      hi.fixed_tokens = std::min<int64_t>(hi.tokens, static_cast<int64_t>(u01(rng) * 24));
      if (s.tables) {
        hi.eviction.table = RandomTable(rng, hi.tokens, hi.fixed_tokens);
      } else {
        hi.eviction.coverage_tokens = u01(rng) < 0.1 ? 0 : 1 + u01(rng) * hi.tokens;
        hi.eviction.tau = 0.9;
      }
      in.heads.push_back(hi);
    }
  }
  in.budget_bytes = 1;
  return in;
}

// The byte range of a mode: its cheapest and its fullest useful plan.
std::pair<double, double> Range(JointPlanInput in, JointMode mode) {
  in.budget_bytes = int64_t{1} << 50;
  StatusOr<JointPlan> p = PlanJoint(in, mode);
  REQUIRE(p.ok());
  return {p->min_bytes, p->max_bytes};
}

void CheckBudget(const JointPlanInput& in, const JointPlan& p) {
  INFO("budget " << in.budget_bytes << " bytes " << p.bytes << " unit " << p.unit_bytes
                 << " saturated " << p.saturated << " source " << p.source);
  CHECK(p.bytes <= static_cast<double>(in.budget_bytes) * (1 + 1e-12));
  if (!p.saturated) CHECK(static_cast<double>(in.budget_bytes) - p.bytes <= p.unit_bytes + 1e-6);
  double bytes = 0, d = 0;
  int64_t kept = 0;
  for (size_t i = 0; i < p.heads.size(); ++i) {
    const JointHeadPlan& h = p.heads[i];
    const JointHeadInput& hi = in.heads[i];
    CHECK(h.kept >= std::min(hi.tokens, std::max(hi.fixed_tokens, in.min_tokens)));
    CHECK(h.kept <= hi.tokens);
    // The per-head numbers are the model's, recomputed independently.
    StatusOr<JointHeadPlan> e = EvaluateJointHead(in, i, h.kept, h.k_bits, h.v_bits);
    REQUIRE(e.ok());
    CHECK(e->bytes == Approx(h.bytes).epsilon(1e-12));
    CHECK(e->distortion == Approx(h.distortion).epsilon(1e-9).margin(1e-12));
    bytes += h.bytes;
    d += h.distortion;
    kept += h.kept;
  }
  CHECK(bytes == Approx(p.bytes).epsilon(1e-12));
  CHECK(d == Approx(p.distortion).epsilon(1e-9).margin(1e-12));
  CHECK(kept == p.kept);
}

TEST_CASE("JointPlanner: totals within the budget and one allocation unit of it",
          "[policies][joint]") {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u01(0, 1);
  for (int trial = 0; trial < 60; ++trial) {
    const Shape s = SweepShape(trial, 3, 3, 4);
    JointPlanInput in = RandomInput(rng, s);
    in.min_tokens = trial % 5 == 0 ? 40 : 0;
    in.token_quantum = trial % 4 == 0 ? 0 : 8;
    for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly, JointMode::kJoint}) {
      const auto [lo, hi] = Range(in, mode);
      JointPlanInput full = in;
      full.budget_bytes = int64_t{1} << 50;
      const double best = PlanJoint(full, mode)->distortion;
      for (int b = 0; b < 5; ++b) {
        in.budget_bytes = static_cast<int64_t>(std::ceil(lo + (hi - lo) * u01(rng)));
        StatusOr<JointPlan> p = PlanJoint(in, mode);
        REQUIRE(p.ok());
        INFO("trial " << trial << " mode " << JointModeName(mode));
        // Saturated below the maximum only where what is left to win is rounding.
        if (p->saturated) CHECK(p->distortion == Approx(best).epsilon(1e-9).margin(1e-12));
        CheckBudget(in, *p);
        if (mode == JointMode::kQuantOnly) {
          for (const JointHeadPlan& h : p->heads) CHECK(h.kept == h.tokens);
        }
        if (mode == JointMode::kEvictOnly) {
          for (const JointHeadPlan& h : p->heads) CHECK((h.k_bits == 8 || h.k_bits == 4));
        }
      }
      // Above the useful maximum: every head at its best, nothing over budget.
      in.budget_bytes = static_cast<int64_t>(hi * 2 + 1000);
      StatusOr<JointPlan> p = PlanJoint(in, mode);
      REQUIRE(p.ok());
      CHECK(p->saturated);
      CheckBudget(in, *p);
    }
  }
}

TEST_CASE("JointPlanner: more budget never raises predicted distortion", "[policies][joint]") {
  std::mt19937_64 rng(12);
  int violations = 0, steps = 0;
  for (int trial = 0; trial < 30; ++trial) {
    Shape s;
    s.layers = 2;
    s.heads = 1 + trial % 3;
    s.tables = trial % 2 == 0;
    JointPlanInput in = RandomInput(rng, s);
    in.token_quantum = 8;
    for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly, JointMode::kJoint}) {
      const auto [lo, hi] = Range(in, mode);
      double prev = kInf;
      for (int i = 0; i <= 60; ++i) {
        in.budget_bytes = static_cast<int64_t>(std::ceil(lo + (hi - lo) * 1.05 * i / 60));
        StatusOr<JointPlan> p = PlanJoint(in, mode);
        REQUIRE(p.ok());
        ++steps;
        if (p->distortion > prev * (1 + 1e-12) + 1e-12) {
          ++violations;
          UNSCOPED_INFO("trial " << trial << " " << JointModeName(mode) << " budget "
                                 << in.budget_bytes << ": " << p->distortion << " > " << prev);
        }
        prev = std::min(prev, p->distortion);
      }
    }
  }
  CHECK(violations == 0);
  CHECK(steps > 1000);
}

TEST_CASE("JointPlanner: joint never worse than the best single lever at the same bytes",
          "[policies][joint]") {
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<double> u01(0, 1);
  int compared = 0, joint_strictly_better = 0, from_joint = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Shape s = SweepShape(trial, 4, 4, 3);
    JointPlanInput in = RandomInput(rng, s);
    in.token_quantum = 16;
    const auto [lo, hi] = Range(in, JointMode::kJoint);
    in.budget_bytes = static_cast<int64_t>(std::ceil(lo + (hi - lo) * u01(rng)));
    StatusOr<JointPlan> joint = PlanJoint(in, JointMode::kJoint);
    REQUIRE(joint.ok());
    CheckBudget(in, *joint);
    CHECK(joint->lower_bound <= joint->distortion * (1 + 1e-12) + 1e-12);
    from_joint += joint->source == "joint";
    double best = kInf;
    for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly}) {
      StatusOr<JointPlan> single = PlanJoint(in, mode);
      if (!single.ok()) {
        CHECK(single.status().code() == StatusCode::kResourceExhausted);
        continue;
      }
      best = std::min(best, single->distortion);
      ++compared;
      CHECK(joint->distortion <= single->distortion * (1 + 1e-12) + 1e-12);
    }
    joint_strictly_better += joint->distortion < best * (1 - 1e-6);
  }
  // The comparison is not vacuous: the joint search itself wins most of the time.
  std::printf(
      "joint vs single levers: %d comparisons, joint strictly better in %d of 200, "
      "joint search chosen %d times\n",
      compared, joint_strictly_better, from_joint);
  CHECK(compared >= 200);
  CHECK(joint_strictly_better >= 100);
}

// Every assignment of (kept, widths) per head, on the planner's own quantum grid.
double BruteForce(const JointPlanInput& in, JointMode mode, int64_t quantum) {
  struct Opt {
    double bytes, d;
  };
  std::vector<std::vector<Opt>> opts(in.heads.size());
  std::vector<int> bits = in.bits;
  const int top = bits.back();
  for (size_t h = 0; h < in.heads.size(); ++h) {
    const JointHeadInput& hi = in.heads[h];
    const int64_t floor = std::min(hi.tokens, std::max(hi.fixed_tokens, in.min_tokens));
    std::vector<int64_t> kept;
    if (mode == JointMode::kQuantOnly) {
      kept = {hi.tokens};
    } else {
      for (int64_t k = floor; k < hi.tokens; k += quantum) kept.push_back(k);
      kept.push_back(hi.tokens);
    }
    for (int64_t k : kept) {
      for (int kb : bits) {
        for (int vb : bits) {
          if (mode == JointMode::kEvictOnly && (kb != top || vb != top)) continue;
          StatusOr<JointHeadPlan> e = EvaluateJointHead(in, h, k, kb, vb);
          REQUIRE(e.ok());
          opts[h].push_back({e->bytes, e->distortion});
        }
      }
    }
  }
  double best = kInf;
  std::vector<size_t> idx(opts.size(), 0);
  while (true) {
    double bytes = 0, d = 0;
    for (size_t h = 0; h < opts.size(); ++h) {
      bytes += opts[h][idx[h]].bytes;
      d += opts[h][idx[h]].d;
    }
    if (bytes <= static_cast<double>(in.budget_bytes) * (1 + 1e-12)) best = std::min(best, d);
    size_t h = 0;
    while (h < opts.size() && ++idx[h] == opts[h].size()) idx[h++] = 0;
    if (h == opts.size()) break;
  }
  return best;
}

TEST_CASE("JointPlanner: against brute force on tiny instances", "[policies][joint]") {
  std::mt19937_64 rng(14);
  std::uniform_real_distribution<double> u01(0, 1);
  int cases = 0, optimal = 0;
  double worst_gap = 0;
  for (int trial = 0; trial < 150; ++trial) {
    Shape s;
    s.layers = 1;
    s.heads = 2 + trial % 2;
    s.min_tokens = 24;
    s.max_tokens = 48;
    s.tables = trial % 2 == 0;
    JointPlanInput in = RandomInput(rng, s);
    in.token_quantum = 8;
    in.kept_levels = 4096;  // The whole grid: the hull bound is a bound over every option.
    for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly, JointMode::kJoint}) {
      const auto [lo, hi] = Range(in, mode);
      in.budget_bytes = static_cast<int64_t>(std::ceil(lo + (hi - lo) * u01(rng)));
      StatusOr<JointPlan> p = PlanJoint(in, mode);
      REQUIRE(p.ok());
      const double opt = BruteForce(in, mode, 8);
      INFO("trial " << trial << " " << JointModeName(mode) << " plan " << p->distortion << " brute "
                    << opt << " bound " << p->lower_bound);
      CHECK(p->distortion >= opt * (1 - 1e-9) - 1e-12);   // Nothing beats the optimum.
      CHECK(p->lower_bound <= opt * (1 + 1e-9) + 1e-12);  // The bound is a bound.
      ++cases;
      optimal += p->distortion <= opt * (1 + 1e-9) + 1e-12;
      worst_gap = std::max(worst_gap, p->distortion / opt - 1);
    }
  }
  std::printf("brute force: optimal in %d of %d tiny cases, worst gap %.3g%%\n", optimal, cases,
              100 * worst_gap);
  CHECK(optimal >= cases * 85 / 100);
}

TEST_CASE("JointPlanner: bounds, floor and protected tokens", "[policies][joint]") {
  std::mt19937_64 rng(15);
  Shape s;
  s.layers = 3;
  s.heads = 2;
  JointPlanInput in = RandomInput(rng, s);
  in.token_quantum = 8;
  in.min_bits = 3;
  in.max_bits = 4;
  in.min_tokens = 48;
  for (JointHeadInput& h : in.heads) h.fixed_tokens = 20;
  const auto [lo, hi] = Range(in, JointMode::kJoint);
  for (double f : {0.0, 0.3, 0.7, 1.0}) {
    in.budget_bytes = static_cast<int64_t>(std::ceil(lo + (hi - lo) * f));
    StatusOr<JointPlan> p = PlanJoint(in, JointMode::kJoint);
    REQUIRE(p.ok());
    CheckBudget(in, *p);
    for (const JointHeadPlan& h : p->heads) {
      CHECK(h.k_bits >= 3);
      CHECK(h.k_bits <= 4);
      CHECK(h.v_bits >= 3);
      CHECK(h.v_bits <= 4);
      CHECK(h.kept >= 48);
    }
  }
  // At the minimum every head sits at its floor and the cheapest widths.
  in.budget_bytes = static_cast<int64_t>(std::ceil(lo));
  StatusOr<JointPlan> p = PlanJoint(in, JointMode::kJoint);
  REQUIRE(p.ok());
  for (const JointHeadPlan& h : p->heads) {
    CHECK(h.kept == 48);
    CHECK(h.k_bits == 3);
    CHECK(h.v_bits == 3);
  }
  // One byte less is refused, naming the budget and the minimum.
  in.budget_bytes = static_cast<int64_t>(std::ceil(lo)) - 1;
  StatusOr<JointPlan> low = PlanJoint(in, JointMode::kJoint);
  CHECK(low.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(low.status().message(), Contains("budget_bytes: got"));
  // Fixed tokens above the floor: never evicted, even with everything else gone.
  for (JointHeadInput& h : in.heads) h.fixed_tokens = h.tokens - 5;
  in.min_tokens = 0;
  in.budget_bytes = static_cast<int64_t>(std::ceil(Range(in, JointMode::kJoint).first));
  p = PlanJoint(in, JointMode::kJoint);
  REQUIRE(p.ok());
  for (size_t i = 0; i < p->heads.size(); ++i) CHECK(p->heads[i].kept >= in.heads[i].tokens - 5);
}

TEST_CASE("JointPlanner: degenerate inputs plan without surprises", "[policies][joint]") {
  std::mt19937_64 rng(19);
  Shape shape;
  shape.layers = 2;
  shape.heads = 2;
  const JointPlanInput base = RandomInput(rng, shape);
  for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly, JointMode::kJoint}) {
    INFO(JointModeName(mode));
    // Every token fixed: nothing to choose, fp16 bytes, no distortion.
    JointPlanInput in = base;
    for (JointHeadInput& h : in.heads) h.fixed_tokens = h.tokens;
    in.budget_bytes = static_cast<int64_t>(Fp16Bytes(in));
    StatusOr<JointPlan> p = PlanJoint(in, mode);
    REQUIRE(p.ok());
    CHECK(p->bytes == Approx(Fp16Bytes(in)));
    CHECK(p->distortion == 0);
    CHECK(p->saturated);
    // Nothing ever errs (alpha 0): the cheapest plan is already the best.
    in = base;
    for (JointHeadInput& h : in.heads) h.alpha_k = h.alpha_v = 0;
    in.budget_bytes = int64_t{1} << 30;
    p = PlanJoint(in, mode);
    REQUIRE(p.ok());
    CHECK(p->distortion == 0);
    CHECK(p->bytes == Approx(p->min_bytes));
    CHECK(p->saturated);
    // One token per head, a quantum larger than the sequence.
    in = base;
    for (JointHeadInput& h : in.heads) {
      h.tokens = 1;
      h.fixed_tokens = 0;
    }
    in.token_quantum = 64;
    in.budget_bytes = int64_t{1} << 30;
    p = PlanJoint(in, mode);
    REQUIRE(p.ok());
    for (const JointHeadPlan& h : p->heads) CHECK(h.kept == 1);
  }
}

TEST_CASE("JointPlanner: bytes per token come from the registry", "[policies][joint]") {
  std::mt19937_64 rng(16);
  Shape s;
  s.method = QuantMethod::kOscar;
  s.layers = 1;
  s.heads = 4;
  JointPlanInput in = RandomInput(rng, s);
  in.heads[0].fixed_tokens = 4;
  StatusOr<JointHeadPlan> e = EvaluateJointHead(in, 0, 4 + 64, 2, 4);
  REQUIRE(e.ok());
  QuantSpec spec = in.spec;
  spec.k_bits = 2;
  spec.v_bits = 4;
  const BlockLayout layout = BlockLayoutOf(spec);
  // 64 quantized tokens = 64 / block_tokens records plus the side record share of 4 heads.
  const double expect = 4.0 * 4 * 64 + 64.0 / spec.block_tokens * layout.record_bytes +
                        64.0 * layout.side_bytes_per_token / 4;
  CHECK(e->bytes == Approx(expect));
  CHECK(e->k_bits == 2);
  CHECK(e->v_bits == 4);
}

TEST_CASE("JointPlanner: the worst-case fp16 tail is charged at fp16 less the narrowest rate",
          "[policies][joint]") {
  std::mt19937_64 rng(17);
  Shape s;
  s.layers = 1;
  s.heads = 2;
  JointPlanInput in = RandomInput(rng, s);
  in.heads[0].fixed_tokens = 4;
  in.heads[0].tail_tokens = 0;
  StatusOr<JointHeadPlan> without = EvaluateJointHead(in, 0, 4 + 64, 4, 4);
  REQUIRE(without.ok());
  in.heads[0].tail_tokens = 20;
  StatusOr<JointHeadPlan> with = EvaluateJointHead(in, 0, 4 + 64, 4, 4);
  REQUIRE(with.ok());
  QuantSpec spec = in.spec;
  spec.k_bits = spec.v_bits = in.bits.front();
  const double narrowest = BitsPerElement(spec, in.kv_heads).average * 2.0 * spec.head_dim / 8.0;
  // 20 rows at fp16 instead of the narrowest rate, whatever the widths evaluated.
  CHECK(with->bytes - without->bytes == Approx(20 * (4.0 * spec.head_dim - narrowest)));
  CHECK(with->distortion == Approx(without->distortion));

  // Planned, the charge uses the narrowest allowed width, so it holds for any width picked.
  for (JointHeadInput& h : in.heads) {
    h.fixed_tokens = 4;
    h.tail_tokens = std::min<int64_t>(31, h.tokens - h.fixed_tokens);
  }
  const auto [lo, hi] = Range(in, JointMode::kJoint);
  in.budget_bytes = static_cast<int64_t>((lo + hi) / 2);
  StatusOr<JointPlan> p = PlanJoint(in, JointMode::kJoint);
  REQUIRE(p.ok());
  CheckBudget(in, *p);
  for (size_t h = 0; h < p->heads.size(); ++h) {
    const JointHeadPlan& hp = p->heads[h];
    QuantSpec at = in.spec;
    at.k_bits = hp.k_bits;
    at.v_bits = hp.v_bits;
    const double rate = BitsPerElement(at, in.kv_heads).average * 2.0 * spec.head_dim / 8.0;
    const double expect =
        4.0 * 4 * spec.head_dim + static_cast<double>(hp.kept - 4) * rate +
        static_cast<double>(in.heads[h].tail_tokens) * (4.0 * spec.head_dim - narrowest);
    CHECK(hp.bytes == Approx(expect));
  }
}

TEST_CASE("JointPlanner: requantize before evict when it costs less", "[policies][joint]") {
  std::mt19937_64 rng(17);
  Shape s;
  s.layers = 2;
  s.heads = 2;
  s.min_tokens = s.max_tokens = 512;
  JointPlanInput in = RandomInput(rng, s);
  in.token_quantum = 16;
  in.budget_bytes = static_cast<int64_t>(Range(in, JointMode::kJoint).second);
  // Flat attention: evicting drops real mass, requantizing 8 -> 4 bits costs little.
  for (JointHeadInput& h : in.heads) h.eviction.coverage_tokens = 0;
  StatusOr<JointPlan> full = PlanJoint(in, JointMode::kJoint);
  REQUIRE(full.ok());
  const int64_t shortfall = static_cast<int64_t>(full->bytes / 4);
  StatusOr<ShortfallAdvice> a = AdviseShortfall(in, *full, shortfall);
  REQUIRE(a.ok());
  CHECK(a->by_requantize.feasible);
  CHECK(a->by_eviction.feasible);
  CHECK(a->by_requantize.bytes_freed >= static_cast<double>(shortfall));
  CHECK(a->by_eviction.bytes_freed >= static_cast<double>(shortfall));
  CHECK(a->requantize);
  CHECK(a->by_requantize.distortion_added < a->by_eviction.distortion_added);
  double freed = 0;
  for (const ShortfallStep& st : a->by_requantize.steps) {
    CHECK(!st.evict);
    CHECK(st.to_k_bits + st.to_v_bits < st.from_k_bits + st.from_v_bits);
    freed += st.bytes_freed;
  }
  CHECK(freed == Approx(a->by_requantize.bytes_freed));

  // Very concentrated attention on 3-bit records: the tail costs almost nothing to evict.
  for (JointHeadInput& h : in.heads) h.eviction.coverage_tokens = 4;
  in.max_bits = 3;
  in.budget_bytes = static_cast<int64_t>(Range(in, JointMode::kQuantOnly).second);
  StatusOr<JointPlan> q = PlanJoint(in, JointMode::kQuantOnly);
  REQUIRE(q.ok());
  a = AdviseShortfall(in, *q, static_cast<int64_t>(q->bytes / 5));
  REQUIRE(a.ok());
  CHECK(!a->requantize);
  CHECK(a->by_eviction.distortion_added < a->by_requantize.distortion_added);
  for (const ShortfallStep& st : a->by_eviction.steps) CHECK(st.evict);

  CHECK_THAT(AdviseShortfall(in, *q, 0).status().message(), Contains("shortfall_bytes: got 0"));
  CHECK(AdviseShortfall(in, *q, int64_t{1} << 50).status().code() ==
        StatusCode::kResourceExhausted);
  JointPlan bad = *q;
  bad.heads[1].kept = bad.heads[1].tokens + 1;
  CHECK_THAT(AdviseShortfall(in, bad, 100).status().message(),
             Contains("current.heads[1].kept: got"));
}

TEST_CASE("JointPlanner: bad input names the field", "[policies][joint]") {
  std::mt19937_64 rng(18);
  JointPlanInput good = RandomInput(rng, Shape{});
  good.budget_bytes = 1 << 20;
  REQUIRE(PlanJoint(good, JointMode::kJoint).ok());
  auto expect = [&](auto mutate, const char* text) {
    JointPlanInput in = good;
    mutate(in);
    StatusOr<JointPlan> p = PlanJoint(in, JointMode::kJoint);
    INFO(text);
    REQUIRE(!p.ok());
    CHECK(p.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(p.status().message(), Contains(text));
  };
  expect([](JointPlanInput& in) { in.layers = 0; }, "layers: got 0");
  expect([](JointPlanInput& in) { in.beta_k = 1; }, "beta_k: got 1");
  expect([](JointPlanInput& in) { in.bits = {2, 5}; }, "bits[1]: got 5");
  expect([](JointPlanInput& in) { in.bits = {}; }, "bits: empty");
  expect([](JointPlanInput& in) { in.min_bits = 9; }, "min_bits/max_bits: got 9/0");
  expect(
      [](JointPlanInput& in) {
        in.evict_k_bits = 3;
        in.min_bits = 4;
      },
      "evict_k_bits: got 3");
  expect([](JointPlanInput& in) { in.budget_bytes = 0; }, "budget_bytes: got 0");
  expect([](JointPlanInput& in) { in.eviction_scale = -1; }, "eviction_scale: got -1");
  expect([](JointPlanInput& in) { in.kept_levels = 1; }, "kept_levels: got 1");
  expect([](JointPlanInput& in) { in.heads.pop_back(); }, "heads: got 3 entries");
  expect([](JointPlanInput& in) { in.heads[2].layer = 0; }, "heads[2].layer: got 0");
  expect([](JointPlanInput& in) { in.heads[1].alpha_v = NAN; }, "heads[1].alpha_v: got nan");
  expect([](JointPlanInput& in) { in.heads[0].tokens = 0; }, "heads[0].tokens: got 0");
  expect([](JointPlanInput& in) { in.heads[3].fixed_tokens = in.heads[3].tokens + 1; },
         "heads[3].fixed_tokens: got");
  expect(
      [](JointPlanInput& in) {
        in.heads[3].tail_tokens = in.heads[3].tokens - in.heads[3].fixed_tokens + 1;
      },
      "heads[3].tail_tokens: got");
  expect([](JointPlanInput& in) { in.heads[3].tail_tokens = -1; }, "heads[3].tail_tokens: got");
  expect([](JointPlanInput& in) { in.heads[0].eviction.tau = 1; }, "heads[0].eviction.tau: got 1");
  expect(
      [](JointPlanInput& in) {
        in.heads[1].eviction.table.min_budget = 0;
        in.heads[1].eviction.table.retained.assign(static_cast<size_t>(in.heads[1].tokens + 1), 1);
        in.heads[1].eviction.table.retained[3] = 0.5;
      },
      "heads[1].eviction.table.retained[3]: got 0.5");
  expect([](JointPlanInput& in) { in.spec.head_dim = 7; }, "spec.head_dim");
  CHECK_THAT(ParseJointMode("both").status().message(), Contains("mode: got 'both'"));
  CHECK(*ParseJointMode("evict-only") == JointMode::kEvictOnly);
}

CalibProfile HandProfile(int layers, int heads, bool demand) {
  CalibProfile p;
  RateQuantFit& f = p.fit;
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kKivi, 128, 2, 2);
  REQUIRE(spec.ok());
  f.spec = *spec;
  f.layers = layers;
  f.kv_heads = heads;
  f.bits = {2, 3, 4, 8};
  f.beta = f.beta_k = f.beta_v = f.beta_k_only = f.beta_v_only = 4.5;
  f.sequences = 4;
  f.tokens = 4 * 1024;
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      for (UnitKind kind : {UnitKind::kKey, UnitKind::kValue}) {
        RateQuantUnit u;
        u.layer = l;
        u.head = h;
        u.kind = kind;
        u.alpha = 0.1 * (1 + l + h) * (kind == UnitKind::kKey ? 2 : 1);
        u.importance = 1 + 0.5 * h;
        f.units.push_back(u);
      }
    }
  }
  if (demand) {
    LayerDemandProfile d;
    d.layers = layers;
    d.kv_heads = heads;
    d.tau = 0.9;
    d.queries_per_sequence = 8;
    d.sequences = 4;
    for (int l = 0; l < layers; ++l) {
      d.samples.push_back(32);
      d.demand.push_back(50.0 * (l + 1));
    }
    p.demand = d;
  }
  REQUIRE(ValidateRateQuantFit(f).ok());
  return p;
}

TEST_CASE("JointPlanner: input from a calibration profile", "[policies][joint]") {
  const CalibProfile profile = HandProfile(3, 2, true);
  StatusOr<JointPlanInput> in =
      MakeJointInput(profile, {.tokens = 2048, .sinks = 4, .window = 60, .budget_fraction = 0.25});
  REQUIRE(in.ok());
  REQUIRE(in->heads.size() == 6);
  CHECK(in->budget_bytes == static_cast<int64_t>(0.25 * 6 * 2048 * 4 * 128));
  const JointHeadInput& h = in->heads[3];  // Layer 1, head 1.
  CHECK(h.alpha_k == Approx(0.1 * 3 * 2));
  CHECK(h.importance_v == Approx(1.5));
  CHECK(h.fixed_tokens == 64);
  // Up to flush_tokens - 1 rows wait at fp16 besides the 4 sinks: 4 + 127 - 64 beyond F.
  CHECK(TraitsOf(QuantMethod::kKivi).streaming.flush_tokens == 128);
  CHECK(h.tail_tokens == 4 + 127 - 64);
  // Calibration sequences of 1024 tokens, demand 100 at layer 1, twice the tokens.
  CHECK(h.eviction.coverage_tokens == Approx(200));
  StatusOr<JointPlan> p = PlanJoint(*in, JointMode::kJoint);
  REQUIRE(p.ok());
  CheckBudget(*in, *p);

  StatusOr<JointPlanInput> fixed =
      MakeJointInput(profile, {.tokens = 2048, .budget_bytes = 1 << 22, .coverage_exponent = 0});
  REQUIRE(fixed.ok());
  CHECK(fixed->heads[3].eviction.coverage_tokens == Approx(100));
  CHECK(fixed->heads[0].fixed_tokens == TraitsOf(QuantMethod::kKivi).streaming.sink_tokens);
  CHECK(fixed->budget_bytes == 1 << 22);
  StatusOr<JointPlanInput> flush32 = MakeJointInput(
      profile,
      {.tokens = 2048, .sinks = 4, .window = 60, .flush_tokens = 32, .budget_fraction = 1});
  REQUIRE(flush32.ok());
  CHECK(flush32->heads[0].tail_tokens == 0);  // The window covers a 31-row tail.
  StatusOr<JointPlanInput> short_seq =
      MakeJointInput(profile, {.tokens = 100, .sinks = 4, .window = 60, .budget_fraction = 1});
  REQUIRE(short_seq.ok());
  CHECK(short_seq->heads[0].tail_tokens == 100 - 64);  // Never more rows than tokens.

  StatusOr<JointPlanInput> flat =
      MakeJointInput(HandProfile(2, 2, false), {.tokens = 512, .budget_fraction = 0.5});
  REQUIRE(flat.ok());
  CHECK(flat->heads[0].eviction.coverage_tokens == 0);

  CHECK_THAT(MakeJointInput(profile, {.tokens = 0, .budget_fraction = 0.5}).status().message(),
             Contains("tokens: got 0"));
  CHECK_THAT(MakeJointInput(profile, {.tokens = 8}).status().message(),
             Contains("budget_fraction: got 0"));
  CHECK_THAT(MakeJointInput(profile, {.tokens = 8, .budget_fraction = 0.5, .beta_override = 0.5})
                 .status()
                 .message(),
             Contains("beta_override: got 0.5"));
  CHECK_THAT(MakeJointInput(profile, {.tokens = 8, .flush_tokens = -1, .budget_fraction = 0.5})
                 .status()
                 .message(),
             Contains("flush_tokens: got -1"));
}

// PlanJoint's plan against the straightforward reference solve: same feasibility, winner,
// saturation and per-head choices; totals to rounding (the reference sums in another order).
void CheckAgainstReference(const JointPlanInput& in, JointMode mode) {
  const StatusOr<JointPlan> p = PlanJoint(in, mode);
  const joint_ref::RefPlan ref = joint_ref::RefPlanJoint(in, mode);
  INFO(JointModeName(mode) << " budget " << in.budget_bytes);
  REQUIRE(p.ok() == ref.feasible);
  if (!p.ok()) {
    CHECK(p.status().code() == StatusCode::kResourceExhausted);
    return;
  }
  CHECK(p->source == ref.source);
  CHECK(p->saturated == ref.saturated);
  CHECK(p->bytes == Approx(ref.bytes).epsilon(1e-12));
  CHECK(p->distortion == Approx(ref.distortion).epsilon(1e-12).margin(1e-12));
  REQUIRE(p->heads.size() == ref.heads.size());
  int differ = 0;
  for (size_t h = 0; h < ref.heads.size(); ++h) {
    differ += p->heads[h].kept != ref.heads[h].kept || p->heads[h].k_bits != ref.heads[h].k_bits ||
              p->heads[h].v_bits != ref.heads[h].v_bits;
  }
  CHECK(differ == 0);
}

// Guards the planner's speed-ups (merged chains, shared models and grids, the quickselect, the
// fill's early stop): none of them may change a plan.
TEST_CASE("JointPlanner: plans equal a straightforward reference solve", "[policies][joint]") {
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> u01(0, 1);
  int compared = 0;
  for (int trial = 0; trial < 120; ++trial) {
    Shape s = SweepShape(trial, 3, 4, 5);
    if (trial % 7 == 0) s.max_tokens = 3000;
    JointPlanInput in = RandomInput(rng, s);
    in.token_quantum = trial % 3 == 0 ? 0 : 8 * (1 + trial % 2);
    in.min_tokens = trial % 5 == 0 ? 40 : 0;
    in.kept_levels = trial % 4 == 0 ? 4096 : (trial % 4 == 1 ? 5 : 16);
    if (trial % 6 == 0) in.min_bits = 3;
    if (trial % 9 == 0) in.eviction_scale = 0.3;  // Dropping can be cheaper than a wide width.
    for (JointHeadInput& h : in.heads) {
      h.tail_tokens = std::min<int64_t>(h.tokens - h.fixed_tokens, trial % 3 == 1 ? 31 : 0);
    }
    if (trial % 8 == 0) {  // Heads that share one curve (as from a profile) share one grid.
      for (JointHeadInput& h : in.heads) {
        h.tokens = in.heads[0].tokens;
        h.fixed_tokens = in.heads[0].fixed_tokens;
        h.tail_tokens = in.heads[0].tail_tokens;
        h.eviction = in.heads[0].eviction;
      }
    }
    for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly, JointMode::kJoint}) {
      const auto [lo, hi] = Range(in, mode);
      for (double f : {-0.01, 0.0, u01(rng), u01(rng), 0.5, 1.1}) {
        in.budget_bytes = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(lo + (hi - lo) * f)));
        CheckAgainstReference(in, mode);
        ++compared;
      }
    }
  }
  // The bench's profile instance: 80 x 8 heads with one curve per layer.
  StatusOr<JointPlanInput> big = MakeJointInput(
      HandProfile(80, 8, true), {.tokens = 8192, .window = 64, .budget_fraction = 0.21});
  REQUIRE(big.ok());
  for (double f : {0.21, 0.3, 0.6}) {
    big->budget_bytes = static_cast<int64_t>(f * Fp16Bytes(*big));
    for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly, JointMode::kJoint}) {
      CheckAgainstReference(*big, mode);
      ++compared;
    }
  }
  CHECK(compared == 120 * 3 * 6 + 9);
}

TEST_CASE("JointPlanner: 80 layers x 8 KV heads plans in about a millisecond",
          "[policies][joint][.bench]") {
  const CalibProfile profile = HandProfile(80, 8, true);
  StatusOr<JointPlanInput> in =
      MakeJointInput(profile, {.tokens = 8192, .window = 64, .budget_fraction = 0.21});
  REQUIRE(in.ok());
  for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly, JointMode::kJoint}) {
    std::vector<double> ms;
    for (int i = 0; i < 21; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      StatusOr<JointPlan> p = PlanJoint(*in, mode);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      REQUIRE(p.ok());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("PlanJoint %s 80x8: median %.3f ms, min %.3f ms\n",
                std::string(JointModeName(mode)).c_str(), ms[10], ms[0]);
  }
}

}  // namespace
}  // namespace kvctl
