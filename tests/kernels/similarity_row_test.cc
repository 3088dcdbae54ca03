// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kernels/similarity_row.h: the reference row pass on a hand-checked row and on sums past int32,
// and the SIMD pass element for element against the reference at every SIMD level this CPU runs.
#include "kernels/similarity_row.h"

#include <catch2/catch.hpp>
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

TEST_CASE("SimilarityRowRef: column sums, partners and the last one above the threshold") {
  const std::vector<int32_t> s = {25, 75, -50, 50, 90, 10};
  std::vector<int64_t> col = {10, 20, 30, 40, 50, 60};
  std::vector<int32_t> partner = {-1, -1, 4, -1, 2, -1};
  std::vector<int32_t> value = {0, 0, 80, 0, 60, 0};
  const SimilarityRowSums sums =
      SimilarityRowRef(s.data(), 6, 50, 7, col.data(), partner.data(), value.data());
  CHECK(sums.row_sum == 25 + 75 - 50 + 50 + 90 + 10);
  CHECK(sums.last_above == 4);  // 50 is not above 50.
  CHECK(col == std::vector<int64_t>{35, 95, -20, 90, 140, 70});
  CHECK(partner == std::vector<int32_t>{-1, 7, 4, -1, 7, -1});
  CHECK(value == std::vector<int32_t>{0, 75, 80, 0, 90, 0});
  const SimilarityRowSums none =
      SimilarityRowRef(s.data(), 0, 50, 8, col.data(), partner.data(), value.data());
  CHECK(none.row_sum == 0);
  CHECK(none.last_above == -1);
  // Sums past int32: the row and column sums are int64.
  const std::vector<int32_t> big = {INT32_MAX, INT32_MAX, INT32_MIN};
  std::vector<int64_t> wide = {INT32_MAX, 0, 0};
  const SimilarityRowSums far =
      SimilarityRowRef(big.data(), 3, 0, 1, wide.data(), partner.data(), value.data());
  CHECK(far.row_sum == int64_t{INT32_MAX} - 1);
  CHECK(wide[0] == 2 * int64_t{INT32_MAX});
}

TEST_CASE("SimilarityRow: the reference's results at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> sim(INT32_MIN, INT32_MAX);
  std::uniform_int_distribution<int64_t> start(-(int64_t{1} << 50), int64_t{1} << 50);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 64, 100, 1023}) {
      // 2^27: R-KV's 0.5 for keys scaled by 2^14; the extremes: every element above, or none.
      for (int32_t threshold : {1 << 27, 1 << 30, INT32_MAX, INT32_MIN}) {
        std::vector<int32_t> s(static_cast<size_t>(n));
        for (int32_t& v : s) v = sim(rng) >> 2;  // Mostly within R-KV's range of 2^29.
        if (n > 2) s[1] = INT32_MIN;             // Full range: int64 sums.
        if (n > 3) s[2] = threshold;             // Equal to the threshold: not above.
        if (n > 4) s[3] = INT32_MAX;
        std::vector<int64_t> col_ref(static_cast<size_t>(n) + 1);
        for (int64_t& c : col_ref) c = start(rng);
        std::vector<int32_t> partner_ref(col_ref.size(), -1);
        std::vector<int32_t> value_ref(col_ref.size(), 3);
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

TEST_CASE("LastAboveRef: the newest element above the threshold, the skipped one excluded") {
  const std::vector<int32_t> s = {60, 10, 70, 50, 80, 20};
  CHECK(LastAboveRef(s.data(), 6, 50, -1) == 4);
  CHECK(LastAboveRef(s.data(), 6, 50, 4) == 2);    // Skipped: the next one down.
  CHECK(LastAboveRef(s.data(), 6, 50, 5) == 4);    // Skipping one below the threshold: no change.
  CHECK(LastAboveRef(s.data(), 6, 50, 99) == 4);   // Outside: excludes nothing.
  CHECK(LastAboveRef(s.data(), 4, 50, -1) == 2);   // Only the first n count.
  CHECK(LastAboveRef(s.data(), 6, 80, -1) == -1);  // 80 is not above 80.
  CHECK(LastAboveRef(s.data(), 1, 50, 0) == -1);   // The only one above is skipped.
  CHECK(LastAboveRef(s.data(), 0, INT32_MIN, -1) == -1);
}

TEST_CASE("LastAbove: the reference's answer at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(12);
  std::uniform_int_distribution<int32_t> sim(INT32_MIN, INT32_MAX);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    // The AVX2 path takes 64 elements a mask: one chunk up to 64, two or more past it.
    for (int64_t n : {0, 1, 7, 8, 9, 16, 17, 31, 32, 33, 56, 63, 64, 65, 100}) {
      for (int trial = 0; trial < 50; ++trial) {
        std::vector<int32_t> s(static_cast<size_t>(n));
        for (int32_t& v : s) v = sim(rng);
        // Few above (the answer deep in the row), many, or none at all.
        const int32_t threshold = trial % 3 == 0   ? INT32_MAX - (INT32_MAX >> 4)
                                  : trial % 3 == 1 ? 0
                                                   : INT32_MAX;
        for (int64_t skip : {int64_t{-1}, n - 1, n / 2, n - 9, int64_t{0}, n, int64_t{-9}}) {
          CAPTURE(SimdLevelName(level), n, trial, skip);
          CHECK(LastAbove(s.data(), n, threshold, skip) ==
                LastAboveRef(s.data(), n, threshold, skip));
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
