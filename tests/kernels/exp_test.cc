// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kernels/exp.h: ExpRef on known answers and special values, its distance from exp over the whole
// float range, and SoftmaxNumerators bit for bit against its scalar definition at every SIMD level
// this CPU runs.
#include "kernels/exp.h"

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

using testing::kNoSimd;
using testing::SimdLevelGuard;
using testing::SimdLevelsUnderTest;
using testing::Skip;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Distance in units in the last place between two finite non-negative floats.
int32_t Ulps(float a, float b) {
  const int32_t d = std::bit_cast<int32_t>(a) - std::bit_cast<int32_t>(b);
  return d < 0 ? -d : d;
}

// exp correctly rounded to float (double's exp is far more precise than float's last bit).
float ExpFloat(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

TEST_CASE("ExpRef: known answers and special values") {
  CHECK(ExpRef(0.0f) == 1.0f);
  CHECK(ExpRef(-0.0f) == 1.0f);
  CHECK(Ulps(ExpRef(1.0f), 2.7182817f) <= 1);
  CHECK(Ulps(ExpRef(-1.0f), 0.36787945f) <= 1);
  CHECK(Ulps(ExpRef(std::log(2.0f)), 2.0f) <= 1);
  CHECK(ExpRef(kInf) == kInf);
  CHECK(ExpRef(-kInf) == 0.0f);
  CHECK(std::isnan(ExpRef(kNaN)));
  CHECK(ExpRef(89.0f) == kInf);  // Past the largest float.
  CHECK(ExpRef(1e30f) == kInf);
  CHECK(std::isfinite(ExpRef(88.7f)));
  CHECK(ExpRef(-104.0f) == 0.0f);  // Below half the smallest subnormal.
  CHECK(ExpRef(-1e30f) == 0.0f);
  // Subnormal results: exp(-103) is about 1.4 * 2^-149, rounded to the smallest step.
  CHECK(ExpRef(-103.0f) == ExpFloat(-103.0f));
  CHECK(ExpRef(-103.0f) > 0.0f);
}

TEST_CASE("ExpRef: within 2 ulp of exp over the whole range") {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> wide(-103.9f, 88.7f);
  std::uniform_real_distribution<float> narrow(-40.0f, 0.0f);  // A softmax's usual range.
  int32_t worst = 0;
  for (int i = 0; i < 400000; ++i) {
    const float x = (i % 2) ? wide(rng) : narrow(rng);
    const float want = ExpFloat(x);
    const float got = ExpRef(x);
    if (want < std::numeric_limits<float>::min()) {
      // Subnormal: absolute error of a few of the smallest steps.
      CHECK(std::abs(got - want) <= 4 * std::numeric_limits<float>::denorm_min());
      continue;
    }
    const int32_t ulps = Ulps(got, want);
    worst = std::max(worst, ulps);
    if (ulps > 2) FAIL_CHECK("x " << x << " got " << got << " want " << want);
  }
  INFO("worst " << worst << " ulp");
  CHECK(worst <= 2);
}

// The spec of SoftmaxNumerators, written out: the maximum skipping NaNs, ExpRef of each shifted
// value, eight running sums in double combined as a tree.
double SoftmaxSpec(std::vector<float>* z, int64_t n) {
  float m = -kInf;
  for (int64_t j = 0; j < n; ++j) m = (*z)[j] > m ? (*z)[j] : m;
  double s[8] = {};
  for (int64_t j = 0; j < n; ++j) {
    (*z)[j] = ExpRef((*z)[j] - m);
    s[j % 8] += (*z)[j];
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

TEST_CASE("SoftmaxNumerators: the spec's bits at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> value(-150.0f, 150.0f);
  const float specials[] = {0.0f, -0.0f, kInf, -kInf, kNaN, -103.0f, 89.0f, 88.7f, -104.0f, 1e-30f};
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 3, 7, 8, 9, 13, 15, 16, 17, 31, 33, 37, 1000}) {
      for (int variant = 0; variant < 3; ++variant) {
        std::vector<float> z(static_cast<size_t>(n) + 1, 42.0f);
        for (int64_t j = 0; j < n; ++j) {
          // Variant 0: finite values only (what the scorers pass); 1: with specials; 2: a NaN
          // first, which the maximum must skip.
          const bool special = variant == 1 && j % 5 == 0;
          z[j] = special ? specials[(j / 5) % std::size(specials)] : value(rng);
          if (variant == 2 && j == 0) z[j] = kNaN;
        }
        std::vector<float> want = z;
        const double want_sum = SoftmaxSpec(&want, n);
        const double sum = SoftmaxNumerators(z.data(), n);
        INFO(SimdLevelName(level) << " n " << n << " variant " << variant);
        if (std::isnan(want_sum)) {
          CHECK(std::isnan(sum));  // Which NaN a sum of NaNs keeps depends on operand order.
        } else {
          CHECK(std::bit_cast<uint64_t>(sum) == std::bit_cast<uint64_t>(want_sum));
        }
        for (int64_t j = 0; j <= n; ++j) {
          INFO("j " << j);
          CHECK(std::bit_cast<uint32_t>(z[j]) == std::bit_cast<uint32_t>(want[j]));
        }
      }
    }
  }
}

TEST_CASE("SoftmaxNumerators: each running sum adds its numerators in index order") {
  // Two numerators a and b (of logits p and q) whose sum with 1 depends on the order they are
  // added in, found among ExpRef's values from e^-20 down to e^-40 (2^-29 .. 2^-58, around the
  // ulp of 1 in double).
  std::vector<float> logits(2000);
  std::vector<double> numerators(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = -20.0f - 0.01f * static_cast<float>(i);
    numerators[i] = ExpRef(logits[i]);
  }
  float p = 0, q = 0;
  bool found = false;
  for (size_t i = 0; i < logits.size() && !found; ++i) {
    for (size_t k = 0; k < logits.size() && !found; ++k) {
      const double a = numerators[i], b = numerators[k];
      if ((1.0 + a) + b != (1.0 + b) + a) p = logits[i], q = logits[k], found = true;
    }
  }
  REQUIRE(found);
  // s_0 takes x[0] (the maximum: a numerator of 1), x[8], x[16], x[24]: p at 16 and q at 24 sit
  // in one 16-wide step and in two 8-wide ones, so a path that adds a step's upper half first
  // gives other bits.
  std::vector<float> x(32, -200.0f);
  x[0] = 0.0f;
  x[16] = p;
  x[24] = q;
  std::vector<float> want = x;
  const double want_sum = SoftmaxSpec(&want, 32);
  SimdLevelGuard guard;
  for (SimdLevel level : SimdLevelsUnderTest()) {
    REQUIRE(SetSimdLevel(level).ok());
    std::vector<float> z = x;
    INFO(SimdLevelName(level));
    CHECK(std::bit_cast<uint64_t>(SoftmaxNumerators(z.data(), 32)) ==
          std::bit_cast<uint64_t>(want_sum));
  }
}

TEST_CASE("SoftmaxNumerators: a softmax of finite logits sums to one") {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  std::vector<float> z(3851);
  for (float& x : z) x = logit(rng);
  const double sum = SoftmaxNumerators(z.data(), static_cast<int64_t>(z.size()));
  double total = 0, largest = 0;
  for (float p : z) total += p / sum, largest = std::max<double>(largest, p);
  CHECK(largest == 1.0);  // exp(max - max).
  CHECK(std::abs(total - 1.0) < 1e-12);
}

TEST_CASE("SoftmaxNumerators: out of place gives the in-place bits, input untouched") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937_64 rng(13);
  std::normal_distribution<float> logit(0.0f, 6.0f);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 8, 11, 517}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = logit(rng);
      const std::vector<float> x0 = x;
      std::vector<float> in_place = x, z(static_cast<size_t>(n) + 1, 42.0f);
      const double want = SoftmaxNumerators(in_place.data(), n);
      const double got = SoftmaxNumerators(x.data(), z.data(), n);
      INFO(SimdLevelName(level) << " n " << n);
      CHECK(std::bit_cast<uint64_t>(got) == std::bit_cast<uint64_t>(want));
      CHECK(x == x0);
      for (int64_t j = 0; j < n; ++j) {
        CHECK(std::bit_cast<uint32_t>(z[j]) == std::bit_cast<uint32_t>(in_place[j]));
      }
      CHECK(z[static_cast<size_t>(n)] == 42.0f);
    }
  }
}

TEST_CASE("AddScaled: a multiply then an add in double, the same bits at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  // Known answer: 0.1f widened, times 3, plus 1.
  double one[] = {1.0};
  const float tenth[] = {0.1f};
  AddScaled(tenth, 1, 3.0, one);
  CHECK(std::bit_cast<uint64_t>(one[0]) ==
        std::bit_cast<uint64_t>(1.0 + static_cast<double>(0.1f) * 3.0));
  // Two roundings, not one: these operands give a different double when the multiply and the
  // add are fused (a search over random ones found them), so an FMA fails here. Seventeen
  // copies: the vector bodies (8 and 16 wide) and the scalar tails of both SIMD paths see them.
  const float z_fma = std::bit_cast<float>(0x3f566b83u);
  const double w_fma = 0x1.1fed5e2d12f2fp-2, a_fma = 0x1.48dace8666678p-1;
  const double unfused = static_cast<double>(z_fma) * w_fma + a_fma;
  REQUIRE(unfused != std::fma(static_cast<double>(z_fma), w_fma, a_fma));
  const std::vector<float> zs(17, z_fma);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    std::vector<double> sums(17, a_fma);
    AddScaled(zs.data(), 17, w_fma, sums.data());
    INFO(SimdLevelName(level));
    for (double v : sums) CHECK(std::bit_cast<uint64_t>(v) == std::bit_cast<uint64_t>(unfused));
  }
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> prob(0.0f, 1.0f);
  std::uniform_real_distribution<double> acc(0.0, 1.0);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 4, 7, 8, 9, 15, 16, 17, 23, 33, 1000}) {
      std::vector<float> z(static_cast<size_t>(n));
      for (float& v : z) v = prob(rng);
      std::vector<double> want(static_cast<size_t>(n) + 1);
      for (double& v : want) v = acc(rng);
      std::vector<double> got = want;
      const double w = 1.0 / (3.0 + acc(rng));
      for (int64_t j = 0; j < n; ++j) want[j] += static_cast<double>(z[j]) * w;
      AddScaled(z.data(), n, w, got.data());
      INFO(SimdLevelName(level) << " n " << n);
      for (size_t j = 0; j < want.size(); ++j) {
        CHECK(std::bit_cast<uint64_t>(got[j]) == std::bit_cast<uint64_t>(want[j]));
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
