// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kernels/exp.h: ExpRef on known answers and special values, its distance from std::exp over the
// whole double range, and ExpShiftedInPlace bit for bit against ExpRef at every SIMD level this
// CPU runs.
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

constexpr double kInf = std::numeric_limits<double>::infinity();

// Distance in units in the last place between two finite non-negative doubles.
int64_t Ulps(double a, double b) {
  const int64_t d = std::bit_cast<int64_t>(a) - std::bit_cast<int64_t>(b);
  return d < 0 ? -d : d;
}

TEST_CASE("ExpRef: known answers and special values") {
  CHECK(ExpRef(0.0) == 1.0);
  CHECK(ExpRef(-0.0) == 1.0);
  CHECK(Ulps(ExpRef(1.0), 2.718281828459045) <= 1);
  CHECK(Ulps(ExpRef(-1.0), 0.36787944117144233) <= 1);
  CHECK(Ulps(ExpRef(std::log(2.0)), 2.0) <= 1);
  CHECK(ExpRef(kInf) == kInf);
  CHECK(ExpRef(-kInf) == 0.0);
  CHECK(std::isnan(ExpRef(std::numeric_limits<double>::quiet_NaN())));
  CHECK(ExpRef(710.0) == kInf);  // Past the largest double.
  CHECK(ExpRef(1e300) == kInf);
  CHECK(std::isfinite(ExpRef(709.78)));
  CHECK(ExpRef(-746.0) == 0.0);  // Below half the smallest subnormal.
  CHECK(ExpRef(-1e300) == 0.0);
  // Subnormal results: exp(-745) is the smallest subnormal, 2^-1074, rounded.
  CHECK(ExpRef(-745.0) == std::exp(-745.0));
  CHECK(ExpRef(-745.0) > 0.0);
}

TEST_CASE("ExpRef: within 2 ulp of std::exp over the whole range") {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> wide(-745.0, 709.7);
  std::uniform_real_distribution<double> narrow(-40.0, 0.0);  // A softmax's usual range.
  int64_t worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = (i % 2) ? wide(rng) : narrow(rng);
    const double want = std::exp(x);
    const double got = ExpRef(x);
    if (want < std::numeric_limits<double>::min()) {
      // Subnormal: absolute error of a few of the smallest steps.
      CHECK(std::abs(got - want) <= 4 * std::numeric_limits<double>::denorm_min());
      continue;
    }
    const int64_t ulps = Ulps(got, want);
    worst = std::max(worst, ulps);
    if (ulps > 2) FAIL_CHECK("x " << x << " got " << got << " want " << want);
  }
  INFO("worst " << worst << " ulp");
  CHECK(worst <= 2);
}

TEST_CASE("ExpShiftedInPlace: ExpRef's bits at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> value(-800.0, 800.0);
  const double specials[] = {
      0.0,    -0.0,  kInf,   -kInf,  std::numeric_limits<double>::quiet_NaN(),
      -745.0, 710.0, 709.78, -746.0, 1e-300};
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 3, 4, 5, 8, 13, 37, 1000}) {
      for (double shift : {0.0, 12.5, -3.0}) {
        std::vector<double> z(static_cast<size_t>(n) + 1, 42.0);
        for (int64_t j = 0; j < n; ++j) {
          z[j] = (j % 5 == 0) ? specials[(j / 5) % std::size(specials)] : value(rng);
        }
        std::vector<double> want = z;
        for (int64_t j = 0; j < n; ++j) want[j] = ExpRef(z[j] - shift);
        ExpShiftedInPlace(z.data(), n, shift);
        for (int64_t j = 0; j <= n; ++j) {
          INFO(SimdLevelName(level) << " n " << n << " shift " << shift << " j " << j);
          CHECK(std::bit_cast<uint64_t>(z[j]) == std::bit_cast<uint64_t>(want[j]));
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
