// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Eviction scorers against small cases computed by hand. Most cases use the query scale
// c = sqrt(2) * ln 2 with D = 2, so a logit q.k / sqrt(2) is ln 2 times a small integer and every
// softmax is a ratio of powers of two.
#include "policies/eviction.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/half.h"
#include "kernels/quantize.h"
#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

using Catch::Matchers::Contains;

const float kC = static_cast<float>(std::sqrt(2.0) * std::log(2.0));
// R-KV's and SnapKV's logits come from int16 unit rows (policies/eviction.cc): each is off by at
// most eps = |q| |k| (2 sqrt(D) 2^-15 + D 2^-30), so a softmax probability, and a mean of them, by
// a factor within e^(+-2 eps). In these cases |q| |k| <= 2.1 at D = 2: at most 3.6e-4 relative.
constexpr double kUnitLogitRel = 4e-4;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Queries as a dense fp32 [tokens, heads, D] view over `storage`.
KvTensorView Queries(const std::vector<float>& storage, int64_t tokens, int64_t heads,
                     int64_t head_dim) {
  return KvTensorView::Contiguous(storage.data(), DType::kF32, tokens, heads, head_dim);
}

// The six keys of the main case (D = 2); tokens 4 and 5 are the recent window.
//   k0 = (2,0)  k1 = (0,1)  k2 = (1,1)  k3 = (3,0)  | k4 = (0,2)  k5 = (1,0)
// Observation queries (the last two tokens, one head each): qa = c(1,0), qb = c(0,1).
const std::vector<float> kKeys6 = {2, 0, 0, 1, 1, 1, 3, 0, 0, 2, 1, 0};
const std::vector<float> kObs2 = {kC, 0, 0, kC};
const KeyRows kRows6{kKeys6.data(), 6, 2};

// Importance over the non-window keys 0..3:
//   qa: logits/ln2 = k_x = (2,0,1,3) -> 2^x = (4,1,2,8)/15
//   qb: logits/ln2 = k_y = (0,1,1,0) -> (1,2,2,1)/6
//   a = mean = (8+5, 2+10, 4+10, 16+5)/60 = (13, 12, 14, 21)/60
const double kA[4] = {13 / 60.0, 12 / 60.0, 14 / 60.0, 21 / 60.0};

// Redundancy. Unit keys: u0=u3=u5=(1,0), u1=u4=(0,1), u2=(1,1)/sqrt2. Off-diagonal cosines above
// 0.5 and the most recent one per row (zeroed): row0 {2,3,5}->5, row1 {2,4}->4,
// row2 {0,1,3,4,5}->5, row3 {0,2,5}->5, row4 {1,2}->2, row5 {0,2,3}->3. With s = 1/sqrt2 the
// column sums left are (2+s, 1+s, 4s, 1+s, s, 0), the means divide by 6, r = softmax of the means.
std::vector<double> HandRedundancy() {
  const double s = 1 / std::sqrt(2.0);
  const double col[6] = {2 + s, 1 + s, 4 * s, 1 + s, s, 0};
  double z = 0;
  for (double c : col) z += std::exp(c / 6);
  std::vector<double> r;
  for (double c : col) r.push_back(std::exp(c / 6) / z);
  return r;
}

TEST_CASE("SnapKV: importance and pooling match the hand case", "[policies]") {
  const KvTensorView q = Queries(kObs2, 2, 1, 2);
  const ProtectedRegions regions{0, 2};
  struct Case {
    int kernel;
    PoolKind pool;
    double expect[4];
  };
  const Case cases[] = {
      {1, PoolKind::kMax, {kA[0], kA[1], kA[2], kA[3]}},
      // Max over [j-1, j+1]: (13, 14, 21, 21)/60.
      {3, PoolKind::kMax, {13 / 60.0, 14 / 60.0, 21 / 60.0, 21 / 60.0}},
      // Sum over [j-1, j+1] / 3, the padding counts: (0+13+12, 13+12+14, 12+14+21, 14+21+0)/180.
      {3, PoolKind::kAvg, {25 / 180.0, 39 / 180.0, 47 / 180.0, 35 / 180.0}},
      // Kernel 5 (SnapKV's default): (13+12+14, 60, 60, 12+14+21)/300.
      {5, PoolKind::kAvg, {39 / 300.0, 60 / 300.0, 60 / 300.0, 47 / 300.0}},
      // Kernel 7 covers all four keys from every position.
      {7, PoolKind::kMax, {21 / 60.0, 21 / 60.0, 21 / 60.0, 21 / 60.0}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.kernel, static_cast<int>(c.pool));
    auto scores =
        ScoreSnapKV(kRows6, q, regions, {.obs_window = 32, .kernel = c.kernel, .pool = c.pool});
    REQUIRE(scores.ok());
    REQUIRE(scores->size() == 6);
    for (int j = 0; j < 4; ++j) CHECK((*scores)[j] == Approx(c.expect[j]).epsilon(kUnitLogitRel));
    CHECK((*scores)[4] == kInf);
    CHECK((*scores)[5] == kInf);
  }
}

TEST_CASE("SnapKV: the observation window takes the last queries only", "[policies]") {
  // obs_window = 1 keeps qb alone: (1,2,2,1)/6.
  auto scores =
      ScoreSnapKV(kRows6, Queries(kObs2, 2, 1, 2), {0, 2}, {.obs_window = 1, .kernel = 1});
  REQUIRE(scores.ok());
  const double expect[4] = {1 / 6.0, 2 / 6.0, 2 / 6.0, 1 / 6.0};
  for (int j = 0; j < 4; ++j) CHECK((*scores)[j] == Approx(expect[j]).epsilon(kUnitLogitRel));
}

TEST_CASE("R-KV: redundancy and the combined score match the hand case", "[policies]") {
  const KvTensorView q = Queries(kObs2, 2, 1, 2);
  const std::vector<double> r = HandRedundancy();
  // lambda = 0 leaves -r.
  auto red = ScoreRKV(kRows6, q, {0, 2}, {.kernel = 1, .lambda = 0.0f});
  REQUIRE(red.ok());
  for (int j = 0; j < 4; ++j) CHECK((*red)[j] == Approx(-r[j]).epsilon(1e-5));
  // lambda = 1 is SnapKV with R-KV's pooling.
  auto imp = ScoreRKV(kRows6, q, {0, 2}, {.kernel = 3, .lambda = 1.0f});
  auto snap =
      ScoreSnapKV(kRows6, q, {0, 2}, {.obs_window = 8, .kernel = 3, .pool = PoolKind::kMax});
  REQUIRE(imp.ok());
  REQUIRE(snap.ok());
  CHECK(*imp == *snap);
  // Defaults (kernel 7, lambda 0.07): 0.07 * 21/60 - 0.93 * r_j.
  auto full = ScoreRKV(kRows6, q, {0, 2});
  REQUIRE(full.ok());
  for (int j = 0; j < 4; ++j) {
    CHECK((*full)[j] == Approx(0.07 * 21 / 60.0 - 0.93 * r[j]).epsilon(kUnitLogitRel));
  }
  // Kernel 3: 0.07 * (13, 14, 21, 21)/60 - 0.93 * r.
  auto k3 = ScoreRKV(kRows6, q, {0, 2}, {.kernel = 3});
  REQUIRE(k3.ok());
  const double pooled[4] = {13, 14, 21, 21};
  for (int j = 0; j < 4; ++j) {
    CHECK((*k3)[j] == Approx(0.07 * pooled[j] / 60 - 0.93 * r[j]).epsilon(kUnitLogitRel));
  }
  CHECK((*k3)[4] == kInf);
}

TEST_CASE("R-KV: the most recent near-duplicate is spared", "[policies]") {
  // k0 = k1 = k2 = (1,0), k3 = (0,1). Rows: 0 -> {1,2} zero S02; 1 -> {0,2} zero S12;
  // 2 -> {0,1} zero S21; 3 -> none. Column sums (2, 1, 0, 0): the newest copy (2) is left with
  // no redundancy, the oldest with the most. Without the rule all three copies would sum to 2.
  const std::vector<float> keys = {1, 0, 1, 0, 1, 0, 0, 1};
  const std::vector<float> obs = {kC, 0};
  auto scores = ScoreRKV({keys.data(), 4, 2}, Queries(obs, 1, 1, 2), {0, 0}, {.lambda = 0.0f});
  REQUIRE(scores.ok());
  const double z = std::exp(0.5) + std::exp(0.25) + 2;
  CHECK((*scores)[0] == Approx(-std::exp(0.5) / z).epsilon(kUnitLogitRel));
  CHECK((*scores)[1] == Approx(-std::exp(0.25) / z).epsilon(kUnitLogitRel));
  CHECK((*scores)[2] == Approx(-1 / z).epsilon(kUnitLogitRel));
  CHECK((*scores)[2] > (*scores)[1]);
  CHECK((*scores)[1] > (*scores)[0]);
  auto kept = SelectKeep(*scores, 2, ProtectedMask(4, {0, 0}));
  REQUIRE(kept.ok());
  CHECK(*kept == std::vector<int64_t>{2, 3});
}

TEST_CASE("R-KV: sinks stay in the softmax and score +inf", "[policies]") {
  const KvTensorView q = Queries(kObs2, 2, 1, 2);
  auto plain = ScoreRKV(kRows6, q, {0, 2}, {.kernel = 3});
  auto sunk = ScoreRKV(kRows6, q, {1, 2}, {.kernel = 3});
  REQUIRE(plain.ok());
  REQUIRE(sunk.ok());
  CHECK((*sunk)[0] == kInf);
  for (int j = 1; j < 6; ++j) CHECK((*sunk)[j] == (*plain)[j]);
}

TEST_CASE("R-KV: GQA takes the max of the logits over the group, then the softmax", "[policies]") {
  // KV head 1 of 2, g = 2: query heads 2 and 3. Keys k0=(1,0), k1=(0,1), k2=(1,1), k3 window.
  // head 2 = c(1,0): logits/ln2 (1,0,1); head 3 = c(0,2): (0,2,2); max (1,2,2) -> (2,4,4)/10.
  // (Softmax first, then max, would give (0.4, 4/9, 4/9).)
  const std::vector<float> keys = {1, 0, 0, 1, 1, 1, 5, 5};
  const std::vector<float> q = {9, 9, -9, 9, kC, 0, 0, 2 * kC};  // Heads 0,1 read KV head 0.
  auto group = QueryGroup(Queries(q, 1, 4, 2), 2, 1);
  REQUIRE(group.ok());
  CHECK(group->heads == 2);
  auto scores = ScoreSnapKV({keys.data(), 4, 2}, *group, {0, 1}, {.kernel = 1});
  REQUIRE(scores.ok());
  CHECK((*scores)[0] == Approx(0.2).epsilon(kUnitLogitRel));
  CHECK((*scores)[1] == Approx(0.4).epsilon(kUnitLogitRel));
  CHECK((*scores)[2] == Approx(0.4).epsilon(kUnitLogitRel));
  CHECK((*scores)[3] == kInf);

  // The same through fp16 queries: only the rounding of c changes.
  std::vector<uint16_t> q16;
  for (float v : q) q16.push_back(FloatToHalf(v));
  auto group16 = QueryGroup(KvTensorView::Contiguous(q16.data(), DType::kF16, 1, 4, 2), 2, 1);
  REQUIRE(group16.ok());
  auto scores16 = ScoreSnapKV({keys.data(), 4, 2}, *group16, {0, 1}, {.kernel = 1});
  REQUIRE(scores16.ok());
  for (int j = 0; j < 3; ++j) CHECK((*scores16)[j] == Approx((*scores)[j]).epsilon(2e-3));
}

TEST_CASE("SnapKV/R-KV: logits from int16 unit rows stay within their bound", "[policies]") {
  // Model-like keys (two outlier channels, a near-zero key) and g = 3 query heads, D = 64. The
  // importance of every candidate against one computed here in double from exact logits: with
  // eps the largest |q| |k| (2 sqrt(D) 2^-15 + D 2^-30) over the pairs, every softmax probability
  // and their mean move by a factor within e^(+-2 eps) (plus float roundings of the scorer).
  const int64_t t_n = 300, d = 64, g = 3, m = 8, recent = 8;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> keys(static_cast<size_t>(t_n * d));
  for (int64_t t = 0; t < t_n; ++t) {
    for (int64_t c = 0; c < d; ++c) {
      keys[t * d + c] = normal(rng) * (c == 3 || c == 40 ? 12.0f : 1.0f);
    }
  }
  for (int64_t c = 0; c < d; ++c) keys[5 * d + c] = 1e-6f * static_cast<float>(c % 3);
  std::vector<float> q(static_cast<size_t>(m * g * d));
  for (float& x : q) x = 1.5f * normal(rng);
  auto scores = ScoreSnapKV({keys.data(), t_n, d}, Queries(q, m, g, d), {0, recent}, {.kernel = 1});
  REQUIRE(scores.ok());

  const int64_t n = t_n - recent;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double eps = 0;
  std::vector<double> a(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> z(static_cast<size_t>(n), -1e300);
    for (int64_t h = 0; h < g; ++h) {
      const float* qr = q.data() + (i * g + h) * d;
      double qn = 0;
      for (int64_t c = 0; c < d; ++c) qn += static_cast<double>(qr[c]) * qr[c] * scale * scale;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0, kn = 0;
        for (int64_t c = 0; c < d; ++c) {
          dot += static_cast<double>(qr[c]) * scale * keys[j * d + c];
          kn += static_cast<double>(keys[j * d + c]) * keys[j * d + c];
        }
        z[j] = std::max(z[j], dot);
        eps = std::max(eps, std::sqrt(qn * kn) * (2 * std::sqrt(64.0) * 0x1p-15 + 64 * 0x1p-30));
      }
    }
    const double top = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (double v : z) sum += std::exp(v - top);
    for (int64_t j = 0; j < n; ++j) a[j] += std::exp(z[j] - top) / sum / static_cast<double>(m);
  }
  INFO("eps " << eps);
  CHECK(eps < 0.05);  // The bound is meaningful at these magnitudes.
  const double factor = std::exp(2 * eps) - 1 + 1e-5;
  double worst = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double err = std::abs((*scores)[j] - a[j]) / a[j];
    worst = std::max(worst, err);
    CHECK(err <= factor);
  }
  INFO("worst relative error " << worst << ", allowed " << factor);
  // Not the float path: DotRef's float logits are off by 1.3e-6 at most on this case (measured
  // with the scorer of f417454), the int16 rows by 1.9e-3.
  CHECK(worst > 1e-4);
}

TEST_CASE("SnapKV: the mean of per-head softmaxes over the group (SnapKV's code)", "[policies]") {
  // The keys and queries of the max-of-logits case: head 2 = c(1,0) gives logits/ln2 (1,0,1) ->
  // (2,1,2)/5; head 3 = c(0,2) gives (0,2,2) -> (1,4,4)/9; a = their mean.
  const std::vector<float> keys = {1, 0, 0, 1, 1, 1, 5, 5};
  const std::vector<float> q = {9, 9, -9, 9, kC, 0, 0, 2 * kC};
  auto group = QueryGroup(Queries(q, 1, 4, 2), 2, 1);
  REQUIRE(group.ok());
  auto scores = ScoreSnapKV({keys.data(), 4, 2}, *group, {0, 1},
                            {.kernel = 1, .group = GqaReduce::kMeanProb});
  REQUIRE(scores.ok());
  CHECK((*scores)[0] == Approx((0.4 + 1 / 9.0) / 2).epsilon(kUnitLogitRel));
  CHECK((*scores)[1] == Approx((0.2 + 4 / 9.0) / 2).epsilon(kUnitLogitRel));
  CHECK((*scores)[2] == Approx((0.4 + 4 / 9.0) / 2).epsilon(kUnitLogitRel));
  CHECK((*scores)[3] == kInf);
  // R-KV's max of logits differs on this case (see the test above), so the switch is live.
  auto rkv = ScoreRKV({keys.data(), 4, 2}, *group, {0, 1},
                      {.kernel = 1, .lambda = 1.0f, .group = GqaReduce::kMeanProb});
  REQUIRE(rkv.ok());
  for (int j = 0; j < 3; ++j) CHECK((*rkv)[j] == Approx((*scores)[j]).epsilon(1e-6));
}

TEST_CASE("SnapKV: a causal softmax puts the window in the denominator", "[policies]") {
  // The main case with the window's keys in each query's softmax: qa at position 4 sees k0..k4,
  // logits/ln2 = k_x = (2,0,1,3,0) -> (4,1,2,8,1)/16; qb at 5 sees k0..k5, k_y = (0,1,1,0,2,0)
  // -> (1,2,2,1,4,1)/11. a_j (j < 4) is the mean; the window's own columns are dropped.
  auto scores = ScoreSnapKV(kRows6, Queries(kObs2, 2, 1, 2), {0, 2},
                            {.kernel = 1, .softmax = SoftmaxScope::kCausal});
  REQUIRE(scores.ok());
  const double expect[4] = {(4 / 16.0 + 1 / 11.0) / 2, (1 / 16.0 + 2 / 11.0) / 2,
                            (2 / 16.0 + 2 / 11.0) / 2, (8 / 16.0 + 1 / 11.0) / 2};
  for (int j = 0; j < 4; ++j) CHECK((*scores)[j] == Approx(expect[j]).epsilon(kUnitLogitRel));
  CHECK((*scores)[4] == kInf);
  // Candidates-only normalises each query over k0..k3: kA, a different ranking weight.
  CHECK((*scores)[3] != Approx(kA[3]).epsilon(1e-3));
}

TEST_CASE("R-KV: observation queries inside the candidates are causal", "[policies]") {
  // recent = 0 and two observation queries c(1,0) at positions 2 and 3 over keys
  // k0=(2,0), k1=(0,0), k2=(1,0), k3=(0,1). Query at 2 sees k0..k2: (4,1,2)/7; query at 3 sees
  // all: (4,1,2,1)/8. a = mean.
  const std::vector<float> keys = {2, 0, 0, 0, 1, 0, 0, 1};
  const std::vector<float> obs = {kC, 0, kC, 0};
  auto scores = ScoreSnapKV({keys.data(), 4, 2}, Queries(obs, 2, 1, 2), {0, 0}, {.kernel = 1});
  REQUIRE(scores.ok());
  const double expect[4] = {(4 / 7.0 + 0.5) / 2, (1 / 7.0 + 0.125) / 2, (2 / 7.0 + 0.25) / 2,
                            0.125 / 2};
  for (int j = 0; j < 4; ++j) CHECK((*scores)[j] == Approx(expect[j]).epsilon(kUnitLogitRel));
}

TEST_CASE("StreamingLLM: keeps the sinks and the recent window, then the newest", "[policies]") {
  auto scores = ScoreStreaming(10, {2, 3});
  REQUIRE(scores.ok());
  const auto mask = ProtectedMask(10, {2, 3});
  auto five = SelectKeep(*scores, 5, mask);
  auto six = SelectKeep(*scores, 6, mask);
  REQUIRE(five.ok());
  REQUIRE(six.ok());
  CHECK(*five == std::vector<int64_t>{0, 1, 7, 8, 9});
  CHECK(*six == std::vector<int64_t>{0, 1, 6, 7, 8, 9});
}

TEST_CASE("H2O: accumulates softmax mass summed over the group", "[policies]") {
  // Heads c(1,0) and c(0,1). Step 1, keys k0=(2,0), k1=(0,0), k2=(1,0):
  //   head 0: (4,1,2)/7; head 1: all y = 0 -> 1/3 each.
  // Step 2 appends k3=(0,1): head 0: (4,1,2,1)/8; head 1: (1,1,1,2)/5.
  std::vector<float> keys = {2, 0, 0, 0, 1, 0, 0, 1};
  const std::vector<float> q = {kC, 0, 0, kC};
  H2OState state;
  REQUIRE(UpdateH2O(&state, {keys.data(), 3, 2}, Queries(q, 1, 2, 2)).ok());
  REQUIRE(state.acc.size() == 3);
  CHECK(state.acc[0] == Approx(4 / 7.0 + 1 / 3.0));
  CHECK(state.acc[1] == Approx(1 / 7.0 + 1 / 3.0));
  CHECK(state.acc[2] == Approx(2 / 7.0 + 1 / 3.0));
  REQUIRE(UpdateH2O(&state, {keys.data(), 4, 2}, Queries(q, 1, 2, 2)).ok());
  const double acc[4] = {4 / 7.0 + 1 / 3.0 + 0.5 + 0.2, 1 / 7.0 + 1 / 3.0 + 0.125 + 0.2,
                         2 / 7.0 + 1 / 3.0 + 0.25 + 0.2, 0.125 + 0.4};
  for (int j = 0; j < 4; ++j) CHECK(state.acc[j] == Approx(acc[j]));

  // The lowest non-recent token (1) goes; CompactH2O follows the eviction.
  auto scores = ScoreH2O(state, {0, 1});
  REQUIRE(scores.ok());
  CHECK((*scores)[3] == kInf);
  auto kept = SelectKeep(*scores, 3, ProtectedMask(4, {0, 1}));
  REQUIRE(kept.ok());
  CHECK(*kept == std::vector<int64_t>{0, 2, 3});
  REQUIRE(CompactH2O(&state, *kept).ok());
  REQUIRE(state.acc.size() == 3);
  CHECK(state.acc[1] == Approx(acc[2]));

  // A state that was not compacted is refused.
  H2OState stale{{1, 1, 1, 1, 1}};
  Status s = UpdateH2O(&stale, {keys.data(), 4, 2}, Queries(q, 1, 2, 2));
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Contains("h2o state"));
}

TEST_CASE("H2O: a chunk of queries is applied causally", "[policies]") {
  // Three queries c(1,0) for tokens 0..2 of k0=(2,0), k1=(0,0), k2=(1,0):
  // token 0 sees k0: 1; token 1 sees k0,k1: (4,1)/5; token 2 sees all: (4,1,2)/7.
  const std::vector<float> keys = {2, 0, 0, 0, 1, 0};
  const std::vector<float> q = {kC, 0, kC, 0, kC, 0};
  H2OState state;
  REQUIRE(UpdateH2O(&state, {keys.data(), 3, 2}, Queries(q, 3, 1, 2)).ok());
  CHECK(state.acc[0] == Approx(1 + 0.8 + 4 / 7.0));
  CHECK(state.acc[1] == Approx(0.2 + 1 / 7.0));
  CHECK(state.acc[2] == Approx(2 / 7.0));
}

TEST_CASE("SelectKeep: keeps protected tokens and exactly the budget", "[policies]") {
  const std::vector<float> scores = {5, 1, 3, 3, 0, 9};
  const std::vector<uint8_t> mask = {1, 0, 0, 0, 0, 1};
  auto b4 = SelectKeep(scores, 4, mask);
  auto b3 = SelectKeep(scores, 3, mask);  // Tie 2 vs 3: the newer wins.
  auto b2 = SelectKeep(scores, 2, mask);
  auto all = SelectKeep(scores, 100, mask);
  REQUIRE(b4.ok());
  REQUIRE(b3.ok());
  REQUIRE(b2.ok());
  REQUIRE(all.ok());
  CHECK(*b4 == std::vector<int64_t>{0, 2, 3, 5});
  CHECK(*b3 == std::vector<int64_t>{0, 3, 5});
  CHECK(*b2 == std::vector<int64_t>{0, 5});
  CHECK(all->size() == 6);

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t t = 1 + rng() % 64;
    std::vector<float> s(t);
    std::vector<uint8_t> m(t);
    int64_t protected_count = 0;
    for (int64_t j = 0; j < t; ++j) {
      s[j] = u(rng);
      m[j] = rng() % 4 == 0;
      protected_count += m[j];
    }
    const int64_t budget = protected_count + rng() % (t + 2);
    auto kept = SelectKeep(s, budget, m);
    REQUIRE(kept.ok());
    REQUIRE(static_cast<int64_t>(kept->size()) == std::min(budget, t));
    REQUIRE(std::is_sorted(kept->begin(), kept->end()));
    std::vector<uint8_t> in(t, 0);
    for (int64_t j : *kept) in[j] = 1;
    float worst_kept = kInf, best_dropped = -kInf;
    for (int64_t j = 0; j < t; ++j) {
      if (m[j]) REQUIRE(in[j]);
      if (!m[j] && in[j]) worst_kept = std::min(worst_kept, s[j]);
      if (!m[j] && !in[j]) best_dropped = std::max(best_dropped, s[j]);
    }
    REQUIRE(worst_kept >= best_dropped);
  }
}

TEST_CASE("Eviction: attention mass retained and its curve", "[policies]") {
  // Keys k0=(2,0), k1=(0,0), k2=(1,0), k3=(0,1); queries c(1,0) for tokens 2 and 3:
  // (4,1,2,0)/7 and (4,1,2,1)/8, averaged.
  const std::vector<float> keys = {2, 0, 0, 0, 1, 0, 0, 1};
  const std::vector<float> obs = {kC, 0, kC, 0};
  auto mass = TokenAttentionMass({keys.data(), 4, 2}, Queries(obs, 2, 1, 2));
  REQUIRE(mass.ok());
  const double expect[4] = {(4 / 7.0 + 0.5) / 2, (1 / 7.0 + 0.125) / 2, (2 / 7.0 + 0.25) / 2,
                            0.0625};
  for (int j = 0; j < 4; ++j) CHECK((*mass)[j] == Approx(expect[j]));
  const std::vector<int64_t> kept = {0, 3};
  auto retained = RetainedMass(*mass, kept);
  REQUIRE(retained.ok());
  CHECK(*retained == Approx(expect[0] + expect[3]));

  auto scores = ScoreStreaming(4, {1, 1});
  const auto mask = ProtectedMask(4, {1, 1});
  auto curve = ComputeRetainedMassCurve(*mass, *scores, mask);
  REQUIRE(curve.ok());
  CHECK(curve->min_budget == 2);
  REQUIRE(curve->retained.size() == 3);
  for (int64_t b = 2; b <= 4; ++b) {
    auto k = SelectKeep(*scores, b, mask);
    REQUIRE(k.ok());
    CHECK(curve->At(b) == Approx(*RetainedMass(*mass, *k)));
  }
  CHECK(curve->At(99) == Approx(1.0));
  CHECK(curve->At(0) == curve->At(2));
}

TEST_CASE("Eviction: bad input gives named errors", "[policies]") {
  const KvTensorView q = Queries(kObs2, 2, 1, 2);
  auto message = [](const Status& s) { return s.ToString(); };
  const std::vector<float> scores = {1, 2, 3};

  CHECK_THAT(message(SelectKeep({}, 1, {}).status()), Contains("scores: empty"));
  CHECK_THAT(message(SelectKeep(scores, 2, std::vector<uint8_t>{1, 0}).status()),
             Contains("protected_mask: got 2 entries, expected 3"));
  CHECK_THAT(message(SelectKeep(scores, 1, std::vector<uint8_t>{1, 0, 1}).status()),
             Contains("budget: got 1, expected >= 2"));
  const std::vector<float> nan_scores = {1, std::nanf(""), 3};
  CHECK_THAT(message(SelectKeep(nan_scores, 2, std::vector<uint8_t>{0, 0, 0}).status()),
             Contains("scores[1]: got nan"));

  CHECK_THAT(message(ScoreRKV({kKeys6.data(), 0, 2}, q, {}).status()),
             Contains("keys: tokens must be > 0"));
  CHECK_THAT(message(ScoreRKV({kKeys6.data(), 3, 4}, q, {}).status()),
             Contains("queries: head_dim 2 does not match keys head_dim 4"));
  CHECK_THAT(message(ScoreRKV({kKeys6.data(), 1, 2}, q, {}).status()),
             Contains("2 observation query tokens but only 1 keys"));
  CHECK_THAT(message(ScoreRKV(kRows6, q, {-1, 0}).status()), Contains("sinks: got -1"));
  CHECK_THAT(message(ScoreRKV(kRows6, q, {}, {.kernel = 4}).status()),
             Contains("rkv.kernel: got 4"));
  CHECK_THAT(message(ScoreRKV(kRows6, q, {}, {.lambda = 1.5f}).status()),
             Contains("rkv.lambda: got 1.5"));
  // Past the redundancy term's limit (refused before any scoring work).
  const std::vector<float> many(static_cast<size_t>((kMaxRedundancyTokens + 1) * 2), 0.5f);
  CHECK_THAT(message(ScoreRKV({many.data(), kMaxRedundancyTokens + 1, 2}, q, {}).status()),
             Contains("keys: tokens 4194305 is more than R-KV's redundancy takes (4194304)"));
  CHECK_THAT(message(ScoreSnapKV(kRows6, q, {}, {.obs_window = 0}).status()),
             Contains("snapkv.obs_window: got 0"));
  std::vector<float> bad = kKeys6;
  bad[7] = std::numeric_limits<float>::infinity();
  CHECK_THAT(message(ScoreSnapKV({bad.data(), 6, 2}, q, {}).status()),
             Contains("keys: element (token 3, channel 1) is inf"));
  CHECK_THAT(message(QueryGroup(Queries(kObs2, 1, 2, 2), 3, 0).status()),
             Contains("kv_heads: got 3"));
  CHECK_THAT(message(QueryGroup(Queries(kObs2, 1, 2, 2), 2, 2).status()),
             Contains("kv_head: got 2, expected 0..1"));
  CHECK_THAT(message(ScoreStreaming(0, {}).status()), Contains("tokens: got 0"));
  CHECK_THAT(message(ScoreH2O(H2OState{}, {}).status()), Contains("h2o state: empty"));
  H2OState state{{1, 2, 3}};
  CHECK_THAT(message(CompactH2O(&state, std::vector<int64_t>{2, 1})),
             Contains("kept[1]: got 1 after 2"));
  CHECK_THAT(message(RetainedMass(std::vector<double>{0.5, 0.5}, std::vector<int64_t>{2}).status()),
             Contains("kept[0]: got 2, expected 0..1"));
  for (const Status& s : {SelectKeep({}, 1, {}).status(), ScoreStreaming(-3, {}).status()}) {
    CHECK(s.code() == StatusCode::kInvalidArgument);
  }
}

std::vector<uint32_t> FloatBits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

std::vector<uint64_t> DoubleBits(const std::vector<double>& v) {
  std::vector<uint64_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(double));
  return bits;
}

// Which tokens a scorer keeps must not depend on the CPU: the dot products are kernels/dot.h's,
// bit-identical on every SIMD level, so every score is too.
TEST_CASE("Eviction: every scorer gives the same bits at every SIMD level", "[policies]") {
  const std::vector<SimdLevel> levels = testing::SimdLevelsUnderTest();
  if (levels.empty()) return testing::Skip(testing::kNoSimd);
  testing::SimdLevelGuard guard;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  for (int64_t d : {64, 60}) {  // 60: every dot product has a 4-element tail.
    constexpr int64_t kT = 203, kG = 3, kObs = 32;
    std::vector<float> keys(kT * d), q(kObs * kG * d);
    for (float& v : keys) v = normal(rng);
    for (int64_t t = 40; t < 60; ++t) {  // Near-duplicates, so R-KV's threshold is crossed.
      for (int64_t c = 0; c < d; ++c) keys[t * d + c] = keys[(t - 40) * d + c] * 1.5f;
    }
    for (float& v : q) v = normal(rng);
    const KeyRows rows{keys.data(), kT, d};
    const KvTensorView view = Queries(q, kObs, kG, d);
    const ProtectedRegions regions{4, 16};
    auto all = [&] {
      H2OState h2o;
      REQUIRE(UpdateH2O(&h2o, rows, view).ok());
      return std::make_tuple(FloatBits(*ScoreRKV(rows, view, regions, {.obs_window = kObs})),
                             FloatBits(*ScoreSnapKV(rows, view, regions)), DoubleBits(h2o.acc),
                             DoubleBits(*TokenAttentionMass(rows, view)));
    };
    REQUIRE(SetSimdLevel(SimdLevel::kScalar).ok());
    const auto reference = all();
    for (SimdLevel level : levels) {
      INFO(SimdLevelName(level) << ", D " << d);
      REQUIRE(SetSimdLevel(level).ok());
      CHECK(all() == reference);
    }
  }
}

void ScorerTimings(int64_t kT);

// Timings for docs/eviction.md: one KV head, T keys, 8 observation query tokens, D = 64; each at
// the scalar level (the reference's dot products) and the best level this CPU runs.
TEST_CASE("Eviction: scorer timings", "[.bench][policies]") {
  testing::SimdLevelGuard guard;
  for (int64_t kT : {256, 1024}) {
    for (SimdLevel level : {SimdLevel::kScalar, DetectSimdLevel()}) {
      REQUIRE(SetSimdLevel(level).ok());
      std::printf("T=%lld, %s\n", static_cast<long long>(kT), SimdLevelName(level).data());
      ScorerTimings(kT);
    }
  }
}

// R-KV as the 1/8 recipe runs it on one head at an 8K context
// (configs/smollm2-copy-heads-1of8.toml: about 3,850 keys kept, 32 observation tokens of 3 query
// heads, lambda 0.6, the newest 64 keys protected), in steady state: each scoring drops 64 keys and
// the next appends 64, with the redundancy state carried. Keys share a direction with noise
// (near-duplicates nearby, as a model's keys have). Median of 64 scorings after 8 warm-up ones,
// scalar and the best level.
//   build/tests/policies_test "Eviction: R-KV steady-state timings"
TEST_CASE("Eviction: R-KV steady-state timings", "[.bench][policies]") {
  constexpr int64_t kD = 64, kT = 3850, kG = 3, kObs = 32, kStep = 64;
  testing::SimdLevelGuard guard;
  for (SimdLevel level : {SimdLevel::kScalar, DetectSimdLevel()}) {
    REQUIRE(SetSimdLevel(level).ok());
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0, 1);
    std::vector<float> dir(kD);
    for (float& v : dir) v = 2 * n(rng);
    std::vector<float> keys;
    auto append_key = [&] {
      for (int64_t c = 0; c < kD; ++c) keys.push_back(dir[c] + n(rng));
    };
    for (int64_t t = 0; t < kT; ++t) append_key();
    std::vector<float> q(kObs * kG * kD);
    for (float& v : q) v = n(rng);
    const KvTensorView view = Queries(q, kObs, kG, kD);
    const RkvParams params{.obs_window = kObs, .lambda = 0.6f};
    RedundancyState state;
    std::vector<double> runs;
    for (int round = 0; round < 72; ++round) {
      const int64_t tokens = static_cast<int64_t>(keys.size()) / kD;
      const auto start = std::chrono::steady_clock::now();
      const std::vector<float> scores =
          *ScoreRKV({keys.data(), tokens, kD}, view, {0, kStep}, params, &state);
      const auto end = std::chrono::steady_clock::now();
      if (round >= 8)
        runs.push_back(std::chrono::duration<double, std::micro>(end - start).count());
      // Evict the kStep lowest scores, compact the state, append kStep new keys.
      const std::vector<int64_t> kept =
          *SelectKeep(scores, tokens - kStep, ProtectedMask(tokens, {0, kStep}));
      REQUIRE(CompactRedundancy(&state, kept).ok());
      std::vector<float> next;
      for (int64_t j : kept) next.insert(next.end(), &keys[j * kD], &keys[(j + 1) * kD]);
      keys.swap(next);
      for (int64_t i = 0; i < kStep; ++i) append_key();
    }
    std::sort(runs.begin(), runs.end());
    std::printf("R-KV steady state, T=%lld, %s: %.1f us per scoring (median of %zu)\n",
                static_cast<long long>(kT), SimdLevelName(level).data(), runs[runs.size() / 2],
                runs.size());
  }
}

void ScorerTimings(int64_t kT) {
  constexpr int64_t kD = 64, kObs = 8;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> keys(kT * kD);
  for (float& v : keys) v = n(rng);
  const KeyRows rows{keys.data(), kT, kD};
  // Random keys have hardly a near-duplicate (R-KV's redundancy falls back to its full pass); a
  // model's keys share a direction and have one a few keys back (policies/redundancy.h).
  std::vector<float> shared(keys);
  for (int64_t c = 0; c < kD; ++c) {
    const float dir = 3 * n(rng);
    for (int64_t t = 0; t < kT; ++t) shared[t * kD + c] = dir + 0.5f * keys[t * kD + c];
  }
  const KeyRows shared_rows{shared.data(), kT, kD};
  const ProtectedRegions regions{4, 8};
  const auto mask = ProtectedMask(kT, regions);
  auto time_us = [](auto&& fn) {
    std::vector<double> runs;
    for (int rep = 0; rep < 7; ++rep) {
      constexpr int kIters = 50;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kIters; ++i) fn();
      const auto end = std::chrono::steady_clock::now();
      runs.push_back(std::chrono::duration<double, std::micro>(end - start).count() / kIters);
    }
    std::sort(runs.begin(), runs.end());
    return runs[runs.size() / 2];
  };
  for (int64_t g : {1, 4}) {
    std::vector<float> q(kObs * g * kD);
    for (float& v : q) v = n(rng);
    const KvTensorView view = Queries(q, kObs, g, kD);
    std::vector<float> scores;
    std::printf("g=%lld\n", static_cast<long long>(g));
    std::printf("  R-KV     %8.1f us\n", time_us([&] { scores = *ScoreRKV(rows, view, regions); }));
    std::printf("  R-KV     %8.1f us (keys sharing a direction, as a model's do)\n",
                time_us([&] { (void)*ScoreRKV(shared_rows, view, regions); }));
    std::printf("  SnapKV   %8.1f us\n",
                time_us([&] { scores = *ScoreSnapKV(rows, view, regions, {.obs_window = 8}); }));
    std::printf("  H2O step %8.1f us (one query token)\n", time_us([&] {
                  H2OState state;
                  (void)UpdateH2O(&state, rows, view.Tokens(kObs - 1, 1));
                }));
    std::printf("  mass     %8.1f us\n", time_us([&] { (void)TokenAttentionMass(rows, view); }));
    std::printf("  stream   %8.1f us\n", time_us([&] { (void)ScoreStreaming(kT, regions); }));
    std::printf("  select   %8.1f us (budget 128)\n",
                time_us([&] { (void)SelectKeep(scores, 128, mask); }));
  }
}

}  // namespace
}  // namespace kvctl
