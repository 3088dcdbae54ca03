// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX-512 instance of the element conversions (16 lanes). Only called when the CPU has
// AVX-512F/BW/VL (the level kernels/quantize.h detects; F16C comes with it).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "kernels/convert_simd.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,f16c")
// GCC 12 flags its own _mm512_undefined_*() inside avx512fintrin.h as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kvctl::simd {
namespace {
typedef int32_t VI __attribute__((vector_size(64)));
typedef uint32_t VU __attribute__((vector_size(64)));
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT;

inline VU SplatU(uint32_t x) { return (VU)_mm512_set1_epi32(static_cast<int>(x)); }
inline VU LoadU32(const uint8_t* p) { return (VU)_mm512_loadu_si512(p); }
inline void StoreU32(uint8_t* p, VU v) { _mm512_storeu_si512(p, (__m512i)v); }
inline VU LoadU16(const uint8_t* p) {
  return (VU)_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void StoreU16(uint8_t* p, VU v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16((__m512i)v));
}
inline VU LoadF16AsF32(const uint8_t* p) {
  return (VU)_mm512_castps_si512(
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}
inline void StoreF32AsF16(uint8_t* p, VU bits) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(_mm512_castsi512_ps((__m512i)bits), kRne));
}
inline bool AnyLane(VU mask) { return _mm512_test_epi32_mask((__m512i)mask, (__m512i)mask) != 0; }
}  // namespace

#define KVCTL_W 16
#define KVCTL_SUFFIXED(name) name##Avx512
#include "kernels/convert_simd_impl.inc"
#undef KVCTL_SUFFIXED
#undef KVCTL_W

}  // namespace kvctl::simd

#pragma GCC pop_options
