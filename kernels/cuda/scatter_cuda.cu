// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/scatter_cuda.h"

namespace kvctl {
namespace {

constexpr int kThreads = 256;

// A block per range. Ranges whose source, destination and length are 16-byte aligned (whole pages,
// most merged runs) move as uint4; the rest byte by byte (slots of odd record sizes).
__global__ void ScatterKernel(const uint8_t* packed, const CopyRange* ranges, uint8_t* dst_base) {
  const CopyRange r = ranges[blockIdx.x];
  const uint8_t* src = packed + r.src;
  uint8_t* dst = dst_base + r.dst;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | r.bytes) & 15) == 0;
  if (aligned) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (uint64_t i = threadIdx.x; i < r.bytes / 16; i += blockDim.x) d[i] = s[i];
  } else {
    for (uint64_t i = threadIdx.x; i < r.bytes; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

Status EnqueueScatterCuda(const uint8_t* packed, const CopyRange* ranges, int n, uint8_t* dst_base,
                          void* stream) {
  if (n < 1) return InvalidArgument("n: got ", n, ", expected >= 1 ranges");
  if (!packed || !ranges || !dst_base) {
    return InvalidArgument("packed, ranges, dst_base: got a null pointer");
  }
  ScatterKernel<<<n, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(packed, ranges, dst_base);
  KVCTL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace kvctl
