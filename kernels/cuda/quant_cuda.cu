// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include <cuda_runtime.h>

#include <vector>

#include "kernels/block_codec.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/quant_cuda.h"

namespace kvctl {
namespace {

constexpr int kThreads = 64;  // Decode: a thread per record.
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;

struct WarpSync {
  __device__ void operator()() const { __syncwarp(); }
};

// A warp per record: lane l encodes rows l, l + 32, ... of each code section (and KVarN's Sinkhorn
// statistics for those rows / columns) with the reference's own per-row code (block::EncodeRecord
// with a LaneSplit), so the bytes are those of a single lane, with 32x the parallelism and
// coalesced reads of K's channel rows.
__global__ void EncodeRecordsWarpKernel(QuantSpec spec, BlockLayout layout, BlockBatch batch,
                                        float* scratch, int64_t scratch_floats, uint8_t* records,
                                        int* overflow) {
  const int lane = static_cast<int>(threadIdx.x) & (kWarp - 1);
  const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (b >= batch.n_blocks) return;  // Whole warp.
  uint8_t* rec = records + static_cast<size_t>(b) * layout.record_bytes;
  for (size_t i = lane; i < layout.record_bytes; i += kWarp) rec[i] = 0;
  __syncwarp();  // PutCode ORs into the zeroed rows.
  const float* norms =
      batch.token_norms ? batch.token_norms + static_cast<int64_t>(b) * spec.block_tokens : nullptr;
  const bool ok = block::EncodeRecord(spec, layout, batch.k + b * batch.block_stride,
                                      batch.v + b * batch.block_stride, batch.row_stride, norms,
                                      scratch + b * scratch_floats, rec, {lane, kWarp}, WarpSync{});
  if (!ok) atomicExch(overflow, 1);
}

__global__ void DecodeRecordsKernel(QuantSpec spec, BlockLayout layout, const uint8_t* records,
                                    const float* norms, int n_blocks, float* k_out, float* v_out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  const int64_t elems = static_cast<int64_t>(spec.block_tokens) * spec.head_dim;
  block::DecodeRecord(spec, layout, records + static_cast<size_t>(b) * layout.record_bytes,
                      norms ? norms + static_cast<int64_t>(b) * spec.block_tokens : nullptr,
                      k_out + b * elems, v_out + b * elems);
}

// The device encoder runs block::EncodeRecord, which reads fp32 rows; fp16 batches (k_f16, v_f16)
// are refused here rather than misread (controller/pool/cuda_arena.cc widens them on the host).
Status RefuseF16(const BlockBatch& batch) {
  if (!batch.f16()) return OkStatus();
  return Unimplemented(
      "block batch: fp16 rows (k_f16, v_f16) on the CUDA encoder, expected fp32 "
      "rows (k, v); widen them first or use the CPU QuantizeBlocks");
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

int64_t QuantizeScratchFloats(const QuantSpec& spec, int n_blocks) {
  return block::ScratchFloats(spec) * static_cast<int64_t>(n_blocks > 0 ? n_blocks : 0);
}

Status EnqueueQuantizeBlocksCuda(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records,
                                 float* scratch, int* overflow, void* stream) {
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  KVCTL_RETURN_IF_ERROR(RefuseF16(batch));
  if (batch.n_blocks <= 0) {
    return InvalidArgument("n_blocks: got ", batch.n_blocks, ", expected > 0");
  }
  if (!batch.k || !batch.v || !records || !scratch || !overflow) {
    return InvalidArgument("k, v, records, scratch, overflow: got a null pointer");
  }
  const int grid = (batch.n_blocks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  EncodeRecordsWarpKernel<<<grid, kWarpsPerBlock * kWarp, 0, static_cast<cudaStream_t>(stream)>>>(
      spec, BlockLayoutOf(spec), batch, scratch, block::ScratchFloats(spec), records, overflow);
  KVCTL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status QuantizeBlocksCuda(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records) {
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  KVCTL_RETURN_IF_ERROR(RefuseF16(batch));
  if (batch.n_blocks <= 0)
    return InvalidArgument("n_blocks: got ", batch.n_blocks, ", expected > 0");
  DeviceBuffer<float> scratch;
  DeviceBuffer<int> overflow;
  KVCTL_CUDA_RETURN_IF_ERROR(
      scratch.Allocate(static_cast<size_t>(QuantizeScratchFloats(spec, batch.n_blocks))));
  KVCTL_CUDA_RETURN_IF_ERROR(overflow.Allocate(1));
  KVCTL_CUDA_RETURN_IF_ERROR(cudaMemset(overflow.ptr, 0, sizeof(int)));
  KVCTL_RETURN_IF_ERROR(
      EnqueueQuantizeBlocksCuda(spec, batch, records, scratch.ptr, overflow.ptr, nullptr));
  KVCTL_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  int host_overflow = 0;
  KVCTL_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&host_overflow, overflow.ptr, sizeof(int), cudaMemcpyDeviceToHost));
  if (host_overflow) {
    return InvalidArgument(QuantMethodName(spec.method),
                           " metadata would exceed the fp16 range (|value| <= 65504)");
  }
  return OkStatus();
}

Status DequantizeBlocksCuda(const QuantSpec& spec, const uint8_t* records, const float* norms,
                            int n_blocks, float* k_out, float* v_out) {
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  if (n_blocks <= 0) return InvalidArgument("n_blocks: got ", n_blocks, ", expected > 0");
  const int grid = (n_blocks + kThreads - 1) / kThreads;
  DecodeRecordsKernel<<<grid, kThreads>>>(spec, BlockLayoutOf(spec), records, norms, n_blocks,
                                          k_out, v_out);
  KVCTL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  KVCTL_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return OkStatus();
}

Status QuantizeBlocksCudaHost(const QuantSpec& spec, const BlockBatch& host,
                              uint8_t* host_records) {
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  KVCTL_RETURN_IF_ERROR(RefuseF16(host));
  if (host.n_blocks <= 0) return InvalidArgument("n_blocks: got ", host.n_blocks, ", expected > 0");
  // The host batch may be strided: copy the span that covers every row of every block.
  const int64_t span = (host.n_blocks - 1) * host.block_stride +
                       (spec.block_tokens - 1) * host.row_stride + spec.head_dim;
  const size_t record_bytes = BlockLayoutOf(spec).record_bytes;
  DeviceBuffer<float> k, v, norms;
  DeviceBuffer<uint8_t> records;
  KVCTL_CUDA_RETURN_IF_ERROR(k.Allocate(span));
  KVCTL_CUDA_RETURN_IF_ERROR(v.Allocate(span));
  KVCTL_CUDA_RETURN_IF_ERROR(records.Allocate(record_bytes * host.n_blocks));
  KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpy(k.ptr, host.k, span * 4, cudaMemcpyHostToDevice));
  KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpy(v.ptr, host.v, span * 4, cudaMemcpyHostToDevice));
  BlockBatch dev = host;
  dev.k = k.ptr;
  dev.v = v.ptr;
  if (host.token_norms) {
    const size_t n = static_cast<size_t>(host.n_blocks) * spec.block_tokens;
    KVCTL_CUDA_RETURN_IF_ERROR(norms.Allocate(n));
    KVCTL_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(norms.ptr, host.token_norms, n * 4, cudaMemcpyHostToDevice));
    dev.token_norms = norms.ptr;
  }
  KVCTL_RETURN_IF_ERROR(QuantizeBlocksCuda(spec, dev, records.ptr));
  KVCTL_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host_records, records.ptr, record_bytes * host.n_blocks, cudaMemcpyDeviceToHost));
  return OkStatus();
}

Status DequantizeBlocksCudaHost(const QuantSpec& spec, const uint8_t* host_records,
                                const float* host_norms, int n_blocks, float* k_out, float* v_out) {
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  if (n_blocks <= 0) return InvalidArgument("n_blocks: got ", n_blocks, ", expected > 0");
  const size_t record_bytes = BlockLayoutOf(spec).record_bytes;
  const size_t elems = static_cast<size_t>(n_blocks) * spec.block_tokens * spec.head_dim;
  DeviceBuffer<uint8_t> records;
  DeviceBuffer<float> norms, k, v;
  KVCTL_CUDA_RETURN_IF_ERROR(records.Allocate(record_bytes * n_blocks));
  KVCTL_CUDA_RETURN_IF_ERROR(k.Allocate(elems));
  KVCTL_CUDA_RETURN_IF_ERROR(v.Allocate(elems));
  KVCTL_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(records.ptr, host_records, record_bytes * n_blocks, cudaMemcpyHostToDevice));
  if (host_norms) {
    const size_t n = static_cast<size_t>(n_blocks) * spec.block_tokens;
    KVCTL_CUDA_RETURN_IF_ERROR(norms.Allocate(n));
    KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpy(norms.ptr, host_norms, n * 4, cudaMemcpyHostToDevice));
  }
  KVCTL_RETURN_IF_ERROR(DequantizeBlocksCuda(spec, records.ptr, norms.ptr, n_blocks, k.ptr, v.ptr));
  KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpy(k_out, k.ptr, elems * 4, cudaMemcpyDeviceToHost));
  KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpy(v_out, v.ptr, elems * 4, cudaMemcpyDeviceToHost));
  return OkStatus();
}

}  // namespace kvctl
