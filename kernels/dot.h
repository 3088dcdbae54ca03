// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/dot.h
// Dot products whose results do not depend on the CPU: the inner loop of the eviction scorers
// (policies/eviction.cc).
// Float ones for H2O's and the mass metric's queries against every key; exact int16 ones between
// unit rows rounded to int16 (UnitRowsI16): R-KV's T^2 / 2 key similarities and the logits of
// R-KV's and SnapKV's observation queries (docs/algorithms.md §12.4).
//
// The order (the spec, DotRef): eight running sums s_u = sum over the whole chunks c of
// a[8c + u] * b[8c + u], each product rounded to float before it is added (no fused multiply-add);
// then ((s_0 + s_1) + (s_2 + s_3)) + ((s_4 + s_5) + (s_6 + s_7)); then plus the tail, the sum of
// a[d] * b[d] over the last n % 8 elements in index order (0 when there are none). Every SIMD path
// returns DotRef's bits, so which tokens a scorer keeps never depends on the CPU.
//
// Thread safety: reentrant, no state (the SIMD level is the process-wide one of
// kernels/quantize.h).
#ifndef KVCTL_KERNELS_DOT_H_
#define KVCTL_KERNELS_DOT_H_

#include <cstdint>

namespace kvctl {

// The reference: sum of a[d] * b[d] over d < n in the order above. n >= 0.
float DotRef(const float* a, const float* b, int64_t n);

// out[r] = DotRef(a, rows + r * stride, n) for r in [0, count), on the active SIMD level (AVX2
// when the CPU has it, AVX-512 CPUs included; the scalar reference otherwise). stride >= n;
// count >= 0; `out` must not overlap the inputs.
void DotRows(const float* a, const float* rows, int64_t stride, int64_t count, int64_t n,
             float* out);

// out[q * out_stride + r] = DotRef(a + q * a_stride, rows + r * stride, n) for q in
// [0, a_count) and r in [0, count): several rows `a` against the same rows, which are then read
// from beyond L1 once per call (in blocks of four that every row of `a` passes over) instead of
// once per row of `a` (what bounds DotRows when `rows` is larger than the L1 cache). a_stride,
// stride >= n; out_stride >= count; counts >= 0; `out` must not overlap the inputs.
void DotRowsMany(const float* a, int64_t a_stride, int64_t a_count, const float* rows,
                 int64_t stride, int64_t count, int64_t n, float* out, int64_t out_stride);

// The int16 reference: the exact sum of a[d] * b[d] over d < n. Integer sums do not depend on
// their order, so every SIMD path returns the same value. REQUIRES: n >= 0; every element in
// [-32767, 32767]; the exact sum in int32 (it is for vectors of norm <= 2^15 - 8, e.g. unit
// vectors scaled by 2^14 and rounded: by Cauchy-Schwarz no partial sum exceeds the product of
// the norms).
int32_t DotI16Ref(const int16_t* a, const int16_t* b, int64_t n);

// DotRowsMany on int16 rows: out[q * out_stride + r] = DotI16Ref(a + q * a_stride,
// rows + r * stride, n), on the active SIMD level (AVX2; AVX-512 VNNI at the AVX-512 level when
// the CPU has it). Same layout rules as DotRowsMany, strides in
// elements; DotI16Ref's requirements on every pair.
void DotRowsManyI16(const int16_t* a, int64_t a_stride, int64_t a_count, const int16_t* rows,
                    int64_t stride, int64_t count, int64_t n, int32_t* out, int64_t out_stride);

// out[k] = DotI16Ref(rows + first[k] * n, rows + second[k] * n, n) for k < count: chosen pairs
// among one set of rows (R-KV's squared norms, first[k] == second[k], and the similarity of a row
// with the partner an earlier scoring found for it). On the active SIMD level (AVX2 at the AVX2
// and AVX-512 levels). REQUIRES: n >= 0, count >= 0; every index names a row the caller holds;
// DotI16Ref's requirements on every pair; `out` does not overlap the inputs.
void DotPairsI16(const int16_t* rows, int64_t n, const int32_t* first, const int32_t* second,
                 int64_t count, int32_t* out);
// Rows as int16 unit vectors (the eviction scorers' keys and queries, docs/algorithms.md §12.4):
// for each row t < count of x (rows `stride` floats apart, n elements each)
//   norm[t] = sqrt(DotRef(x_t, x_t, n)) + 1e-8 and to_unit = scale / norm[t], in float;
//   unit[t * n + c] = x_t[c] * to_unit rounded to the nearest integer, ties to even.
// REQUIRES: n > 0, stride >= n, 0 < scale <= 2^14 (so |unit| <= scale + 1 fits int16), finite x;
// `unit` (count * n) and `norm` (count) must not overlap x. UnitRowsI16 returns the reference's
// bits on the active SIMD level.
void UnitRowsI16Ref(const float* x, int64_t stride, int64_t count, int64_t n, float scale,
                    int16_t* unit, float* norm);
void UnitRowsI16(const float* x, int64_t stride, int64_t count, int64_t n, float scale,
                 int16_t* unit, float* norm);

// The logits of one unit query row against n unit key rows, from their exact int16 dots
// (DotRowsManyI16 of rows scaled by 2^14): out[j] = float(dot[j]) * (q_norm * (k_norm[j] *
// 2^-28)), each product rounded to float in that order (k_norm[j] * 2^-28 is exact for the norms
// UnitRowsI16 gives). The reference is that loop; LogitsFromUnitDots returns its bits on the active
// SIMD level. n >= 0; `out` must not overlap the inputs.
void LogitsFromUnitDotsRef(const int32_t* dot, float q_norm, const float* k_norm, int64_t n,
                           float* out);
void LogitsFromUnitDots(const int32_t* dot, float q_norm, const float* k_norm, int64_t n,
                        float* out);

namespace simd {
// DotRows, DotRowsMany, DotRowsManyI16, UnitRowsI16, LogitsFromUnitDots and DotPairsI16 on AVX2
// (kernels/dot_avx2.cc); only called when the CPU has it.
void DotRowsAvx2(const float* a, const float* rows, int64_t stride, int64_t count, int64_t n,
                 float* out);
void DotRowsManyAvx2(const float* a, int64_t a_stride, int64_t a_count, const float* rows,
                     int64_t stride, int64_t count, int64_t n, float* out, int64_t out_stride);
void DotRowsManyI16Avx2(const int16_t* a, int64_t a_stride, int64_t a_count, const int16_t* rows,
                        int64_t stride, int64_t count, int64_t n, int32_t* out, int64_t out_stride);
void UnitRowsI16Avx2(const float* x, int64_t stride, int64_t count, int64_t n, float scale,
                     int16_t* unit, float* norm);
void DotPairsI16Avx2(const int16_t* rows, int64_t n, const int32_t* first, const int32_t* second,
                     int64_t count, int32_t* out);
void LogitsFromUnitDotsAvx2(const int32_t* dot, float q_norm, const float* k_norm, int64_t n,
                            float* out);
// DotRowsManyI16 with AVX-512 VNNI (kernels/dot_avx512.cc); only called at the AVX-512 level on a
// CPU with VNNI (CpuHasAvx512Vnni).
void DotRowsManyI16Avx512Vnni(const int16_t* a, int64_t a_stride, int64_t a_count,
                              const int16_t* rows, int64_t stride, int64_t count, int64_t n,
                              int32_t* out, int64_t out_stride);
}  // namespace simd

// Whether this CPU has AVX-512 VNNI (vpdpwssd), which DotRowsManyI16 uses at the AVX-512 level.
bool CpuHasAvx512Vnni();

}  // namespace kvctl

#endif  // KVCTL_KERNELS_DOT_H_
