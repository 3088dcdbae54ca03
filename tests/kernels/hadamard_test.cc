#include "kernels/hadamard.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/quantize.h"
#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

TEST_CASE("Hadamard: known answer for d=4", "[kernels]") {
  float x[4] = {1, 2, 3, 4};
  FwhtRowsRef(x, 1, 4);
  // H4 * x / 2 = [10, -2, -4, 0] / 2.
  CHECK(x[0] == 5.0f);
  CHECK(x[1] == -1.0f);
  CHECK(x[2] == -2.0f);
  CHECK(x[3] == 0.0f);
}

TEST_CASE("Hadamard: orthonormal rows for every power of two up to 256", "[kernels]") {
  for (int d = 1; d <= 256; d *= 2) {
    // Column j of H is the transform of basis vector e_j.
    std::vector<float> h(static_cast<size_t>(d) * d, 0.0f);
    for (int j = 0; j < d; ++j) h[j * d + j] = 1.0f;
    FwhtRowsRef(h.data(), d, d);
    for (int a = 0; a < d; ++a) {
      CHECK(std::fabs(std::fabs(h[a * d]) - 1.0f / std::sqrt(static_cast<float>(d))) < 1e-6f);
      for (int b = a; b < d; b += (d > 16 ? 7 : 1)) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += static_cast<double>(h[a * d + i]) * h[b * d + i];
        CHECK(std::fabs(dot - (a == b ? 1.0 : 0.0)) < 1e-5);
      }
    }
  }
}

TEST_CASE("Hadamard: self-inverse and norm-preserving", "[kernels]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0, 3);
  for (int d : {8, 64, 128, 256}) {
    std::vector<float> x(static_cast<size_t>(d) * 5), y;
    for (float& v : x) v = n(rng);
    y = x;
    FwhtRowsRef(y.data(), 5, d);
    double nx = 0, ny = 0;
    for (int i = 0; i < d; ++i) nx += x[i] * x[i], ny += y[i] * y[i];
    CHECK(std::fabs(nx - ny) / nx < 1e-5);
    FwhtRowsRef(y.data(), 5, d);
    for (size_t i = 0; i < x.size(); ++i)
      CHECK(std::fabs(y[i] - x[i]) < 1e-4f * (1 + std::fabs(x[i])));
  }
}

TEST_CASE("Hadamard: SIMD path is bit-identical to the reference", "[kernels]") {
  if (testing::SimdLevelsUnderTest().empty()) return testing::Skip(testing::kNoSimd);
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0, 1);
  const SimdLevel saved = ActiveSimdLevel();
  for (int level = 0; level <= static_cast<int>(DetectSimdLevel()); ++level) {
    REQUIRE(SetSimdLevel(static_cast<SimdLevel>(level)).ok());
    for (int d : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      for (int rows : {1, 7, 16, 33}) {
        std::vector<float> a(static_cast<size_t>(rows) * d);
        for (float& v : a) v = n(rng);
        std::vector<float> b = a;
        FwhtRowsRef(a.data(), rows, d);
        FwhtRows(b.data(), rows, d);
        REQUIRE(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
      }
    }
  }
  REQUIRE(SetSimdLevel(saved).ok());
}

TEST_CASE("Hadamard: dimension validation names the value", "[kernels]") {
  CHECK(ValidateHadamardDim(128).ok());
  Status s = ValidateHadamardDim(96);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("got 96") != std::string::npos);
  CHECK_FALSE(ValidateHadamardDim(512).ok());
  CHECK_FALSE(ValidateHadamardDim(0).ok());
}

}  // namespace
}  // namespace kvctl
