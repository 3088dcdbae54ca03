#include "kernels/quantize.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/half.h"
#include "tests/kernels/quant_test_util.h"
#include "tests/kernels/simd_levels.h"

namespace kvctl {
namespace {

using testing::BlockData;
using testing::MakeBlock;

QuantSpec Spec(QuantMethod m, int d, int kb, int vb) {
  StatusOr<QuantSpec> s = MakeQuantSpec(m, d, kb, vb);
  REQUIRE(s.ok());
  return *s;
}

uint16_t HalfAt(const std::vector<uint8_t>& rec, size_t offset) {
  return static_cast<uint16_t>(rec[offset] | (rec[offset + 1] << 8));
}

TEST_CASE("Quantize: KIVI 2-bit known answer on an 8x8 tile", "[kernels]") {
  QuantSpec spec;
  spec.method = QuantMethod::kKivi;
  spec.head_dim = 8;
  spec.k_bits = spec.v_bits = 2;
  spec.block_tokens = spec.k_group_tokens = spec.v_group_channels = 8;
  REQUIRE(ValidateQuantSpec(spec).ok());
  float k[64], v[64];
  for (int t = 0; t < 8; ++t) {
    for (int c = 0; c < 8; ++c) k[t * 8 + c] = static_cast<float>(t), v[t * 8 + c] = c - 4.0f;
  }
  const BlockLayout l = BlockLayoutOf(spec);
  REQUIRE(l.record_bytes == 96);
  std::vector<uint8_t> rec(l.record_bytes, 0xAA);
  REQUIRE(QuantizeBlockRef(spec, {k, v, 8, nullptr}, rec.data()).ok());
  // Each K channel spans tokens 0..7: scale fp16(7/3) = 0x40AB, zero 0; codes 0,0,1,1,2,2,3,3
  // packed LSB-first = 0x50, 0xFA.
  for (int c = 0; c < 8; ++c) {
    CHECK(rec[c * 2] == 0x50);
    CHECK(rec[c * 2 + 1] == 0xFA);
    CHECK(HalfAt(rec, 16 + c * 4) == 0x40AB);
    CHECK(HalfAt(rec, 16 + c * 4 + 2) == 0x0000);
  }
  // Each V token spans -4..3: same scale, zero fp16(-4) = 0xC400, same codes.
  for (int t = 0; t < 8; ++t) {
    CHECK(rec[48 + t * 2] == 0x50);
    CHECK(rec[48 + t * 2 + 1] == 0xFA);
    CHECK(HalfAt(rec, 64 + t * 4) == 0x40AB);
    CHECK(HalfAt(rec, 64 + t * 4 + 2) == 0xC400);
  }
  float ko[64], vo[64];
  DequantizeBlockRef(spec, rec.data(), nullptr, ko, vo);
  const float s = HalfToFloat(0x40AB);
  const float expect[8] = {0, 0, s, s, 2 * s, 2 * s, 3 * s, 3 * s};
  for (int t = 0; t < 8; ++t) CHECK(ko[t * 8 + 5] == expect[t]);
  for (int c = 0; c < 8; ++c) CHECK(vo[3 * 8 + c] == expect[c] - 4.0f);
}

TEST_CASE("Quantize: SIMD paths write the reference's bytes and read back its floats",
          "[kernels]") {
  if (testing::SimdLevelsUnderTest().empty()) return testing::Skip(testing::kNoSimd);
  const SimdLevel saved = ActiveSimdLevel();
  for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kKivi, QuantMethod::kQuaRot,
                        QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo}) {
    for (int bits : {2, 3, 4, 8}) {
      for (int d : {64, 128}) {
        const int b = m == QuantMethod::kFp16 ? 16 : bits;
        if (m == QuantMethod::kFp16 && bits != 2) continue;
        if (m == QuantMethod::kTurbo && bits == 8) continue;  // Its widths are 2, 3, 4.
        QuantSpec spec = Spec(m, d, b, m == QuantMethod::kFp16 ? 16 : (bits == 8 ? 2 : bits));
        if (m == QuantMethod::kKvarn) spec.block_tokens = spec.k_group_tokens = d == 64 ? 64 : 128;
        const BlockData blk = MakeBlock(spec.block_tokens, 2, d, 17 + bits + d);
        const BlockLayout l = BlockLayoutOf(spec);
        std::vector<uint8_t> ref(l.record_bytes), fast(l.record_bytes);
        REQUIRE(QuantizeBlockRef(spec, blk.Input(1), ref.data()).ok());
        const size_t n = static_cast<size_t>(spec.block_tokens) * d;
        std::vector<float> kr(n), vr(n), kf(n), vf(n);
        DequantizeBlockRef(spec, ref.data(), blk.norms.data(), kr.data(), vr.data());
        for (int level = 0; level <= static_cast<int>(DetectSimdLevel()); ++level) {
          INFO(QuantMethodName(m) << " bits " << bits << " d " << d << " simd " << level);
          REQUIRE(SetSimdLevel(static_cast<SimdLevel>(level)).ok());
          std::fill(fast.begin(), fast.end(), 0x5A);
          REQUIRE(QuantizeBlock(spec, blk.Input(1), fast.data()).ok());
          REQUIRE(std::memcmp(ref.data(), fast.data(), l.record_bytes) == 0);
          DequantizeBlock(spec, ref.data(), blk.norms.data(), kf.data(), vf.data());
          REQUIRE(std::memcmp(kr.data(), kf.data(), n * 4) == 0);
          REQUIRE(std::memcmp(vr.data(), vf.data(), n * 4) == 0);
        }
      }
    }
  }
  REQUIRE(SetSimdLevel(saved).ok());
}

double RelativeMse(const float* x, const float* y, size_t n) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) err += (x[i] - y[i]) * (x[i] - y[i]), ref += x[i] * x[i];
  return err / ref;
}

TEST_CASE("Quantize: round-trip error shrinks with bits and 8-bit is near lossless", "[kernels]") {
  for (QuantMethod m :
       {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn, QuantMethod::kOscar}) {
    double prev_k = 1e9, prev_v = 1e9;
    for (int bits : {2, 3, 4, 8}) {
      const QuantSpec spec = Spec(m, 128, bits, bits);
      const BlockData blk = MakeBlock(spec.block_tokens * 2, 4, 128, 99);
      const size_t n = static_cast<size_t>(spec.block_tokens) * 128;
      std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
      std::vector<float> ko(n), vo(n), kin(n), vin(n);
      // Second block of head 2 (skips the low-norm sink token of block 0).
      BlockInput in = blk.Input(2);
      in.k += spec.block_tokens * in.row_stride;
      in.v += spec.block_tokens * in.row_stride;
      in.token_norms += spec.block_tokens;
      for (int t = 0; t < spec.block_tokens; ++t) {
        std::memcpy(&kin[t * 128], in.k + t * in.row_stride, 128 * 4);
        std::memcpy(&vin[t * 128], in.v + t * in.row_stride, 128 * 4);
      }
      REQUIRE(QuantizeBlock(spec, in, rec.data()).ok());
      DequantizeBlock(spec, rec.data(), in.token_norms, ko.data(), vo.data());
      const double ek = RelativeMse(kin.data(), ko.data(), n);
      const double ev = RelativeMse(vin.data(), vo.data(), n);
      INFO(QuantMethodName(m) << " " << bits << " bits: K " << ek << " V " << ev);
      CHECK(ek < prev_k);
      CHECK(ev < prev_v);
      // Uniform-quantizer bounds with generous room for heavy tails: error ~ 4^-bits.
      CHECK(ek < 0.6 * std::pow(4.0, -bits) * 8);
      CHECK(ev < 0.6 * std::pow(4.0, -bits) * 8);
      if (bits == 8) {
        CHECK(ek < 1e-4);
        CHECK(ev < 1e-4);
      }
      prev_k = ek;
      prev_v = ev;
    }
  }
}

TEST_CASE("Quantize: a record assembled from other records' tokens decodes to those tokens",
          "[kernels]") {
  // Token-separable methods: token t of the assembled record is token src[t] of record a or b,
  // copied byte for byte, and decodes to exactly the rows it decoded to there, whatever its new
  // neighbours (what eviction's compaction relies on to move kept tokens without quantizing them
  // again). The assembled bytes also equal a record encoded from those tokens' inputs where the
  // encoder is per token (it is: each token's codes and scale come from its own row).
  for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kQuaRot, QuantMethod::kTurbo}) {
    for (int d : {64, 128}) {
      for (auto [kb, vb] : {std::pair{2, 3}, std::pair{4, 2}, std::pair{16, 16}}) {
        if ((m == QuantMethod::kFp16) != (kb == 16)) continue;
        const QuantSpec spec = Spec(m, d, kb, vb);
        INFO(QuantMethodName(m) << " D " << d << " K" << kb << " V" << vb);
        REQUIRE(TokenSeparable(m));
        const BlockLayout l = BlockLayoutOf(spec);
        const int g = spec.block_tokens;
        const BlockData blk = MakeBlock(2 * g, 1, d, 7);
        const size_t n = static_cast<size_t>(g) * d;
        std::vector<uint8_t> a(l.record_bytes), b(l.record_bytes), out(l.record_bytes, 0);
        REQUIRE(QuantizeBlock(spec, blk.Input(0), a.data()).ok());
        BlockInput second = blk.Input(0);
        second.k += n, second.v += n;
        REQUIRE(QuantizeBlock(spec, second, b.data()).ok());
        // Token t of `out`: token (5 t + 3) mod g of a for even t, of b for odd t.
        std::vector<float> ka(n), va(n), kb_rows(n), vb_rows(n), ko(n), vo(n);
        DequantizeBlock(spec, a.data(), nullptr, ka.data(), va.data());
        DequantizeBlock(spec, b.data(), nullptr, kb_rows.data(), vb_rows.data());
        std::vector<float> kin(n), vin(n);
        for (int t = 0; t < g; ++t) {
          const int src = (5 * t + 3) % g;
          CopyRecordToken(spec, l, t % 2 == 0 ? a.data() : b.data(), src, out.data(), t);
          const size_t from = (static_cast<size_t>(t % 2) * g + src) * d;
          std::memcpy(&kin[t * d], blk.kv.k.data() + from, d * 4);
          std::memcpy(&vin[t * d], blk.kv.v.data() + from, d * 4);
        }
        DequantizeBlock(spec, out.data(), nullptr, ko.data(), vo.data());
        for (int t = 0; t < g; ++t) {
          const int src = (5 * t + 3) % g;
          const std::vector<float>& ks = t % 2 == 0 ? ka : kb_rows;
          const std::vector<float>& vs = t % 2 == 0 ? va : vb_rows;
          CHECK(std::memcmp(&ko[t * d], &ks[src * d], d * 4) == 0);
          CHECK(std::memcmp(&vo[t * d], &vs[src * d], d * 4) == 0);
        }
        std::vector<uint8_t> encoded(l.record_bytes);
        REQUIRE(QuantizeBlock(spec, {kin.data(), vin.data(), d, nullptr}, encoded.data()).ok());
        CHECK(encoded == out);
      }
    }
  }
  CHECK_FALSE(TokenSeparable(QuantMethod::kKivi));
  CHECK_FALSE(TokenSeparable(QuantMethod::kKvarn));
  CHECK_FALSE(TokenSeparable(QuantMethod::kOscar));
}

}  // namespace
}  // namespace kvctl
