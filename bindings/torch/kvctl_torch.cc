// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: bindings/torch/kvctl_torch.cc
// PyTorch ops over kvctl's kernels, registered as torch.ops.kvctl.* (TORCH_LIBRARY): quantize K/V
// tensors into block records, dequantize records, and fused decode attention over records (a
// dense [H, N, record_bytes] tensor, or pages of the daemon's shm pool addressed by byte offsets)
// plus the fp16/fp32/bf16 window. The records are read in place (no copy, no dequantized cache);
// q, K and V inputs of other dtypes or layouts are converted once.
//
// Python wrappers with argument docs live in python/kvctl/torch_ops.py; this file validates every
// argument itself (ValueError naming the argument) because the ops are also callable directly.
// CPU tensors only: a CUDA tensor is a RuntimeError until kernels/cuda grows an attention entry.
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
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/attention.h"
#include "kernels/quant_types.h"
#include "kernels/quantize.h"

namespace kvctl {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// A failed kvctl Status becomes a Python ValueError (bad input) or RuntimeError (anything else).
void ThrowIfError(const Status& status, std::string_view what) {
  if (status.ok()) return;
  TORCH_CHECK_VALUE(
      status.code() != StatusCode::kInvalidArgument && status.code() != StatusCode::kUnimplemented,
      what, ": ", status.message());
  TORCH_CHECK(false, what, ": ", status.ToString());
}

// Keeps the first error of a parallel loop; the others are dropped.
class FirstError {
 public:
  void Record(Status status) {
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (first_.ok()) first_ = std::move(status);
  }
  void ThrowIfAny(std::string_view what) const { ThrowIfError(first_, what); }

 private:
  std::mutex mu_;
  Status first_;
};

void CheckDevice(const Tensor& t, const char* name) {
  TORCH_CHECK(!t.is_cuda(), name,
              ": CUDA tensors are not supported by this build of kvctl_torch (no CUDA attention "
              "kernels); pass CPU tensors (.cpu())");
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, ": expected a CPU tensor, got device ", t.device());
}

DType DTypeOf(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    default:
      TORCH_CHECK_VALUE(false, name, ": dtype ", t.scalar_type(),
                        ", expected float32, float16 or bfloat16");
  }
  return DType::kF32;
}

// The QuantSpec of a method at head_dim and bit widths, with optional overrides (<= 0: the
// registry default), canonicalised like the daemon's config (controller/config.cc).
QuantSpec SpecFrom(std::string_view method, int64_t head_dim, int64_t k_bits, int64_t v_bits,
                   int64_t block_tokens, int64_t k_group_tokens, int64_t v_group_channels) {
  StatusOr<QuantMethod> m = ParseQuantMethod(method);
  ThrowIfError(m.status(), "method");
  TORCH_CHECK_VALUE(head_dim >= 8 && head_dim <= 1024, "head_dim: got ", head_dim,
                    ", expected 8..1024");
  TORCH_CHECK_VALUE(k_bits >= 1 && k_bits <= 16, "k_bits: got ", k_bits,
                    ", expected 2, 3, 4, 8 "
                    "(16 for fp16)");
  TORCH_CHECK_VALUE(v_bits >= 1 && v_bits <= 16, "v_bits: got ", v_bits,
                    ", expected 2, 3, 4, 8 "
                    "(16 for fp16)");
  for (int64_t v : {block_tokens, k_group_tokens, v_group_channels}) {
    TORCH_CHECK_VALUE(v <= 65536, "block_tokens/k_group_tokens/v_group_channels: got ", v,
                      ", expected <= 65536 (or <= 0 for the default)");
  }
  StatusOr<QuantSpec> made = MakeQuantSpec(*m, static_cast<int>(head_dim), static_cast<int>(k_bits),
                                           static_cast<int>(v_bits));
  ThrowIfError(made.status(), "quant spec");
  QuantSpec spec = *made;
  const bool groups = *m == QuantMethod::kKivi || *m == QuantMethod::kOscar;
  if (block_tokens > 0) spec.block_tokens = static_cast<int>(block_tokens);
  if (groups) {
    if (k_group_tokens > 0) spec.k_group_tokens = static_cast<int>(k_group_tokens);
    if (v_group_channels > 0) spec.v_group_channels = static_cast<int>(v_group_channels);
  } else {
    spec.k_group_tokens = spec.block_tokens;
  }
  ThrowIfError(ValidateQuantSpec(spec), "quant spec");
  return spec;
}

// K or V as [T, H, D] with a float dtype; returns fp32 contiguous (a copy only when needed).
Tensor DenseKv(const Tensor& t, const char* name) {
  CheckDevice(t, name);
  TORCH_CHECK_VALUE(t.dim() == 3, name, ": expected [tokens, heads, head_dim], got shape ",
                    t.sizes());
  DTypeOf(t, name);
  return t.to(at::kFloat).contiguous();
}

// Optional per-token norms of OScaR (fp32 [tokens]): required exactly when the method uses them.
// When absent for OScaR, `k` (all heads of one layer, fp32 contiguous) provides them.
Tensor TokenNormsFor(const QuantSpec& spec, const OptTensor& norms, int64_t tokens,
                     const Tensor* k) {
  const bool needs = TraitsOf(spec.method).needs_token_norms;
  if (!needs) {
    TORCH_CHECK_VALUE(!norms.has_value(), "token_norms: given, but method ",
                      QuantMethodName(spec.method), " does not use token norms (only oscar)");
    return Tensor();
  }
  if (norms.has_value()) {
    CheckDevice(*norms, "token_norms");
    TORCH_CHECK_VALUE(norms->dim() == 1 && norms->size(0) == tokens, "token_norms: expected [",
                      tokens, "], got shape ", norms->sizes());
    Tensor n = norms->to(at::kFloat).contiguous();
    TORCH_CHECK_VALUE(at::isfinite(n).all().item<bool>() && (n > 0).all().item<bool>(),
                      "token_norms: expected finite values > 0");
    return n;
  }
  if (tokens == 0) return Tensor();  // No records, nothing to scale.
  TORCH_CHECK_VALUE(k != nullptr,
                    "token_norms: required for oscar (the fp32 L2 norm of each "
                    "token's K over all heads of the layer, kvctl.torch_ops.token_norms)");
  Tensor n = at::empty({tokens}, at::kFloat);
  ComputeTokenNorms(KvTensorView::Contiguous(k->data_ptr<float>(), DType::kF32, k->size(0),
                                             k->size(1), k->size(2)),
                    n.data_ptr<float>());
  return n;
}

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
  Tensor kf = DenseKv(k, "k");
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
  Tensor kf = DenseKv(k, "k");
  Tensor vf = DenseKv(v, "v");
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "v: shape ", v.sizes(), " differs from k's ",
                    k.sizes());
  const int64_t tokens = kf.size(0), heads = kf.size(1), dim = kf.size(2);
  const QuantSpec spec =
      SpecFrom(method, dim, k_bits, v_bits, block_tokens, k_group_tokens, v_group_channels);
  const int64_t g = spec.block_tokens;
  TORCH_CHECK_VALUE(tokens > 0 && tokens % g == 0,
                    "k: tokens must be a positive multiple of "
                    "block_tokens ",
                    g, " (", QuantMethodName(spec.method), "), got ", tokens);
  TORCH_CHECK_VALUE(heads > 0, "k: heads must be > 0");
  const Tensor norms = TokenNormsFor(spec, token_norms, tokens, &kf);
  const int64_t blocks = tokens / g;
  const size_t record_bytes = BlockLayoutOf(spec).record_bytes;
  Tensor out = at::empty({heads, blocks, static_cast<int64_t>(record_bytes)}, at::kByte);
  const float* kp = kf.data_ptr<float>();
  const float* vp = vf.data_ptr<float>();
  const float* np = norms.defined() ? norms.data_ptr<float>() : nullptr;
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
      error.Record(QuantizeBlock(spec, in, op + i * static_cast<int64_t>(record_bytes)));
    }
  });
  error.ThrowIfAny("quantize");
  return out;
}

// records: uint8 [H, N, record_bytes] with a contiguous last axis. Returns its data pointer.
const uint8_t* CheckRecords(const Tensor& records, const QuantSpec& spec) {
  CheckDevice(records, "records");
  TORCH_CHECK_VALUE(records.scalar_type() == at::kByte, "records: dtype ", records.scalar_type(),
                    ", expected uint8");
  const int64_t record_bytes = static_cast<int64_t>(BlockLayoutOf(spec).record_bytes);
  TORCH_CHECK_VALUE(
      records.dim() == 3 && records.size(2) == record_bytes, "records: expected [heads, blocks, ",
      record_bytes, "] for ", QuantMethodName(spec.method), " k", spec.k_bits, "v", spec.v_bits,
      " D=", spec.head_dim, " G=", spec.block_tokens, ", got shape ", records.sizes());
  TORCH_CHECK_VALUE(records.size(2) == 0 || records.stride(2) == 1,
                    "records: the last axis must be contiguous, got strides ", records.strides());
  return records.data_ptr<uint8_t>();
}

std::tuple<Tensor, Tensor> Dequantize(const Tensor& records, c10::string_view method,
                                      int64_t head_dim, int64_t k_bits, int64_t v_bits,
                                      int64_t block_tokens, int64_t k_group_tokens,
                                      int64_t v_group_channels, const OptTensor& token_norms) {
  const QuantSpec spec =
      SpecFrom(method, head_dim, k_bits, v_bits, block_tokens, k_group_tokens, v_group_channels);
  const uint8_t* rp = CheckRecords(records, spec);
  const int64_t heads = records.size(0), blocks = records.size(1), g = spec.block_tokens;
  const Tensor norms = TokenNormsFor(spec, token_norms, blocks * g, nullptr);
  // Written head-major ([H, T, D]: one record is G contiguous rows) and returned as a [T, H, D]
  // view of it.
  Tensor k = at::empty({heads, blocks * g, head_dim}, at::kFloat);
  Tensor v = at::empty({heads, blocks * g, head_dim}, at::kFloat);
  float* kp = k.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  const float* np = norms.defined() ? norms.data_ptr<float>() : nullptr;
  const int64_t s0 = records.stride(0), s1 = records.stride(1);
  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / blocks, b = i % blocks;
      const int64_t offset = (h * blocks + b) * g * head_dim;
      DequantizeBlock(spec, rp + h * s0 + b * s1, np == nullptr ? nullptr : np + b * g, kp + offset,
                      vp + offset);
    }
  });
  return {k.transpose(0, 1), v.transpose(0, 1)};
}

// What one (layer, KV head) holds, in the form kernels/attention.h reads.
struct HeadInput {
  std::vector<const uint8_t*> records;
  std::vector<const float*> norms;
  KvTensorView window_k, window_v;
};

void CheckWindowTensor(const Tensor& t, const char* name, int64_t dim) {
  CheckDevice(t, name);
  DTypeOf(t, name);
  TORCH_CHECK_VALUE(t.size(-1) == dim, name, ": head_dim ", t.size(-1), ", expected ", dim,
                    " (q's)");
  TORCH_CHECK_VALUE(t.numel() == 0 || t.stride(-1) == 1, name,
                    ": the last axis must be contiguous, got strides ", t.strides());
}

// Rows [first, first + count) of one head of a window tensor: [Tw, H, D] (head `head_index`) or
// [rows, D] (heads' rows one after another), as a one-head view. No rows: an empty view.
KvTensorView RowsView(const Tensor& t, int64_t first, int64_t count, int64_t head_index) {
  if (count == 0) return KvTensorView{};
  const int64_t elem = static_cast<int64_t>(t.element_size());
  const char* base = static_cast<const char*>(t.data_ptr());
  KvTensorView view;
  view.dtype = DTypeOf(t, "window");
  view.head_dim = t.size(-1);
  view.tokens = count;
  view.heads = 1;
  view.token_stride = t.stride(0);
  view.head_stride = view.head_dim;
  int64_t offset = first * t.stride(0);
  if (t.dim() == 3) offset += head_index * t.stride(1);
  view.data = base + offset * elem;
  return view;
}

using NamedTensor = std::pair<const Tensor*, const char*>;
std::vector<NamedTensor> WindowPairs(const OptTensor& window_k, const OptTensor& window_v) {
  return {{&*window_k, "window_k"}, {&*window_v, "window_v"}};
}

// Attends every head's g query rows over its records and window: tasks (head, split-K part) on
// at::parallel_for, then one merge per head. splits <= 0 picks enough parts to feed the threads.
std::tuple<Tensor, Tensor> Attend(const QuantSpec& spec, const std::vector<HeadInput>& heads,
                                  const Tensor& q, double scale, int64_t splits) {
  const int64_t num_heads = static_cast<int64_t>(heads.size());
  const int64_t dim = spec.head_dim;
  const int64_t group = q.size(0) / num_heads;
  const float s = scale > 0 ? static_cast<float>(scale) : 1.0f / std::sqrt(float(dim));
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale >= 0, "scale: got ", scale,
                    ", expected > 0 (or 0 for 1/sqrt(head_dim))");
  Tensor out = at::empty({q.size(0), dim}, at::kFloat);
  Tensor lse = at::empty({q.size(0)}, at::kFloat);
  const float* qp = q.data_ptr<float>();
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
          .q = qp + t.head * group * dim, .group = static_cast<int>(group), .scale = s};
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

// q's shape, checked before head_dim is read from it.
void CheckQueryShape(const Tensor& q) {
  TORCH_CHECK_VALUE(q.dim() == 2, "q: expected [q_heads, head_dim], got shape ", q.sizes());
}

// q: [Hq, D] of any float dtype, Hq a multiple of num_heads. Returns fp32 contiguous.
Tensor QueryRows(const Tensor& q, int64_t num_heads) {
  CheckDevice(q, "q");
  DTypeOf(q, "q");
  TORCH_CHECK_VALUE(q.dim() == 2, "q: expected [q_heads, head_dim], got shape ", q.sizes());
  TORCH_CHECK_VALUE(num_heads > 0 && q.size(0) % num_heads == 0 && q.size(0) > 0, "q: q_heads ",
                    q.size(0), " is not a positive multiple of the KV heads ", num_heads);
  TORCH_CHECK_VALUE(q.size(0) / num_heads <= kMaxAttentionGroup, "q: ", q.size(0) / num_heads,
                    " query heads per KV head, expected at most ", kMaxAttentionGroup);
  Tensor qf = q.to(at::kFloat).contiguous();
  TORCH_CHECK_VALUE(at::isfinite(qf).all().item<bool>(), "q: non-finite values");
  return qf;
}

std::tuple<Tensor, Tensor> DecodeAttentionOp(const Tensor& q, const Tensor& records,
                                             const OptTensor& window_k, const OptTensor& window_v,
                                             c10::string_view method, int64_t k_bits,
                                             int64_t v_bits, double scale, int64_t block_tokens,
                                             int64_t k_group_tokens, int64_t v_group_channels,
                                             const OptTensor& token_norms, int64_t splits) {
  CheckQueryShape(q);
  const QuantSpec spec =
      SpecFrom(method, q.size(-1), k_bits, v_bits, block_tokens, k_group_tokens, v_group_channels);
  const uint8_t* rp = CheckRecords(records, spec);
  const int64_t num_heads = records.size(0), blocks = records.size(1);
  const Tensor qf = QueryRows(q, num_heads);
  const Tensor norms = TokenNormsFor(spec, token_norms, blocks * spec.block_tokens, nullptr);
  TORCH_CHECK_VALUE(window_k.has_value() == window_v.has_value(),
                    "window_k/window_v: give both or neither");
  int64_t window_tokens = 0;
  if (window_k.has_value()) {
    for (const auto& [t, name] : WindowPairs(window_k, window_v)) {
      CheckWindowTensor(*t, name, spec.head_dim);
      TORCH_CHECK_VALUE(t->dim() == 3 && t->size(1) == num_heads, name, ": expected [tokens, ",
                        num_heads, ", ", spec.head_dim, "], got shape ", t->sizes());
    }
    TORCH_CHECK_VALUE(window_k->size(0) == window_v->size(0), "window_v: ", window_v->size(0),
                      " tokens, window_k has ", window_k->size(0));
    window_tokens = window_k->size(0);
  }
  std::vector<HeadInput> heads(num_heads);
  for (int64_t h = 0; h < num_heads; ++h) {
    HeadInput& in = heads[h];
    for (int64_t b = 0; b < blocks; ++b) {
      in.records.push_back(rp + h * records.stride(0) + b * records.stride(1));
      if (norms.defined()) in.norms.push_back(norms.data_ptr<float>() + b * spec.block_tokens);
    }
    if (window_tokens > 0) {
      in.window_k = RowsView(*window_k, 0, window_tokens, h);
      in.window_v = RowsView(*window_v, 0, window_tokens, h);
    }
  }
  return Attend(spec, heads, qf, scale, splits);
}

// int64 [n] CPU tensor, contiguous copy.
Tensor IndexTensor(const Tensor& t, const char* name, int64_t expected) {
  CheckDevice(t, name);
  TORCH_CHECK_VALUE(
      t.dim() == 1 && !at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kBool, name,
      ": expected a 1-D integer tensor, got ", t.scalar_type(), " shape ", t.sizes());
  TORCH_CHECK_VALUE(expected < 0 || t.size(0) == expected, name, ": expected ", expected,
                    " entries, got ", t.size(0));
  return t.to(at::kLong).contiguous();
}

// indptr [H + 1]: 0, non-decreasing, ending at `total`.
void CheckIndptr(const Tensor& indptr, const char* name, int64_t total) {
  const int64_t* p = indptr.data_ptr<int64_t>();
  const int64_t n = indptr.size(0);
  TORCH_CHECK_VALUE(p[0] == 0, name, "[0]: got ", p[0], ", expected 0");
  for (int64_t i = 1; i < n; ++i) {
    TORCH_CHECK_VALUE(p[i] >= p[i - 1], name, ": decreases at ", i, " (", p[i - 1], " -> ", p[i],
                      ")");
  }
  TORCH_CHECK_VALUE(p[n - 1] == total, name, "[-1]: got ", p[n - 1], ", expected ", total);
}

std::tuple<Tensor, Tensor> PagedDecodeAttentionOp(
    const Tensor& q, const Tensor& pool, const Tensor& record_offsets, const Tensor& indptr,
    const OptTensor& window_k, const OptTensor& window_v, const OptTensor& window_indptr,
    c10::string_view method, int64_t k_bits, int64_t v_bits, double scale, int64_t block_tokens,
    int64_t k_group_tokens, int64_t v_group_channels, const OptTensor& norm_offsets,
    int64_t splits) {
  CheckQueryShape(q);
  const QuantSpec spec =
      SpecFrom(method, q.size(-1), k_bits, v_bits, block_tokens, k_group_tokens, v_group_channels);
  CheckDevice(pool, "pool");
  TORCH_CHECK_VALUE(pool.scalar_type() == at::kByte && pool.dim() == 1 &&
                        (pool.numel() == 0 || pool.stride(0) == 1),
                    "pool: expected a contiguous 1-D uint8 tensor (the shm pool), got ",
                    pool.scalar_type(), " shape ", pool.sizes());
  const Tensor ip = IndexTensor(indptr, "indptr", -1);
  TORCH_CHECK_VALUE(ip.size(0) >= 2, "indptr: expected [heads + 1] with heads >= 1, got ",
                    ip.size(0), " entries");
  const int64_t num_heads = ip.size(0) - 1;
  const Tensor offsets = IndexTensor(record_offsets, "record_offsets", -1);
  CheckIndptr(ip, "indptr", offsets.size(0));
  const Tensor qf = QueryRows(q, num_heads);
  const int64_t record_bytes = static_cast<int64_t>(BlockLayoutOf(spec).record_bytes);
  const int64_t pool_bytes = pool.numel();
  const uint8_t* base = pool.numel() == 0 ? nullptr : pool.data_ptr<uint8_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  for (int64_t i = 0; i < offsets.size(0); ++i) {
    TORCH_CHECK_VALUE(off[i] >= 0 && off[i] + record_bytes <= pool_bytes, "record_offsets[", i,
                      "]: ", off[i], " + record_bytes ", record_bytes, " is outside the pool of ",
                      pool_bytes, " bytes");
  }
  const bool needs_norms = TraitsOf(spec.method).needs_token_norms;
  Tensor noff;
  if (needs_norms) {
    TORCH_CHECK_VALUE(norm_offsets.has_value(),
                      "norm_offsets: required for oscar (byte "
                      "offsets of each record's side record of block_tokens fp32 norms)");
    noff = IndexTensor(*norm_offsets, "norm_offsets", offsets.size(0));
    const int64_t side = int64_t{spec.block_tokens} * 4;
    const int64_t* n = noff.data_ptr<int64_t>();
    for (int64_t i = 0; i < noff.size(0); ++i) {
      TORCH_CHECK_VALUE(n[i] >= 0 && n[i] % 4 == 0 && n[i] + side <= pool_bytes, "norm_offsets[", i,
                        "]: ", n[i],
                        " is not a 4-byte aligned side record "
                        "of ",
                        side, " bytes inside the pool of ", pool_bytes, " bytes");
    }
  } else {
    TORCH_CHECK_VALUE(!norm_offsets.has_value(), "norm_offsets: given, but method ",
                      QuantMethodName(spec.method), " has no side records (only oscar)");
  }
  TORCH_CHECK_VALUE(window_k.has_value() == window_v.has_value() &&
                        window_k.has_value() == window_indptr.has_value(),
                    "window_k/window_v/window_indptr: give all three or none");
  Tensor wip;
  if (window_k.has_value()) {
    for (const auto& [t, name] : WindowPairs(window_k, window_v)) {
      CheckWindowTensor(*t, name, spec.head_dim);
      TORCH_CHECK_VALUE(t->dim() == 2, name, ": expected [rows, ", spec.head_dim,
                        "] (heads' rows one after another), got shape ", t->sizes());
    }
    TORCH_CHECK_VALUE(window_k->size(0) == window_v->size(0), "window_v: ", window_v->size(0),
                      " rows, window_k has ", window_k->size(0));
    wip = IndexTensor(*window_indptr, "window_indptr", num_heads + 1);
    CheckIndptr(wip, "window_indptr", window_k->size(0));
  }
  const int64_t* p = ip.data_ptr<int64_t>();
  std::vector<HeadInput> heads(num_heads);
  for (int64_t h = 0; h < num_heads; ++h) {
    HeadInput& in = heads[h];
    for (int64_t i = p[h]; i < p[h + 1]; ++i) {
      in.records.push_back(base + off[i]);
      if (needs_norms) {
        in.norms.push_back(reinterpret_cast<const float*>(base + noff.data_ptr<int64_t>()[i]));
      }
    }
    if (wip.defined()) {
      const int64_t* w = wip.data_ptr<int64_t>();
      in.window_k = RowsView(*window_k, w[h], w[h + 1] - w[h], h);
      in.window_v = RowsView(*window_v, w[h], w[h + 1] - w[h], h);
    }
  }
  return Attend(spec, heads, qf, scale, splits);
}

}  // namespace
}  // namespace kvctl

TORCH_LIBRARY(kvctl, m) {
  using namespace kvctl;
  m.def(
      "layout(str method, int head_dim, int k_bits, int v_bits, int block_tokens=-1, "
      "int k_group_tokens=-1, int v_group_channels=-1) -> int[]",
      &Layout);
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
