// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX2 instances of SoftmaxNumerators and AddScaled (kernels/exp.h): ExpRef's operations, eight
// floats per step, in the same order (separate multiplies and adds: the target below enables no
// FMA, and the build compiles with -ffp-contract=off), so every lane gives ExpRef's bits; the
// running sums s_0..s_7 are the lanes of two double vectors.
#include <immintrin.h>

#include <cstdint>
#include <iterator>
#include <limits>

#include "kernels/exp.h"

#pragma GCC push_options
#pragma GCC target("avx2")

namespace kvctl {
namespace exp_detail {
#include "kernels/exp_coefficients.inc"
}  // namespace exp_detail

namespace simd {
namespace {

// 2^i for eight int32 lanes i in [-126, 127].
inline __m256 Pow2(__m256i i) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(i, _mm256_set1_epi32(127)), 23));
}

inline __m256 Exp8(__m256 x) {
  using namespace exp_detail;
  const __m256 magic = _mm256_set1_ps(kRoundMagic);
  // The scalar clamp's order: below kLowest first, then above kHighest (NaN lanes are replaced
  // at the end).
  __m256 xc = _mm256_blendv_ps(x, _mm256_set1_ps(kLowest),
                               _mm256_cmp_ps(x, _mm256_set1_ps(kLowest), _CMP_LT_OQ));
  xc = _mm256_blendv_ps(xc, _mm256_set1_ps(kHighest),
                        _mm256_cmp_ps(xc, _mm256_set1_ps(kHighest), _CMP_GT_OQ));
  const __m256 biased = _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kInvLn2)), magic);
  const __m256 k = _mm256_sub_ps(biased, magic);
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(k, _mm256_set1_ps(kLn2Hi))),
                                 _mm256_mul_ps(k, _mm256_set1_ps(kLn2Lo)));
  __m256 p = _mm256_set1_ps(kTaylor[0]);
  for (size_t i = 1; i < std::size(kTaylor); ++i) {
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kTaylor[i]));
  }
  // ExpRef's k1 = floor(k / 2) (an arithmetic shift) and k2 = k - k1 from the integer k.
  const __m256i ik = _mm256_sub_epi32(_mm256_castps_si256(biased), _mm256_castps_si256(magic));
  const __m256i i1 = _mm256_srai_epi32(ik, 1);
  const __m256i i2 = _mm256_sub_epi32(ik, i1);
  const __m256 e = _mm256_mul_ps(_mm256_mul_ps(p, Pow2(i1)), Pow2(i2));
  return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

}  // namespace

double SoftmaxNumeratorsAvx2(const float* x, float* z, int64_t n) {
  const int64_t whole = n - n % 8;
  // The maximum: lane-wise max(x, m) = x > m ? x : m skips NaNs as the scalar loop does, and a
  // maximum of values does not depend on the order.
  __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < whole; j += 8) mv = _mm256_max_ps(_mm256_loadu_ps(x + j), mv);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  float m = -std::numeric_limits<float>::infinity();
  for (float v : lanes) m = v > m ? v : m;
  for (int64_t j = whole; j < n; ++j) m = x[j] > m ? x[j] : m;
  const __m256 shift = _mm256_set1_ps(m);
  __m256d lo = _mm256_setzero_pd(), hi = lo;  // s_0..s_3 and s_4..s_7.
  for (int64_t j = 0; j < whole; j += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), shift));
    _mm256_storeu_ps(z + j, e);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double s[8];
  _mm256_store_pd(s, lo);
  _mm256_store_pd(s + 4, hi);
  for (int64_t j = whole; j < n; ++j) {
    z[j] = ExpRef(x[j] - m);
    s[j % 8] += static_cast<double>(z[j]);
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void AddScaledAvx2(const float* z, int64_t n, double w, double* a) {
  // The reference's two roundings per element (a multiply, then an add; no FMA).
  const __m256d wv = _mm256_set1_pd(w);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(z + j);
    const __m256d p0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), wv);
    const __m256d p1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), wv);
    _mm256_storeu_pd(a + j, _mm256_add_pd(_mm256_loadu_pd(a + j), p0));
    _mm256_storeu_pd(a + j + 4, _mm256_add_pd(_mm256_loadu_pd(a + j + 4), p1));
  }
  for (; j < n; ++j) a[j] += static_cast<double>(z[j]) * w;
}

}  // namespace simd
}  // namespace kvctl

#pragma GCC pop_options
