// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/convert.h
// Element conversions between fp32, fp16 and bf16, and range checks, over runs of n elements.
// Every function gives the same bits as the scalar functions of common/half.h (the spec:
// FloatToHalf rounds to nearest even, overflows to +-Inf, keeps subnormals and turns every NaN
// into sign | 0x7E00; HalfToFloat keeps NaN payloads as they are; FloatToBf16 rounds to nearest
// even and keeps NaN payloads with the quiet bit set). The SIMD paths (AVX2 with F16C, AVX-512)
// are picked by kernels/quantize.h's ActiveSimdLevel(), so SetSimdLevel selects them here too.
//
// Pointers need no alignment (tensor bytes lie in ZeroMQ frames at any offset); source and
// destination must not overlap unless they are the same pointer with the same dtype. Nothing
// allocates; all functions are reentrant.
//
//   ConvertF32ToF16(rows.data(), rows.size(), frame.data());
//   const size_t bad = FirstOutsideHalf(DType::kBF16, k, n);
//   if (bad < n) return InvalidArgument("k: element ", bad, " ...");
#ifndef KVCTL_KERNELS_CONVERT_H_
#define KVCTL_KERNELS_CONVERT_H_

#include <cstddef>

#include "common/tensor.h"

namespace kvctl {

// n floats to n fp16 / bf16 bit patterns (2 bytes each, little endian), and back.
void ConvertF32ToF16(const void* src, size_t n, void* dst);
void ConvertF16ToF32(const void* src, size_t n, void* dst);
void ConvertF32ToBf16(const void* src, size_t n, void* dst);
void ConvertBf16ToF32(const void* src, size_t n, void* dst);

// Each of n floats replaced by RoundToHalf of it (common/half.h: HalfToFloat(FloatToHalf(x))), in
// place, through the SIMD conversions: what a value stored as fp16 reads back as.
void RoundToHalfInPlace(float* values, size_t n);

// n elements of `from` to `to`: a copy when the dtypes match, fp16 <-> bf16 through fp32 (each
// element exactly as HalfToFloat/Bf16ToFloat then FloatToBf16/FloatToHalf would give it).
void ConvertElements(DType from, const void* src, DType to, void* dst, size_t n);

// Index of the first of n elements that is NaN or +-Inf; n when every element is finite.
size_t FirstNonFinite(DType dtype, const void* src, size_t n);
// Index of the first of n elements that is NaN, +-Inf or of magnitude above 65504 (kHalfMax, the
// largest finite fp16: block::FitsHalf's test); n when every element fits fp16's range.
size_t FirstOutsideHalf(DType dtype, const void* src, size_t n);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_CONVERT_H_
