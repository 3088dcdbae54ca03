// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/kernels_cuda/cuda_device.h
// The guard every [cuda] test case starts with: on a machine without a CUDA device the case is
// marked skipped (tests/skip.h: CTest shows it as "Skipped", not "Passed") and returns, while the
// [cuda-host] cases (host-side validation) still run everywhere.
//
//   if (!CudaDeviceOrSkip()) return;
#ifndef KVCTL_TESTS_KERNELS_CUDA_CUDA_DEVICE_H_
#define KVCTL_TESTS_KERNELS_CUDA_CUDA_DEVICE_H_

#include "kernels/cuda/quant_cuda.h"
#include "tests/skip.h"

namespace kvctl::testing {

inline bool CudaDeviceOrSkip() {
  if (CudaDeviceCount() > 0) return true;
  Skip("no CUDA device on this machine");
  return false;
}

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_KERNELS_CUDA_CUDA_DEVICE_H_
