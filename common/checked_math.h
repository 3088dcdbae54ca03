// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/checked_math.h
// The one place where numbers a client sent become sizes, offsets and counts. Every offset,
// length and count taken from a message goes through these helpers (ipc/ decoders and the
// controller alike), so no sum can wrap, no product can overflow, no narrowing cast can truncate
// and no [offset, offset + length) range can reach outside the region it claims to lie in.
// Failures are INVALID_ARGUMENT statuses naming the field, the value and what was expected.
//
// Rules (one test each in tests/common/checked_math_test.cc):
//   1. CheckedAdd / CheckedMul: a + b and a * b in uint64, or an error on wrap.
//   2. CheckedProduct: a product of several counts, refused past a stated limit.
//   3. CheckSpanInside: [offset, offset + length) inside [region_begin, region_begin +
//   region_bytes)
//      with neither end wrapping; an empty span may start at the region's end, not past it.
//   4. CheckedNarrow: a uint64 into a smaller integer type, refused if it does not fit.
//   5. CheckedOffset: base + index * stride for a pointer into a buffer of known size.
//
// Thread safety: pure functions.
//
//   KVCTL_RETURN_IF_ERROR(CheckSpanInside("staging_offset", offset, need, slot.offset,
//   slot.bytes)); KVCTL_ASSIGN_OR_RETURN(uint64_t bytes, CheckedProduct("k", {layers, tokens,
//   heads, dim, 2}));
#ifndef KVCTL_COMMON_CHECKED_MATH_H_
#define KVCTL_COMMON_CHECKED_MATH_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string_view>

#include "common/status.h"

namespace kvctl {

// a * b and a + b into *out; true on uint64 overflow (then *out is unspecified).
inline bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
inline bool AddOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

// Rule 1.
inline StatusOr<uint64_t> CheckedAdd(std::string_view field, uint64_t a, uint64_t b) {
  uint64_t out;
  if (AddOverflow(a, b, &out)) {
    return InvalidArgument(field, ": ", a, " + ", b, " overflows 64 bits");
  }
  return out;
}
inline StatusOr<uint64_t> CheckedMul(std::string_view field, uint64_t a, uint64_t b) {
  uint64_t out;
  if (MulOverflow(a, b, &out)) {
    return InvalidArgument(field, ": ", a, " x ", b, " overflows 64 bits");
  }
  return out;
}

// Rule 2. The product of `factors`, refused when it overflows or exceeds `limit`.
StatusOr<uint64_t> CheckedProduct(std::string_view field, std::initializer_list<uint64_t> factors,
                                  uint64_t limit = std::numeric_limits<uint64_t>::max());

// Rule 3. OK when [offset, offset + length) lies inside [region_begin, region_begin +
// region_bytes). The error names `field`, the offending offset and length and the region.
Status CheckSpanInside(std::string_view field, uint64_t offset, uint64_t length,
                       uint64_t region_begin, uint64_t region_bytes);

// Rule 4. `value` as T (an integer type), or an error if it does not fit.
template <typename T>
StatusOr<T> CheckedNarrow(std::string_view field, uint64_t value) {
  static_assert(std::numeric_limits<T>::is_integer);
  if (value > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    return InvalidArgument(field, ": got ", value, ", expected at most ",
                           static_cast<uint64_t>(std::numeric_limits<T>::max()));
  }
  return static_cast<T>(value);
}

// Rule 5. index * stride as a byte offset into a buffer of `buffer_bytes`, refused when the
// `length` bytes from there would not fit in it.
StatusOr<uint64_t> CheckedOffset(std::string_view field, uint64_t index, uint64_t stride,
                                 uint64_t length, uint64_t buffer_bytes);

}  // namespace kvctl

#endif  // KVCTL_COMMON_CHECKED_MATH_H_
