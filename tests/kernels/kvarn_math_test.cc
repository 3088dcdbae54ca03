// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// KVarN's own exp/log (block::KvarnExp / KvarnLog) against libm and a double-precision answer, and
// its one-pass spreads against a two-pass double-precision std. The SIMD and CUDA paths must
// reproduce these functions bit for bit; that is checked through whole records in
// quantize_simd_test.cc and tests/kernels_cuda.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/half.h"
#include "kernels/quant_block.h"

namespace kvctl {
namespace {

int64_t UlpDistance(float a, float b) {
  return std::llabs(static_cast<int64_t>(static_cast<int32_t>(FloatBits(a))) -
                    static_cast<int32_t>(FloatBits(b)));
}

// Every 97th float of [lo, hi], walking the bit patterns of the magnitudes of each sign's part.
template <typename F>
void ForFloats(float lo, float hi, F&& f) {
  auto walk = [&](float from, float to, float sign) {  // 0 <= from <= to.
    for (uint32_t b = FloatBits(from); b <= FloatBits(to); b += 97) f(sign * BitsToFloat(b));
  };
  if (lo < 0.0f) walk(0.0f, -lo, -1.0f), lo = 0.0f;
  walk(lo, hi, 1.0f);
}

TEST_CASE("KvarnExp: within 1 ulp of expf and of the exact value on Sinkhorn's domain",
          "[kernels]") {
  int64_t worst_libm = 0, worst_exact = 0, n = 0;
  ForFloats(-0.3f, 10.0f, [&](float x) {
    const float got = block::KvarnExp(x);
    worst_libm = std::max(worst_libm, UlpDistance(got, std::exp(x)));
    worst_exact = std::max(worst_exact, UlpDistance(got, static_cast<float>(std::exp(double{x}))));
    ++n;
  });
  CHECK(n > 1000000);
  CHECK(worst_libm <= 1);
  CHECK(worst_exact <= 1);
  // Outside the domain Sinkhorn uses, still a sane exp (documented REQUIRES: |x| <= 87).
  for (float x : {-87.0f, -20.0f, -1.0f, 0.0f, 0.5f, 30.0f, 87.0f}) {
    CHECK(UlpDistance(block::KvarnExp(x), static_cast<float>(std::exp(double{x}))) <= 2);
  }
}

TEST_CASE("KvarnLog: within 1 ulp of logf and of the exact value on Sinkhorn's domain",
          "[kernels]") {
  int64_t worst_libm = 0, worst_exact = 0, n = 0;
  ForFloats(1e-3f, 1e3f, [&](float x) {
    const float got = block::KvarnLog(x);
    worst_libm = std::max(worst_libm, UlpDistance(got, std::log(x)));
    worst_exact = std::max(worst_exact, UlpDistance(got, static_cast<float>(std::log(double{x}))));
    ++n;
  });
  CHECK(n > 1000000);
  CHECK(worst_libm <= 1);
  CHECK(worst_exact <= 1);
  CHECK(block::KvarnLog(1.0f) == 0.0f);
  for (float x : {1.1754944e-38f, 1e-20f, 0.7071f, 1.5f, 1e20f, 3.4e38f}) {
    CHECK(UlpDistance(block::KvarnLog(x), static_cast<float>(std::log(double{x}))) <= 2);
  }
}

TEST_CASE("KVarN spreads: the one-pass std agrees with a two-pass double-precision std",
          "[kernels]") {
  // Rows with a large mean relative to their spread are the one-pass formula's weak case.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int rows = 64, cols = 48;
  for (float offset : {0.0f, 3.0f, 30.0f}) {
    std::vector<float> x(rows * cols), ic(cols), ir(rows), rp(rows), cp(cols);
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) x[i * cols + j] = nd(rng) * (1.0f + i % 5) + offset;
    }
    for (float& v : ic) v = 0.5f + std::abs(nd(rng));
    for (float& v : ir) v = 0.5f + std::abs(nd(rng));
    block::RowSpreads(x.data(), rows, cols, ic.data(), rp.data());
    block::ColumnSpreads(x.data(), rows, cols, ir.data(), cp.data());
    auto std2 = [](const std::vector<double>& u) {
      double mean = 0, ss = 0;
      for (double v : u) mean += v;
      mean /= static_cast<double>(u.size());
      for (double v : u) ss += (v - mean) * (v - mean);
      return std::sqrt(ss / static_cast<double>(u.size() - 1));
    };
    INFO("offset " << offset);
    for (int i = 0; i < rows; ++i) {
      std::vector<double> u(cols);
      for (int j = 0; j < cols; ++j) u[j] = double{x[i * cols + j]} * ic[j];
      CHECK(std::abs(rp[i] - std2(u)) <= 1e-4 * std2(u));
    }
    for (int j = 0; j < cols; ++j) {
      std::vector<double> u(rows);
      for (int i = 0; i < rows; ++i) u[i] = double{x[i * cols + j]} * ir[i];
      CHECK(std::abs(cp[j] - std2(u)) <= 1e-4 * std2(u));
    }
  }
  // A constant line has spread 0 whatever the rounding of its sums (never negative).
  std::vector<float> c(16 * 16, 7.3f), ones(16, 1.0f), out(16);
  block::RowSpreads(c.data(), 16, 16, ones.data(), out.data());
  for (float s : out) CHECK(s >= 0.0f);
}

}  // namespace
}  // namespace kvctl
