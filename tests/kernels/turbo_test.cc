// TurboQuant (docs/algorithms.md §20): the Lloyd-Max codebooks against published known answers,
// the record layout, and the round trip of the scalar reference against the paper's distortion.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "kernels/quant_block.h"
#include "kernels/quantize.h"
#include "kernels/turbo_codebook.h"

namespace kvctl {
namespace {

QuantSpec TurboSpec(int d, int kb, int vb) {
  StatusOr<QuantSpec> s = MakeQuantSpec(QuantMethod::kTurbo, d, kb, vb);
  REQUIRE(s.ok());
  return *s;
}

// Positive half of the Gaussian Lloyd-Max quantizer, sigma = 1, and its MSE (Max 1960, Table I;
// the values every later table repeats).
struct KnownGaussian {
  int bits;
  std::vector<double> positive_centroids;
  double mse;
};

TEST_CASE("Turbo: Gaussian Lloyd-Max codebooks match the published tables", "[kernels]") {
  const KnownGaussian known[] = {
      {1, {0.7979}, 0.3634},
      {2, {0.4528, 1.510}, 0.1175},
      {3, {0.2451, 0.7560, 1.344, 2.152}, 0.03454},
      {4, {0.1284, 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733}, 0.009497},
  };
  for (const KnownGaussian& k : known) {
    INFO("bits " << k.bits);
    const LloydMaxResult r = LloydMax(CoordinateDensity::kGaussian, 0, k.bits);
    const int n = 1 << k.bits;
    REQUIRE(static_cast<int>(r.centroids.size()) == n);
    for (int i = 0; i < n / 2; ++i) {
      CHECK(r.centroids[n / 2 + i] == Approx(k.positive_centroids[i]).margin(1.5e-3));
      CHECK(r.centroids[n / 2 - 1 - i] == -r.centroids[n / 2 + i]);
    }
    CHECK(r.mse == Approx(k.mse).epsilon(5e-3));
    CHECK(r.iterations < 200000);  // Converged, did not run out of steps.
  }
}

TEST_CASE("Turbo: sphere codebooks approach the Gaussian's and give the paper's distortion",
          "[kernels]") {
  // d * (per-coordinate MSE) is the expected ||x - x_hat||^2 of a unit vector: the paper's
  // D_mse ≈ 0.36, 0.117, 0.03, 0.009 for b = 1..4 (Gaussian limit 0.3634 ... 0.009497).
  // The gap to the Gaussian limit is a finite-d effect (3.3 % at d = 64, 3 and 4 bits): it must
  // shrink as d grows.
  const double paper[5] = {0, 0.3634, 0.1175, 0.03454, 0.009497};
  for (int bits = 1; bits <= 4; ++bits) {
    double prev_gap = 1.0;
    for (int d : {64, 128, 256}) {
      INFO("d " << d << " bits " << bits);
      const LloydMaxResult r = LloydMax(CoordinateDensity::kSphere, d, bits);
      CHECK(d * r.mse == Approx(paper[bits]).epsilon(0.04));
      const double gap = std::abs(d * r.mse / paper[bits] - 1.0);
      CHECK(gap < prev_gap);
      prev_gap = gap;
      const LloydMaxResult gauss = LloydMax(CoordinateDensity::kGaussian, 0, bits);
      const int n = 1 << bits;
      for (int i = 0; i < n; ++i) {
        CHECK(r.centroids[i] * std::sqrt(d) == Approx(gauss.centroids[i]).epsilon(0.04));
      }
    }
  }
  // Small d: the Beta density is visibly narrower than the Gaussian in the tails.
  const LloydMaxResult d8 = LloydMax(CoordinateDensity::kSphere, 8, 2);
  CHECK(d8.centroids[3] < 1.0);
  CHECK(d8.centroids[3] * std::sqrt(8.0) < 1.510);
}

TEST_CASE("Turbo: fp32 tables are sorted, antisymmetric, with midpoint bounds", "[kernels]") {
  for (int d : {8, 16, 32, 64, 128, 256}) {
    for (int bits = 1; bits <= 4; ++bits) {
      INFO("d " << d << " bits " << bits);
      const TurboCodebook& cb = TurboCodebookFor(d, bits);
      const int n = 1 << bits;
      for (int i = 0; i + 1 < n; ++i) {
        CHECK(cb.centroid[i] < cb.centroid[i + 1]);
        CHECK(cb.bound[i] == 0.5f * (cb.centroid[i] + cb.centroid[i + 1]));
        CHECK(block::TurboCode(cb.centroid[i], cb, bits) == static_cast<uint32_t>(i));
        CHECK(block::TurboCode(cb.bound[i], cb, bits) == static_cast<uint32_t>(i));  // Tie: down.
      }
      for (int i = 0; i < n; ++i) CHECK(cb.centroid[i] == -cb.centroid[n - 1 - i]);
      for (int i = n; i < 16; ++i) CHECK(cb.centroid[i] == 0.0f);
      CHECK(block::TurboCode(-2.0f, cb, bits) == 0u);
      CHECK(block::TurboCode(2.0f, cb, bits) == static_cast<uint32_t>(n - 1));
    }
  }
}

TEST_CASE("Turbo: registry entry, validation and record layout", "[kernels]") {
  StatusOr<QuantMethod> m = ParseQuantMethod("turbo");
  REQUIRE(m.ok());
  CHECK(*m == QuantMethod::kTurbo);
  CHECK(QuantMethodName(QuantMethod::kTurbo) == "turbo");
  CHECK(TraitsOf(QuantMethod::kTurbo).rotates);
  CHECK(!TraitsOf(QuantMethod::kTurbo).needs_token_norms);
  StatusOr<QuantSpec> bad = MakeQuantSpec(QuantMethod::kTurbo, 128, 8, 8);
  REQUIRE(!bad.ok());
  CHECK(bad.status().message() == "k_bits: got 8, expected one of {2, 3, 4} for turbo");
  bad = MakeQuantSpec(QuantMethod::kTurbo, 96, 2, 2);
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("power of two") != std::string::npos);
  // d 128, 3 bits, G 32: K codes 32 x 48 B, K norms 32 x 2 B, the same for V.
  const BlockLayout l = BlockLayoutOf(TurboSpec(128, 3, 3));
  CHECK(l.k_codes_bytes == 1536);
  CHECK(l.k_meta_offset == 1536);
  CHECK(l.k_meta_bytes == 64);
  CHECK(l.v_codes_offset == 1600);
  CHECK(l.v_meta_offset == 3136);
  CHECK(l.record_bytes == 3200);
  CHECK(l.side_bytes_per_token == 0);
  CHECK(BitsPerElement(TurboSpec(128, 3, 3), 8).average == Approx(3.125));
  CHECK(BitsPerElement(TurboSpec(64, 2, 2), 8).average == Approx(2.25));
  CHECK(std::memcmp(&l.turbo_k, &TurboCodebookFor(128, 3), sizeof(TurboCodebook)) == 0);
  const BlockLayout kivi = BlockLayoutOf(*MakeQuantSpec(QuantMethod::kKivi, 128, 2, 2));
  CHECK(kivi.turbo_k.centroid[0] == 0.0f);
}

TEST_CASE("Turbo: the random signs are fixed and balanced", "[kernels]") {
  int negative = 0;
  for (int c = 0; c < 256; ++c) negative += block::TurboSignNegative(c) ? 1 : 0;
  CHECK(negative > 100);
  CHECK(negative < 156);
  // Pinned: a change of the signs changes every stored record.
  uint32_t first32 = 0;
  for (int c = 0; c < 32; ++c) first32 |= (block::TurboSignNegative(c) ? 1u : 0u) << c;
  CHECK(first32 == 0xA18494A5u);
}

// Rows of `tokens` Gaussian vectors (a uniform direction) with norms spread over 1e-2 .. 1e2.
std::vector<float> RandomRows(int tokens, int d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-2.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(tokens) * d);
  for (int t = 0; t < tokens; ++t) {
    const float s = std::pow(10.0f, log_scale(rng));
    for (int c = 0; c < d; ++c) x[t * d + c] = s * n01(rng);
  }
  return x;
}

TEST_CASE("Turbo: round trip distortion per bit matches the codebook's, for any norm",
          "[kernels]") {
  const double paper[5] = {0, 0.3634, 0.1175, 0.03454, 0.009497};
  for (int d : {64, 128}) {
    for (int bits : {2, 3, 4}) {
      INFO("d " << d << " bits " << bits);
      const QuantSpec spec = TurboSpec(d, bits, bits);
      const BlockLayout l = BlockLayoutOf(spec);
      const int g = spec.block_tokens;
      double sum_k = 0, sum_v = 0;
      int rows = 0;
      for (int b = 0; b < 64; ++b) {  // 2,048 vectors per K and V.
        const std::vector<float> k = RandomRows(g, d, 1000 + b + 97 * bits + d);
        const std::vector<float> v = RandomRows(g, d, 5000 + b + 97 * bits + d);
        std::vector<uint8_t> rec(l.record_bytes);
        REQUIRE(QuantizeBlockRef(spec, {k.data(), v.data(), d, nullptr}, rec.data()).ok());
        std::vector<float> ko(k.size()), vo(v.size());
        DequantizeBlockRef(spec, rec.data(), nullptr, ko.data(), vo.data());
        for (int t = 0; t < g; ++t) {
          double ek = 0, ev = 0, nk = 0, nv = 0;
          for (int c = 0; c < d; ++c) {
            const int i = t * d + c;
            ek += (k[i] - ko[i]) * (k[i] - ko[i]), nk += k[i] * k[i];
            ev += (v[i] - vo[i]) * (v[i] - vo[i]), nv += v[i] * v[i];
          }
          sum_k += ek / nk, sum_v += ev / nv;
          ++rows;
          // K's stored scale is the least-squares one for the row's codes: x . x^ / x^ . x^ of
          // the decoded row (the rotation is orthonormal) is 1 up to the fp16 rounding of a.
          // V's is the unbiased one: x . x^ / x . x is 1, x^'s component along x is x.
          double kh = 0, hh = 0, vh = 0;
          for (int c = 0; c < d; ++c) {
            const int i = t * d + c;
            kh += static_cast<double>(k[i]) * ko[i], hh += static_cast<double>(ko[i]) * ko[i];
            vh += static_cast<double>(v[i]) * vo[i];
          }
          CHECK(kh / hh == Approx(1.0).epsilon(2e-3));
          CHECK(vh / nv == Approx(1.0).epsilon(2e-3));
        }
      }
      // The unbiased scale is the least-squares one over cos^2 of the angle between the rotated
      // row and its centroids, so V's error is D / (1 - D) for K's D (the orthogonal error
      // sin^2 plus the overshoot along x, over cos^2).
      const double mse = d * LloydMax(CoordinateDensity::kSphere, d, bits).mse;
      CHECK(sum_k / rows == Approx(mse).epsilon(0.08));
      CHECK(sum_v / rows == Approx(mse / (1 - mse)).epsilon(0.08));
      CHECK(sum_k / rows == Approx(paper[bits]).epsilon(0.1));
    }
  }
}

TEST_CASE("Turbo: re-encoding a decoded record changes nothing", "[kernels]") {
  // Eviction's compaction decodes kept tokens and quantizes them again (docs/budgets.md); a
  // token may pass through that ten times. Storing ||x|| made each pass shrink the row by
  // ||c[code]|| (~0.94 at 2 bits); either scale rule (K least squares, V unbiased) makes the
  // pass a fixed point.
  for (int bits : {2, 3, 4}) {
    INFO("bits " << bits);
    const int d = 64;
    const QuantSpec spec = TurboSpec(d, bits, bits);
    const BlockLayout l = BlockLayoutOf(spec);
    const int g = spec.block_tokens;
    const std::vector<float> k = RandomRows(g, d, 41 + bits), v = RandomRows(g, d, 43 + bits);
    std::vector<uint8_t> first(l.record_bytes), again(l.record_bytes);
    REQUIRE(QuantizeBlockRef(spec, {k.data(), v.data(), d, nullptr}, first.data()).ok());
    std::vector<float> ko(k.size()), vo(v.size());
    DequantizeBlockRef(spec, first.data(), nullptr, ko.data(), vo.data());
    double first_norm = 0;
    for (float x : ko) first_norm += static_cast<double>(x) * x;
    for (int pass = 0; pass < 10; ++pass) {
      REQUIRE(QuantizeBlockRef(spec, {ko.data(), vo.data(), d, nullptr}, again.data()).ok());
      CHECK(std::memcmp(first.data(), again.data(), l.record_bytes) == 0);
      DequantizeBlockRef(spec, again.data(), nullptr, ko.data(), vo.data());
    }
    double norm = 0;
    for (float x : ko) norm += static_cast<double>(x) * x;
    CHECK(norm == Approx(first_norm).epsilon(1e-6));
  }
}

TEST_CASE("Turbo: scaled rows share codes, zero rows decode to zero", "[kernels]") {
  const int d = 64;
  const QuantSpec spec = TurboSpec(d, 3, 2);
  const BlockLayout l = BlockLayoutOf(spec);
  const int g = spec.block_tokens;
  std::vector<float> k = RandomRows(g, d, 7), v = RandomRows(g, d, 8);
  for (int c = 0; c < d; ++c) k[5 * d + c] = 0.0f, v[6 * d + c] = 0.0f;
  std::vector<float> k4(k), v4(v);
  for (float& x : k4) x *= 4.0f;  // A power of two: the unit-norm frame is bit-identical.
  for (float& x : v4) x *= 4.0f;
  std::vector<uint8_t> a(l.record_bytes), b(l.record_bytes);
  REQUIRE(QuantizeBlockRef(spec, {k.data(), v.data(), d, nullptr}, a.data()).ok());
  REQUIRE(QuantizeBlockRef(spec, {k4.data(), v4.data(), d, nullptr}, b.data()).ok());
  CHECK(std::memcmp(a.data(), b.data(), l.k_meta_offset) == 0);  // K codes.
  CHECK(std::memcmp(a.data() + l.v_codes_offset, b.data() + l.v_codes_offset, l.v_codes_bytes) ==
        0);
  std::vector<float> ko(k.size()), vo(v.size());
  DequantizeBlockRef(spec, a.data(), nullptr, ko.data(), vo.data());
  for (int c = 0; c < d; ++c) {
    CHECK(ko[5 * d + c] == 0.0f);
    CHECK(vo[6 * d + c] == 0.0f);
  }
}

TEST_CASE("Turbo: norms beyond fp16 and non-finite input are named errors", "[kernels]") {
  const int d = 64;
  const QuantSpec spec = TurboSpec(d, 2, 2);
  std::vector<float> k(static_cast<size_t>(spec.block_tokens) * d, 1.0f), v(k);
  std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
  for (int c = 0; c < d; ++c) k[3 * d + c] = 9000.0f;  // ||x|| = 72,000 > 65504.
  Status s = QuantizeBlock(spec, {k.data(), v.data(), d, nullptr}, rec.data());
  REQUIRE(!s.ok());
  CHECK(s.message().find("fp16 range") != std::string::npos);
  CHECK(s.message().find("turbo") != std::string::npos);
  k[3 * d + 7] = NAN;
  s = QuantizeBlock(spec, {k.data(), v.data(), d, nullptr}, rec.data());
  REQUIRE(!s.ok());
  CHECK(s.message() == "k: element (token 3, channel 7) is nan, expected a finite value");
}

}  // namespace
}  // namespace kvctl
