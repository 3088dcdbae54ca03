// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/dot.h"

#include <cmath>

#include "kernels/quantize.h"

namespace kvctl {
namespace {

// The scalar DotRowsMany of either element type: one reference dot product per output.
template <typename In, typename Out, typename Ref>
void RowsManyRef(Ref ref, const In* a, int64_t a_stride, int64_t a_count, const In* rows,
                 int64_t stride, int64_t count, int64_t n, Out* out, int64_t out_stride) {
  for (int64_t q = 0; q < a_count; ++q) {
    for (int64_t r = 0; r < count; ++r) {
      out[q * out_stride + r] = ref(a + q * a_stride, rows + r * stride, n);
    }
  }
}

}  // namespace

float DotRef(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[d + u] * b[d + u];
  }
  float tail = 0;
  for (; d < n; ++d) tail += a[d] * b[d];
  return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

void DotRows(const float* a, const float* rows, int64_t stride, int64_t count, int64_t n,
             float* out) {
  if (ActiveSimdLevel() != SimdLevel::kScalar) {
    simd::DotRowsAvx2(a, rows, stride, count, n, out);
    return;
  }
  for (int64_t r = 0; r < count; ++r) out[r] = DotRef(a, rows + r * stride, n);
}

void DotRowsMany(const float* a, int64_t a_stride, int64_t a_count, const float* rows,
                 int64_t stride, int64_t count, int64_t n, float* out, int64_t out_stride) {
  if (ActiveSimdLevel() != SimdLevel::kScalar) {
    simd::DotRowsManyAvx2(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
    return;
  }
  RowsManyRef(DotRef, a, a_stride, a_count, rows, stride, count, n, out, out_stride);
}

int32_t DotI16Ref(const int16_t* a, const int16_t* b, int64_t n) {
  // Modulo 2^32 (uint32: wrapping is defined), so the requirement is on the result only: the
  // exact sum fits int32, so the wrapped one equals it. A loop the compiler vectorises (SSE2).
  uint32_t sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += static_cast<uint32_t>(int32_t{a[d]} * int32_t{b[d]});
  return static_cast<int32_t>(sum);
}

bool CpuHasAvx512Vnni() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return has;
}

void DotPairsI16(const int16_t* rows, int64_t n, const int32_t* first, const int32_t* second,
                 int64_t count, int32_t* out) {
  if (ActiveSimdLevel() != SimdLevel::kScalar) {
    simd::DotPairsI16Avx2(rows, n, first, second, count, out);
    return;
  }
  for (int64_t k = 0; k < count; ++k) {
    out[k] = DotI16Ref(rows + int64_t{first[k]} * n, rows + int64_t{second[k]} * n, n);
  }
}

void DotRowsManyI16(const int16_t* a, int64_t a_stride, int64_t a_count, const int16_t* rows,
                    int64_t stride, int64_t count, int64_t n, int32_t* out, int64_t out_stride) {
  if (ActiveSimdLevel() == SimdLevel::kAvx512 && CpuHasAvx512Vnni()) {
    simd::DotRowsManyI16Avx512Vnni(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
    return;
  }
  if (ActiveSimdLevel() != SimdLevel::kScalar) {
    simd::DotRowsManyI16Avx2(a, a_stride, a_count, rows, stride, count, n, out, out_stride);
    return;
  }
  RowsManyRef(DotI16Ref, a, a_stride, a_count, rows, stride, count, n, out, out_stride);
}

void UnitRowsI16Ref(const float* x, int64_t stride, int64_t count, int64_t n, float scale,
                    int16_t* unit, float* norm) {
  // Adding and subtracting 1.5 * 2^23 rounds to nearest, ties to even (|v| <= 2^14 + 1 is far
  // below 2^22), without a libm call.
  constexpr float kRound = 0x1.8p23f;
  for (int64_t t = 0; t < count; ++t) {
    const float* row = x + t * stride;
    norm[t] = std::sqrt(DotRef(row, row, n)) + 1e-8f;
    const float to_unit = scale / norm[t];
    for (int64_t c = 0; c < n; ++c) {
      unit[t * n + c] = static_cast<int16_t>((row[c] * to_unit + kRound) - kRound);
    }
  }
}

void UnitRowsI16(const float* x, int64_t stride, int64_t count, int64_t n, float scale,
                 int16_t* unit, float* norm) {
  if (ActiveSimdLevel() != SimdLevel::kScalar) {
    simd::UnitRowsI16Avx2(x, stride, count, n, scale, unit, norm);
    return;
  }
  UnitRowsI16Ref(x, stride, count, n, scale, unit, norm);
}

void LogitsFromUnitDotsRef(const int32_t* dot, float q_norm, const float* k_norm, int64_t n,
                           float* out) {
  for (int64_t j = 0; j < n; ++j) {
    out[j] = static_cast<float>(dot[j]) * (q_norm * (k_norm[j] * 0x1p-28f));
  }
}

void LogitsFromUnitDots(const int32_t* dot, float q_norm, const float* k_norm, int64_t n,
                        float* out) {
  if (ActiveSimdLevel() != SimdLevel::kScalar) {
    simd::LogitsFromUnitDotsAvx2(dot, q_norm, k_norm, n, out);
    return;
  }
  LogitsFromUnitDotsRef(dot, q_norm, k_norm, n, out);
}

}  // namespace kvctl
