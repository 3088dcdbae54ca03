// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/exp.h
// The eviction scorers' softmax (policies/eviction.cc): exp in float from one fixed sequence of
// IEEE operations (no libm, no fused multiply-add), and the sum of the numerators in one fixed
// order. libm's exp may differ in the last bit between C libraries and CPUs and runs one element
// at a time; this one gives the same bits on every CPU, scalar or SIMD, and vectorises.
//
// ExpRef(x), the spec (docs/algorithms.md §12.1):
//   NaN -> NaN. Otherwise x is clamped to [-104, 89] (exp is 0 below and +inf above, in float),
//   k = round(x / ln 2) (x * (1 / ln 2) rounded to float, then to nearest, ties to even),
//   r = (x - k ln2_hi) - k ln2_lo (Cody-Waite: ln2_hi has 16 significant bits, so k ln2_hi is
//   exact), p = the degree-7 Taylor polynomial of e^r in Horner form (coefficients 1/n! rounded
//   to float), and the result (p 2^k1) 2^k2 with k1 = floor(k / 2), k2 = k - k1 (both powers
//   normal, so only the last multiplication rounds: subnormal results and overflow to +inf come
//   out of IEEE arithmetic).
// Accuracy: within 2 ulp of exp for normal results (|r| <= 0.347, so the Taylor remainder is
// below 1e-8 relative); tested against std::exp.
//
// SoftmaxNumerators(x, z, n), the spec: m = the maximum of x[0, n) (NaNs skipped), z[j] =
// ExpRef(x[j] - m), and the returned sum of the z[j] in double as eight running sums
// s_u = sum of z[j] for j = u mod 8 in index order, combined ((s0 + s1) + (s2 + s3)) +
// ((s4 + s5) + (s6 + s7)); 0 when n is 0. The AVX2 and AVX-512 paths hold s_u in lane u.
//
// AddScaled(z, n, w, a), the spec: a[j] += double(z[j]) * w for j < n, the product rounded to
// double before the sum (no fused multiply-add): how a scorer adds one softmax, weighted by w / its
// sum, to its importance in double.
//
// Thread safety: reentrant, no state (the SIMD level is the process-wide one of
// kernels/quantize.h).
#ifndef KVCTL_KERNELS_EXP_H_
#define KVCTL_KERNELS_EXP_H_

#include <cstdint>

namespace kvctl {

// The reference (see above).
float ExpRef(float x);

// A softmax's numerators of x into z and their sum (see above), on the active SIMD level (AVX2
// when the CPU has it, AVX-512 at the AVX-512 level). n >= 0; z is x (in place) or does not
// overlap it.
double SoftmaxNumerators(const float* x, float* z, int64_t n);
inline double SoftmaxNumerators(float* z, int64_t n) { return SoftmaxNumerators(z, z, n); }

// a[j] += double(z[j]) * w for j < n (see above), on the active SIMD level. n >= 0; a and z do
// not overlap.
void AddScaled(const float* z, int64_t n, double w, double* a);

namespace simd {
// SoftmaxNumerators and AddScaled on AVX2 (kernels/exp_avx2.cc); only called when the CPU has it.
double SoftmaxNumeratorsAvx2(const float* x, float* z, int64_t n);
void AddScaledAvx2(const float* z, int64_t n, double w, double* a);
// The same on AVX-512 (kernels/exp_avx512.cc); only called at the AVX-512 level.
double SoftmaxNumeratorsAvx512(const float* x, float* z, int64_t n);
void AddScaledAvx512(const float* z, int64_t n, double w, double* a);
}  // namespace simd

}  // namespace kvctl

#endif  // KVCTL_KERNELS_EXP_H_
