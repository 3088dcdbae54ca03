// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// kernels/scatter.h: packing scattered ranges and the scatter reference that spells what the CUDA
// scatter kernel must do.
#include "kernels/scatter.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

namespace kvctl {
namespace {

TEST_CASE("Scatter: packed ranges scatter back to their places and nowhere else", "[kernels]") {
  std::vector<uint8_t> source(10000);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 1);
  // Out of order, odd sizes, one byte, one range moved elsewhere in the destination.
  const std::vector<CopyRange> wanted = {
      {5000, 5000, 300}, {17, 17, 1}, {4096, 4096, 512}, {9000, 100, 250}};
  const int n = static_cast<int>(wanted.size());
  REQUIRE(PackedBytes(wanted.data(), n) == 1063);
  std::vector<uint8_t> packed(PackedBytes(wanted.data(), n));
  std::vector<CopyRange> table(wanted.size());
  CHECK(PackRanges(source.data(), wanted.data(), n, packed.data(), table.data()) == 1063);
  // Known answer: the pack is the ranges back to back, in order.
  CHECK(table[0].src == 0);
  CHECK(table[1].src == 300);
  CHECK(table[2].src == 301);
  CHECK(table[3].src == 813);
  CHECK(packed[300] == source[17]);
  CHECK(packed[813] == source[9000]);

  std::vector<uint8_t> dest(10000, 0xEE);
  ScatterRef(packed.data(), table.data(), n, dest.data());
  std::vector<uint8_t> expected(10000, 0xEE);
  for (const CopyRange& r : wanted) {
    for (uint64_t i = 0; i < r.bytes; ++i) expected[r.dst + i] = source[r.src + i];
  }
  CHECK(dest == expected);
}

TEST_CASE("Scatter: no ranges pack nothing", "[kernels]") {
  uint8_t byte = 3;
  CHECK(PackedBytes(nullptr, 0) == 0);
  CHECK(PackRanges(&byte, nullptr, 0, nullptr, nullptr) == 0);
  ScatterRef(nullptr, nullptr, 0, &byte);
  CHECK(byte == 3);
}

}  // namespace
}  // namespace kvctl
