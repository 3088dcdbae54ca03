#include "kernels/quant_types.h"

#include <catch2/catch.hpp>

namespace kvctl {
namespace {

QuantSpec Spec(QuantMethod m, int d, int kb, int vb) {
  StatusOr<QuantSpec> s = MakeQuantSpec(m, d, kb, vb);
  REQUIRE(s.ok());
  return *s;
}

TEST_CASE("QuantTypes: bits per element match docs/algorithms.md", "[kernels]") {
  // KVarN k2v2 G=128 D=128: 2 + 16*(2*128+128)/(128*128) = 2.375 for K and V
  // (docs/algorithms.md §6.4).
  auto b = BitsPerElement(Spec(QuantMethod::kKvarn, 128, 2, 2), 8);
  CHECK(b.k == Approx(2.375).epsilon(1e-12));
  CHECK(b.v == Approx(2.375).epsilon(1e-12));
  // KVarN k4v2 G=128: 4.375 / 2.375 / 3.375.
  b = BitsPerElement(Spec(QuantMethod::kKvarn, 128, 4, 2), 8);
  CHECK(b.average == Approx(3.375));
  // KIVI 2-bit G=32: b + 32/G = 3.0 (docs/algorithms.md §4).
  b = BitsPerElement(Spec(QuantMethod::kKivi, 128, 2, 2), 8);
  CHECK(b.k == Approx(3.0));
  CHECK(b.v == Approx(3.0));
  // QuaRot 2-bit: b + 32/D = 2.25 (docs/algorithms.md §5).
  b = BitsPerElement(Spec(QuantMethod::kQuaRot, 128, 2, 2), 8);
  CHECK(b.average == Approx(2.25));
  // OScaR INT2 G=32 H=8 D=128: K = 2 + 1 + 32/1024 = 3.03125, V = 3.0 (docs/algorithms.md §7.5).
  b = BitsPerElement(Spec(QuantMethod::kOscar, 128, 2, 2), 8);
  CHECK(b.k == Approx(3.03125));
  CHECK(b.v == Approx(3.0));
  CHECK(BitsPerElement(Spec(QuantMethod::kFp16, 64, 16, 16), 3).average == Approx(16.0));
}

TEST_CASE("QuantTypes: layout sections are ordered, aligned and fit the record", "[kernels]") {
  for (int m = 0; m < kNumQuantMethods; ++m) {
    const QuantMethod method = static_cast<QuantMethod>(m);
    const int bits = method == QuantMethod::kFp16 ? 16 : 3;
    const BlockLayout l = BlockLayoutOf(Spec(method, 64, bits, bits));
    CHECK(l.k_codes_offset == 0);
    CHECK(l.k_meta_offset >= l.k_codes_offset + l.k_codes_bytes);
    CHECK(l.v_codes_offset >= l.k_meta_offset + l.k_meta_bytes);
    CHECK(l.v_meta_offset >= l.v_codes_offset + l.v_codes_bytes);
    CHECK(l.record_bytes >= l.v_meta_offset + l.v_meta_bytes);
    CHECK(l.record_bytes % 8 == 0);
    CHECK(l.k_meta_offset % 4 == 0);
  }
  // KVarN record: codes 2*128*128/8 + scales (2*128+128)*2, twice = 4096+768+4096+768.
  CHECK(BlockLayoutOf(Spec(QuantMethod::kKvarn, 128, 2, 2)).record_bytes == 9728);
}

TEST_CASE("QuantTypes: validation names field, value and expectation", "[kernels]") {
  StatusOr<QuantSpec> s = MakeQuantSpec(QuantMethod::kKivi, 128, 5, 2);
  CHECK(s.status().code() == StatusCode::kUnimplemented);
  CHECK(s.status().message() == "k_bits: got 5, expected one of {2, 3, 4, 8} for kivi");
  s = MakeQuantSpec(QuantMethod::kKvarn, 96, 2, 2);
  CHECK(s.status().message().find("head_dim: got 96") != std::string::npos);
  s = MakeQuantSpec(QuantMethod::kKivi, 96, 2, 2);  // KIVI does not rotate: 96 is fine.
  CHECK(s.ok());
  QuantSpec spec = Spec(QuantMethod::kKivi, 64, 2, 2);
  spec.v_group_channels = 24;
  CHECK(ValidateQuantSpec(spec).message().find("v_group_channels: got 24") != std::string::npos);
  spec = Spec(QuantMethod::kOscar, 64, 2, 2);
  spec.k_group_tokens = 12;
  CHECK_FALSE(ValidateQuantSpec(spec).ok());
  CHECK(ParseQuantMethod("kvarn").value() == QuantMethod::kKvarn);
  CHECK(ParseQuantMethod("kivy").status().message().find("\"kivy\"") != std::string::npos);
  CHECK(ValidateStreamingRules(Spec(QuantMethod::kKvarn, 64, 2, 2), {0, 100})
            .message()
            .find("flush_tokens: got 100") != std::string::npos);
}

TEST_CASE("QuantTypes: effective bits count sinks and the fp16 tail", "[kernels]") {
  const QuantSpec spec = Spec(QuantMethod::kKvarn, 128, 2, 2);
  const StreamingRules rules{.sink_tokens = 128, .flush_tokens = 128};  // Not the registry's.
  CHECK(QuantizedTokenCount(spec, rules, 100) == 0);
  CHECK(QuantizedTokenCount(spec, rules, 256) == 128);
  CHECK(QuantizedTokenCount(spec, rules, 300) == 128);
  // 1024 tokens: 128 sinks fp16, 896 quantized, 0 tail.
  CHECK(EffectiveBitsPerElement(spec, rules, 8, 1024) == Approx((896 * 2.375 + 128 * 16.0) / 1024));
  CHECK(EffectiveBitsPerElement(spec, rules, 8, 10) == Approx(16.0));
}

}  // namespace
}  // namespace kvctl
