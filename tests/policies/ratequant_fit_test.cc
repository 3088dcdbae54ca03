// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// RateQuant calibration: the pooled regression on known curves, fits on synthetic K/V/Q with the
// real quantizers, the TOML profile round trip, and errors that name the field.
#include "policies/ratequant_fit.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "common/half.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace ratequant_testing {

// One long synthetic sequence per layer (per-layer head statistics, outlier strength 4..16),
// cut into `sequences` calibration sequences of `tokens` tokens.
struct SyntheticCalibration {
  std::vector<SyntheticKv> layers;
  CalibrationSet set;
};

SyntheticCalibration MakeCalibration(int layers, int heads, int q_heads, int head_dim,
                                     int sequences, int64_t tokens, bool with_q) {
  SyntheticCalibration c;
  for (int l = 0; l < layers; ++l) {
    c.layers.push_back(
        GenerateSyntheticKv({.tokens = tokens * sequences,
                             .heads = heads,
                             .head_dim = head_dim,
                             .q_heads = q_heads,
                             .outlier_scale = 4.0f + 4.0f * static_cast<float>(l % 4),
                             .seed = 100 + static_cast<uint64_t>(l)}));
  }
  c.set.resize(static_cast<size_t>(sequences));
  for (int s = 0; s < sequences; ++s) {
    for (int l = 0; l < layers; ++l) {
      const SyntheticKv& kv = c.layers[static_cast<size_t>(l)];
      CalibrationLayer cl{
          kv.KView().Tokens(s * tokens, tokens), kv.VView().Tokens(s * tokens, tokens), {}};
      if (with_q) cl.q = kv.QView().Tokens(s * tokens, tokens);
      c.set[static_cast<size_t>(s)].push_back(cl);
    }
  }
  return c;
}

}  // namespace ratequant_testing

namespace {

using ratequant_testing::MakeCalibration;

constexpr QuantMethod kMethods[] = {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn,
                                    QuantMethod::kOscar};

TEST_CASE("RateQuant fit: pooled regression recovers known alpha and beta exactly", "[policies]") {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u01(0, 1);
  const std::vector<int> bits = {2, 3, 4, 8};
  for (double beta : {2.0, 3.6, 4.3, 5.3}) {
    std::vector<double> alpha, measured;
    for (int i = 0; i < 50; ++i) {
      alpha.push_back(std::pow(10.0, -4 + 6 * u01(rng)));
      for (int b : bits) measured.push_back(alpha.back() * std::pow(beta, -b));
    }
    // Unit 3 never errs (all zero: alpha 0); unit 4 has one positive point (intercept only).
    for (size_t j = 0; j < bits.size(); ++j) measured[3 * bits.size() + j] = 0;
    for (size_t j = 1; j < bits.size(); ++j) measured[4 * bits.size() + j] = 0;
    StatusOr<CurveFit> fit = FitDistortionCurves(bits, measured, 50);
    REQUIRE(fit.ok());
    CHECK(fit->beta == Approx(beta).epsilon(1e-12));
    CHECK(fit->rms_log_residual < 1e-12);
    CHECK(fit->points == 50 * 4 - 4 - 3);
    for (size_t i = 0; i < alpha.size(); ++i) {
      if (i == 3) {
        CHECK(fit->alpha[i] == 0);
      } else {
        CHECK(fit->alpha[i] == Approx(alpha[i]).epsilon(1e-10));
      }
    }
  }
  // Multiplicative noise: still close.
  std::normal_distribution<double> noise(0, 0.05);
  std::vector<double> measured;
  for (int i = 0; i < 200; ++i) {
    const double a = std::pow(10.0, -2 + 3 * u01(rng));
    for (int b : bits) measured.push_back(a * std::pow(4.5, -b) * std::exp(noise(rng)));
  }
  StatusOr<CurveFit> noisy = FitDistortionCurves(bits, measured, 200);
  REQUIRE(noisy.ok());
  CHECK(noisy->beta == Approx(4.5).epsilon(0.01));
  CHECK(noisy->rms_log_residual == Approx(0.05 * std::sqrt(0.75)).epsilon(0.2));
}

TEST_CASE("RateQuant fit: regression errors name the problem", "[policies]") {
  CHECK_THAT(FitDistortionCurves({2, 3}, {1, 2, 3}, 2).status().message(),
             Catch::Contains("measured: got 3 values, expected units * bits = 2 * 2"));
  CHECK_THAT(FitDistortionCurves({2}, {1}, 1).status().message(), Catch::Contains("bits: got 1"));
  StatusOr<CurveFit> flat = FitDistortionCurves({2, 3}, {0, 1, 0, 0}, 2);
  CHECK(flat.status().code() == StatusCode::kFailedPrecondition);
  StatusOr<CurveFit> rising = FitDistortionCurves({2, 3}, {1, 2, 1, 3}, 2);
  CHECK(rising.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(rising.status().message(), Catch::Contains("beta: fitted"));
}

// Pooled slope of an ideal min/max RTN quantizer, whose MSE is proportional to (2^b - 1)^-2:
// 4.33 per bit over {2, 3, 4, 8} (5.4 from 2 to 3 bits, 4.1 per bit from 4 to 8).
double IdealRtnBeta(const std::vector<int>& bits) {
  std::vector<double> d;
  for (int b : bits) d.push_back(std::pow(std::pow(2.0, b) - 1, -2));
  return FitDistortionCurves(bits, d, 1)->beta;
}

TEST_CASE("RateQuant fit: synthetic K/V through the real quantizers gives the RTN slope",
          "[policies]") {
  // Every registry quantizer is min/max RTN underneath, so on data without pathologies the
  // pooled slope should be the ideal RTN slope; the fp16 metadata and the data bend it slightly.
  const double ideal = IdealRtnBeta({2, 3, 4, 8});
  CHECK(ideal == Approx(4.33).epsilon(0.001));
  const auto calib = MakeCalibration(2, 2, 4, 64, 4, 256, true);
  for (QuantMethod m : kMethods) {
    StatusOr<RateQuantFit> fit =
        FitRateQuant(calib.set, {.method = m, .importance = ImportanceMode::kAttention});
    REQUIRE(fit.ok());
    INFO(QuantMethodName(m) << ": beta " << fit->beta << " K " << fit->beta_k_only << " V "
                            << fit->beta_v_only << " rms " << fit->rms_log_residual);
    CHECK(fit->beta == Approx(ideal).epsilon(0.03));
    CHECK(fit->beta_k_only == Approx(ideal).epsilon(0.03));
    CHECK(fit->beta_v_only == Approx(ideal).epsilon(0.03));
    CHECK(fit->beta_k == fit->beta);
    CHECK(fit->rms_log_residual < 0.2);  // The exponential misses the RTN curve by ~12%.
    CHECK(fit->layers == 2);
    CHECK(fit->kv_heads == 2);
    CHECK(fit->tokens == 4 * 256);
    REQUIRE(fit->units.size() == 8);
    for (const RateQuantUnit& u : fit->units) {
      CHECK(u.alpha > 0);
      CHECK(u.importance > 0);
      REQUIRE(u.mse.size() == 4);
      REQUIRE(u.attention.size() == 4);
      for (size_t j = 1; j < 4; ++j) {
        CHECK(u.mse[j] < u.mse[j - 1]);
        CHECK(u.attention[j] < u.attention[j - 1]);
      }
    }
    REQUIRE(ValidateRateQuantFit(*fit).ok());
  }
}

TEST_CASE("RateQuant fit: work is exactly one quantization per block and width (KVarN as KIVI)",
          "[policies]") {
  // Bounds the fit's cost without a clock: 3 sequences x 2 layers x 2 heads x 4 widths x the full
  // blocks after the sinks, and one K-error softmax per (sequence, layer, width, probe, query
  // head). KVarN (its sinks, 128-token blocks) does no more per token than KIVI (its sinks, 32).
  const auto calib = MakeCalibration(2, 2, 4, 64, 3, 300, true);
  for (QuantMethod m : kMethods) {
    INFO(QuantMethodName(m));
    RateQuantFitWork work;
    StatusOr<RateQuantFit> fit = FitRateQuant(
        calib.set,
        {.method = m, .importance = ImportanceMode::kAttention, .probe_queries = 5, .work = &work});
    REQUIRE(fit.ok());
    const int64_t sinks = TraitsOf(m).streaming.sink_tokens, g = fit->spec.block_tokens;
    const int64_t blocks_per_head = (300 - sinks) / g;  // E.g. KIVI 8 of 32, KVarN 2 of 128.
    CHECK(work.blocks_quantized == 3 * 2 * 2 * 4 * blocks_per_head);
    CHECK(work.attention_softmaxes == 3 * 2 * 4 * 5 * 4);
    // Quantized tokens per unit and width: KVarN's fewer blocks cover fewer tokens, never more.
    CHECK(work.blocks_quantized * g <= 3 * 2 * 2 * 4 * 300);
  }
}

TEST_CASE("RateQuant fit: attention proxy tracks the measured attention error", "[policies]") {
  // w_i * MSE_i estimates the attention-output error unit i causes: across units and widths it
  // should follow the measured error within a small factor.
  const auto calib = MakeCalibration(4, 2, 4, 64, 4, 256, true);
  StatusOr<RateQuantFit> fit = FitRateQuant(
      calib.set, {.method = QuantMethod::kKivi, .importance = ImportanceMode::kAttention});
  REQUIRE(fit.ok());
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  int n = 0;
  for (const RateQuantUnit& u : fit->units) {
    for (size_t j = 0; j < 3; ++j) {  // 2..4 bits; 8-bit errors sit near float noise.
      const double x = std::log(u.importance * u.mse[j]), y = std::log(u.attention[j]);
      sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y, ++n;
      CHECK(std::fabs(x - y) < std::log(8.0));
    }
  }
  const double corr = (n * sxy - sx * sy) / std::sqrt((n * sxx - sx * sx) * (n * syy - sy * sy));
  INFO("log-log correlation " << corr);
  CHECK(corr > 0.9);

  // The attention target fits its own slope; per-kind slopes are kept when asked.
  StatusOr<RateQuantFit> attn = FitRateQuant(calib.set, {.method = QuantMethod::kKivi,
                                                         .target = DistortionTarget::kAttention,
                                                         .per_kind_beta = true});
  REQUIRE(attn.ok());
  CHECK(attn->beta > 3.0);
  CHECK(attn->beta < 6.0);
  CHECK(attn->beta_k == attn->beta_k_only);
  CHECK(attn->beta_v == attn->beta_v_only);
  CHECK(attn->beta_k != attn->beta_v);
  StatusOr<RateQuantPlan> plan = PlanRateQuant(*attn, {.budget_bpe = 4.0});
  REQUIRE(plan.ok());
  StatusOr<PlanScore> score = ScorePlan(*attn, *plan);
  REQUIRE(score.ok());
  CHECK(score->has_attention);
  CHECK(score->measured == Approx(score->attention).epsilon(1e-12));  // Uniform importance.
}

TEST_CASE("RateQuant fit: decode-time importance counts only the keys flushed before a probe",
          "[policies]") {
  // A decoding query reads its newest keys as fp16 tail rows: with decode_flush_tokens F a probe
  // seeing n tokens weighs only the first n / F * F of them. Fewer quantized keys can only lower
  // w_V = D sum a^2 (a subset of the same positive terms), and must for some unit; flush 1 (every
  // key before the probe is flushed) reproduces the prefill-time weights exactly.
  const auto calib = MakeCalibration(2, 2, 4, 64, 2, 512, true);
  RateQuantFitOptions o{.method = QuantMethod::kKivi, .importance = ImportanceMode::kAttention};
  o.decode_flush_tokens = 0;
  StatusOr<RateQuantFit> prefill = FitRateQuant(calib.set, o);
  o.decode_flush_tokens = 1;
  StatusOr<RateQuantFit> every = FitRateQuant(calib.set, o);
  o.decode_flush_tokens = 128;
  StatusOr<RateQuantFit> decode = FitRateQuant(calib.set, o);
  o.decode_flush_tokens = -1;  // KIVI's registry flush, as given explicitly.
  StatusOr<RateQuantFit> method_flush = FitRateQuant(calib.set, o);
  o.decode_flush_tokens = TraitsOf(QuantMethod::kKivi).streaming.flush_tokens;
  StatusOr<RateQuantFit> explicit_flush = FitRateQuant(calib.set, o);
  REQUIRE(explicit_flush.ok());
  REQUIRE(prefill.ok());
  REQUIRE(every.ok());
  REQUIRE(decode.ok());
  REQUIRE(method_flush.ok());
  int lower = 0;
  for (size_t i = 0; i < prefill->units.size(); ++i) {
    INFO("unit " << i);
    CHECK(every->units[i].importance == prefill->units[i].importance);
    CHECK(method_flush->units[i].importance == explicit_flush->units[i].importance);
    if (prefill->units[i].kind == UnitKind::kValue) {
      CHECK(decode->units[i].importance <= prefill->units[i].importance * (1 + 1e-12));
      lower += decode->units[i].importance < prefill->units[i].importance * (1 - 1e-6);
    }
    CHECK(decode->units[i].importance > 0);
  }
  CHECK(lower > 0);

  // Too short to have anything flushed when a probe reads: an error naming the option.
  const auto shorter = MakeCalibration(1, 2, 4, 64, 1, 96, true);
  o.decode_flush_tokens = 128;
  StatusOr<RateQuantFit> bad = FitRateQuant(shorter.set, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("decode_flush_tokens 128") != std::string::npos);
  o.decode_flush_tokens = -2;
  CHECK_FALSE(FitRateQuant(calib.set, o).ok());
}

TEST_CASE("RateQuant fit: importance relative to the layer output is scale-free across layers",
          "[policies]") {
  // Layer 1 is layer 0 with V times 16 (a deeper layer's larger activations). RTN is scale-
  // equivariant, so V's MSE grows 256x and so does every absolute attention error; relative to
  // each layer's ||o||^2 the two layers' units are the same, so no plan starves the small layer.
  SyntheticKv base = GenerateSyntheticKv(
      {.tokens = 512, .heads = 2, .head_dim = 64, .q_heads = 4, .outlier_scale = 8, .seed = 7});
  SyntheticKv scaled = base;
  for (float& x : scaled.v) x *= 16.0f;
  CalibrationSet set(2);
  for (int s = 0; s < 2; ++s) {
    for (const SyntheticKv* kv : {&base, &scaled}) {
      set[static_cast<size_t>(s)].push_back({kv->KView().Tokens(s * 256, 256),
                                             kv->VView().Tokens(s * 256, 256),
                                             kv->QView().Tokens(s * 256, 256)});
    }
  }
  RateQuantFitOptions o{.method = QuantMethod::kKivi, .importance = ImportanceMode::kAttention};
  StatusOr<RateQuantFit> relative = FitRateQuant(set, o);
  o.relative_to_output = false;
  StatusOr<RateQuantFit> absolute = FitRateQuant(set, o);
  REQUIRE(relative.ok());
  REQUIRE(absolute.ok());
  const size_t per_layer = 2 * 2;  // Heads x {K, V}.
  for (size_t i = 0; i < per_layer; ++i) {
    const RateQuantUnit& r0 = relative->units[i];
    const RateQuantUnit& r1 = relative->units[per_layer + i];
    const RateQuantUnit& a0 = absolute->units[i];
    const RateQuantUnit& a1 = absolute->units[per_layer + i];
    INFO("unit " << i);
    CHECK(r1.importance * r1.mse[0] == Approx(r0.importance * r0.mse[0]).epsilon(1e-3));
    CHECK(r1.attention[0] == Approx(r0.attention[0]).epsilon(1e-3));
    CHECK(a1.importance * a1.mse[0] == Approx(256 * a0.importance * a0.mse[0]).epsilon(1e-3));
    CHECK(a1.attention[0] == Approx(256 * a0.attention[0]).epsilon(1e-3));
  }
}

TEST_CASE("RateQuant fit: fp16 views and MSE-only data work", "[policies]") {
  const auto calib = MakeCalibration(1, 2, 2, 64, 2, 256, false);
  std::vector<uint16_t> k16, v16;
  for (float x : calib.layers[0].k) k16.push_back(FloatToHalf(x));
  for (float x : calib.layers[0].v) v16.push_back(FloatToHalf(x));
  CalibrationSet set(2);
  for (int s = 0; s < 2; ++s) {
    set[static_cast<size_t>(s)].push_back(
        {KvTensorView::Contiguous(k16.data(), DType::kF16, 512, 2, 64).Tokens(s * 256, 256),
         KvTensorView::Contiguous(v16.data(), DType::kF16, 512, 2, 64).Tokens(s * 256, 256),
         {}});
  }
  StatusOr<RateQuantFit> f16 = FitRateQuant(set, {.method = QuantMethod::kQuaRot});
  StatusOr<RateQuantFit> f32 = FitRateQuant(calib.set, {.method = QuantMethod::kQuaRot});
  REQUIRE(f16.ok());
  REQUIRE(f32.ok());
  CHECK(f16->beta == Approx(f32->beta).epsilon(0.02));
  CHECK(f16->units[0].attention.empty());
  CHECK(f16->units[0].importance == 1);
}

TEST_CASE("RateQuant fit: profile round-trips exactly", "[policies]") {
  const auto calib = MakeCalibration(2, 2, 4, 64, 2, 256, true);
  StatusOr<RateQuantFit> fit = FitRateQuant(calib.set, {.method = QuantMethod::kOscar,
                                                        .bits = {2, 3, 4},
                                                        .importance = ImportanceMode::kAttention,
                                                        .per_kind_beta = true});
  REQUIRE(fit.ok());
  const std::string text = FormatRateQuantProfile(*fit);
  StatusOr<RateQuantFit> back = ParseRateQuantProfile(text, "mem.toml");
  REQUIRE(back.ok());
  CHECK(*back == *fit);
  CHECK(FormatRateQuantProfile(*back) == text);

  char path[] = "/tmp/ratequant_profile_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(path) << text;
  StatusOr<RateQuantFit> read = ReadRateQuantProfile(path);
  std::remove(path);
  REQUIRE(read.ok());
  CHECK(*read == *fit);
  CHECK(ReadRateQuantProfile("/nonexistent/p.toml").status().code() == StatusCode::kNotFound);

  // A plan from the profile equals a plan from the fit.
  StatusOr<RateQuantPlan> a = PlanRateQuant(*fit, {.budget_bpe = 4.5});
  StatusOr<RateQuantPlan> b = PlanRateQuant(*back, {.budget_bpe = 4.5});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(FormatOverridesToml(*a) == FormatOverridesToml(*b));
}

TEST_CASE("RateQuant fit: profile errors name the key", "[policies]") {
  const std::string head =
      "[ratequant]\nversion = 1\nmethod = \"kivi\"\nhead_dim = 64\nlayers = 1\nkv_heads = 1\n"
      "bits = [2, 3]\nbeta_k = 4.0\nbeta_v = 4.0\n";
  const std::string units =
      "[[ratequant.units]]\nlayer = 0\nhead = 0\nkind = \"k\"\nalpha = 1.0\n"
      "[[ratequant.units]]\nlayer = 0\nhead = 0\nkind = \"v\"\nalpha = 2.0\n";
  REQUIRE(ParseRateQuantProfile(head + units, "p.toml").ok());
  auto error = [&](const std::string& text) {
    return ParseRateQuantProfile(text, "p.toml").status().message();
  };
  CHECK_THAT(error(head + "colour = 1\n" + units),
             Catch::Contains("p.toml: ratequant.colour: unknown key"));
  CHECK_THAT(error(head + "[[ratequant.units]]\nlayer = 0\nhead = 0\nkind = \"k\"\nalpha = -1.0\n"),
             Catch::Contains("p.toml: ratequant.units[0].alpha: got -1"));
  CHECK_THAT(
      error(head + units + "[[ratequant.units]]\nlayer = 0\nhead = 0\nkind = \"x\"\nalpha = 1.0\n"),
      Catch::Contains("ratequant.units[2].kind: got \"x\", expected \"k\" or \"v\""));
  CHECK_THAT(
      error(head + units + "[[ratequant.units]]\nlayer = 0\nhead = 0\nkind = \"k\"\nalpha = 1.0\n"),
      Catch::Contains("ratequant.units: got 3, expected 2 * layers * kv_heads = 2"));
  std::string no_beta = head;
  no_beta.replace(no_beta.find("beta_k = 4.0\n"), 13, "");
  CHECK_THAT(error(no_beta + units), Catch::Contains("ratequant.beta_k: missing"));
  std::string bad_method = head;
  bad_method.replace(bad_method.find("kivi"), 4, "zip");
  CHECK_THAT(error(bad_method + units), Catch::Contains("ratequant.method: "));
  std::string bad_bits = head;
  bad_bits.replace(bad_bits.find("[2, 3]"), 6, "[2, 5]");
  CHECK_THAT(error(bad_bits + units), Catch::Contains("bits[1]"));
  CHECK_THAT(error(head + units + "mse = [1.0, \"x\"]\n"),
             Catch::Contains("ratequant.units[1].mse[1]: got \"x\""));
  CHECK_THAT(error("[ratequant\n"), Catch::StartsWith("p.toml:1:"));
  CHECK_THAT(error("x = 1\n"), Catch::Contains("p.toml: x: unknown key"));
}

TEST_CASE("RateQuant fit: bad calibration input errors name the field", "[policies]") {
  auto calib = MakeCalibration(2, 2, 4, 64, 2, 256, true);
  auto error = [](const CalibrationSet& set, const RateQuantFitOptions& o) {
    return FitRateQuant(set, o).status().message();
  };
  CHECK_THAT(error({}, {}), Catch::Contains("data: got 0 sequences"));
  CalibrationSet set = calib.set;
  set[1].pop_back();
  CHECK_THAT(error(set, {}), Catch::Contains("data[1]: got 1 layers, expected 2"));
  set = calib.set;
  set[0][1].v.head_dim = 32;
  CHECK_THAT(error(set, {}), Catch::Contains("data[0][1].v: shape [256, 2, 32]"));
  set = calib.set;
  set[1][0].q = {};
  CHECK_THAT(error(set, {}), Catch::Contains("data[1][0].q: missing"));
  set = calib.set;
  for (auto& seq : set) {
    for (auto& l : seq) l.q = {};
  }
  CHECK_THAT(error(set, {.target = DistortionTarget::kAttention}),
             Catch::Contains("target: got attention"));
  CHECK_THAT(error(set, {.importance = ImportanceMode::kAttention}),
             Catch::Contains("importance: got attention"));
  CHECK_THAT(error(calib.set, {.target = DistortionTarget::kAttention,
                               .importance = ImportanceMode::kAttention}),
             Catch::Contains("importance: got attention with target attention"));
  CHECK_THAT(error(calib.set, {.bits = {2, 5}}), Catch::Contains("bits[1]: "));
  CHECK_THAT(error(calib.set, {.bits = {4, 2}}), Catch::Contains("bits[1]: got 2, expected > 4"));
  CHECK_THAT(error(calib.set, {.bits = {4}}), Catch::Contains("bits: got 1 widths"));
  CHECK_THAT(error(calib.set, {.method = QuantMethod::kFp16}), Catch::Contains("method: got fp16"));
  CHECK_THAT(error(calib.set, {.block_tokens = -1}), Catch::Contains("block_tokens: got -1"));
  CHECK_THAT(error(calib.set, {.probe_queries = 0}), Catch::Contains("probe_queries: got 0"));
  // The shortest sequence a KVarN fit can use: its registry sinks + one 128-token block.
  const int sinks = TraitsOf(QuantMethod::kKvarn).streaming.sink_tokens;
  const int too_short = sinks + 128 - 1;
  set = calib.set;
  for (auto& seq : set) {
    for (auto& l : seq) l.k.tokens = l.v.tokens = l.q.tokens = too_short;
  }
  CHECK_THAT(error(set, {.method = QuantMethod::kKvarn}),
             Catch::Contains("data[0][0].k: tokens: got " + std::to_string(too_short) +
                             ", expected >= " + std::to_string(too_short + 1) + " (" +
                             std::to_string(sinks) + " kvarn sink tokens + one 128-token block)"));
  calib.layers[1].k[5 * 2 * 64 + 3] = NAN;  // Token 5 of sequence 0, layer 1, head 0, channel 3.
  CHECK_THAT(error(calib.set, {}), Catch::Contains("data[0][1].k"));
}

}  // namespace
}  // namespace kvctl
