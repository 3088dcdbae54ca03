// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvbench_attention_notorch.cc
// kvbench attention without libtorch (KVCTL_TORCH=OFF or torch not importable at configure time):
// the SDPA baseline is reported as missing and the run keeps our SIMD fp32 baseline.
#include "tools/kvbench_attention.h"

namespace kvctl {

StatusOr<std::unique_ptr<DenseSdpa>> MakeTorchSdpa(const float*, const float*, int, int64_t, int,
                                                   int, int) {
  return Unimplemented("kvbench was built without libtorch (KVCTL_TORCH=OFF or torch not found)");
}

std::string TorchVersion() { return ""; }

}  // namespace kvctl
