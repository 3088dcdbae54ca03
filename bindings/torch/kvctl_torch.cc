// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: bindings/torch/kvctl_torch.cc
// PyTorch ops over kvctl's kernels, registered as torch.ops.kvctl.* (TORCH_LIBRARY): quantize K/V
// tensors into block records, dequantize records, and fused decode attention over records (a
// dense [H, N, record_bytes] tensor, or pages of the daemon's shm pool addressed by byte offsets)
// plus the fp16/fp32/bf16 window. The records are read in place (no copy, no dequantized cache);
// q, K and V inputs of other dtypes or layouts are converted once.
//
// Python wrappers with argument docs live in python/kvctl/torch_ops.py; kvctl_torch_args.h
// validates every argument (ValueError naming the argument) because the ops are also callable
// directly. This file holds the op schemas and the CPU kernels, registered without a dispatch key
// (CompositeImplicitAutograd), so they serve every call without a CUDA tensor. When built with
// CUDA, kvctl_torch_cuda.cc registers CUDA kernels of quantize, dequantize and the two attention
// ops, which the dispatcher picks when any tensor argument is on a CUDA device; without it a CUDA
// tensor is a RuntimeError here.
//
// Thread safety: the ops are reentrant. They parallelise with at::parallel_for (torch's intra-op
// pool, torch.set_num_threads) over (head, block) for the codecs and over (head, split-K part) for
// attention, so kvctl and torch's own ops use the same threads.
//
//   torch.ops.load_library("build/lib/libkvctl_torch.so")
//   rec = torch.ops.kvctl.quantize(k, v, "kvarn", 2, 2, -1, -1, -1, None)  # [H, T/G, bytes]
//   out, lse = torch.ops.kvctl.decode_attention(q, rec, wk, wv, "kvarn", 2, 2, 0.0, -1, -1, -1,
//                                               None, 0)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "bindings/torch/kvctl_torch_args.h"
#include "common/status.h"
#include "common/tensor.h"
#include "common/thread_annotations.h"
#include "kernels/attention.h"
#include "kernels/quant_types.h"
#include "kernels/quantize.h"

namespace kvctl::torch_ops {
namespace {

const c10::Device kCpu(at::kCPU);

// Keeps the first error of a parallel loop; the others are dropped.
class FirstError {
 public:
  void Record(Status status) KVCTL_EXCLUDES(mu_) {
    if (status.ok()) return;
    MutexLock lock(&mu_);
    if (first_.ok()) first_ = std::move(status);
  }
  void ThrowIfAny(std::string_view what) const KVCTL_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    ThrowIfError(first_, what);
  }

 private:
  mutable Mutex mu_;
  Status first_ KVCTL_GUARDED_BY(mu_);
};

std::vector<int64_t> Layout(c10::string_view method, int64_t head_dim, int64_t k_bits,
                            int64_t v_bits, int64_t block_tokens, int64_t k_group_tokens,
                            int64_t v_group_channels) {
  const QuantSpec spec =
      SpecFrom(method, head_dim, k_bits, v_bits, block_tokens, k_group_tokens, v_group_channels);
  const BlockLayout l = BlockLayoutOf(spec);
  const StreamingRules& rules = TraitsOf(spec.method).streaming;
  const int64_t g = spec.block_tokens;
  return {static_cast<int64_t>(l.record_bytes),
          g,
          spec.k_group_tokens,
          spec.v_group_channels,
          static_cast<int64_t>(l.side_bytes_per_token),
          rules.sink_tokens,
          (rules.flush_tokens + g - 1) / g * g,
          spec.k_bits,
          spec.v_bits};
}

Tensor TokenNorms(const Tensor& k) {
  TORCH_CHECK(!k.is_cuda(),
              "k: token_norms runs on the CPU only (OScaR's norms in the CPU "
              "reference's summation order), got a tensor on ",
              k.device(), "; pass k.cpu()");
  CheckDevice(k, "k", kCpu);
  TORCH_CHECK_VALUE(k.dim() == 3, "k: expected [tokens, heads, head_dim], got shape ", k.sizes());
  DTypeOf(k, "k");
  Tensor kf = k.to(at::kFloat).contiguous();
  TORCH_CHECK_VALUE(kf.numel() > 0, "k: empty tensor, shape ", k.sizes());
  TORCH_CHECK_VALUE(at::isfinite(kf).all().item<bool>(), "k: non-finite values");
  Tensor n = at::empty({kf.size(0)}, at::kFloat);
  ComputeTokenNorms(KvTensorView::Contiguous(kf.data_ptr<float>(), DType::kF32, kf.size(0),
                                             kf.size(1), kf.size(2)),
                    n.data_ptr<float>());
  return n;
}

Tensor Quantize(const Tensor& k, const Tensor& v, c10::string_view method, int64_t k_bits,
                int64_t v_bits, int64_t block_tokens, int64_t k_group_tokens,
                int64_t v_group_channels, const OptTensor& token_norms) {
  const QuantizeArgs a = PrepareQuantize(kCpu, k, v, method, k_bits, v_bits, block_tokens,
                                         k_group_tokens, v_group_channels, token_norms);
  const int64_t heads = a.heads, blocks = a.blocks, dim = a.dim, g = a.spec.block_tokens;
  Tensor out = at::empty({heads, blocks, a.record_bytes}, at::kByte);
  const float* kp = a.k.data_ptr<float>();
  const float* vp = a.v.data_ptr<float>();
  const float* np = a.norms.defined() ? a.norms.data_ptr<float>() : nullptr;
  uint8_t* op = out.data_ptr<uint8_t>();
  FirstError error;
  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / blocks, b = i % blocks;
      const int64_t offset = (b * g * heads + h) * dim;
      const BlockInput in{.k = kp + offset,
                          .v = vp + offset,
                          .row_stride = heads * dim,
                          .token_norms = np == nullptr ? nullptr : np + b * g};
      error.Record(QuantizeBlock(a.spec, in, op + i * a.record_bytes));
    }
  });
  error.ThrowIfAny("quantize");
  return out;
}

std::tuple<Tensor, Tensor> Dequantize(const Tensor& records, c10::string_view method,
                                      int64_t head_dim, int64_t k_bits, int64_t v_bits,
                                      int64_t block_tokens, int64_t k_group_tokens,
                                      int64_t v_group_channels, const OptTensor& token_norms) {
  const DequantizeArgs a =
      PrepareDequantize(kCpu, records, method, head_dim, k_bits, v_bits, block_tokens,
                        k_group_tokens, v_group_channels, token_norms);
  const uint8_t* rp = records.data_ptr<uint8_t>();
  const int64_t heads = a.heads, blocks = a.blocks, g = a.spec.block_tokens;
  // Written head-major ([H, T, D]: one record is G contiguous rows) and returned as a [T, H, D]
  // view of it.
  Tensor k = at::empty({heads, blocks * g, head_dim}, at::kFloat);
  Tensor v = at::empty({heads, blocks * g, head_dim}, at::kFloat);
  float* kp = k.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  const float* np = a.norms.defined() ? a.norms.data_ptr<float>() : nullptr;
  const int64_t s0 = records.stride(0), s1 = records.stride(1);
  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / blocks, b = i % blocks;
      const int64_t offset = (h * blocks + b) * g * head_dim;
      DequantizeBlock(a.spec, rp + h * s0 + b * s1, np == nullptr ? nullptr : np + b * g,
                      kp + offset, vp + offset);
    }
  });
  return {k.transpose(0, 1), v.transpose(0, 1)};
}

// Attends every head's g query rows over its records and window: tasks (head, split-K part) on
// at::parallel_for, then one merge per head. splits <= 0 picks enough parts to feed the threads.
std::tuple<Tensor, Tensor> Attend(const AttentionArgs& a) {
  const QuantSpec& spec = a.spec;
  const std::vector<HeadInput>& heads = a.heads;
  const int64_t num_heads = static_cast<int64_t>(heads.size());
  const int64_t dim = spec.head_dim;
  const int64_t group = a.group;
  const int64_t splits = a.splits;
  Tensor out = at::empty({a.q.size(0), dim}, at::kFloat);
  Tensor lse = at::empty({a.q.size(0)}, at::kFloat);
  const float* qp = a.q.data_ptr<float>();
  const int threads = at::get_num_threads();
  struct Task {
    int64_t head, first, count;
    bool with_window;
    int64_t part;  // Index into the part buffers, or -1: write straight into out/lse.
  };
  std::vector<Task> tasks;
  std::vector<int64_t> part_begin(num_heads + 1, 0);
  int64_t num_parts = 0;
  for (int64_t h = 0; h < num_heads; ++h) {
    const int64_t n = static_cast<int64_t>(heads[h].records.size());
    int64_t p =
        splits > 0 ? splits : (threads <= 1 ? 1 : (4 * threads + num_heads - 1) / num_heads);
    p = std::max<int64_t>(1, std::min<int64_t>(p, n / 4));
    part_begin[h] = num_parts;
    for (int64_t i = 0; i < p; ++i) {
      const int64_t first = n * i / p, last = n * (i + 1) / p;
      tasks.push_back({h, first, last - first, i == p - 1, p == 1 ? -1 : num_parts + i});
    }
    num_parts += p == 1 ? 0 : p;
  }
  part_begin[num_heads] = num_parts;
  std::vector<float> part_out(static_cast<size_t>(num_parts * group * dim));
  std::vector<float> part_lse(static_cast<size_t>(num_parts * group));
  FirstError error;
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Task& t = tasks[i];
      const HeadInput& in = heads[t.head];
      AttentionKv kv{.records = in.records.data(),
                     .record_norms = in.norms.empty() ? nullptr : in.norms.data(),
                     .num_records = static_cast<int64_t>(in.records.size()),
                     .window_k = in.window_k,
                     .window_v = in.window_v,
                     .window_head = 0};
      const AttentionQuery query{
          .q = qp + t.head * group * dim, .group = static_cast<int>(group), .scale = a.scale};
      AttentionResult result{.out = out.data_ptr<float>() + t.head * group * dim,
                             .lse = lse.data_ptr<float>() + t.head * group};
      if (t.part >= 0) {
        result = {part_out.data() + t.part * group * dim, part_lse.data() + t.part * group};
      }
      error.Record(
          DecodeAttention(spec, AttentionPart(kv, t.first, t.count, t.with_window), query, result));
    }
  });
  error.ThrowIfAny("decode_attention");
  for (int64_t h = 0; h < num_heads; ++h) {
    const int64_t p = part_begin[h + 1] - part_begin[h];
    if (p == 0) continue;
    std::vector<const float*> outs(p), lses(p);
    for (int64_t i = 0; i < p; ++i) {
      outs[i] = part_out.data() + (part_begin[h] + i) * group * dim;
      lses[i] = part_lse.data() + (part_begin[h] + i) * group;
    }
    ThrowIfError(MergeAttentionParts(
                     static_cast<int>(group), static_cast<int>(dim), static_cast<int>(p),
                     outs.data(), lses.data(),
                     {out.data_ptr<float>() + h * group * dim, lse.data_ptr<float>() + h * group}),
                 "decode_attention merge");
  }
  return {out, lse};
}

std::tuple<Tensor, Tensor> DecodeAttentionOp(const Tensor& q, const Tensor& records,
                                             const OptTensor& window_k, const OptTensor& window_v,
                                             c10::string_view method, int64_t k_bits,
                                             int64_t v_bits, double scale, int64_t block_tokens,
                                             int64_t k_group_tokens, int64_t v_group_channels,
                                             const OptTensor& token_norms, int64_t splits) {
  return Attend(PrepareDecodeAttention(kCpu, q, records, window_k, window_v, method, k_bits, v_bits,
                                       scale, block_tokens, k_group_tokens, v_group_channels,
                                       token_norms, splits));
}

std::tuple<Tensor, Tensor> PagedDecodeAttentionOp(
    const Tensor& q, const Tensor& pool, const Tensor& record_offsets, const Tensor& indptr,
    const OptTensor& window_k, const OptTensor& window_v, const OptTensor& window_indptr,
    c10::string_view method, int64_t k_bits, int64_t v_bits, double scale, int64_t block_tokens,
    int64_t k_group_tokens, int64_t v_group_channels, const OptTensor& norm_offsets,
    int64_t splits) {
  return Attend(PreparePagedDecodeAttention(
      kCpu, q, pool, record_offsets, indptr, window_k, window_v, window_indptr, method, k_bits,
      v_bits, scale, block_tokens, k_group_tokens, v_group_channels, norm_offsets, splits));
}

// Whether this library registered the CUDA kernels (kvctl_torch_cuda.cc); tests use it to tell
// "not built" from "built but not registered".
bool HasCudaKernels() {
#if defined(KVCTL_TORCH_CUDA)
  return true;
#else
  return false;
#endif
}

#if !defined(KVCTL_TORCH_CUDA)
at::Tensor OpenCudaPool(const at::Tensor& /*handle*/, int64_t /*pool_bytes*/, int64_t /*device*/) {
  TORCH_CHECK_VALUE(false,
                    "open_cuda_pool: this kvctl_torch was built without CUDA (needs our CUDA "
                    "kernels and a CUDA build of torch)");
}
#endif

}  // namespace
}  // namespace kvctl::torch_ops

TORCH_LIBRARY(kvctl, m) {
  using namespace kvctl::torch_ops;
  m.def(
      "layout(str method, int head_dim, int k_bits, int v_bits, int block_tokens=-1, "
      "int k_group_tokens=-1, int v_group_channels=-1) -> int[]",
      &Layout);
  m.def("has_cuda_kernels() -> bool", &HasCudaKernels);
  m.def("open_cuda_pool(Tensor handle, int pool_bytes, int device) -> Tensor", &OpenCudaPool);
  m.def("token_norms(Tensor k) -> Tensor", &TokenNorms);
  m.def(
      "quantize(Tensor k, Tensor v, str method, int k_bits, int v_bits, int block_tokens=-1, "
      "int k_group_tokens=-1, int v_group_channels=-1, Tensor? token_norms=None) -> Tensor",
      &Quantize);
  m.def(
      "dequantize(Tensor records, str method, int head_dim, int k_bits, int v_bits, "
      "int block_tokens=-1, int k_group_tokens=-1, int v_group_channels=-1, "
      "Tensor? token_norms=None) -> (Tensor, Tensor)",
      &Dequantize);
  m.def(
      "decode_attention(Tensor q, Tensor records, Tensor? window_k, Tensor? window_v, str method, "
      "int k_bits, int v_bits, float scale=0., int block_tokens=-1, int k_group_tokens=-1, "
      "int v_group_channels=-1, Tensor? token_norms=None, int splits=0) -> (Tensor, Tensor)",
      &DecodeAttentionOp);
  m.def(
      "paged_decode_attention(Tensor q, Tensor pool, Tensor record_offsets, Tensor indptr, "
      "Tensor? window_k, Tensor? window_v, Tensor? window_indptr, str method, int k_bits, "
      "int v_bits, float scale=0., int block_tokens=-1, int k_group_tokens=-1, "
      "int v_group_channels=-1, Tensor? norm_offsets=None, int splits=0) -> (Tensor, Tensor)",
      &PagedDecodeAttentionOp);
}
