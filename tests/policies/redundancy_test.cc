// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// R-KV's redundancy column sums (policies/redundancy.h): the full pass, the newest-first scan and
// the automatic choice against a brute-force reference that builds all of S, on key sets whose
// near-duplicates sit next to each other, far apart or nowhere, at every SIMD level.
#include "policies/redundancy.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/dot.h"
#include "kernels/quantize.h"
#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

// All of S (zero diagonal), then in each row the largest j with S_ij > threshold zeroed, then the
// column sums: docs/algorithms.md §12.4 written out.
std::vector<int64_t> BruteForce(const std::vector<int16_t>& unit, int64_t t_n, int64_t d_n,
                                int32_t threshold) {
  std::vector<int64_t> s(static_cast<size_t>(t_n * t_n), 0);
  for (int64_t i = 0; i < t_n; ++i) {
    for (int64_t j = 0; j < t_n; ++j) {
      if (i != j) s[i * t_n + j] = DotI16Ref(&unit[i * d_n], &unit[j * d_n], d_n);
    }
    for (int64_t j = t_n - 1; j >= 0; --j) {
      if (j != i && s[i * t_n + j] > threshold) {
        s[i * t_n + j] = 0;
        break;
      }
    }
  }
  std::vector<int64_t> col(static_cast<size_t>(t_n), 0);
  for (int64_t i = 0; i < t_n; ++i) {
    for (int64_t j = 0; j < t_n; ++j) col[j] += s[i * t_n + j];
  }
  return col;
}

// round(u * 2^14) of each row's unit vector, as policies/eviction.cc makes them.
std::vector<int16_t> UnitKeys(const std::vector<float>& keys, int64_t t_n, int64_t d_n) {
  std::vector<int16_t> unit(keys.size());
  for (int64_t t = 0; t < t_n; ++t) {
    double norm = 0;
    for (int64_t c = 0; c < d_n; ++c) norm += double{keys[t * d_n + c]} * keys[t * d_n + c];
    norm = std::sqrt(norm) + 1e-8;
    for (int64_t c = 0; c < d_n; ++c) {
      unit[t * d_n + c] = static_cast<int16_t>(std::nearbyint(keys[t * d_n + c] / norm * 16384));
    }
  }
  return unit;
}

enum class Shape {
  kRandom,    // Independent normal keys: at D >= 16 hardly any pair is above 0.5.
  kShared,    // A direction every key shares plus noise: every pair above 0.5, partners adjacent.
  kFarBack,   // Random keys, and key t a scaled copy of key t - 70 for t in [70, 90): the partners
              // of rows 0-20 are 70 keys later, those of 70-90 70 keys earlier (beyond the first
              // scan steps); everything else has none.
  kMixed,     // Runs of 5 copies of a random key: partners within the run.
  kOutliers,  // kShared, but every 10th key random (no partner), and from key 100 on every 20th
              // a copy of the one 100 keys earlier: a tenth of the rows scan past the first step.
};

std::vector<float> Keys(Shape shape, int64_t t_n, int64_t d_n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> keys(static_cast<size_t>(t_n * d_n));
  for (float& v : keys) v = normal(rng);
  if (shape == Shape::kShared || shape == Shape::kOutliers) {
    std::vector<float> dir(static_cast<size_t>(d_n));
    for (float& v : dir) v = 3 * normal(rng);
    for (int64_t t = 0; t < t_n; ++t) {
      for (int64_t c = 0; c < d_n; ++c) keys[t * d_n + c] = dir[c] + 0.5f * keys[t * d_n + c];
    }
  }
  if (shape == Shape::kOutliers) {
    for (int64_t t = 0; t < t_n; t += 10) {
      for (int64_t c = 0; c < d_n; ++c) {
        keys[t * d_n + c] = t >= 100 && t % 20 == 0 ? keys[(t - 100) * d_n + c] : normal(rng);
      }
    }
  } else if (shape == Shape::kFarBack) {
    for (int64_t t = 70; t < std::min<int64_t>(t_n, 90); ++t) {
      for (int64_t c = 0; c < d_n; ++c) keys[t * d_n + c] = 1.5f * keys[(t - 70) * d_n + c];
    }
  } else if (shape == Shape::kMixed) {
    for (int64_t t = 0; t < t_n; ++t) {
      for (int64_t c = 0; c < d_n; ++c) keys[t * d_n + c] = keys[(t / 5 * 5) * d_n + c];
    }
  }
  return keys;
}

TEST_CASE("Redundancy: every pass equals the brute-force column sums", "[policies]") {
  const int32_t kHalf = 1 << 27;  // threshold 0.5
  for (Shape shape :
       {Shape::kRandom, Shape::kShared, Shape::kFarBack, Shape::kMixed, Shape::kOutliers}) {
    for (int64_t t_n : {0, 1, 2, 3, 31, 32, 33, 64, 65, 100, 257}) {
      for (int64_t d_n : {1, 4, 60, 64}) {
        for (int32_t threshold : {kHalf, -kHalf, (1 << 28) - 1}) {
          CAPTURE(static_cast<int>(shape), t_n, d_n, threshold);
          const std::vector<int16_t> unit =
              UnitKeys(Keys(shape, t_n, d_n, static_cast<uint32_t>(t_n * 131 + d_n)), t_n, d_n);
          const std::vector<int64_t> expect = BruteForce(unit, t_n, d_n, threshold);
          for (RedundancyPass pass :
               {RedundancyPass::kFull, RedundancyPass::kNewestFirst, RedundancyPass::kAuto}) {
            CAPTURE(static_cast<int>(pass));
            CHECK(RedundancyColumnSums(unit.data(), t_n, d_n, threshold, pass) == expect);
          }
        }
      }
    }
  }
}

TEST_CASE("Redundancy: the passes agree at every SIMD level", "[policies]") {
  const std::vector<SimdLevel> levels = testing::SimdLevelsUnderTest();
  if (levels.empty()) return testing::Skip(testing::kNoSimd);
  testing::SimdLevelGuard guard;
  constexpr int64_t kT = 301, kD = 64;
  const int32_t kHalf = 1 << 27;
  for (Shape shape :
       {Shape::kRandom, Shape::kShared, Shape::kFarBack, Shape::kMixed, Shape::kOutliers}) {
    const std::vector<int16_t> unit = UnitKeys(Keys(shape, kT, kD, 7), kT, kD);
    const std::vector<int64_t> expect = BruteForce(unit, kT, kD, kHalf);
    for (SimdLevel level : levels) {
      REQUIRE(SetSimdLevel(level).ok());
      CAPTURE(static_cast<int>(shape), SimdLevelName(level));
      for (RedundancyPass pass :
           {RedundancyPass::kFull, RedundancyPass::kNewestFirst, RedundancyPass::kAuto}) {
        CHECK(RedundancyColumnSums(unit.data(), kT, kD, kHalf, pass) == expect);
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
