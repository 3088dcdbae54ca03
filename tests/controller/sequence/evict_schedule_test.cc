// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// When eviction compresses, and how much it re-packs: evict.stagger_layers (layers take turns
// instead of all compressing on the decode step they overflow together) and evict.whole_records
// (streaming drops whole quantized records instead of re-quantizing the ones behind its cut).
#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "controller/sequence/budget_resolve.h"
#include "controller/sequence/eviction_driver.h"
#include "controller/sequence/kv_sequence.h"
#include "policies/reasonalloc.h"
#include "tests/controller/sequence/evict_test_util.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl {
namespace {

using testing::Stream;

// KIVI 2-bit records of `block` tokens flushed every `flush`, `sinks` fp16 sink rows.
std::vector<LayerPlan> KiviPlans(int layers, int heads, int d, int block, int flush, int sinks) {
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kKivi, d, 2, 2);
  REQUIRE(spec.ok());
  spec->block_tokens = spec->k_group_tokens = block;
  REQUIRE(ValidateQuantSpec(*spec).ok());
  std::vector<LayerPlan> plans(static_cast<size_t>(layers));
  for (LayerPlan& p : plans) {
    p.head_specs.assign(static_cast<size_t>(heads), *spec);
    p.rules = testing::PinnedRules(QuantMethod::kKivi);
    p.rules.flush_tokens = flush;
    p.rules.sink_tokens = sinks;
  }
  return plans;
}

EvictionSettings Fixed(EvictPolicy policy, int64_t budget, int64_t period) {
  EvictionSettings s = testing::EvictOn(policy, 4, 8, 8);
  s.tokens_per_head = budget;
  s.compression_period = period;
  return s;
}

SequenceGeometry Geometry(int layers, int kv_heads, int d) {
  return {.layers = layers,
          .kv_heads = kv_heads,
          .head_dim = d,
          .dtype = DType::kF32,
          .q_heads = 2 * kv_heads};
}

TEST_CASE("CompressionDue: every layer once per period, in turns", "[controller][evict]") {
  const int layers = 8;
  for (int64_t period : {2, 4, 8, 32}) {
    INFO("period " << period);
    std::vector<int> due_count(layers, 0);
    for (int64_t t = 100; t < 100 + period; ++t) {
      int due_now = 0;
      for (int l = 0; l < layers; ++l) {
        if (CompressionDue(period, l, layers, t, t + 1)) ++due_count[l], ++due_now;
      }
      CHECK(due_now <= (layers + period - 1) / period);
    }
    for (int c : due_count) CHECK(c == 1);
    // An append of a whole period or more is due for every layer.
    for (int l = 0; l < layers; ++l) CHECK(CompressionDue(period, l, layers, 7, 7 + period));
  }
  CHECK(CompressionDue(1, 3, layers, 5, 6));
}

// Per decode step, the layers whose head 0 `field` of HeadUsage moved during it: compressions
// (each compression counts), or the budget (which, with the layer's budget fixed, only a head
// re-allocation moves).
template <typename T>
std::vector<int> MovedLayers(const KvSequence& seq, int layers, T HeadUsage::*field,
                             std::vector<T>* last) {
  std::vector<int> out;
  for (int l = 0; l < layers; ++l) {
    const T now = seq.HeadUsageOf(l, 0).*field;
    if (now != (*last)[l]) out.push_back(l);
    (*last)[l] = now;
  }
  return out;
}

std::vector<int> CompressedLayers(const KvSequence& seq, int layers, std::vector<uint64_t>* last) {
  return MovedLayers(seq, layers, &HeadUsage::compressions, last);
}

TEST_CASE("Eviction: staggered layers compress in turns, as often, within their budgets",
          "[controller][evict]") {
  const int layers = 8, kv_heads = 2, d = 32, prefill = 60, total = 220;
  const int64_t budget = 48, period = 4;
  const EvictPolicy policy = GENERATE(EvictPolicy::kStreaming, EvictPolicy::kSnapKV);
  INFO("policy " << EvictPolicyName(policy));
  const Stream s(layers, total, kv_heads, 2 * kv_heads, d, 21);
  auto pool = testing::MakeTestPool(16 << 20, 4096);
  auto pool_sync = testing::MakeTestPool(16 << 20, 4096);
  EvictionSettings staggered = Fixed(policy, budget, period);
  staggered.stagger_layers = true;
  KvSequence seq(pool.get(), Geometry(layers, kv_heads, d),
                 KiviPlans(layers, kv_heads, d, 8, 16, 4), staggered);
  KvSequence sync(pool_sync.get(), Geometry(layers, kv_heads, d),
                  KiviPlans(layers, kv_heads, d, 8, 16, 4), Fixed(policy, budget, period));
  REQUIRE(s.Append(seq, 0, prefill).ok());
  REQUIRE(s.Append(sync, 0, prefill).ok());
  std::vector<uint64_t> last(layers, 0), last_sync(layers, 0);
  CompressedLayers(seq, layers, &last);
  CompressedLayers(sync, layers, &last_sync);
  size_t most = 0, most_sync = 0;
  for (int t = prefill; t < total; ++t) {
    REQUIRE(s.Append(seq, t, 1).ok());
    REQUIRE(s.Append(sync, t, 1).ok());
    INFO("token " << t);
    const std::vector<int> now = CompressedLayers(seq, layers, &last);
    most = std::max(most, now.size());
    most_sync = std::max(most_sync, CompressedLayers(sync, layers, &last_sync).size());
    for (int l : now) CHECK(CompressionDue(period, l, layers, t, t + 1));
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kv_heads; ++h) {
        const HeadUsage u = seq.HeadUsageOf(l, h);
        CHECK(u.tokens <= u.budget);
        CHECK(u.tokens >= budget - period + 1);  // Never compressed below its target.
      }
    }
    CHECK(pool->Stats().pages_used == testing::PackedPages(seq, layers, kv_heads, 2 * d * 2, 4096));
  }
  // Unstaggered, every layer overflows on the same step; staggered, two layers per step at most.
  CHECK(most_sync == layers);
  CHECK(most <= static_cast<size_t>((layers + period - 1) / period));
  // With a fixed budget a layer compresses as often either way (its first turn may come earlier).
  for (int l = 0; l < layers; ++l) {
    const uint64_t a = seq.HeadUsageOf(l, 0).compressions, b = sync.HeadUsageOf(l, 0).compressions;
    CHECK(a >= b);
    CHECK(a <= b + 1);
  }
}

TEST_CASE("StaggerInterval: the period, or longer where the budget grows with the tokens",
          "[controller][evict]") {
  EvictionSettings s = Fixed(EvictPolicy::kSnapKV, 48, 32);
  CHECK(StaggerInterval(s, 8192) == 32);  // tokens_per_head: fixed.
  s.tokens_per_head = 0;
  for (auto [fraction, interval] :
       {std::pair{0.25, 32}, {0.5, 32}, {0.75, 64}, {0.875, 128}, {0.98, 800}, {1.0, 32 * 1024}}) {
    INFO("token_fraction " << fraction);
    s.token_fraction = fraction;
    CHECK(StaggerInterval(s, 8192) == interval);
  }
  // While the floor exceeds the fraction the budget is fixed too.
  s.token_fraction = 0.98;
  s.floor = 100;
  CHECK(StaggerInterval(s, 100) == 32);
  CHECK(StaggerInterval(s, 8192) == 800);
  // So are joint caps, and a period of 1 (every overflow) stays 1.
  s.head_caps = {100, 100};
  CHECK(StaggerInterval(s, 8192) == 32);
  s.head_caps.clear();
  s.compression_period = 1;
  CHECK(StaggerInterval(s, 8192) == 1);
}

TEST_CASE("Eviction: with a growing budget staggered layers compress when half a period is due",
          "[controller][evict]") {
  // token_fraction 0.9, period 4: a head compressed to budget - 3 overflows again after about 40
  // tokens. Every 4 tokens (the interval of a fixed budget) it would drop one token or none; the
  // staggered interval is 4 / (2 x 0.1) = 20 tokens, about 2 tokens each.
  const int layers = 8, kv_heads = 2, d = 32, prefill = 60, total = 460;
  const int64_t period = 4;
  const Stream s(layers, total, kv_heads, 2 * kv_heads, d, 23);
  auto pool = testing::MakeTestPool(16 << 20, 4096);
  EvictionSettings settings = testing::EvictOn(EvictPolicy::kSnapKV, 4, 8, 8);
  settings.token_fraction = 0.9;
  settings.compression_period = period;
  settings.stagger_layers = true;
  const int64_t interval = StaggerInterval(settings, total);
  REQUIRE(interval == 20);
  KvSequence seq(pool.get(), Geometry(layers, kv_heads, d),
                 KiviPlans(layers, kv_heads, d, 8, 16, 4), settings);
  REQUIRE(s.Append(seq, 0, prefill).ok());
  std::vector<uint64_t> last(layers, 0);
  CompressedLayers(seq, layers, &last);
  size_t most = 0;
  for (int t = prefill; t < total; ++t) {
    REQUIRE(s.Append(seq, t, 1).ok());
    INFO("token " << t);
    const std::vector<int> now = CompressedLayers(seq, layers, &last);
    most = std::max(most, now.size());
    // Each compression is the layer's turn: none was forced by an overflow.
    for (int l : now) CHECK(CompressionDue(interval, l, layers, t, t + 1));
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kv_heads; ++h) {
        const HeadUsage u = seq.HeadUsageOf(l, h);
        CHECK(u.tokens <= u.budget);
      }
    }
  }
  CHECK(most == 1);
  // 400 decode tokens: 20 turns per layer, against 100 at the fixed budget's interval.
  const int turns = (total - prefill) / static_cast<int>(interval);
  for (int l = 0; l < layers; ++l) {
    INFO("layer " << l);
    const HeadUsage u = seq.HeadUsageOf(l, 0);
    CHECK(u.compressions >= static_cast<uint64_t>(turns - 1));
    CHECK(u.compressions <= static_cast<uint64_t>(turns + 2));  // + the prefill's.
    CHECK(u.evicted_tokens >= static_cast<uint64_t>((total - prefill) / 10 - 4));
  }
}

TEST_CASE("Eviction: a memory budget holds the payload at its share of fp16 as the sequence grows",
          "[controller][evict]") {
  // evict-only at budget.fp16_fraction 1/8 over TurboQuant K4/V3 (60 bytes a token as records,
  // 256 as fp16 rows): the heads keep about 53 % of the tokens less the mean fp16 tail's price,
  // and the payload (records and rows, no page slack) averages 1/8 of the fp16 rows of the
  // tokens seen, whatever the length.
  const int layers = 4, kv_heads = 2, d = 64, prefill = 256, total = 2304;
  const Stream s(layers, total, kv_heads, 2 * kv_heads, d, 41);
  auto pool = testing::MakeTestPool(32 << 20, 4096);
  const Config c = testing::WithToml(
      "[quant]\nmethod = \"turbo\"\nk_bits = 4\nv_bits = 3\nflush_tokens = 64\n[budget]\nmode = "
      "\"evict-only\"\nfp16_fraction = 0.125\n[evict]\npolicy = \"snapkv\"\nobs_window = 8\n"
      "compression_period = 16\n");
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kTurbo, d, 4, 3);
  REQUIRE(spec.ok());
  std::vector<LayerPlan> plans(layers);
  for (LayerPlan& p : plans) {
    p.head_specs.assign(kv_heads, *spec);
    p.rules = {.sink_tokens = 0, .flush_tokens = 64};
  }
  StatusOr<EvictionSettings> settings = ResolveEviction(c, {layers, kv_heads, 2 * kv_heads, d, 0});
  REQUIRE(settings.ok());
  AimEvictionAtMemory(c, plans, d, DType::kF32, &*settings);
  REQUIRE(settings->token_fraction > 0.5);
  KvSequence seq(pool.get(), Geometry(layers, kv_heads, d), plans, *settings);
  REQUIRE(s.Append(seq, 0, prefill).ok());
  double share_sum = 0, share_max = 0;
  int steps = 0;
  for (int t = prefill; t < total; ++t) {
    REQUIRE(s.Append(seq, t, 1).ok());
    uint64_t payload = 0;
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kv_heads; ++h) {
        const HeadUsage u = seq.HeadUsageOf(l, h);
        CHECK(u.tokens <= u.budget);
        payload += u.payload_bytes;
      }
    }
    const double fp16 = static_cast<double>(t + 1) * layers * kv_heads * 2 * d * 2;
    const double share = static_cast<double>(payload) / fp16;
    if (t + 1 >= 1024) {  // Past the floor's and the prefill's reach.
      share_sum += share;
      share_max = std::max(share_max, share);
      ++steps;
    }
  }
  INFO("mean " << share_sum / steps << ", max " << share_max);
  CHECK(share_sum / steps == Approx(0.125).epsilon(0.04));
  // The tail swings by up to 32 fp16 rows around its mean: at 1,024 tokens 32 x (256 - 60)
  // bytes per head are 0.024 of the fp16 rows.
  CHECK(share_max <= 0.125 + 0.025);
}

std::vector<int> ResplitLayers(const KvSequence& seq, int layers, std::vector<int64_t>* last) {
  return MovedLayers(seq, layers, &HeadUsage::budget, last);
}

TEST_CASE("Eviction: staggered layers re-split their heads' budgets in turns",
          "[controller][evict]") {
  const int layers = 8, kv_heads = 2, d = 32, prefill = 64, total = 260;
  const int64_t budget = 48, realloc = 16;
  const Stream s(layers, total, kv_heads, 2 * kv_heads, d, 33);
  auto pool = testing::MakeTestPool(16 << 20, 4096);
  auto pool_sync = testing::MakeTestPool(16 << 20, 4096);
  EvictionSettings sync_settings = Fixed(EvictPolicy::kSnapKV, budget, 4);
  sync_settings.realloc_period = realloc;
  sync_settings.floor = StarvationFloor(8, budget);
  EvictionSettings staggered = sync_settings;
  staggered.stagger_layers = true;
  KvSequence seq(pool.get(), Geometry(layers, kv_heads, d),
                 KiviPlans(layers, kv_heads, d, 8, 16, 4), staggered);
  KvSequence sync(pool_sync.get(), Geometry(layers, kv_heads, d),
                  KiviPlans(layers, kv_heads, d, 8, 16, 4), sync_settings);
  REQUIRE(s.Append(seq, 0, prefill).ok());
  REQUIRE(s.Append(sync, 0, prefill).ok());
  std::vector<int64_t> last(layers, 0), last_sync(layers, 0);
  ResplitLayers(seq, layers, &last);
  ResplitLayers(sync, layers, &last_sync);
  size_t most = 0, most_sync = 0, moves = 0;
  for (int t = prefill; t < total; ++t) {
    REQUIRE(s.Append(seq, t, 1).ok());
    REQUIRE(s.Append(sync, t, 1).ok());
    INFO("token " << t);
    const std::vector<int> now = ResplitLayers(seq, layers, &last);
    most = std::max(most, now.size());
    moves += now.size();
    most_sync = std::max(most_sync, ResplitLayers(sync, layers, &last_sync).size());
    for (int l : now) CHECK(CompressionDue(realloc, l, layers, t, t + 1));
    for (int l = 0; l < layers; ++l) {
      int64_t sum = 0;
      for (int h = 0; h < kv_heads; ++h) {
        const HeadUsage u = seq.HeadUsageOf(l, h);
        CHECK(u.tokens <= u.budget);
        CHECK(u.budget >= staggered.floor);
        sum += u.budget;
      }
      CHECK(sum == seq.LayerBudget(l));
    }
  }
  // Re-splits did move budgets (the test is not vacuous); unstaggered, several layers move on one
  // step; staggered, one layer per step at most (ceil(8 / 16)).
  CHECK(moves >= static_cast<size_t>(layers));
  CHECK(most_sync > 1);
  CHECK(most == 1);
}

TEST_CASE("Eviction: streaming drops whole records and never re-quantizes a kept token",
          "[controller][evict]") {
  // Records of 8 tokens, compression period 3: the cut at budget - 2 falls inside a record, so
  // without whole_records every compression re-packs the records behind it.
  const int d = 32, total = 160, kv_heads = 2;
  const int64_t budget = 40, period = 3;
  const Stream s(1, total, kv_heads, 2 * kv_heads, d, 5);
  auto pool = testing::MakeTestPool(8 << 20, 4096);
  auto pool_q = testing::MakeTestPool(8 << 20, 4096);
  auto pool_exact = testing::MakeTestPool(8 << 20, 4096);
  EvictionSettings whole = Fixed(EvictPolicy::kStreaming, budget, period);
  whole.whole_records = true;
  EvictionSettings exact = whole;
  exact.whole_records = false;
  KvSequence seq(pool.get(), Geometry(1, kv_heads, d), KiviPlans(1, kv_heads, d, 8, 8, 4), whole);
  // The same sequence given Q: it decodes every key to measure the kept attention mass, so its
  // compaction reads decoded records where `seq` reads none; both must store the same.
  KvSequence with_q(pool_q.get(), Geometry(1, kv_heads, d), KiviPlans(1, kv_heads, d, 8, 8, 4),
                    whole);
  KvSequence repack(pool_exact.get(), Geometry(1, kv_heads, d), KiviPlans(1, kv_heads, d, 8, 8, 4),
                    exact);
  int64_t min_kept = budget;
  for (int t = 0; t < total; ++t) {
    REQUIRE(s.Append(seq, t, 1, /*with_q=*/false).ok());
    REQUIRE(s.Append(with_q, t, 1, /*with_q=*/true).ok());
    REQUIRE(s.Append(repack, t, 1, /*with_q=*/false).ok());
    INFO("token " << t);
    const DenseKv a = seq.FetchDense(0, 1), b = with_q.FetchDense(0, 1);
    CHECK(a.positions == b.positions);
    CHECK(a.k == b.k);
    CHECK(a.v == b.v);
    for (int h = 0; h < kv_heads; ++h) {
      const HeadUsage u = seq.HeadUsageOf(0, h);
      CHECK(u.tokens <= budget);
      if (u.compressions > 0) min_kept = std::min(min_kept, u.tokens);
    }
    // Streaming keeps the sinks and a contiguous run of the newest tokens.
    for (size_t i = 0; i + 1 < a.counts[0]; ++i) {
      if (a.positions[i] >= 4) CHECK(a.positions[i + 1] == a.positions[i] + 1);
    }
    CHECK(pool->Stats().pages_used == testing::PackedPages(seq, 1, kv_heads, 2 * d * 2, 4096));
  }
  const HeadUsage u = seq.HeadUsageOf(0, 0);
  CHECK(u.compressions > 0);
  CHECK(u.requantized_tokens == 0);
  CHECK(u.evicted_bytes % BlockLayoutOf(seq.HeadSpec(0, 0)).record_bytes == 0);
  // Up to a record's worth more is evicted than the cut asks: never below target - (block - 1).
  CHECK(min_kept >= budget - period + 1 - 7);
  CHECK(min_kept < budget - period + 1);
  // The exact cut re-quantizes the records behind it.
  CHECK(repack.HeadUsageOf(0, 0).requantized_tokens > 0);
  CHECK(repack.HeadUsageOf(0, 0).tokens <= budget);
}

}  // namespace
}  // namespace kvctl
