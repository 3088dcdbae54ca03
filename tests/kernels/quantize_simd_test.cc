// The SIMD codecs (AVX2, AVX-512) against the scalar reference over the shapes the default specs
// do not reach: every bit width on K and V, odd group sizes, small and large head_dim and block
// sizes, rows that are not 64-byte aligned, rounding ties, constant and signed-zero groups, and
// the error paths (non-finite input, fp16 overflow) that the SIMD path detects on its own.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/tensor.h"
#include "kernels/quantize.h"
#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

constexpr size_t kGuard = 64;
constexpr uint8_t kCanary = 0xA5;

using testing::kNoSimd;
using testing::SimdLevelGuard;
using testing::SimdLevelsUnderTest;
using testing::Skip;

// Scalar and every SIMD level this CPU runs; each test case first skips (loudly) a CPU with no
// SIMD level, where this would compare the reference with itself.
std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> levels;
  for (int l = 0; l <= static_cast<int>(DetectSimdLevel()); ++l) {
    levels.push_back(static_cast<SimdLevel>(l));
  }
  return levels;
}

enum class Fill { kGaussian, kGrid, kConstantGroups };

// G rows of K and V with row stride `stride` (>= D), and OScaR norms.
struct Block {
  int g = 0, d = 0;
  int64_t stride = 0;
  std::vector<float> k, v, norms;

  BlockInput Input() const { return {k.data(), v.data(), stride, norms.data()}; }
  float& K(int t, int c) { return k[t * stride + c]; }
  float& V(int t, int c) { return v[t * stride + c]; }
};

Block MakeBlock(int g, int d, int64_t stride, Fill fill, uint32_t seed) {
  Block b;
  b.g = g, b.d = d, b.stride = stride;
  b.k.assign(static_cast<size_t>(g) * stride, 0.0f);
  b.v.assign(b.k.size(), 0.0f);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> grid(0, 24);
  for (int t = 0; t < g; ++t) {
    for (int c = 0; c < d; ++c) {
      switch (fill) {
        case Fill::kGaussian:
          // Outlier channels in K, heavier tails in V, a low-norm first token.
          b.K(t, c) = normal(rng) * (c % 13 == 0 ? 20.0f : 1.0f) + (c % 7 == 0 ? 5.0f : 0.0f);
          b.V(t, c) = normal(rng) * normal(rng) * 2.0f;
          if (t == 0) b.K(t, c) *= 0.01f, b.V(t, c) *= 0.01f;
          break;
        case Fill::kGrid:
          // Multiples of 1/8: scales and zeros come out exact, so x / scale hits .5 ties.
          b.K(t, c) = grid(rng) * 0.125f - 1.0f;
          b.V(t, c) = grid(rng) * 0.25f;
          break;
        case Fill::kConstantGroups:
          // Constant rows, zero rows with either sign, and constant channels.
          b.K(t, c) = (t % 3 == 0) ? -0.0f : (c % 2 ? 1.5f : 0.0f);
          b.V(t, c) = (t % 4 == 1) ? 2.25f : (t % 4 == 2 ? -0.0f : static_cast<float>(c % 5));
          break;
      }
    }
  }
  b.norms.resize(static_cast<size_t>(g));
  for (int t = 0; t < g; ++t) {
    double ss = 0;
    for (int c = 0; c < d; ++c) ss += static_cast<double>(b.K(t, c)) * b.K(t, c);
    b.norms[t] = ss > 0 ? static_cast<float>(std::sqrt(ss)) : 1.0f;
  }
  return b;
}

bool SameFloats(const std::vector<float>& a, const std::vector<float>& b, bool nan_equal) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (nan_equal && std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

// True when the guard zone behind a written range still holds the canary everywhere.
bool AllCanary(const uint8_t* guard, size_t bytes) {
  return std::all_of(guard, guard + bytes, [](uint8_t b) { return b == kCanary; });
}

// fp16 rows equal, bit for bit, or (nan_equal) both NaN whatever their signs: a NaN made by
// arithmetic (Inf - Inf in a butterfly) takes its sign from the order of the operations.
bool SameHalves(const std::vector<uint8_t>& a, const uint8_t* b, bool nan_equal) {
  for (size_t i = 0; i < a.size(); i += 2) {
    uint16_t x, y;
    std::memcpy(&x, &a[i], 2);
    std::memcpy(&y, b + i, 2);
    if (nan_equal && (x & 0x7FFF) > 0x7C00 && (y & 0x7FFF) > 0x7C00) continue;
    if (x != y) return false;
  }
  return true;
}

// DequantizeBlockHalves of `rec` at the active level against its reference, which must be
// FloatToHalf of DequantizeBlockRef's floats: the same bytes (NaN as SameHalves says), written at
// an odd address (frames have any alignment) with nothing written past the rows.
void ExpectSameHalves(const QuantSpec& spec, const uint8_t* rec, const float* norms,
                      bool nan_equal) {
  const size_t n = static_cast<size_t>(spec.block_tokens) * spec.head_dim;
  std::vector<float> kr(n), vr(n);
  DequantizeBlockRef(spec, rec, norms, kr.data(), vr.data());
  std::vector<uint8_t> k_ref(2 * n), v_ref(2 * n);
  DequantizeBlockHalvesRef(spec, rec, norms, k_ref.data(), v_ref.data());
  // One assertion for the whole block: a Catch REQUIRE per element cost more than the codecs.
  size_t first_diff = n;
  for (size_t i = 0; i < n && first_diff == n; ++i) {
    const uint16_t k = FloatToHalf(kr[i]), v = FloatToHalf(vr[i]);
    if (std::memcmp(&k_ref[2 * i], &k, 2) != 0 || std::memcmp(&v_ref[2 * i], &v, 2) != 0) {
      first_diff = i;
    }
  }
  REQUIRE(first_diff == n);
  std::vector<uint8_t> k_fast(1 + 2 * n + kGuard, kCanary), v_fast(1 + 2 * n + kGuard, kCanary);
  DequantizeBlockHalves(spec, rec, norms, k_fast.data() + 1, v_fast.data() + 1);
  REQUIRE(k_fast[0] == kCanary);
  REQUIRE(v_fast[0] == kCanary);
  REQUIRE(SameHalves(k_ref, k_fast.data() + 1, nan_equal));
  REQUIRE(SameHalves(v_ref, v_fast.data() + 1, nan_equal));
  REQUIRE(AllCanary(k_fast.data() + 1 + 2 * n, kGuard));
  REQUIRE(AllCanary(v_fast.data() + 1 + 2 * n, kGuard));
}

// QuantizeBlock at every SIMD level must return the reference's status and, on success, write
// exactly the reference's bytes (into a record prefilled with junk, with a guard zone behind it)
// and decode to exactly the reference's floats.
void ExpectSameAsReference(const QuantSpec& spec, const Block& blk) {
  SimdLevelGuard guard;
  const BlockLayout l = BlockLayoutOf(spec);
  std::vector<uint8_t> ref(l.record_bytes);
  const Status ref_status = QuantizeBlockRef(spec, blk.Input(), ref.data());
  const size_t n = static_cast<size_t>(spec.block_tokens) * spec.head_dim;
  std::vector<float> kr(n), vr(n), kf(n), vf(n);
  if (ref_status.ok()) DequantizeBlockRef(spec, ref.data(), blk.norms.data(), kr.data(), vr.data());
  for (SimdLevel level : Levels()) {
    INFO("simd " << SimdLevelName(level));
    REQUIRE(SetSimdLevel(level).ok());
    std::vector<uint8_t> fast(l.record_bytes + kGuard, 0x5A);
    std::memset(fast.data() + l.record_bytes, kCanary, kGuard);
    const Status s = QuantizeBlock(spec, blk.Input(), fast.data());
    REQUIRE(s.code() == ref_status.code());
    REQUIRE(s.message() == ref_status.message());
    REQUIRE(AllCanary(fast.data() + l.record_bytes, kGuard));
    if (!ref_status.ok()) continue;
    REQUIRE(std::memcmp(ref.data(), fast.data(), l.record_bytes) == 0);
    DequantizeBlock(spec, ref.data(), blk.norms.data(), kf.data(), vf.data());
    REQUIRE(SameFloats(kr, kf, false));
    REQUIRE(SameFloats(vr, vf, false));
    ExpectSameHalves(spec, ref.data(), blk.norms.data(), false);
  }
}

QuantSpec Spec(QuantMethod m, int d, int g, int kb, int vb, int kg, int vg) {
  QuantSpec spec = TraitsOf(m).defaults;
  spec.head_dim = d;
  spec.block_tokens = g;
  spec.k_bits = kb;
  spec.v_bits = vb;
  const bool grouped = m == QuantMethod::kKivi || m == QuantMethod::kOscar;
  spec.k_group_tokens = grouped ? kg : g;
  spec.v_group_channels = grouped ? vg : d;
  INFO("spec: " << ValidateQuantSpec(spec).ToString());
  REQUIRE(ValidateQuantSpec(spec).ok());
  return spec;
}

const int kBitPairs[][2] = {{2, 2}, {3, 3}, {4, 4}, {8, 8}, {2, 8}, {4, 3}};

TEST_CASE("SIMD codecs: KIVI and OScaR match the reference for odd groups, widths and shapes",
          "[kernels]") {
  if (SimdLevelsUnderTest().empty()) return Skip(kNoSimd);
  struct Shape {
    int d, g, kg, vg;
  };
  // Groups of 8, 24 and 40 do not divide into 16 lanes; G = 48 and D = 96 are not powers of two.
  // G = 8 gives K rows of 2 bytes at 2 bits (shorter than a word; 8 lanes only).
  const Shape kivi_shapes[] = {{128, 32, 32, 32}, {64, 48, 24, 8},   {96, 80, 40, 24},
                               {16, 16, 8, 16},   {256, 64, 16, 64}, {48, 16, 16, 48},
                               {32, 8, 8, 8}};
  // OScaR's K is rotated in the row layout: D = 8 (AVX2: one vector, in-vector stages only),
  // 16, 32 and up to 256 (16 vectors per row at 16 lanes).
  const Shape oscar_shapes[] = {{128, 32, 32, 32},  {64, 48, 24, 8}, {16, 32, 8, 16},
                                {256, 16, 16, 128}, {8, 16, 8, 8},   {32, 64, 16, 32}};
  for (QuantMethod m : {QuantMethod::kKivi, QuantMethod::kOscar}) {
    for (const Shape& sh :
         m == QuantMethod::kKivi
             ? std::vector<Shape>(std::begin(kivi_shapes), std::end(kivi_shapes))
             : std::vector<Shape>(std::begin(oscar_shapes), std::end(oscar_shapes))) {
      for (const auto& bits : kBitPairs) {
        for (Fill fill : {Fill::kGaussian, Fill::kGrid, Fill::kConstantGroups}) {
          // Rows 3 * 4 bytes past a multiple of 64, so no row starts aligned; and rows back to
          // back (row_stride = head_dim), as the daemon's flush hands them over.
          for (int stride : {2 * sh.d + 3, sh.d}) {
            const QuantSpec spec = Spec(m, sh.d, sh.g, bits[0], bits[1], sh.kg, sh.vg);
            const Block blk = MakeBlock(sh.g, sh.d, stride, fill, sh.d * 7 + bits[0]);
            INFO(QuantMethodName(m) << " d " << sh.d << " g " << sh.g << " kg " << sh.kg << " vg "
                                    << sh.vg << " bits " << bits[0] << "/" << bits[1] << " fill "
                                    << static_cast<int>(fill) << " stride " << stride);
            ExpectSameAsReference(spec, blk);
          }
        }
      }
    }
  }
}

TEST_CASE("SIMD codecs: QuaRot matches the reference for every width and head_dim", "[kernels]") {
  if (SimdLevelsUnderTest().empty()) return Skip(kNoSimd);
  for (int d : {8, 16, 32, 64, 128, 256}) {
    for (int g : {8, 16, 48, 64}) {
      for (const auto& bits : kBitPairs) {
        for (Fill fill : {Fill::kGaussian, Fill::kGrid, Fill::kConstantGroups}) {
          const QuantSpec spec = Spec(QuantMethod::kQuaRot, d, g, bits[0], bits[1], g, d);
          const Block blk = MakeBlock(g, d, d + 5, fill, d + g + bits[1]);
          INFO("quarot d " << d << " g " << g << " bits " << bits[0] << "/" << bits[1] << " fill "
                           << static_cast<int>(fill));
          ExpectSameAsReference(spec, blk);
        }
      }
    }
  }
}

TEST_CASE("SIMD codecs: TurboQuant matches the reference for every width and head_dim",
          "[kernels]") {
  if (SimdLevelsUnderTest().empty()) return Skip(kNoSimd);
  const int turbo_bits[][2] = {{2, 2}, {3, 3}, {4, 4}, {2, 4}, {4, 3}, {3, 2}};
  for (int d : {8, 16, 32, 64, 128, 256}) {
    for (int g : {16, 48, 64}) {
      for (const auto& bits : turbo_bits) {
        for (Fill fill : {Fill::kGaussian, Fill::kGrid, Fill::kConstantGroups}) {
          const QuantSpec spec = Spec(QuantMethod::kTurbo, d, g, bits[0], bits[1], g, d);
          const Block blk = MakeBlock(g, d, d + 5, fill, d + g + bits[1]);
          INFO("turbo d " << d << " g " << g << " bits " << bits[0] << "/" << bits[1] << " fill "
                          << static_cast<int>(fill));
          ExpectSameAsReference(spec, blk);
        }
      }
    }
  }
}

TEST_CASE("SIMD codecs: KVarN matches the reference for every width and tile shape", "[kernels]") {
  if (SimdLevelsUnderTest().empty()) return Skip(kNoSimd);
  struct Shape {
    int d, g, iters;
  };
  // Decode runs the Hadamard in the row layout: D = 8 (AVX2: in-vector stages only) up to 256
  // (32 vectors per row at 8 lanes).
  const Shape shapes[] = {{128, 128, 16}, {64, 32, 16}, {16, 48, 5},
                          {256, 16, 3},   {32, 64, 0},  {8, 32, 2}};
  for (const Shape& sh : shapes) {
    for (const auto& bits : kBitPairs) {
      for (Fill fill : {Fill::kGaussian, Fill::kGrid, Fill::kConstantGroups}) {
        if (sh.d * sh.g > 4096 && fill != Fill::kGaussian) continue;  // Keeps the test fast.
        QuantSpec spec = Spec(QuantMethod::kKvarn, sh.d, sh.g, bits[0], bits[1], sh.g, sh.d);
        spec.sinkhorn_iters = sh.iters;
        const Block blk = MakeBlock(sh.g, sh.d, sh.d + 1, fill, sh.g + bits[0]);
        INFO("kvarn d " << sh.d << " g " << sh.g << " iters " << sh.iters << " bits " << bits[0]
                        << "/" << bits[1] << " fill " << static_cast<int>(fill));
        ExpectSameAsReference(spec, blk);
      }
    }
  }
}

TEST_CASE("SIMD codecs: a non-finite element is reported with the reference's message",
          "[kernels]") {
  if (SimdLevelsUnderTest().empty()) return Skip(kNoSimd);
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kKivi, QuantMethod::kQuaRot,
                        QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo}) {
    const int b = m == QuantMethod::kFp16 ? 16 : 2;
    const int g = 32;
    const QuantSpec spec = Spec(m, 64, g, b, b, 16, 32);
    struct Spot {
      bool in_k;
      int t, c;
    };
    for (const Spot& spot : {Spot{true, 0, 0}, Spot{false, 0, 0}, Spot{true, g - 1, 63},
                             Spot{false, g - 1, 63}, Spot{false, 5, 9}, Spot{true, 17, 40}}) {
      for (float bad : bad_values) {
        Block blk = MakeBlock(g, 64, 64 * 3, Fill::kGaussian, 11);
        (spot.in_k ? blk.K(spot.t, spot.c) : blk.V(spot.t, spot.c)) = bad;
        INFO(QuantMethodName(m) << (spot.in_k ? " k" : " v") << " (" << spot.t << ", " << spot.c
                                << ") = " << bad);
        ExpectSameAsReference(spec, blk);
      }
    }
    // Several bad elements: the first in (token, channel) order wins, K before V at one spot.
    Block blk = MakeBlock(g, 64, 64, Fill::kGaussian, 12);
    blk.K(7, 30) = bad_values[1];
    blk.V(7, 3) = bad_values[0];
    blk.K(9, 0) = bad_values[2];
    ExpectSameAsReference(spec, blk);
    std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
    const Status s = QuantizeBlock(spec, blk.Input(), rec.data());
    CHECK(s.message().find("v: element (token 7, channel 3) is nan") != std::string::npos);
    if (m == QuantMethod::kOscar) {
      // Bad norms and a non-finite element: the element is reported, as by the reference.
      blk.norms[2] = 0.0f;
      ExpectSameAsReference(spec, blk);
      blk.K(7, 30) = blk.V(7, 3) = blk.K(9, 0) = 1.0f;
      ExpectSameAsReference(spec, blk);  // Now the norm.
    }
  }
}

TEST_CASE("SIMD codecs: fp16 rows round like FloatToHalf at every boundary and refuse overflow",
          "[kernels]") {
  if (SimdLevelsUnderTest().empty()) return Skip(kNoSimd);
  // Every finite fp16 value, the midpoints between neighbours (ties to even) and one float ulp
  // either side of them, both signs: every rounding boundary including subnormals and 65504.
  std::vector<float> values;
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const float a = HalfToFloat(static_cast<uint16_t>(h));
    const float mid = (a + HalfToFloat(static_cast<uint16_t>(h + 1))) / 2;
    for (float x : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      values.push_back(x);
      values.push_back(-x);
    }
  }
  values.push_back(65504.0f);
  values.push_back(std::nextafter(65520.0f, 0.0f));  // Largest float that rounds to 65504.
  const QuantSpec spec = Spec(QuantMethod::kFp16, 128, 32, 16, 16, 32, 128);
  const size_t per_block = 2 * 32 * 128;
  for (size_t first = 0; first < values.size(); first += per_block) {
    Block blk = MakeBlock(32, 128, 128, Fill::kGaussian, 1);
    for (size_t i = 0; i < per_block; ++i) {
      const float x = values[(first + i) % values.size()];
      (i % 2 ? blk.k : blk.v)[i / 2] = x;
    }
    ExpectSameAsReference(spec, blk);
  }
  // Beyond the fp16 range: an INVALID_ARGUMENT naming the fp16 range, as the reference's.
  for (float big : {65520.0f, -65520.0f, 1e30f, -3.4e38f}) {
    Block blk = MakeBlock(32, 128, 128, Fill::kGaussian, 2);
    blk.V(31, 127) = big;
    INFO("value " << big);
    ExpectSameAsReference(spec, blk);
    SimdLevelGuard guard;
    for (SimdLevel level : Levels()) {
      REQUIRE(SetSimdLevel(level).ok());
      std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
      const Status s = QuantizeBlock(spec, blk.Input(), rec.data());
      CHECK(s.code() == StatusCode::kInvalidArgument);
      CHECK(s.message().find("fp16 range") != std::string::npos);
    }
  }
}

TEST_CASE("SIMD codecs: metadata overflow is refused like the reference", "[kernels]") {
  if (SimdLevelsUnderTest().empty()) return Skip(kNoSimd);
  for (QuantMethod m : {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn,
                        QuantMethod::kOscar, QuantMethod::kTurbo}) {
    for (float big : {7e4f, 1e6f, 3e38f}) {
      const QuantSpec spec = Spec(m, 64, 32, 4, 2, 32, 32);
      Block blk = MakeBlock(32, 64, 64, Fill::kGaussian, 3);
      blk.K(4, 5) = big;
      blk.V(6, 7) = -big;
      INFO(QuantMethodName(m) << " value " << big);
      ExpectSameAsReference(spec, blk);
    }
  }
}

TEST_CASE("SIMD codecs: arbitrary record bytes decode like the reference", "[kernels]") {
  if (SimdLevelsUnderTest().empty()) return Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(5);
  for (QuantMethod m : {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn,
                        QuantMethod::kOscar, QuantMethod::kTurbo}) {
    for (const auto& bits : kBitPairs) {
      if (m == QuantMethod::kTurbo && (bits[0] == 8 || bits[1] == 8)) continue;
      const QuantSpec spec = Spec(m, 64, 48, bits[0], bits[1], 16, 8);
      std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
      for (uint8_t& byte : rec) byte = static_cast<uint8_t>(rng());
      const size_t n = static_cast<size_t>(spec.block_tokens) * spec.head_dim;
      std::vector<float> norms(spec.block_tokens, 1.5f), kr(n), vr(n), kf(n), vf(n);
      DequantizeBlockRef(spec, rec.data(), norms.data(), kr.data(), vr.data());
      for (SimdLevel level : Levels()) {
        INFO(QuantMethodName(m) << " bits " << bits[0] << "/" << bits[1] << " simd "
                                << SimdLevelName(level));
        REQUIRE(SetSimdLevel(level).ok());
        DequantizeBlock(spec, rec.data(), norms.data(), kf.data(), vf.data());
        // fp16 NaN payloads may come back quieted by the hardware conversion; NaN stays NaN.
        REQUIRE(SameFloats(kr, kf, true));
        REQUIRE(SameFloats(vr, vf, true));
        ExpectSameHalves(spec, rec.data(), norms.data(), true);
      }
    }
  }
  // fp16 records: random halves hold NaNs with payloads (quiet and signaling) and infinities.
  const QuantSpec spec = Spec(QuantMethod::kFp16, 64, 48, 16, 16, 48, 64);
  std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
  for (uint8_t& byte : rec) byte = static_cast<uint8_t>(rng());
  const uint16_t specials[] = {0x7C01, 0xFE01, 0x7E00, 0x7C00, 0xFC00, 0x0001, 0x8000};
  for (size_t i = 0; i < std::size(specials); ++i) std::memcpy(&rec[2 * i], &specials[i], 2);
  std::vector<float> norms(spec.block_tokens, 1.0f);
  for (SimdLevel level : Levels()) {
    INFO("fp16 simd " << SimdLevelName(level));
    REQUIRE(SetSimdLevel(level).ok());
    // Stored NaNs (not made by arithmetic) keep their sign: canonical fp16 NaN on both paths.
    ExpectSameHalves(spec, rec.data(), norms.data(), false);
  }
}

TEST_CASE("DequantizeBlock without v_out decodes K alone, the same floats", "[kernels]") {
  // The eviction scorers decode keys only. Every method and width, the reference and every SIMD
  // level: K equal to a full decode's bit for bit, and nothing written anywhere else (a canary
  // after K; there is no V buffer to write).
  std::mt19937 rng(9);
  std::vector<SimdLevel> levels = Levels();
  levels.insert(levels.begin(), SimdLevel::kScalar);
  SimdLevelGuard guard;
  for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kKivi, QuantMethod::kQuaRot,
                        QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo}) {
    for (const auto& bits : kBitPairs) {
      if (m == QuantMethod::kTurbo && (bits[0] == 8 || bits[1] == 8)) continue;
      if (m == QuantMethod::kFp16 && bits[0] != kBitPairs[0][0]) continue;
      const QuantSpec spec = m == QuantMethod::kFp16 ? Spec(m, 64, 32, 16, 16, 32, 64)
                                                     : Spec(m, 64, 48, bits[0], bits[1], 16, 8);
      const size_t n = static_cast<size_t>(spec.block_tokens) * spec.head_dim;
      std::vector<float> k(n), v(n), norms(spec.block_tokens);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      for (float& x : norms) x = 1.0f + std::abs(normal(rng));
      std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
      REQUIRE(QuantizeBlockRef(spec, {k.data(), v.data(), spec.head_dim, norms.data()}, rec.data())
                  .ok());
      for (SimdLevel level : levels) {
        INFO(QuantMethodName(m) << " bits " << bits[0] << "/" << bits[1] << " simd "
                                << SimdLevelName(level));
        REQUIRE(SetSimdLevel(level).ok());
        std::vector<float> full_k(n), full_v(n), alone(n + 16, 42.0f);
        DequantizeBlock(spec, rec.data(), norms.data(), full_k.data(), full_v.data());
        DequantizeBlock(spec, rec.data(), norms.data(), alone.data(), nullptr);
        CHECK(SameFloats(full_k, {alone.begin(), alone.begin() + static_cast<std::ptrdiff_t>(n)},
                         false));
        for (size_t i = n; i < alone.size(); ++i) CHECK(alone[i] == 42.0f);
        if (level == SimdLevel::kScalar) {
          std::vector<float> ref(n);
          DequantizeBlockRef(spec, rec.data(), norms.data(), ref.data(), nullptr);
          CHECK(SameFloats(full_k, ref, false));
        }
      }
    }
  }
}

// What the SIMD tests above compare depends on DetectSimdLevel: if it under-reported the CPU (a
// wrong CPUID bit), every SIMD test would quietly run a narrower path. Its CPUID reading is
// checked against the flags Linux lists.
TEST_CASE("SIMD levels: the kernels run the widest instruction set /proc/cpuinfo lists",
          "[kernels]") {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (flags.empty() && std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string word; words >> word;) flags.insert(word);
  }
  if (flags.empty()) return Skip("no flags line in /proc/cpuinfo to check DetectSimdLevel with");
  auto has = [&](const char* flag) { return flags.count(flag) == 1; };
  SimdLevel expected = SimdLevel::kScalar;  // Without FMA3 or F16C, whatever else.
  if (has("fma") && has("f16c") && has("avx512f") && has("avx512bw") && has("avx512vl")) {
    expected = SimdLevel::kAvx512;
  } else if (has("fma") && has("f16c") && has("avx2")) {
    expected = SimdLevel::kAvx2;
  }
  INFO("cpuinfo flags: " << line);
  REQUIRE(DetectSimdLevel() == expected);
  SimdLevelGuard guard;
  for (SimdLevel level : Levels()) {
    REQUIRE(SetSimdLevel(level).ok());
    CHECK(ActiveSimdLevel() == level);
  }
}

TEST_CASE("ParseSimdLevel: the inverse of SimdLevelName, other names are errors", "[kernels]") {
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    const StatusOr<SimdLevel> parsed = ParseSimdLevel(SimdLevelName(level));
    REQUIRE(parsed.ok());
    CHECK(*parsed == level);
  }
  for (const char* bad : {"", "AVX2", "avx", "neon", "avx512 "}) {
    const StatusOr<SimdLevel> parsed = ParseSimdLevel(bad);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(parsed.status().message()),
               Catch::Matchers::Contains("expected scalar, avx2 or avx512"));
  }
}

TEST_CASE("ComputeTokenNorms: each token summed in (head, channel) order, bit for bit",
          "[kernels]") {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int tokens : {1, 7, 8, 19}) {
    const int heads = 3, d = 24;
    std::vector<float> k(static_cast<size_t>(tokens) * heads * d);
    for (float& x : k) x = normal(rng);
    for (int c = 0; c < d; ++c) k[c] = 0.0f;  // Head 0 of token 0 is zero.
    std::vector<uint16_t> k16(k.size());
    for (size_t i = 0; i < k.size(); ++i) k16[i] = FloatToHalf(k[i]);
    for (DType dtype : {DType::kF32, DType::kF16}) {
      const void* data = dtype == DType::kF32 ? static_cast<const void*>(k.data()) : k16.data();
      const KvTensorView view = KvTensorView::Contiguous(data, dtype, tokens, heads, d);
      std::vector<float> norms(static_cast<size_t>(tokens)), row(static_cast<size_t>(d));
      ComputeTokenNorms(view, norms.data());
      for (int t = 0; t < tokens; ++t) {
        float ss = 0.0f;
        for (int h = 0; h < heads; ++h) {
          view.LoadRow(t, h, row.data());
          for (float x : row) ss += x * x;
        }
        const float expect = std::sqrt(ss) > 0.0f ? std::sqrt(ss) : 1.0f;
        INFO("tokens " << tokens << " token " << t << " dtype " << static_cast<int>(dtype));
        REQUIRE(std::memcmp(&norms[t], &expect, sizeof(float)) == 0);
      }
    }
  }
  // An all-zero token gets norm 1.
  std::vector<float> zeros(2 * 8, 0.0f);
  float norms[2];
  ComputeTokenNorms(KvTensorView::Contiguous(zeros.data(), DType::kF32, 2, 1, 8), norms);
  CHECK(norms[0] == 1.0f);
  CHECK(norms[1] == 1.0f);
}

TEST_CASE("ComputeTokenNorms: SIMD lanes over tokens equal the reference, bit for bit",
          "[kernels]") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) Skip(kNoSimd);
  SimdLevelGuard guard;
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 12);
  // Token counts around the 8- and 16-lane groups and their pairs; head_dim a multiple of 8 or
  // 16, or neither (the reference does all of it); the [T, H, D] layout and the daemon's
  // head-major one (each head's rows back to back), plus a padded token stride.
  for (int tokens : {1, 8, 15, 16, 17, 31, 32, 33, 47, 64, 100}) {
    for (int heads : {1, 3, 8}) {
      for (int d : {8, 16, 24, 40, 128}) {
        for (int layout = 0; layout < 3; ++layout) {
          const int64_t pad = layout == 2 ? 8 : 0;
          const int64_t token_stride = layout == 1 ? d : heads * d + pad;
          const int64_t head_stride = layout == 1 ? int64_t{tokens} * d : d;
          std::vector<float> k(static_cast<size_t>(tokens) * (heads * d + pad));
          // Magnitudes over many binades make the order of the adds visible in the low bits.
          for (float& x : k) x = std::ldexp(normal(rng), exponent(rng));
          const KvTensorView view{k.data(), DType::kF32,  tokens,     heads,
                                  d,        token_stride, head_stride};
          REQUIRE(view.Validate("k").ok());
          std::vector<float> expect(static_cast<size_t>(tokens));
          ComputeTokenNormsRef(view, expect.data());
          for (SimdLevel level : levels) {
            REQUIRE(SetSimdLevel(level).ok());
            std::vector<float> got(static_cast<size_t>(tokens) + 1, -7.0f);
            ComputeTokenNorms(view, got.data());
            INFO(SimdLevelName(level) << " tokens " << tokens << " heads " << heads << " d " << d
                                      << " layout " << layout);
            REQUIRE(std::memcmp(got.data(), expect.data(), sizeof(float) * tokens) == 0);
            REQUIRE(got[static_cast<size_t>(tokens)] == -7.0f);  // Nothing written past the end.
          }
        }
      }
    }
  }
  // All-zero tokens inside a SIMD group get norm 1, as in the reference.
  std::vector<float> zeros(static_cast<size_t>(32) * 16, 0.0f);
  for (int c = 0; c < 16; ++c) zeros[5 * 16 + c] = 0.5f;
  for (SimdLevel level : levels) {
    REQUIRE(SetSimdLevel(level).ok());
    std::vector<float> norms(32);
    ComputeTokenNorms(KvTensorView::Contiguous(zeros.data(), DType::kF32, 32, 1, 16), norms.data());
    for (int t = 0; t < 32; ++t) CHECK(norms[t] == (t == 5 ? 2.0f : 1.0f));
  }
}

}  // namespace
}  // namespace kvctl
