// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX2 instance of ExpShiftedInPlace (kernels/exp.h): ExpRef's operations, four doubles per step,
// in the same order (separate multiplies and adds: the target below enables no FMA, and the build
// compiles with -ffp-contract=off), so every lane gives ExpRef's bits.
#include <immintrin.h>

#include <cstdint>
#include <iterator>

#include "kernels/exp.h"

#pragma GCC push_options
#pragma GCC target("avx2")

namespace kvctl {
namespace exp_detail {
#include "kernels/exp_coefficients.inc"
}  // namespace exp_detail

namespace simd {
namespace {

// 2^i for four int64 lanes i in [-1022, 1023].
inline __m256d Pow2(__m256i i) {
  return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(i, _mm256_set1_epi64x(1023)), 52));
}

inline __m256d Exp4(__m256d x) {
  using namespace exp_detail;
  const __m256d magic = _mm256_set1_pd(kRoundMagic);
  // The scalar clamp's order: below kLowest first, then above kHighest (NaN lanes are replaced
  // at the end).
  __m256d xc = _mm256_blendv_pd(x, _mm256_set1_pd(kLowest),
                                _mm256_cmp_pd(x, _mm256_set1_pd(kLowest), _CMP_LT_OQ));
  xc = _mm256_blendv_pd(xc, _mm256_set1_pd(kHighest),
                        _mm256_cmp_pd(xc, _mm256_set1_pd(kHighest), _CMP_GT_OQ));
  const __m256d biased = _mm256_add_pd(_mm256_mul_pd(xc, _mm256_set1_pd(kInvLn2)), magic);
  const __m256d k = _mm256_sub_pd(biased, magic);
  const __m256d r = _mm256_sub_pd(_mm256_sub_pd(xc, _mm256_mul_pd(k, _mm256_set1_pd(kLn2Hi))),
                                  _mm256_mul_pd(k, _mm256_set1_pd(kLn2Lo)));
  __m256d p = _mm256_set1_pd(kTaylor[0]);
  for (size_t i = 1; i < std::size(kTaylor); ++i) {
    p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(kTaylor[i]));
  }
  // ExpRef's k1 = floor(k / 2), k2 = k - k1 from the integer k (ik >= -1076). AVX2 has no
  // arithmetic 64-bit shift: floor(ik / 2) = ((ik + 2048) >> 1) - 1024 with a logical one.
  const __m256i ik = _mm256_sub_epi64(_mm256_castpd_si256(biased), _mm256_castpd_si256(magic));
  const __m256i offset = _mm256_set1_epi64x(1024);
  const __m256i i1 = _mm256_sub_epi64(
      _mm256_srli_epi64(_mm256_add_epi64(ik, _mm256_add_epi64(offset, offset)), 1), offset);
  const __m256i i2 = _mm256_sub_epi64(ik, i1);
  const __m256d e = _mm256_mul_pd(_mm256_mul_pd(p, Pow2(i1)), Pow2(i2));
  return _mm256_blendv_pd(e, x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}

}  // namespace

void ExpShiftedInPlaceAvx2(double* z, int64_t n, double shift) {
  const __m256d s = _mm256_set1_pd(shift);
  int64_t j = 0;
  // Two vectors per step: the Horner chain is serial, so two independent chains keep the
  // multipliers busy.
  for (; j + 8 <= n; j += 8) {
    const __m256d a = Exp4(_mm256_sub_pd(_mm256_loadu_pd(z + j), s));
    const __m256d b = Exp4(_mm256_sub_pd(_mm256_loadu_pd(z + j + 4), s));
    _mm256_storeu_pd(z + j, a);
    _mm256_storeu_pd(z + j + 4, b);
  }
  for (; j + 4 <= n; j += 4) {
    _mm256_storeu_pd(z + j, Exp4(_mm256_sub_pd(_mm256_loadu_pd(z + j), s)));
  }
  for (; j < n; ++j) z[j] = ExpRef(z[j] - shift);
}

}  // namespace simd
}  // namespace kvctl

#pragma GCC pop_options
