// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// RateQuant benchmarks, hidden from the default run ([.bench]); docs/ratequant.md quotes them:
//   build/tests/policies_test "RateQuant bench*"
// Plan time for 80 layers x 8 KV heads, fit time for the SmolLM2-135M geometry on 32 x 256
// synthetic tokens, and the quality table (uniform vs RateQuant vs mismatched models).
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>

#include "policies/ratequant_fit.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace ratequant_testing {
struct SyntheticCalibration {
  std::vector<SyntheticKv> layers;
  CalibrationSet set;
};
// Defined in ratequant_fit_test.cc.
SyntheticCalibration MakeCalibration(int layers, int heads, int q_heads, int head_dim,
                                     int sequences, int64_t tokens, bool with_q);
}  // namespace ratequant_testing

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU time of this thread: the machine is shared, so wall time alone overstates the cost.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// 80 x 8 units of a fit with log-normal alphas and importances (kivi, D = 128).
RateQuantFit LargeFit(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  RateQuantFit fit;
  fit.spec = *MakeQuantSpec(QuantMethod::kKivi, 128, 2, 2);
  fit.layers = 80;
  fit.kv_heads = 8;
  fit.bits = {2, 3, 4, 8};
  fit.beta = fit.beta_k = fit.beta_v = 4.33;
  for (int i = 0; i < 2 * 80 * 8; ++i) {
    RateQuantUnit u;
    u.layer = i / 16;
    u.head = i / 2 % 8;
    u.kind = i % 2 ? UnitKind::kValue : UnitKind::kKey;
    u.alpha = std::exp(normal(rng));
    u.importance = std::exp(0.5 * normal(rng));
    fit.units.push_back(u);
  }
  return fit;
}

TEST_CASE("RateQuant bench: plan for 80 layers x 8 KV heads", "[.bench][policies]") {
  const RateQuantFit fit = LargeFit(1);
  std::printf("plan, 80 layers x 8 KV heads (1280 units), kivi D=128, bits {2,3,4,8}, one core\n");
  std::printf("%8s %8s %12s %12s %6s %10s %10s\n", "budget", "solver", "median_us", "max_us",
              "exact", "cost_bpe", "gap");
  for (double budget : {3.5, 4.0, 4.25, 4.5, 5.3, 6.0}) {
    for (IntegerSolver solver : {IntegerSolver::kGreedy, IntegerSolver::kExact}) {
      std::vector<double> us;
      StatusOr<RateQuantPlan> plan = InvalidArgument("not run");
      for (int rep = 0; rep < 31; ++rep) {
        const auto t0 = Clock::now();
        plan = PlanRateQuant(fit, {.budget_bpe = budget, .solver = solver});
        us.push_back(Seconds(t0, Clock::now()) * 1e6);
        REQUIRE(plan.ok());
      }
      std::sort(us.begin(), us.end());
      const double gap = plan->predicted_distortion / plan->lower_bound - 1;
      std::printf("%8.3f %8s %12.1f %12.1f %6s %10.5f %10.2e\n", budget,
                  solver == IntegerSolver::kExact ? "exact" : "greedy", us[us.size() / 2],
                  us.back(), plan->exact ? "yes" : "no", plan->cost_bpe, gap);
      CHECK(plan->cost_bpe <= budget + 1e-12);
      if (solver == IntegerSolver::kExact) CHECK(us[us.size() / 2] < 1000);
    }
  }
  // How many units the exact step had to decide, straight from the solver.
  for (double budget : {3.5, 4.25, 5.3}) {
    AllocationProblem p;
    p.units = 1280;
    p.levels = 4;
    const UnitCosts c = *UnitCostTable(fit.spec, 8, fit.bits);
    for (const RateQuantUnit& u : fit.units) {
      for (int l = 0; l < 4; ++l) {
        p.cost.push_back((u.kind == UnitKind::kKey ? c.k : c.v)[static_cast<size_t>(l)]);
        p.distortion.push_back(u.importance * u.alpha *
                               std::pow(4.33, -fit.bits[static_cast<size_t>(l)]));
      }
    }
    p.budget = budget * 1280;
    StatusOr<IntegerAllocation> a = SolveIntegerAllocation(p, IntegerSolver::kExact);
    REQUIRE(a.ok());
    std::printf("budget %.3f: exact=%d, units left to the DP after reduced-cost fixing: %d\n",
                budget, a->exact, a->free_units);
  }
}

void PrintFit(const char* label, const RateQuantFit& fit, double wall, double cpu) {
  std::printf("%-28s %6.2f s wall %6.2f s cpu  beta %.4f (K %.4f, V %.4f)  rms ln-res %.3f\n",
              label, wall, cpu, fit.beta, fit.beta_k_only, fit.beta_v_only, fit.rms_log_residual);
}

TEST_CASE("RateQuant bench: fit time and slopes on the SmolLM2-135M geometry",
          "[.bench][policies]") {
  // 30 layers, 3 KV heads, 9 query heads, D 64; 32 sequences x 256 tokens.
  const auto t0 = Clock::now();
  const auto calib = ratequant_testing::MakeCalibration(30, 3, 9, 64, 32, 256, true);
  std::printf("synthetic data: %.2f s to generate\n", Seconds(t0, Clock::now()));
  CalibrationSet no_q = calib.set;
  for (auto& seq : no_q) {
    for (auto& l : seq) l.q = {};
  }
  for (QuantMethod m :
       {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn, QuantMethod::kOscar}) {
    const std::string name(QuantMethodName(m));
    const std::pair<std::string, RateQuantFitOptions> runs[] = {
        {name + " mse, no Q", {.method = m}},
        {name + " mse + attn importance", {.method = m, .importance = ImportanceMode::kAttention}},
        {name + " attention target", {.method = m, .target = DistortionTarget::kAttention}}};
    for (const auto& [label, options] : runs) {
      const auto t1 = Clock::now();
      const double c1 = ThreadCpuSeconds();
      StatusOr<RateQuantFit> fit =
          FitRateQuant(label.find("no Q") == std::string::npos ? calib.set : no_q, options);
      const double cpu = ThreadCpuSeconds() - c1;
      REQUIRE(fit.ok());
      PrintFit(label.c_str(), *fit, Seconds(t1, Clock::now()), cpu);
    }
  }
}

// A copy of `fit` whose model (alphas, importances, slopes) comes from `other`: the allocator of
// quantizer X driven by quantizer Y's distortion model, at X's costs.
RateQuantFit WithModelOf(const RateQuantFit& fit, const RateQuantFit& other) {
  RateQuantFit mixed = fit;
  mixed.beta_k = other.beta_k;
  mixed.beta_v = other.beta_v;
  for (size_t i = 0; i < mixed.units.size(); ++i) {
    mixed.units[i].alpha = other.units[i].alpha;
    mixed.units[i].importance = other.units[i].importance;
  }
  return mixed;
}

TEST_CASE("RateQuant bench: quality table of uniform vs RateQuant vs mismatched models",
          "[.bench][policies]") {
  const auto calib = ratequant_testing::MakeCalibration(30, 3, 9, 64, 32, 256, true);
  const QuantMethod methods[] = {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn,
                                 QuantMethod::kOscar};
  std::vector<RateQuantFit> fits;
  for (QuantMethod m : methods) {
    StatusOr<RateQuantFit> f =
        FitRateQuant(calib.set, {.method = m, .importance = ImportanceMode::kAttention});
    REQUIRE(f.ok());
    fits.push_back(*f);
  }
  for (const RateQuantFit& fit : fits) {
    // How well w * MSE (the proxy) predicts the measured attention error, units x 2..4 bits.
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, worst = 0;
    int n = 0;
    for (const RateQuantUnit& u : fit.units) {
      for (size_t j = 0; j < 3; ++j) {
        const double x = std::log(u.importance * u.mse[j]), y = std::log(u.attention[j]);
        sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y, ++n;
        worst = std::max(worst, std::fabs(x - y));
      }
    }
    const double r = (n * sxy - sx * sy) / std::sqrt((n * sxx - sx * sx) * (n * syy - sy * sy));
    std::printf("%-7s proxy vs measured attention error: log-log r = %.3f, worst ratio %.2fx\n",
                std::string(QuantMethodName(fit.spec.method)).c_str(), r, std::exp(worst));
  }
  std::printf(
      "Measured on the calibration data: proxy = sum w_i * MSE_i, attn = sum of measured\n"
      "attention-output errors; both relative to uniform at the same b/e.\n");
  std::printf("%-7s %-6s %-34s %8s %9s %9s %8s\n", "method", "bits", "allocation", "b/e", "proxy",
              "attn", "K bits");
  for (size_t x = 0; x < fits.size(); ++x) {
    const RateQuantFit& fit = fits[x];
    const std::string name(QuantMethodName(fit.spec.method));
    // Average code bits 2.5 (baselines k3v2 and k2v3), 3 and 4, at the b/e of the first baseline.
    const std::vector<std::vector<std::pair<int, int>>> budgets = {
        {{3, 2}, {2, 3}}, {{3, 3}}, {{4, 4}}};
    for (const auto& baselines : budgets) {
      StatusOr<RateQuantPlan> first = UniformPlan(fit, baselines[0].first, baselines[0].second);
      REQUIRE(first.ok());
      const PlanScore base = *ScorePlan(fit, *first);
      const double mean_bits = (baselines[0].first + baselines[0].second) / 2.0;
      auto row = [&](const std::string& label, const RateQuantPlan& plan) {
        const PlanScore s = *ScorePlan(fit, plan);
        double k_bits = 0;
        for (const HeadPlan& h : plan.heads) k_bits += h.k_bits;
        std::printf("%-7s %-6.1f %-34s %8.4f %9.3f %9.3f %8.2f\n", name.c_str(), mean_bits,
                    label.c_str(), plan.cost_bpe, s.measured / base.measured,
                    s.attention / base.attention, k_bits / static_cast<double>(plan.heads.size()));
      };
      for (const auto& [k, v] : baselines) {
        row("uniform k" + std::to_string(k) + "v" + std::to_string(v), *UniformPlan(fit, k, v));
      }
      const double budget = first->cost_bpe;
      row("RateQuant (own model)", *PlanRateQuant(fit, {.budget_bpe = budget}));
      row("RateQuant, uniform importance",
          *PlanRateQuant(fit, {.budget_bpe = budget, .uniform_importance = true}));
      for (double beta : {1.5, 2.5, 8.0}) {
        char label[64];
        std::snprintf(label, sizeof label, "beta_override %.1f", beta);
        row(label, *PlanRateQuant(fit, {.budget_bpe = budget, .beta_override = beta}));
      }
      for (size_t y = 0; y < fits.size(); ++y) {
        if (y == x) continue;
        const RateQuantFit mixed = WithModelOf(fit, fits[y]);
        row("model of " + std::string(QuantMethodName(fits[y].spec.method)),
            *PlanRateQuant(mixed, {.budget_bpe = budget}));
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
