// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kernels/convert.h against the scalar functions of common/half.h, bit for bit, at every SIMD
// level this CPU runs: every fp16 and bf16 bit pattern, the fp32 values around every fp16 value
// and rounding tie, NaN payloads, random bits; odd lengths and unaligned pointers (the SIMD tails),
// and the index the range checks name.
#include "kernels/convert.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

using testing::kNoSimd;
using testing::SimdLevelGuard;
using testing::SimdLevelsUnderTest;
using testing::Skip;

// The scalar level too: convert.cc has its own scalar loops besides the SIMD tails.
std::vector<SimdLevel> LevelsWithScalar() {
  std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (!levels.empty()) levels.insert(levels.begin(), SimdLevel::kScalar);
  return levels;
}

std::vector<uint16_t> AllPatterns16() {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  return all;
}

// fp32 bit patterns around every fp16 value: the value, its neighbours, the exact tie with the
// next fp16 value and the neighbours of that tie; both signs come from the patterns' sign bit.
// Then the fp32 specials and NaN payloads, and random bits (fixed seed).
std::vector<uint32_t> Float32Cases() {
  std::vector<uint32_t> bits;
  for (uint32_t h = 0; h < 0x7C00u; ++h) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t f = FloatBits(HalfToFloat(static_cast<uint16_t>(h))) | sign;
      const uint32_t next = FloatBits(HalfToFloat(static_cast<uint16_t>(h + 1))) | sign;
      const uint32_t tie = FloatBits((HalfToFloat(static_cast<uint16_t>(h)) +
                                      HalfToFloat(static_cast<uint16_t>(h + 1))) /
                                     2) |
                           sign;
      for (uint32_t b : {f, f + 1, f - 1, next - 1, tie, tie + 1, tie - 1}) bits.push_back(b);
    }
  }
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x00800000u, 0x33000000u,
                     0x33000001u, 0x32FFFFFFu, 0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u,
                     0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFF800001u,
                     0x7FC00000u, 0xFFC00000u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F802000u,
                     0x7FA00000u, 0xFFD55555u, 0x7F80FFFFu, 0x7F818000u}) {
    bits.push_back(b);
  }
  std::mt19937 rng(20261202);
  for (int i = 0; i < 1 << 20; ++i) bits.push_back(rng());
  return bits;
}

template <typename T>
std::vector<uint8_t> AsBytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// First mismatching element of two byte arrays of `width`-byte elements, for a readable failure.
std::string FirstDiff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                      size_t width) {
  for (size_t i = 0; i * width < want.size(); ++i) {
    if (std::memcmp(&got[i * width], &want[i * width], width) != 0) {
      uint32_t g = 0, w = 0;
      std::memcpy(&g, &got[i * width], width);
      std::memcpy(&w, &want[i * width], width);
      return "element " + std::to_string(i) + ": got bits " + std::to_string(g) + ", want " +
             std::to_string(w);
    }
  }
  return "";
}

TEST_CASE("Convert: every fp16 and bf16 pattern widens and crosses over as the reference does") {
  const std::vector<SimdLevel> levels = LevelsWithScalar();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  const std::vector<uint16_t> all = AllPatterns16();
  std::vector<uint32_t> from_half(all.size()), from_bf16(all.size());
  std::vector<uint16_t> half_to_bf16(all.size()), bf16_to_half(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    from_half[i] = FloatBits(HalfToFloat(all[i]));
    from_bf16[i] = FloatBits(Bf16ToFloat(all[i]));
    half_to_bf16[i] = FloatToBf16(HalfToFloat(all[i]));
    bf16_to_half[i] = FloatToHalf(Bf16ToFloat(all[i]));
  }
  for (SimdLevel level : levels) {
    INFO("level " << SimdLevelName(level));
    REQUIRE(SetSimdLevel(level).ok());
    std::vector<uint8_t> out32(4 * all.size()), out16(2 * all.size());
    ConvertF16ToF32(all.data(), all.size(), out32.data());
    CHECK(FirstDiff(out32, AsBytes(from_half), 4) == "");
    ConvertBf16ToF32(all.data(), all.size(), out32.data());
    CHECK(FirstDiff(out32, AsBytes(from_bf16), 4) == "");
    ConvertElements(DType::kF16, all.data(), DType::kBF16, out16.data(), all.size());
    CHECK(FirstDiff(out16, AsBytes(half_to_bf16), 2) == "");
    ConvertElements(DType::kBF16, all.data(), DType::kF16, out16.data(), all.size());
    CHECK(FirstDiff(out16, AsBytes(bf16_to_half), 2) == "");
    ConvertElements(DType::kF16, all.data(), DType::kF16, out16.data(), all.size());
    CHECK(FirstDiff(out16, AsBytes(all), 2) == "");
  }
}

TEST_CASE("Convert: fp32 narrows to fp16 and bf16 as FloatToHalf and FloatToBf16 do") {
  const std::vector<SimdLevel> levels = LevelsWithScalar();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  const std::vector<uint32_t> bits = Float32Cases();
  std::vector<uint16_t> want_half(bits.size()), want_bf16(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    want_half[i] = FloatToHalf(BitsToFloat(bits[i]));
    want_bf16[i] = FloatToBf16(BitsToFloat(bits[i]));
  }
  // The cases must reach every branch of FloatToHalf, or the comparison proves little.
  size_t subnormal = 0, nan = 0, inf = 0;
  for (uint16_t h : want_half) {
    subnormal += (h & 0x7C00u) == 0 && (h & 0x3FFu) != 0;
    nan += (h & 0x7FFFu) > 0x7C00u;
    inf += (h & 0x7FFFu) == 0x7C00u;
  }
  CHECK(subnormal > 1000);
  CHECK(nan > 1000);
  CHECK(inf > 1000);
  for (SimdLevel level : levels) {
    INFO("level " << SimdLevelName(level));
    REQUIRE(SetSimdLevel(level).ok());
    std::vector<uint8_t> out(2 * bits.size());
    ConvertF32ToF16(bits.data(), bits.size(), out.data());
    CHECK(FirstDiff(out, AsBytes(want_half), 2) == "");
    ConvertF32ToBf16(bits.data(), bits.size(), out.data());
    CHECK(FirstDiff(out, AsBytes(want_bf16), 2) == "");
    ConvertElements(DType::kF32, bits.data(), DType::kF16, out.data(), bits.size());
    CHECK(FirstDiff(out, AsBytes(want_half), 2) == "");
  }
}

TEST_CASE("Convert: RoundToHalfInPlace gives RoundToHalf of every value, past a chunk") {
  const std::vector<SimdLevel> levels = LevelsWithScalar();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  const std::vector<uint32_t> bits = Float32Cases();
  REQUIRE(bits.size() > 1024);  // More than one stack chunk of the implementation.
  for (SimdLevel level : levels) {
    INFO("level " << SimdLevelName(level));
    REQUIRE(SetSimdLevel(level).ok());
    for (const size_t n : {bits.size(), size_t{513}, size_t{7}}) {
      std::vector<float> values(n);
      std::memcpy(values.data(), bits.data(), 4 * n);
      RoundToHalfInPlace(values.data(), n);
      // One assertion per length, naming the first wrong element: an INFO and a REQUIRE per
      // element cost more than the conversion.
      size_t first_diff = n;
      for (size_t i = 0; i < n && first_diff == n; ++i) {
        const float want = RoundToHalf(BitsToFloat(bits[i]));
        const bool same =
            std::isnan(want) ? std::isnan(values[i]) : FloatBits(values[i]) == FloatBits(want);
        if (!same) first_diff = i;
      }
      INFO("first wrong element " << first_diff << " of " << n << ", input bits "
                                  << (first_diff < n ? bits[first_diff] : 0u));
      REQUIRE(first_diff == n);
    }
  }
}

TEST_CASE("Convert: any length at any alignment writes exactly n elements") {
  const std::vector<SimdLevel> levels = LevelsWithScalar();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  constexpr uint8_t kCanary = 0xA5;
  std::mt19937 rng(7);
  std::vector<uint32_t> src32(80);
  for (uint32_t& b : src32) b = FloatBits(std::normal_distribution<float>(0.0f, 300.0f)(rng));
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (size_t n = 0; n <= 70; ++n) {
      for (size_t offset : {0, 1, 3}) {
        INFO("level " << SimdLevelName(level) << ", n " << n << ", offset " << offset);
        // Source and destination both at `offset` bytes past an aligned buffer.
        std::vector<uint8_t> src(4 * n + 8), dst(4 * n + 8, kCanary);
        std::memcpy(src.data() + offset, src32.data(), 4 * n);
        ConvertF32ToF16(src.data() + offset, n, dst.data() + offset);
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, dst.data() + offset + 2 * i, 2);
          REQUIRE(h == FloatToHalf(BitsToFloat(src32[i])));
        }
        for (size_t i = 2 * n + offset; i < dst.size(); ++i) REQUIRE(dst[i] == kCanary);
        // And back: fp16 -> fp32 over the halves just written.
        std::vector<uint8_t> wide(4 * n + 8, kCanary);
        ConvertF16ToF32(dst.data() + offset, n, wide.data() + offset);
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, dst.data() + offset + 2 * i, 2);
          uint32_t f;
          std::memcpy(&f, wide.data() + offset + 4 * i, 4);
          REQUIRE(f == FloatBits(HalfToFloat(h)));
        }
        for (size_t i = 4 * n + offset; i < wide.size(); ++i) REQUIRE(wide[i] == kCanary);
        std::fill(dst.begin(), dst.end(), kCanary);
        ConvertF32ToBf16(src.data() + offset, n, dst.data() + offset);
        for (size_t i = 0; i < n; ++i) {
          uint16_t b;
          std::memcpy(&b, dst.data() + offset + 2 * i, 2);
          REQUIRE(b == FloatToBf16(BitsToFloat(src32[i])));
        }
        for (size_t i = 2 * n + offset; i < dst.size(); ++i) REQUIRE(dst[i] == kCanary);
      }
    }
  }
}

// The reference of both checks, element by element.
bool Finite(DType dtype, uint32_t bits) {
  const float f = dtype == DType::kF32   ? BitsToFloat(bits)
                  : dtype == DType::kF16 ? HalfToFloat(static_cast<uint16_t>(bits))
                                         : Bf16ToFloat(static_cast<uint16_t>(bits));
  return std::isfinite(f);
}
bool FitsHalfRange(DType dtype, uint32_t bits) {
  const float f = dtype == DType::kF32   ? BitsToFloat(bits)
                  : dtype == DType::kF16 ? HalfToFloat(static_cast<uint16_t>(bits))
                                         : Bf16ToFloat(static_cast<uint16_t>(bits));
  return f == f && std::fabs(f) <= kHalfMax;
}

TEST_CASE("Convert: the range checks classify every pattern as the reference does") {
  const std::vector<SimdLevel> levels = LevelsWithScalar();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  const std::vector<uint16_t> all = AllPatterns16();
  const std::vector<uint32_t> f32 = Float32Cases();
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
      INFO("level " << SimdLevelName(level) << ", dtype " << DTypeName(dtype));
      // One element at a time, each at a varying position in a run of fine values, so every
      // pattern passes the blocked vector body (8 vectors per test), the single vectors after
      // it and the scalar tail.
      const size_t count = dtype == DType::kF32 ? f32.size() : all.size();
      const size_t width = DTypeSize(dtype);
      constexpr size_t kRun = 301;
      std::vector<uint8_t> run(width * kRun, 0);  // Zeros: finite and in range.
      size_t mismatches = 0, bad_seen = 0;
      for (size_t i = 0; i < count; ++i) {
        const uint32_t bits = dtype == DType::kF32 ? f32[i] : all[i];
        const size_t at = i % kRun;
        std::memcpy(&run[width * at], &bits, width);
        const size_t want_finite = Finite(dtype, bits) ? kRun : at;
        const size_t want_half = FitsHalfRange(dtype, bits) ? kRun : at;
        bad_seen += want_half != kRun;
        mismatches += FirstNonFinite(dtype, run.data(), kRun) != want_finite;
        mismatches += FirstOutsideHalf(dtype, run.data(), kRun) != want_half;
        std::memset(&run[width * at], 0, width);
      }
      CHECK(bad_seen > 1000);
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("Convert: the range checks name the first bad element, not a later one") {
  const std::vector<SimdLevel> levels = LevelsWithScalar();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (size_t first = 0; first < 300; ++first) {
      INFO("level " << SimdLevelName(level) << ", first bad at " << first);
      std::vector<float> f(330, 1.0f);
      f[first] = 70000.0f;  // Finite, outside fp16.
      f[first + 5] = BitsToFloat(0x7FC00000u);
      f[first + 20] = BitsToFloat(0x7F800000u);
      CHECK(FirstOutsideHalf(DType::kF32, f.data(), f.size()) == first);
      CHECK(FirstNonFinite(DType::kF32, f.data(), f.size()) == first + 5);
      CHECK(FirstNonFinite(DType::kF32, f.data(), first + 5) == first + 5);  // n: none.
      std::vector<uint16_t> h(330, 0x3C00u);
      h[first] = 0xFC00u;  // -Inf.
      h[first + 3] = 0x7E00u;
      CHECK(FirstNonFinite(DType::kF16, h.data(), h.size()) == first);
      CHECK(FirstOutsideHalf(DType::kF16, h.data(), h.size()) == first);
      std::vector<uint16_t> b(330, 0x3F80u);
      b[first] = 0x4780u;  // 65536: finite bf16, outside fp16.
      b[first + 7] = 0xFF80u;
      CHECK(FirstOutsideHalf(DType::kBF16, b.data(), b.size()) == first);
      CHECK(FirstNonFinite(DType::kBF16, b.data(), b.size()) == first + 7);
    }
  }
}

}  // namespace
}  // namespace kvctl
