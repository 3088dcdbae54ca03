// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// R-KV's redundancy state across a head's first compression: with a token-separable quantizer the
// prefill scores each row by the key it will hold once quantized (KvSequence::KeysAsStored), so
// the next scoring finds the rows unchanged and reuses their near-duplicate partners.
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "kernels/convert.h"
#include "kernels/quantize.h"
#include "policies/eviction.h"
#include "tests/controller/sequence/evict_test_util.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl {
namespace {

using testing::PositionsOf;
using testing::Stream;

constexpr int kKvHeads = 2, kQHeads = 4, kD = 64, kPrefill = 300, kBudget = 120, kPeriod = 8;
constexpr int kObs = 8, kFlush = 64;

// Keys in eight clusters (same-cluster cosine about 0.7): rows have partners at many depths.
Stream ClusteredStream(int tokens) {
  Stream s(1, tokens, kKvHeads, kQHeads, kD, 41);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> dirs(8 * kD);
  for (float& x : dirs) x = normal(rng);
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < kKvHeads; ++h) {
      float* row = &s.k[0][(static_cast<size_t>(t) * kKvHeads + h) * kD];
      const int cluster = (t * 5 + h + t / 13) % 8;
      for (int c = 0; c < kD; ++c) row[c] = dirs[cluster * kD + c] + 0.65f * normal(rng);
    }
  }
  return s;
}

std::vector<LayerPlan> Plans(QuantMethod method) {
  StatusOr<QuantSpec> spec = MakeQuantSpec(method, kD, 2, 2);
  REQUIRE(spec.ok());
  std::vector<LayerPlan> plans(1);
  plans[0].head_specs.assign(kKvHeads, *spec);
  plans[0].rules = {.sink_tokens = 0, .flush_tokens = kFlush};
  return plans;
}

EvictionSettings RkvSettings() {
  EvictionSettings s = testing::EvictOn(EvictPolicy::kRKV, 4, kObs, kObs);
  s.tokens_per_head = kBudget;
  s.compression_period = kPeriod;
  s.rkv.lambda = 0.3f;
  return s;
}

// Head h's prefill keys as a TurboQuant record holds them: each token quantized on its own (a
// block of copies of it) from its fp16 value, decoded and rounded to fp16 as the daemon's
// scorers read records.
std::vector<float> KeysOnceQuantized(const Stream& s, const QuantSpec& spec, int h, int tokens) {
  const int g = spec.block_tokens;
  std::vector<float> raw = s.Keys(0, h, tokens), out(raw.size());
  std::vector<uint16_t> block(static_cast<size_t>(g) * kD);
  std::vector<uint8_t> record(BlockLayoutOf(spec).record_bytes);
  std::vector<float> k(block.size());
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < g; ++i) {
      ConvertElements(DType::kF32, &raw[static_cast<size_t>(t) * kD], DType::kF16,
                      &block[static_cast<size_t>(i) * kD], kD);
    }
    const BlockInput in{.row_stride = kD, .k_f16 = block.data(), .v_f16 = block.data()};
    REQUIRE(QuantizeBlock(spec, in, record.data()).ok());
    DequantizeBlock(spec, record.data(), nullptr, k.data(), nullptr);
    RoundToHalfInPlace(k.data(), kD);
    std::copy_n(k.data(), kD, &out[static_cast<size_t>(t) * kD]);
  }
  return out;
}

// The positions the pure scorer keeps from the prefill when it reads `keys`.
std::vector<int64_t> ScratchKeep(const Stream& s, const std::vector<float>& keys, int h) {
  const EvictionSettings ev = RkvSettings();
  StatusOr<KvTensorView> g = QueryGroup(s.QueryRows(0, kPrefill - kObs, kObs), kKvHeads, h);
  REQUIRE(g.ok());
  const ProtectedRegions regions{.sinks = ev.sinks, .recent = ev.window};
  StatusOr<std::vector<float>> scores = ScoreRKV({keys.data(), kPrefill, kD}, *g, regions, ev.rkv);
  REQUIRE(scores.ok());
  StatusOr<std::vector<int64_t>> kept =
      SelectKeep(*scores, kBudget - kPeriod + 1, ProtectedMask(kPrefill, regions));
  REQUIRE(kept.ok());
  return *kept;
}

TEST_CASE(
    "R-KV: the prefill scores TurboQuant rows as they will be stored, and the next scoring "
    "reuses them",
    "[controller][evict]") {
  const Stream s = ClusteredStream(kPrefill + 2 * kPeriod);
  auto pool = testing::MakeTestPool(8 << 20, 4096);
  const std::vector<LayerPlan> plans = Plans(QuantMethod::kTurbo);
  KvSequence seq(
      pool.get(),
      {.layers = 1, .kv_heads = kKvHeads, .head_dim = kD, .dtype = DType::kF32, .q_heads = kQHeads},
      plans, RkvSettings());
  REQUIRE(s.Append(seq, 0, kPrefill).ok());
  const DenseKv dense = seq.FetchDense(0, 1);
  for (int h = 0; h < kKvHeads; ++h) {
    INFO("head " << h);
    const std::vector<int64_t> as_stored =
        ScratchKeep(s, KeysOnceQuantized(s, plans[0].head_specs[h], h, kPrefill), h);
    // The keys as they came choose otherwise on these rows: the check below can tell the two.
    REQUIRE(ScratchKeep(s, s.Keys(0, h, kPrefill), h) != as_stored);
    CHECK(PositionsOf(dense, h) == as_stored);
    const RedundancyState& state = seq.RedundancyStateOf(0, h);
    CHECK(state.rows() == static_cast<int64_t>(as_stored.size()));
  }
  // Decode steps up to the next compression: it reuses every row the flush did not leave in the
  // tail (those are fp16 until the next flush, not the key they were scored by).
  const uint64_t compressions = seq.HeadUsageOf(0, 0).compressions;
  for (int t = kPrefill; seq.HeadUsageOf(0, 0).compressions == compressions; ++t) {
    REQUIRE(t < s.tokens);
    REQUIRE(s.Append(seq, t, 1).ok());
  }
  for (int h = 0; h < kKvHeads; ++h) {
    INFO("head " << h);
    // evict.sinks raises the fp16 sinks to 4 (KvSequence): the flush packs what follows them.
    const int64_t kept = kBudget - kPeriod + 1, sinks = 4;
    const int64_t tail = (kept - sinks) % kFlush;
    const RedundancyState& state = seq.RedundancyStateOf(0, h);
    CHECK(state.reused_rows == kept - tail);
    CHECK_FALSE(state.full_pass);
  }
}

TEST_CASE("R-KV: a quantizer that is not token-separable scores the prefill's rows as they are",
          "[controller][evict]") {
  // KIVI's K codes depend on the record's other tokens, which the eviction has not chosen yet.
  const Stream s = ClusteredStream(kPrefill + 2 * kPeriod);
  auto pool = testing::MakeTestPool(8 << 20, 4096);
  KvSequence seq(
      pool.get(),
      {.layers = 1, .kv_heads = kKvHeads, .head_dim = kD, .dtype = DType::kF32, .q_heads = kQHeads},
      Plans(QuantMethod::kKivi), RkvSettings());
  REQUIRE(s.Append(seq, 0, kPrefill).ok());
  const DenseKv dense = seq.FetchDense(0, 1);
  for (int h = 0; h < kKvHeads; ++h) {
    std::vector<float> keys = s.Keys(0, h, kPrefill);
    RoundToHalfInPlace(keys.data(), keys.size());
    CHECK(PositionsOf(dense, h) == ScratchKeep(s, keys, h));
  }
  // Its records' keys differ from the rows scored: the next scoring starts afresh.
  const uint64_t compressions = seq.HeadUsageOf(0, 0).compressions;
  for (int t = kPrefill; seq.HeadUsageOf(0, 0).compressions == compressions; ++t) {
    REQUIRE(t < s.tokens);
    REQUIRE(s.Append(seq, t, 1).ok());
  }
  for (int h = 0; h < kKvHeads; ++h) CHECK(seq.RedundancyStateOf(0, h).reused_rows == 0);
}

}  // namespace
}  // namespace kvctl
