#include "common/half.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

namespace kvctl {
namespace {

TEST_CASE("Half: known encodings", "[common]") {
  CHECK(FloatToHalf(0.0f) == 0x0000);
  CHECK(FloatToHalf(-0.0f) == 0x8000);
  CHECK(FloatToHalf(1.0f) == 0x3C00);
  CHECK(FloatToHalf(-2.0f) == 0xC000);
  CHECK(FloatToHalf(65504.0f) == 0x7BFF);
  CHECK(FloatToHalf(65520.0f) == 0x7C00);  // Ties to even rounds up to Inf.
  CHECK(FloatToHalf(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(FloatToHalf(5.9604644775390625e-8f) == 0x0001);   // Smallest subnormal.
  CHECK(FloatToHalf(2.98023223876953125e-8f) == 0x0000);  // Exactly half of it: ties to even.
  CHECK(FloatToHalf(6.103515625e-5f) == 0x0400);          // Smallest normal.
  CHECK(FloatToHalf(1.0f + 1.0f / 2048) == 0x3C00);       // Tie, even mantissa stays.
  CHECK(FloatToHalf(1.0f + 3.0f / 2048) == 0x3C02);       // Tie, odd mantissa rounds up.
  CHECK(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

TEST_CASE("Half: every fp16 value round-trips through float", "[common]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = HalfToFloat(bits);
    if (std::isnan(f)) continue;
    REQUIRE(FloatToHalf(f) == bits);
  }
}

TEST_CASE("Half: rounding matches the nearest representable value", "[common]") {
  // For values between two adjacent halves, the result is the closer one.
  for (uint16_t h = 0x0001; h < 0x7BFF; h = static_cast<uint16_t>(h + 97)) {
    const float lo = HalfToFloat(h);
    const float hi = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float a = lo + (hi - lo) * 0.3f;
    const float b = lo + (hi - lo) * 0.7f;
    CHECK(FloatToHalf(a) == h);
    CHECK(FloatToHalf(b) == h + 1);
  }
}

TEST_CASE("Bf16: round to nearest even", "[common]") {
  CHECK(FloatToBf16(1.0f) == 0x3F80);
  CHECK(Bf16ToFloat(0x3F80) == 1.0f);
  CHECK(FloatToBf16(BitsToFloat(0x3F808000u)) == 0x3F80);  // Tie, even stays.
  CHECK(FloatToBf16(BitsToFloat(0x3F818000u)) == 0x3F82);  // Tie, odd rounds up.
  CHECK(FloatToBf16(BitsToFloat(0x3F808001u)) == 0x3F81);
}

}  // namespace
}  // namespace kvctl
