// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// One section per rule of common/checked_math.h, each with the wrapping case it exists for.
#include "common/checked_math.h"

#include <catch2/catch.hpp>
#include <cstdint>

namespace kvctl {
namespace {

constexpr uint64_t kMax = UINT64_MAX;

bool Contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST_CASE("rule 1: CheckedAdd and CheckedMul refuse a wrap", "[checked_math]") {
  REQUIRE(CheckedAdd("a", 2, 3).value() == 5);
  REQUIRE(CheckedAdd("a", kMax - 1, 1).value() == kMax);
  const StatusOr<uint64_t> wrapped =
      CheckedAdd("staging_offset", kMax - (1ull << 32) + 1, 1ull << 32);
  REQUIRE_FALSE(wrapped.ok());
  REQUIRE(wrapped.status().code() == StatusCode::kInvalidArgument);
  REQUIRE(Contains(wrapped.status(), "staging_offset"));
  REQUIRE(CheckedMul("m", 1ull << 31, 1ull << 32).value() == 1ull << 63);
  REQUIRE_FALSE(CheckedMul("m", 1ull << 32, 1ull << 32).ok());
  REQUIRE(CheckedMul("m", 0, kMax).value() == 0);
}

TEST_CASE("rule 2: CheckedProduct refuses overflow and sizes past the limit", "[checked_math]") {
  REQUIRE(CheckedProduct("k", {2, 3, 4}).value() == 24);
  REQUIRE(CheckedProduct("k", {}).value() == 1);
  // 1024 layers x 2^20 tokens x 1024 heads x 1024 dims x 4 bytes = 2^52: fits in 64 bits.
  REQUIRE(CheckedProduct("k", {1024, 1u << 20, 1024, 1024, 4}).value() == 1ull << 52);
  // x 2^12 more wraps.
  const StatusOr<uint64_t> wrapped = CheckedProduct("k", {1024, 1u << 20, 1024, 1024, 4, 1 << 12});
  REQUIRE_FALSE(wrapped.ok());
  REQUIRE(Contains(wrapped.status(), "k: the size overflows"));
  const StatusOr<uint64_t> big = CheckedProduct("request", {1000, 1000}, 999'999);
  REQUIRE_FALSE(big.ok());
  REQUIRE(Contains(big.status(), "1000000 bytes, expected at most 999999"));
  REQUIRE(CheckedProduct("request", {1000, 1000}, 1'000'000).ok());
}

TEST_CASE("rule 3: CheckSpanInside cannot be fooled by a wrapping offset", "[checked_math]") {
  // A slot [4096, 4096 + 8192).
  REQUIRE(CheckSpanInside("s", 4096, 8192, 4096, 8192).ok());
  REQUIRE(CheckSpanInside("s", 8192, 4096, 4096, 8192).ok());
  REQUIRE(CheckSpanInside("s", 4096 + 8192, 0, 4096, 8192).ok());  // Empty, at the end.
  REQUIRE_FALSE(CheckSpanInside("s", 4096 + 8193, 0, 4096, 8192).ok());
  REQUIRE_FALSE(CheckSpanInside("s", 4095, 1, 4096, 8192).ok());     // Starts below.
  REQUIRE_FALSE(CheckSpanInside("s", 8192, 4097, 4096, 8192).ok());  // Ends past.
  // The crash of issue #17: offset 2^64 - 2^32 with a 2^32-byte payload wraps offset + length
  // to 0, which a naive `offset + need > end` check accepts.
  const Status wrapped =
      CheckSpanInside("staging_offset", kMax - (1ull << 32) + 1, 1ull << 32, 4096, 8192);
  REQUIRE_FALSE(wrapped.ok());
  REQUIRE(Contains(wrapped, "staging_offset: got 18446744069414584320 for 4294967296 bytes"));
  REQUIRE(Contains(wrapped, "[4096, 12288)"));
  // Smaller wraps that land below the region.
  for (uint64_t back = 1; back <= 4096; back *= 2) {
    REQUIRE_FALSE(CheckSpanInside("s", kMax - back + 1, back + 100, 4096, 8192).ok());
  }
  // A region reaching the top of the address space does not wrap in the message either.
  REQUIRE_FALSE(CheckSpanInside("s", 0, 1, kMax - 10, 10).ok());
  REQUIRE(CheckSpanInside("s", kMax - 5, 5, kMax - 10, 10).ok());
  REQUIRE(Contains(CheckSpanInside("s", 0, 1, kMax - 10, 20), "18446744073709551615)"));
}

TEST_CASE("rule 4: CheckedNarrow refuses values that do not fit", "[checked_math]") {
  REQUIRE(CheckedNarrow<int32_t>("layers", 1024).value() == 1024);
  REQUIRE(CheckedNarrow<int32_t>("layers", INT32_MAX).value() == INT32_MAX);
  const StatusOr<int32_t> big = CheckedNarrow<int32_t>("layers", uint64_t{1} << 31);
  REQUIRE_FALSE(big.ok());
  REQUIRE(Contains(big.status(), "layers: got 2147483648, expected at most 2147483647"));
  REQUIRE_FALSE(CheckedNarrow<uint8_t>("bits", 256).ok());
  REQUIRE(CheckedNarrow<uint64_t>("x", kMax).value() == kMax);
}

TEST_CASE("rule 5: CheckedOffset keeps index * stride + length inside the buffer",
          "[checked_math]") {
  REQUIRE(CheckedOffset("page", 3, 4096, 4096, 16384).value() == 12288);
  REQUIRE_FALSE(CheckedOffset("page", 4, 4096, 1, 16384).ok());
  REQUIRE_FALSE(CheckedOffset("page", 3, 4096, 4097, 16384).ok());
  REQUIRE_FALSE(CheckedOffset("page", 1ull << 52, 1 << 12, 0, 16384).ok());  // Wraps to 0.
}

}  // namespace
}  // namespace kvctl
