// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: bindings/torch/kvctl_torch_cuda.cc
// CUDA kernels of torch.ops.kvctl.{quantize, dequantize, decode_attention,
// paged_decode_attention} (TORCH_LIBRARY_IMPL(kvctl, CUDA)): the dispatcher calls them when any
// tensor argument is a CUDA tensor. They validate with the CPU kernels' own functions
// (kvctl_torch_args.h, so a CPU/CUDA mix is a ValueError naming the odd tensor) and run the
// kernels/cuda launchers on device pointers. Host C++ only (no nvcc): compiled when CMake finds
// both our CUDA kernels and the CUDA half of the torch wheel (KVCTL_HAVE_TORCH_CUDA).
//
// Streams: quantize and attention are enqueued on torch's current CUDA stream of the tensors'
// device (c10::cuda::getCurrentCUDAStream) and the op waits for them (quantize reads back its
// fp16-overflow flag; attention's plan owns device buffers freed on return). dequantize runs on
// the legacy default stream because kernels/cuda's DequantizeBlocksCuda takes no stream: the op
// first synchronizes torch's current stream, then the launcher synchronizes the device. So every
// op returns with its results complete; none overlaps with later work on the stream.
//
// Thread safety: reentrant (each call builds its own plan and buffers).
//
//   rec = torch.ops.kvctl.quantize(k.cuda(), v.cuda(), "kivi", 2, 2, -1, -1, -1, None)
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "bindings/torch/kvctl_torch_args.h"
#include "common/tensor.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/quant_cuda.h"
#include "kernels/quant_types.h"

namespace kvctl::torch_ops {
namespace {

// Records are padded to 8 bytes (kernels/quant_types.h), so dense tensors, the daemon's pages and
// kernels/cuda's own staging keep them 8-byte aligned. The device code has not been audited for
// unaligned record reads (the fp16 metadata uses byte loads, other fields may not), so a record
// at any other address is refused rather than risking a misaligned-address fault.
constexpr uintptr_t kRecordAlign = 8;

int BlockCount(int64_t n, const char* what) {
  TORCH_CHECK_VALUE(n <= INT_MAX, what, ": ", n, " (head, block) records, expected at most ",
                    INT_MAX, " per call on CUDA");
  return static_cast<int>(n);
}

Tensor QuantizeCuda(const Tensor& k, const Tensor& v, c10::string_view method, int64_t k_bits,
                    int64_t v_bits, int64_t block_tokens, int64_t k_group_tokens,
                    int64_t v_group_channels, const OptTensor& token_norms) {
  const c10::Device device =
      CallDevice({{&k, "k"}, {&v, "v"}, {token_norms ? &*token_norms : nullptr, "token_norms"}});
  const c10::cuda::CUDAGuard guard(device);
  const QuantizeArgs a = PrepareQuantize(device, k, v, method, k_bits, v_bits, block_tokens,
                                         k_group_tokens, v_group_channels, token_norms);
  const int n = BlockCount(a.heads * a.blocks, "quantize");
  // Head-major copies, so record i = (h, b) is the block of G contiguous rows at i * G * D, as
  // BlockBatch addresses them; the norms repeat per head for the same reason.
  const Tensor kh = a.k.transpose(0, 1).contiguous();
  const Tensor vh = a.v.transpose(0, 1).contiguous();
  const Tensor norms = a.norms.defined() ? a.norms.repeat({a.heads}) : Tensor();
  const auto opts = a.k.options();
  Tensor out = at::empty({a.heads, a.blocks, a.record_bytes}, opts.dtype(at::kByte));
  Tensor scratch =
      at::empty({std::max<int64_t>(1, QuantizeScratchFloats(a.spec, n))}, opts.dtype(at::kFloat));
  Tensor overflow = at::zeros({1}, opts.dtype(at::kInt));
  const BlockBatch batch{.k = kh.data_ptr<float>(),
                         .v = vh.data_ptr<float>(),
                         .row_stride = a.dim,
                         .block_stride = a.spec.block_tokens * a.dim,
                         .token_norms = norms.defined() ? norms.data_ptr<float>() : nullptr,
                         .n_blocks = n};
  ThrowIfError(EnqueueQuantizeBlocksCuda(a.spec, batch, out.data_ptr<uint8_t>(),
                                         scratch.data_ptr<float>(), overflow.data_ptr<int>(),
                                         c10::cuda::getCurrentCUDAStream(device.index()).stream()),
               "quantize");
  // item() waits for the stream. The CPU codecs' message (kernels/quantize.cc OverflowError).
  TORCH_CHECK_VALUE(overflow.item<int>() == 0, "quantize: block of ", a.spec.block_tokens,
                    " tokens: ", QuantMethodName(a.spec.method),
                    " metadata would exceed the fp16 range (|value| <= 65504); K/V magnitudes "
                    "this large cannot be stored by this method");
  return out;
}

std::tuple<Tensor, Tensor> DequantizeCuda(const Tensor& records, c10::string_view method,
                                          int64_t head_dim, int64_t k_bits, int64_t v_bits,
                                          int64_t block_tokens, int64_t k_group_tokens,
                                          int64_t v_group_channels, const OptTensor& token_norms) {
  const c10::Device device =
      CallDevice({{&records, "records"}, {token_norms ? &*token_norms : nullptr, "token_norms"}});
  const c10::cuda::CUDAGuard guard(device);
  const DequantizeArgs a =
      PrepareDequantize(device, records, method, head_dim, k_bits, v_bits, block_tokens,
                        k_group_tokens, v_group_channels, token_norms);
  const int64_t g = a.spec.block_tokens;
  const auto opts = records.options().dtype(at::kFloat);
  // [H, T, D] written record by record, returned as [T, H, D] views like the CPU kernel's.
  Tensor k = at::empty({a.heads, a.blocks * g, head_dim}, opts);
  Tensor v = at::empty({a.heads, a.blocks * g, head_dim}, opts);
  const int n = BlockCount(a.heads * a.blocks, "dequantize");
  if (n > 0) {
    const Tensor rec = records.contiguous();  // Records back to back, record_bytes apart.
    const Tensor norms = a.norms.defined() ? a.norms.repeat({a.heads}) : Tensor();
    TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(rec.data_ptr()) % kRecordAlign == 0,
                      "records: device address is not a multiple of ", kRecordAlign,
                      " (a storage offset that splits a record?)");
    // The launcher runs on the default stream: let torch's stream finish the inputs first.
    c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
    ThrowIfError(DequantizeBlocksCuda(a.spec, rec.data_ptr<uint8_t>(),
                                      norms.defined() ? norms.data_ptr<float>() : nullptr, n,
                                      k.data_ptr<float>(), v.data_ptr<float>()),
                 "dequantize");
  }
  return {k.transpose(0, 1), v.transpose(0, 1)};
}

// Uploads a host table of device pointers (as int64) to `device`; synchronous.
Tensor PointerTable(const std::vector<int64_t>& ptrs, c10::Device device) {
  if (ptrs.empty()) return Tensor();
  return at::from_blob(const_cast<int64_t*>(ptrs.data()), {static_cast<int64_t>(ptrs.size())},
                       at::kLong)
      .to(device);
}

// Runs the prepared heads through one CudaAttentionPlan on torch's current stream. records_name
// names the argument that placed the records (alignment errors).
std::tuple<Tensor, Tensor> AttendCuda(const AttentionArgs& a, c10::Device device,
                                      const char* records_name) {
  const int64_t num_heads = static_cast<int64_t>(a.heads.size());
  const int64_t dim = a.spec.head_dim;
  const bool oscar = TraitsOf(a.spec.method).needs_token_norms;
  std::optional<DType> window_dtype;
  std::vector<int64_t> rec_ptrs, norm_ptrs;
  for (int64_t h = 0; h < num_heads; ++h) {
    const HeadInput& in = a.heads[h];
    for (const uint8_t* r : in.records) {
      TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(r) % kRecordAlign == 0, records_name,
                        ": record ", rec_ptrs.size(), " (KV head ", h,
                        ") starts at a device address that is not a multiple of ", kRecordAlign,
                        ", which the CUDA kernels need");
      rec_ptrs.push_back(reinterpret_cast<int64_t>(r));
    }
    for (const float* p : in.norms) norm_ptrs.push_back(reinterpret_cast<int64_t>(p));
    for (const KvTensorView* w : {&in.window_k, &in.window_v}) {
      if (w->tokens == 0) continue;
      if (!window_dtype) window_dtype = w->dtype;
      // The op converts window_k/window_v of different dtypes to fp32 before this.
      TORCH_CHECK(w->dtype == *window_dtype, "window_k/window_v: one dtype per call on CUDA");
    }
  }
  const Tensor d_rec = PointerTable(rec_ptrs, device);
  const Tensor d_norms = PointerTable(norm_ptrs, device);
  const auto opts = a.q.options();
  Tensor out = at::empty({a.q.size(0), dim}, opts);
  Tensor lse = at::empty({a.q.size(0)}, opts);
  std::vector<CudaAttentionHead> table(num_heads);
  int64_t first = 0;
  for (int64_t h = 0; h < num_heads; ++h) {
    const HeadInput& in = a.heads[h];
    CudaAttentionHead& t = table[h];
    const int64_t n = static_cast<int64_t>(in.records.size());
    if (n > 0) {
      t.records = reinterpret_cast<const uint8_t* const*>(d_rec.data_ptr<int64_t>() + first);
      if (oscar) {
        t.record_norms = reinterpret_cast<const float* const*>(d_norms.data_ptr<int64_t>() + first);
      }
    }
    t.num_records = n;
    first += n;
    if (in.window_k.tokens > 0) {
      const int64_t elem = static_cast<int64_t>(DTypeSize(*window_dtype));
      t.window_k = static_cast<const uint8_t*>(in.window_k.data);
      t.window_v = static_cast<const uint8_t*>(in.window_v.data);
      t.window_k_row_bytes = in.window_k.token_stride * elem;
      t.window_v_row_bytes = in.window_v.token_stride * elem;
      t.window_rows = in.window_k.tokens;
    }
    t.q = a.q.data_ptr<float>() + h * a.group * dim;
    t.out = out.data_ptr<float>() + h * a.group * dim;
    t.lse = lse.data_ptr<float>() + h * a.group;
  }
  const int splits =
      a.splits <= 0 ? 0 : static_cast<int>(std::min<int64_t>(a.splits, kMaxCudaAttentionSplits));
  StatusOr<std::unique_ptr<CudaAttentionPlan>> plan =
      CudaAttentionPlan::Create(a.spec, table, static_cast<int>(a.group), a.scale,
                                window_dtype.value_or(DType::kF32), splits);
  ThrowIfError(plan.status(), "decode_attention");
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  ThrowIfError((*plan)->Enqueue(stream.stream()), "decode_attention");
  // The plan's head table and split-K buffers are freed when it goes out of scope.
  stream.synchronize();
  return {out, lse};
}

// window_k and window_v of different float dtypes: both as fp32 (the CUDA plan reads one window
// dtype). Anything else passes through for the shared checks to judge.
std::pair<OptTensor, OptTensor> OneWindowDtype(const OptTensor& window_k,
                                               const OptTensor& window_v) {
  const auto is_float = [](const Tensor& t) {
    return t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf ||
           t.scalar_type() == at::kBFloat16;
  };
  if (window_k && window_v && window_k->scalar_type() != window_v->scalar_type() &&
      is_float(*window_k) && is_float(*window_v)) {
    return {window_k->to(at::kFloat), window_v->to(at::kFloat)};
  }
  return {window_k, window_v};
}

std::tuple<Tensor, Tensor> DecodeAttentionCuda(const Tensor& q, const Tensor& records,
                                               const OptTensor& window_k, const OptTensor& window_v,
                                               c10::string_view method, int64_t k_bits,
                                               int64_t v_bits, double scale, int64_t block_tokens,
                                               int64_t k_group_tokens, int64_t v_group_channels,
                                               const OptTensor& token_norms, int64_t splits) {
  const c10::Device device = CallDevice({{&q, "q"},
                                         {&records, "records"},
                                         {window_k ? &*window_k : nullptr, "window_k"},
                                         {window_v ? &*window_v : nullptr, "window_v"},
                                         {token_norms ? &*token_norms : nullptr, "token_norms"}});
  const c10::cuda::CUDAGuard guard(device);
  const auto [wk, wv] = OneWindowDtype(window_k, window_v);
  const AttentionArgs a =
      PrepareDecodeAttention(device, q, records, wk, wv, method, k_bits, v_bits, scale,
                             block_tokens, k_group_tokens, v_group_channels, token_norms, splits);
  return AttendCuda(a, device, "records");
}

std::tuple<Tensor, Tensor> PagedDecodeAttentionCuda(
    const Tensor& q, const Tensor& pool, const Tensor& record_offsets, const Tensor& indptr,
    const OptTensor& window_k, const OptTensor& window_v, const OptTensor& window_indptr,
    c10::string_view method, int64_t k_bits, int64_t v_bits, double scale, int64_t block_tokens,
    int64_t k_group_tokens, int64_t v_group_channels, const OptTensor& norm_offsets,
    int64_t splits) {
  const c10::Device device =
      CallDevice({{&q, "q"},
                  {&pool, "pool"},
                  {&record_offsets, "record_offsets"},
                  {&indptr, "indptr"},
                  {window_k ? &*window_k : nullptr, "window_k"},
                  {window_v ? &*window_v : nullptr, "window_v"},
                  {window_indptr ? &*window_indptr : nullptr, "window_indptr"},
                  {norm_offsets ? &*norm_offsets : nullptr, "norm_offsets"}});
  const c10::cuda::CUDAGuard guard(device);
  const auto [wk, wv] = OneWindowDtype(window_k, window_v);
  const AttentionArgs a = PreparePagedDecodeAttention(
      device, q, pool, record_offsets, indptr, wk, wv, window_indptr, method, k_bits, v_bits, scale,
      block_tokens, k_group_tokens, v_group_channels, norm_offsets, splits);
  return AttendCuda(a, device, "record_offsets");
}

}  // namespace

Tensor OpenCudaPool(const Tensor& handle, int64_t pool_bytes, int64_t device) {
  TORCH_CHECK_VALUE(handle.device().is_cpu() && handle.scalar_type() == at::kByte &&
                        handle.is_contiguous() && handle.numel() == sizeof(cudaIpcMemHandle_t),
                    "handle: expected a contiguous CPU uint8 tensor of ",
                    sizeof(cudaIpcMemHandle_t), " bytes (HELLO's cuda_ipc_handle), got ",
                    handle.scalar_type(), " on ", handle.device(), " with ", handle.numel(),
                    " elements");
  TORCH_CHECK_VALUE(pool_bytes > 0, "pool_bytes: got ", pool_bytes, ", expected > 0");
  const int devices = c10::cuda::device_count();
  TORCH_CHECK_VALUE(devices > 0, "open_cuda_pool: no CUDA device is visible to this process");
  TORCH_CHECK_VALUE(device >= 0 && device < devices, "device: got ", device, ", expected 0..",
                    devices - 1);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaIpcMemHandle_t raw;
  std::memcpy(&raw, handle.data_ptr(), sizeof(raw));
  void* base = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&base, raw, cudaIpcMemLazyEnablePeerAccess);
  TORCH_CHECK(err == cudaSuccess, "open_cuda_pool: cudaIpcOpenMemHandle on device ", device,
              " failed: ", cudaGetErrorString(err),
              " (the daemon's pool.cuda_device must be this device, and a process cannot open "
              "its own allocation)");
  auto close = [device](void* p) {
    const c10::cuda::CUDAGuard close_guard(static_cast<c10::DeviceIndex>(device));
    cudaIpcCloseMemHandle(p);
  };
  return at::from_blob(base, {pool_bytes}, close,
                       at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
}

}  // namespace kvctl::torch_ops

TORCH_LIBRARY_IMPL(kvctl, CUDA, m) {
  using namespace kvctl::torch_ops;
  m.impl("quantize", &QuantizeCuda);
  m.impl("dequantize", &DequantizeCuda);
  m.impl("decode_attention", &DecodeAttentionCuda);
  m.impl("paged_decode_attention", &PagedDecodeAttentionCuda);
}
