// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/hadamard.h"

#include "kernels/quant_block.h"
#include "kernels/quantize.h"
#include "kernels/quantize_simd.h"

namespace kvctl {

Status ValidateHadamardDim(int d) {
  if (d < 1 || d > 256 || (d & (d - 1)) != 0) {
    return InvalidArgument("head_dim: got ", d,
                           ", expected a power of two in 1..256 for the "
                           "Hadamard transform");
  }
  return OkStatus();
}

void FwhtRowsRef(float* rows, int64_t n, int d) {
  for (int64_t i = 0; i < n; ++i) block::FwhtRow(rows + i * d, d);
}

void FwhtRows(float* rows, int64_t n, int d) {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return simd::FwhtRowsAvx512(rows, n, d);
    case SimdLevel::kAvx2:
      return simd::FwhtRowsAvx2(rows, n, d);
    case SimdLevel::kScalar:
      return FwhtRowsRef(rows, n, d);
  }
}

}  // namespace kvctl
