// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/cuda/scatter_cuda.h
// One launch that copies many byte ranges out of a packed device buffer to their places in
// another device buffer: the device path of kernels/scatter.h ScatterRef (its spec; the pack is
// made on the host by PackRanges). The device pool (controller/cuda_arena) publishes the slots a
// request changed this way: the host packs them into one pinned buffer, one host-to-device copy
// moves the pack, this kernel scatters it, instead of one cudaMemcpy per slot (a decode step of a
// 32-layer, 8-head model changes 256 slots of ~0.5 KiB).
//
// Thread safety: reentrant; the launch is asynchronous on the given stream.
//
//   KVCTL_RETURN_IF_ERROR(EnqueueScatterCuda(packed_dev, ranges_dev, n, pool_dev, stream));
#ifndef KVCTL_KERNELS_CUDA_SCATTER_CUDA_H_
#define KVCTL_KERNELS_CUDA_SCATTER_CUDA_H_

#include <cstdint>

#include "common/status.h"
#include "kernels/scatter.h"

namespace kvctl {

// packed, ranges (n entries) and dst_base are device pointers; the ranges' destinations must not
// overlap. INVALID_ARGUMENT for n < 1 or a null pointer, UNAVAILABLE for a launch error. stream is
// a cudaStream_t (null = default).
Status EnqueueScatterCuda(const uint8_t* packed, const CopyRange* ranges, int n, uint8_t* dst_base,
                          void* stream);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_CUDA_SCATTER_CUDA_H_
