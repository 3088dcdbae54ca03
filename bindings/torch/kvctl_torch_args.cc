// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "bindings/torch/kvctl_torch_args.h"

#include <cmath>
#include <string>

#include "kernels/attention.h"
#include "kernels/quantize.h"

namespace kvctl::torch_ops {

void ThrowIfError(const Status& status, std::string_view what) {
  if (status.ok()) return;
  TORCH_CHECK_VALUE(
      status.code() != StatusCode::kInvalidArgument && status.code() != StatusCode::kUnimplemented,
      what, ": ", status.message());
  TORCH_CHECK(false, what, ": ", status.ToString());
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

c10::Device CallDevice(std::initializer_list<NamedTensor> tensors) {
  for (const auto& [t, name] : tensors) {
    if (t != nullptr && t->is_cuda()) return t->device();
  }
  TORCH_CHECK(false, "kvctl CUDA kernel called without a CUDA tensor argument");
  return c10::Device(at::kCPU);
}

void CheckDevice(const Tensor& t, const char* name, c10::Device device) {
#if !defined(KVCTL_TORCH_CUDA)
  // Without CUDA kernels every call lands in the CPU kernels, CUDA tensors included.
  TORCH_CHECK(!t.is_cuda(), name,
              ": CUDA tensors are not supported by this build of kvctl_torch (built without the "
              "CUDA kernels: KVCTL_CUDA=OFF, no nvcc, or a CPU-only torch); pass CPU tensors "
              "(.cpu())");
#endif
  TORCH_CHECK_VALUE(t.device() == device, name, ": on device ", t.device(), ", expected ", device,
                    " (every tensor argument of one call must be on the same device; move it "
                    "with .to(\"",
                    device, "\"))");
}

namespace {

// Throws naming the first non-finite element of x ([tokens, heads, head_dim] or [tokens]). The
// CPU codecs find it themselves; the CUDA ones require finite input.
void CheckFinite(const Tensor& x, const char* name) {
  const Tensor bad = at::isfinite(x).logical_not();
  if (!bad.any().item<bool>()) return;
  const Tensor first = bad.nonzero().select(0, 0).cpu();
  const int64_t* i = first.data_ptr<int64_t>();
  if (x.dim() == 3) {
    TORCH_CHECK_VALUE(false, name, ": element (token ", i[0], ", head ", i[1], ", channel ", i[2],
                      ") is ", x[i[0]][i[1]][i[2]].item<float>(), ", expected a finite value");
  }
  TORCH_CHECK_VALUE(false, name, "[", i[0], "]: got ", x[i[0]].item<float>(),
                    ", expected a finite value");
}

// K or V as [T, H, D] with a float dtype; returns fp32 contiguous (a copy only when needed).
Tensor DenseKv(const Tensor& t, const char* name, c10::Device device) {
  CheckDevice(t, name, device);
  TORCH_CHECK_VALUE(t.dim() == 3, name, ": expected [tokens, heads, head_dim], got shape ",
                    t.sizes());
  DTypeOf(t, name);
  return t.to(at::kFloat).contiguous();
}

// Optional per-token norms of OScaR (fp32 [tokens]): required exactly when the method uses them.
// When absent for OScaR, `k` (all heads of one layer, fp32 contiguous) provides them.
Tensor TokenNormsFor(const QuantSpec& spec, const OptTensor& norms, int64_t tokens, const Tensor* k,
                     c10::Device device) {
  const bool needs = TraitsOf(spec.method).needs_token_norms;
  if (!needs) {
    TORCH_CHECK_VALUE(!norms.has_value(), "token_norms: given, but method ",
                      QuantMethodName(spec.method), " does not use token norms (only oscar)");
    return Tensor();
  }
  if (norms.has_value()) {
    CheckDevice(*norms, "token_norms", device);
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
  // The CPU reference's summation order, so CPU and CUDA records agree bit for bit: a device K is
  // copied to the host for it (pass token_norms to avoid the copy).
  const Tensor kh = k->cpu();
  Tensor n = at::empty({tokens}, at::kFloat);
  ComputeTokenNorms(KvTensorView::Contiguous(kh.data_ptr<float>(), DType::kF32, kh.size(0),
                                             kh.size(1), kh.size(2)),
                    n.data_ptr<float>());
  return n.to(device);
}

// records: uint8 [H, N, record_bytes] with a contiguous last axis.
void CheckRecords(const Tensor& records, const QuantSpec& spec, c10::Device device) {
  CheckDevice(records, "records", device);
  TORCH_CHECK_VALUE(records.scalar_type() == at::kByte, "records: dtype ", records.scalar_type(),
                    ", expected uint8");
  const int64_t record_bytes = static_cast<int64_t>(BlockLayoutOf(spec).record_bytes);
  TORCH_CHECK_VALUE(
      records.dim() == 3 && records.size(2) == record_bytes, "records: expected [heads, blocks, ",
      record_bytes, "] for ", QuantMethodName(spec.method), " k", spec.k_bits, "v", spec.v_bits,
      " D=", spec.head_dim, " G=", spec.block_tokens, ", got shape ", records.sizes());
  TORCH_CHECK_VALUE(records.size(2) == 0 || records.stride(2) == 1,
                    "records: the last axis must be contiguous, got strides ", records.strides());
}

void CheckWindowTensor(const Tensor& t, const char* name, int64_t dim, c10::Device device) {
  CheckDevice(t, name, device);
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

std::vector<NamedTensor> WindowPairs(const OptTensor& window_k, const OptTensor& window_v) {
  return {{&*window_k, "window_k"}, {&*window_v, "window_v"}};
}

// q's shape, checked before head_dim is read from it.
void CheckQueryShape(const Tensor& q) {
  TORCH_CHECK_VALUE(q.dim() == 2, "q: expected [q_heads, head_dim], got shape ", q.sizes());
}

// q: [Hq, D] of any float dtype, Hq a multiple of num_heads. Returns fp32 contiguous.
Tensor QueryRows(const Tensor& q, int64_t num_heads, c10::Device device) {
  CheckDevice(q, "q", device);
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

float ResolveScale(double scale, int64_t dim) {
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale >= 0, "scale: got ", scale,
                    ", expected > 0 (or 0 for 1/sqrt(head_dim))");
  return scale > 0 ? static_cast<float>(scale) : 1.0f / std::sqrt(static_cast<float>(dim));
}

// int64 [n] integer tensor on the call's device, as a contiguous host copy (the offsets are
// checked and turned into pointers on the host).
Tensor IndexTensor(const Tensor& t, const char* name, int64_t expected, c10::Device device) {
  CheckDevice(t, name, device);
  TORCH_CHECK_VALUE(
      t.dim() == 1 && !at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kBool, name,
      ": expected a 1-D integer tensor, got ", t.scalar_type(), " shape ", t.sizes());
  TORCH_CHECK_VALUE(expected < 0 || t.size(0) == expected, name, ": expected ", expected,
                    " entries, got ", t.size(0));
  return t.to(at::kCPU, at::kLong).contiguous();
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

}  // namespace

QuantizeArgs PrepareQuantize(c10::Device device, const Tensor& k, const Tensor& v,
                             std::string_view method, int64_t k_bits, int64_t v_bits,
                             int64_t block_tokens, int64_t k_group_tokens, int64_t v_group_channels,
                             const OptTensor& token_norms) {
  QuantizeArgs a;
  a.k = DenseKv(k, "k", device);
  a.v = DenseKv(v, "v", device);
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "v: shape ", v.sizes(), " differs from k's ",
                    k.sizes());
  a.tokens = a.k.size(0);
  a.heads = a.k.size(1);
  a.dim = a.k.size(2);
  a.spec = SpecFrom(method, a.dim, k_bits, v_bits, block_tokens, k_group_tokens, v_group_channels);
  const int64_t g = a.spec.block_tokens;
  TORCH_CHECK_VALUE(a.tokens > 0 && a.tokens % g == 0,
                    "k: tokens must be a positive multiple of "
                    "block_tokens ",
                    g, " (", QuantMethodName(a.spec.method), "), got ", a.tokens);
  TORCH_CHECK_VALUE(a.heads > 0, "k: heads must be > 0");
  if (!device.is_cpu()) {
    // The CPU codecs report the first non-finite element themselves.
    CheckFinite(a.k, "k");
    CheckFinite(a.v, "v");
  }
  a.norms = TokenNormsFor(a.spec, token_norms, a.tokens, &a.k, device);
  a.blocks = a.tokens / g;
  a.record_bytes = static_cast<int64_t>(BlockLayoutOf(a.spec).record_bytes);
  return a;
}

DequantizeArgs PrepareDequantize(c10::Device device, const Tensor& records, std::string_view method,
                                 int64_t head_dim, int64_t k_bits, int64_t v_bits,
                                 int64_t block_tokens, int64_t k_group_tokens,
                                 int64_t v_group_channels, const OptTensor& token_norms) {
  DequantizeArgs a;
  a.spec =
      SpecFrom(method, head_dim, k_bits, v_bits, block_tokens, k_group_tokens, v_group_channels);
  CheckRecords(records, a.spec, device);
  a.heads = records.size(0);
  a.blocks = records.size(1);
  a.norms = TokenNormsFor(a.spec, token_norms, a.blocks * a.spec.block_tokens, nullptr, device);
  return a;
}

AttentionArgs PrepareDecodeAttention(c10::Device device, const Tensor& q, const Tensor& records,
                                     const OptTensor& window_k, const OptTensor& window_v,
                                     std::string_view method, int64_t k_bits, int64_t v_bits,
                                     double scale, int64_t block_tokens, int64_t k_group_tokens,
                                     int64_t v_group_channels, const OptTensor& token_norms,
                                     int64_t splits) {
  CheckQueryShape(q);
  AttentionArgs a;
  a.spec =
      SpecFrom(method, q.size(-1), k_bits, v_bits, block_tokens, k_group_tokens, v_group_channels);
  const QuantSpec& spec = a.spec;
  CheckRecords(records, spec, device);
  const uint8_t* rp = records.data_ptr<uint8_t>();
  const int64_t num_heads = records.size(0), blocks = records.size(1);
  a.q = QueryRows(q, num_heads, device);
  a.group = a.q.size(0) / num_heads;
  a.norms = TokenNormsFor(spec, token_norms, blocks * spec.block_tokens, nullptr, device);
  TORCH_CHECK_VALUE(window_k.has_value() == window_v.has_value(),
                    "window_k/window_v: give both or neither");
  int64_t window_tokens = 0;
  if (window_k.has_value()) {
    for (const auto& [t, name] : WindowPairs(window_k, window_v)) {
      CheckWindowTensor(*t, name, spec.head_dim, device);
      TORCH_CHECK_VALUE(t->dim() == 3 && t->size(1) == num_heads, name, ": expected [tokens, ",
                        num_heads, ", ", spec.head_dim, "], got shape ", t->sizes());
    }
    TORCH_CHECK_VALUE(window_k->size(0) == window_v->size(0), "window_v: ", window_v->size(0),
                      " tokens, window_k has ", window_k->size(0));
    window_tokens = window_k->size(0);
  }
  a.scale = ResolveScale(scale, spec.head_dim);
  a.splits = splits;
  a.heads.resize(num_heads);
  for (int64_t h = 0; h < num_heads; ++h) {
    HeadInput& in = a.heads[h];
    for (int64_t b = 0; b < blocks; ++b) {
      in.records.push_back(rp + h * records.stride(0) + b * records.stride(1));
      if (a.norms.defined()) in.norms.push_back(a.norms.data_ptr<float>() + b * spec.block_tokens);
    }
    if (window_tokens > 0) {
      in.window_k = RowsView(*window_k, 0, window_tokens, h);
      in.window_v = RowsView(*window_v, 0, window_tokens, h);
    }
  }
  return a;
}

AttentionArgs PreparePagedDecodeAttention(c10::Device device, const Tensor& q, const Tensor& pool,
                                          const Tensor& record_offsets, const Tensor& indptr,
                                          const OptTensor& window_k, const OptTensor& window_v,
                                          const OptTensor& window_indptr, std::string_view method,
                                          int64_t k_bits, int64_t v_bits, double scale,
                                          int64_t block_tokens, int64_t k_group_tokens,
                                          int64_t v_group_channels, const OptTensor& norm_offsets,
                                          int64_t splits) {
  CheckQueryShape(q);
  AttentionArgs a;
  a.spec =
      SpecFrom(method, q.size(-1), k_bits, v_bits, block_tokens, k_group_tokens, v_group_channels);
  const QuantSpec& spec = a.spec;
  CheckDevice(pool, "pool", device);
  TORCH_CHECK_VALUE(pool.scalar_type() == at::kByte && pool.dim() == 1 &&
                        (pool.numel() == 0 || pool.stride(0) == 1),
                    "pool: expected a contiguous 1-D uint8 tensor (the shm pool), got ",
                    pool.scalar_type(), " shape ", pool.sizes());
  const Tensor ip = IndexTensor(indptr, "indptr", -1, device);
  TORCH_CHECK_VALUE(ip.size(0) >= 2, "indptr: expected [heads + 1] with heads >= 1, got ",
                    ip.size(0), " entries");
  const int64_t num_heads = ip.size(0) - 1;
  const Tensor offsets = IndexTensor(record_offsets, "record_offsets", -1, device);
  CheckIndptr(ip, "indptr", offsets.size(0));
  a.q = QueryRows(q, num_heads, device);
  a.group = a.q.size(0) / num_heads;
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
    noff = IndexTensor(*norm_offsets, "norm_offsets", offsets.size(0), device);
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
      CheckWindowTensor(*t, name, spec.head_dim, device);
      TORCH_CHECK_VALUE(t->dim() == 2, name, ": expected [rows, ", spec.head_dim,
                        "] (heads' rows one after another), got shape ", t->sizes());
    }
    TORCH_CHECK_VALUE(window_k->size(0) == window_v->size(0), "window_v: ", window_v->size(0),
                      " rows, window_k has ", window_k->size(0));
    wip = IndexTensor(*window_indptr, "window_indptr", num_heads + 1, device);
    CheckIndptr(wip, "window_indptr", window_k->size(0));
  }
  a.scale = ResolveScale(scale, spec.head_dim);
  a.splits = splits;
  const int64_t* p = ip.data_ptr<int64_t>();
  a.heads.resize(num_heads);
  for (int64_t h = 0; h < num_heads; ++h) {
    HeadInput& in = a.heads[h];
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
  return a;
}

}  // namespace kvctl::torch_ops
