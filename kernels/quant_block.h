// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/quant_block.h
// The per-block math of every quantizer, written once for the CPU reference and the CUDA kernels
// (KVCTL_HOST_DEVICE). These functions allocate nothing, validate nothing and never fail except by
// reporting fp16 metadata overflow: callers check specs and inputs first (kernels/quantize.cc).
//
// Rounding rules (the spec the SIMD path reproduces bit for bit):
//   - round() is rintf: round half to even.
//   - A quotient x / s is computed as x * (1.0f / s), with the reciprocal taken once per group.
//   - Stored metadata is fp16 (round to nearest even); codes are computed from the fp16-rounded
//     scale and zero so that dequantization uses exactly the values that produced the codes, except
//     KVarN, whose codes come from fp32 parameters and whose folded scales are rounded afterwards
//     (as in its reference implementation).
//   - Sums run in index order, in fp32.
//   - Group minima and maxima are canonicalised with + 0.0f, so -0 and +0 never give different
//     bytes whatever order a SIMD reduction visits them in.
#ifndef KVCTL_KERNELS_QUANT_BLOCK_H_
#define KVCTL_KERNELS_QUANT_BLOCK_H_

#include <cmath>
#include <cstdint>

#include "common/half.h"
#include "common/host_device.h"
#include "kernels/quant_types.h"

namespace kvctl::block {

// 1/sqrt(2^i) in fp32 for i = 0..10: the orthonormal Hadamard scale for head_dim 2^i.
KVCTL_HOST_DEVICE inline float HadamardScale(int d) {
  constexpr float kScale[11] = {1.0f,   0.70710677f,  0.5f,    0.35355339f,  0.25f,   0.17677669f,
                                0.125f, 0.088388346f, 0.0625f, 0.044194173f, 0.03125f};
  int log2 = 0;
  while ((1 << log2) < d) ++log2;
  return kScale[log2];
}

// In-place orthonormal fast Walsh-Hadamard transform of one row of d (power of two) floats.
// Self-inverse: applying it twice restores the row up to rounding.
KVCTL_HOST_DEVICE inline void FwhtRow(float* x, int d) {
  for (int len = 1; len < d; len <<= 1) {
    for (int i = 0; i < d; i += 2 * len) {
      for (int j = i; j < i + len; ++j) {
        const float a = x[j];
        const float b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
  const float s = HadamardScale(d);
  for (int j = 0; j < d; ++j) x[j] *= s;
}

// Codes: rows of n codes of `bits` bits, LSB-first bit stream, row bytes = n * bits / 8.
// REQUIRES for PutCode: the row was zeroed.
KVCTL_HOST_DEVICE inline void PutCode(uint8_t* row, int i, int bits, uint32_t code) {
  const int bit = i * bits;
  const int byte = bit >> 3;
  const int shift = bit & 7;
  row[byte] = static_cast<uint8_t>(row[byte] | (code << shift));
  if (shift + bits > 8) row[byte + 1] = static_cast<uint8_t>(row[byte + 1] | (code >> (8 - shift)));
}

KVCTL_HOST_DEVICE inline uint32_t GetCode(const uint8_t* row, int i, int bits) {
  const int bit = i * bits;
  const int byte = bit >> 3;
  const int shift = bit & 7;
  uint32_t v = row[byte] >> shift;
  if (shift + bits > 8) v |= static_cast<uint32_t>(row[byte + 1]) << (8 - shift);
  return v & ((1u << bits) - 1u);
}

KVCTL_HOST_DEVICE inline void StoreHalf(uint8_t* base, int i, float v) {
  const uint16_t h = FloatToHalf(v);
  base[2 * i] = static_cast<uint8_t>(h & 0xFF);
  base[2 * i + 1] = static_cast<uint8_t>(h >> 8);
}

KVCTL_HOST_DEVICE inline float LoadHalf(const uint8_t* base, int i) {
  return HalfToFloat(static_cast<uint16_t>(base[2 * i] | (base[2 * i + 1] << 8)));
}

KVCTL_HOST_DEVICE inline bool FitsHalf(float v) { return v == v && fabsf(v) <= kHalfMax; }

// x_hat = code * scale + zero; both stored as fp16.
struct Affine {
  float scale;
  float zero;
};

// KIVI / QuaRot RTN (docs/algorithms.md §2.2) over [lo, hi] with fp16 parameters. A
// constant group (range rounds to a zero scale) gets scale 0: every code 0, x_hat = zero.
// Returns false when a parameter overflows fp16.
KVCTL_HOST_DEVICE inline bool MinMaxAffine(float lo, float hi, int bits, Affine* p) {
  const float levels = static_cast<float>((1 << bits) - 1);
  p->zero = RoundToHalf(lo);
  p->scale = RoundToHalf((hi - p->zero) / levels);
  if (!(p->scale > 0.0f)) p->scale = 0.0f;
  return FitsHalf(p->zero) && FitsHalf(p->scale);
}

KVCTL_HOST_DEVICE inline uint32_t MinMaxCode(float x, const Affine& p, float inv_scale,
                                             float levels) {
  if (p.scale == 0.0f) return 0;
  const float q = rintf((x - p.zero) * inv_scale);
  return static_cast<uint32_t>(fminf(fmaxf(q, 0.0f), levels));
}

// OScaR RTN (docs/algorithms.md §2.3): integer zero point zq = round(-lo / scale),
// code = clamp(round(x / scale + zq)), x_hat = code * scale + zero with zero = -zq * scale.
// lo = hi = 0 widens to [-1, 1]; a zero scale gives every code 0 and x_hat = lo.
struct OscarAffine {
  Affine a;
  float inv_scale;
  float zq;
};

KVCTL_HOST_DEVICE inline bool OscarParams(float lo, float hi, int bits, OscarAffine* p) {
  const float levels = static_cast<float>((1 << bits) - 1);
  if (lo == 0.0f && hi == 0.0f) {
    lo = -1.0f;
    hi = 1.0f;
  }
  p->a.scale = RoundToHalf((hi - lo) / levels);
  if (!(p->a.scale > 0.0f)) {
    p->a.scale = 0.0f;
    p->a.zero = RoundToHalf(lo);
    p->inv_scale = 0.0f;
    p->zq = 0.0f;
  } else {
    p->inv_scale = 1.0f / p->a.scale;
    p->zq = rintf(-lo * p->inv_scale);
    p->a.zero = RoundToHalf(-p->zq * p->a.scale);
  }
  return FitsHalf(p->a.zero) && FitsHalf(p->a.scale);
}

KVCTL_HOST_DEVICE inline uint32_t OscarCode(float x, const OscarAffine& p, float levels) {
  if (p.a.scale == 0.0f) return 0;
  const float q = rintf(x * p.inv_scale + p.zq);
  return static_cast<uint32_t>(fminf(fmaxf(q, 0.0f), levels));
}

// KVarN's Sinkhorn-style variance normalisation (docs/algorithms.md §6.2) of a rows x cols fp32
// matrix x (row-major). Outputs the best-iterate axis scales r[rows], c[cols] (x_bal = x / (r c)).
// Scratch: SinkhornScratch (eight vectors per axis).
// Sample standard deviations (n - 1), clamped to [1e-3, 1e3]; log scales clipped to [-0.3, 10];
// imbalance = max/min of column stds + max/min of row stds, on the clamped stds [ours: the clamp
// keeps all-zero rows from making it infinite]; ties keep the later iterate.
//
// How the stds are formed (the spec every path reproduces bit for bit, docs/algorithms.md §6.2):
// the std of column j of y = x * ir * ic (ir = 1 / r, ic = 1 / c) is ic[j] times the std of
// u[i] = x[i][j] * ir[i], and that std is taken in one pass from S = sum u and Q = sum u * u (index
// order, fp32): SpreadFromSums. Rows likewise with u[j] = x[i][j] * ic[j]. The row spreads depend
// only on ic, so the row stds after the row update are the same spreads times the new ir.
//
// Lanes (the CUDA warp-per-record encoder): every function below takes a LaneSplit; lane l computes
// rows (or columns) l, l + lanes, ... each exactly as the single-lane loop does, and Sinkhorn calls
// `sync` wherever a lane reads what another lane wrote. The defaults are the plain CPU loops.
struct LaneSplit {
  int lane = 0;
  int lanes = 1;
};

struct NoSync {
  KVCTL_HOST_DEVICE void operator()() const {}
};

KVCTL_HOST_DEVICE inline float ClampStd(float s) { return fminf(fmaxf(s, 1e-3f), 1e3f); }

// KVarN's exp and log: polynomial and bit-manipulation functions that define the math (glibc's
// expf/logf are not correctly rounded and differ from CUDA's and between releases, so a vector
// version could not match them). Only + - * / and rintf, in this order, no FMA: the SIMD codecs
// (kernels/quantize_simd_kvarn.inc) and CUDA (--fmad=false) run the same operations per lane.
// Coefficients: weighted least-squares fits (Lawson iterations on Chebyshev nodes), rounded to
// fp32. Measured on every float of the domains Sinkhorn uses (docs/algorithms.md §6.2): KvarnExp
// on [-0.3, 10] and KvarnLog on [1e-3, 1e3] are within 1 ulp of glibc 2.36's expf/logf and of
// the correctly rounded result (tests/kernels/quantize_test.cc checks a sample of them).
//
// KvarnExp: x = n ln2 + r, |r| <= ln2 / 2, exp(r) = 1 + r + r^2 q(r), times 2^n in the exponent
// bits. REQUIRES |x| <= 87 (a normal result).
KVCTL_HOST_DEVICE inline float KvarnExp(float x) {
  constexpr float kLn2Hi = 0.693359375f;     // 355/512: n * kLn2Hi is exact for |n| < 2^15.
  constexpr float kLn2Lo = -2.12194440e-4f;  // ln 2 - kLn2Hi.
  const float n = rintf(x * 1.44269504f);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float q = 1.97892280e-4f;
  q = q * r + 1.39457530e-3f;
  q = q * r + 8.33350420e-3f;
  q = q * r + 4.16662800e-2f;
  q = q * r + 1.66666660e-1f;
  q = q * r + 0.5f;
  float y = (r * r) * q;
  y = y + r;
  y = y + 1.0f;
  return BitsToFloat(FloatBits(y) + (static_cast<uint32_t>(static_cast<int32_t>(n)) << 23));
}

// KvarnLog: x = 2^e m, m in [sqrt(1/2), sqrt(2)) from the bits, f = m - 1 (exact),
// log(1 + f) = f - f^2 / 2 + f^3 p(f), plus e ln2. REQUIRES x positive and normal.
KVCTL_HOST_DEVICE inline float KvarnLog(float x) {
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  const uint32_t b = FloatBits(x);
  const int32_t e = static_cast<int32_t>(b - 0x3F3504F3u) >> 23;
  const float f = BitsToFloat(b - (static_cast<uint32_t>(e) << 23)) - 1.0f;
  float p = 6.74734500e-2f;
  p = p * f - 1.18357874e-1f;
  p = p * f + 1.19795114e-1f;
  p = p * f - 1.23838510e-1f;
  p = p * f + 1.42029360e-1f;
  p = p * f - 1.66687070e-1f;
  p = p * f + 2.00030730e-1f;
  p = p * f - 2.50000100e-1f;
  p = p * f + 3.33332960e-1f;
  const float f2 = f * f;
  float y = (f2 * f) * p;
  y = y - 0.5f * f2;
  y = y + f;
  const float ef = static_cast<float>(e);
  y = y + ef * kLn2Lo;
  return y + ef * kLn2Hi;
}

// The unclamped sample std of n values from their sum s and sum of squares q (one pass; a
// negative difference from rounding counts as zero).
KVCTL_HOST_DEVICE inline float SpreadFromSums(float s, float q, int n) {
  const float mean = s / static_cast<float>(n);
  return sqrtf(fmaxf(q - s * mean, 0.0f) / static_cast<float>(n - 1));
}

// out[j] = spread over i of x[i][j] * ir[i].
KVCTL_HOST_DEVICE inline void ColumnSpreads(const float* x, int rows, int cols, const float* ir,
                                            float* out, LaneSplit ls = {}) {
  for (int j = ls.lane; j < cols; j += ls.lanes) {
    float s = 0.0f, q = 0.0f;
    for (int i = 0; i < rows; ++i) {
      const float u = x[i * cols + j] * ir[i];
      s += u;
      q += u * u;
    }
    out[j] = SpreadFromSums(s, q, rows);
  }
}

// out[i] = spread over j of x[i][j] * ic[j].
KVCTL_HOST_DEVICE inline void RowSpreads(const float* x, int rows, int cols, const float* ic,
                                         float* out, LaneSplit ls = {}) {
  for (int i = ls.lane; i < rows; i += ls.lanes) {
    float s = 0.0f, q = 0.0f;
    for (int j = 0; j < cols; ++j) {
      const float u = x[i * cols + j] * ic[j];
      s += u;
      q += u * u;
    }
    out[i] = SpreadFromSums(s, q, cols);
  }
}

KVCTL_HOST_DEVICE inline float MaxOverMin(const float* v, int n) {
  float lo = v[0], hi = v[0];
  for (int i = 1; i < n; ++i) {
    lo = fminf(lo, v[i]);
    hi = fmaxf(hi, v[i]);
  }
  return hi / lo;
}

// One axis scale update: l = clip(l + log(std), -0.3, 10), e = exp(l), inv = 1 / e.
KVCTL_HOST_DEVICE inline void UpdateScale(float std, float* l, float* e, float* inv) {
  *l = fminf(fmaxf(*l + KvarnLog(std), -0.3f), 10.0f);
  *e = KvarnExp(*l);
  *inv = 1.0f / *e;
}

// y[i][j] = (x[i][j] * ir[i]) * ic[j], with ir = 1 / exp(lr) and ic = 1 / exp(lc): the reciprocals
// are taken once per axis, so the balanced tile costs two multiplies per element.
KVCTL_HOST_DEVICE inline void ApplyScales(const float* x, int rows, int cols, const float* ir,
                                          const float* ic, float* y, LaneSplit ls = {}) {
  for (int i = ls.lane; i < rows; i += ls.lanes) {
    for (int j = 0; j < cols; ++j) y[i * cols + j] = x[i * cols + j] * ir[i] * ic[j];
  }
}

struct SinkhornScratch {
  float* lr;  // rows: log row scales
  float* lc;  // cols
  float* er;  // rows: exp(lr)
  float* ec;  // cols
  float* ir;  // rows: 1 / er
  float* ic;  // cols: 1 / ec
  float* rp;  // rows: row spreads under ic
  float* cp;  // cols: column spreads under ir
  float* rs;  // rows: row stds
  float* cs;  // cols: column stds
};

// Returns with every lane's writes visible to all lanes (ends with sync).
template <class Sync = NoSync>
KVCTL_HOST_DEVICE inline void Sinkhorn(const float* x, int rows, int cols, int iters,
                                       const SinkhornScratch& s, float* r_best, float* c_best,
                                       LaneSplit ls = {}, Sync sync = {}) {
  const int l0 = ls.lane, ln = ls.lanes;
  for (int i = l0; i < rows; i += ln) s.lr[i] = 0.0f, s.er[i] = s.ir[i] = r_best[i] = 1.0f;
  for (int j = l0; j < cols; j += ln) s.lc[j] = 0.0f, s.ec[j] = s.ic[j] = c_best[j] = 1.0f;
  sync();
  ColumnSpreads(x, rows, cols, s.ir, s.cp, ls);
  RowSpreads(x, rows, cols, s.ic, s.rp, ls);
  for (int j = l0; j < cols; j += ln) s.cs[j] = ClampStd(s.ic[j] * s.cp[j]);
  for (int i = l0; i < rows; i += ln) s.rs[i] = ClampStd(s.ir[i] * s.rp[i]);
  sync();
  float best = MaxOverMin(s.cs, cols) + MaxOverMin(s.rs, rows);  // The same in every lane.
  for (int it = 0; it < iters; ++it) {
    for (int j = l0; j < cols; j += ln) UpdateScale(s.cs[j], &s.lc[j], &s.ec[j], &s.ic[j]);
    sync();  // Also: every lane is done reading cs and rs of the previous step.
    RowSpreads(x, rows, cols, s.ic, s.rp, ls);  // Row i: written and read by the same lane.
    for (int i = l0; i < rows; i += ln) {
      UpdateScale(ClampStd(s.ir[i] * s.rp[i]), &s.lr[i], &s.er[i], &s.ir[i]);
      s.rs[i] = ClampStd(s.ir[i] * s.rp[i]);  // The row stds of the updated tile.
    }
    sync();
    ColumnSpreads(x, rows, cols, s.ir, s.cp, ls);  // Also the next iteration's column stds.
    for (int j = l0; j < cols; j += ln) s.cs[j] = ClampStd(s.ic[j] * s.cp[j]);
    sync();
    const float imb = MaxOverMin(s.cs, cols) + MaxOverMin(s.rs, rows);
    if (imb <= best) {
      best = imb;
      for (int i = l0; i < rows; i += ln) r_best[i] = s.er[i];
      for (int j = l0; j < cols; j += ln) c_best[j] = s.ec[j];
    }
  }
  sync();
}

// KVarN RTN of one balanced row (fp32 parameters, docs/algorithms.md §2.4):
// delta = max(range/L, 1e-10).
struct KvarnRow {
  float lo;
  float delta;
  float inv_delta;
};

KVCTL_HOST_DEVICE inline KvarnRow KvarnRowParams(float lo, float hi, int bits) {
  const float levels = static_cast<float>((1 << bits) - 1);
  KvarnRow p;
  p.lo = lo;
  p.delta = fmaxf((hi - lo) / levels, 1e-10f);
  p.inv_delta = 1.0f / p.delta;
  return p;
}

KVCTL_HOST_DEVICE inline uint32_t KvarnCode(float y, const KvarnRow& p, float levels) {
  const float q = rintf((y - p.lo) * p.inv_delta);
  return static_cast<uint32_t>(fminf(fmaxf(q, 0.0f), levels));
}

// TurboQuant (docs/algorithms.md §20): the fixed random signs of its rotation y = H (s ⊙ x), the
// same for every head_dim, layer and head: bit 63 of splitmix64(kTurboSeed + c). Decoding applies
// s ⊙ H (H is self-inverse, s_c^2 = 1).
inline constexpr uint64_t kTurboSeed = 0x7475726271756174ull;  // "turbquat"

KVCTL_HOST_DEVICE constexpr bool TurboSignNegative(int c) {
  uint64_t z = kTurboSeed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(c) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (z >> 63) != 0;
}

// The code of y: how many of the 2^bits - 1 bounds lie strictly below it (ties go down).
KVCTL_HOST_DEVICE inline uint32_t TurboCode(float y, const TurboCodebook& cb, int bits) {
  uint32_t code = 0;
  const int n = (1 << bits) - 1;
  for (int k = 0; k < n; ++k) code += y > cb.bound[k] ? 1u : 0u;
  return code;
}

// How a row's scale is chosen from its codes (docs/algorithms.md §20.3). Both are fixed points of
// re-encoding a decoded row: it gives the same codes and the same scale.
enum class TurboScale : uint8_t {
  // a = (r . c) / (c . c): the decoded row's error is orthogonal to it (least squares). K rows.
  kLeastSquares,
  // a = (r . r) / (r . c): the decoded row's component along x is x itself, its error is
  // orthogonal to x. V rows: attention sums values with weights, the errors of different tokens
  // cancel in that sum and a shrink common to all of them (least squares decodes each row to
  // about 1 - D_mse of itself along x) would not.
  kUnbiased,
};

// One token row x[0..d) into d codes and its fp16 scale at meta[t] (§20.3): n = ||x|| summed in
// index order; r = H (s ⊙ x) in `work` (d floats); code_c = TurboCode(r_c * (1 / n)), or of 0 when
// n = 0; the scale is `scale_rule`'s a for the chosen centroids c, not n. Why: decoding n c has
// norm n ||c|| < n (Lloyd-Max centroids shrink, ||c||^2 ~ 1 - D_mse), so every re-encoding of a
// decoded row shrank it by ||c|| again (0.94x per pass at 2 bits); with either rule the decoded
// row a c re-encodes to the same codes and the same a. Returns false when n or a does not fit
// fp16.
KVCTL_HOST_DEVICE inline bool TurboEncodeRow(const float* x, int d, int bits,
                                             const TurboCodebook& cb, TurboScale scale_rule,
                                             float* work, uint8_t* codes, uint8_t* meta, int t) {
  float ss = 0.0f;
  for (int c = 0; c < d; ++c) ss += x[c] * x[c];
  const float norm = sqrtf(ss);
  for (int c = 0; c < d; ++c) work[c] = TurboSignNegative(c) ? -x[c] : x[c];
  FwhtRow(work, d);
  const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
  float rc = 0.0f, cc = 0.0f;
  for (int c = 0; c < d; ++c) {
    const uint32_t code = TurboCode(work[c] * inv, cb, bits);
    PutCode(codes, c, bits, code);
    rc += work[c] * cb.centroid[code];
    cc += cb.centroid[code] * cb.centroid[code];
  }
  // cc > 0: no Lloyd-Max centroid is 0 (2^bits levels, antisymmetric). Each centroid has its
  // coordinate's sign (or the coordinate is 0), so rc > 0 unless the row is 0 (or NaN, refused
  // input): those store 0.
  const float a = scale_rule == TurboScale::kUnbiased ? ss / rc : rc / cc;
  const float scale = rc > 0.0f ? a : 0.0f;
  StoreHalf(meta, t, scale);
  return FitsHalf(norm) && FitsHalf(scale);
}

// The inverse: out_c = s_c (H (centroid[code] * a_fp16))_c.
KVCTL_HOST_DEVICE inline void TurboDecodeRow(const uint8_t* codes, const uint8_t* meta, int t,
                                             int d, int bits, const TurboCodebook& cb, float* out) {
  const float scale = LoadHalf(meta, t);
  for (int c = 0; c < d; ++c) out[c] = cb.centroid[GetCode(codes, c, bits)] * scale;
  FwhtRow(out, d);
  for (int c = 0; c < d; ++c) out[c] = TurboSignNegative(c) ? -out[c] : out[c];
}

}  // namespace kvctl::block

#endif  // KVCTL_KERNELS_QUANT_BLOCK_H_
