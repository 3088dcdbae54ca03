// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/quantize.h
// Quantize and dequantize block records (see kernels/quant_types.h): K and V of block_tokens tokens
// of one (layer, KV head) to one record, and back. Inputs are fp32 or fp16 rows of head_dim in the
// engine's frame, outputs fp32 (or fp16) rows: rotating methods apply the Hadamard inside and undo
// it on dequantize. fp16 input is the form the engines and the daemon's stored rows hold: the
// encoders read it as it is (half the bytes of fp32) and convert in registers, so a record from
// fp16 rows is byte for byte the record from their fp32 values.
//
// Three implementations produce identical bytes: the scalar reference (`*Ref`, the spec, per-block
// math in kernels/quant_block.h shared with CUDA), and the SIMD path (AVX2, or AVX-512 where the
// CPU has it) picked at run time by Quantize/Dequantize. `SetSimdLevel` forces one for tests and
// benchmarks.
//
// Thread safety: all functions are reentrant; scratch is per call.
//
//   std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
//   KVCTL_RETURN_IF_ERROR(QuantizeBlock(spec, {k, v, head_dim, nullptr}, rec.data()));
//   DequantizeBlock(spec, rec.data(), nullptr, k_out, v_out);
#ifndef KVCTL_KERNELS_QUANTIZE_H_
#define KVCTL_KERNELS_QUANTIZE_H_

#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/quant_types.h"

namespace kvctl {

// One head's tokens for one block, as fp32 rows (k, v) or fp16 rows (k_f16, v_f16): exactly one
// of the two pairs is set. Row t of K starts at k + t * row_stride (elements of the rows' type).
struct BlockInput {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t row_stride = 0;              // >= head_dim.
  const float* token_norms = nullptr;  // block_tokens norms from ComputeTokenNorms; OScaR only.
  // IEEE binary16 bit patterns (2-byte aligned). Separate pointers rather than a dtype beside
  // untyped ones, so the many fp32 callers keep their typed arithmetic on k and v.
  const uint16_t* k_f16 = nullptr;
  const uint16_t* v_f16 = nullptr;

  bool f16() const { return k_f16 != nullptr || v_f16 != nullptr; }
};

// Writes one record of BlockLayoutOf(spec).record_bytes bytes (padding zeroed). Fails with
// INVALID_ARGUMENT when both or neither pair of row pointers is set, on non-finite input or when
// stored fp16 metadata would overflow (|value| beyond 65504), naming the token and channel.
// REQUIRES: ValidateQuantSpec(spec).ok().
Status QuantizeBlockRef(const QuantSpec& spec, const BlockInput& in, uint8_t* record);
Status QuantizeBlock(const QuantSpec& spec, const BlockInput& in, uint8_t* record);

// n_blocks blocks of one head: block b's K rows start at k + b * block_stride (elements), row t of
// it at + t * row_stride; the same for v. token_norms: block_tokens norms per block, back to back
// (OScaR), else null. fp16 rows: k_f16 and v_f16 instead of k and v, as in BlockInput. A stored
// row slot of the daemon (K row then V row, fp16) is {.row_stride = 2 * head_dim, .k_f16 = slot,
// .v_f16 = slot + head_dim}.
struct BlockBatch {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t row_stride = 0;
  int64_t block_stride = 0;
  const float* token_norms = nullptr;
  int n_blocks = 0;
  const uint16_t* k_f16 = nullptr;
  const uint16_t* v_f16 = nullptr;

  bool f16() const { return k_f16 != nullptr || v_f16 != nullptr; }
};

// Block b of `batch` (0 <= b < n_blocks) as QuantizeBlock takes it: the set pair of row pointers
// moved to the block, its norms when the batch has them.
BlockInput BatchBlock(const QuantSpec& spec, const BlockBatch& batch, int b);

// QuantizeBlock over a batch; records back to back, record_bytes apart. The first error stops it,
// with the block's index prefixed to QuantizeBlock's message. The same bytes as block-by-block
// calls; faster on rows not in cache, as each block asks for the next one's K rows while it
// computes.
Status QuantizeBlocks(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records);

// Reads a record back to dense fp32 rows [block_tokens, head_dim] in the engine's frame.
// token_norms: the side record of this block (OScaR), else null. Never fails on a record written by
// QuantizeBlock*; garbage bytes give garbage values but no out-of-bounds access. v_out may be null:
// then only K is decoded (the same floats; what the eviction scorers read).
void DequantizeBlockRef(const QuantSpec& spec, const uint8_t* record, const float* token_norms,
                        float* k_out, float* v_out);
void DequantizeBlock(const QuantSpec& spec, const uint8_t* record, const float* token_norms,
                     float* k_out, float* v_out);
// The same rows as fp16 (2 bytes each, little endian, any alignment): element i is
// FloatToHalf (common/half.h) of DequantizeBlock's element i, bit for bit, but for NaN: a decoded
// NaN (only a corrupted record's metadata makes one) is a NaN of any sign and payload (the fp16
// method's stored NaNs come back as FloatToHalf gives them). The SIMD decoders store fp16 from
// their last pass instead of writing fp32 rows and converting them afterwards.
void DequantizeBlockHalvesRef(const QuantSpec& spec, const uint8_t* record,
                              const float* token_norms, uint8_t* k_out, uint8_t* v_out);
void DequantizeBlockHalves(const QuantSpec& spec, const uint8_t* record, const float* token_norms,
                           uint8_t* k_out, uint8_t* v_out);

// OScaR's omni-token norm: for each token, the L2 norm of K over all heads and channels of the
// layer, in fp32, summed in (head, channel) order; 1 where the norm is not > 0. A Hadamard
// preserves norms, so this is computed on the unrotated K. `k` must be valid and finite.
// ComputeTokenNormsRef is the scalar reference; ComputeTokenNorms gives the same bits, with the
// active SIMD level for fp32 and fp16 views.
void ComputeTokenNormsRef(const KvTensorView& k, float* norms_out);
void ComputeTokenNorms(const KvTensorView& k, float* norms_out);

enum class SimdLevel : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
std::string_view SimdLevelName(SimdLevel level);
// The level SimdLevelName names ("scalar", "avx2", "avx512"); any other name is an error whose
// message ("got ..., expected ...") the caller prefixes with the field it came from.
StatusOr<SimdLevel> ParseSimdLevel(std::string_view name);
SimdLevel DetectSimdLevel();  // Best level this CPU supports.
SimdLevel ActiveSimdLevel();  // What QuantizeBlock/DequantizeBlock use now.
// Selects the path for this process; a level above DetectSimdLevel() is an error.
Status SetSimdLevel(SimdLevel level);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_QUANTIZE_H_
