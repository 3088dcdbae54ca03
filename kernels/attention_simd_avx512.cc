// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// AVX-512 instance of the fused-attention primitives (16 lanes). Only called when the CPU has
// AVX-512F/BW/VL (kernels/attention.cc checks through ActiveSimdLevel()).
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

// Everything below is compiled for AVX-512; the headers above stay generic. Attention may use FMA
// (AVX-512F has it): its results are compared within a tolerance, never bit for bit.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,f16c,fma")
// GCC 12 flags its own _mm512_undefined_*() inside avx512fintrin.h as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kvctl::attn {
namespace {
typedef float VF __attribute__((vector_size(64)));
typedef int32_t VI __attribute__((vector_size(64)));

inline VF Splat(float x) { return (VF)_mm512_set1_ps(x); }
inline VF Fma(VF a, VF b, VF c) { return (VF)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
inline VF VMax(VF a, VF b) { return (VF)_mm512_max_ps((__m512)a, (__m512)b); }
inline float HSum(VF v) { return _mm512_reduce_add_ps((__m512)v); }
inline float HMax(VF v) { return _mm512_reduce_max_ps((__m512)v); }
inline VF LoadHalvesW(const uint8_t* p) {
  return (VF)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// W bytes at p, zero-extended to int32 lanes (one vpmovzxbd; GCC 12 compiles the generic
// __builtin_convertvector of a byte vector into one extraction per byte).
inline VI LoadBytesW(const uint8_t* p) {
  return (VI)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// Lanes 0..7 = lo, lanes 8..15 = hi: two groups of 8 packed codes.
inline VI Splat2(int32_t lo, int32_t hi) {
  return (VI)_mm512_inserti64x4(_mm512_set1_epi32(lo), _mm256_set1_epi32(hi), 1);
}
// A 16-entry table held in registers, and table[code] per lane, code < 16 (kernels/simd_lookup.h).
using Table16 = simd_lookup::Table16Avx512;
inline Table16 LoadTable16(const float* table) { return simd_lookup::LoadTable16Avx512(table); }
inline VF Lookup16(const Table16& t, VI code) {
  return (VF)simd_lookup::Lookup16Avx512(t, (__m512i)code);
}
}  // namespace

#define KVCTL_W 16
#define KVCTL_ATTEND_ENTRY AttendAvx512
#include "kernels/attention_simd_impl.inc"
#undef KVCTL_ATTEND_ENTRY
#undef KVCTL_W

}  // namespace kvctl::attn

#pragma GCC pop_options
