// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// R-KV's redundancy column sums (policies/redundancy.h): the full pass, the newest-first scan and
// the automatic choice against a brute-force reference that builds all of S, on key sets whose
// near-duplicates sit next to each other, far apart or nowhere, at every SIMD level.
#include "policies/redundancy.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
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
      for (int64_t d_n : {1, 4, 60, 64, 128}) {  // 64, 128: fixed-size gathers.
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

// The rows of `unit` (d_n each) at the indices `kept`, in order.
std::vector<int16_t> KeepRows(const std::vector<int16_t>& unit, int64_t d_n,
                              const std::vector<int64_t>& kept) {
  std::vector<int16_t> out;
  for (int64_t j : kept) out.insert(out.end(), &unit[j * d_n], &unit[(j + 1) * d_n]);
  return out;
}

TEST_CASE("Redundancy: the incremental state gives the brute-force sums through evictions",
          "[policies]") {
  // A stream of keys in the scorer's rhythm: append a few, score with the state, keep a random
  // subset (most of it, or at times a small part), compact the state; now and then a kept row's
  // key changes (re-quantized), which the state must notice. Every scoring must equal a fresh one.
  const int32_t kHalf = 1 << 27;
  for (Shape shape :
       {Shape::kRandom, Shape::kShared, Shape::kFarBack, Shape::kMixed, Shape::kOutliers}) {
    for (int64_t d_n : {4, 64}) {
      CAPTURE(static_cast<int>(shape), d_n);
      const std::vector<int16_t> source =
          UnitKeys(Keys(shape, 600, d_n, static_cast<uint32_t>(d_n) + 11), 600, d_n);
      std::mt19937 rng(static_cast<uint32_t>(shape) * 97 + static_cast<uint32_t>(d_n));
      std::vector<int16_t> unit;
      RedundancyState state;
      int64_t t_n = 0, next = 0, reused = 0;
      for (int step = 0; step < 60 && next < 600; ++step) {
        CAPTURE(step);
        const int64_t add = std::min<int64_t>(600 - next, 1 + rng() % 12);
        unit.insert(unit.end(), &source[next * d_n], &source[(next + add) * d_n]);
        next += add, t_n += add;
        // An old row's key changes (quantized again): the state holds up to that row only.
        const int64_t old_rows = state.rows();
        const int64_t changed_row = step % 7 == 6 ? old_rows * 3 / 4 : old_rows;
        if (changed_row < old_rows) {
          const int64_t at = changed_row * d_n;
          unit[at] = static_cast<int16_t>(unit[at] ^ 1);
        }
        const int32_t threshold = step % 11 == 10 ? kHalf / 2 : kHalf;
        const std::vector<int64_t> expect = BruteForce(unit, t_n, d_n, threshold);
        int64_t usable = threshold != state.threshold ? 0 : changed_row;
        if (usable * 2 < t_n) usable = 0;  // Under half the rows: scanned fresh.
        REQUIRE(RedundancyColumnSums(unit.data(), t_n, d_n, threshold, RedundancyPass::kAuto,
                                     &state) == expect);
        REQUIRE(state.rows() == t_n);
        // The state was read up to a changed key, not at all after a change of threshold; or the
        // scan passed its budget and the full pass ran (keys without near-duplicates, where every
        // new row scans every key).
        CHECK(state.reused_rows == (state.full_pass ? 0 : usable));
        reused += state.reused_rows > 0;
        // Keep 96 % (or, every ninth step, 30 %) of the rows.
        const uint32_t keep_pct = step % 9 == 8 ? 30 : 96;
        std::vector<int64_t> kept;
        for (int64_t j = 0; j < t_n; ++j) {
          if (rng() % 100 < keep_pct) kept.push_back(j);
        }
        REQUIRE(CompactRedundancy(&state, kept).ok());
        unit = KeepRows(unit, d_n, kept);
        t_n = static_cast<int64_t>(kept.size());
        REQUIRE(state.rows() == t_n);
      }
      INFO("reused " << reused);
      CHECK(reused >= 15);
    }
  }
}

TEST_CASE("Redundancy: every pass fills the state, and the state's partners are the newest",
          "[policies]") {
  const int32_t kHalf = 1 << 27;
  constexpr int64_t kT = 120, kD = 16;
  const std::vector<int16_t> unit = UnitKeys(Keys(Shape::kOutliers, kT, kD, 3), kT, kD);
  for (RedundancyPass pass :
       {RedundancyPass::kFull, RedundancyPass::kNewestFirst, RedundancyPass::kAuto}) {
    CAPTURE(static_cast<int>(pass));
    RedundancyState state;
    RedundancyColumnSums(unit.data(), kT, kD, kHalf, pass, &state);
    REQUIRE(state.rows() == kT);
    CHECK(state.threshold == kHalf);
    CHECK(state.reused_rows == 0);
    CHECK(state.full_pass == (pass == RedundancyPass::kFull));
    if (pass == RedundancyPass::kFull) CHECK(state.dot_products == kT * (kT - 1) / 2);
    if (pass != RedundancyPass::kFull) CHECK(state.dot_products > 0);
    for (int64_t i = 0; i < kT; ++i) {
      int32_t expect = -1;
      for (int64_t j = kT - 1; j >= 0 && expect < 0; --j) {
        if (j != i && DotI16Ref(&unit[i * kD], &unit[j * kD], kD) > kHalf) {
          expect = static_cast<int32_t>(j);
        }
      }
      CHECK(state.partner[i] == expect);
      CHECK(state.key_hash[i] == UnitKeyChecksum(&unit[i * kD], kD));
    }
  }
}

TEST_CASE("Redundancy: compaction renumbers partners and bounds", "[policies]") {
  RedundancyState state;
  // Row 0: partner 3 (kept); row 1: partner 2 (evicted); row 2: none at 1 and up; row 3: none;
  // row 4: partner 0.
  state.partner = {3, 2, -2, -1, 0};
  state.key_hash = {10, 11, 12, 13, 14};
  state.threshold = 5;
  REQUIRE(CompactRedundancy(&state, std::vector<int64_t>{0, 1, 3, 4}).ok());
  CHECK(state.partner == std::vector<int32_t>{2, -3, -1, 0});
  CHECK(state.key_hash == std::vector<uint32_t>{10, 11, 13, 14});
  CHECK(state.threshold == 5);
  // Not strictly increasing, or past the rows: refused, the state as it was.
  const RedundancyState before = state;
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{1, 1}, std::vector<int64_t>{2, 1},
                                          std::vector<int64_t>{4}, std::vector<int64_t>{-1}}) {
    const Status s = CompactRedundancy(&state, bad);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Matchers::Contains("redundancy state"));
    CHECK(state.partner == before.partner);
  }
  // A state that is not one RedundancyColumnSums made: refused as well.
  RedundancyState broken = before;
  broken.partner[1] = 4;
  CHECK(CompactRedundancy(&broken, std::vector<int64_t>{0, 1}).code() ==
        StatusCode::kInvalidArgument);
  broken.partner[1] = -6;
  CHECK(CompactRedundancy(&broken, std::vector<int64_t>{0, 1}).code() ==
        StatusCode::kInvalidArgument);
  CHECK(broken.partner[1] == -6);
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
      // And from a state: the first 250 rows scored, 200 of them kept, then all 301 again.
      RedundancyState state;
      const std::vector<int64_t> first = BruteForce(unit, 250, kD, kHalf);
      CHECK(RedundancyColumnSums(unit.data(), 250, kD, kHalf, RedundancyPass::kAuto, &state) ==
            first);
      std::vector<int64_t> kept;
      for (int64_t j = 0; j < 250; ++j) {
        if (j % 5 != 2) kept.push_back(j);
      }
      REQUIRE(CompactRedundancy(&state, kept).ok());
      for (int64_t j = 250; j < kT; ++j) kept.push_back(j);
      const std::vector<int16_t> rest = KeepRows(unit, kD, kept);
      const auto rest_n = static_cast<int64_t>(kept.size());
      CHECK(RedundancyColumnSums(rest.data(), rest_n, kD, kHalf, RedundancyPass::kAuto, &state) ==
            BruteForce(rest, rest_n, kD, kHalf));
    }
  }
}

TEST_CASE("Redundancy: exact where the key totals pass int32, both signs, every SIMD level",
          "[policies]") {
  // 70,000 copies of one key of the largest norm allowed (2^15 - 8): every similarity is
  // S = |u|^2, each row's newest partner is the last row (the last row's, the one before), so
  // col_j = (T - 1) S but for the last two columns. The channel totals reach 2.3e9 (past int32,
  // into the third 11-bit piece), negative in the second channel.
  constexpr int64_t kT = 70000, kD = 64;
  std::vector<int16_t> unit(static_cast<size_t>(kT * kD), 0);
  for (int64_t t = 0; t < kT; ++t) {
    unit[t * kD] = 23160;
    unit[t * kD + 1] = -23160;
    unit[t * kD + 5] = 12;
  }
  const int64_t s = int64_t{23160} * 23160 * 2 + 12 * 12;
  REQUIRE(s <= int64_t{32760} * 32760);
  std::vector<int64_t> expect(static_cast<size_t>(kT), (kT - 1) * s);
  expect[kT - 1] = 0;
  expect[kT - 2] = (kT - 2) * s;
  std::vector<SimdLevel> levels = testing::SimdLevelsUnderTest();
  levels.insert(levels.begin(), SimdLevel::kScalar);
  testing::SimdLevelGuard guard;
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    CAPTURE(SimdLevelName(level));
    for (RedundancyPass pass : {RedundancyPass::kNewestFirst, RedundancyPass::kAuto}) {
      CHECK(RedundancyColumnSums(unit.data(), kT, kD, (1 << 28) - 1, pass) == expect);
    }
  }
}

TEST_CASE("Redundancy: heads wider than 256 channels (the double column sums)", "[policies]") {
  const int32_t kHalf = 1 << 27;
  for (Shape shape : {Shape::kRandom, Shape::kShared, Shape::kMixed}) {
    for (int64_t d_n : {256, 257, 300}) {
      constexpr int64_t kT = 45;
      CAPTURE(static_cast<int>(shape), d_n);
      const std::vector<int16_t> unit = UnitKeys(Keys(shape, kT, d_n, 11), kT, d_n);
      const std::vector<int64_t> expect = BruteForce(unit, kT, d_n, kHalf);
      for (RedundancyPass pass :
           {RedundancyPass::kFull, RedundancyPass::kNewestFirst, RedundancyPass::kAuto}) {
        CHECK(RedundancyColumnSums(unit.data(), kT, d_n, kHalf, pass) == expect);
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
