// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/cuda/quant_cuda.h
// CUDA path of the block codecs. The kernels call block::EncodeRecord / block::DecodeRecord from
// kernels/block_codec.h, the very functions the CPU reference loops over, so there is one copy of
// the math: encode runs a warp per record (lane l encodes rows l, l + 32, ... of each code
// section: block_codec.h's LaneSplit), decode a thread per record. Built only when CUDA is
// enabled (KVCTL_HAVE_CUDA); callers include this header only under KVCTL_USE_CUDA.
//
// Agreement with the CPU reference: bit-identical records for every method (the kernels are
// compiled with --fmad=false and use IEEE division, sqrt and rint; KVarN's exp and log are
// block::KvarnExp / KvarnLog, built from those operations, not the device expf/logf).
//
// Thread safety: functions are reentrant; each call synchronizes its own stream (the default one).
//
//   if (CudaDeviceCount() > 0) KVCTL_RETURN_IF_ERROR(QuantizeBlocksCudaHost(spec, batch, records));
#ifndef KVCTL_KERNELS_CUDA_QUANT_CUDA_H_
#define KVCTL_KERNELS_CUDA_QUANT_CUDA_H_

#include <cstdint>

#include "common/status.h"
#include "kernels/quant_types.h"
#include "kernels/quantize.h"

namespace kvctl {

// Number of visible CUDA devices; 0 when there is none or no driver.
int CudaDeviceCount();

// Batches are kernels/quantize.h BlockBatch (the CPU batch's layout) holding device pointers,
// except where a function says host. Records are written back to back, record_bytes apart.
// fp32 rows only: a batch with fp16 rows (k_f16, v_f16) is refused with UNIMPLEMENTED (the
// device encoder is the shared fp32 block::EncodeRecord).

// Device pointers. Fails with INVALID_ARGUMENT on fp16 metadata overflow (as the CPU path) and
// UNAVAILABLE/INTERNAL on CUDA errors, with the CUDA error string. Inputs must be finite (the
// controller validates on the CPU before upload).
Status QuantizeBlocksCuda(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records);
// The asynchronous core of QuantizeBlocksCuda with caller-owned buffers, for callers that quantize
// repeatedly (benchmarks, a device pool): scratch holds QuantizeScratchFloats(spec, n_blocks)
// floats, *overflow is an int the caller zeroes and reads after the stream completes (non-zero:
// fp16 metadata overflow). stream is a cudaStream_t (null = default). Only launch errors are
// reported here.
int64_t QuantizeScratchFloats(const QuantSpec& spec, int n_blocks);
Status EnqueueQuantizeBlocksCuda(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records,
                                 float* scratch, int* overflow, void* stream);
// Dense rows [n_blocks, block_tokens, head_dim] for K and V.
Status DequantizeBlocksCuda(const QuantSpec& spec, const uint8_t* records, const float* norms,
                            int n_blocks, float* k_out, float* v_out);

// Host-memory conveniences for tests and benchmarks: copy in, run, copy out.
Status QuantizeBlocksCudaHost(const QuantSpec& spec, const BlockBatch& host_batch,
                              uint8_t* host_records);
Status DequantizeBlocksCudaHost(const QuantSpec& spec, const uint8_t* host_records,
                                const float* host_norms, int n_blocks, float* k_out, float* v_out);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_CUDA_QUANT_CUDA_H_
