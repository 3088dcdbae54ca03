// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX2 + FMA instance of the fused-attention primitives (8 lanes). Only called when the CPU has
// AVX2, F16C and FMA (kernels/attention.cc checks).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/attention_block.h"
#include "kernels/hadamard.h"
#include "kernels/prefetch.h"
#include "kernels/simd_lookup.h"

// Everything below is compiled for AVX2; the headers above stay generic. Unlike the codecs,
// attention may use FMA: its results are compared within a tolerance, never bit for bit.
#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")

namespace kvctl::attn {
namespace {
typedef float VF __attribute__((vector_size(32)));
typedef int32_t VI __attribute__((vector_size(32)));

inline VF Splat(float x) { return (VF)_mm256_set1_ps(x); }
inline VF Fma(VF a, VF b, VF c) { return (VF)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
inline VF VMax(VF a, VF b) { return (VF)_mm256_max_ps((__m256)a, (__m256)b); }
inline float HSum(VF v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
inline float HMax(VF v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
inline VF LoadHalvesW(const uint8_t* p) {
  return (VF)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// W bytes at p, zero-extended to int32 lanes (one vpmovzxbd; GCC 12 compiles the generic
// __builtin_convertvector of a byte vector into one extraction per byte).
inline VI LoadBytesW(const uint8_t* p) {
  return (VI)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// Unused at 8 lanes (one 32-bit word always holds 8 codes of <= 4 bits); declared for the .inc.
inline VI Splat2(int32_t lo, int32_t) { return VI{} + lo; }
// A 16-entry table held in registers, and table[code] per lane, code < 16 (kernels/simd_lookup.h).
using Table16 = simd_lookup::Table16Avx2;
inline Table16 LoadTable16(const float* table) { return simd_lookup::LoadTable16Avx2(table); }
inline VF Lookup16(const Table16& t, VI code) {
  return (VF)simd_lookup::Lookup16Avx2(t, (__m256i)code);
}
}  // namespace

#define KVCTL_W 8
#define KVCTL_ATTEND_ENTRY AttendAvx2
#include "kernels/attention_simd_impl.inc"
#undef KVCTL_ATTEND_ENTRY
#undef KVCTL_W

}  // namespace kvctl::attn

#pragma GCC pop_options
