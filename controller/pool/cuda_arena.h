// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/pool/cuda_arena.h
// The pool in device memory (pool.backend = "cuda"): one cudaMalloc of pool.bytes on
// pool.cuda_device, exported to engines through a CUDA IPC handle (HELLO's cuda_ipc_handle; the
// engine opens it with cudaIpcOpenMemHandle and reads pages at the offsets replies give).
//
// The arena is mirrored (pool.h, Arena): the daemon keeps a pinned host copy it bookkeeps on
// (eviction scoring, compaction, dense FETCH decode), and each request publishes the bytes it
// changed to the device before the daemon replies (a few ranges: one cudaMemcpy each; many: packed
// into one copy and scattered by kernels/cuda/scatter_cuda), so an engine never sees a
// half-written page of a completed request. Staging slots are the other way round: engines write
// them on the device and APPEND pulls the slot's bytes to the host. Block records are encoded on
// the device (EncodeBlocks runs kernels/cuda's warp encoder on the arena's own stream), then
// copied back into the host copy.
//
// Cost, stated: host memory of pool.bytes (pinned) besides the device memory; per APPEND the
// changed bytes cross PCIe once more than on a device-resident design (records are small: 2-3
// bits per element; a decode step changes one fp16 row slot per layer and head).
//
// Thread safety: Publish, Pull and EncodeBlocks may be called from any thread (each sets the
// device; batched Publish and EncodeBlocks each serialize on a mutex around their reusable
// buffers and stream).
//
//   KVCTL_ASSIGN_OR_RETURN(std::unique_ptr<Arena> arena, CreateCudaArena(256 << 20, 0));
//   KVCTL_ASSIGN_OR_RETURN(auto pool, PageAllocator::Create(std::move(arena), options));
#ifndef KVCTL_CONTROLLER_POOL_CUDA_ARENA_H_
#define KVCTL_CONTROLLER_POOL_CUDA_ARENA_H_

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "controller/pool/pool.h"

namespace kvctl {

// Whether this build has the CUDA pool (configured with a CUDA compiler, KVCTL_CUDA != OFF).
bool CudaArenaBuilt();

// FAILED_PRECONDITION naming pool.backend when this kvctl was built without CUDA or no device is
// visible (with the driver's own words); INVALID_ARGUMENT naming pool.cuda_device when `device` is
// not a visible ordinal; RESOURCE_EXHAUSTED naming pool.bytes when device or pinned host memory
// cannot be had.
StatusOr<std::unique_ptr<Arena>> CreateCudaArena(uint64_t bytes, int device);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_POOL_CUDA_ARENA_H_
