// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "common/checked_math.h"

namespace kvctl {

StatusOr<uint64_t> CheckedProduct(std::string_view field, std::initializer_list<uint64_t> factors,
                                  uint64_t limit) {
  uint64_t product = 1;
  for (uint64_t f : factors) {
    if (MulOverflow(product, f, &product)) {
      return InvalidArgument(field, ": the size overflows 64 bits");
    }
  }
  if (product > limit) {
    return InvalidArgument(field, ": ", product, " bytes, expected at most ", limit);
  }
  return product;
}

Status CheckSpanInside(std::string_view field, uint64_t offset, uint64_t length,
                       uint64_t region_begin, uint64_t region_bytes) {
  // Compare distances from region_begin, never offset + length: a client-chosen offset near 2^64
  // would wrap the sum back inside the region.
  if (offset < region_begin || offset - region_begin > region_bytes ||
      length > region_bytes - (offset - region_begin)) {
    uint64_t region_end;
    const bool end_wraps = AddOverflow(region_begin, region_bytes, &region_end);
    return InvalidArgument(field, ": got ", offset, " for ", length,
                           " bytes, expected the range to lie inside [", region_begin, ", ",
                           end_wraps ? UINT64_MAX : region_end, ")");
  }
  return OkStatus();
}

StatusOr<uint64_t> CheckedOffset(std::string_view field, uint64_t index, uint64_t stride,
                                 uint64_t length, uint64_t buffer_bytes) {
  uint64_t offset;
  if (MulOverflow(index, stride, &offset)) {
    return InvalidArgument(field, ": index ", index, " x stride ", stride, " overflows 64 bits");
  }
  KVCTL_RETURN_IF_ERROR(CheckSpanInside(field, offset, length, 0, buffer_bytes));
  return offset;
}

}  // namespace kvctl
