// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/kernels/simd_levels.h
// The SIMD levels a kernels test compares against the scalar reference. A CPU without AVX2 or
// AVX-512 must not turn such a test into "scalar equals scalar" in silence: SimdLevelsUnderTest
// WARNs each instruction set it lacks, and a test with nothing left to compare calls Skip.
//
//   const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
//   if (levels.empty()) return Skip(kNoSimd);
//   for (SimdLevel level : levels) { REQUIRE(SetSimdLevel(level).ok()); ... }
#ifndef KVCTL_TESTS_KERNELS_SIMD_LEVELS_H_
#define KVCTL_TESTS_KERNELS_SIMD_LEVELS_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/quantize.h"
#include "tests/skip.h"

namespace kvctl::testing {

inline constexpr const char* kNoSimd =
    "this CPU has neither AVX2 (with F16C) nor AVX-512 (F, BW, VL): no SIMD path to compare";

// The best level these tests may use: DetectSimdLevel(), or lower when the environment variable
// KVCTL_TEST_SIMD_CEILING names a level ("scalar", "avx2"), so a CPU with AVX-512 can run the
// skip path a CPU without it takes (tests/kernels/CMakeLists.txt does).
inline SimdLevel SimdCeiling() {
  const char* env = std::getenv("KVCTL_TEST_SIMD_CEILING");
  const std::string ceiling = env ? env : "";
  if (ceiling == "scalar") return SimdLevel::kScalar;
  if (ceiling == "avx2") return std::min(SimdLevel::kAvx2, DetectSimdLevel());
  return DetectSimdLevel();
}

// kAvx2 and kAvx512 where this CPU runs them (up to SimdCeiling), WARNing the ones it does not.
inline std::vector<SimdLevel> SimdLevelsUnderTest() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (level <= SimdCeiling()) {
      levels.push_back(level);
    } else {
      WARN("not tested: the " << SimdLevelName(level) << " path (this CPU lacks it)");
    }
  }
  return levels;
}

// Sets a level for one test and restores the process-wide level when it ends, also on a failed
// REQUIRE.
class SimdLevelGuard {
 public:
  SimdLevelGuard() : saved_(ActiveSimdLevel()) {}
  ~SimdLevelGuard() { (void)SetSimdLevel(saved_); }
  SimdLevelGuard(const SimdLevelGuard&) = delete;
  SimdLevelGuard& operator=(const SimdLevelGuard&) = delete;

 private:
  SimdLevel saved_;
};

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_KERNELS_SIMD_LEVELS_H_
