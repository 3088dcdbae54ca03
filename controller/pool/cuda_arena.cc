// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/pool/cuda_arena.h"

#ifdef KVCTL_USE_CUDA
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "kernels/convert.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/quant_cuda.h"
#include "kernels/cuda/scatter_cuda.h"
#endif

namespace kvctl {

#ifndef KVCTL_USE_CUDA

bool CudaArenaBuilt() { return false; }

StatusOr<std::unique_ptr<Arena>> CreateCudaArena(uint64_t /*bytes*/, int /*device*/) {
  return FailedPrecondition(
      "pool.backend: got \"cuda\", but this kvctl was built without CUDA (configure with nvcc on "
      "PATH and -DKVCTL_CUDA=AUTO or ON); use \"cpu\"");
}

#else

namespace {

// Device buffers that only grow, reused across EncodeBlocks calls.
template <typename T>
struct GrowingBuffer {
  DeviceBuffer<T> buffer;
  size_t capacity = 0;
  cudaError_t Reserve(size_t count) {
    if (count <= capacity) return cudaSuccess;
    const cudaError_t err = buffer.Allocate(count);
    capacity = err == cudaSuccess ? count : 0;
    return err;
  }
};

bool AllFinite(const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

class CudaArena final : public Arena {
 public:
  CudaArena(int device, uint8_t* device_base, uint8_t* host_base, uint64_t bytes,
            cudaStream_t stream, cudaStream_t publish_stream, const cudaIpcMemHandle_t& handle)
      : device_(device),
        device_base_(device_base),
        host_base_(host_base),
        bytes_(bytes),
        stream_(stream),
        handle_(reinterpret_cast<const char*>(&handle), sizeof(handle)),
        publish_stream_(publish_stream) {}
  ~CudaArena() override {
    // The device buffers (members) are freed after this body, on the device set here.
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
    cudaStreamDestroy(publish_stream_);
    if (pack_host_ != nullptr) cudaFreeHost(pack_host_);
    cudaFree(device_base_);
    cudaFreeHost(host_base_);
  }
  CudaArena(const CudaArena&) = delete;
  CudaArena& operator=(const CudaArena&) = delete;

  uint8_t* base() const override { return host_base_; }
  uint64_t bytes() const override { return bytes_; }
  bool mirrored() const override { return true; }
  int cuda_device() const override { return device_; }
  std::string cuda_ipc_handle() const override { return handle_; }

  // A few ranges: one plain cudaMemcpy each (from pinned memory it has completed when it returns,
  // so a reply sent after it never races the copy). Many small ranges (a decode step changes one
  // slot per layer and head): packed into one pinned buffer with their copy table, one
  // host-to-device copy, one scatter launch, then a stream synchronize. Both paths leave the
  // encode stream alone.
  Status Publish(const std::vector<ByteRange>& ranges) override KVCTL_EXCLUDES(publish_mu_) {
    KVCTL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (ranges.size() <= kDirectCopies) {
      for (const ByteRange& r : ranges) {
        KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpy(device_base_ + r.offset, host_base_ + r.offset,
                                              r.bytes, cudaMemcpyHostToDevice));
      }
      return OkStatus();
    }
    MutexLock lock(&publish_mu_);
    const int n = static_cast<int>(ranges.size());
    std::vector<CopyRange> wanted;  // Same offset in both copies.
    for (const ByteRange& r : ranges) wanted.push_back({r.offset, r.offset, r.bytes});
    // The table goes after the data, 8-byte aligned.
    const uint64_t table_at = (PackedBytes(wanted.data(), n) + 7) / 8 * 8;
    const uint64_t pack_bytes = table_at + sizeof(CopyRange) * ranges.size();
    KVCTL_RETURN_IF_ERROR(ReserveHost(pack_bytes));
    KVCTL_CUDA_RETURN_IF_ERROR(pack_device_.Reserve(pack_bytes));
    PackRanges(host_base_, wanted.data(), n, pack_host_,
               reinterpret_cast<CopyRange*>(pack_host_ + table_at));
    uint8_t* device_pack = pack_device_.buffer.ptr;
    KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_pack, pack_host_, pack_bytes,
                                               cudaMemcpyHostToDevice, publish_stream_));
    KVCTL_RETURN_IF_ERROR(
        EnqueueScatterCuda(device_pack, reinterpret_cast<const CopyRange*>(device_pack + table_at),
                           n, device_base_, publish_stream_));
    KVCTL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(publish_stream_));
    return OkStatus();
  }
  Status Pull(uint64_t offset, uint64_t bytes) override {
    KVCTL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVCTL_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(host_base_ + offset, device_base_ + offset, bytes, cudaMemcpyDeviceToHost));
    return OkStatus();
  }

  Status EncodeBlocks(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records) override
      KVCTL_EXCLUDES(mu_) {
    if (batch.n_blocks <= 0) return OkStatus();
    const int g = spec.block_tokens, d = spec.head_dim;
    const int64_t span = (batch.n_blocks - 1) * batch.block_stride + (g - 1) * batch.row_stride + d;
    if (batch.f16()) {
      // The device encoder reads fp32 rows (kernels/cuda/quant_cuda.h): widen the span exactly on
      // the host and encode that, so fp16 batches give the records their fp32 values give.
      std::vector<float> k(static_cast<size_t>(span)), v(k.size());
      ConvertF16ToF32(batch.k_f16, k.size(), k.data());
      ConvertF16ToF32(batch.v_f16, v.size(), v.data());
      BlockBatch wide = batch;
      wide.k = k.data();
      wide.v = v.data();
      wide.k_f16 = wide.v_f16 = nullptr;
      return EncodeBlocks(spec, wide, records);
    }
    const bool norms = batch.token_norms != nullptr;
    const int64_t norm_count = static_cast<int64_t>(batch.n_blocks) * g;
    // The device encoder assumes finite input; the CPU path names the first bad element. Rows
    // are finite fp16 values on every daemon path, so this scan almost never falls back.
    if (!AllFinite(batch.k, span) || !AllFinite(batch.v, span) ||
        (norms && !AllFinite(batch.token_norms, norm_count))) {
      return QuantizeBlocks(spec, batch, records);
    }
    const size_t record_bytes = BlockLayoutOf(spec).record_bytes;
    const size_t out_bytes = record_bytes * batch.n_blocks;
    int overflow = 0;
    {
      MutexLock lock(&mu_);
      KVCTL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      KVCTL_CUDA_RETURN_IF_ERROR(k_.Reserve(span));
      KVCTL_CUDA_RETURN_IF_ERROR(v_.Reserve(span));
      KVCTL_CUDA_RETURN_IF_ERROR(norms_.Reserve(norms ? norm_count : 1));
      KVCTL_CUDA_RETURN_IF_ERROR(records_.Reserve(out_bytes));
      KVCTL_CUDA_RETURN_IF_ERROR(
          scratch_.Reserve(static_cast<size_t>(QuantizeScratchFloats(spec, batch.n_blocks))));
      KVCTL_CUDA_RETURN_IF_ERROR(overflow_.Reserve(1));
      const size_t in_bytes = sizeof(float) * span;
      KVCTL_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(k_.buffer.ptr, batch.k, in_bytes, cudaMemcpyHostToDevice, stream_));
      KVCTL_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(v_.buffer.ptr, batch.v, in_bytes, cudaMemcpyHostToDevice, stream_));
      if (norms) {
        KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(norms_.buffer.ptr, batch.token_norms,
                                                   sizeof(float) * norm_count,
                                                   cudaMemcpyHostToDevice, stream_));
      }
      KVCTL_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(overflow_.buffer.ptr, 0, sizeof(int), stream_));
      const BlockBatch device_batch{k_.buffer.ptr,
                                    v_.buffer.ptr,
                                    batch.row_stride,
                                    batch.block_stride,
                                    norms ? norms_.buffer.ptr : nullptr,
                                    batch.n_blocks};
      KVCTL_RETURN_IF_ERROR(EnqueueQuantizeBlocksCuda(spec, device_batch, records_.buffer.ptr,
                                                      scratch_.buffer.ptr, overflow_.buffer.ptr,
                                                      stream_));
      KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(records, records_.buffer.ptr, out_bytes,
                                                 cudaMemcpyDeviceToHost, stream_));
      KVCTL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&overflow, overflow_.buffer.ptr, sizeof(int),
                                                 cudaMemcpyDeviceToHost, stream_));
      KVCTL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    // fp16 metadata overflow: the CPU path says which token and channel (and if its libm rounds
    // the other way and fits, its records are as good).
    if (overflow != 0) return QuantizeBlocks(spec, batch, records);
    return OkStatus();
  }

 private:
  const int device_;
  uint8_t* const device_base_;
  uint8_t* const host_base_;
  const uint64_t bytes_;
  const cudaStream_t stream_;
  const std::string handle_;
  static constexpr size_t kDirectCopies = 4;

  // Grows the pinned pack buffer to at least `bytes` (contents not kept).
  Status ReserveHost(size_t bytes) KVCTL_REQUIRES(publish_mu_) {
    if (bytes <= pack_host_bytes_) return OkStatus();
    if (pack_host_ != nullptr) cudaFreeHost(pack_host_);
    pack_host_ = nullptr;
    pack_host_bytes_ = 0;
    KVCTL_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pack_host_, bytes));
    pack_host_bytes_ = bytes;
    return OkStatus();
  }

  const cudaStream_t publish_stream_;
  Mutex publish_mu_;  // Guards the pack buffers (and orders use of publish_stream_).
  uint8_t* pack_host_ KVCTL_GUARDED_BY(publish_mu_) = nullptr;  // Pinned.
  size_t pack_host_bytes_ KVCTL_GUARDED_BY(publish_mu_) = 0;
  GrowingBuffer<uint8_t> pack_device_ KVCTL_GUARDED_BY(publish_mu_);

  Mutex mu_;  // Guards the encode buffers (and orders use of stream_).
  GrowingBuffer<float> k_ KVCTL_GUARDED_BY(mu_);
  GrowingBuffer<float> v_ KVCTL_GUARDED_BY(mu_);
  GrowingBuffer<float> norms_ KVCTL_GUARDED_BY(mu_);
  GrowingBuffer<float> scratch_ KVCTL_GUARDED_BY(mu_);
  GrowingBuffer<uint8_t> records_ KVCTL_GUARDED_BY(mu_);
  GrowingBuffer<int> overflow_ KVCTL_GUARDED_BY(mu_);
};

}  // namespace

bool CudaArenaBuilt() { return true; }

StatusOr<std::unique_ptr<Arena>> CreateCudaArena(uint64_t bytes, int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return FailedPrecondition(
        "pool.backend: got \"cuda\", but no CUDA device is visible (cudaGetDeviceCount: ",
        err != cudaSuccess ? cudaGetErrorString(err) : "0 devices", "); use \"cpu\"");
  }
  if (device < 0 || device >= count) {
    return InvalidArgument("pool.cuda_device: got ", device, ", expected 0..", count - 1, " (",
                           count, " visible CUDA devices)");
  }
  if (bytes == 0) return InvalidArgument("pool.bytes: got 0, expected at least 1 byte");
  KVCTL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  uint8_t* device_base = nullptr;
  if (cudaMalloc(&device_base, bytes) != cudaSuccess) {
    cudaGetLastError();  // Not a sticky error: clear it so later calls do not report it.
    return ResourceExhausted("pool.bytes: cudaMalloc of ", bytes, " bytes on device ", device,
                             " failed; lower pool.bytes");
  }
  uint8_t* host_base = nullptr;
  if (cudaMallocHost(&host_base, bytes) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(device_base);
    return ResourceExhausted("pool.bytes: the host copy of the cuda pool (cudaMallocHost of ",
                             bytes, " pinned bytes) failed; lower pool.bytes");
  }
  // Touching every page reserves it now, as ShmArena does, instead of faulting in mid-request.
  std::memset(host_base, 0, bytes);
  Status ready = [&]() -> Status {
    KVCTL_CUDA_RETURN_IF_ERROR(cudaMemset(device_base, 0, bytes));
    return OkStatus();
  }();
  cudaIpcMemHandle_t handle;
  cudaStream_t stream = nullptr, publish_stream = nullptr;
  if (ready.ok()) {
    ready = [&]() -> Status {
      KVCTL_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, device_base));
      KVCTL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      KVCTL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&publish_stream, cudaStreamNonBlocking));
      return OkStatus();
    }();
  }
  if (!ready.ok()) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    cudaFree(device_base);
    cudaFreeHost(host_base);
    return ready;
  }
  return std::unique_ptr<Arena>(
      new CudaArena(device, device_base, host_base, bytes, stream, publish_stream, handle));
}

#endif  // KVCTL_USE_CUDA

}  // namespace kvctl
