// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/simd_lookup.h (internal)
// table[code] per lane for a 16-entry float table (TurboQuant's centroids) and codes < 16, written
// once per instruction set for the TurboQuant codec (quantize_avx2.cc, quantize_avx512.cc) and its
// fused attention (attention_simd_avx2.cc, attention_simd_avx512.cc), each of which wraps it for
// its own vector types. Each function carries its own target, so it inlines into those files and
// nothing else may call it.
#ifndef KVCTL_KERNELS_SIMD_LOOKUP_H_
#define KVCTL_KERNELS_SIMD_LOOKUP_H_

#include <immintrin.h>

namespace kvctl::simd_lookup {

// The table in registers (loaded once where a loop looks up many codes), and table[code] per lane.
// AVX2: two 8-entry permutes, picked by bit 3 of the code (moved to the sign bit for the blend).
struct Table16Avx2 {
  __m256 lo, hi;
};
__attribute__((target("avx2"))) inline Table16Avx2 LoadTable16Avx2(const float* table) {
  return {_mm256_loadu_ps(table), _mm256_loadu_ps(table + 8)};
}
__attribute__((target("avx2"))) inline __m256 Lookup16Avx2(const Table16Avx2& t, __m256i code) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.lo, code),
                          _mm256_permutevar8x32_ps(t.hi, code),
                          _mm256_castsi256_ps(_mm256_slli_epi32(code, 28)));
}

// AVX-512: one permute over the whole table.
struct Table16Avx512 {
  __m512 t;
};
__attribute__((target("avx512f"))) inline Table16Avx512 LoadTable16Avx512(const float* table) {
  return {_mm512_loadu_ps(table)};
}
__attribute__((target("avx512f"))) inline __m512 Lookup16Avx512(const Table16Avx512& t,
                                                                __m512i code) {
  return _mm512_permutexvar_ps(code, t.t);
}

}  // namespace kvctl::simd_lookup

#endif  // KVCTL_KERNELS_SIMD_LOOKUP_H_
