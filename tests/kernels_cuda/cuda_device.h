// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/kernels_cuda/cuda_device.h
// The guard every [cuda] test case starts with: on a machine without a CUDA device the case is
// marked skipped (tests/skip.h: CTest shows it as "Skipped", not "Passed") and returns, while the
// [cuda-host] cases (host-side validation) still run everywhere. With KVCTL_REQUIRE_CUDA=1 in the
// environment (tools/gpu_check.sh, on a machine lent for its GPU) a missing device fails the case
// instead, so a GPU check cannot pass by skipping everything.
//
//   if (!CudaDeviceOrSkip()) return;
#ifndef KVCTL_TESTS_KERNELS_CUDA_CUDA_DEVICE_H_
#define KVCTL_TESTS_KERNELS_CUDA_CUDA_DEVICE_H_

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "kernels/cuda/quant_cuda.h"
#include "tests/skip.h"

namespace kvctl::testing {

inline bool CudaDeviceOrSkip() {
  if (CudaDeviceCount() > 0) return true;
  const char* require = std::getenv("KVCTL_REQUIRE_CUDA");
  if (require != nullptr && std::string(require) == "1") {
    FAIL("KVCTL_REQUIRE_CUDA=1 and this machine has no CUDA device");
  }
  Skip("no CUDA device on this machine");
  return false;
}

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_KERNELS_CUDA_CUDA_DEVICE_H_
