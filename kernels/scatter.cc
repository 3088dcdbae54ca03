// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/scatter.h"

#include <cstring>

namespace kvctl {

uint64_t PackedBytes(const CopyRange* wanted, int n) {
  uint64_t total = 0;
  for (int i = 0; i < n; ++i) total += wanted[i].bytes;
  return total;
}

uint64_t PackRanges(const uint8_t* base, const CopyRange* wanted, int n, uint8_t* packed,
                    CopyRange* table) {
  uint64_t at = 0;
  for (int i = 0; i < n; ++i) {
    std::memcpy(packed + at, base + wanted[i].src, wanted[i].bytes);
    table[i] = {at, wanted[i].dst, wanted[i].bytes};
    at += wanted[i].bytes;
  }
  return at;
}

void ScatterRef(const uint8_t* packed, const CopyRange* table, int n, uint8_t* dst_base) {
  for (int i = 0; i < n; ++i) {
    std::memcpy(dst_base + table[i].dst, packed + table[i].src, table[i].bytes);
  }
}

}  // namespace kvctl
