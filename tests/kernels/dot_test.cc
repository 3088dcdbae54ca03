// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kernels/dot.h: DotRef's order on known answers, and DotRows and DotRowsMany bit for bit against
// DotRef at every SIMD level this CPU runs, over lengths with and without a tail, row counts
// around the blocks (4 rows; 4 x 2), strides, signed zeros and magnitudes where the order of
// the sums shows.
#include "kernels/dot.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

using testing::kNoSimd;
using testing::SimdLevelGuard;
using testing::SimdLevelsUnderTest;
using testing::Skip;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

TEST_CASE("DotRef: the eight lane sums, their tree, then the tail") {
  const float tiny = std::ldexp(1.0f, -24);  // Half an ulp of 1: lost when added to 1 alone.
  // Lane sums first: lane 0 gets 1e8 and then -1e8, lane 1 gets 1 and then 0.5. Summed in index
  // order the 1 and the 0.5 would be lost against 1e8 (0.25 at the end); DotRef gives 1.75.
  std::vector<float> a(17, 0.0f), b(17, 1.0f);
  a[0] = 1e8f;
  a[8] = -1e8f;
  a[1] = 1.0f;
  a[9] = 0.5f;
  a[16] = 0.25f;  // The tail.
  CHECK(DotRef(a.data(), b.data(), 17) == 1.75f);
  CHECK(DotRef(a.data(), b.data(), 16) == 1.5f);
  CHECK(DotRef(a.data(), b.data(), 0) == 0.0f);
  // The tree: (s0 + s1) + (s2 + s3), so two tiny lane sums meet each other before they meet 1
  // (in lane order each would be lost against 1).
  const std::vector<float> ones(8, 1.0f);
  std::vector<float> x = {1.0f, 0, tiny, tiny, 0, 0, 0, 0};
  CHECK(DotRef(x.data(), ones.data(), 8) == 1.0f + 2 * tiny);
  x = {1.0f, 0, 0, 0, tiny, tiny, 0, 0};  // And the first half before the second.
  CHECK(DotRef(x.data(), ones.data(), 8) == 1.0f + 2 * tiny);
  x = {1.0f, tiny, tiny, 0, 0, 0, 0, 0};  // 1 + tiny rounds to 1 (a tie, to even) first.
  CHECK(DotRef(x.data(), ones.data(), 8) == 1.0f);
  // Each product is rounded before it is added (no FMA): lane 0 holds -(1 + 2^-11), then adds
  // (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24, whose float is 1 + 2^-11: the sum is exactly 0 (a fused
  // multiply-add would leave 2^-24).
  const float e = 1.0f + std::ldexp(1.0f, -12);
  std::vector<float> p(16, 0.0f), q(16, 0.0f);
  p[0] = -(1.0f + std::ldexp(1.0f, -11));
  q[0] = 1.0f;
  p[8] = q[8] = e;
  CHECK(DotRef(p.data(), q.data(), 16) == 0.0f);
}

TEST_CASE("DotRows: bit-identical to DotRef at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 128, 131, 256}) {
      for (int64_t count : {0, 1, 3, 4, 5, 8, 12, 13, 17}) {
        const int64_t stride = n + (count % 3);  // Rows back to back, or with a gap.
        std::vector<float> a(static_cast<size_t>(n)), rows(static_cast<size_t>(stride * count + 1));
        // Magnitudes over 60 binades so the order of the sums decides the low bits.
        for (float& v : a) v = std::ldexp(unit(rng), exponent(rng));
        for (float& v : rows) v = std::ldexp(unit(rng), exponent(rng));
        if (n > 0) a[0] = -0.0f;
        std::vector<float> out(static_cast<size_t>(count) + 1, 42.0f);
        DotRows(a.data(), rows.data(), stride, count, n, out.data());
        for (int64_t r = 0; r < count; ++r) {
          const float want = DotRef(a.data(), rows.data() + r * stride, n);
          INFO(SimdLevelName(level) << " n " << n << " count " << count << " row " << r);
          CHECK(Bits(out[static_cast<size_t>(r)]) == Bits(want));
        }
        CHECK(out[static_cast<size_t>(count)] == 42.0f);  // Nothing written past count.
      }
    }
    // The product rounding of the known answer above, through the SIMD path.
    std::vector<float> p(16, 0.0f), q(16, 0.0f), one(1);
    p[0] = -(1.0f + std::ldexp(1.0f, -11));
    q[0] = 1.0f;
    p[8] = q[8] = 1.0f + std::ldexp(1.0f, -12);
    DotRows(p.data(), q.data(), 16, 1, 16, one.data());
    CHECK(Bits(one[0]) == Bits(0.0f));
    // A negative zero sum: every product -0 (signs differ), the tail +0 added as DotRef does.
    std::vector<float> neg(16, -0.0f), pos(64, 0.0f);
    std::vector<float> out(4);
    DotRows(neg.data(), pos.data(), 16, 4, 16, out.data());
    for (float v : out) CHECK(Bits(v) == Bits(DotRef(neg.data(), pos.data(), 16)));
  }
}

TEST_CASE("DotRowsMany: bit-identical to DotRef at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 8, 9, 64, 67}) {
      for (int64_t a_count : {0, 1, 3, 4, 5, 8, 9}) {
        for (int64_t count : {0, 1, 2, 3, 7, 8}) {
          const int64_t a_stride = n + 1, stride = n + (count % 2);
          const int64_t out_stride = count + 2;  // Gaps between the output rows stay untouched.
          std::vector<float> a(static_cast<size_t>(a_stride * a_count + 1));
          std::vector<float> rows(static_cast<size_t>(stride * count + 1));
          for (float& v : a) v = std::ldexp(unit(rng), exponent(rng));
          for (float& v : rows) v = std::ldexp(unit(rng), exponent(rng));
          std::vector<float> out(static_cast<size_t>(out_stride * a_count + 1), 42.0f);
          DotRowsMany(a.data(), a_stride, a_count, rows.data(), stride, count, n, out.data(),
                      out_stride);
          for (int64_t q = 0; q < a_count; ++q) {
            for (int64_t r = 0; r < out_stride; ++r) {
              INFO(SimdLevelName(level) << " n " << n << " a_count " << a_count << " count "
                                        << count << " q " << q << " r " << r);
              const float got = out[static_cast<size_t>(q * out_stride + r)];
              if (r >= count) {
                CHECK(got == 42.0f);
                continue;
              }
              const float want = DotRef(a.data() + q * a_stride, rows.data() + r * stride, n);
              CHECK(Bits(got) == Bits(want));
            }
          }
          CHECK(out.back() == 42.0f);
        }
      }
    }
  }
}

TEST_CASE("DotI16Ref: exact sums, including intermediate sums past int32") {
  const std::vector<int16_t> a = {1, -2, 3, 32767, -32767};
  const std::vector<int16_t> b = {4, 5, -6, 2, 1};
  CHECK(DotI16Ref(a.data(), b.data(), 0) == 0);
  CHECK(DotI16Ref(a.data(), b.data(), 3) == 4 - 10 - 18);
  CHECK(DotI16Ref(a.data(), b.data(), 5) == 4 - 10 - 18 + 65534 - 32767);
  // Three products of 32767^2: the running sum passes 2^31 before the last term brings it back.
  const std::vector<int16_t> x = {32767, 32767, 32767, -32767};
  const std::vector<int16_t> y = {32767, 32767, -32767, 32767};
  CHECK(DotI16Ref(x.data(), x.data(), 2) == 2 * 32767 * 32767);
  CHECK(DotI16Ref(x.data(), y.data(), 4) == 0);
}

TEST_CASE("DotRowsManyI16: DotI16Ref's values at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(17);
  // Elements up to 2^11, so no sum of n <= 128 products leaves int32 (the requirement); the
  // largest elements allowed (+-32767) in the short rows below.
  std::uniform_int_distribution<int> element(-2048, 2048);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 15, 16, 17, 64, 67, 128}) {
      for (int64_t a_count : {0, 1, 3, 4, 5, 8, 9}) {
        for (int64_t count : {0, 1, 2, 3, 4, 5, 7}) {
          const int64_t a_stride = n + 1, stride = n + (count % 2);
          const int64_t out_stride = count + 2;  // Gaps between the output rows stay untouched.
          std::vector<int16_t> a(static_cast<size_t>(a_stride * a_count + 1));
          std::vector<int16_t> rows(static_cast<size_t>(stride * count + 1));
          for (int16_t& v : a) v = static_cast<int16_t>(element(rng));
          for (int16_t& v : rows) v = static_cast<int16_t>(element(rng));
          if (a_count > 0 && count > 0 && n <= 2) {  // 2 * 32767^2 < 2^31.
            for (int64_t d = 0; d < n; ++d) a[d] = rows[d] = (d % 2) ? -32767 : 32767;
          }
          std::vector<int32_t> out(static_cast<size_t>(out_stride * a_count + 1), 42);
          DotRowsManyI16(a.data(), a_stride, a_count, rows.data(), stride, count, n, out.data(),
                         out_stride);
          for (int64_t q = 0; q < a_count; ++q) {
            for (int64_t r = 0; r < out_stride; ++r) {
              INFO(SimdLevelName(level) << " n " << n << " a_count " << a_count << " count "
                                        << count << " q " << q << " r " << r);
              const int32_t got = out[static_cast<size_t>(q * out_stride + r)];
              if (r >= count) {
                CHECK(got == 42);
                continue;
              }
              CHECK(got == DotI16Ref(a.data() + q * a_stride, rows.data() + r * stride, n));
            }
          }
          CHECK(out.back() == 42);
        }
      }
    }
  }
}

TEST_CASE("DotRowsManyI16: many rows and keys, DotI16Ref's values at every SIMD level") {
  // With 8 rows of a or more the SIMD paths transpose the keys, 32 at a time on AVX-512 VNNI and
  // 16 on AVX2 (kernels/dot_lanes_over_keys.inc): whole and partial groups of keys, whole and
  // partial blocks of 4 rows, fewer rows than that (4, 7: the other layout), every row length
  // they take (multiples of 32 up to 256) and one they leave to the other layout (288).
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(29);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {32, 64, 128, 256, 288}) {
      // Elements up to 2^15 / sqrt(n) keep every sum within int32, as unit keys are.
      const int bound = n <= 64 ? 4095 : 2047;
      std::uniform_int_distribution<int> element(-bound, bound);
      for (int64_t a_count : {4, 7, 8, 13, 17}) {
        for (int64_t count : {1, 15, 16, 17, 31, 32, 33, 64, 77}) {
          const int64_t a_stride = n + 3, stride = n + 2 * (count % 3);
          const int64_t out_stride = count + 5;  // Gaps between the output rows stay untouched.
          std::vector<int16_t> a(static_cast<size_t>(a_stride * a_count + 1));
          std::vector<int16_t> rows(static_cast<size_t>(stride * count + 1));
          for (int16_t& v : a) v = static_cast<int16_t>(element(rng));
          for (int16_t& v : rows) v = static_cast<int16_t>(element(rng));
          std::vector<int32_t> out(static_cast<size_t>(out_stride * a_count + 1), 42);
          DotRowsManyI16(a.data(), a_stride, a_count, rows.data(), stride, count, n, out.data(),
                         out_stride);
          int64_t wrong = 0, gaps_touched = 0;
          for (int64_t q = 0; q < a_count; ++q) {
            for (int64_t r = 0; r < out_stride; ++r) {
              const int32_t got = out[static_cast<size_t>(q * out_stride + r)];
              if (r >= count) {
                gaps_touched += got != 42;
              } else {
                wrong += got != DotI16Ref(a.data() + q * a_stride, rows.data() + r * stride, n);
              }
            }
          }
          INFO(SimdLevelName(level) << " n " << n << " a_count " << a_count << " count " << count);
          CHECK(wrong == 0);
          CHECK(gaps_touched == 0);
          CHECK(out.back() == 42);
        }
      }
    }
  }
}

TEST_CASE("DotPairsI16: DotI16Ref's values of the chosen pairs at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> element(-2048, 2048);  // As above: sums stay in int32.
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 15, 16, 17, 64, 67, 128}) {
      for (int64_t count : {0, 1, 3, 4, 5, 8, 9}) {
        const int64_t row_count = 6;
        std::vector<int16_t> rows(static_cast<size_t>(row_count * n));
        for (int16_t& v : rows) v = static_cast<int16_t>(element(rng));
        if (n > 0 && n <= 2) {  // The largest elements: 2 * 32767^2 < 2^31.
          for (int64_t d = 0; d < n; ++d) rows[d] = (d % 2) ? -32767 : 32767;
        }
        // Self pairs, repeats and both orders among the six rows.
        std::uniform_int_distribution<int32_t> row(0, row_count - 1);
        std::vector<int32_t> first(static_cast<size_t>(count)), second(first.size());
        for (int64_t k = 0; k < count; ++k) {
          first[k] = row(rng);
          second[k] = k % 3 == 0 ? first[k] : row(rng);
        }
        std::vector<int32_t> out(static_cast<size_t>(count) + 1, 42);
        DotPairsI16(rows.data(), n, first.data(), second.data(), count, out.data());
        for (int64_t k = 0; k < count; ++k) {
          INFO(SimdLevelName(level) << " n " << n << " count " << count << " k " << k);
          CHECK(out[k] == DotI16Ref(rows.data() + first[k] * n, rows.data() + second[k] * n, n));
        }
        CHECK(out.back() == 42);
      }
    }
  }
}

TEST_CASE("UnitRowsI16Ref: norms, scale and ties to even on known answers") {
  // Row 0 = (3, 4): norm 5 (+1e-8, lost in float), units 3/5 and 4/5 of 2^14 = 9830.4 -> 9830 and
  // 13107.2 -> 13107. Row 1 = (-1, 0): -16384. Row 2 = 2.5 * 2^-14 * (norm) ... made a tie: with
  // scale 8 and row (1, 1, 1, 1) (norm 2), each unit is 4 exactly; with (0.625, 0, 0, 0) and scale
  // 4 it is 4 * 0.625 / 0.625 = 4; the tie case: scale 5 over norm 2 -> 2.5 per element, to 2.
  const float x[] = {3, 4, -1, 0};
  int16_t unit[4];
  float norm[2];
  UnitRowsI16Ref(x, 2, 2, 2, 16384.0f, unit, norm);
  CHECK(norm[0] == 5.0f);
  CHECK(norm[1] == 1.0f);
  CHECK(unit[0] == 9830);
  CHECK(unit[1] == 13107);
  CHECK(unit[2] == -16384);
  CHECK(unit[3] == 0);
  const float ones[] = {1, 1, 1, 1, -1, -1, -1, -1};
  int16_t ties[8];
  float two[2];
  UnitRowsI16Ref(ones, 4, 2, 4, 5.0f, ties, two);  // 1 * (5 / 2) = 2.5 -> 2, -2.5 -> -2.
  for (int c = 0; c < 4; ++c) CHECK(ties[c] == 2);
  for (int c = 4; c < 8; ++c) CHECK(ties[c] == -2);
}

TEST_CASE("UnitRowsI16: UnitRowsI16Ref's bits at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {1, 7, 8, 15, 16, 17, 64, 67, 128}) {
      for (int64_t count : {1, 2, 3, 4, 5, 9}) {
        const int64_t stride = n + (count % 3);
        std::vector<float> x(static_cast<size_t>(stride * count));
        for (float& v : x) v = normal(rng) * (n % 2 ? 100.0f : 0.01f);
        x[0] = 0.0f;  // A zero and a signed zero: both give units of 0.
        if (x.size() > 1) x[1] = -0.0f;
        if (count > 2) {  // An all-zero row: norm 1e-8, every unit 0.
          for (int64_t c = 0; c < n; ++c) x[static_cast<size_t>(2 * stride + c)] = 0.0f;
        }
        std::vector<int16_t> want(static_cast<size_t>(count * n) + 1, 7), got(want);
        std::vector<float> want_norm(static_cast<size_t>(count) + 1, 7), got_norm(want_norm);
        UnitRowsI16Ref(x.data(), stride, count, n, 16384.0f, want.data(), want_norm.data());
        UnitRowsI16(x.data(), stride, count, n, 16384.0f, got.data(), got_norm.data());
        INFO(SimdLevelName(level) << " n " << n << " count " << count);
        CHECK(got == want);
        for (size_t t = 0; t < want_norm.size(); ++t)
          CHECK(Bits(got_norm[t]) == Bits(want_norm[t]));
        CHECK(got.back() == 7);                // Nothing written past count * n.
        for (int64_t t = 0; t < count; ++t) {  // Every unit row has norm about 2^14.
          double sum = 0;
          for (int64_t c = 0; c < n; ++c) sum += std::pow(want[static_cast<size_t>(t * n + c)], 2);
          bool zero_row = true;
          for (int64_t c = 0; c < n; ++c) zero_row &= x[static_cast<size_t>(t * stride + c)] == 0;
          if (zero_row) {
            CHECK(sum == 0);
          } else {
            CHECK(std::sqrt(sum) == Approx(16384).margin(std::sqrt(n) * 0.5 + 1));
          }
        }
      }
    }
  }
}

TEST_CASE("LogitsFromUnitDotsRef: the three roundings in order, on known answers") {
  // dot 2^28 with norms 3 and 5: 2^28 * (3 * (5 * 2^-28)) = 15 exactly.
  const int32_t dot[] = {1 << 28, -(1 << 28), 0, 12345};
  const float k_norm[] = {5.0f, 5.0f, 2.0f, 0.1f};
  float out[4];
  LogitsFromUnitDotsRef(dot, 3.0f, k_norm, 4, out);
  CHECK(out[0] == 15.0f);
  CHECK(out[1] == -15.0f);
  CHECK(Bits(out[2]) == Bits(0.0f));
  CHECK(Bits(out[3]) == Bits(12345.0f * (3.0f * (0.1f * 0x1p-28f))));
}

TEST_CASE("LogitsFromUnitDots: LogitsFromUnitDotsRef's bits at every SIMD level") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(29);
  std::uniform_int_distribution<int32_t> dot_value(-(1 << 28), 1 << 28);
  std::uniform_real_distribution<float> norm_value(1e-8f, 1e3f);
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    for (int64_t n : {0, 1, 7, 8, 9, 16, 31, 1000}) {
      std::vector<int32_t> dot(static_cast<size_t>(n));
      std::vector<float> k_norm(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) dot[j] = dot_value(rng), k_norm[j] = norm_value(rng);
      if (n > 2) dot[1] = INT32_MAX, dot[2] = INT32_MIN;  // Rounded to float on conversion.
      std::vector<float> want(static_cast<size_t>(n) + 1, 7.0f), got(want);
      const float q_norm = norm_value(rng);
      LogitsFromUnitDotsRef(dot.data(), q_norm, k_norm.data(), n, want.data());
      LogitsFromUnitDots(dot.data(), q_norm, k_norm.data(), n, got.data());
      INFO(SimdLevelName(level) << " n " << n);
      for (size_t j = 0; j < want.size(); ++j) CHECK(Bits(got[j]) == Bits(want[j]));
    }
  }
}

}  // namespace
}  // namespace kvctl
