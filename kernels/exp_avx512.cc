// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX-512 instances of SoftmaxNumerators and AddScaled (kernels/exp.h): the AVX2 file's
// operations on sixteen floats per step, so every lane gives ExpRef's bits (separate multiplies
// and adds, no FMA: the target below enables none and the build compiles with
// -ffp-contract=off). The running sums s_0..s_7 are the eight lanes of one double vector, and a
// step adds its first eight numerators to them before its last eight, which is the spec's index
// order within each s_u.
#include <immintrin.h>

#include <cstdint>
#include <iterator>
#include <limits>

#include "kernels/exp.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2")
// GCC 12 flags its own _mm512_undefined_*() inside avx512fintrin.h as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kvctl {
namespace exp_detail {
#include "kernels/exp_coefficients.inc"
}  // namespace exp_detail

namespace simd {
namespace {

// 2^i for sixteen int32 lanes i in [-126, 127].
inline __m512 Pow2(__m512i i) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(i, _mm512_set1_epi32(127)), 23));
}

inline __m512 Exp16(__m512 x) {
  using namespace exp_detail;
  const __m512 magic = _mm512_set1_ps(kRoundMagic);
  // ExpRef's clamp, below kLowest first, then above kHighest; NaN lanes are put back at the end.
  const __m512 lowest = _mm512_set1_ps(kLowest), highest = _mm512_set1_ps(kHighest);
  __m512 xc = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, lowest, _CMP_LT_OQ), lowest);
  xc = _mm512_mask_mov_ps(xc, _mm512_cmp_ps_mask(xc, highest, _CMP_GT_OQ), highest);
  const __m512 biased = _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(kInvLn2)), magic);
  const __m512 k = _mm512_sub_ps(biased, magic);
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(xc, _mm512_mul_ps(k, _mm512_set1_ps(kLn2Hi))),
                                 _mm512_mul_ps(k, _mm512_set1_ps(kLn2Lo)));
  __m512 p = _mm512_set1_ps(kTaylor[0]);
  for (size_t i = 1; i < std::size(kTaylor); ++i) {
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kTaylor[i]));
  }
  const __m512i ik = _mm512_sub_epi32(_mm512_castps_si512(biased), _mm512_castps_si512(magic));
  const __m512i i1 = _mm512_srai_epi32(ik, 1);
  const __m512i i2 = _mm512_sub_epi32(ik, i1);
  const __m512 e = _mm512_mul_ps(_mm512_mul_ps(p, Pow2(i1)), Pow2(i2));
  return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// The upper eight floats of v (AVX-512F has no 256-bit float extract; DQ's is not required).
inline __m256 Upper8(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

}  // namespace

double SoftmaxNumeratorsAvx512(const float* x, float* z, int64_t n) {
  const int64_t whole = n - n % 16;
  // The maximum as the AVX2 path takes it: lane-wise max(x, m) = x > m ? x : m skips NaNs.
  __m512 mv = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < whole; j += 16) mv = _mm512_max_ps(_mm512_loadu_ps(x + j), mv);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, mv);
  float m = -std::numeric_limits<float>::infinity();
  for (float v : lanes) m = v > m ? v : m;
  for (int64_t j = whole; j < n; ++j) m = x[j] > m ? x[j] : m;
  const __m512 shift = _mm512_set1_ps(m);
  __m512d sums = _mm512_setzero_pd();  // s_0..s_7.
  for (int64_t j = 0; j < whole; j += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), shift));
    _mm512_storeu_ps(z + j, e);
    sums = _mm512_add_pd(sums, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    sums = _mm512_add_pd(sums, _mm512_cvtps_pd(Upper8(e)));
  }
  alignas(64) double s[8];
  _mm512_store_pd(s, sums);
  for (int64_t j = whole; j < n; ++j) {
    z[j] = ExpRef(x[j] - m);
    s[j % 8] += static_cast<double>(z[j]);
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void AddScaledAvx512(const float* z, int64_t n, double w, double* a) {
  // The reference's two roundings per element (a multiply, then an add; no FMA).
  const __m512d wv = _mm512_set1_pd(w);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(z + j);
    const __m512d p0 = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)), wv);
    const __m512d p1 = _mm512_mul_pd(_mm512_cvtps_pd(Upper8(v)), wv);
    _mm512_storeu_pd(a + j, _mm512_add_pd(_mm512_loadu_pd(a + j), p0));
    _mm512_storeu_pd(a + j + 8, _mm512_add_pd(_mm512_loadu_pd(a + j + 8), p1));
  }
  for (; j < n; ++j) a[j] += static_cast<double>(z[j]) * w;
}

}  // namespace simd
}  // namespace kvctl

#pragma GCC pop_options
