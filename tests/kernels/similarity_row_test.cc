// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kernels/similarity_row.h: FixedSimilarity on known answers (scaling, ties to even, signs), the
// reference row pass on a hand-checked row, and the SIMD pass element for element against the
// reference at every SIMD level this CPU runs.
#include "kernels/similarity_row.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

using testing::kNoSimd;
using testing::SimdLevelGuard;
using testing::SimdLevelsUnderTest;
using testing::Skip;

constexpr int64_t kOne = int64_t{1} << 40;

TEST_CASE("FixedSimilarity: s * 2^40 rounded to nearest, ties to even") {
  CHECK(FixedSimilarity(0.0f) == 0);
  CHECK(FixedSimilarity(-0.0f) == 0);
  CHECK(FixedSimilarity(1.0f) == kOne);
  CHECK(FixedSimilarity(-1.0f) == -kOne);
  CHECK(FixedSimilarity(0.5f) == kOne / 2);
  CHECK(FixedSimilarity(std::ldexp(1.0f, -40)) == 1);
  // Half a unit goes to the even neighbour: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, and the same negated.
  CHECK(FixedSimilarity(std::ldexp(1.0f, -41)) == 0);
  CHECK(FixedSimilarity(std::ldexp(3.0f, -41)) == 2);
  CHECK(FixedSimilarity(std::ldexp(5.0f, -41)) == 2);
  CHECK(FixedSimilarity(-std::ldexp(3.0f, -41)) == -2);
  CHECK(FixedSimilarity(-std::ldexp(5.0f, -41)) == -2);
  // Below half a unit: 0; just above it: 1.
  CHECK(FixedSimilarity(std::ldexp(1.0f, -45)) == 0);
  CHECK(FixedSimilarity(std::ldexp(1.0f + std::ldexp(1.0f, -20), -41)) == 1);
  // A similarity a little over 1 (rounding in the dot product) is in range.
  CHECK(FixedSimilarity(std::nextafter(1.0f, 2.0f)) == kOne + (int64_t{1} << 17));
  // Every bit of a float in [2^-16, 1) survives: the conversion is exact there.
  const float s = 0.7123456f;
  CHECK(static_cast<double>(FixedSimilarity(s)) == std::ldexp(static_cast<double>(s), 40));
}

TEST_CASE("SimilarityRowRef: column sums, partners and the last one above the threshold") {
  const std::vector<float> s = {0.25f, 0.75f, -0.5f, 0.5f, 0.9f, 0.1f};
  std::vector<int64_t> col = {10, 20, 30, 40, 50, 60};
  std::vector<int32_t> partner = {-1, -1, 4, -1, 2, -1};
  std::vector<float> value = {0, 0, 0.8f, 0, 0.6f, 0};
  const SimilarityRowSums sums =
      SimilarityRowRef(s.data(), 6, 0.5f, 7, col.data(), partner.data(), value.data());
  // 0.25 + 0.75 - 0.5 + 0.5 + 0.9 + 0.1 in fixed point (0.9f and 0.1f as their floats).
  const int64_t want =
      kOne / 4 + 3 * kOne / 4 - kOne / 2 + kOne / 2 + FixedSimilarity(0.9f) + FixedSimilarity(0.1f);
  CHECK(sums.row_sum == want);
  CHECK(sums.last_above == 4);  // 0.5 is not above 0.5.
  CHECK(col == std::vector<int64_t>{10 + kOne / 4, 20 + 3 * kOne / 4, 30 - kOne / 2, 40 + kOne / 2,
                                    50 + FixedSimilarity(0.9f), 60 + FixedSimilarity(0.1f)});
  CHECK(partner == std::vector<int32_t>{-1, 7, 4, -1, 7, -1});
  CHECK(value == std::vector<float>{0, 0.75f, 0.8f, 0, 0.9f, 0});
  const SimilarityRowSums none =
      SimilarityRowRef(s.data(), 0, 0.5f, 8, col.data(), partner.data(), value.data());
  CHECK(none.row_sum == 0);
  CHECK(none.last_above == -1);
}

TEST_CASE("SimilarityRow: the reference's results at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> sim(-1.0f, 1.0f);
  std::uniform_int_distribution<int64_t> start(-(int64_t{1} << 50), int64_t{1} << 50);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 64, 100, 1023}) {
      for (float threshold : {0.5f, 0.95f, 2.0f, -2.0f}) {
        std::vector<float> s(static_cast<size_t>(n));
        for (float& v : s) v = sim(rng);
        if (n > 2) s[1] = std::ldexp(3.0f, -41);  // A tie in the fixed point.
        if (n > 3) s[2] = threshold;              // Equal to the threshold: not above.
        std::vector<int64_t> col_ref(static_cast<size_t>(n) + 1);
        for (int64_t& c : col_ref) c = start(rng);
        std::vector<int32_t> partner_ref(col_ref.size(), -1);
        std::vector<float> value_ref(col_ref.size(), 0.25f);
        auto col = col_ref;
        auto partner = partner_ref;
        auto value = value_ref;
        const SimilarityRowSums want = SimilarityRowRef(s.data(), n, threshold, 5, col_ref.data(),
                                                        partner_ref.data(), value_ref.data());
        const SimilarityRowSums got =
            SimilarityRow(s.data(), n, threshold, 5, col.data(), partner.data(), value.data());
        INFO(SimdLevelName(level) << " n " << n << " threshold " << threshold);
        CHECK(got.row_sum == want.row_sum);
        CHECK(got.last_above == want.last_above);
        CHECK(col == col_ref);  // The element past n is untouched in both.
        CHECK(partner == partner_ref);
        CHECK(value == value_ref);
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
