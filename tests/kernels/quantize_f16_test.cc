// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// fp16 input rows (BlockInput/BlockBatch k_f16, v_f16): at every SIMD level, for every method and
// every pair of bit widths the registry allows, the record from fp16 rows is byte for byte the
// record from the same values as fp32 rows and the scalar reference's; strided rows and the
// daemon's row slots (K row then V row); non-finite fp16 named like the fp32 path names it; and
// ComputeTokenNorms on fp16 views with the reference's bits.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/tensor.h"
#include "kernels/quantize.h"
#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

using testing::SimdLevelGuard;
using testing::SimdLevelsUnderTest;

constexpr QuantMethod kMethods[] = {QuantMethod::kFp16,  QuantMethod::kKivi,  QuantMethod::kQuaRot,
                                    QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo};

// Scalar, then the SIMD levels this CPU runs (SimdLevelsUnderTest WARNs the missing ones).
std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> levels{SimdLevel::kScalar};
  for (SimdLevel l : SimdLevelsUnderTest()) levels.push_back(l);
  return levels;
}

std::vector<int> AllowedBits(QuantMethod m) {
  std::vector<int> bits;
  for (int b = 0; b < 32; ++b) {
    if (TraitsOf(m).allowed_bits & (1u << b)) bits.push_back(b);
  }
  return bits;
}

// G tokens of K and V, the same values as fp32 and as fp16 bits, row t of K at t * stride and of
// V at v_offset + t * stride in both buffers (v_offset = d with stride 2d is the daemon's slot).
struct Rows {
  int g = 0, d = 0;
  int64_t stride = 0, v_offset = 0;
  std::vector<float> f32;
  std::vector<uint16_t> f16;
  std::vector<float> norms;

  int64_t K(int t, int c) const { return t * stride + c; }
  int64_t V(int t, int c) const { return v_offset + t * stride + c; }
  BlockInput F32() const { return {f32.data(), f32.data() + v_offset, stride, norms.data()}; }
  BlockInput F16() const {
    return {nullptr, nullptr, stride, norms.data(), f16.data(), f16.data() + v_offset};
  }
  // Sets element i to the fp16 value h in both forms.
  void Set(int64_t i, uint16_t h) {
    f16[i] = h;
    f32[i] = HalfToFloat(h);
  }
};

// Gaussian values with outlier channels, rounded to fp16 (so fp32 and fp16 hold the same values);
// scale 1e4 pushes metadata past the fp16 range for some methods (the overflow error path).
Rows MakeRows(int g, int d, int64_t stride, int64_t v_offset, float scale, uint32_t seed) {
  Rows r;
  r.g = g, r.d = d, r.stride = stride, r.v_offset = v_offset;
  const int64_t n = v_offset + g * stride;
  r.f32.assign(static_cast<size_t>(n), 0.0f);
  r.f16.assign(static_cast<size_t>(n), 0);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int t = 0; t < g; ++t) {
    for (int c = 0; c < d; ++c) {
      r.Set(r.K(t, c), FloatToHalf(scale * (normal(rng) * (c % 11 == 0 ? 8.0f : 1.0f) + 0.5f)));
      r.Set(r.V(t, c), FloatToHalf(scale * normal(rng) * normal(rng)));
    }
  }
  r.norms.resize(static_cast<size_t>(g));
  for (int t = 0; t < g; ++t) {
    float ss = 0.0f;
    for (int c = 0; c < d; ++c) ss += r.f32[r.K(t, c)] * r.f32[r.K(t, c)];
    r.norms[t] = ss > 0.0f ? std::sqrt(ss) : 1.0f;
  }
  return r;
}

QuantSpec SpecOf(QuantMethod m, int d, int kb, int vb) {
  StatusOr<QuantSpec> spec = MakeQuantSpec(m, d, kb, vb);
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return *spec;
}

// The fp32 reference's record and status on `rows`; then at every level the fp16 rows through
// QuantizeBlock and QuantizeBlockRef, and the fp32 rows through QuantizeBlock, must give the same
// status and message and, on success, the same bytes.
void ExpectSameRecords(const QuantSpec& spec, const Rows& rows) {
  SimdLevelGuard guard;
  const size_t bytes = BlockLayoutOf(spec).record_bytes;
  std::vector<uint8_t> ref(bytes);
  const Status ref_status = QuantizeBlockRef(spec, rows.F32(), ref.data());
  for (SimdLevel level : Levels()) {
    INFO("simd " << SimdLevelName(level));
    REQUIRE(SetSimdLevel(level).ok());
    struct Path {
      const char* name;
      Status (*fn)(const QuantSpec&, const BlockInput&, uint8_t*);
      BlockInput in;
    };
    for (const Path& p :
         {Path{"fp16", QuantizeBlock, rows.F16()}, Path{"fp16 ref", QuantizeBlockRef, rows.F16()},
          Path{"fp32", QuantizeBlock, rows.F32()}}) {
      INFO(p.name);
      std::vector<uint8_t> rec(bytes, 0x5A);
      const Status s = p.fn(spec, p.in, rec.data());
      REQUIRE(s.code() == ref_status.code());
      REQUIRE(s.message() == ref_status.message());
      if (ref_status.ok()) REQUIRE(std::memcmp(rec.data(), ref.data(), bytes) == 0);
    }
  }
}

TEST_CASE("fp16 input: every method and width gives the fp32 path's bytes at every level",
          "[kernels]") {
  int checked = 0;
  for (QuantMethod m : kMethods) {
    for (int kb : AllowedBits(m)) {
      for (int vb : AllowedBits(m)) {
        for (int d : {64, 128}) {
          const QuantSpec spec = SpecOf(m, d, kb, vb);
          const int g = spec.block_tokens;
          INFO(QuantMethodName(m) << " k" << kb << "v" << vb << " d " << d << " g " << g);
          // Contiguous rows, rows with a gap (not a multiple of 16 elements: unaligned loads),
          // and the daemon's slots: K row then V row, so both tensors stride 2 * d.
          ExpectSameRecords(spec, MakeRows(g, d, d, int64_t{g} * d, 1.0f, 11 + d));
          ExpectSameRecords(spec, MakeRows(g, d, d + 24, int64_t{g} * (d + 24) + 8, 1.0f, 12));
          ExpectSameRecords(spec, MakeRows(g, d, 2 * d, d, 1.0f, 13));
          // Large values: metadata overflow where the method stores fp16 metadata past 65504.
          ExpectSameRecords(spec, MakeRows(g, d, 2 * d, d, 1e4f, 14));
          ++checked;
        }
      }
    }
  }
  CHECK(checked >= 2 * 6);  // At least one width pair per method, two head_dims.
}

// The SIMD loaders check finiteness on the halves themselves (an exponent of all ones); the
// largest finite halves sit one below that boundary, in every position of a 16 x 16 tile.
TEST_CASE("fp16 input: the largest finite halves are accepted as the reference accepts them",
          "[kernels]") {
  for (QuantMethod m : kMethods) {
    const std::vector<int> bits = AllowedBits(m);
    const QuantSpec spec = SpecOf(m, 128, bits.back(), bits.back());
    const int g = spec.block_tokens;
    for (const uint16_t big : {uint16_t{0x7BFF}, uint16_t{0xFBFF}, uint16_t{0x7800}}) {
      INFO(QuantMethodName(m) << " bits " << big);
      Rows rows = MakeRows(g, 128, 2 * 128, 128, 1.0f, 51);
      for (int t = 0; t < g; ++t) {
        rows.Set(rows.K(t, (7 * t) % 128), big);
        rows.Set(rows.V(t, (5 * t + 3) % 128), big);
      }
      ExpectSameRecords(spec, rows);
    }
  }
}

TEST_CASE("fp16 input: QuantizeBlocks over the daemon's row slots equals block-by-block fp32",
          "[kernels]") {
  SimdLevelGuard guard;
  const int d = 128, n_blocks = 3;
  for (QuantMethod m : kMethods) {
    const std::vector<int> bits = AllowedBits(m);
    const QuantSpec spec = SpecOf(m, d, bits.front(), bits.back());
    const int g = spec.block_tokens;
    INFO(QuantMethodName(m));
    // n_blocks * g slots of [K row | V row].
    const Rows rows = MakeRows(n_blocks * g, d, 2 * d, d, 1.0f, 21);
    const size_t bytes = BlockLayoutOf(spec).record_bytes;
    std::vector<uint8_t> ref(bytes * n_blocks);
    for (int b = 0; b < n_blocks; ++b) {
      const int64_t first = int64_t{b} * g * 2 * d;
      const BlockInput in{rows.f32.data() + first, rows.f32.data() + first + d, 2 * d,
                          rows.norms.data() + b * g};
      REQUIRE(QuantizeBlockRef(spec, in, ref.data() + b * bytes).ok());
    }
    for (SimdLevel level : Levels()) {
      INFO("simd " << SimdLevelName(level));
      REQUIRE(SetSimdLevel(level).ok());
      const BlockBatch batch{.row_stride = 2 * d,
                             .block_stride = int64_t{g} * 2 * d,
                             .token_norms = rows.norms.data(),
                             .n_blocks = n_blocks,
                             .k_f16 = rows.f16.data(),
                             .v_f16 = rows.f16.data() + d};
      std::vector<uint8_t> out(bytes * n_blocks, 0x5A);
      REQUIRE(QuantizeBlocks(spec, batch, out.data()).ok());
      REQUIRE(out == ref);
      // fp32 rows in a batch (whose blocks ask for the next block's rows) give the same bytes.
      BlockBatch f32_batch = batch;
      f32_batch.k_f16 = f32_batch.v_f16 = nullptr;
      f32_batch.k = rows.f32.data();
      f32_batch.v = rows.f32.data() + d;
      std::fill(out.begin(), out.end(), 0x5A);
      REQUIRE(QuantizeBlocks(spec, f32_batch, out.data()).ok());
      REQUIRE(out == ref);
      // A NaN in block 1 stops the batch there, named with the block's index as for fp32 rows.
      Rows bad = rows;
      bad.Set(bad.V(g + 2, 7), 0x7E00);
      BlockBatch bad_batch = batch;
      bad_batch.k_f16 = bad.f16.data();
      bad_batch.v_f16 = bad.f16.data() + d;
      BlockBatch bad_f32 = bad_batch;
      bad_f32.k_f16 = bad_f32.v_f16 = nullptr;
      bad_f32.k = bad.f32.data();
      bad_f32.v = bad.f32.data() + d;
      const Status s16 = QuantizeBlocks(spec, bad_batch, out.data());
      const Status s32 = QuantizeBlocks(spec, bad_f32, out.data());
      REQUIRE(s16.code() == StatusCode::kInvalidArgument);
      REQUIRE(s16.message() == s32.message());
      REQUIRE(s16.message().rfind("block 1: v: element (token 2, channel 7)", 0) == 0);
    }
  }
}

TEST_CASE("fp16 input: Inf and NaN are refused naming the token and channel, as fp32 is",
          "[kernels]") {
  SimdLevelGuard guard;
  const int d = 128;
  struct Bad {
    bool k;
    int t, c;
    uint16_t bits;
  };
  for (QuantMethod m : kMethods) {
    const std::vector<int> bits = AllowedBits(m);
    const QuantSpec spec = SpecOf(m, d, bits.front(), bits.front());
    const int g = spec.block_tokens;
    for (const Bad& bad :
         {Bad{true, 0, 0, 0x7C00}, Bad{false, 0, 5, 0xFC00}, Bad{true, g - 1, d - 1, 0x7E00},
          Bad{false, g / 2, 17, 0xFE01}, Bad{true, 3, 64, 0x7C01}}) {
      INFO(QuantMethodName(m) << (bad.k ? " k" : " v") << " token " << bad.t << " channel " << bad.c
                              << " bits " << bad.bits);
      Rows rows = MakeRows(g, d, 2 * d, d, 1.0f, 31);
      rows.Set(bad.k ? rows.K(bad.t, bad.c) : rows.V(bad.t, bad.c), bad.bits);
      std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
      const Status ref = QuantizeBlockRef(spec, rows.F32(), rec.data());
      REQUIRE(ref.code() == StatusCode::kInvalidArgument);
      const std::string where = std::string(bad.k ? "k" : "v") + ": element (token " +
                                std::to_string(bad.t) + ", channel " + std::to_string(bad.c) + ")";
      REQUIRE(ref.message().find(where) != std::string::npos);
      for (SimdLevel level : Levels()) {
        INFO("simd " << SimdLevelName(level));
        REQUIRE(SetSimdLevel(level).ok());
        const Status s = QuantizeBlock(spec, rows.F16(), rec.data());
        REQUIRE(s.code() == ref.code());
        REQUIRE(s.message() == ref.message());
      }
    }
  }
}

TEST_CASE("fp16 input: a block input with both or neither pair of rows is refused", "[kernels]") {
  const QuantSpec spec = SpecOf(QuantMethod::kKivi, 64, 2, 2);
  const Rows rows = MakeRows(spec.block_tokens, 64, 64, 64 * spec.block_tokens, 1.0f, 41);
  std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
  BlockInput both = rows.F16();
  both.k = rows.f32.data();
  both.v = rows.f32.data();
  Status s = QuantizeBlock(spec, both, rec.data());
  REQUIRE(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("both fp32 (k, v) and fp16 (k_f16, v_f16)") != std::string::npos);
  BlockInput half_pair = rows.F16();
  half_pair.v_f16 = nullptr;
  s = QuantizeBlock(spec, half_pair, rec.data());
  REQUIRE(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("null K or V rows") != std::string::npos);
}

TEST_CASE("ComputeTokenNorms: fp16 views equal the reference and the fp32 view, bit for bit",
          "[kernels]") {
  SimdLevelGuard guard;
  for (int d : {64, 128}) {
    for (int64_t tokens : {1, 7, 16, 40, 97}) {
      const int64_t heads = 3;
      // Strided [T, H, D] with a gap between tokens.
      const int64_t token_stride = heads * d + 8;
      std::vector<uint16_t> f16(static_cast<size_t>(tokens * token_stride));
      std::vector<float> f32(f16.size());
      std::mt19937 rng(static_cast<uint32_t>(d + tokens));
      std::normal_distribution<float> normal(0.0f, 3.0f);
      for (size_t i = 0; i < f16.size(); ++i) {
        f16[i] = FloatToHalf(normal(rng));
        f32[i] = HalfToFloat(f16[i]);
      }
      const KvTensorView v16{f16.data(), DType::kF16, tokens, heads, d, token_stride, d};
      const KvTensorView v32{f32.data(), DType::kF32, tokens, heads, d, token_stride, d};
      std::vector<float> ref(static_cast<size_t>(tokens)), ref32(ref.size());
      ComputeTokenNormsRef(v16, ref.data());
      ComputeTokenNormsRef(v32, ref32.data());
      REQUIRE(std::memcmp(ref.data(), ref32.data(), 4 * ref.size()) == 0);
      for (SimdLevel level : Levels()) {
        INFO("simd " << SimdLevelName(level) << " d " << d << " tokens " << tokens);
        REQUIRE(SetSimdLevel(level).ok());
        std::vector<float> fast(ref.size(), -1.0f);
        ComputeTokenNorms(v16, fast.data());
        REQUIRE(std::memcmp(ref.data(), fast.data(), 4 * ref.size()) == 0);
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
