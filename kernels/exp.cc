// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/exp.h"

#include <bit>
#include <iterator>
#include <limits>

#include "kernels/quantize.h"

namespace kvctl {
namespace exp_detail {
#include "kernels/exp_coefficients.inc"
}  // namespace exp_detail

float ExpRef(float x) {
  using namespace exp_detail;
  if (x != x) return x;
  const float xc = x < kLowest ? kLowest : (x > kHighest ? kHighest : x);
  const float biased = xc * kInvLn2 + kRoundMagic;
  const float k = biased - kRoundMagic;
  const float r = (xc - k * kLn2Hi) - k * kLn2Lo;
  float p = kTaylor[0];
  for (size_t i = 1; i < std::size(kTaylor); ++i) p = p * r + kTaylor[i];
  // k as an integer from the rounding's own bits, split as k1 = floor(k / 2) (an arithmetic
  // shift) and k2 = k - k1, both in [-75, 64]: normal powers of two.
  const int32_t ik = std::bit_cast<int32_t>(biased) - std::bit_cast<int32_t>(kRoundMagic);
  const int32_t i1 = ik >> 1;
  const float s1 = std::bit_cast<float>((i1 + 127) << 23);
  const float s2 = std::bit_cast<float>((ik - i1 + 127) << 23);
  return (p * s1) * s2;
}

double SoftmaxNumerators(const float* x, float* z, int64_t n) {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return simd::SoftmaxNumeratorsAvx512(x, z, n);
    case SimdLevel::kAvx2:
      return simd::SoftmaxNumeratorsAvx2(x, z, n);
    case SimdLevel::kScalar:
      break;
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;  // NaN compares false: skipped.
  double s[8] = {};
  for (int64_t j = 0; j < n; ++j) {
    z[j] = ExpRef(x[j] - m);
    s[j % 8] += static_cast<double>(z[j]);
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void AddScaled(const float* z, int64_t n, double w, double* a) {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return simd::AddScaledAvx512(z, n, w, a);
    case SimdLevel::kAvx2:
      return simd::AddScaledAvx2(z, n, w, a);
    case SimdLevel::kScalar:
      break;
  }
  for (int64_t j = 0; j < n; ++j) a[j] += static_cast<double>(z[j]) * w;
}

}  // namespace kvctl
