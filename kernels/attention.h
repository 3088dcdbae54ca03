// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/attention.h
// Fused single-query (decode) attention of one (layer, KV head) read straight from block records:
// the g query rows of a GQA group attend over the head's full-precision window (sinks + tail, in
// the engine's frame) and its quantized records, with an online softmax across blocks, never
// materialising the dequantized cache. Rotating methods rotate the query once, score and
// accumulate in the rotated frame and rotate the output back once; KVarN uses its folded scale
// vectors, OScaR multiplies each key's score by its stored token norm. See docs/attention.md.
//
// Results are fp32 and agree with "dequantize everything, then softmax attention in fp64" to a
// relative 1e-4 of max |out| (tests/kernels/attention_test.cc). The SIMD path (AVX2+FMA or
// AVX-512, picked from ActiveSimdLevel() in kernels/quantize.h) reorders sums and uses a
// polynomial exp, so it is not bitwise equal to the scalar reference: within 5e-5 relative.
//
// Thread safety: reentrant, no shared state; scratch is per call. Parallelism is the caller's:
// run heads (and split-K parts) on separate threads, each with its own output buffers.
//
//   AttentionKv kv{.records = recs, .num_records = n, .window_k = wk, .window_v = wv};
//   AttentionQuery q{.q = rows, .group = 4, .scale = 1.0f / std::sqrt(128.0f)};
//   KVCTL_RETURN_IF_ERROR(DecodeAttention(spec, kv, q, {out, lse}));  // out [4,128], lse [4]
#ifndef KVCTL_KERNELS_ATTENTION_H_
#define KVCTL_KERNELS_ATTENTION_H_

#include <cstdint>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/quant_types.h"

namespace kvctl {

// Everything one (layer, KV head) holds. Token order does not matter to attention (positions are
// already in K through RoPE), so the window may hold the sinks and the tail in one view.
struct AttentionKv {
  // num_records pointers to records of BlockLayoutOf(spec).record_bytes bytes each.
  const uint8_t* const* records = nullptr;
  // OScaR only (else null): per record, its block_tokens fp32 token norms (the side record).
  const float* const* record_norms = nullptr;
  int64_t num_records = 0;
  // Full-precision rows in the engine's frame, exactly as appended (OScaR: not norm-scaled).
  // fp32, fp16 or bf16; K and V must have the same token count. An empty window is a view with
  // tokens == 0 (data may be null).
  KvTensorView window_k;
  KvTensorView window_v;
  int64_t window_head = 0;  // Head index inside the window views.
};

struct AttentionQuery {
  const float* q = nullptr;  // [group, head_dim] fp32, engine frame (after RoPE), row-major.
  int group = 1;             // Query heads sharing this KV head: 1..kMaxAttentionGroup.
  float scale = 0.0f;        // Softmax scale, > 0 and finite; usually 1 / sqrt(head_dim).
};

inline constexpr int kMaxAttentionGroup = 128;

// Caller-owned outputs.
struct AttentionResult {
  float* out = nullptr;  // [group, head_dim]: softmax(scale q K^T) V, engine frame.
  float* lse = nullptr;  // [group]: log(sum_j exp(scale q.k_j)), natural log, for split-K merges.
};

// Checks spec, pointers, counts, window views and the query (finite) without computing anything.
// Errors are INVALID_ARGUMENT naming the field, the value and what was expected.
Status ValidateAttention(const QuantSpec& spec, const AttentionKv& kv, const AttentionQuery& query,
                         const AttentionResult& result);

// Fused attention. With zero tokens in total (no records, empty window) every row gets out = 0 and
// lse = -inf: the value of an empty split-K part. DecodeAttentionRef is the scalar reference
// (kernels/attention_block.h with ScalarOps, the math CUDA reuses); DecodeAttention uses the SIMD
// path when ActiveSimdLevel() allows it (AVX2 also needs FMA) and the reference otherwise.
// Garbage record bytes give garbage values, never out-of-bounds reads.
Status DecodeAttentionRef(const QuantSpec& spec, const AttentionKv& kv, const AttentionQuery& query,
                          const AttentionResult& result);
Status DecodeAttention(const QuantSpec& spec, const AttentionKv& kv, const AttentionQuery& query,
                       const AttentionResult& result);

// Split-K. A part is the records [first, first + count) of kv, with the window or without it;
// attend over it with DecodeAttention into its own (out, lse) and merge the parts (in any order).
// REQUIRES: 0 <= first, count >= 0, first + count <= kv.num_records (else the returned part has
// num_records = -1, which DecodeAttention rejects).
AttentionKv AttentionPart(const AttentionKv& kv, int64_t first, int64_t count, bool with_window);

// out = sum_k w_k out_k / sum_k w_k with w_k = exp(lse_k - max lse), lse = log sum_k exp(lse_k).
// outs[k] is [group, head_dim], lses[k] is [group]. Empty parts (lse = -inf) weigh nothing.
Status MergeAttentionParts(int group, int head_dim, int parts, const float* const* outs,
                           const float* const* lses, const AttentionResult& result);

// Convenience: splits the records into `splits` contiguous parts (the window rides with the last),
// attends each with DecodeAttention on this thread and merges. Equals DecodeAttention up to fp32
// reordering; the shape a multi-threaded or CUDA flash-decoding caller reproduces.
Status DecodeAttentionSplitK(const QuantSpec& spec, const AttentionKv& kv,
                             const AttentionQuery& query, int splits,
                             const AttentionResult& result);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_ATTENTION_H_
