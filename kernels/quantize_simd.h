// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/quantize_simd.h (internal to kernels/)
// Entry points of the SIMD record codecs, one set per instruction set. They take the same
// arguments as block::EncodeRecord / block::DecodeRecord and produce the same bytes and floats.
// Each is compiled for its ISA in its own file; callers must check the CPU first (quantize.cc).
//
// Thread safety: reentrant; all state is in the caller's scratch.
//
//   std::vector<float> scratch(simd::ScratchFloats(spec));
//   simd::EncodeResult r = simd::EncodeRecordAvx2(spec, layout, k, v, stride, norms,
//                                                  scratch.data(), record);
#ifndef KVCTL_KERNELS_QUANTIZE_SIMD_H_
#define KVCTL_KERNELS_QUANTIZE_SIMD_H_

#include <algorithm>
#include <cstdint>

#include "kernels/quant_types.h"

namespace kvctl::simd {

// Scratch floats of one call, by region (the codecs carve it in this order, from the first 64-byte
// boundary). Sized for the widest ISA (16 lanes) and the largest rows (8-bit codes over
// max(G, D) positions); every region is a multiple of 16 floats.
struct ScratchPlan {
  int64_t tile = 0;    // Each of two G x D tiles.
  int64_t vecs = 0;    // Per-row and per-column vectors.
  int64_t words = 0;   // Code words of 16 rows.
  int64_t groups = 0;  // Each of three per-group arrays of 16 lanes.
  int64_t total = 0;
};

inline ScratchPlan PlanScratch(const QuantSpec& s) {
  const int64_t g = s.block_tokens, d = s.head_dim, m = std::max(g, d);
  ScratchPlan p;
  p.tile = g * d;
  p.vecs = 16 * (g + d);
  p.words = 16 * (m / 4 + 1);
  p.groups = 16 * (m / 8 + 1);
  p.total = 2 * p.tile + p.vecs + p.words + 3 * p.groups + 16;  // + 16: 64-byte alignment.
  return p;
}

inline int64_t ScratchFloats(const QuantSpec& s) { return PlanScratch(s).total; }

// kNonFinite: some K or V element is Inf or NaN (the record is then garbage; the caller names the
// element). kOverflow: stored fp16 metadata would overflow (block::EncodeRecord's false).
enum class EncodeResult : uint8_t { kOk, kNonFinite, kOverflow };

#define KVCTL_DECLARE_SIMD_CODEC(Suffix)                                                          \
  /* next_k: the K rows of the block the caller encodes next (same stride), or null; a hint */    \
  /* the encoder prefetches while it computes, never reads. */                                    \
  EncodeResult EncodeRecord##Suffix(const QuantSpec& s, const BlockLayout& l, const float* k,     \
                                    const float* v, int64_t stride, const float* norms,           \
                                    float* scratch, uint8_t* rec, const float* next_k);           \
  /* The same record from fp16 rows (stride in fp16 elements), converted in the loaders. */       \
  EncodeResult EncodeRecordF16In##Suffix(                                                         \
      const QuantSpec& s, const BlockLayout& l, const uint16_t* k, const uint16_t* v,             \
      int64_t stride, const float* norms, float* scratch, uint8_t* rec, const uint16_t* next_k);  \
  void DecodeRecord##Suffix(const QuantSpec& s, const BlockLayout& l, const uint8_t* rec,         \
                            const float* norms, float* scratch, float* k_out, float* v_out);      \
  /* DecodeRecord's floats stored as fp16 (common/half.h's FloatToHalf of each), 2 bytes each. */ \
  void DecodeRecordHalves##Suffix(const QuantSpec& s, const BlockLayout& l, const uint8_t* rec,   \
                                  const float* norms, float* scratch, uint8_t* k_out,             \
                                  uint8_t* v_out);                                                \
  void FwhtRows##Suffix(float* rows, int64_t n, int d);                                           \
  /* ComputeTokenNormsRef's norms of the first tokens, a multiple of the lane count of them */    \
  /* (0 when head_dim is not a multiple of it); returns how many. fp32 rows. */                   \
  int64_t TokenNorms##Suffix(const float* k, int64_t tokens, int64_t heads, int d,                \
                             int64_t token_stride, int64_t head_stride, float* norms);            \
  int64_t TokenNormsF16In##Suffix(const uint16_t* k, int64_t tokens, int64_t heads, int d,        \
                                  int64_t token_stride, int64_t head_stride, float* norms);

KVCTL_DECLARE_SIMD_CODEC(Avx2)
KVCTL_DECLARE_SIMD_CODEC(Avx512)
#undef KVCTL_DECLARE_SIMD_CODEC

}  // namespace kvctl::simd

#endif  // KVCTL_KERNELS_QUANTIZE_SIMD_H_
