// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/quant_types.h"

#include <cstring>
#include <sstream>

#include "kernels/turbo_codebook.h"

namespace kvctl {
namespace {

constexpr uint32_t Bits(std::initializer_list<int> widths) {
  uint32_t mask = 0;
  for (int b : widths) mask |= 1u << b;
  return mask;
}

constexpr uint32_t kLowBits = Bits({2, 3, 4, 8});
// TurboQuant: 2^b Lloyd-Max points per coordinate; beyond 4 bits the table is large and a uniform
// grid does as well (docs/algorithms.md §20.2).
constexpr uint32_t kTurboBits = Bits({2, 3, 4});

// Defaults (docs/algorithms.md): KIVI groups of 32, flush at 128 (§4); QuaRot under KIVI's flush
// rule (§5); KVarN G=128, 4 iterations (§6.1: the paper's 16 measured no better); OScaR groups of
// 32 (§7.4); TurboQuant per token, QuaRot's flush rule (§20.3). Streaming rules (§8.4): sinks and
// OScaR's flush were chosen by measurement on SmolLM2-135M at 2K-token contexts (issue #18,
// docs/quality.md "Sinks and flush per method"): KIVI 16 sinks (was 0), KVarN 32 (was 128), OScaR
// 32 sinks with a 128 flush (was 0 and 256); QuaRot and TurboQuant keep theirs where the
// measurement did not resolve a gain.
const MethodTraits kTraits[kNumQuantMethods] = {
    {QuantMethod::kFp16, "fp16", "uncompressed fp16 rows", Bits({16}), false, false,
     QuantSpec{QuantMethod::kFp16, 128, 16, 16, 32, 32, 128, 0}, StreamingRules{0, 32}},
    {QuantMethod::kKivi, "kivi", "KIVI: per-channel K over token groups, per-token V", kLowBits,
     false, false, QuantSpec{QuantMethod::kKivi, 128, 2, 2, 32, 32, 32, 0},
     StreamingRules{16, 128}},
    {QuantMethod::kQuaRot, "quarot", "QuaRot-style: Hadamard, per-token RTN over head_dim",
     kLowBits, true, false, QuantSpec{QuantMethod::kQuaRot, 128, 2, 2, 32, 32, 128, 0},
     StreamingRules{0, 128}},
    {QuantMethod::kKvarn, "kvarn", "KVarN: Hadamard, Sinkhorn variance normalisation, RTN",
     kLowBits, true, false, QuantSpec{QuantMethod::kKvarn, 128, 2, 2, 128, 128, 128, 4},
     StreamingRules{32, 128}},
    {QuantMethod::kOscar, "oscar", "OScaR: Hadamard, omni-token K scaling, per-channel K", kLowBits,
     true, true, QuantSpec{QuantMethod::kOscar, 128, 2, 2, 32, 32, 32, 0}, StreamingRules{32, 128}},
    {QuantMethod::kTurbo, "turbo", "TurboQuant: token scale, random-sign Hadamard, Lloyd-Max codes",
     kTurboBits, true, false, QuantSpec{QuantMethod::kTurbo, 128, 3, 3, 32, 32, 128, 0},
     StreamingRules{0, 128}},
};

std::string AllowedBitsText(uint32_t mask) {
  std::ostringstream out;
  out << "{";
  bool first = true;
  for (int b = 0; b < 32; ++b) {
    if (!(mask & (1u << b))) continue;
    out << (first ? "" : ", ") << b;
    first = false;
  }
  out << "}";
  return out.str();
}

bool IsPowerOfTwo(int x) { return x > 0 && (x & (x - 1)) == 0; }

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Bytes of `rows` rows of `n` codes of `bits` bits: rows start on byte boundaries.
size_t CodeBytes(int rows, int n, int bits) {
  return static_cast<size_t>(rows) * ((static_cast<size_t>(n) * bits + 7) / 8);
}

}  // namespace

const MethodTraits& TraitsOf(QuantMethod method) {
  const int i = static_cast<int>(method);
  KVCTL_CHECK(i >= 0 && i < kNumQuantMethods);
  return kTraits[i];
}

std::string_view QuantMethodName(QuantMethod method) {
  const int i = static_cast<int>(method);
  if (i < 0 || i >= kNumQuantMethods) return "unknown";
  return kTraits[i].name;
}

StatusOr<QuantMethod> ParseQuantMethod(std::string_view name) {
  for (const MethodTraits& t : kTraits) {
    if (name == t.name) return t.method;
  }
  return InvalidArgument("method: got \"", name,
                         "\", expected one of fp16, kivi, quarot, kvarn, oscar, turbo");
}

StatusOr<QuantSpec> MakeQuantSpec(QuantMethod method, int head_dim, int k_bits, int v_bits) {
  const int i = static_cast<int>(method);
  if (i < 0 || i >= kNumQuantMethods) {
    return InvalidArgument("method: got ", i, ", expected 0..", kNumQuantMethods - 1);
  }
  QuantSpec spec = kTraits[i].defaults;
  spec.head_dim = head_dim;
  spec.k_bits = k_bits;
  spec.v_bits = v_bits;
  // Fields a method does not use are pinned to canonical values so equal specs compare equal.
  if (method == QuantMethod::kQuaRot || method == QuantMethod::kKvarn ||
      method == QuantMethod::kFp16 || method == QuantMethod::kTurbo) {
    spec.v_group_channels = head_dim;
    spec.k_group_tokens = spec.block_tokens;
  }
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  return spec;
}

Status ValidateQuantSpec(const QuantSpec& spec) {
  const int m = static_cast<int>(spec.method);
  if (m < 0 || m >= kNumQuantMethods) {
    return InvalidArgument("method: got ", m, ", expected 0..", kNumQuantMethods - 1);
  }
  const MethodTraits& t = kTraits[m];
  const int d = spec.head_dim;
  if (d < 8 || d > 1024 || d % 8 != 0) {
    return InvalidArgument("head_dim: got ", d, ", expected a multiple of 8 in 8..1024");
  }
  if (t.rotates && (!IsPowerOfTwo(d) || d > 256)) {
    return InvalidArgument("head_dim: got ", d, ", expected a power of two <= 256 for ", t.name,
                           " (its Hadamard rotation needs one)");
  }
  for (auto [field, bits] : {std::pair{"k_bits", spec.k_bits}, std::pair{"v_bits", spec.v_bits}}) {
    if (bits < 0 || bits > 31 || !(t.allowed_bits & (1u << bits))) {
      return Unimplemented(field, ": got ", bits, ", expected one of ",
                           AllowedBitsText(t.allowed_bits), " for ", t.name);
    }
  }
  const int g = spec.block_tokens;
  if (g < 8 || g > 1024 || g % 8 != 0) {
    return InvalidArgument("block_tokens: got ", g, ", expected a multiple of 8 in 8..1024");
  }
  if (spec.method == QuantMethod::kKivi || spec.method == QuantMethod::kOscar) {
    const int kg = spec.k_group_tokens;
    if (kg < 8 || kg % 8 != 0 || g % kg != 0) {
      return InvalidArgument("k_group_tokens: got ", kg,
                             ", expected a multiple of 8 that divides block_tokens ", g);
    }
    const int vg = spec.v_group_channels;
    if (vg < 8 || vg % 8 != 0 || d % vg != 0) {
      return InvalidArgument("v_group_channels: got ", vg,
                             ", expected a multiple of 8 that divides head_dim ", d);
    }
  }
  if (spec.method == QuantMethod::kKvarn && (spec.sinkhorn_iters < 0 || spec.sinkhorn_iters > 64)) {
    return InvalidArgument("sinkhorn_iters: got ", spec.sinkhorn_iters, ", expected 0..64");
  }
  return OkStatus();
}

Status ValidateStreamingRules(const QuantSpec& spec, const StreamingRules& rules) {
  if (rules.sink_tokens < 0 || rules.sink_tokens > 65536) {
    return InvalidArgument("sink_tokens: got ", rules.sink_tokens, ", expected 0..65536");
  }
  const int g = spec.block_tokens;
  if (rules.flush_tokens < g || rules.flush_tokens > 65536 || rules.flush_tokens % g != 0) {
    return InvalidArgument("flush_tokens: got ", rules.flush_tokens,
                           ", expected a multiple of block_tokens ", g, " up to 65536");
  }
  return OkStatus();
}

BlockLayout BlockLayoutOf(const QuantSpec& spec) {
  const int d = spec.head_dim;
  const int g = spec.block_tokens;
  size_t k_codes = 0, k_meta = 0, v_codes = 0, v_meta = 0, side = 0;
  switch (spec.method) {
    case QuantMethod::kFp16:
      k_codes = v_codes = static_cast<size_t>(g) * d * 2;
      break;
    case QuantMethod::kKivi:
    case QuantMethod::kOscar:
      // K: one row per channel over the block's tokens; (scale, zero) fp16 per channel group.
      k_codes = CodeBytes(d, g, spec.k_bits);
      k_meta = static_cast<size_t>(d) * (g / spec.k_group_tokens) * 4;
      // V: one row per token over channels; (scale, zero) fp16 per channel group.
      v_codes = CodeBytes(g, d, spec.v_bits);
      v_meta = static_cast<size_t>(g) * (d / spec.v_group_channels) * 4;
      if (spec.method == QuantMethod::kOscar) side = 4;
      break;
    case QuantMethod::kQuaRot:
      k_codes = CodeBytes(g, d, spec.k_bits);
      k_meta = static_cast<size_t>(g) * 4;
      v_codes = CodeBytes(g, d, spec.v_bits);
      v_meta = static_cast<size_t>(g) * 4;
      break;
    case QuantMethod::kKvarn:
      k_codes = CodeBytes(d, g, spec.k_bits);
      k_meta = static_cast<size_t>(2 * d + g) * 2;  // sK[D], zK[D], tK[G].
      v_codes = CodeBytes(g, d, spec.v_bits);
      v_meta = static_cast<size_t>(d + 2 * g) * 2;  // uV[D], sV[G], zV[G].
      break;
    case QuantMethod::kTurbo:
      // One row of codes per token; one fp16 L2 norm per token (docs/algorithms.md §20.3).
      k_codes = CodeBytes(g, d, spec.k_bits);
      k_meta = static_cast<size_t>(g) * 2;
      v_codes = CodeBytes(g, d, spec.v_bits);
      v_meta = static_cast<size_t>(g) * 2;
      break;
  }
  BlockLayout l;
  l.k_codes_offset = 0;
  l.k_codes_bytes = k_codes;
  l.k_meta_offset = AlignUp(l.k_codes_offset + k_codes, 4);
  l.k_meta_bytes = k_meta;
  l.v_codes_offset = AlignUp(l.k_meta_offset + k_meta, 4);
  l.v_codes_bytes = v_codes;
  l.v_meta_offset = AlignUp(l.v_codes_offset + v_codes, 4);
  l.v_meta_bytes = v_meta;
  l.record_bytes = AlignUp(l.v_meta_offset + v_meta, 8);
  l.side_bytes_per_token = side;
  if (spec.method == QuantMethod::kTurbo) {
    l.turbo_k = TurboCodebookFor(d, spec.k_bits);
    l.turbo_v = TurboCodebookFor(d, spec.v_bits);
  }
  return l;
}

bool TokenSeparable(QuantMethod method) {
  return method == QuantMethod::kFp16 || method == QuantMethod::kQuaRot ||
         method == QuantMethod::kTurbo;
}

void CopyRecordToken(const QuantSpec& spec, const BlockLayout& layout, const uint8_t* src,
                     int src_token, uint8_t* dst, int dst_token) {
  KVCTL_CHECK(TokenSeparable(spec.method));
  KVCTL_CHECK(src_token >= 0 && src_token < spec.block_tokens);
  KVCTL_CHECK(dst_token >= 0 && dst_token < spec.block_tokens);
  // A separable record's sections are block_tokens equal per-token slices (BlockLayoutOf): one
  // row of codes, and but for fp16 the token's metadata.
  const auto g = static_cast<size_t>(spec.block_tokens);
  auto copy = [&](size_t offset, size_t section_bytes) {
    const size_t bytes = section_bytes / g;
    std::memcpy(dst + offset + static_cast<size_t>(dst_token) * bytes,
                src + offset + static_cast<size_t>(src_token) * bytes, bytes);
  };
  copy(layout.k_codes_offset, layout.k_codes_bytes);
  copy(layout.k_meta_offset, layout.k_meta_bytes);
  copy(layout.v_codes_offset, layout.v_codes_bytes);
  copy(layout.v_meta_offset, layout.v_meta_bytes);
}

BitsPerElementBreakdown BitsPerElement(const QuantSpec& spec, int kv_heads) {
  const BlockLayout l = BlockLayoutOf(spec);
  const double elems = static_cast<double>(spec.block_tokens) * spec.head_dim;
  const double k_bytes = static_cast<double>(l.v_codes_offset);  // K sections and their padding.
  const double v_bytes = static_cast<double>(l.record_bytes - l.v_codes_offset);
  BitsPerElementBreakdown b;
  b.k = k_bytes * 8 / elems + static_cast<double>(l.side_bytes_per_token) * 8 /
                                  (static_cast<double>(kv_heads) * spec.head_dim);
  b.v = v_bytes * 8 / elems;
  b.average = (b.k + b.v) / 2;
  return b;
}

int64_t QuantizedTokenCount(const QuantSpec& spec, const StreamingRules& rules, int64_t tokens) {
  (void)spec;
  const int64_t after_sinks = tokens - rules.sink_tokens;
  if (after_sinks <= 0) return 0;
  return after_sinks / rules.flush_tokens * rules.flush_tokens;
}

double EffectiveBitsPerElement(const QuantSpec& spec, const StreamingRules& rules, int kv_heads,
                               int64_t tokens) {
  if (tokens <= 0) return 0;
  const int64_t q = QuantizedTokenCount(spec, rules, tokens);
  const double bpe = BitsPerElement(spec, kv_heads).average;
  return (static_cast<double>(q) * bpe + static_cast<double>(tokens - q) * 16.0) /
         static_cast<double>(tokens);
}

}  // namespace kvctl
