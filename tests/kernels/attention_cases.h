// File: attention test cases shared by tests/kernels (CPU attention), tests/kernels_cuda (GPU
// attention and its warp emulation). One (layer, KV head) cache built from synthetic data, with
// the CPU reference result when a test compares another path against it.
// Thread-safety: plain values; build and use each case on one thread.
// Usage:
//   testing::AttentionCase c = testing::MakeAttentionCase(spec, 4, 3, 2, 9, DType::kF16, 1);
//   REQUIRE(DecodeAttention(spec, c.Kv(), c.Query(), {c.out.data(), c.lse.data()}).ok());
#ifndef KVCTL_TESTS_KERNELS_ATTENTION_CASES_H_
#define KVCTL_TESTS_KERNELS_ATTENTION_CASES_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/half.h"
#include "common/tensor.h"
#include "kernels/attention.h"
#include "kernels/quantize.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl::testing {

// The spec MakeQuantSpec builds for (method, head_dim, k_bits, v_bits); it must be valid.
inline QuantSpec Spec(QuantMethod m, int d, int kb, int vb) {
  StatusOr<QuantSpec> s = MakeQuantSpec(m, d, kb, vb);
  REQUIRE(s.ok());
  return *s;
}

// Writes `x` as one element of `dt` at `p`.
inline void StoreElement(DType dt, float x, uint8_t* p) {
  if (dt == DType::kF32) {
    memcpy(p, &x, 4);
    return;
  }
  const uint16_t h = dt == DType::kF16 ? FloatToHalf(x) : FloatToBf16(x);
  memcpy(p, &h, 2);
}

// One (layer, KV head) cache built from synthetic data: head 1 of a [T, 2, D] stream. Tokens
// [0, sinks) and the last `tail` tokens form the window (stored as [rows, 2, D] in window_dtype,
// head 1 real, head 0 a decoy); the tokens between are quantized into `records` records.
struct HeadCache {
  QuantSpec spec;
  int group = 1;
  std::vector<std::vector<uint8_t>> records;
  std::vector<std::vector<float>> norms;
  std::vector<const uint8_t*> rec_ptrs;
  std::vector<const float*> norm_ptrs;
  DType window_dtype = DType::kF16;
  int64_t window_rows = 0;
  std::vector<uint8_t> window_k, window_v;  // [rows, 2, D] elements of window_dtype.
  std::vector<float> q;                     // [group, D].
  float scale = 1.0f;

  AttentionKv Kv() const {
    AttentionKv kv;
    kv.records = rec_ptrs.data();
    kv.record_norms = spec.method == QuantMethod::kOscar ? norm_ptrs.data() : nullptr;
    kv.num_records = static_cast<int64_t>(rec_ptrs.size());
    if (window_rows > 0) {
      kv.window_k =
          KvTensorView::Contiguous(window_k.data(), window_dtype, window_rows, 2, spec.head_dim);
      kv.window_v =
          KvTensorView::Contiguous(window_v.data(), window_dtype, window_rows, 2, spec.head_dim);
      kv.window_head = 1;
    }
    return kv;
  }
  AttentionQuery Query() const { return {q.data(), group, scale}; }
};

// Builds the cache: records through QuantizeBlockRef, q = the last token's query heads of KV head
// 1, scale = 1/sqrt(D). The same arguments always give the same cache.
inline HeadCache MakeHeadCache(const QuantSpec& spec, int group, int sinks, int records, int tail,
                               DType window_dtype, uint64_t seed) {
  HeadCache hc;
  hc.spec = spec;
  hc.group = group;
  hc.window_dtype = window_dtype;
  const int d = spec.head_dim, gt = spec.block_tokens;
  const int64_t tokens = sinks + static_cast<int64_t>(records) * gt + tail;
  const SyntheticKv kv = GenerateSyntheticKv({.tokens = std::max<int64_t>(tokens, 1),
                                              .heads = 2,
                                              .head_dim = d,
                                              .q_heads = 2 * group,
                                              .seed = seed});
  std::vector<float> norms(static_cast<size_t>(kv.tokens));
  ComputeTokenNorms(kv.KView(), norms.data());
  const size_t row = 2 * static_cast<size_t>(d);  // Floats per token of the [T, 2, D] stream.
  const BlockLayout l = BlockLayoutOf(spec);
  for (int r = 0; r < records; ++r) {
    const int64_t t0 = sinks + static_cast<int64_t>(r) * gt;
    hc.records.emplace_back(l.record_bytes);
    hc.norms.emplace_back(norms.begin() + t0, norms.begin() + t0 + gt);
    const BlockInput in{kv.k.data() + t0 * row + d, kv.v.data() + t0 * row + d,
                        static_cast<int64_t>(row), hc.norms.back().data()};
    REQUIRE(QuantizeBlockRef(spec, in, hc.records.back().data()).ok());
  }
  for (size_t r = 0; r < hc.records.size(); ++r) {
    hc.rec_ptrs.push_back(hc.records[r].data());
    hc.norm_ptrs.push_back(hc.norms[r].data());
  }
  hc.window_rows = sinks + tail;
  const size_t es = DTypeSize(window_dtype);
  hc.window_k.resize(hc.window_rows * row * es);
  hc.window_v.resize(hc.window_k.size());
  for (int64_t w = 0; w < hc.window_rows; ++w) {
    const int64_t t = w < sinks ? w : tokens - tail + (w - sinks);
    for (size_t c = 0; c < row; ++c) {
      StoreElement(window_dtype, kv.k[t * row + c], &hc.window_k[(w * row + c) * es]);
      StoreElement(window_dtype, kv.v[t * row + c], &hc.window_v[(w * row + c) * es]);
    }
  }
  const size_t qrow = static_cast<size_t>(2 * group) * d;
  const float* qlast = kv.q.data() + (kv.tokens - 1) * qrow + static_cast<size_t>(group) * d;
  hc.q.assign(qlast, qlast + static_cast<size_t>(group) * d);
  hc.scale = 1.0f / std::sqrt(static_cast<float>(d));
  return hc;
}

// A HeadCache with room for another path's result (out/lse pre-filled with NaN, so an unwritten
// element fails the comparison) and DecodeAttentionRef's result to compare it with.
struct AttentionCase : HeadCache {
  std::vector<float> out, lse;          // The path under test writes here.
  std::vector<float> ref_out, ref_lse;  // DecodeAttentionRef.
};

inline AttentionCase MakeAttentionCase(const QuantSpec& spec, int group, int sinks, int records,
                                       int tail, DType window_dtype, uint64_t seed) {
  AttentionCase c;
  static_cast<HeadCache&>(c) = MakeHeadCache(spec, group, sinks, records, tail, window_dtype, seed);
  c.out.assign(static_cast<size_t>(group) * spec.head_dim, NAN);
  c.lse.assign(group, NAN);
  c.ref_out.assign(c.out.size(), 0.0f);
  c.ref_lse.assign(group, 0.0f);
  REQUIRE(DecodeAttentionRef(spec, c.Kv(), c.Query(), {c.ref_out.data(), c.ref_lse.data()}).ok());
  return c;
}

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_KERNELS_ATTENTION_CASES_H_
