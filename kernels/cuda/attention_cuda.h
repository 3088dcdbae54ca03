// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/cuda/attention_cuda.h
// CUDA fused single-query (decode) attention on packed block records, for every method and bit
// width, over many (layer, KV head) pairs at once; the g query rows of a GQA group share their KV
// head. Split-K: each head's records are cut into `splits` contiguous parts, one warp per
// (head, part) runs attn::Attend<WarpOps> of kernels/attention_block.h -- the very per-record math
// of the CPU reference (DecodeAttentionRef), with warp-cooperative loop primitives -- into a
// partial (out, lse); a second kernel merges the parts with attn::MergeParts (log-sum-exp). The
// dequantized cache is never materialised. Design and limits: docs/gpu.md.
//
// Agreement with DecodeAttentionRef: the primitives keep ScalarOps' summation order per output;
// what differs is FMA contraction (--fmad=true), the device expf/logf, the order of the
// softmax-sum reduction and the split-K merge, so results agree to ~1e-5 relative
// (tests/kernels_cuda bound it at 1e-4 of max |out|).
//
// Built only when CUDA is enabled (KVCTL_HAVE_CUDA); callers include this header only under
// KVCTL_USE_CUDA. Thread safety: a plan is immutable after Create and may be enqueued from one
// thread at a time (its split-K buffers are per plan); distinct plans are independent.
//
//   auto plan = CudaAttentionPlan::Create(spec, heads, /*group=*/4, 1 / sqrtf(128), DType::kF16);
//   KVCTL_RETURN_IF_ERROR(plan.status());
//   KVCTL_RETURN_IF_ERROR((*plan)->Run());  // heads[h].out / .lse written (device memory)
#ifndef KVCTL_KERNELS_CUDA_ATTENTION_CUDA_H_
#define KVCTL_KERNELS_CUDA_ATTENTION_CUDA_H_

#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/attention.h"
#include "kernels/quant_types.h"

namespace kvctl {

// One (layer, KV head) in device memory. Every pointer is a device pointer.
struct CudaAttentionHead {
  const uint8_t* const* records = nullptr;     // num_records record pointers (any token order).
  const float* const* record_norms = nullptr;  // OScaR: num_records pointers to G norms; else null.
  int64_t num_records = 0;
  const uint8_t* window_k = nullptr;  // Row 0 of this head's window K (engine frame).
  const uint8_t* window_v = nullptr;
  int64_t window_k_row_bytes = 0;  // Bytes between consecutive window rows.
  int64_t window_v_row_bytes = 0;
  int64_t window_rows = 0;   // Sinks + tail; 0 = no window.
  const float* q = nullptr;  // [group, head_dim] fp32, engine frame.
  float* out = nullptr;      // [group, head_dim] fp32.
  float* lse = nullptr;      // [group], natural log.
};

// Most split-K parts per head (the merge kernel keeps one pointer per part in registers/local).
inline constexpr int kMaxCudaAttentionSplits = 128;

class CudaAttentionPlan {
 public:
  // Validates everything checkable on the host (spec, group 1..kMaxAttentionGroup, scale, counts,
  // null pointers, window row bytes >= head_dim elements, splits 0..kMaxCudaAttentionSplits where
  // 0 picks ~16 warps per SM spread over the heads), uploads the head table and allocates the
  // split-K buffers. window_dtype: the element type of every head's window (fp32, fp16, bf16).
  // Errors: INVALID_ARGUMENT naming the field; UNAVAILABLE with the CUDA error string.
  static StatusOr<std::unique_ptr<CudaAttentionPlan>> Create(
      const QuantSpec& spec, std::span<const CudaAttentionHead> heads, int group, float scale,
      DType window_dtype, int splits = 0);
  ~CudaAttentionPlan();
  CudaAttentionPlan(const CudaAttentionPlan&) = delete;
  CudaAttentionPlan& operator=(const CudaAttentionPlan&) = delete;

  // Launches the two kernels on `stream` (a cudaStream_t; null = the default stream) without
  // waiting. Reads the records, windows and queries at execution time, so new query values need
  // no new plan. UNAVAILABLE if a launch fails.
  Status Enqueue(void* stream = nullptr) const;
  // Enqueue on the default stream and wait; reports execution errors too.
  Status Run() const;

  int splits() const;
  int warps_per_block() const;
  // True when each warp's attn::Work lives in shared memory (false: a global-memory fallback for
  // very large group x head_dim).
  bool shared_scratch() const;

 private:
  struct State;
  explicit CudaAttentionPlan(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

// Host-memory convenience for tests and tools: the CPU API's inputs (AttentionKv, query rows,
// AttentionResult in host memory) for several heads with the same spec, group and scale; copies
// records, norms, each head's window rows and the queries to the device, runs one plan, copies
// out/lse back. Validates each head with ValidateAttention; every non-empty window must have the
// same dtype.
struct HostAttentionHead {
  AttentionKv kv;
  const float* q = nullptr;  // [group, head_dim]
  AttentionResult result;
};
Status DecodeAttentionCudaHost(const QuantSpec& spec, std::span<const HostAttentionHead> heads,
                               int group, float scale, int splits = 0);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_CUDA_ATTENTION_CUDA_H_
