// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/cuda/cuda_status.h
// CUDA runtime errors as kvctl::Status for kvctl's CUDA code (kernels/cuda, controller/cuda_arena):
// UNAVAILABLE with the file, line, failing expression and cudaGetErrorString. Also an owning
// device buffer. Thread safety: none needed (macros and a move-only RAII type).
//
//   DeviceBuffer<float> buf;
//   KVCTL_CUDA_RETURN_IF_ERROR(buf.Allocate(n));
#ifndef KVCTL_KERNELS_CUDA_CUDA_STATUS_H_
#define KVCTL_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "common/status.h"

#define KVCTL_CUDA_RETURN_IF_ERROR(expr)                                      \
  do {                                                                        \
    const cudaError_t kvctl_err_ = (expr);                                    \
    if (kvctl_err_ != cudaSuccess) {                                          \
      return ::kvctl::Unavailable(__FILE__, ":", __LINE__, ": ", #expr, ": ", \
                                  cudaGetErrorString(kvctl_err_));            \
    }                                                                         \
  } while (0)

namespace kvctl {

// Owns count elements of device memory (cudaMalloc), freed on destruction.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  cudaError_t Allocate(size_t count) {
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    return cudaMalloc(&ptr, (count > 0 ? count : 1) * sizeof(T));
  }
};

}  // namespace kvctl

#endif  // KVCTL_KERNELS_CUDA_CUDA_STATUS_H_
