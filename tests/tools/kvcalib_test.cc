// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvcalib: the fit through the library and through dumps on disk, the layer demand, plan totals,
// the overrides through the daemon's config loader, and bad input. The CLI runs are registered in
// tests/tools/CMakeLists.txt.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "controller/config/config.h"
#include "policies/calib_profile.h"
#include "policies/eviction.h"
#include "policies/joint_planner.h"
#include "tests/tools/tools_test_util.h"
#include "tools/kvcalib_commands.h"
#include "tools/kvcalib_data.h"
#include "tools/kvcalib_joint.h"
#include "tools/kvcalib_plan.h"
#include "tools/npy.h"

namespace kvctl {
namespace {

using Catch::Matchers::Contains;
using testing::TempDir;

constexpr SyntheticCalibOptions kTiny{.sequences = 2,
                                      .layers = 3,
                                      .heads = 2,
                                      .q_heads = 4,
                                      .head_dim = 64,
                                      .tokens = 256,
                                      .seed = 5};

FitCommandOptions TinyFit(const std::string& method) {
  FitCommandOptions o;
  o.synthetic = kTiny.sequences;
  o.synth = kTiny;
  o.method = method;
  o.probe_queries = 4;
  o.demand_options.queries = 4;
  return o;
}

// TinyFit("kivi") on `sequences` synthetic sequences of 256 tokens (seed 1) of the given geometry.
FitCommandOptions BenchFit(int sequences, int layers, int heads, int q_heads, int head_dim) {
  FitCommandOptions o = TinyFit("kivi");
  o.synthetic = sequences;
  o.synth = {.sequences = sequences,
             .layers = layers,
             .heads = heads,
             .q_heads = q_heads,
             .head_dim = head_dim,
             .tokens = 256,
             .seed = 1};
  return o;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs a command with stdout and stderr captured.
struct Captured {
  int rc = -1;
  std::string out, err;
};
template <typename Fn>
Captured Capture(Fn&& fn) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  REQUIRE(out != nullptr);
  REQUIRE(err != nullptr);
  Captured c;
  c.rc = fn(out, err);
  for (auto [f, s] : {std::pair{out, &c.out}, std::pair{err, &c.err}}) {
    std::fflush(f);
    std::rewind(f);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s->append(buf, n);
    std::fclose(f);
  }
  return c;
}

int Lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

CalibProfile TinyProfile(const std::string& method) {
  StatusOr<FitResult> r = RunFit(TinyFit(method));
  INFO(r.status().message());
  REQUIRE(r.ok());
  return r->profile;
}

TEST_CASE("kvcalib: fit reports its work, and KVarN does no more of it per token than KIVI",
          "[tools]") {
  // kTiny: 2 sequences x 3 layers x 2 KV heads (4 query heads) x 256 tokens, 4 probes, 4 widths;
  // the fit quantizes the whole blocks after the method's registry sinks.
  const auto blocks_after_sinks = [](QuantMethod m, int block) {
    return 2 * 3 * 2 * 4 * ((256 - TraitsOf(m).streaming.sink_tokens) / block);
  };
  for (const auto& [method, blocks] :
       {std::pair{"kivi", blocks_after_sinks(QuantMethod::kKivi, 32)},
        std::pair{"kvarn", blocks_after_sinks(QuantMethod::kKvarn, 128)}}) {
    INFO(method);
    StatusOr<FitResult> r = RunFit(TinyFit(method));
    REQUIRE(r.ok());
    CHECK(r->work.blocks_quantized == blocks);
    CHECK(r->work.attention_softmaxes == 2 * 3 * 4 * 4 * 4);
    const Captured run =
        Capture([&](auto out, auto err) { return RunFitCommand(TinyFit(method), out, err); });
    REQUIRE(run.rc == 0);
    CHECK_THAT(run.out,
               Contains("work: " + std::to_string(blocks) +
                        " blocks quantized and dequantized (4 widths), 384 attention-error "
                        "softmaxes"));
  }
}

TEST_CASE("kvcalib: fit via the library and via dump-synthetic + --input give one profile",
          "[tools]") {
  TempDir tmp;
  // The library path, by hand: data, FitRateQuant, the demand pass.
  StatusOr<CalibrationData> data = GenerateSyntheticCalibration(kTiny);
  REQUIRE(data.ok());
  REQUIRE(data->set.size() == 2);
  REQUIRE(data->set[0].size() == 3);
  StatusOr<RateQuantFit> fit = FitRateQuant(
      data->set,
      {.method = QuantMethod::kKivi, .importance = ImportanceMode::kAttention, .probe_queries = 4});
  REQUIRE(fit.ok());
  StatusOr<LayerDemandProfile> demand = ComputeLayerDemand(data->set, {.queries = 4});
  REQUIRE(demand.ok());
  const CalibProfile by_hand{*fit, *demand};

  // The command on synthetic data, writing the profile.
  FitCommandOptions synth = TinyFit("kivi");
  synth.out = tmp.Path("synthetic.toml");
  const Captured fit_run =
      Capture([&](auto out, auto err) { return RunFitCommand(synth, out, err); });
  INFO(fit_run.err);
  REQUIRE(fit_run.rc == 0);
  CHECK_THAT(fit_run.out, Contains("wrote " + synth.out));
  StatusOr<CalibProfile> from_file = ReadCalibProfile(synth.out);
  REQUIRE(from_file.ok());
  CHECK(*from_file == by_hand);

  // dump-synthetic, then fit --input on the directories it wrote: the same profile, byte for byte.
  DumpCommandOptions dump{.out = tmp.Path("dump"), .synth = kTiny};
  const Captured dump_run =
      Capture([&](auto out, auto err) { return RunDumpCommand(dump, out, err); });
  REQUIRE(dump_run.rc == 0);
  CHECK(dump_run.out == tmp.Path("dump/seq_0") + "\n" + tmp.Path("dump/seq_1") + "\n");
  StatusOr<NpyArray> q = ReadNpy(tmp.Path("dump/seq_1/layer_2/q.npy"));
  REQUIRE(q.ok());
  CHECK(q->shape == std::vector<int64_t>{256, 4, 64});
  FitCommandOptions from_dirs = TinyFit("kivi");
  from_dirs.synthetic = 0;
  from_dirs.inputs = {tmp.Path("dump/seq_0"), tmp.Path("dump/seq_1")};
  from_dirs.out = tmp.Path("dirs.toml");
  const Captured dirs_run =
      Capture([&](auto out, auto err) { return RunFitCommand(from_dirs, out, err); });
  INFO(dirs_run.err);
  REQUIRE(dirs_run.rc == 0);
  CHECK(ReadText(from_dirs.out) == ReadText(synth.out));

  // A float16 dump stays float16 in memory and fits nearly the same model.
  dump.out = tmp.Path("dump16");
  dump.dtype = "float16";
  REQUIRE(Capture([&](auto out, auto err) { return RunDumpCommand(dump, out, err); }).rc == 0);
  StatusOr<CalibrationData> half =
      LoadCalibrationDirs({tmp.Path("dump16/seq_0"), tmp.Path("dump16/seq_1")});
  REQUIRE(half.ok());
  CHECK(half->set[0][0].k.dtype == DType::kF16);
  CHECK(half->q_heads == 4);
  from_dirs.inputs = {tmp.Path("dump16/seq_0"), tmp.Path("dump16/seq_1")};
  StatusOr<FitResult> r16 = RunFit(from_dirs);
  REQUIRE(r16.ok());
  CHECK(r16->profile.fit.beta == Approx(fit->beta).epsilon(0.01));
  CHECK(r16->profile.demand->demand[0] == Approx(demand->demand[0]).epsilon(0.05));

  // Without the demand: no [reasonalloc] table, and the profile still round-trips.
  FitCommandOptions no_demand = TinyFit("oscar");
  no_demand.demand = false;
  StatusOr<FitResult> nd = RunFit(no_demand);
  REQUIRE(nd.ok());
  CHECK(!nd->profile.demand.has_value());
  const std::string text = FormatCalibProfile(nd->profile);
  CHECK(text.find("[reasonalloc]") == std::string::npos);
  StatusOr<CalibProfile> back = ParseCalibProfile(text, "nd.toml");
  REQUIRE(back.ok());
  CHECK(*back == nd->profile);
}

TEST_CASE("kvcalib: profile tables written another way parse to the same profile", "[tools]") {
  const CalibProfile p = TinyProfile("quarot");
  const std::string text = FormatCalibProfile(p);
  // [reasonalloc] first, then [ratequant]: the line split must not care about the order.
  const size_t at = text.find("\n# ReasonAlloc-like");
  REQUIRE(at != std::string::npos);
  const std::string swapped = text.substr(at + 1) + "\n" + text.substr(0, at + 1);
  StatusOr<CalibProfile> a = ParseCalibProfile(swapped, "swapped.toml");
  INFO(a.status().message());
  REQUIRE(a.ok());
  CHECK(*a == p);
  // Dotted keys instead of a header: the whole-file path re-serialises [ratequant] losslessly.
  std::string dotted = text.substr(0, at + 1);
  std::istringstream ra(text.substr(text.find("[reasonalloc]") + 14));
  std::string line;
  std::string dotted_keys;
  while (std::getline(ra, line)) {
    if (!line.empty()) dotted_keys += "reasonalloc." + line + "\n";
  }
  dotted = dotted_keys + dotted;  // Root-level dotted keys must precede the first table.
  StatusOr<CalibProfile> b = ParseCalibProfile(dotted, "dotted.toml");
  INFO(b.status().message());
  REQUIRE(b.ok());
  CHECK(*b == p);
}

TEST_CASE("kvcalib: layer demand is the coverage size of the group's causal attention", "[tools]") {
  // GroupAttention's mean equals the eviction module's TokenAttentionMass for one query token,
  // within what the mass's int16 unit-row logits allow (docs/algorithms.md §12.4 (7): a logit
  // off by at most eps = |q| |k| (2 sqrt(D) 2^-15 + D 2^-30) moves each probability by a factor
  // within e^(+-2 eps)); the max is at least every head's share and covers the group.
  StatusOr<CalibrationData> data = GenerateSyntheticCalibration(
      {.sequences = 1, .layers = 1, .heads = 2, .q_heads = 6, .head_dim = 32, .tokens = 40});
  REQUIRE(data.ok());
  const KvTensorView k = data->set[0][0].k, q = data->set[0][0].q;
  const int64_t n = 30, d = 32, g = 3;
  std::vector<float> keys(n * d), rows(g * d);
  for (int64_t j = 0; j < n; ++j) k.LoadRow(j, 1, &keys[j * d]);
  for (int64_t i = 0; i < g; ++i) q.LoadRow(n - 1, g + i, &rows[i * d]);
  const std::vector<double> mean = GroupAttention(keys, rows, n, g, d, GroupReduce::kMean);
  StatusOr<KvTensorView> group = QueryGroup(q.Tokens(n - 1, 1), 2, 1);
  REQUIRE(group.ok());
  StatusOr<std::vector<double>> ref = TokenAttentionMass({keys.data(), n, d}, *group);
  REQUIRE(ref.ok());
  auto norm = [&](const float* x) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += double{x[c]} * x[c];
    return std::sqrt(ss);
  };
  double eps = 0;  // The largest logit error the unit rows allow, over every query row and key.
  for (int64_t i = 0; i < g; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      eps = std::max(eps, norm(&rows[i * d]) / std::sqrt(double(d)) * norm(&keys[j * d]) *
                              (2 * std::sqrt(double(d)) * 0x1p-15 + d * 0x1p-30));
    }
  }
  REQUIRE(eps < 0.01);  // Else the check below says little.
  for (int64_t j = 0; j < n; ++j) {
    INFO("key " << j << " eps " << eps);
    CHECK(std::abs(mean[j] - (*ref)[j]) <= (std::exp(2 * eps) - 1) * mean[j] + 1e-12);
  }
  const std::vector<double> mx = GroupAttention(keys, rows, n, g, d, GroupReduce::kMax);
  for (int64_t i = 0; i < g; ++i) {
    const std::vector<double> one = GroupAttention(
        keys, std::span<const float>(rows).subspan(i * d, d), n, 1, d, GroupReduce::kMean);
    for (int64_t j = 0; j < n; ++j) CHECK(mx[j] >= one[j]);
  }

  CHECK(DemandQueryPositions(100, 4) == std::vector<int64_t>{50, 66, 82, 99});
  CHECK(DemandQueryPositions(100, 1) == std::vector<int64_t>{99});
  CHECK(DemandQueryPositions(3, 8) == std::vector<int64_t>{1, 2});

  // Hand-computed layers. Layer 0: keys all zero, so every query spreads evenly over its p + 1
  // keys and the coverage at 0.9 is ceil(0.9 (p + 1)). Layer 1: key 0 is e_0 * 40 and queries are
  // e_0, so (almost) all mass sits on token 0: coverage 1.
  const int64_t t = 20;
  std::vector<float> zeros(t * 1 * 8, 0.0f), spike(t * 1 * 8, 0.0f), qs(t * 2 * 8, 0.0f);
  spike[0] = 40.0f;
  for (int64_t p = 0; p < t; ++p) qs[p * 16] = qs[p * 16 + 8] = 1.0f;
  const KvTensorView zk = KvTensorView::Contiguous(zeros.data(), DType::kF32, t, 1, 8);
  const KvTensorView sk = KvTensorView::Contiguous(spike.data(), DType::kF32, t, 1, 8);
  const KvTensorView qv = KvTensorView::Contiguous(qs.data(), DType::kF32, t, 2, 8);
  const CalibrationSet set = {{{zk, zk, qv}, {sk, sk, qv}}};
  StatusOr<LayerDemandProfile> dp = ComputeLayerDemand(set, {.tau = 0.9, .queries = 3});
  REQUIRE(dp.ok());
  // Positions 10, 14, 19: ceil(0.9 * 11) = 10, ceil(0.9 * 15) = 14, ceil(0.9 * 20) = 18.
  CHECK(dp->demand[0] == Approx((10.0 + 14 + 18) / 3));
  CHECK(dp->demand[1] == Approx(1.0));
  CHECK(dp->samples == std::vector<int64_t>{3, 3});
  // Without queries the pass refuses, naming the sequence and layer.
  const CalibrationSet no_q = {{{zk, zk, {}}}};
  StatusOr<LayerDemandProfile> bad = ComputeLayerDemand(no_q, {});
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Contains("data[0][0].q: missing"));
}

TEST_CASE("kvcalib: fit --method turbo measures its widths and plans over them", "[tools]") {
  // Default --bits: every width turbo has. Each unit's distortion falls with every extra bit by
  // about the Lloyd-Max ratio (0.117 -> 0.034 -> 0.0095, docs/algorithms.md §20.2).
  const CalibProfile p = TinyProfile("turbo");
  REQUIRE(p.fit.spec.method == QuantMethod::kTurbo);
  REQUIRE(p.fit.bits == std::vector<int>{2, 3, 4});
  for (const RateQuantUnit& u : p.fit.units) {
    REQUIRE(u.mse.size() == 3);
    CHECK(u.mse[0] > 2.5 * u.mse[1]);
    CHECK(u.mse[1] > 2.5 * u.mse[2]);
  }
  CHECK(p.fit.beta > 2.5);
  CHECK(p.fit.beta < 5.0);
  StatusOr<BudgetRange> range = ComputeBudgetRange(p.fit, 0, 0);
  REQUIRE(range.ok());
  const double budget = 0.5 * (range->min_bpe + range->max_bpe);
  StatusOr<KvcalibPlan> plan = BuildKvcalibPlan(p, {.quant = {.budget_bpe = budget}});
  INFO(plan.status().message());
  REQUIRE(plan.ok());
  CHECK(plan->bits.ok);
  CHECK(plan->bits.achieved_bpe <= budget + 1e-9);
  for (const HeadPlan& h : plan->quant.heads) {
    CHECK(h.k_bits >= 2);
    CHECK(h.v_bits <= 4);
  }
  // An explicit width turbo lacks is refused by name.
  FitCommandOptions o = TinyFit("turbo");
  o.bits = {2, 8};
  StatusOr<FitResult> bad = RunFit(o);
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Contains("among 2,3,4 (turbo)"));
}

TEST_CASE("kvcalib: plan totals stay within one allocation unit of the budget", "[tools]") {
  for (const char* method : {"kivi", "quarot", "kvarn", "oscar"}) {
    const CalibProfile p = TinyProfile(method);
    StatusOr<BudgetRange> range = ComputeBudgetRange(p.fit, 0, 0);
    REQUIRE(range.ok());
    CHECK(range->bits == std::vector<int>{2, 3, 4, 8});
    // Largest step is 4 -> 8 bits: 4 bits over 2 x 3 x 2 = 12 units.
    CHECK(range->unit_step_bpe == Approx(4.0 / 12));
    for (int i = 0; i <= 40; ++i) {
      const double budget = range->min_bpe + (range->max_bpe - range->min_bpe) * i / 40;
      StatusOr<KvcalibPlan> plan = BuildKvcalibPlan(p, {.quant = {.budget_bpe = budget}});
      INFO(method << " budget " << budget << ": " << plan.status().message());
      REQUIRE(plan.ok());
      CHECK(plan->bits.ok);
      CHECK(plan->bits.achieved_bpe <= budget + 1e-9);
      CHECK(budget - plan->bits.achieved_bpe <= range->unit_step_bpe + 1e-9);
      CHECK(plan->bits.achieved_bpe == Approx(plan->quant.cost_bpe).epsilon(1e-12));
    }
    // A narrower range has a smaller unit: {2, 3, 4} steps by one bit.
    StatusOr<KvcalibPlan> narrow =
        BuildKvcalibPlan(p, {.quant = {.budget_bpe = range->min_bpe + 1.3, .max_bits = 4}});
    REQUIRE(narrow.ok());
    CHECK(narrow->range.unit_step_bpe == Approx(1.0 / 12));
    CHECK(narrow->bits.ok);
    for (const HeadPlan& h : narrow->quant.heads) CHECK(std::max(h.k_bits, h.v_bits) <= 4);
  }

  // The check is independent of the planner: doctored plans fail it.
  const CalibProfile p = TinyProfile("kivi");
  StatusOr<KvcalibPlan> plan = BuildKvcalibPlan(p, {.quant = {.budget_bpe = 5.0}});
  REQUIRE(plan.ok());
  REQUIRE(plan->ok());
  RateQuantPlan over = plan->quant;
  for (HeadPlan& h : over.heads) {
    if (h.k_bits < 8) {
      h.k_bits = 8;
      break;
    }
  }
  StatusOr<BitBudgetCheck> c = CheckBitBudget(p.fit, plan->range, over, 5.0);
  REQUIRE(c.ok());
  CHECK(!c->ok);  // Over budget.
  RateQuantPlan under = plan->quant;
  for (HeadPlan& h : under.heads) h.k_bits = h.v_bits = 2;
  c = CheckBitBudget(p.fit, plan->range, under, 5.0);
  REQUIRE(c.ok());
  CHECK(!c->ok);  // Far below: more than one unit left unspent.
  under.heads[0].k_bits = 5;
  CHECK(!CheckBitBudget(p.fit, plan->range, under, 5.0).ok());

  // A profile whose units never err (alpha 0) gives the planner no reason to spend bits: the
  // command prints the report, says so on one line, exits 2 and writes no overrides.
  {
    TempDir tmp;
    CalibProfile zero = p;
    for (RateQuantUnit& u : zero.fit.units) u.alpha = 0;
    PlanCommandOptions o;
    o.profile = tmp.Path("zero.toml");
    std::ofstream(o.profile) << FormatCalibProfile(zero);
    o.plan.quant.budget_bpe = 6;
    o.json = true;
    o.overrides_toml = tmp.Path("never.toml");
    const Captured run = Capture([&](auto out, auto err) { return RunPlanCommand(o, out, err); });
    CHECK(run.rc == 2);
    CHECK(Lines(run.err) == 1);
    CHECK_THAT(run.err, Contains("budget check failed: achieved 3 b/e for 6 requested"));
    CHECK_THAT(run.out, Contains("\"ok\": false"));
    CHECK(!std::filesystem::exists(o.overrides_toml));
  }

  // Token budgets: demand and uniform sum exactly; pyramid within its documented overshoot.
  for (LayerSchedule s :
       {LayerSchedule::kDemand, LayerSchedule::kUniform, LayerSchedule::kPyramid}) {
    StatusOr<KvcalibPlan> tp = BuildKvcalibPlan(
        p, {.quant = {.budget_bpe = 4.0}, .layer_budget_tokens = 100, .schedule = s});
    INFO(LayerScheduleName(s) << ": " << tp.status().message());
    REQUIRE(tp.ok());
    REQUIRE(tp->tokens.has_value());
    const LayerTokenPlan& t = *tp->tokens;
    CHECK(t.ok);
    CHECK(t.requested_tokens == 3 * 2 * 100);
    CHECK(t.tokens.size() == 3);
    if (s != LayerSchedule::kPyramid) CHECK(t.achieved_tokens == t.requested_tokens);
    CHECK(t.achieved_tokens <= t.requested_tokens + t.tolerance_tokens);
    for (size_t l = 0; l < 3; ++l) {
      CHECK(t.bytes[l] == Approx(t.tokens[l] * 64 * 2 * t.bpe[l] / 8));
    }
  }
  // More demand, more tokens.
  StatusOr<KvcalibPlan> dp =
      BuildKvcalibPlan(p, {.quant = {.budget_bpe = 4.0}, .layer_budget_tokens = 100, .floor = 0});
  REQUIRE(dp.ok());
  const std::vector<double>& d = p.demand->demand;
  for (size_t a = 0; a < 3; ++a) {
    for (size_t b = 0; b < 3; ++b) {
      if (d[a] > d[b] + 1) CHECK(dp->tokens->tokens[a] >= dp->tokens->tokens[b]);
    }
  }
}

TEST_CASE("kvcalib: plan --mode totals equal the byte budget within one allocation unit",
          "[tools]") {
  for (const char* method : {"kivi", "oscar"}) {
    const CalibProfile p = TinyProfile(method);
    for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly, JointMode::kJoint}) {
      const JointProfileOptions base{.tokens = 512, .window = 16, .budget_bytes = int64_t{1} << 40};
      StatusOr<KvcalibJointPlan> top = BuildKvcalibJointPlan(p, mode, base);
      REQUIRE(top.ok());
      CHECK(top->check.saturated);
      const double lo = top->plan.min_bytes, hi = top->plan.max_bytes;
      double prev = std::numeric_limits<double>::infinity();
      for (int i = 0; i <= 20; ++i) {
        JointProfileOptions o = base;
        o.budget_bytes = static_cast<int64_t>(std::ceil(lo + (hi - lo) * i / 20));
        StatusOr<KvcalibJointPlan> jp = BuildKvcalibJointPlan(p, mode, o);
        INFO(method << " " << JointModeName(mode) << " budget " << o.budget_bytes << ": "
                    << jp.status().message());
        REQUIRE(jp.ok());
        const JointBudgetCheck& c = jp->check;
        CHECK(c.ok);
        CHECK(c.achieved_bytes <= static_cast<double>(o.budget_bytes) + 1e-6);
        if (!c.saturated) CHECK(c.slack_bytes <= c.unit_bytes + 1e-6);
        CHECK(c.achieved_bytes == Approx(jp->plan.bytes).epsilon(1e-12));
        CHECK(c.fp16_bytes == 3.0 * 2 * 512 * 4 * 64);
        for (const JointHeadPlan& h : jp->plan.heads) {
          CHECK(h.kept >= 16 + TraitsOf(p.fit.spec.method).streaming.sink_tokens);
          if (mode == JointMode::kQuantOnly) CHECK(h.kept == 512);
        }
        CHECK(jp->plan.distortion <= prev * (1 + 1e-12));
        prev = jp->plan.distortion;
        if (mode == JointMode::kJoint) {
          for (JointMode single : {JointMode::kQuantOnly, JointMode::kEvictOnly}) {
            StatusOr<KvcalibJointPlan> sp = BuildKvcalibJointPlan(p, single, o);
            if (sp.ok()) CHECK(jp->plan.distortion <= sp->plan.distortion * (1 + 1e-12));
          }
        }
      }
    }
  }

  // The check is independent of the planner: doctored plans fail it. No sinks (set explicitly,
  // not KIVI's registry default), so a head's floor is the 16-token window.
  const CalibProfile p = TinyProfile("kivi");
  StatusOr<KvcalibJointPlan> jp = BuildKvcalibJointPlan(
      p, JointMode::kJoint, {.tokens = 512, .sinks = 0, .window = 16, .budget_fraction = 0.3});
  REQUIRE(jp.ok());
  REQUIRE(jp->ok());
  JointPlan over = jp->plan;
  over.heads[0].kept = 512;
  over.heads[0].k_bits = over.heads[0].v_bits = 8;
  StatusOr<JointBudgetCheck> c = CheckJointBudget(jp->input, over);
  REQUIRE(c.ok());
  CHECK(!c->ok);
  JointPlan under = jp->plan;
  for (JointHeadPlan& h : under.heads) h.kept = 16;
  c = CheckJointBudget(jp->input, under);
  REQUIRE(c.ok());
  CHECK(!c->ok);
  under.heads[1].kept = 15;
  CHECK_THAT(CheckJointBudget(jp->input, under).status().message(),
             Contains("plan.heads[1].kept: got 15, expected 16..512"));

  // The command: JSON with the totals, exit 0.
  TempDir tmp;
  PlanCommandOptions o;
  o.profile = tmp.Path("p.toml");
  std::ofstream(o.profile) << FormatCalibProfile(p);
  o.mode = "joint";
  o.joint = {.tokens = 512, .sinks = 0, .budget_fraction = 0.25};  // No sinks: set, not KIVI's.
  o.plan.window = 16;
  o.json = true;
  const Captured run = Capture([&](auto out, auto err) { return RunPlanCommand(o, out, err); });
  INFO(run.err);
  CHECK(run.rc == 0);
  CHECK_THAT(run.out, Contains("\"mode\": \"joint\""));
  CHECK_THAT(run.out, Contains("\"requested_bytes\": 196608"));
  CHECK_THAT(run.out, Contains("\"ok\": true"));
  CHECK(std::count(run.out.begin(), run.out.end(), '{') == 1 + 1 + 6 + 1);  // heads, budget, time
  o.json = false;
  const Captured table = Capture([&](auto out, auto err) { return RunPlanCommand(o, out, err); });
  CHECK(table.rc == 0);
  CHECK_THAT(table.out, Contains("budget: requested 196608 B (0.25 of fp16)"));

  // Bad flags for --mode: one line, exit 1.
  auto mode_err = [&](const PlanCommandOptions& bad) {
    const Captured r = Capture([&](auto out, auto err) { return RunPlanCommand(bad, out, err); });
    CHECK(r.rc == 1);
    CHECK(Lines(r.err) == 1);
    return r.err;
  };
  PlanCommandOptions bad = o;
  bad.mode = "both";
  CHECK_THAT(mode_err(bad), Contains("--mode: got 'both', expected joint, quant-only"));
  bad = o;
  bad.joint.budget_bytes = 1000;
  CHECK_THAT(mode_err(bad), Contains("--budget-bytes/--budget-fraction: expected exactly one"));
  bad = o;
  bad.joint.tokens = 0;
  CHECK_THAT(mode_err(bad), Contains("--tokens: got 0"));
  bad = o;
  bad.plan.quant.budget_bpe = 4;
  CHECK_THAT(mode_err(bad), Contains("--budget-bpe: not used with --mode"));
  bad = o;
  bad.joint.budget_fraction = 0;
  bad.joint.budget_bytes = 1000;
  // 6 heads x (16 fixed tokens at fp16 + the worst-case tail, 127 - 16 rows, at fp16 less the
  // 2-bit rate).
  CHECK_THAT(mode_err(bad), Contains("--budget-bytes: got 1000, expected >= 163104"));
  bad = o;
  bad.joint.budget_fraction = 1.5;
  CHECK_THAT(mode_err(bad), Contains("--budget-fraction: got 1.5, expected (0, 1]"));
  bad = o;
  bad.mode = "";
  CHECK_THAT(mode_err(bad), Contains("--budget-bpe: missing"));
}

TEST_CASE("kvcalib: the overrides load with the daemon config and resolve to the plan",
          "[tools][config]") {
  TempDir tmp;
  for (const char* method : {"kivi", "oscar"}) {
    const CalibProfile p = TinyProfile(method);
    const std::string profile_path = tmp.Path(std::string(method) + ".toml");
    { std::ofstream(profile_path) << FormatCalibProfile(p); }
    for (const char* table : {"quant.override", "model.override"}) {
      PlanCommandOptions o;
      o.profile = profile_path;
      o.plan.quant.budget_bpe = 4.25;
      o.json = true;
      o.overrides_toml = tmp.Path("overrides.toml");
      o.overrides_table = table;
      const Captured run = Capture([&](auto out, auto err) { return RunPlanCommand(o, out, err); });
      INFO(method << " " << table << ": " << run.err);
      REQUIRE(run.rc == 0);
      CHECK_THAT(run.out, Contains("\"ok\": true"));
      StatusOr<KvcalibPlan> plan = BuildKvcalibPlan(p, o.plan);
      REQUIRE(plan.ok());
      bool mixed = false;
      for (const HeadPlan& h : plan->quant.heads) {
        mixed |= h.k_bits != plan->quant.heads[0].k_bits || h.v_bits != h.k_bits;
      }
      CHECK(mixed);  // Otherwise the check below would not tell heads apart.

      const QuantSpec& spec = plan->quant.spec;
      std::ostringstream settings;
      settings << "method = \"" << method
               << "\"\nk_bits = 2\nv_bits = 2\nblock_tokens = " << spec.block_tokens
               << "\nk_group_tokens = " << spec.k_group_tokens
               << "\nv_group_channels = " << spec.v_group_channels << "\n";
      const bool model = std::string(table) == "model.override";
      const std::string text = (model ? "[[model]]\nname = \"calib/tiny\"\n" : "[quant]\n") +
                               settings.str() + "\n" + ReadText(o.overrides_toml);
      Config config;
      Status applied = ApplyToml(config, text, "kvcalib-overrides.toml");
      INFO(applied.message() << "\n" << text);
      REQUIRE(applied.ok());
      REQUIRE(ValidateConfig(config).ok());
      for (const HeadPlan& h : plan->quant.heads) {
        StatusOr<QuantSpec> s = ResolveQuantSpec(config, "tiny", 64, h.layer, h.head);
        REQUIRE(s.ok());
        CHECK(QuantMethodName(s->method) == method);
        CHECK(s->k_bits == h.k_bits);
        CHECK(s->v_bits == h.v_bits);
        CHECK(s->block_tokens == spec.block_tokens);
      }
    }
  }
}

TEST_CASE("kvcalib: bad input fails with one clear line and exit status 1", "[tools]") {
  TempDir tmp;
  auto fit_err = [](FitCommandOptions o) {
    const Captured c = Capture([&](auto out, auto err) { return RunFitCommand(o, out, err); });
    CHECK(c.rc == 1);
    CHECK(Lines(c.err) == 1);
    CHECK(c.out.empty());
    return c.err;
  };
  FitCommandOptions base = TinyFit("kivi");
  base.synthetic = 0;
  base.out = tmp.Path("never.toml");

  FitCommandOptions o = base;
  o.inputs = {tmp.Path("missing")};
  CHECK_THAT(fit_err(o), Contains(tmp.Path("missing") + ": no such directory"));

  // A good dump to break in various ways.
  DumpCommandOptions dump{.out = tmp.Path("d"), .synth = kTiny};
  REQUIRE(Capture([&](auto out, auto err) { return RunDumpCommand(dump, out, err); }).rc == 0);
  const std::string seq0 = tmp.Path("d/seq_0"), seq1 = tmp.Path("d/seq_1");

  o = base;
  o.inputs = {seq0, seq1};
  o.method = "bogus";
  CHECK_THAT(fit_err(o), Contains("--method: got 'bogus'"));
  o.method = "fp16";
  CHECK_THAT(fit_err(o), Contains("--method: got 'fp16'"));
  o.method = "kivi";
  o.bits = {2, 5};
  CHECK_THAT(fit_err(o), Contains("--bits: got 2,5"));
  o.bits = {2, 3, 4, 8};
  o.importance = "gradient";
  CHECK_THAT(fit_err(o), Contains("--importance: got 'gradient'"));

  // The other layout (one file per layer) gets a hint.
  std::filesystem::create_directories(tmp.Path("flat"));
  std::filesystem::copy_file(seq0 + "/layer_0/k.npy", tmp.Path("flat/k_0.npy"));
  o = base;
  o.inputs = {tmp.Path("flat")};
  CHECK_THAT(fit_err(o), Contains("found k_0.npy or k.npy"));

  // Wrong shapes: v.npy of seq_1 layer 1 with another head_dim; then k with other heads.
  const std::string v11 = seq1 + "/layer_1/v.npy";
  std::vector<float> junk(256 * 2 * 32, 0.5f);
  REQUIRE(WriteNpy(v11, {256, 2, 32}, junk.data()).ok());
  o = base;
  o.inputs = {seq0, seq1};
  CHECK_THAT(fit_err(o), Contains(v11 + ": shape: got (256, 2, 32), expected (256, 2, 64)"));
  REQUIRE(WriteNpy(v11, {256, 2, 64}, std::vector<float>(256 * 2 * 64, 0.5f).data()).ok());
  REQUIRE(WriteNpy(seq1 + "/layer_1/k.npy", {256, 3, 64}, std::vector<float>(256 * 3 * 64).data())
              .ok());
  CHECK_THAT(fit_err(o), Contains("layer_1/k.npy: shape: got (256, 3, 64), expected (*, 2, 64)"));
  REQUIRE(WriteNpy(seq1 + "/layer_1/k.npy", {256, 2, 64}, std::vector<float>(256 * 2 * 64).data())
              .ok());

  // Queries in some layers only; a gap in the layer numbering; a missing v.npy.
  std::filesystem::remove(seq1 + "/layer_2/q.npy");
  CHECK_THAT(fit_err(o), Contains("layer_2/q.npy: missing, expected present"));
  std::filesystem::rename(seq1 + "/layer_2", seq1 + "/layer_3");
  CHECK_THAT(fit_err(o), Contains("layer numbering has a gap"));
  std::filesystem::rename(seq1 + "/layer_3", seq1 + "/layer_2");
  std::filesystem::remove(seq1 + "/layer_2/v.npy");
  CHECK_THAT(fit_err(o), Contains("layer_2/v.npy"));

  // Too short for KVarN's sinks plus one block: the fit's error names the directory.
  o = TinyFit("kvarn");
  o.synth.tokens = TraitsOf(QuantMethod::kKvarn).streaming.sink_tokens + 128 - 1;
  o.out = base.out;
  CHECK_THAT(fit_err(o), Contains("(data[0] is synthetic[0])"));
  // Layer demand without queries.
  o = base;
  o.inputs = {seq0};
  for (int l = 0; l < 3; ++l)
    std::filesystem::remove(seq0 + "/layer_" + std::to_string(l) + "/q.npy");
  o.importance = "uniform";
  CHECK_THAT(fit_err(o), Contains("--no-demand"));
  o.demand = false;
  CHECK(Capture([&](auto out, auto err) { return RunFitCommand(o, out, err); }).rc == 0);
  o.importance = "attention";
  CHECK_THAT(fit_err(o), Contains("--importance attention: the input has no q.npy"));

  // plan: missing profile, budget outside the widths, a profile with an unknown key, demand
  // schedule on a profile without [reasonalloc].
  auto plan_err = [](const PlanCommandOptions& po) {
    const Captured c = Capture([&](auto out, auto err) { return RunPlanCommand(po, out, err); });
    CHECK(c.rc == 1);
    CHECK(Lines(c.err) == 1);
    return c.err;
  };
  PlanCommandOptions po;
  po.profile = tmp.Path("nope.toml");
  po.plan.quant.budget_bpe = 4;
  CHECK_THAT(plan_err(po), Contains("nope.toml: cannot open"));
  const CalibProfile p = TinyProfile("kivi");
  po.profile = tmp.Path("p.toml");
  std::ofstream(po.profile) << FormatCalibProfile(p);
  po.plan.quant.budget_bpe = 9.5;
  CHECK_THAT(plan_err(po), Contains("--budget-bpe: got 9.5, expected 3..9 for kivi"));
  po.plan.quant.budget_bpe = 2.5;
  CHECK_THAT(plan_err(po), Contains("--budget-bpe: got 2.5"));
  po.plan.quant.budget_bpe = 4;
  po.plan.quant.min_bits = 5;
  po.plan.quant.max_bits = 7;
  CHECK_THAT(plan_err(po), Contains("--min-bits/--max-bits: got 5/7"));
  po.plan.quant.min_bits = po.plan.quant.max_bits = 0;
  po.plan.layer_budget_tokens = 12;  // Below the starvation floor max(8 + 8, 3).
  CHECK_THAT(plan_err(po), Contains("--layer-budget-tokens: got 12, expected >= the floor 16"));
  po.plan.layer_budget_tokens = 0;
  std::ofstream(po.profile) << FormatCalibProfile(p) << "\n[extra]\nx = 1\n";
  CHECK_THAT(plan_err(po), Contains("extra: unknown key"));
  CalibProfile wrong = p;
  wrong.demand->layers = 4;
  wrong.demand->samples.push_back(1);
  wrong.demand->demand.push_back(1);
  std::ofstream(po.profile) << FormatCalibProfile(wrong);
  CHECK_THAT(plan_err(po), Contains("reasonalloc: layers 4, kv_heads 2, expected 3 and 2"));
  CalibProfile bare = p;
  bare.demand.reset();
  std::ofstream(po.profile) << FormatCalibProfile(bare);
  po.plan.layer_budget_tokens = 64;
  CHECK_THAT(plan_err(po), Contains("--schedule demand: the profile has no [reasonalloc]"));
  po.plan.schedule = LayerSchedule::kUniform;
  CHECK(Capture([&](auto out, auto err) { return RunPlanCommand(po, out, err); }).rc == 0);
  std::ofstream(po.profile) << FormatCalibProfile(p);
  std::string text = ReadText(po.profile);
  const size_t first = text.find("demand = [") + 10;
  text.replace(first, text.find(',', first) - first, "-1");
  std::ofstream(po.profile) << text;
  CHECK_THAT(plan_err(po), Contains("reasonalloc.demand[0]: got -1"));
}

// Timings quoted in docs/kvcalib.md: `build/tests/tools_test "[.bench]"`.
TEST_CASE("kvcalib bench: plan 80 layers x 8 heads and fit SmolLM2-135M geometry",
          "[tools][.bench]") {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // A profile of 80 x 8 heads: fitted on 2 short synthetic sequences (the plan's cost does not
  // depend on how the alphas were obtained).
  const FitCommandOptions big = BenchFit(2, 80, 8, 8, 128);
  StatusOr<FitResult> r = RunFit(big);
  REQUIRE(r.ok());
  const std::string text = FormatCalibProfile(r->profile);
  std::vector<double> parse;
  for (int i = 0; i < 5; ++i) {
    const Clock::time_point t0 = Clock::now();
    REQUIRE(ParseCalibProfile(text, "big.toml").ok());
    parse.push_back(ms(t0));
  }
  std::printf("profile: %zu bytes, parse median %.1f ms\n", text.size(), median(parse));
  for (double budget : {3.5, 4.0, 4.25, 5.3}) {
    for (bool tokens : {false, true}) {
      std::vector<double> t;
      for (int i = 0; i < 31; ++i) {
        const Clock::time_point t0 = Clock::now();
        StatusOr<KvcalibPlan> plan = BuildKvcalibPlan(
            r->profile, {.quant = {.budget_bpe = budget}, .layer_budget_tokens = tokens ? 256 : 0});
        t.push_back(ms(t0));
        REQUIRE(plan.ok());
        REQUIRE(plan->ok());
      }
      std::printf("plan 80x8 kivi at %.2f b/e%s: median %.3f ms, min %.3f ms\n", budget,
                  tokens ? " + layer tokens" : "", median(t),
                  *std::min_element(t.begin(), t.end()));
    }
  }
  // The joint planner on the same profile: 8192 tokens per head, a 64-token window, 21% of fp16
  // (at 20% quant-only no longer fits: every token at 2 bits is exactly 20%, plus the fp16 tail).
  for (JointMode mode : {JointMode::kQuantOnly, JointMode::kEvictOnly, JointMode::kJoint}) {
    std::vector<double> t;
    for (int i = 0; i < 31; ++i) {
      const Clock::time_point t0 = Clock::now();
      StatusOr<KvcalibJointPlan> plan = BuildKvcalibJointPlan(
          r->profile, mode, {.tokens = 8192, .window = 64, .budget_fraction = 0.21});
      t.push_back(ms(t0));
      INFO(JointModeName(mode) << ": " << plan.status().message());
      REQUIRE(plan.ok());
      REQUIRE(plan->ok());
    }
    std::printf(
        "plan --mode %s 80x8 kivi, 8192 tokens, 0.21 of fp16: median %.3f ms, min %.3f ms\n",
        std::string(JointModeName(mode)).c_str(), median(t), *std::min_element(t.begin(), t.end()));
  }
  // Fit: SmolLM2-135M geometry, 32 sequences x 256 tokens, one thread.
  FitCommandOptions smol = BenchFit(32, 30, 3, 9, 64);
  smol.probe_queries = 8;
  smol.demand_options.queries = 8;
  for (const char* m : {"kivi", "quarot", "kvarn", "oscar"}) {
    smol.method = m;
    StatusOr<FitResult> f = RunFit(smol);
    REQUIRE(f.ok());
    std::printf("fit smol %s: generate %.2f s, fit %.2f s, demand %.2f s (cpu %.2f s all)\n", m,
                f->timings.load_s, f->timings.fit_s, f->timings.demand_s, f->timings.cpu_s);
  }
}

}  // namespace
}  // namespace kvctl
