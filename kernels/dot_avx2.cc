// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX2 instances of kernels/dot.h. Float: a vector's lane u is DotRef's running sum s_u, so the
// products and sums are DotRef's own; four rows share each load of `a`, and their four final
// combinations run as one horizontal-add tree. No FMA: the target below does not enable it, and
// the build compiles with -ffp-contract=off. int16: vpmaddwd (16 products, summed in pairs into
// eight int32 lanes) per 16 elements; integer sums in any order equal DotI16Ref's. With 8 rows of
// `a` or more, lanes over keys (below): 1.0 instead of 1.6 ns a dot product at D = 64 with many
// rows (Intel Xeon guest at the AVX2 level; docs/eviction.md "Timings").
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/dot.h"

#pragma GCC push_options
#pragma GCC target("avx2")

namespace kvctl::simd {
namespace {

// DotRef's tail: the last n % 8 products, in index order.
inline float Tail(const float* a, const float* b, int64_t whole, int64_t n) {
  float tail = 0;
  for (int64_t d = whole; d < n; ++d) tail += a[d] * b[d];
  return tail;
}

// Lane r of the result: ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) of row r's sums.
// hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7]; IEEE addition is
// commutative, so each pair sum equals DotRef's.
inline __m128 Combine4(__m256 r0, __m256 r1, __m256 r2, __m256 r3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(r0, r1), _mm256_hadd_ps(r2, r3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Lane r: the total of the eight int32 lanes of x_r (wrapping, so in any order the same).
inline __m128i Sum4(__m256i x0, __m256i x1, __m256i x2, __m256i x3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(x0, x1), _mm256_hadd_epi32(x2, x3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// One A x B block of int16 dot products: out[i * out_stride + j] = a_i . b_j. Each load of a row
// of `b` serves A products, each load of a row of `a` B of them; A * B accumulators stay in
// registers (the loops unroll: A and B are constants). kTail: n is not a multiple of 16, the
// last n % 16 products are added one by one. Inlined: the block's bookkeeping is a large part of
// its cost at R-KV's head dimensions (4 vector steps per row at D = 64).
template <int A, int B, bool kTail>
__attribute__((always_inline)) inline void BlockI16(const int16_t* a, int64_t a_stride,
                                                    const int16_t* b, int64_t stride, int64_t n,
                                                    int32_t* out, int64_t out_stride) {
  const int64_t whole = kTail ? n - n % 16 : n;
  __m256i acc[A * B];
  for (int k = 0; k < A * B; ++k) acc[k] = _mm256_setzero_si256();
  for (int64_t d = 0; d < whole; d += 16) {
    __m256i y[B];
    for (int j = 0; j < B; ++j) {
      y[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + j * stride + d));
    }
    for (int i = 0; i < A; ++i) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i * a_stride + d));
      for (int j = 0; j < B; ++j) {
        acc[i * B + j] = _mm256_add_epi32(acc[i * B + j], _mm256_madd_epi16(x, y[j]));
      }
    }
  }
  if constexpr (B == 4 && !kTail) {
    // A row's four totals are adjacent in `out`: one store each.
    for (int i = 0; i < A; ++i) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i * out_stride),
                       Sum4(acc[i * 4], acc[i * 4 + 1], acc[i * 4 + 2], acc[i * 4 + 3]));
    }
    return;
  }
  // The A * B lane totals, four at a time (Sum4), in row-major order.
  constexpr int kOut = A * B;
  alignas(16) int32_t total[(kOut + 3) / 4 * 4];
  for (int k = 0; k < kOut; k += 4) {
    const __m256i zero = _mm256_setzero_si256();
    const __m256i x1 = k + 1 < kOut ? acc[k + 1] : zero;
    const __m256i x2 = k + 2 < kOut ? acc[k + 2] : zero;
    const __m256i x3 = k + 3 < kOut ? acc[k + 3] : zero;
    _mm_store_si128(reinterpret_cast<__m128i*>(total + k), Sum4(acc[k], x1, x2, x3));
  }
  for (int i = 0; i < A; ++i) {
    for (int j = 0; j < B; ++j) {
      // uint32: the lanes wrapped modulo 2^32 like this tail may; the true sum fits int32.
      uint32_t sum = static_cast<uint32_t>(total[i * B + j]);
      if constexpr (kTail) {
        for (int64_t d = whole; d < n; ++d) {
          sum += static_cast<uint32_t>(int32_t{a[i * a_stride + d]} * int32_t{b[j * stride + d]});
        }
      }
      out[i * out_stride + j] = static_cast<int32_t>(sum);
    }
  }
}

// Lanes over keys (kernels/dot_lanes_over_keys.inc, as kernels/dot_avx512.cc's, with vpmaddwd
// and vpaddd): each row of `a` broadcasts its pairs against 16 transposed keys, so eight totals
// come out of an accumulator with no sum across lanes (when TakesLanesOverKeys).
constexpr int64_t kMinKeysLanesOverKeys = 8;

// 8 x 8 int32 transpose in registers: r[i] lane j -> r[j] lane i.
inline void Transpose8(__m256i* r) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4k + m], 128-bit half L: element 4L + m of rows 4k..4k+3.
  for (int k = 0; k < 2; ++k) {
    u[4 * k] = _mm256_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm256_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm256_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm256_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x20);
    r[4 + m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x31);
  }
}

// The primitives kernels/dot_lanes_over_keys.inc builds on, eight int32 lanes.
using VecI = __m256i;
constexpr int64_t kLanes = 8;
inline VecI ZeroI() { return _mm256_setzero_si256(); }
inline VecI LoadI(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline VecI LoadAlignedI(const int32_t* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}
inline void StoreAlignedI(int32_t* p, VecI v) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(p), v);
}
inline VecI SplatI(int32_t x) { return _mm256_set1_epi32(x); }
// acc + the products of x's and k's int16 pairs, summed in pairs (vpmaddwd, vpaddd).
inline VecI AddPairProducts(VecI acc, VecI x, VecI k) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(x, k));
}
// The first n <= kLanes lanes of v to out.
inline void StoreFirstI(int32_t* out, VecI v, int64_t n) {
  if (n >= kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), v);
    return;
  }
  alignas(32) int32_t lanes[kLanes];
  StoreAlignedI(lanes, v);
  for (int64_t k = 0; k < n; ++k) out[k] = lanes[k];
}
inline void TransposeLanes(VecI* r) { Transpose8(r); }

#include "kernels/dot_lanes_over_keys.inc"

// DotRowsManyI16Avx2 for one value of kTail.
template <bool kTail>
void RowsManyI16(const int16_t* a, int64_t a_stride, int64_t a_count, const int16_t* rows,
                 int64_t stride, int64_t count, int64_t n, int32_t* out, int64_t out_stride) {
  int64_t q = 0;
  for (; q + 4 <= a_count; q += 4) {
    const int16_t* aq = a + q * a_stride;
    int32_t* o = out + q * out_stride;
    int64_t r = 0;
    // Four rows of `rows` (in L1 after the first pair) against two pairs of `a` rows: each
    // block's four totals per `a` row are one store.
    for (; r + 4 <= count; r += 4) {
      const int16_t* b = rows + r * stride;
      BlockI16<2, 4, kTail>(aq, a_stride, b, stride, n, o + r, out_stride);
      BlockI16<2, 4, kTail>(aq + 2 * a_stride, a_stride, b, stride, n, o + 2 * out_stride + r,
                            out_stride);
    }
    for (; r < count; ++r) {
      BlockI16<4, 1, kTail>(aq, a_stride, rows + r * stride, stride, n, o + r, out_stride);
    }
  }
  for (; q < a_count; ++q) {
    const int16_t* aq = a + q * a_stride;
    int32_t* o = out + q * out_stride;
    int64_t r = 0;
    for (; r + 4 <= count; r += 4) {
      BlockI16<1, 4, kTail>(aq, a_stride, rows + r * stride, stride, n, o + r, out_stride);
    }
    for (; r < count; ++r) {
      BlockI16<1, 1, kTail>(aq, a_stride, rows + r * stride, stride, n, o + r, out_stride);
    }
  }
}

// A rows of `a` against four rows b, b + stride, ...: out[i * out_stride + j] = DotRef(a_i, b_j).
// Per eight elements: the four rows of b and each row of `a` loaded once, A x 4 products and sums
// (lane u of accumulator (i, j) is DotRef's running sum s_u); then one Combine4 per row of `a`,
// whose four totals are adjacent in `out`. kTail: n is not a multiple of 8, and each total gets
// DotRef's tail.
template <int A, bool kTail>
__attribute__((always_inline)) inline void RowsBlock4(const float* a, int64_t a_stride,
                                                      const float* b, int64_t stride, int64_t n,
                                                      float* out, int64_t out_stride) {
  const int64_t whole = kTail ? n - n % 8 : n;
  __m256 acc[A][4];
  for (int i = 0; i < A; ++i) {
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  for (int64_t d = 0; d < whole; d += 8) {
    __m256 x[A];
    for (int i = 0; i < A; ++i) x[i] = _mm256_loadu_ps(a + i * a_stride + d);
    for (int j = 0; j < 4; ++j) {
      const __m256 y = _mm256_loadu_ps(b + j * stride + d);
      for (int i = 0; i < A; ++i) acc[i][j] = _mm256_add_ps(acc[i][j], _mm256_mul_ps(x[i], y));
    }
  }
  for (int i = 0; i < A; ++i) {
    const __m128 sums = Combine4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    float* o = out + i * out_stride;
    if constexpr (!kTail) {
      _mm_storeu_ps(o, sums);
    } else {
      alignas(16) float lanes[4];
      _mm_store_ps(lanes, sums);
      for (int j = 0; j < 4; ++j) {
        o[j] = lanes[j] + Tail(a + i * a_stride, b + j * stride, whole, n);
      }
    }
  }
}

// DotRowsManyAvx2 for one value of kTail: four rows of `rows` at a time (kept in L1 while every
// row of `a` passes over them, so each is read from L2 once per call) against pairs of rows of
// `a`: eight running-sum vectors, four loads of `rows` and two of `a` per eight products.
template <bool kTail>
void RowsMany(const float* a, int64_t a_stride, int64_t a_count, const float* rows, int64_t stride,
              int64_t count, int64_t n, float* out, int64_t out_stride) {
  int64_t r = 0;
  for (; r + 4 <= count; r += 4) {
    const float* b = rows + r * stride;
    int64_t q = 0;
    for (; q + 2 <= a_count; q += 2) {
      RowsBlock4<2, kTail>(a + q * a_stride, a_stride, b, stride, n, out + q * out_stride + r,
                           out_stride);
    }
    if (q < a_count) {
      RowsBlock4<1, kTail>(a + q * a_stride, a_stride, b, stride, n, out + q * out_stride + r,
                           out_stride);
    }
  }
  if (r == count) return;
  for (int64_t q = 0; q < a_count; ++q) {
    DotRowsAvx2(a + q * a_stride, rows + r * stride, stride, count - r, n,
                out + q * out_stride + r);
  }
}

}  // namespace

void DotRowsAvx2(const float* a, const float* rows, int64_t stride, int64_t count, int64_t n,
                 float* out) {
  const int64_t whole = n - n % 8;
  alignas(16) float sums[4];
  int64_t r = 0;
  for (; r + 4 <= count; r += 4) {
    const float* b0 = rows + r * stride;
    const float* b1 = b0 + stride;
    const float* b2 = b1 + stride;
    const float* b3 = b2 + stride;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t d = 0; d < whole; d += 8) {
      const __m256 x = _mm256_loadu_ps(a + d);
      s0 = _mm256_add_ps(s0, _mm256_mul_ps(x, _mm256_loadu_ps(b0 + d)));
      s1 = _mm256_add_ps(s1, _mm256_mul_ps(x, _mm256_loadu_ps(b1 + d)));
      s2 = _mm256_add_ps(s2, _mm256_mul_ps(x, _mm256_loadu_ps(b2 + d)));
      s3 = _mm256_add_ps(s3, _mm256_mul_ps(x, _mm256_loadu_ps(b3 + d)));
    }
    _mm_store_ps(sums, Combine4(s0, s1, s2, s3));
    out[r] = sums[0] + Tail(a, b0, whole, n);
    out[r + 1] = sums[1] + Tail(a, b1, whole, n);
    out[r + 2] = sums[2] + Tail(a, b2, whole, n);
    out[r + 3] = sums[3] + Tail(a, b3, whole, n);
  }
  for (; r < count; ++r) {
    const float* b = rows + r * stride;
    __m256 s = _mm256_setzero_ps();
    for (int64_t d = 0; d < whole; d += 8) {
      s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d)));
    }
    _mm_store_ps(sums, Combine4(s, s, s, s));
    out[r] = sums[0] + Tail(a, b, whole, n);
  }
}

void UnitRowsI16Avx2(const float* x, int64_t stride, int64_t count, int64_t n, float scale,
                     int16_t* unit, float* norm) {
  const int64_t whole = n - n % 8;
  const int64_t whole16 = n - n % 16;
  const __m256 round = _mm256_set1_ps(0x1.8p23f);
  alignas(16) float sums[4];
  int64_t t = 0;
  // Norms four rows at a time: lane u of s_r is DotRef's running sum s_u of x_r . x_r.
  for (; t < count; t += 4) {
    const int64_t rows = count - t < 4 ? count - t : 4;
    __m256 s[4];
    for (int r = 0; r < 4; ++r) s[r] = _mm256_setzero_ps();
    for (int64_t d = 0; d < whole; d += 8) {
      for (int r = 0; r < rows; ++r) {
        const __m256 v = _mm256_loadu_ps(x + (t + r) * stride + d);
        s[r] = _mm256_add_ps(s[r], _mm256_mul_ps(v, v));
      }
    }
    _mm_store_ps(sums, Combine4(s[0], s[1], s[2], s[3]));
    for (int r = 0; r < rows; ++r) {
      const float* row = x + (t + r) * stride;
      norm[t + r] = std::sqrt(sums[r] + Tail(row, row, whole, n)) + 1e-8f;
      const float to_unit = scale / norm[t + r];
      const __m256 k = _mm256_set1_ps(to_unit);
      int16_t* u = unit + (t + r) * n;
      int64_t d = 0;
      for (; d < whole16; d += 16) {
        // (v * k + 1.5 * 2^23) - 1.5 * 2^23 is an integer in float; the conversion is exact, and
        // packs + the 64-bit permute put the sixteen int16 in order (no value saturates).
        const __m256 lo =
            _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(row + d), k), round), round);
        const __m256 hi = _mm256_sub_ps(
            _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(row + d + 8), k), round), round);
        const __m256i packed = _mm256_packs_epi32(_mm256_cvtps_epi32(lo), _mm256_cvtps_epi32(hi));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + d),
                            _mm256_permute4x64_epi64(packed, 0xD8));
      }
      for (; d < n; ++d) {
        u[d] = static_cast<int16_t>((row[d] * to_unit + 0x1.8p23f) - 0x1.8p23f);
      }
    }
  }
}

void LogitsFromUnitDotsAvx2(const int32_t* dot, float q_norm, const float* k_norm, int64_t n,
                            float* out) {
  // LogitsFromUnitDotsRef's three roundings per lane, in its order (no FMA).
  const __m256 qn = _mm256_set1_ps(q_norm);
  const __m256 unit = _mm256_set1_ps(0x1p-28f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 d =
        _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dot + j)));
    const __m256 s = _mm256_mul_ps(qn, _mm256_mul_ps(_mm256_loadu_ps(k_norm + j), unit));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(d, s));
  }
  for (; j < n; ++j) out[j] = static_cast<float>(dot[j]) * (q_norm * (k_norm[j] * 0x1p-28f));
}

void DotRowsManyAvx2(const float* a, int64_t a_stride, int64_t a_count, const float* rows,
                     int64_t stride, int64_t count, int64_t n, float* out, int64_t out_stride) {
  if (n % 8 == 0) {
    RowsMany<false>(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
  } else {
    RowsMany<true>(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
  }
}

void DotRowsManyI16Avx2(const int16_t* a, int64_t a_stride, int64_t a_count, const int16_t* rows,
                        int64_t stride, int64_t count, int64_t n, int32_t* out,
                        int64_t out_stride) {
  if (TakesLanesOverKeys(n, a_count, count)) {
    LanesOverKeys(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
  } else if (n % 16 == 0) {
    RowsManyI16<false>(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
  } else {
    RowsManyI16<true>(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
  }
}

void DotPairsI16Avx2(const int16_t* rows, int64_t n, const int32_t* first, const int32_t* second,
                     int64_t count, int32_t* out) {
  const int64_t whole = n - n % 16;
  // Four pairs at a time share one Sum4; their tails (n % 16 products) are added one by one.
  for (int64_t k = 0; k < count; k += 4) {
    const int pairs = count - k < 4 ? static_cast<int>(count - k) : 4;
    __m256i acc[4];
    for (int p = 0; p < 4; ++p) {
      acc[p] = _mm256_setzero_si256();
      if (p >= pairs) continue;
      const int16_t* a = rows + int64_t{first[k + p]} * n;
      const int16_t* b = rows + int64_t{second[k + p]} * n;
      for (int64_t d = 0; d < whole; d += 16) {
        acc[p] = _mm256_add_epi32(
            acc[p], _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d)),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + d))));
      }
    }
    alignas(16) int32_t total[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(total), Sum4(acc[0], acc[1], acc[2], acc[3]));
    for (int p = 0; p < pairs; ++p) {
      const int16_t* a = rows + int64_t{first[k + p]} * n;
      const int16_t* b = rows + int64_t{second[k + p]} * n;
      // uint32: the lanes wrapped modulo 2^32 like this tail may; the true sum fits int32.
      uint32_t sum = static_cast<uint32_t>(total[p]);
      for (int64_t d = whole; d < n; ++d) {
        sum += static_cast<uint32_t>(int32_t{a[d]} * int32_t{b[d]});
      }
      out[k + p] = static_cast<int32_t>(sum);
    }
  }
}

}  // namespace kvctl::simd

#pragma GCC pop_options
