// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "common/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/half.h"

namespace kvctl {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
  }
  return "unknown";
}

StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "float32" || name == "fp32" || name == "f32") return DType::kF32;
  if (name == "float16" || name == "fp16" || name == "f16" || name == "half") return DType::kF16;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  return InvalidArgument("dtype: got \"", name, "\", expected float32, float16 or bfloat16");
}

KvTensorView KvTensorView::Contiguous(const void* data, DType dtype, int64_t tokens, int64_t heads,
                                      int64_t head_dim) {
  return KvTensorView{data, dtype, tokens, heads, head_dim, heads * head_dim, head_dim};
}

Status KvTensorView::Validate(std::string_view name) const {
  if (tokens <= 0) return InvalidArgument(name, ": tokens must be > 0, got ", tokens);
  if (heads <= 0) return InvalidArgument(name, ": heads must be > 0, got ", heads);
  if (head_dim <= 0) return InvalidArgument(name, ": head_dim must be > 0, got ", head_dim);
  if (data == nullptr) return InvalidArgument(name, ": data pointer is null");
  if (heads > 1 && std::llabs(head_stride) < head_dim) {
    return InvalidArgument(name, ": head_stride ", head_stride, " overlaps rows of head_dim ",
                           head_dim);
  }
  if (tokens > 1 && std::llabs(token_stride) < head_dim) {
    return InvalidArgument(name, ": token_stride ", token_stride, " overlaps rows of head_dim ",
                           head_dim);
  }
  return OkStatus();
}

void KvTensorView::LoadRow(int64_t t, int64_t h, float* out) const {
  // Tensor bytes lie in ZeroMQ frames or at a client-chosen staging offset: nothing guarantees
  // alignment (PROTOCOL.md), so each element is copied out (an unaligned load, not UB).
  const char* src = RowBytes(t, h);
  switch (dtype) {
    case DType::kF32:
      for (int64_t d = 0; d < head_dim; ++d) std::memcpy(&out[d], src + 4 * d, 4);
      return;
    case DType::kF16:
      for (int64_t d = 0; d < head_dim; ++d) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * d, 2);
        out[d] = HalfToFloat(bits);
      }
      return;
    case DType::kBF16:
      for (int64_t d = 0; d < head_dim; ++d) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * d, 2);
        out[d] = Bf16ToFloat(bits);
      }
      return;
  }
}

namespace {

// Bit tests on the raw elements (one OR-reduced pass per row, which compilers vectorise): an
// element is bad when its magnitude bits reach `limit` (the first non-finite pattern, or for
// a range check the first pattern above the range).
template <typename Bits>
bool RowHasBad(const char* src, int64_t n, Bits magnitude_mask, Bits limit) {
  Bits worst = 0;
  for (int64_t d = 0; d < n; ++d) {
    Bits bits;
    std::memcpy(&bits, src + d * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
    worst = std::max<Bits>(worst, bits & magnitude_mask);
  }
  return worst >= limit;
}

}  // namespace

bool KvTensorView::RowOutside(int64_t t, int64_t h, bool half_range) const {
  const char* src = RowBytes(t, h);
  switch (dtype) {
    case DType::kF32:  // 0x477fe000 is 65504 (kHalfMax), 0x7f800000 infinity.
      return RowHasBad<uint32_t>(src, head_dim, 0x7fffffffu,
                                 half_range ? 0x477fe001u : 0x7f800000u);
    case DType::kF16:  // Every finite fp16 value is within the fp16 range.
      return RowHasBad<uint16_t>(src, head_dim, 0x7fff, 0x7c00);
    case DType::kBF16:  // 0x4780 is 65536, the first bf16 value above 65504; 0x7f80 infinity.
      return RowHasBad<uint16_t>(src, head_dim, 0x7fff, half_range ? 0x4780 : 0x7f80);
  }
  return false;
}

Status KvTensorView::CheckFinite(std::string_view name) const {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      if (!RowOutside(t, h, /*half_range=*/false)) continue;
      std::unique_ptr<float[]> row(new float[head_dim]);
      LoadRow(t, h, row.get());
      for (int64_t d = 0; d < head_dim; ++d) {
        if (!std::isfinite(row[d])) {
          return InvalidArgument(name, ": element (token ", t, ", head ", h, ", channel ", d,
                                 ") is ", row[d], ", expected a finite value");
        }
      }
    }
  }
  return OkStatus();
}

KvTensorView KvTensorView::Tokens(int64_t first, int64_t count) const {
  KvTensorView v = *this;
  v.data = static_cast<const char*>(data) +
           static_cast<ptrdiff_t>(first * token_stride) * static_cast<ptrdiff_t>(DTypeSize(dtype));
  v.tokens = count;
  return v;
}

}  // namespace kvctl
