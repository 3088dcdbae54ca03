// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/tensor.h
// KvTensorView: a non-owning, strided [T, H, D] view of K, V or Q in fp32, fp16 or bf16, the shape
// engines hand us (tokens, KV heads, head_dim). The innermost axis (D) is contiguous; token and
// head strides are in elements and may describe any layout ([T,H,D], [H,T,D], a slice of a bigger
// cache). Validate() before use: every accessor assumes a valid view.
//
//   KvTensorView k = KvTensorView::Contiguous(ptr, DType::kF16, tokens, heads, head_dim);
//   KVCTL_RETURN_IF_ERROR(k.Validate("k"));
//   k.LoadRow(t, h, row);  // D floats
#ifndef KVCTL_COMMON_TENSOR_H_
#define KVCTL_COMMON_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace kvctl {

// Values are part of the wire protocol: never renumber.
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

std::string_view DTypeName(DType dtype);
inline size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }
StatusOr<DType> ParseDType(std::string_view name);  // "float32", "float16", "bfloat16".

struct KvTensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t token_stride = 0;  // Elements between token t and t+1.
  int64_t head_stride = 0;   // Elements between head h and h+1.

  // A dense row-major [tokens, heads, head_dim] view.
  static KvTensorView Contiguous(const void* data, DType dtype, int64_t tokens, int64_t heads,
                                 int64_t head_dim);

  // Checks pointer, positive sizes and strides that keep rows from overlapping. `name` is used in
  // the message ("k: head_dim must be > 0, got 0").
  Status Validate(std::string_view name) const;

  // Checks that every element is finite; the error names the first bad (token, head, channel).
  Status CheckFinite(std::string_view name) const;

  // True when some element of row (t, h) is not finite or, with half_range, has a magnitude
  // above 65504 (what fp16 cannot hold). Bit tests only: cheap enough for every APPEND.
  // REQUIRES: valid view, indices in range.
  bool RowOutside(int64_t t, int64_t h, bool half_range) const;
  // The first byte of row (t, h). REQUIRES: valid view, indices in range.
  const char* RowBytes(int64_t t, int64_t h) const {
    return static_cast<const char*>(data) +
           (t * token_stride + h * head_stride) * static_cast<int64_t>(DTypeSize(dtype));
  }
  // Converts row (t, h) to fp32. REQUIRES: valid view, indices in range, out holds head_dim floats.
  void LoadRow(int64_t t, int64_t h, float* out) const;

  // Sub-view of tokens [first, first + count). REQUIRES: in range.
  KvTensorView Tokens(int64_t first, int64_t count) const;

  size_t ElementCount() const { return static_cast<size_t>(tokens * heads * head_dim); }
};

}  // namespace kvctl

#endif  // KVCTL_COMMON_TENSOR_H_
