// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/attention_block.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/attention_warp_ops.h"
#include "kernels/cuda/cuda_status.h"

namespace kvctl {
namespace {

constexpr int kWarp = attn::kWarpLanes;
// Shared memory a block may ask for: fits A100 (163 KiB) and H100/H200 (227 KiB) with room.
constexpr int64_t kMaxSharedBytes = 96 * 1024;
constexpr int kMaxWarpsPerBlock = 4;
constexpr int kMergeThreads = 128;

// The warp of the calling CUDA thread, for attn::WarpOps.
struct CudaWarp {
  KVCTL_HOST_DEVICE static int Lane() {
#if defined(__CUDA_ARCH__)
    return static_cast<int>(threadIdx.x) & (attn::kWarpLanes - 1);
#else
    return 0;
#endif
  }
  KVCTL_HOST_DEVICE static void Sync() {
#if defined(__CUDA_ARCH__)
    __syncwarp();
#endif
  }
  KVCTL_HOST_DEVICE static float ShflXor(float v, int lane_mask) {
#if defined(__CUDA_ARCH__)
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#else
    (void)lane_mask;
    return v;
#endif
  }
};
using WarpOps = attn::WarpOps<CudaWarp>;

using KernelArgs = attn::PartsArgs<CudaAttentionHead>;

// One warp per (head, part); the warp's Work in dynamic shared memory unless a global fallback
// was allocated.
__global__ void AttendPartsKernel(KernelArgs a) {
  extern __shared__ float smem[];
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t part = static_cast<int64_t>(blockIdx.x) * a.warps_per_block + warp;
  if (part >= static_cast<int64_t>(a.num_heads) * a.splits) return;  // Whole warp leaves.
  float* scratch = a.global_scratch ? a.global_scratch + part * a.scratch_floats
                                    : smem + static_cast<int64_t>(warp) * a.scratch_floats;
  attn::AttendPart<WarpOps>(a, part, scratch);
}

// One thread per (head, query row, 8 channels).
__global__ void MergePartsKernel(KernelArgs a) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= attn::MergeChunks(a)) return;
  attn::MergeChunk<kMaxCudaAttentionSplits>(a, idx);
}

int DefaultSplits(int num_heads, int64_t max_units) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    sms = 108;
  }
  // ~16 resident warps per SM in total, but at least one record or window chunk per part.
  int64_t s = (16LL * sms + num_heads - 1) / num_heads;
  if (s > max_units) s = max_units;
  if (s > kMaxCudaAttentionSplits) s = kMaxCudaAttentionSplits;
  return s < 1 ? 1 : static_cast<int>(s);
}

Status ValidateHead(const QuantSpec& spec, const CudaAttentionHead& h, int index, DType dtype) {
  const bool oscar = spec.method == QuantMethod::kOscar;
  if (h.num_records < 0) {
    return InvalidArgument("heads[", index, "].num_records: got ", h.num_records,
                           ", expected >= 0");
  }
  if (h.num_records > 0 && !h.records) {
    return InvalidArgument("heads[", index,
                           "].records: got null with num_records = ", h.num_records);
  }
  if (oscar && h.num_records > 0 && !h.record_norms) {
    return InvalidArgument("heads[", index, "].record_norms: got null, expected ", h.num_records,
                           " norm pointers for oscar");
  }
  if (!oscar && h.record_norms) {
    return InvalidArgument("heads[", index, "].record_norms: got non-null for ",
                           QuantMethodName(spec.method), ", expected null");
  }
  if (h.window_rows < 0) {
    return InvalidArgument("heads[", index, "].window_rows: got ", h.window_rows,
                           ", expected >= 0");
  }
  if (h.window_rows > 0) {
    const int64_t min_bytes = static_cast<int64_t>(spec.head_dim) * DTypeSize(dtype);
    if (!h.window_k || !h.window_v) {
      return InvalidArgument("heads[", index,
                             "].window_k/window_v: got null with window_rows = ", h.window_rows);
    }
    if (h.window_k_row_bytes < min_bytes || h.window_v_row_bytes < min_bytes) {
      return InvalidArgument("heads[", index, "].window_k_row_bytes/window_v_row_bytes: got ",
                             h.window_k_row_bytes, "/", h.window_v_row_bytes,
                             ", expected >= ", min_bytes, " (head_dim elements)");
    }
  }
  if (!h.q || !h.out || !h.lse) {
    return InvalidArgument("heads[", index, "]: q, out and lse must be non-null");
  }
  return OkStatus();
}

}  // namespace

struct CudaAttentionPlan::State {
  KernelArgs args{};
  DeviceBuffer<CudaAttentionHead> heads;
  DeviceBuffer<float> part_out, part_lse, scratch;
  int64_t shared_bytes = 0;
};

CudaAttentionPlan::CudaAttentionPlan(std::unique_ptr<State> state) : s_(std::move(state)) {}
CudaAttentionPlan::~CudaAttentionPlan() = default;

StatusOr<std::unique_ptr<CudaAttentionPlan>> CudaAttentionPlan::Create(
    const QuantSpec& spec, std::span<const CudaAttentionHead> heads, int group, float scale,
    DType window_dtype, int splits) {
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  if (heads.empty()) return InvalidArgument("heads: got 0, expected at least one head");
  if (group < 1 || group > kMaxAttentionGroup) {
    return InvalidArgument("group: got ", group, ", expected 1..", kMaxAttentionGroup);
  }
  if (!(scale > 0.0f) || !std::isfinite(scale)) {
    return InvalidArgument("scale: got ", scale, ", expected a finite value > 0");
  }
  if (splits < 0 || splits > kMaxCudaAttentionSplits) {
    return InvalidArgument("splits: got ", splits, ", expected 0 (auto)..",
                           kMaxCudaAttentionSplits);
  }
  // Parts are worth having up to one record or one block_tokens window chunk each.
  int64_t max_units = 1;
  for (size_t i = 0; i < heads.size(); ++i) {
    KVCTL_RETURN_IF_ERROR(ValidateHead(spec, heads[i], static_cast<int>(i), window_dtype));
    const int64_t units =
        heads[i].num_records + (heads[i].window_rows + spec.block_tokens - 1) / spec.block_tokens;
    if (units > max_units) max_units = units;
  }
  auto state = std::make_unique<State>();
  KernelArgs& a = state->args;
  a.spec = spec;
  a.layout = BlockLayoutOf(spec);
  a.rotates = TraitsOf(spec.method).rotates;
  a.window_format = attn::WindowFormat(window_dtype);
  a.group = group;
  a.scale = scale;
  a.num_heads = static_cast<int>(heads.size());
  a.splits = splits > 0 ? splits : DefaultSplits(a.num_heads, max_units);
  a.scratch_floats = attn::ScratchFloats(spec, group);
  // Keep every warp's Work 16-byte aligned.
  a.scratch_floats = (a.scratch_floats + 3) / 4 * 4;
  const int64_t warp_bytes = a.scratch_floats * static_cast<int64_t>(sizeof(float));
  const int64_t parts = static_cast<int64_t>(a.num_heads) * a.splits;
  a.warps_per_block = kMaxWarpsPerBlock;
  if (warp_bytes <= kMaxSharedBytes) {
    while (a.warps_per_block > 1 && a.warps_per_block * warp_bytes > kMaxSharedBytes) {
      --a.warps_per_block;
    }
    state->shared_bytes = a.warps_per_block * warp_bytes;
    KVCTL_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(AttendPartsKernel,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(state->shared_bytes)));
  } else {
    KVCTL_CUDA_RETURN_IF_ERROR(
        state->scratch.Allocate(static_cast<size_t>(parts * a.scratch_floats)));
    a.global_scratch = state->scratch.ptr;
  }
  KVCTL_CUDA_RETURN_IF_ERROR(state->heads.Allocate(heads.size()));
  KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpy(state->heads.ptr, heads.data(),
                                        heads.size() * sizeof(CudaAttentionHead),
                                        cudaMemcpyHostToDevice));
  KVCTL_CUDA_RETURN_IF_ERROR(
      state->part_out.Allocate(static_cast<size_t>(parts) * group * spec.head_dim));
  KVCTL_CUDA_RETURN_IF_ERROR(state->part_lse.Allocate(static_cast<size_t>(parts) * group));
  a.heads = state->heads.ptr;
  a.part_out = state->part_out.ptr;
  a.part_lse = state->part_lse.ptr;
  return std::unique_ptr<CudaAttentionPlan>(new CudaAttentionPlan(std::move(state)));
}

Status CudaAttentionPlan::Enqueue(void* stream) const {
  const KernelArgs& a = s_->args;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int64_t parts = static_cast<int64_t>(a.num_heads) * a.splits;
  const int blocks = static_cast<int>((parts + a.warps_per_block - 1) / a.warps_per_block);
  AttendPartsKernel<<<blocks, a.warps_per_block * kWarp, s_->shared_bytes, st>>>(a);
  KVCTL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const int64_t threads = static_cast<int64_t>(a.num_heads) * a.group * (a.spec.head_dim / 8);
  MergePartsKernel<<<static_cast<int>((threads + kMergeThreads - 1) / kMergeThreads), kMergeThreads,
                     0, st>>>(a);
  KVCTL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status CudaAttentionPlan::Run() const {
  KVCTL_RETURN_IF_ERROR(Enqueue(nullptr));
  KVCTL_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return OkStatus();
}

int CudaAttentionPlan::splits() const { return s_->args.splits; }
int CudaAttentionPlan::warps_per_block() const { return s_->args.warps_per_block; }
bool CudaAttentionPlan::shared_scratch() const { return s_->args.global_scratch == nullptr; }

Status DecodeAttentionCudaHost(const QuantSpec& spec, std::span<const HostAttentionHead> heads,
                               int group, float scale, int splits) {
  AttentionStaging st;
  KVCTL_RETURN_IF_ERROR(StageAttention(spec, heads, group, scale, &st));
  const bool oscar = spec.method == QuantMethod::kOscar;
  const size_t n_rec = static_cast<size_t>(st.total_records);
  DeviceBuffer<uint8_t> d_rec, d_window;
  DeviceBuffer<float> d_norms, d_q, d_out, d_lse;
  DeviceBuffer<const uint8_t*> d_rec_ptrs;
  DeviceBuffer<const float*> d_norm_ptrs;
  KVCTL_CUDA_RETURN_IF_ERROR(d_rec.Allocate(st.records.size()));
  KVCTL_CUDA_RETURN_IF_ERROR(d_window.Allocate(st.windows.size()));
  KVCTL_CUDA_RETURN_IF_ERROR(d_norms.Allocate(st.norms.size()));
  KVCTL_CUDA_RETURN_IF_ERROR(d_q.Allocate(st.q.size()));
  KVCTL_CUDA_RETURN_IF_ERROR(d_out.Allocate(st.q.size()));
  KVCTL_CUDA_RETURN_IF_ERROR(d_lse.Allocate(heads.size() * group));
  KVCTL_CUDA_RETURN_IF_ERROR(d_rec_ptrs.Allocate(n_rec));
  KVCTL_CUDA_RETURN_IF_ERROR(d_norm_ptrs.Allocate(oscar ? n_rec : 0));
  AttentionPlacement at{d_rec.ptr, d_norms.ptr, d_window.ptr,   d_q.ptr,
                        d_out.ptr, d_lse.ptr,   d_rec_ptrs.ptr, d_norm_ptrs.ptr};
  std::vector<const uint8_t*> rec_ptrs(n_rec);
  std::vector<const float*> norm_ptrs(oscar ? n_rec : 0);
  std::vector<CudaAttentionHead> table;
  BuildAttentionTables(spec, st, group, at, rec_ptrs.data(), norm_ptrs.data(), &table);
  const auto up = [](void* dst, const void* src, size_t bytes) {
    return bytes ? cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) : cudaSuccess;
  };
  KVCTL_CUDA_RETURN_IF_ERROR(up(d_rec.ptr, st.records.data(), st.records.size()));
  KVCTL_CUDA_RETURN_IF_ERROR(up(d_window.ptr, st.windows.data(), st.windows.size()));
  KVCTL_CUDA_RETURN_IF_ERROR(up(d_norms.ptr, st.norms.data(), st.norms.size() * sizeof(float)));
  KVCTL_CUDA_RETURN_IF_ERROR(up(d_q.ptr, st.q.data(), st.q.size() * sizeof(float)));
  KVCTL_CUDA_RETURN_IF_ERROR(
      up(d_rec_ptrs.ptr, rec_ptrs.data(), rec_ptrs.size() * sizeof(const uint8_t*)));
  KVCTL_CUDA_RETURN_IF_ERROR(
      up(d_norm_ptrs.ptr, norm_ptrs.data(), norm_ptrs.size() * sizeof(const float*)));
  KVCTL_ASSIGN_OR_RETURN(
      std::unique_ptr<CudaAttentionPlan> plan,
      CudaAttentionPlan::Create(spec, table, group, scale, st.window_dtype, splits));
  KVCTL_RETURN_IF_ERROR(plan->Run());
  std::vector<float> out(st.q.size()), lse(heads.size() * group);
  KVCTL_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out.data(), d_out.ptr, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  KVCTL_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(lse.data(), d_lse.ptr, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const int d = spec.head_dim;
  for (size_t h = 0; h < heads.size(); ++h) {
    memcpy(heads[h].result.out, out.data() + st.heads[h].q, sizeof(float) * group * d);
    memcpy(heads[h].result.lse, lse.data() + h * group, sizeof(float) * group);
  }
  return OkStatus();
}

}  // namespace kvctl
