// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/exp.h"

#include <bit>
#include <iterator>

#include "kernels/quantize.h"

namespace kvctl {
namespace exp_detail {
#include "kernels/exp_coefficients.inc"
}  // namespace exp_detail

double ExpRef(double x) {
  using namespace exp_detail;
  if (x != x) return x;
  const double xc = x < kLowest ? kLowest : (x > kHighest ? kHighest : x);
  const double biased = xc * kInvLn2 + kRoundMagic;
  const double k = biased - kRoundMagic;
  const double r = (xc - k * kLn2Hi) - k * kLn2Lo;
  double p = kTaylor[0];
  for (size_t i = 1; i < std::size(kTaylor); ++i) p = p * r + kTaylor[i];
  // k as an integer from the rounding's own bits, split as k1 = floor(k / 2) (an arithmetic
  // shift) and k2 = k - k1, both in [-538, 512]: normal powers of two.
  const int64_t ik = std::bit_cast<int64_t>(biased) - std::bit_cast<int64_t>(kRoundMagic);
  const int64_t i1 = ik >> 1;
  const double s1 = std::bit_cast<double>((i1 + 1023) << 52);
  const double s2 = std::bit_cast<double>((ik - i1 + 1023) << 52);
  return (p * s1) * s2;
}

void ExpShiftedInPlace(double* z, int64_t n, double shift) {
  if (ActiveSimdLevel() != SimdLevel::kScalar) {
    simd::ExpShiftedInPlaceAvx2(z, n, shift);
    return;
  }
  for (int64_t j = 0; j < n; ++j) z[j] = ExpRef(z[j] - shift);
}

}  // namespace kvctl
