// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX2 + F16C instance of the element conversions (8 lanes). Only called when the CPU has both.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "kernels/convert_simd.h"

#pragma GCC push_options
#pragma GCC target("avx2,f16c")

namespace kvctl::simd {
namespace {
typedef int32_t VI __attribute__((vector_size(32)));
typedef uint32_t VU __attribute__((vector_size(32)));
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT;

inline VU SplatU(uint32_t x) { return (VU)_mm256_set1_epi32(static_cast<int>(x)); }
inline VU LoadU32(const uint8_t* p) {
  return (VU)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline void StoreU32(uint8_t* p, VU v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)v);
}
inline VU LoadU16(const uint8_t* p) {
  return (VU)_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// Lanes hold values below 2^16, so the signed saturating pack keeps them.
inline void StoreU16(uint8_t* p, VU v) {
  const __m256i x = (__m256i)v;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
}
inline VU LoadF16AsF32(const uint8_t* p) {
  return (VU)_mm256_castps_si256(
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline void StoreF32AsF16(uint8_t* p, VU bits) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(_mm256_castsi256_ps((__m256i)bits), kRne));
}
inline bool AnyLane(VU mask) { return !_mm256_testz_si256((__m256i)mask, (__m256i)mask); }
}  // namespace

#define KVCTL_W 8
#define KVCTL_SUFFIXED(name) name##Avx2
#include "kernels/convert_simd_impl.inc"
#undef KVCTL_SUFFIXED
#undef KVCTL_W

}  // namespace kvctl::simd

#pragma GCC pop_options
