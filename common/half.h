// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/half.h
// IEEE binary16 (fp16) and bfloat16 conversions in plain integer arithmetic, so the CPU reference,
// the SIMD path and CUDA produce the same bits. float -> half rounds to nearest even, overflows to
// +-Inf, keeps subnormals; NaN stays NaN. float -> bf16 rounds to nearest even.
#ifndef KVCTL_COMMON_HALF_H_
#define KVCTL_COMMON_HALF_H_

#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace kvctl {

KVCTL_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

KVCTL_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

KVCTL_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // Inf or NaN.
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // Rounds past 65504.
  if (abs < 0x38800000u) {  // Result is subnormal or zero: |f| < 2^-14.
    if (abs < 0x33000000u)
      return static_cast<uint16_t>(sign);  // Below half the smallest subnormal.
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24: value = mant * 2^(exp-150), unit = 2^-24.
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Normal: rebias exponent (127 -> 15) and round 23 mantissa bits to 10.
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // May carry into the exponent: fine.
  return static_cast<uint16_t>(sign | h);
}

KVCTL_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return BitsToFloat(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal: value = mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Rounds a float to the nearest fp16 value and back: the value a reader of stored metadata sees.
KVCTL_HOST_DEVICE inline float RoundToHalf(float f) { return HalfToFloat(FloatToHalf(f)); }

KVCTL_HOST_DEVICE inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN.
  const uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

KVCTL_HOST_DEVICE inline float Bf16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// Largest finite fp16 magnitude.
inline constexpr float kHalfMax = 65504.0f;

}  // namespace kvctl

#endif  // KVCTL_COMMON_HALF_H_
