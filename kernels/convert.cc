// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/convert.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "kernels/convert_simd.h"
#include "kernels/quantize.h"

namespace kvctl {
namespace {

const uint8_t* Bytes(const void* p) { return static_cast<const uint8_t*>(p); }
uint8_t* Bytes(void* p) { return static_cast<uint8_t*>(p); }

uint32_t Load16(const uint8_t* p) { return static_cast<uint32_t>(p[0] | (p[1] << 8)); }

// Magnitude bits (sign cleared) above which an element fails each check.
constexpr uint32_t kF32FiniteMax = 0x7F7FFFFFu;  // FLT_MAX.
constexpr uint32_t kF32HalfMax = 0x477FE000u;    // 65504.0f.
constexpr uint32_t kF16Max = 0x7BFFu;            // 65504, also the largest finite fp16.
constexpr uint32_t kBf16FiniteMax = 0x7F7Fu;
constexpr uint32_t kBf16HalfMax = 0x477Fu;  // 65280; the next bf16, 65536, exceeds 65504.

size_t FirstAbove32(const uint8_t* src, size_t n, uint32_t limit) {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return simd::FirstAbove32Avx512(src, n, limit);
    case SimdLevel::kAvx2:
      return simd::FirstAbove32Avx2(src, n, limit);
    case SimdLevel::kScalar:
      break;
  }
  for (size_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, src + 4 * i, 4);
    if ((x & 0x7FFFFFFFu) > limit) return i;
  }
  return n;
}

size_t FirstAbove16(const uint8_t* src, size_t n, uint32_t limit) {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return simd::FirstAbove16Avx512(src, n, limit);
    case SimdLevel::kAvx2:
      return simd::FirstAbove16Avx2(src, n, limit);
    case SimdLevel::kScalar:
      break;
  }
  for (size_t i = 0; i < n; ++i) {
    if ((Load16(src + 2 * i) & 0x7FFFu) > limit) return i;
  }
  return n;
}

}  // namespace

void ConvertF32ToF16(const void* src, size_t n, void* dst) {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return simd::F32ToF16Avx512(Bytes(src), n, Bytes(dst));
    case SimdLevel::kAvx2:
      return simd::F32ToF16Avx2(Bytes(src), n, Bytes(dst));
    case SimdLevel::kScalar:
      break;
  }
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, Bytes(src) + 4 * i, 4);
    const uint16_t h = FloatToHalf(f);
    std::memcpy(Bytes(dst) + 2 * i, &h, 2);
  }
}

void ConvertF16ToF32(const void* src, size_t n, void* dst) {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return simd::F16ToF32Avx512(Bytes(src), n, Bytes(dst));
    case SimdLevel::kAvx2:
      return simd::F16ToF32Avx2(Bytes(src), n, Bytes(dst));
    case SimdLevel::kScalar:
      break;
  }
  for (size_t i = 0; i < n; ++i) {
    const float f = HalfToFloat(static_cast<uint16_t>(Load16(Bytes(src) + 2 * i)));
    std::memcpy(Bytes(dst) + 4 * i, &f, 4);
  }
}

void ConvertF32ToBf16(const void* src, size_t n, void* dst) {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return simd::F32ToBf16Avx512(Bytes(src), n, Bytes(dst));
    case SimdLevel::kAvx2:
      return simd::F32ToBf16Avx2(Bytes(src), n, Bytes(dst));
    case SimdLevel::kScalar:
      break;
  }
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, Bytes(src) + 4 * i, 4);
    const uint16_t b = FloatToBf16(f);
    std::memcpy(Bytes(dst) + 2 * i, &b, 2);
  }
}

void ConvertBf16ToF32(const void* src, size_t n, void* dst) {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return simd::Bf16ToF32Avx512(Bytes(src), n, Bytes(dst));
    case SimdLevel::kAvx2:
      return simd::Bf16ToF32Avx2(Bytes(src), n, Bytes(dst));
    case SimdLevel::kScalar:
      break;
  }
  for (size_t i = 0; i < n; ++i) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(Load16(Bytes(src) + 2 * i)));
    std::memcpy(Bytes(dst) + 4 * i, &f, 4);
  }
}

void RoundToHalfInPlace(float* values, size_t n) {
  constexpr size_t kChunk = 512;
  uint16_t halves[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = std::min(kChunk, n - i);
    ConvertF32ToF16(values + i, m, halves);
    ConvertF16ToF32(halves, m, values + i);
  }
}

void ConvertElements(DType from, const void* src, DType to, void* dst, size_t n) {
  if (from == to) {
    if (src != dst) std::memmove(dst, src, n * DTypeSize(from));
    return;
  }
  if (from == DType::kF32) {
    return to == DType::kF16 ? ConvertF32ToF16(src, n, dst) : ConvertF32ToBf16(src, n, dst);
  }
  if (to == DType::kF32) {
    return from == DType::kF16 ? ConvertF16ToF32(src, n, dst) : ConvertBf16ToF32(src, n, dst);
  }
  // fp16 <-> bf16: through fp32, a stack chunk at a time.
  constexpr size_t kChunk = 512;
  float buf[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = std::min(kChunk, n - i);
    ConvertElements(from, Bytes(src) + 2 * i, DType::kF32, buf, m);
    ConvertElements(DType::kF32, buf, to, Bytes(dst) + 2 * i, m);
  }
}

size_t FirstNonFinite(DType dtype, const void* src, size_t n) {
  switch (dtype) {
    case DType::kF32:
      return FirstAbove32(Bytes(src), n, kF32FiniteMax);
    case DType::kF16:
      return FirstAbove16(Bytes(src), n, kF16Max);
    case DType::kBF16:
      return FirstAbove16(Bytes(src), n, kBf16FiniteMax);
  }
  return n;
}

size_t FirstOutsideHalf(DType dtype, const void* src, size_t n) {
  switch (dtype) {
    case DType::kF32:
      return FirstAbove32(Bytes(src), n, kF32HalfMax);
    case DType::kF16:
      return FirstAbove16(Bytes(src), n, kF16Max);
    case DType::kBF16:
      return FirstAbove16(Bytes(src), n, kBf16HalfMax);
  }
  return n;
}

}  // namespace kvctl
