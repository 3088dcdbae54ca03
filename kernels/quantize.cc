// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/quantize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "common/half.h"
#include "kernels/block_codec.h"
#include "kernels/quantize_simd.h"

namespace kvctl {
namespace {

std::atomic<SimdLevel> g_level{DetectSimdLevel()};

// Per-thread scratch so the hot path never allocates after warm-up.
float* Scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

// Exactly one pair of row pointers; the element type follows from which.
Status CheckPointers(const QuantSpec& spec, const BlockInput& in) {
  const bool f32 = in.k != nullptr || in.v != nullptr;
  if (f32 && in.f16()) {
    return InvalidArgument(
        "block input: both fp32 (k, v) and fp16 (k_f16, v_f16) rows set, "
        "expected one pair");
  }
  if (in.f16() ? (in.k_f16 == nullptr || in.v_f16 == nullptr)
               : (in.k == nullptr || in.v == nullptr)) {
    return InvalidArgument("block input: null K or V rows");
  }
  if (in.row_stride < spec.head_dim) {
    return InvalidArgument("row_stride: got ", in.row_stride, ", expected >= head_dim ",
                           spec.head_dim);
  }
  return OkStatus();
}

// Element c of token t's K (or V) row, as fp32 (fp16 widens exactly).
float InputAt(const BlockInput& in, bool k, int t, int c) {
  const int64_t i = t * in.row_stride + c;
  if (in.f16()) return HalfToFloat((k ? in.k_f16 : in.v_f16)[i]);
  return (k ? in.k : in.v)[i];
}

Status CheckInput(const QuantSpec& spec, const BlockInput& in) {
  KVCTL_RETURN_IF_ERROR(CheckPointers(spec, in));
  for (int t = 0; t < spec.block_tokens; ++t) {
    for (int c = 0; c < spec.head_dim; ++c) {
      const float k = InputAt(in, true, t, c), v = InputAt(in, false, t, c);
      if (!std::isfinite(k)) {
        return InvalidArgument("k: element (token ", t, ", channel ", c, ") is ", k,
                               ", expected a finite value");
      }
      if (!std::isfinite(v)) {
        return InvalidArgument("v: element (token ", t, ", channel ", c, ") is ", v,
                               ", expected a finite value");
      }
    }
  }
  if (TraitsOf(spec.method).needs_token_norms) {
    if (in.token_norms == nullptr) {
      return InvalidArgument("token_norms: null, expected ", spec.block_tokens,
                             " per-token norms for ", QuantMethodName(spec.method));
    }
    for (int t = 0; t < spec.block_tokens; ++t) {
      const float n = in.token_norms[t];
      if (!(std::isfinite(n) && n > 0.0f)) {
        return InvalidArgument("token_norms[", t, "]: got ", n, ", expected a finite value > 0");
      }
    }
  }
  return OkStatus();
}

Status OverflowError(const QuantSpec& spec) {
  return InvalidArgument("block of ", spec.block_tokens, " tokens: ", QuantMethodName(spec.method),
                         " metadata would exceed the fp16 range (|value| <= 65504); K/V "
                         "magnitudes this large cannot be stored by this method");
}

using EncodeFn = simd::EncodeResult (*)(const QuantSpec&, const BlockLayout&, const float*,
                                        const float*, int64_t, const float*, float*, uint8_t*,
                                        const float*);
using EncodeF16Fn = simd::EncodeResult (*)(const QuantSpec&, const BlockLayout&, const uint16_t*,
                                           const uint16_t*, int64_t, const float*, float*, uint8_t*,
                                           const uint16_t*);
using DecodeFn = void (*)(const QuantSpec&, const BlockLayout&, const uint8_t*, const float*,
                          float*, float*, float*);
using DecodeHalvesFn = void (*)(const QuantSpec&, const BlockLayout&, const uint8_t*, const float*,
                                float*, uint8_t*, uint8_t*);

// The SIMD codecs hold W tokens or W channels per vector: block_tokens and head_dim must be
// multiples of the lane count (group sizes need not be).
bool SimdFits(const QuantSpec& spec, int lanes) {
  return spec.block_tokens % lanes == 0 && spec.head_dim % lanes == 0;
}

struct SimdCodec {
  EncodeFn encode = nullptr;
  EncodeF16Fn encode_f16 = nullptr;
  DecodeFn decode = nullptr;
  DecodeHalvesFn decode_halves = nullptr;
};

SimdCodec PickCodec(const QuantSpec& spec) {
  const SimdLevel level = g_level.load(std::memory_order_relaxed);
  if (level == SimdLevel::kAvx512 && SimdFits(spec, 16)) {
    return {simd::EncodeRecordAvx512, simd::EncodeRecordF16InAvx512, simd::DecodeRecordAvx512,
            simd::DecodeRecordHalvesAvx512};
  }
  if (level >= SimdLevel::kAvx2 && SimdFits(spec, 8)) {
    return {simd::EncodeRecordAvx2, simd::EncodeRecordF16InAvx2, simd::DecodeRecordAvx2,
            simd::DecodeRecordHalvesAvx2};
  }
  return {};
}

}  // namespace

Status QuantizeBlockRef(const QuantSpec& spec, const BlockInput& in, uint8_t* record) {
  KVCTL_RETURN_IF_ERROR(CheckInput(spec, in));
  const BlockLayout layout = BlockLayoutOf(spec);
  std::memset(record, 0, layout.record_bytes);
  const float* k = in.k;
  const float* v = in.v;
  int64_t stride = in.row_stride;
  if (in.f16()) {
    // The spec is the fp32 encoder on the widened values (exact), so fp16 rows give the bytes
    // their fp32 values give.
    const int64_t n = static_cast<int64_t>(spec.block_tokens) * spec.head_dim;
    thread_local std::vector<float> rows;
    if (static_cast<int64_t>(rows.size()) < 2 * n) rows.resize(static_cast<size_t>(2 * n));
    for (int t = 0; t < spec.block_tokens; ++t) {
      for (int c = 0; c < spec.head_dim; ++c) {
        rows[t * spec.head_dim + c] = InputAt(in, true, t, c);
        rows[n + t * spec.head_dim + c] = InputAt(in, false, t, c);
      }
    }
    k = rows.data();
    v = rows.data() + n;
    stride = spec.head_dim;
  }
  float* scratch = Scratch(block::ScratchFloats(spec));
  if (!block::EncodeRecord(spec, layout, k, v, stride, in.token_norms, scratch, record)) {
    return OverflowError(spec);
  }
  return OkStatus();
}

namespace {

// What CheckInput verifies besides finiteness, which the SIMD codecs check on the fly.
bool PointersAndNormsOk(const QuantSpec& spec, const BlockInput& in) {
  if (!CheckPointers(spec, in).ok()) return false;
  if (!TraitsOf(spec.method).needs_token_norms) return true;
  if (in.token_norms == nullptr) return false;
  for (int t = 0; t < spec.block_tokens; ++t) {
    const float n = in.token_norms[t];
    if (!(std::isfinite(n) && n > 0.0f)) return false;
  }
  return true;
}

}  // namespace

namespace {

// QuantizeBlock, told where the caller's next block lies (`next`: its rows, of the same type and
// stride as `in`'s, or null), so the encoder can ask for them while it computes.
Status QuantizeBlockBefore(const QuantSpec& spec, const BlockInput& in, const BlockInput* next,
                           uint8_t* record) {
  const SimdCodec codec = PickCodec(spec);
  // Bad pointers or norms: the reference path reports them (after any non-finite element).
  if (codec.encode == nullptr || !PointersAndNormsOk(spec, in)) {
    return QuantizeBlockRef(spec, in, record);
  }
  const BlockLayout layout = BlockLayoutOf(spec);
  float* scratch = Scratch(simd::ScratchFloats(spec));
  const simd::EncodeResult result =
      in.f16() ? codec.encode_f16(spec, layout, in.k_f16, in.v_f16, in.row_stride, in.token_norms,
                                  scratch, record, next != nullptr ? next->k_f16 : nullptr)
               : codec.encode(spec, layout, in.k, in.v, in.row_stride, in.token_norms, scratch,
                              record, next != nullptr ? next->k : nullptr);
  switch (result) {
    case simd::EncodeResult::kOk:
      return OkStatus();
    case simd::EncodeResult::kOverflow:
      return OverflowError(spec);
    case simd::EncodeResult::kNonFinite:
      break;
  }
  // The scalar check names the first bad element, exactly as the reference does.
  Status status = CheckInput(spec, in);
  KVCTL_CHECK(!status.ok());
  return status;
}

}  // namespace

Status QuantizeBlock(const QuantSpec& spec, const BlockInput& in, uint8_t* record) {
  return QuantizeBlockBefore(spec, in, nullptr, record);
}

BlockInput BatchBlock(const QuantSpec& spec, const BlockBatch& batch, int b) {
  // Offsets only on the pair that is set: arithmetic on a null pointer is undefined.
  auto at = [&](auto* p) { return p != nullptr ? p + b * batch.block_stride : nullptr; };
  return BlockInput{at(batch.k),
                    at(batch.v),
                    batch.row_stride,
                    batch.token_norms != nullptr
                        ? batch.token_norms + static_cast<int64_t>(b) * spec.block_tokens
                        : nullptr,
                    at(batch.k_f16),
                    at(batch.v_f16)};
}

Status QuantizeBlocks(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records) {
  const size_t record_bytes = BlockLayoutOf(spec).record_bytes;
  BlockInput block = batch.n_blocks > 0 ? BatchBlock(spec, batch, 0) : BlockInput{};
  for (int b = 0; b < batch.n_blocks; ++b) {
    // The next block's K rows are asked for while this block is computed on (the encoders'
    // first reads are K's rows, which otherwise wait for memory: docs/kvbench_quant.md).
    const bool last = b + 1 == batch.n_blocks;
    const BlockInput next = last ? BlockInput{} : BatchBlock(spec, batch, b + 1);
    Status s = QuantizeBlockBefore(spec, block, last ? nullptr : &next, records + b * record_bytes);
    block = next;
    if (!s.ok()) return Status(s.code(), internal::StrCat("block ", b, ": ", s.message()));
  }
  return OkStatus();
}

void DequantizeBlockRef(const QuantSpec& spec, const uint8_t* record, const float* token_norms,
                        float* k_out, float* v_out) {
  block::DecodeRecord(spec, BlockLayoutOf(spec), record, token_norms, k_out, v_out);
}

void DequantizeBlock(const QuantSpec& spec, const uint8_t* record, const float* token_norms,
                     float* k_out, float* v_out) {
  const SimdCodec codec = PickCodec(spec);
  if (codec.decode == nullptr) return DequantizeBlockRef(spec, record, token_norms, k_out, v_out);
  codec.decode(spec, BlockLayoutOf(spec), record, token_norms, Scratch(simd::ScratchFloats(spec)),
               k_out, v_out);
}

void DequantizeBlockHalvesRef(const QuantSpec& spec, const uint8_t* record,
                              const float* token_norms, uint8_t* k_out, uint8_t* v_out) {
  const int64_t n = static_cast<int64_t>(spec.block_tokens) * spec.head_dim;
  thread_local std::vector<float> rows;
  if (static_cast<int64_t>(rows.size()) < 2 * n) rows.resize(static_cast<size_t>(2 * n));
  DequantizeBlockRef(spec, record, token_norms, rows.data(), rows.data() + n);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t k = FloatToHalf(rows[i]), v = FloatToHalf(rows[n + i]);
    std::memcpy(k_out + 2 * i, &k, 2);
    std::memcpy(v_out + 2 * i, &v, 2);
  }
}

void DequantizeBlockHalves(const QuantSpec& spec, const uint8_t* record, const float* token_norms,
                           uint8_t* k_out, uint8_t* v_out) {
  const SimdCodec codec = PickCodec(spec);
  if (codec.decode_halves == nullptr) {
    return DequantizeBlockHalvesRef(spec, record, token_norms, k_out, v_out);
  }
  codec.decode_halves(spec, BlockLayoutOf(spec), record, token_norms,
                      Scratch(simd::ScratchFloats(spec)), k_out, v_out);
}

void ComputeTokenNormsRef(const KvTensorView& k, float* norms_out) {
  // Each token's sum is one chain of H * D dependent adds; kTokens tokens at a time run as
  // independent chains (each still in (head, channel) order), which the core overlaps.
  constexpr int kTokens = 8;
  const int64_t d = k.head_dim;
  // Past the last token the rows keep older values; those sums are computed and dropped.
  std::vector<float> rows(static_cast<size_t>(kTokens * d), 0.0f);
  for (int64_t t0 = 0; t0 < k.tokens; t0 += kTokens) {
    const int n = static_cast<int>(std::min<int64_t>(kTokens, k.tokens - t0));
    float ss[kTokens] = {};
    for (int64_t h = 0; h < k.heads; ++h) {
      for (int i = 0; i < n; ++i) k.LoadRow(t0 + i, h, &rows[i * d]);
      for (int64_t c = 0; c < d; ++c) {
        for (int i = 0; i < kTokens; ++i) ss[i] += rows[i * d + c] * rows[i * d + c];
      }
    }
    for (int i = 0; i < n; ++i) {
      const float norm = std::sqrt(ss[i]);
      norms_out[t0 + i] = norm > 0.0f ? norm : 1.0f;
    }
  }
}

void ComputeTokenNorms(const KvTensorView& k, float* norms_out) {
  // A large share of OScaR's quantize cost (docs/kvbench_quant.md): the reference converts row by
  // row and sums eight tokens at a time in scalar chains; the SIMD path puts one token per lane.
  const SimdLevel level = g_level.load(std::memory_order_relaxed);
  int64_t done = 0;
  const int d = static_cast<int>(std::min<int64_t>(k.head_dim, std::numeric_limits<int>::max()));
  // The SIMD level's kernel for the view's dtype (none at the scalar level).
  const auto run = [&](auto* avx512, auto* avx2, const auto* data) -> int64_t {
    auto* kernel = level == SimdLevel::kAvx512 ? avx512
                   : level == SimdLevel::kAvx2 ? avx2
                                               : nullptr;
    if (kernel == nullptr) return 0;
    return kernel(data, k.tokens, k.heads, d, k.token_stride, k.head_stride, norms_out);
  };
  if (k.dtype == DType::kF32 && k.head_dim == d) {
    done = run(&simd::TokenNormsAvx512, &simd::TokenNormsAvx2, static_cast<const float*>(k.data));
  } else if (k.dtype == DType::kF16 && k.head_dim == d) {
    // Widened in registers (exact), then the fp32 sums: the reference's LoadRow does the same.
    done = run(&simd::TokenNormsF16InAvx512, &simd::TokenNormsF16InAvx2,
               static_cast<const uint16_t*>(k.data));
  }
  if (done < k.tokens) ComputeTokenNormsRef(k.Tokens(done, k.tokens - done), norms_out + done);
}

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

StatusOr<SimdLevel> ParseSimdLevel(std::string_view name) {
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (name == SimdLevelName(l)) return l;
  }
  return InvalidArgument("got \"", name, "\", expected scalar, avx2 or avx512");
}

#if defined(__x86_64__) || defined(__i386__)
// F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for __builtin_cpu_supports,
// and the fuzz and sanitizer builds use clang 14.
namespace {
bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
}  // namespace
#endif

SimdLevel DetectSimdLevel() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // The codecs convert fp16 with F16C and use FMA3 (VFma); x86 CPUs with AVX2 have both in
  // practice, but they are separate CPUID bits (a hypervisor can hide one): both are checked.
  if (!__builtin_cpu_supports("fma") || !CpuHasF16c()) return SimdLevel::kScalar;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    return SimdLevel::kAvx512;
  }
  if (__builtin_cpu_supports("avx2")) return SimdLevel::kAvx2;
#endif
  return SimdLevel::kScalar;
}

SimdLevel ActiveSimdLevel() { return g_level.load(std::memory_order_relaxed); }

Status SetSimdLevel(SimdLevel level) {
  if (static_cast<int>(level) > static_cast<int>(DetectSimdLevel())) {
    return Unimplemented("simd level: got ", SimdLevelName(level), ", this CPU supports up to ",
                         SimdLevelName(DetectSimdLevel()));
  }
  g_level.store(level, std::memory_order_relaxed);
  return OkStatus();
}

}  // namespace kvctl
