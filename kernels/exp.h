// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/exp.h
// exp in double from one fixed sequence of IEEE operations (no libm, no fused multiply-add): the
// eviction scorers' softmaxes (policies/eviction.cc). libm's exp may differ in the last bit
// between C libraries and CPUs and runs one element at a time; this one gives the same bits on
// every CPU, scalar or SIMD, and vectorises.
//
// ExpRef(x), the spec (docs/algorithms.md §12.1):
//   NaN -> NaN. Otherwise x is clamped to [-746, 710] (exp is 0 below and +inf above, in double),
//   k = round(x / ln 2) (to nearest, ties to even), r = (x - k ln2_hi) - k ln2_lo (Cody-Waite:
//   ln2_hi has 32 significant bits, so k ln2_hi is exact), p = the degree-13 Taylor polynomial of
//   e^r in Horner form (coefficients 1/n! rounded to double), and the result (p 2^k1) 2^k2 with
//   k1 = floor(k / 2), k2 = k - k1 (both powers normal, so only the last multiplication rounds:
//   subnormal results and overflow to +inf come out of IEEE arithmetic).
// Accuracy: within a few ulp of exp over the whole range (|r| <= 0.347, so the Taylor remainder is
// below 1e-17 relative); tested against std::exp.
//
// Thread safety: reentrant, no state (the SIMD level is the process-wide one of
// kernels/quantize.h).
#ifndef KVCTL_KERNELS_EXP_H_
#define KVCTL_KERNELS_EXP_H_

#include <cstdint>

namespace kvctl {

// The reference (see above).
double ExpRef(double x);

// z[j] = ExpRef(z[j] - shift) for j < n, on the active SIMD level (AVX2 when the CPU has it): a
// softmax's numerators once its maximum is known. n >= 0.
void ExpShiftedInPlace(double* z, int64_t n, double shift);

namespace simd {
// ExpShiftedInPlace on AVX2 (kernels/exp_avx2.cc); only called when the CPU has it.
void ExpShiftedInPlaceAvx2(double* z, int64_t n, double shift);
}  // namespace simd

}  // namespace kvctl

#endif  // KVCTL_KERNELS_EXP_H_
