#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/half.h"
#include "kernels/quantize.h"

namespace kvctl {
namespace {

QuantSpec Spec(QuantMethod m, int d, int kb, int vb) {
  StatusOr<QuantSpec> s = MakeQuantSpec(m, d, kb, vb);
  REQUIRE(s.ok());
  return *s;
}

struct Tile {
  std::vector<float> k, v, norms;
  Tile(int g, int d, float fill) : k(g * d, fill), v(g * d, fill), norms(g, 1.0f) {}
};

const QuantMethod kQuantizers[] = {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn,
                                   QuantMethod::kOscar};

// Quantizes with both paths, checks they agree, returns the dequantized K and V.
void RoundTrip(const QuantSpec& spec, const Tile& in, std::vector<float>* ko,
               std::vector<float>* vo) {
  const BlockLayout l = BlockLayoutOf(spec);
  std::vector<uint8_t> a(l.record_bytes), b(l.record_bytes);
  const BlockInput bin{in.k.data(), in.v.data(), spec.head_dim, in.norms.data()};
  REQUIRE(QuantizeBlockRef(spec, bin, a.data()).ok());
  REQUIRE(QuantizeBlock(spec, bin, b.data()).ok());
  REQUIRE(a == b);
  ko->resize(in.k.size());
  vo->resize(in.v.size());
  DequantizeBlock(spec, a.data(), in.norms.data(), ko->data(), vo->data());
}

TEST_CASE("Quantize edge: constant and all-zero groups reconstruct (exactly without rotation)",
          "[kernels]") {
  for (QuantMethod m : kQuantizers) {
    const QuantSpec spec = Spec(m, 64, 2, 2);
    for (float fill : {0.0f, 1.5f, -3.25f}) {
      Tile tile(spec.block_tokens, 64, fill);
      std::vector<float> ko, vo;
      RoundTrip(spec, tile, &ko, &vo);
      INFO(QuantMethodName(m) << " fill " << fill);
      // KIVI's constant groups are exact (fp16 zero, zero scale). Rotated methods see a constant
      // row as one spike of fill * sqrt(D) after the Hadamard; fp16 rounding of its scale leaves
      // an error of a few 1e-3 of the spike, spread back over the row.
      const float tol = m == QuantMethod::kKivi ? 0.0f : 0.03f * (1 + std::fabs(fill));
      for (size_t i = 0; i < ko.size(); ++i) {
        REQUIRE(std::fabs(ko[i] - fill) <= tol);
        REQUIRE(std::fabs(vo[i] - fill) <= tol);
      }
    }
  }
}

TEST_CASE("Quantize edge: a tiny-norm sink token next to large tokens", "[kernels]") {
  // OScaR's token scaling keeps the sink's relative error small; KIVI's per-channel groups crush
  // it (docs/algorithms.md §7.1). Both must stay finite and exact in shape.
  const int g = 32, d = 64;
  Tile tile(g, d, 0.0f);
  for (int t = 0; t < g; ++t) {
    for (int c = 0; c < d; ++c) {
      const float s = t == 0 ? 1e-3f : 10.0f;
      tile.k[t * d + c] = s * std::sin(0.37f * c + 0.11f * t);
      tile.v[t * d + c] = s * std::cos(0.23f * c - 0.07f * t);
    }
  }
  KvTensorView kview = KvTensorView::Contiguous(tile.k.data(), DType::kF32, g, 1, d);
  ComputeTokenNorms(kview, tile.norms.data());
  auto sink_error = [&](QuantMethod m) {
    std::vector<float> ko, vo;
    RoundTrip(Spec(m, d, 2, 2), tile, &ko, &vo);
    double err = 0, ref = 0;
    for (int c = 0; c < d; ++c)
      err += std::pow(ko[c] - tile.k[c], 2), ref += std::pow(tile.k[c], 2);
    return std::sqrt(err / ref);
  };
  const double oscar = sink_error(QuantMethod::kOscar);
  const double kivi = sink_error(QuantMethod::kKivi);
  CHECK(std::isfinite(oscar));
  CHECK(oscar < 0.5);
  CHECK(kivi > 10 * oscar);
}

TEST_CASE("Quantize edge: huge dynamic range stays finite or errors clearly", "[kernels]") {
  for (QuantMethod m : kQuantizers) {
    const QuantSpec spec = Spec(m, 64, 4, 4);
    Tile tile(spec.block_tokens, 64, 0.0f);
    for (size_t i = 0; i < tile.k.size(); ++i) {
      tile.k[i] = (i % 7 == 0 ? 3e4f : 1e-4f) * (i % 2 ? 1.0f : -1.0f);
      tile.v[i] = (i % 5 == 0 ? -2e4f : 3e-5f);
    }
    KvTensorView kview =
        KvTensorView::Contiguous(tile.k.data(), DType::kF32, spec.block_tokens, 1, 64);
    ComputeTokenNorms(kview, tile.norms.data());
    std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
    Status s =
        QuantizeBlock(spec, {tile.k.data(), tile.v.data(), 64, tile.norms.data()}, rec.data());
    INFO(QuantMethodName(m) << ": " << s.ToString());
    if (s.ok()) {
      std::vector<float> ko(tile.k.size()), vo(tile.v.size());
      DequantizeBlock(spec, rec.data(), tile.norms.data(), ko.data(), vo.data());
      for (size_t i = 0; i < ko.size(); ++i)
        REQUIRE((std::isfinite(ko[i]) && std::isfinite(vo[i])));
    } else {
      CHECK(s.message().find("fp16 range") != std::string::npos);
    }
  }
  // Beyond fp16 entirely: every method must refuse rather than store Inf.
  const QuantSpec spec = Spec(QuantMethod::kKivi, 64, 2, 2);
  Tile tile(spec.block_tokens, 64, 1e6f);
  tile.k[3] = -1e6f;
  std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
  Status s = QuantizeBlock(spec, {tile.k.data(), tile.v.data(), 64, nullptr}, rec.data());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("fp16 range") != std::string::npos);
}

TEST_CASE("Quantize edge: NaN, Inf, null pointers and missing norms are named errors",
          "[kernels]") {
  const QuantSpec spec = Spec(QuantMethod::kQuaRot, 64, 2, 2);
  Tile tile(spec.block_tokens, 64, 1.0f);
  std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
  tile.v[5 * 64 + 9] = std::numeric_limits<float>::quiet_NaN();
  Status s = QuantizeBlock(spec, {tile.k.data(), tile.v.data(), 64, nullptr}, rec.data());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("v: element (token 5, channel 9) is nan") != std::string::npos);
  tile.v[5 * 64 + 9] = 0;
  tile.k[0] = std::numeric_limits<float>::infinity();
  s = QuantizeBlockRef(spec, {tile.k.data(), tile.v.data(), 64, nullptr}, rec.data());
  CHECK(s.message().find("k: element (token 0, channel 0) is inf") != std::string::npos);
  s = QuantizeBlock(spec, {nullptr, tile.v.data(), 64, nullptr}, rec.data());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  s = QuantizeBlock(spec, {tile.k.data(), tile.v.data(), 32, nullptr}, rec.data());
  CHECK(s.message().find("row_stride: got 32") != std::string::npos);
  const QuantSpec oscar = Spec(QuantMethod::kOscar, 64, 2, 2);
  tile.k[0] = 1;
  std::vector<uint8_t> rec2(BlockLayoutOf(oscar).record_bytes);
  s = QuantizeBlock(oscar, {tile.k.data(), tile.v.data(), 64, nullptr}, rec2.data());
  CHECK(s.message().find("token_norms") != std::string::npos);
  tile.norms[3] = 0.0f;
  s = QuantizeBlock(oscar, {tile.k.data(), tile.v.data(), 64, tile.norms.data()}, rec2.data());
  CHECK(s.message().find("token_norms[3]: got 0") != std::string::npos);
}

TEST_CASE("Quantize edge: fp16 method is exact for fp16-representable input", "[kernels]") {
  const QuantSpec spec = Spec(QuantMethod::kFp16, 64, 16, 16);
  Tile tile(spec.block_tokens, 64, 0.0f);
  for (size_t i = 0; i < tile.k.size(); ++i) {
    tile.k[i] = RoundToHalf(std::sin(static_cast<float>(i)) * 100);
    tile.v[i] = RoundToHalf(std::cos(static_cast<float>(i)));
  }
  std::vector<float> ko, vo;
  RoundTrip(spec, tile, &ko, &vo);
  CHECK(ko == tile.k);
  CHECK(vo == tile.v);
}

TEST_CASE("Quantize edge: garbage records decode without faults", "[kernels]") {
  for (QuantMethod m : kQuantizers) {
    const QuantSpec spec = Spec(m, 64, 3, 2);
    std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
    for (size_t i = 0; i < rec.size(); ++i) rec[i] = static_cast<uint8_t>(i * 131 + 7);
    std::vector<float> ko(spec.block_tokens * 64), vo(ko.size()), norms(spec.block_tokens, 2.0f);
    DequantizeBlock(spec, rec.data(), norms.data(), ko.data(), vo.data());
    DequantizeBlockRef(spec, rec.data(), norms.data(), ko.data(), vo.data());
    SUCCEED();
  }
}

}  // namespace
}  // namespace kvctl
