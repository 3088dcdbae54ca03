#include "kernels/attention.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/half.h"
#include "kernels/quantize.h"
#include "tests/kernels/attention_cases.h"
#include "tests/kernels/simd_levels.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

using testing::HeadCache;
using testing::MakeHeadCache;
using testing::SimdLevelsUnderTest;
using testing::Skip;
using testing::Spec;

float LoadElement(DType dt, const uint8_t* p) {
  if (dt == DType::kF32) {
    float x;
    memcpy(&x, p, 4);
    return x;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  return dt == DType::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

// The oracle: every record through DequantizeBlockRef, the window as stored, then softmax
// attention in fp64.
struct Reference {
  std::vector<double> out, lse;
};

Reference Oracle(const HeadCache& hc) {
  const int d = hc.spec.head_dim, gt = hc.spec.block_tokens;
  std::vector<float> k, v;
  std::vector<float> kb(static_cast<size_t>(gt) * d), vb(kb.size());
  for (size_t r = 0; r < hc.records.size(); ++r) {
    DequantizeBlockRef(hc.spec, hc.records[r].data(), hc.norms[r].data(), kb.data(), vb.data());
    k.insert(k.end(), kb.begin(), kb.end());
    v.insert(v.end(), vb.begin(), vb.end());
  }
  const size_t es = DTypeSize(hc.window_dtype);
  for (int64_t w = 0; w < hc.window_rows; ++w) {
    for (int c = 0; c < d; ++c) {
      const size_t e = (static_cast<size_t>(w) * 2 + 1) * d + c;
      k.push_back(LoadElement(hc.window_dtype, &hc.window_k[e * es]));
      v.push_back(LoadElement(hc.window_dtype, &hc.window_v[e * es]));
    }
  }
  const size_t n = k.size() / d;
  Reference ref;
  ref.out.assign(static_cast<size_t>(hc.group) * d, 0.0);
  ref.lse.assign(hc.group, -INFINITY);
  for (int i = 0; i < hc.group; ++i) {
    if (n == 0) continue;
    std::vector<double> s(n);
    double m = -INFINITY;
    for (size_t t = 0; t < n; ++t) {
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += static_cast<double>(hc.q[i * d + c]) * k[t * d + c];
      s[t] = dot * hc.scale;
      m = std::max(m, s[t]);
    }
    double sum = 0;
    for (size_t t = 0; t < n; ++t) sum += (s[t] = std::exp(s[t] - m));
    for (size_t t = 0; t < n; ++t) {
      for (int c = 0; c < d; ++c) ref.out[i * d + c] += s[t] / sum * v[t * d + c];
    }
    ref.lse[i] = m + std::log(sum);
  }
  return ref;
}

struct Result {
  std::vector<float> out, lse;
  AttentionResult View() { return {out.data(), lse.data()}; }
};

Result Alloc(const HeadCache& hc) {
  return {std::vector<float>(static_cast<size_t>(hc.group) * hc.spec.head_dim),
          std::vector<float>(hc.group)};
}

// max |out - ref| / max |ref| over all rows and the worst |lse - ref| / max(1, |ref|).
struct Errors {
  double out = 0, lse = 0;
};

template <class A, class B>
Errors Compare(const A& out, const A& lse, const B& ref_out, const B& ref_lse) {
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref_out[i])));
    max_err = std::max(max_err, std::fabs(out[i] - static_cast<double>(ref_out[i])));
  }
  Errors e;
  e.out = max_ref > 0 ? max_err / max_ref : max_err;
  for (size_t i = 0; i < lse.size(); ++i) {
    const double r = ref_lse[i];
    e.lse = std::max(e.lse, std::fabs(lse[i] - r) / std::max(1.0, std::fabs(r)));
  }
  return e;
}

constexpr double kOracleTol = 1e-4;  // fused fp32 vs dequantize + fp64 attention.
constexpr double kSimdTol = 5e-5;    // SIMD vs scalar reference (two fp32 orders).
constexpr double kSplitTol = 2e-5;   // split-K + merge vs single pass.

struct Shape {
  const char* name;
  int sinks, records, tail;
};

// Worst errors seen, for the summary line.
struct Worst {
  double ref = 0, simd_oracle = 0, simd_ref = 0;
};

// Scalar reference and every level of `levels` (SimdLevelsUnderTest) against the oracle, and SIMD
// against scalar.
void CheckAgainstOracle(const HeadCache& hc, const std::vector<SimdLevel>& levels, Worst* worst) {
  const Reference ref = Oracle(hc);
  Result r = Alloc(hc);
  REQUIRE(DecodeAttentionRef(hc.spec, hc.Kv(), hc.Query(), r.View()).ok());
  const Errors er = Compare(r.out, r.lse, ref.out, ref.lse);
  CHECK(er.out <= kOracleTol);
  CHECK(er.lse <= kOracleTol);
  worst->ref = std::max({worst->ref, er.out, er.lse});
  const SimdLevel saved = ActiveSimdLevel();
  for (SimdLevel level : levels) {
    INFO("simd level " << SimdLevelName(level));
    REQUIRE(SetSimdLevel(level).ok());
    Result f = Alloc(hc);
    REQUIRE(DecodeAttention(hc.spec, hc.Kv(), hc.Query(), f.View()).ok());
    const Errors ef = Compare(f.out, f.lse, ref.out, ref.lse);
    const Errors es = Compare(f.out, f.lse, r.out, r.lse);
    CHECK(ef.out <= kOracleTol);
    CHECK(ef.lse <= kOracleTol);
    CHECK(es.out <= kSimdTol);
    CHECK(es.lse <= kSimdTol);
    worst->simd_oracle = std::max({worst->simd_oracle, ef.out, ef.lse});
    worst->simd_ref = std::max({worst->simd_ref, es.out, es.lse});
  }
  REQUIRE(SetSimdLevel(saved).ok());
}

TEST_CASE("Attention: fused equals dequantize-then-attend for every method, width and shape",
          "[kernels]") {
  // records = -1: "many" (9 records of 32 tokens or 4 of 128).
  const Shape shapes[] = {{"window only (tail)", 0, 0, 37},
                          {"sinks + tail", 5, 0, 20},
                          {"one record", 0, 1, 0},
                          {"sinks + one record + tail", 3, 1, 13},
                          {"sinks + many records + tail", 7, -1, 29}};
  const DType dtypes[] = {DType::kF16, DType::kF32, DType::kBF16};
  // The scalar kernel against the oracle runs on every CPU; the SIMD comparisons where it has them.
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  Worst worst;
  for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kKivi, QuantMethod::kQuaRot,
                        QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo}) {
    for (int bits : {2, 3, 4, 8}) {
      if (m == QuantMethod::kFp16 && bits != 2) continue;
      if (m == QuantMethod::kTurbo && bits == 8) continue;  // Its widths are 2, 3, 4.
      const int b = m == QuantMethod::kFp16 ? 16 : bits;
      for (int d : {64, 128}) {
        const QuantSpec spec = Spec(m, d, b, b);
        const int many = spec.block_tokens >= 128 ? 4 : 9;
        int si = 0;
        for (const Shape& sh : shapes) {
          for (int group : {1, 3, 4}) {
            const int records = sh.records < 0 ? many : sh.records;
            const DType dt = dtypes[(si + group) % 3];
            INFO(QuantMethodName(m) << " bits " << b << " d " << d << " " << sh.name << " g "
                                    << group << " window " << DTypeName(dt));
            CheckAgainstOracle(
                MakeHeadCache(spec, group, sh.sinks, records, sh.tail, dt, 100 + bits * 7 + d + si),
                levels, &worst);
          }
          ++si;
        }
      }
    }
  }
  WARN("worst relative error: scalar vs oracle " << worst.ref << ", SIMD vs oracle "
                                                 << worst.simd_oracle << ", SIMD vs scalar "
                                                 << worst.simd_ref);
}

TEST_CASE("Attention: mixed widths, odd geometries and larger groups agree with the oracle",
          "[kernels]") {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  Worst worst;
  for (QuantMethod m : {QuantMethod::kKivi, QuantMethod::kQuaRot, QuantMethod::kKvarn,
                        QuantMethod::kOscar, QuantMethod::kTurbo}) {
    for (int d : {64, 128}) {
      INFO(QuantMethodName(m) << " k4v2 d " << d << " g 8");
      CheckAgainstOracle(MakeHeadCache(Spec(m, d, 4, 2), 8, 5, 3, 11, DType::kF16, 7 + d), levels,
                         &worst);
      INFO(QuantMethodName(m) << " k2v4 d " << d << " g 6");
      CheckAgainstOracle(MakeHeadCache(Spec(m, d, 2, 4), 6, 0, 2, 0, DType::kF32, 9 + d), levels,
                         &worst);
    }
  }
  // Widths that are not a multiple of 16 lanes: the AVX-512 primitives' 8-wide tails.
  QuantSpec kivi;
  kivi.method = QuantMethod::kKivi;
  kivi.head_dim = kivi.block_tokens = 24;
  kivi.k_bits = 3;
  kivi.v_bits = 2;
  kivi.k_group_tokens = kivi.v_group_channels = 8;
  REQUIRE(ValidateQuantSpec(kivi).ok());
  CheckAgainstOracle(MakeHeadCache(kivi, 5, 2, 3, 9, DType::kBF16, 21), levels, &worst);
  QuantSpec quarot = kivi;
  quarot.method = QuantMethod::kQuaRot;
  quarot.head_dim = quarot.block_tokens = 8;
  quarot.k_bits = 8;
  quarot.v_bits = 3;
  REQUIRE(ValidateQuantSpec(quarot).ok());
  CheckAgainstOracle(MakeHeadCache(quarot, 2, 1, 4, 3, DType::kF32, 22), levels, &worst);
}

TEST_CASE(
    "Attention: KIVI and OScaR record geometries of the SIMD record path agree with the oracle",
    "[kernels]") {
  // One K group per record takes the SIMD record path; V groups of 1, 2, 4 or 8 16-lane vectors,
  // of 3 (D = 96, vector by vector at 16 lanes) and of half a vector (8 channels, the generic
  // path), and G = 48 (a 16-token tail of the score blocks). g 1..5 covers every row block.
  struct Geometry {
    int d, block_tokens, v_group_channels;
  };
  const Geometry geometries[] = {{128, 32, 16}, {128, 32, 64}, {128, 32, 128}, {128, 32, 8},
                                 {96, 32, 48},  {64, 48, 32},  {64, 16, 16}};
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(testing::kNoSimd);
  Worst worst;
  int seed = 300;
  for (QuantMethod m : {QuantMethod::kKivi, QuantMethod::kOscar}) {
    for (const Geometry& geo : geometries) {
      if (m == QuantMethod::kOscar && geo.d == 96) continue;  // Its Hadamard needs a power of 2.
      QuantSpec spec = Spec(m, geo.d, 2, 3);
      spec.block_tokens = spec.k_group_tokens = geo.block_tokens;
      spec.v_group_channels = geo.v_group_channels;
      REQUIRE(ValidateQuantSpec(spec).ok());
      for (int group = 1; group <= 5; ++group) {
        INFO(QuantMethodName(m) << " d " << spec.head_dim << " G " << spec.block_tokens << " vg "
                                << spec.v_group_channels << " g " << group);
        CheckAgainstOracle(MakeHeadCache(spec, group, 3, 4, 5, DType::kF16, ++seed), levels,
                           &worst);
      }
    }
  }
}

// A record geometry of the token-row SIMD paths (QuaRot, TurboQuant).
struct RowGeometry {
  int d, block_tokens, k_bits, v_bits;
};

// Each geometry of `method` at g = 1..6 (every row block and a 4 + 2 split), 3 sinks, 4 records
// and a 5-row tail, against the oracle at every SIMD level; seeds from `seed` + 1 on.
void CheckRowGeometries(QuantMethod method, const std::vector<RowGeometry>& geometries, int seed) {
  const std::vector<SimdLevel> levels = SimdLevelsUnderTest();
  if (levels.empty()) return Skip(testing::kNoSimd);
  Worst worst;
  for (const RowGeometry& geo : geometries) {
    QuantSpec spec = Spec(method, geo.d, geo.k_bits, geo.v_bits);
    spec.block_tokens = spec.k_group_tokens = geo.block_tokens;
    REQUIRE(ValidateQuantSpec(spec).ok());
    for (int group = 1; group <= 6; ++group) {
      INFO(QuantMethodName(method) << " d " << geo.d << " G " << geo.block_tokens << " k"
                                   << geo.k_bits << "v" << geo.v_bits << " g " << group);
      CheckAgainstOracle(MakeHeadCache(spec, group, 3, 4, 5, DType::kF16, ++seed), levels, &worst);
    }
  }
}

TEST_CASE("Attention: QuaRot record geometries of the SIMD record path agree with the oracle",
          "[kernels]") {
  // The SIMD QuaRot path reduces W = 8 or 16 tokens' dot products as one tree, so G = 16, 48 and
  // 128 give one, three and eight trees per record at 16 lanes (G = 8: the generic path there);
  // D = 32 is a V tail of single vectors at 16 lanes, D = 256 four 4-vector blocks.
  CheckRowGeometries(QuantMethod::kQuaRot,
                     {{128, 32, 2, 3},
                      {64, 16, 3, 2},
                      {32, 48, 4, 8},
                      {256, 32, 8, 4},
                      {128, 128, 2, 2},
                      {64, 8, 2, 4}},
                     400);
}

TEST_CASE("Attention: TurboQuant record geometries of the SIMD record path agree with the oracle",
          "[kernels]") {
  // The SIMD TurboQuant path looks codes up with one permute (two and a blend at 8 lanes, where
  // 4-bit codes reach the upper half of the table) inside QuaRot's loops: the same G and D cases,
  // and every K/V width pair of 2-4 bits.
  CheckRowGeometries(QuantMethod::kTurbo,
                     {{128, 32, 4, 3},
                      {64, 16, 3, 2},
                      {32, 48, 4, 4},
                      {256, 32, 2, 4},
                      {64, 128, 2, 2},
                      {64, 8, 3, 3},
                      {64, 32, 4, 2},
                      {128, 16, 3, 4},
                      {64, 32, 2, 3}},
                     500);
}

TEST_CASE("Attention: known answer on identical fp16 keys", "[kernels]") {
  // One fp16 record of 8 tokens with the same key: uniform weights, out = mean of V,
  // lse = score + log 8.
  QuantSpec spec;
  spec.method = QuantMethod::kFp16;
  spec.head_dim = 8;
  spec.k_bits = spec.v_bits = 16;
  spec.block_tokens = spec.k_group_tokens = spec.v_group_channels = 8;
  REQUIRE(ValidateQuantSpec(spec).ok());
  float k[64], v[64];
  for (int t = 0; t < 8; ++t) {
    for (int c = 0; c < 8; ++c) k[t * 8 + c] = 0.5f, v[t * 8 + c] = static_cast<float>(t + c);
  }
  std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
  REQUIRE(QuantizeBlockRef(spec, {k, v, 8, nullptr}, rec.data()).ok());
  const uint8_t* recs[] = {rec.data()};
  const float q[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  AttentionKv kv;
  kv.records = recs;
  kv.num_records = 1;
  float out[8], lse;
  REQUIRE(DecodeAttention(spec, kv, {q, 1, 0.25f}, {out, &lse}).ok());
  for (int c = 0; c < 8; ++c) CHECK(out[c] == Approx(3.5f + c).epsilon(1e-6));
  CHECK(lse == Approx(0.25f * 4.0f + std::log(8.0f)).epsilon(1e-6));
}

TEST_CASE("Attention: one changed code moves the output exactly as the oracle says", "[kernels]") {
  // KIVI does not rotate, so a V code of token t at channel c only moves out[., c], by
  // p_t * scale * (new code - old code).
  const QuantSpec spec = Spec(QuantMethod::kKivi, 64, 2, 2);
  HeadCache hc = MakeHeadCache(spec, 1, 0, 2, 0, DType::kF16, 3);
  Result before = Alloc(hc), after = Alloc(hc);
  REQUIRE(DecodeAttention(spec, hc.Kv(), hc.Query(), before.View()).ok());
  const BlockLayout l = BlockLayoutOf(spec);
  const int t = 5, c = 9, d = 64;
  uint8_t* row = hc.records[1].data() + l.v_codes_offset + t * d * 2 / 8;
  const int old_code = (row[c / 4] >> (2 * (c % 4))) & 3;
  const int new_code = old_code >= 2 ? 0 : 3;
  row[c / 4] =
      static_cast<uint8_t>((row[c / 4] & ~(3 << (2 * (c % 4)))) | (new_code << (2 * (c % 4))));
  REQUIRE(DecodeAttention(spec, hc.Kv(), hc.Query(), after.View()).ok());
  // Weight of token t of record 1 (global token gt + t) from the oracle's scores.
  std::vector<float> kb(32 * d), vb(32 * d);
  DequantizeBlockRef(spec, hc.records[1].data(), nullptr, kb.data(), vb.data());
  double s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(hc.q[i]) * kb[t * d + i];
  const double p = std::exp(s * hc.scale - before.lse[0]);
  const float vscale = HalfToFloat(
      static_cast<uint16_t>(hc.records[1][l.v_meta_offset + 4 * (t * 2 + c / 32)] |
                            (hc.records[1][l.v_meta_offset + 4 * (t * 2 + c / 32) + 1] << 8)));
  const double expect = p * vscale * (new_code - old_code);
  REQUIRE(std::fabs(expect) > 1e-4);
  CHECK(after.out[c] - before.out[c] == Approx(expect).epsilon(1e-3));
  for (int i = 0; i < d; ++i) {
    if (i != c) CHECK(std::fabs(after.out[i] - before.out[i]) <= 1e-6);
  }
  CHECK(after.lse[0] == before.lse[0]);
  const Reference ref = Oracle(hc);
  CHECK(Compare(after.out, after.lse, ref.out, ref.lse).out <= kOracleTol);
}

TEST_CASE("Attention: split-K parts merged equal the single pass", "[kernels]") {
  for (QuantMethod m : {QuantMethod::kKivi, QuantMethod::kKvarn, QuantMethod::kOscar}) {
    const QuantSpec spec = Spec(m, 128, 2, 2);
    const HeadCache hc = MakeHeadCache(spec, 3, 6, 5, 9, DType::kF16, 11);
    Result one = Alloc(hc);
    REQUIRE(DecodeAttention(spec, hc.Kv(), hc.Query(), one.View()).ok());
    for (int splits : {1, 2, 3, 5, 8}) {  // 8 > records: some parts are empty.
      INFO(QuantMethodName(m) << " splits " << splits);
      Result split = Alloc(hc);
      REQUIRE(DecodeAttentionSplitK(spec, hc.Kv(), hc.Query(), splits, split.View()).ok());
      const Errors e = Compare(split.out, split.lse, one.out, one.lse);
      CHECK(e.out <= kSplitTol);
      CHECK(e.lse <= kSplitTol);
    }
    // Parts by hand, merged in reverse order, window in the first part.
    Result a = Alloc(hc), b = Alloc(hc), merged = Alloc(hc);
    REQUIRE(DecodeAttention(spec, AttentionPart(hc.Kv(), 0, 2, true), hc.Query(), a.View()).ok());
    REQUIRE(DecodeAttention(spec, AttentionPart(hc.Kv(), 2, 3, false), hc.Query(), b.View()).ok());
    const float* outs[] = {b.out.data(), a.out.data()};
    const float* lses[] = {b.lse.data(), a.lse.data()};
    REQUIRE(MergeAttentionParts(3, 128, 2, outs, lses, merged.View()).ok());
    const Errors e = Compare(merged.out, merged.lse, one.out, one.lse);
    CHECK(e.out <= kSplitTol);
    CHECK(e.lse <= kSplitTol);
  }
}

TEST_CASE("Attention: an empty part gives out 0, lse -inf and merges as a no-op", "[kernels]") {
  const QuantSpec spec = Spec(QuantMethod::kKvarn, 64, 2, 2);
  const HeadCache hc = MakeHeadCache(spec, 2, 0, 1, 0, DType::kF16, 5);
  Result empty = Alloc(hc), full = Alloc(hc), merged = Alloc(hc);
  REQUIRE(
      DecodeAttention(spec, AttentionPart(hc.Kv(), 1, 0, false), hc.Query(), empty.View()).ok());
  for (float x : empty.out) CHECK(x == 0.0f);
  for (float x : empty.lse) CHECK(x == -INFINITY);
  REQUIRE(DecodeAttention(spec, hc.Kv(), hc.Query(), full.View()).ok());
  const float* outs[] = {empty.out.data(), full.out.data()};
  const float* lses[] = {empty.lse.data(), full.lse.data()};
  REQUIRE(MergeAttentionParts(2, 64, 2, outs, lses, merged.View()).ok());
  CHECK(merged.out == full.out);
  CHECK(merged.lse == full.lse);
}

void ExpectInvalid(const Status& s, const std::string& field) {
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find(field) != std::string::npos);
}

TEST_CASE("Attention: bad input is INVALID_ARGUMENT naming the field", "[kernels]") {
  const QuantSpec spec = Spec(QuantMethod::kOscar, 64, 2, 2);
  const HeadCache hc = MakeHeadCache(spec, 2, 2, 2, 3, DType::kF16, 9);
  Result r = Alloc(hc);
  const AttentionQuery q = hc.Query();
  REQUIRE(DecodeAttention(spec, hc.Kv(), q, r.View()).ok());

  QuantSpec bad_spec = spec;
  bad_spec.k_group_tokens = 24;
  ExpectInvalid(DecodeAttention(bad_spec, hc.Kv(), q, r.View()), "k_group_tokens");
  bad_spec = spec;
  bad_spec.k_bits = 5;  // The spec's own code passes through.
  CHECK(DecodeAttention(bad_spec, hc.Kv(), q, r.View()).code() == StatusCode::kUnimplemented);
  AttentionKv kv = hc.Kv();
  kv.records = nullptr;
  ExpectInvalid(DecodeAttention(spec, kv, q, r.View()), "records");
  std::vector<const uint8_t*> recs = hc.rec_ptrs;
  recs[1] = nullptr;
  kv = hc.Kv();
  kv.records = recs.data();
  ExpectInvalid(DecodeAttention(spec, kv, q, r.View()), "records[1]");
  kv = hc.Kv();
  kv.record_norms = nullptr;
  ExpectInvalid(DecodeAttention(spec, kv, q, r.View()), "record_norms");
  std::vector<const float*> norms = hc.norm_ptrs;
  norms[0] = nullptr;
  kv = hc.Kv();
  kv.record_norms = norms.data();
  ExpectInvalid(DecodeAttention(spec, kv, q, r.View()), "record_norms[0]");
  kv = hc.Kv();  // Norms for a method without them.
  ExpectInvalid(DecodeAttention(Spec(QuantMethod::kKivi, 64, 2, 2), kv, q, r.View()),
                "record_norms");
  kv = hc.Kv();
  kv.num_records = -1;
  ExpectInvalid(DecodeAttention(spec, kv, q, r.View()), "num_records");
  ExpectInvalid(DecodeAttention(spec, AttentionPart(hc.Kv(), 1, 2, true), q, r.View()),
                "num_records");
  kv = hc.Kv();
  kv.window_v.tokens -= 1;
  ExpectInvalid(DecodeAttention(spec, kv, q, r.View()), "window_v.tokens");
  kv = hc.Kv();
  kv.window_k.head_dim = kv.window_v.head_dim = 32;
  kv.window_k.token_stride = kv.window_v.token_stride = 64;
  kv.window_k.head_stride = kv.window_v.head_stride = 32;
  ExpectInvalid(DecodeAttention(spec, kv, q, r.View()), "window_k.head_dim");
  kv = hc.Kv();
  kv.window_head = 2;
  ExpectInvalid(DecodeAttention(spec, kv, q, r.View()), "window_head");
  kv = hc.Kv();
  kv.window_k.data = nullptr;
  CHECK(DecodeAttention(spec, kv, q, r.View()).code() == StatusCode::kInvalidArgument);

  AttentionQuery bq = q;
  bq.q = nullptr;
  ExpectInvalid(DecodeAttention(spec, hc.Kv(), bq, r.View()), "query.q");
  bq = q;
  bq.group = 0;
  ExpectInvalid(DecodeAttention(spec, hc.Kv(), bq, r.View()), "query.group");
  bq.group = kMaxAttentionGroup + 1;
  ExpectInvalid(DecodeAttention(spec, hc.Kv(), bq, r.View()), "query.group");
  bq = q;
  bq.scale = 0.0f;
  ExpectInvalid(DecodeAttention(spec, hc.Kv(), bq, r.View()), "query.scale");
  bq.scale = NAN;
  ExpectInvalid(DecodeAttention(spec, hc.Kv(), bq, r.View()), "query.scale");
  std::vector<float> qnan = hc.q;
  qnan[64 + 3] = INFINITY;
  bq = q;
  bq.q = qnan.data();
  ExpectInvalid(DecodeAttention(spec, hc.Kv(), bq, r.View()), "row 1 channel 3");
  ExpectInvalid(DecodeAttention(spec, hc.Kv(), q, {nullptr, r.lse.data()}), "result.out");
  ExpectInvalid(DecodeAttentionRef(spec, hc.Kv(), q, {r.out.data(), nullptr}), "result.lse");
  ExpectInvalid(DecodeAttentionSplitK(spec, hc.Kv(), q, 0, r.View()), "splits");

  const float* outs[] = {r.out.data(), nullptr};
  const float* lses[] = {r.lse.data(), r.lse.data()};
  ExpectInvalid(MergeAttentionParts(2, 64, 2, outs, lses, r.View()), "part 1");
  ExpectInvalid(MergeAttentionParts(2, 64, 0, outs, lses, r.View()), "parts");
  ExpectInvalid(MergeAttentionParts(0, 64, 1, outs, lses, r.View()), "group");
  std::vector<float> nan_lse = {NAN, 0.0f};
  const float* bad_lses[] = {nan_lse.data()};
  ExpectInvalid(MergeAttentionParts(2, 64, 1, outs, bad_lses, r.View()), "lses[0][0]");
}

// ---- Benchmark (hidden; see docs/attention.md for the command and results) ----------------------

// Plain fp32 decode attention over dense [T, D] K and V: the uncompressed-cache baseline, written
// the straightforward way (per token: the g dot products, then two-pass softmax, then the V sum).
void DenseAttention(const float* k, const float* v, int64_t n, int d, const float* q, int g,
                    float scale, float* scores, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    for (int i = 0; i < g; ++i) {
      float s = 0.0f;
      for (int c = 0; c < d; ++c) s += q[i * d + c] * k[t * d + c];
      scores[i * n + t] = s * scale;
    }
  }
  for (int i = 0; i < g; ++i) {
    float* si = scores + i * n;
    float m = si[0];
    for (int64_t t = 1; t < n; ++t) m = std::max(m, si[t]);
    float sum = 0.0f;
    for (int64_t t = 0; t < n; ++t) sum += (si[t] = std::exp(si[t] - m));
    float* o = out + i * d;
    std::fill(o, o + d, 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      const float p = si[t] / sum;
      for (int c = 0; c < d; ++c) o[c] += p * v[t * d + c];
    }
  }
}

template <class F>
double MedianMicros(int reps, F&& f) {
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

TEST_CASE("Attention: benchmark fused 2-bit vs dense fp32, one thread", "[.bench][kernels]") {
  const SimdLevel saved = ActiveSimdLevel();
  struct Geo {
    const char* model;
    int d, g;
  };
  for (const Geo geo : {Geo{"SmolLM2", 64, 3}, Geo{"Llama-3-8B", 128, 4}}) {
    for (int64_t target : {4096, 32768}) {
      for (QuantMethod m : {QuantMethod::kKvarn, QuantMethod::kKivi}) {
        const QuantSpec spec = Spec(m, geo.d, 2, 2);
        const StreamingRules rules = TraitsOf(m).streaming;
        const int gt = spec.block_tokens, tail = 64;
        const int records = static_cast<int>((target - rules.sink_tokens - tail) / gt);
        const int64_t n = rules.sink_tokens + static_cast<int64_t>(records) * gt + tail;
        const SyntheticKv kv = GenerateSyntheticKv(
            {.tokens = n, .heads = 1, .head_dim = geo.d, .q_heads = geo.g, .seed = 1});
        const BlockLayout l = BlockLayoutOf(spec);
        std::vector<uint8_t> pool(static_cast<size_t>(records) * l.record_bytes);
        std::vector<const uint8_t*> recs(records);
        for (int r = 0; r < records; ++r) {
          const int64_t t0 = rules.sink_tokens + static_cast<int64_t>(r) * gt;
          recs[r] = pool.data() + r * l.record_bytes;
          REQUIRE(QuantizeBlock(
                      spec, {kv.k.data() + t0 * geo.d, kv.v.data() + t0 * geo.d, geo.d, nullptr},
                      pool.data() + r * l.record_bytes)
                      .ok());
        }
        // Window: sinks then tail, fp16 like the controller stores them.
        const int64_t wrows = rules.sink_tokens + tail;
        std::vector<uint16_t> wk(wrows * geo.d), wv(wk.size());
        for (int64_t w = 0; w < wrows; ++w) {
          const int64_t t = w < rules.sink_tokens ? w : n - tail + (w - rules.sink_tokens);
          for (int c = 0; c < geo.d; ++c) {
            wk[w * geo.d + c] = FloatToHalf(kv.k[t * geo.d + c]);
            wv[w * geo.d + c] = FloatToHalf(kv.v[t * geo.d + c]);
          }
        }
        AttentionKv akv;
        akv.records = recs.data();
        akv.num_records = records;
        akv.window_k = KvTensorView::Contiguous(wk.data(), DType::kF16, wrows, 1, geo.d);
        akv.window_v = KvTensorView::Contiguous(wv.data(), DType::kF16, wrows, 1, geo.d);
        const float* q = kv.q.data() + (n - 1) * geo.g * geo.d;
        const AttentionQuery query{q, geo.g, 1.0f / std::sqrt(static_cast<float>(geo.d))};
        std::vector<float> out(geo.g * geo.d), lse(geo.g), dense_out(out.size());
        std::vector<float> scores(static_cast<size_t>(geo.g) * n);
        const int reps = n > 8192 ? 7 : 31;
        const double dense = MedianMicros(reps, [&] {
          DenseAttention(kv.k.data(), kv.v.data(), n, geo.d, q, geo.g, query.scale, scores.data(),
                         dense_out.data());
        });
        // The same fused kernel over the whole uncompressed cache as an fp32 (or fp16) window: the
        // vectorised dense baseline, identical code apart from the element format.
        std::vector<uint16_t> k16(kv.k.size()), v16(kv.v.size());
        for (size_t i = 0; i < k16.size(); ++i) {
          k16[i] = FloatToHalf(kv.k[i]);
          v16[i] = FloatToHalf(kv.v[i]);
        }
        AttentionKv dense32, dense16;
        dense32.window_k = KvTensorView::Contiguous(kv.k.data(), DType::kF32, n, 1, geo.d);
        dense32.window_v = KvTensorView::Contiguous(kv.v.data(), DType::kF32, n, 1, geo.d);
        dense16.window_k = KvTensorView::Contiguous(k16.data(), DType::kF16, n, 1, geo.d);
        dense16.window_v = KvTensorView::Contiguous(v16.data(), DType::kF16, n, 1, geo.d);
        char buf[512];
        snprintf(buf, sizeof(buf), "%-10s D=%3d g=%d T=%5lld %-5s | naive fp32 %8.1f", geo.model,
                 geo.d, geo.g, static_cast<long long>(n), std::string(QuantMethodName(m)).c_str(),
                 dense);
        std::string line = buf;
        const double ref = MedianMicros(n > 8192 ? 3 : 7, [&] {
          REQUIRE(DecodeAttentionRef(spec, akv, query, {out.data(), lse.data()}).ok());
        });
        snprintf(buf, sizeof(buf), " | fused scalar %8.1f", ref);
        line += buf;
        for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
          if (static_cast<int>(level) > static_cast<int>(DetectSimdLevel())) continue;
          REQUIRE(SetSimdLevel(level).ok());
          const double f32 = MedianMicros(reps, [&] {
            REQUIRE(DecodeAttention(spec, dense32, query, {out.data(), lse.data()}).ok());
          });
          const double f16 = MedianMicros(reps, [&] {
            REQUIRE(DecodeAttention(spec, dense16, query, {out.data(), lse.data()}).ok());
          });
          const double us = MedianMicros(reps, [&] {
            REQUIRE(DecodeAttention(spec, akv, query, {out.data(), lse.data()}).ok());
          });
          snprintf(buf, sizeof(buf),
                   " | %s: fp32 %7.1f fp16 %7.1f fused %7.1f (naive/fused %4.1fx, fp32/fused "
                   "%4.2fx)",
                   std::string(SimdLevelName(level)).c_str(), f32, f16, us, dense / us, f32 / us);
          line += buf;
        }
        REQUIRE(SetSimdLevel(saved).ok());
        // Sanity: quantized attention is close to the dense result (2-bit, so loosely).
        double num = 0, den = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          num = std::max(num, static_cast<double>(std::fabs(out[i] - dense_out[i])));
          den = std::max(den, static_cast<double>(std::fabs(dense_out[i])));
        }
        snprintf(buf, sizeof(buf), " | 2-bit vs exact max rel. diff %.2f", num / den);
        WARN(line + buf);
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
