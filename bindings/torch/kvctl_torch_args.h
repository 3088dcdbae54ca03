// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: bindings/torch/kvctl_torch_args.h
// Argument validation of the torch.ops.kvctl.* ops, shared by their CPU kernels (kvctl_torch.cc)
// and CUDA kernels (kvctl_torch_cuda.cc): one Prepare* function per op checks every argument
// (ValueError naming the field, the value and what was expected), converts inputs to fp32
// contiguous tensors on the call's device and resolves the QuantSpec. The kernels then only
// compute. Every tensor argument of one call must be on that device; a CPU/CUDA mix is refused.
//
// Thread safety: the functions are reentrant. The pointers in AttentionArgs::heads point into the
// caller's tensors and the tensors held by AttentionArgs: keep both alive while using them.
//
//   const c10::Device device = CallDevice({{&k, "k"}, {&v, "v"}});
//   QuantizeArgs a = PrepareQuantize(device, k, v, method, 2, 2, -1, -1, -1, std::nullopt);
#ifndef KVCTL_BINDINGS_TORCH_KVCTL_TORCH_ARGS_H_
#define KVCTL_BINDINGS_TORCH_KVCTL_TORCH_ARGS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/quant_types.h"

namespace kvctl::torch_ops {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using NamedTensor = std::pair<const Tensor*, const char*>;

// A failed kvctl Status becomes a Python ValueError (bad input) or RuntimeError (anything else).
void ThrowIfError(const Status& status, std::string_view what);

DType DTypeOf(const Tensor& t, const char* name);

// The QuantSpec of a method at head_dim and bit widths, with optional overrides (<= 0: the
// registry default), canonicalised like the daemon's config (controller/config/config.cc).
QuantSpec SpecFrom(std::string_view method, int64_t head_dim, int64_t k_bits, int64_t v_bits,
                   int64_t block_tokens, int64_t k_group_tokens, int64_t v_group_channels);

// The device a CUDA kernel of an op runs on: that of the first CUDA tensor among `tensors`
// (null entries are absent optionals). Only called by the CUDA kernels, which the dispatcher picks
// when at least one tensor argument is a CUDA tensor.
c10::Device CallDevice(std::initializer_list<NamedTensor> tensors);

// Refuses a tensor that is not on `device` (CPU, or the call's CUDA device), naming it.
void CheckDevice(const Tensor& t, const char* name, c10::Device device);

// quantize: k and v as fp32 contiguous [tokens, heads, head_dim]; OScaR's per-token norms fp32
// [tokens] (given, or computed from k); every value finite.
struct QuantizeArgs {
  QuantSpec spec;
  Tensor k, v;
  Tensor norms;  // Undefined unless the method uses token norms.
  int64_t tokens = 0, heads = 0, dim = 0, blocks = 0;
  int64_t record_bytes = 0;
};
QuantizeArgs PrepareQuantize(c10::Device device, const Tensor& k, const Tensor& v,
                             std::string_view method, int64_t k_bits, int64_t v_bits,
                             int64_t block_tokens, int64_t k_group_tokens, int64_t v_group_channels,
                             const OptTensor& token_norms);

// dequantize: records uint8 [heads, blocks, record_bytes] with a contiguous last axis.
struct DequantizeArgs {
  QuantSpec spec;
  int64_t heads = 0, blocks = 0;
  Tensor norms;  // fp32 [blocks * block_tokens] for OScaR, else undefined.
};
DequantizeArgs PrepareDequantize(c10::Device device, const Tensor& records, std::string_view method,
                                 int64_t head_dim, int64_t k_bits, int64_t v_bits,
                                 int64_t block_tokens, int64_t k_group_tokens,
                                 int64_t v_group_channels, const OptTensor& token_norms);

// What one (layer, KV head) holds, in the form kernels/attention.h reads. The pointers are on the
// call's device (device pointers for CUDA: never dereferenced on the host).
struct HeadInput {
  std::vector<const uint8_t*> records;
  std::vector<const float*> norms;
  KvTensorView window_k, window_v;
};

// decode_attention / paged_decode_attention: q fp32 contiguous [q_heads, head_dim] (q_heads =
// heads.size() * group), the resolved scale and the requested split-K parts (<= 0: automatic).
struct AttentionArgs {
  QuantSpec spec;
  Tensor q;
  std::vector<HeadInput> heads;
  int64_t group = 0;
  float scale = 0.0f;
  int64_t splits = 0;
  Tensor norms;  // Keeps the converted OScaR norms that heads[].norms point into alive.
};
AttentionArgs PrepareDecodeAttention(c10::Device device, const Tensor& q, const Tensor& records,
                                     const OptTensor& window_k, const OptTensor& window_v,
                                     std::string_view method, int64_t k_bits, int64_t v_bits,
                                     double scale, int64_t block_tokens, int64_t k_group_tokens,
                                     int64_t v_group_channels, const OptTensor& token_norms,
                                     int64_t splits);
AttentionArgs PreparePagedDecodeAttention(c10::Device device, const Tensor& q, const Tensor& pool,
                                          const Tensor& record_offsets, const Tensor& indptr,
                                          const OptTensor& window_k, const OptTensor& window_v,
                                          const OptTensor& window_indptr, std::string_view method,
                                          int64_t k_bits, int64_t v_bits, double scale,
                                          int64_t block_tokens, int64_t k_group_tokens,
                                          int64_t v_group_channels, const OptTensor& norm_offsets,
                                          int64_t splits);

#if defined(KVCTL_TORCH_CUDA)
// torch.ops.kvctl.open_cuda_pool (kvctl_torch_cuda.cc): the daemon's device pool, opened from
// HELLO's cuda_ipc_handle (a CPU uint8 tensor of 64 bytes) on `device`, as a CUDA uint8 tensor of
// pool_bytes; the mapping closes when the last view of it is freed. ValueError for a bad handle
// tensor or size, RuntimeError with CUDA's words when the handle cannot be opened.
Tensor OpenCudaPool(const Tensor& handle, int64_t pool_bytes, int64_t device);
#endif

}  // namespace kvctl::torch_ops

#endif  // KVCTL_BINDINGS_TORCH_KVCTL_TORCH_ARGS_H_
