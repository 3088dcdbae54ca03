// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// Token eviction inside KvSequence (ragged per-head storage, budgets during APPEND) and the
// budget modes' plans (quant-only widths, joint caps); how the keys resolve:
// budget_resolve_test.cc.
#include "policies/eviction.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "common/half.h"
#include "controller/config/config.h"
#include "controller/sequence/budget_resolve.h"
#include "controller/sequence/kv_sequence.h"
#include "controller/service/blocks_reply.h"
#include "ipc/client.h"
#include "ipc/protocol.h"
#include "policies/ratequant.h"
#include "policies/ratequant_fit.h"
#include "policies/reasonalloc.h"
#include "tests/controller/sequence/evict_test_util.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl {
namespace {

using testing::PositionsOf;
using testing::Stream;
using testing::WithToml;

// fp32 rows of `layers` x `kv_heads` x `d`, with Q of `q_heads` heads.
SequenceGeometry F32Geometry(int layers, int kv_heads, int d, int q_heads) {
  return {.layers = layers,
          .kv_heads = kv_heads,
          .head_dim = d,
          .dtype = DType::kF32,
          .q_heads = q_heads};
}

std::vector<LayerPlan> Plans(int layers, int heads, QuantMethod m, int d, bool lossless,
                             int block = 0, int flush = 0, int sinks = -1) {
  std::vector<LayerPlan> plans(static_cast<size_t>(layers));
  for (LayerPlan& p : plans) {
    p.lossless = lossless;
    StatusOr<QuantSpec> spec =
        MakeQuantSpec(m, d, m == QuantMethod::kFp16 ? 16 : 2, m == QuantMethod::kFp16 ? 16 : 2);
    REQUIRE(spec.ok());
    if (block > 0) spec->block_tokens = spec->k_group_tokens = block;
    REQUIRE(ValidateQuantSpec(*spec).ok());
    p.head_specs.assign(static_cast<size_t>(heads), *spec);
    p.rules = testing::PinnedRules(m);
    if (flush > 0) p.rules.flush_tokens = flush;
    if (sinks >= 0) p.rules.sink_tokens = sinks;
  }
  return plans;
}

EvictionSettings Settings(EvictPolicy policy, int64_t budget, int64_t sinks, int64_t window,
                          int64_t obs) {
  EvictionSettings s = testing::EvictOn(policy, sinks, window, obs);
  s.tokens_per_head = budget;
  return s;
}

// Positions of (layer, head) in a dense fetch of every layer.
TEST_CASE("Eviction: each policy keeps exactly the tokens the pure scorer picks",
          "[controller][evict]") {
  const int kv_heads = 2, q_heads = 4, d = 8, first = 24, budget = 16;
  const Stream s(1, first + 4, kv_heads, q_heads, d, 7);
  for (EvictPolicy policy :
       {EvictPolicy::kStreaming, EvictPolicy::kH2O, EvictPolicy::kSnapKV, EvictPolicy::kRKV}) {
    INFO(EvictPolicyName(policy));
    auto pool = testing::MakeTestPool(4 << 20, 4096);
    const EvictionSettings settings = Settings(policy, budget, 2, 4, 4);
    SequenceGeometry geometry = F32Geometry(1, kv_heads, d, q_heads);
    geometry.quality_sample_period = 4;  // The retained mass: compressions 0, 4, 8, ...
    KvSequence seq(pool.get(), geometry,
                   Plans(1, kv_heads, QuantMethod::kFp16, d, /*lossless=*/true), settings);
    // The first append (24 tokens) already passes the budget, and so does the next one.
    REQUIRE(s.Append(seq, 0, first).ok());
    std::vector<std::set<int64_t>> after_first(kv_heads);
    const ProtectedRegions regions{.sinks = 2, .recent = 4};
    for (int h = 0; h < kv_heads; ++h) {
      std::vector<float> keys = s.Keys(0, h, first);
      const KeyRows rows{keys.data(), first, d};
      StatusOr<KvTensorView> obs = QueryGroup(s.QueryRows(0, first - 4, 4), kv_heads, h);
      StatusOr<KvTensorView> all_q = QueryGroup(s.QueryRows(0, 0, first), kv_heads, h);
      REQUIRE((obs.ok() && all_q.ok()));
      H2OState state;
      auto score = [&]() -> StatusOr<std::vector<float>> {
        switch (policy) {
          case EvictPolicy::kStreaming:
            return ScoreStreaming(first, regions);
          case EvictPolicy::kH2O:
            KVCTL_RETURN_IF_ERROR(UpdateH2O(&state, rows, *all_q));
            return ScoreH2O(state, regions);
          case EvictPolicy::kSnapKV:
            return ScoreSnapKV(rows, *obs, regions, settings.snapkv);
          case EvictPolicy::kRKV:
            return ScoreRKV(rows, *obs, regions, settings.rkv);
        }
        return InvalidArgument("policy");
      };
      StatusOr<std::vector<float>> scores = score();
      REQUIRE(scores.ok());
      StatusOr<std::vector<int64_t>> kept =
          SelectKeep(*scores, budget, ProtectedMask(first, regions));
      REQUIRE(kept.ok());
      const DenseKv dense = seq.FetchDense(0, 1);
      CHECK(PositionsOf(dense, h) == *kept);  // Positions start at 0: index == position.
      after_first[h] = std::set<int64_t>(kept->begin(), kept->end());
      // The kept rows are the appended rows, exactly (lossless fp32).
      size_t at = h == 0 ? 0 : dense.counts[0];
      for (int64_t j : *kept) {
        for (int c = 0; c < d; ++c) CHECK(dense.k[at * d + c] == keys[j * d + c]);
        ++at;
      }
      const HeadUsage u = seq.HeadUsageOf(0, h);
      CHECK(u.tokens == budget);
      CHECK(u.evicted_tokens == first - budget);
      CHECK(u.budget == budget);
      // Q came with the append and it is the head's first compression: the mass was measured.
      CHECK(u.retained_samples == 1);
    }
    // One more token: 17 > 16, so exactly one token goes, the one the scorer ranks lowest among
    // the survivors.
    REQUIRE(s.Append(seq, first, 1).ok());
    const DenseKv dense = seq.FetchDense(0, 1);
    for (int h = 0; h < kv_heads; ++h) {
      const std::vector<int64_t> pos = PositionsOf(dense, h);
      CHECK(pos.size() == budget);
      CHECK(pos.back() == first);
      CHECK(std::is_sorted(pos.begin(), pos.end()));
      int missing = 0;
      for (int64_t p : after_first[h]) missing += std::count(pos.begin(), pos.end(), p) == 0;
      CHECK(missing == 1);
      if (policy == EvictPolicy::kStreaming) {
        // FIFO: sinks 0, 1, then the 14 newest.
        CHECK(pos[0] == 0);
        CHECK(pos[1] == 1);
        CHECK(pos[2] == first - 13);
      }
      // The second compression is not sampled (period 4); the fifth is.
      CHECK(seq.HeadUsageOf(0, h).compressions == 2);
      CHECK(seq.HeadUsageOf(0, h).retained_samples == 1);
    }
    for (int64_t t = first + 1; t < first + 4; ++t) REQUIRE(s.Append(seq, t, 1).ok());
    for (int h = 0; h < kv_heads; ++h) {
      CHECK(seq.HeadUsageOf(0, h).compressions == 5);
      CHECK(seq.HeadUsageOf(0, h).retained_samples == 2);
    }
  }
}

TEST_CASE("Eviction: a lossless layer keeps its rows exact however much it holds, never records",
          "[controller][evict]") {
  // Budgets above the plan's flush size: an evicting lossless head rewrites its rows, and must
  // not flush them into records on the way (flush 48 not a multiple of block 16 once tripped an
  // invariant, a multiple rounded the rows to fp16 records).
  const int kv_heads = 2, d = 8, tokens = 200, budget = 64;
  const Stream s(1, tokens, kv_heads, 0, d, 11);
  for (int flush : {16, 48}) {
    INFO("flush " << flush);
    auto pool = testing::MakeTestPool(4 << 20, 4096);
    KvSequence seq(pool.get(), F32Geometry(1, kv_heads, d, 0),
                   Plans(1, kv_heads, QuantMethod::kFp16, d, /*lossless=*/true, 16, flush),
                   Settings(EvictPolicy::kStreaming, budget, 2, 8, 8));
    for (int first = 0; first < tokens; first += 37) {
      REQUIRE(s.Append(seq, first, std::min(37, tokens - first), /*with_q=*/false).ok());
    }
    const DenseKv dense = seq.FetchDense(0, 1);
    for (int h = 0; h < kv_heads; ++h) {
      CHECK(seq.Blocks(0, h).records == 0);
      const std::vector<int64_t> pos = PositionsOf(dense, h);
      REQUIRE(pos.size() <= static_cast<size_t>(budget));
      const std::vector<float> keys = s.Keys(0, h, tokens);
      size_t at = h == 0 ? 0 : dense.counts[0];
      for (int64_t j : pos) {
        for (int c = 0; c < d; ++c) REQUIRE(dense.k[at * d + c] == keys[j * d + c]);
        ++at;
      }
    }
  }
}

TEST_CASE("Eviction: H2O in the daemon equals the pure scorer over a decode",
          "[controller][evict]") {
  const int kv_heads = 1, q_heads = 2, d = 8, total = 40, budget = 12;
  const Stream s(1, total, kv_heads, q_heads, d, 11);
  // Period 4: the daemon folds queries into the accumulators 4 at a time (or before scoring) and
  // compresses to 12 - 4 + 1 = 9; the reference folds every step.
  for (int64_t period : {1, 4}) {
    INFO("compression_period " << period);
    auto pool = testing::MakeTestPool(4 << 20, 4096);
    EvictionSettings settings = Settings(EvictPolicy::kH2O, budget, 1, 3, 3);
    settings.compression_period = period;
    KvSequence seq(pool.get(), F32Geometry(1, kv_heads, d, q_heads),
                   Plans(1, kv_heads, QuantMethod::kFp16, d, true), settings);
    // Reference: the same stream through the pure functions, one token per step.
    std::vector<int64_t> ref_pos;
    std::vector<float> ref_keys;
    H2OState state;
    const ProtectedRegions regions{.sinks = 1, .recent = 3};
    for (int t = 0; t < total; ++t) {
      REQUIRE(s.Append(seq, t, 1).ok());
      const std::vector<float> key = s.Keys(0, 0, t + 1);
      ref_keys.insert(ref_keys.end(), key.end() - d, key.end());
      ref_pos.push_back(t);
      const int64_t n = static_cast<int64_t>(ref_pos.size());
      StatusOr<KvTensorView> g = QueryGroup(s.QueryRows(0, t, 1), kv_heads, 0);
      REQUIRE(UpdateH2O(&state, {ref_keys.data(), n, d}, *g).ok());
      if (n > budget) {
        auto kept =
            SelectKeep(*ScoreH2O(state, regions), budget - period + 1, ProtectedMask(n, regions));
        REQUIRE(kept.ok());
        REQUIRE(CompactH2O(&state, *kept).ok());
        std::vector<int64_t> pos;
        std::vector<float> keys;
        for (int64_t j : *kept) {
          pos.push_back(ref_pos[j]);
          keys.insert(keys.end(), &ref_keys[j * d], &ref_keys[(j + 1) * d]);
        }
        ref_pos = pos;
        ref_keys = keys;
      }
      INFO("step " << t);
      REQUIRE(seq.FetchDense(0, 1).positions == ref_pos);
    }
  }
}

TEST_CASE("Eviction: R-KV in the daemon equals the pure scorer over a decode",
          "[controller][evict]") {
  // The daemon carries each head's near-duplicate partners from one scoring to the next
  // (policies/redundancy.h); the reference scores every step from scratch. Keys in six clusters
  // (same-cluster cosine about 0.8) give every row partners that evictions keep moving.
  const int kv_heads = 2, q_heads = 4, d = 16, total = 150, budget = 30, prefill = 40, obs = 4;
  Stream s(1, total, kv_heads, q_heads, d, 23);
  {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> dirs(6 * d);
    for (float& x : dirs) x = 2.0f * normal(rng);
    for (int t = 0; t < total; ++t) {
      for (int h = 0; h < kv_heads; ++h) {
        float* row = &s.k[0][(static_cast<size_t>(t) * kv_heads + h) * d];
        const int cluster = (t * 7 + h * 3 + t / 11) % 6;
        for (int c = 0; c < d; ++c) row[c] = dirs[cluster * d + c] + 0.5f * normal(rng);
      }
    }
  }
  const ProtectedRegions regions{.sinks = 2, .recent = 4};
  for (int64_t period : {1, 4}) {
    INFO("compression_period " << period);
    auto pool = testing::MakeTestPool(4 << 20, 4096);
    EvictionSettings settings = Settings(EvictPolicy::kRKV, budget, 2, 4, obs);
    settings.rkv.lambda = 0.3f;
    settings.compression_period = period;
    KvSequence seq(pool.get(), F32Geometry(1, kv_heads, d, q_heads),
                   Plans(1, kv_heads, QuantMethod::kFp16, d, true), settings);
    std::vector<std::vector<int64_t>> ref_pos(kv_heads);
    std::vector<std::vector<float>> ref_keys(kv_heads);
    for (int t = 0; t < total;) {
      const int n = t == 0 ? prefill : 1;
      REQUIRE(s.Append(seq, t, n).ok());
      t += n;
      INFO("tokens " << t);
      const DenseKv dense = seq.FetchDense(0, 1);
      for (int h = 0; h < kv_heads; ++h) {
        const std::vector<float> keys = s.Keys(0, h, t);
        ref_keys[h].insert(ref_keys[h].end(), keys.end() - int64_t{n} * d, keys.end());
        for (int j = t - n; j < t; ++j) ref_pos[h].push_back(j);
        const auto rows = static_cast<int64_t>(ref_pos[h].size());
        if (rows > budget) {
          StatusOr<KvTensorView> g = QueryGroup(s.QueryRows(0, t - obs, obs), kv_heads, h);
          REQUIRE(g.ok());
          StatusOr<std::vector<float>> scores =
              ScoreRKV({ref_keys[h].data(), rows, d}, *g, regions, settings.rkv);
          REQUIRE(scores.ok());
          auto kept = SelectKeep(*scores, budget - period + 1, ProtectedMask(rows, regions));
          REQUIRE(kept.ok());
          std::vector<int64_t> pos;
          std::vector<float> kept_keys;
          for (int64_t j : *kept) {
            pos.push_back(ref_pos[h][j]);
            kept_keys.insert(kept_keys.end(), &ref_keys[h][j * d], &ref_keys[h][(j + 1) * d]);
          }
          ref_pos[h] = std::move(pos);
          ref_keys[h] = std::move(kept_keys);
        }
        INFO("head " << h);
        REQUIRE(PositionsOf(dense, h) == ref_pos[h]);
      }
    }
    for (int h = 0; h < kv_heads; ++h) CHECK(seq.HeadUsageOf(0, h).compressions > 20);
  }
}

TEST_CASE("Eviction: budgets, sinks, window and floor hold after every append, pages are freed",
          "[controller][evict]") {
  // KIVI 2-bit records of 8 tokens, flushed at 16: evictions reach into records and compact them.
  const int layers = 2, kv_heads = 2, q_heads = 4, d = 32, total = 200;
  const Stream s(layers, total, kv_heads, q_heads, d, 5);
  const size_t page = 4096;
  auto pool = testing::MakeTestPool(8 << 20, page);
  EvictionSettings settings = Settings(EvictPolicy::kSnapKV, 48, 4, 8, 8);
  settings.realloc_period = 16;
  settings.floor = StarvationFloor(8, 48);  // 16 >= sinks + window = 12.
  settings.layer_profile = LayerProfile::kPyramid;
  settings.compression_period = 4;
  KvSequence seq(pool.get(), F32Geometry(layers, kv_heads, d, q_heads),
                 Plans(layers, kv_heads, QuantMethod::kKivi, d, false, 8, 16, 0), settings);
  const size_t row_slot = 2 * static_cast<size_t>(d) * 2;
  bool budgets_differ = false;
  bool window_gaps = false;  // A window's positions needed more than a sink and a tail run.
  int t = 0;
  for (int n : {30, 1, 1, 7, 1, 1, 1, 1, 40, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                1,  1, 1, 1, 1, 1, 1, 1, 1,  1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                1,  1, 1, 1, 1, 1, 1, 1, 1,  1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                1,  1, 1, 1, 1, 1, 1, 1, 1,  1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    if (t + n > total) break;
    REQUIRE(s.Append(seq, t, n).ok());
    t += n;
    INFO("after token " << t);
    const DenseKv dense = seq.FetchDense(0, layers);
    for (int l = 0; l < layers; ++l) {
      int64_t layer_sum = 0;
      for (int h = 0; h < kv_heads; ++h) {
        const HeadUsage u = seq.HeadUsageOf(l, h);
        CHECK(u.tokens <= u.budget);
        CHECK(u.budget >= settings.floor);
        layer_sum += u.budget;
        budgets_differ |= u.budget != seq.HeadUsageOf(l, 0).budget;
        const std::vector<int64_t> pos = PositionsOf(dense, l * kv_heads + h);
        REQUIRE(static_cast<int64_t>(pos.size()) == u.tokens);
        CHECK(std::is_sorted(pos.begin(), pos.end()));
        for (int64_t p = 0; p < std::min(4, t); ++p) CHECK(pos[p] == p);  // Sinks.
        for (int64_t i = 0; i < std::min(8, t); ++i) {
          CHECK(pos[pos.size() - 1 - i] == t - 1 - i);  // Window.
        }
      }
      CHECK(layer_sum == seq.LayerBudget(l));
    }
    CHECK(pool->Stats().pages_used == testing::PackedPages(seq, layers, kv_heads, row_slot, page));
    // The blocks reply is valid, and its window (row slots, sinks, position runs) is the dense
    // rows' first window_sinks and last rows, at their positions.
    const ipc::FetchBlocksReply blocks = BuildBlocksReply(
        seq, {layers, kv_heads, q_heads, d, DType::kF32}, 0, layers, page, pool->pages_total());
    REQUIRE(ipc::Encode(1, ipc::FetchBlocksReply(blocks)).ok());
    for (int pair = 0; pair < layers * kv_heads; ++pair) {
      const std::vector<int64_t> pos = PositionsOf(dense, pair);
      std::vector<int64_t> window;
      for (uint32_t j = blocks.run_indptr[pair]; j < blocks.run_indptr[pair + 1]; ++j) {
        for (uint32_t i = 0; i < blocks.run_lengths[j]; ++i) {
          window.push_back(static_cast<int64_t>(blocks.run_starts[j] + i));
        }
      }
      window_gaps |= blocks.run_indptr[pair + 1] - blocks.run_indptr[pair] > 2;
      const size_t rows = window.size(), sinks = blocks.window_sinks[pair];
      REQUIRE(rows == blocks.window_indptr[pair + 1] - blocks.window_indptr[pair]);
      REQUIRE(rows <= pos.size());
      for (size_t i = 0; i < rows; ++i) {
        CHECK(window[i] == pos[i < sinks ? i : pos.size() - rows + i]);
      }
    }
  }
  CHECK(budgets_differ);  // Re-allocation moved budget between heads.
  CHECK(window_gaps);     // Re-quantization left kept tokens with gaps in some tail.
  // SnapKV drops tokens from the middle of records: their kept neighbours were re-quantized.
  CHECK(seq.HeadUsageOf(0, 0).requantized_tokens > 0);
  CHECK(seq.Usage().evicted_tokens > 0);
  // Freeing: an unbounded twin of the same stream holds more pages.
  auto pool2 = testing::MakeTestPool(8 << 20, page);
  KvSequence twin(pool2.get(), F32Geometry(layers, kv_heads, d, q_heads),
                  Plans(layers, kv_heads, QuantMethod::kKivi, d, false, 8, 16, 0));
  REQUIRE(s.Append(twin, 0, t).ok());
  CHECK(pool->Stats().pages_used < pool2->Stats().pages_used);
}

TEST_CASE("Eviction: an evicting append frees exactly the pages of the dropped records",
          "[controller][evict]") {
  // Lossless rows of 128 bytes, 32 per 4 KiB page: one head, budget 40 with period 25 -> keeps 16.
  const int d = 16;
  const Stream s(1, 80, 1, 1, d, 3);
  auto pool = testing::MakeTestPool(4 << 20, 4096);
  EvictionSettings settings = Settings(EvictPolicy::kStreaming, 40, 4, 4, 4);
  settings.compression_period = 25;
  KvSequence seq(pool.get(), {.layers = 1, .kv_heads = 1, .head_dim = d, .dtype = DType::kF32},
                 Plans(1, 1, QuantMethod::kFp16, d, true), settings);
  REQUIRE(s.Append(seq, 0, 40, false).ok());
  CHECK(pool->Stats().pages_used == 2);  // 40 rows of 128 bytes: 2 pages.
  CHECK(seq.HeadUsageOf(0, 0).evicted_tokens == 0);
  REQUIRE(s.Append(seq, 40, 1, false).ok());  // 41 > 40: keep 40 - 25 + 1 = 16.
  CHECK(seq.HeadUsageOf(0, 0).tokens == 16);
  CHECK(pool->Stats().pages_used == 1);
  CHECK(seq.HeadUsageOf(0, 0).evicted_tokens == 25);
  CHECK(seq.HeadUsageOf(0, 0).evicted_bytes == 25 * 2 * d * 4);
  const DenseKv dense = seq.FetchDense(0, 1);
  const std::vector<int64_t> want = {0, 1, 2, 3, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40};
  CHECK(dense.positions == want);
}

TEST_CASE("Eviction: RESOURCE_EXHAUSTED during an evicting append changes nothing",
          "[controller][evict]") {
  // KIVI records of 8 tokens (14 per 4 KiB page); 100 tokens, then 60 more with a budget of 140:
  // snapkv evicts from the middle of records and the head still needs a second record page. With
  // the pool full the append fails whole, and succeeds once pages free up.
  const int d = 32;
  const Stream s(1, 200, 2, 2, d, 23);
  auto pool = testing::MakeTestPool(1 << 20, 4096);
  KvSequence seq(pool.get(),
                 {.layers = 1, .kv_heads = 2, .head_dim = d, .dtype = DType::kF32, .q_heads = 2},
                 Plans(1, 2, QuantMethod::kKivi, d, false, 8, 16, 0),
                 Settings(EvictPolicy::kSnapKV, 140, 4, 8, 8));
  REQUIRE(s.Append(seq, 0, 100).ok());  // Under the budget: 4 sink rows, 12 records: one page.
  const DenseKv before = seq.FetchDense(0, 1);
  const HeadUsage usage_before = seq.HeadUsageOf(0, 1);
  std::vector<uint32_t> filler;
  while (true) {
    StatusOr<uint32_t> page = pool->Allocate();
    if (!page.ok()) break;
    filler.push_back(*page);
  }
  const Status full = s.Append(seq, 100, 60);  // Keeps 140: 17 records, a second page.
  CHECK(full.code() == StatusCode::kResourceExhausted);
  const DenseKv after = seq.FetchDense(0, 1);
  CHECK(after.positions == before.positions);
  CHECK(after.k == before.k);
  CHECK(after.counts == before.counts);
  CHECK(seq.HeadUsageOf(0, 1).evicted_tokens == usage_before.evicted_tokens);
  CHECK(seq.tokens() == 100);
  for (uint32_t page : filler) REQUIRE(pool->Free(page).ok());
  REQUIRE(s.Append(seq, 100, 60).ok());
  CHECK(seq.HeadUsageOf(0, 1).tokens <= 140);
  CHECK(seq.HeadUsageOf(0, 1).evicted_tokens > 0);
  CHECK(seq.FetchDense(0, 1).positions.back() == 159);
}

TEST_CASE("Eviction: a missing Q is refused and changes nothing", "[controller][evict]") {
  const int d = 8;
  const Stream s(2, 40, 1, 2, d, 9);
  auto pool = testing::MakeTestPool(4 << 20, 4096);
  KvSequence seq(
      pool.get(), {.layers = 2, .kv_heads = 1, .head_dim = d, .dtype = DType::kF32, .q_heads = 2},
      Plans(2, 1, QuantMethod::kFp16, d, true), Settings(EvictPolicy::kRKV, 16, 2, 8, 8));
  REQUIRE(s.Append(seq, 0, 20).ok());
  const DenseKv before = seq.FetchDense(0, 2);
  const uint64_t pages = pool->Stats().pages_used;
  const Status st = s.Append(seq, 20, 5, /*with_q=*/false);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("q: missing") != std::string::npos);
  CHECK(st.message().find("rkv") != std::string::npos);
  const DenseKv after = seq.FetchDense(0, 2);
  CHECK(after.positions == before.positions);
  CHECK(after.k == before.k);
  CHECK(seq.tokens() == 20);
  CHECK(pool->Stats().pages_used == pages);
  CHECK(s.Append(seq, 20, 5).ok());  // The same tokens with Q go in.
}

TEST_CASE("Eviction: whole-record evictions move records without re-quantizing them",
          "[controller][evict]") {
  // KIVI 2-bit records of 8 tokens flushed at 8; sinks (4, kept as fp16 rows) and window 8;
  // budget 36 with period 8: every compression drops the 8 oldest candidates = one whole record.
  const int d = 32, total = 70;
  const Stream s(1, total, 1, 2, d, 13);
  const size_t page = 4096;
  auto pool = testing::MakeTestPool(4 << 20, page);
  EvictionSettings settings = Settings(EvictPolicy::kStreaming, 36, 4, 8, 8);
  settings.compression_period = 8;
  KvSequence seq(pool.get(),
                 {.layers = 1, .kv_heads = 1, .head_dim = d, .dtype = DType::kF32, .q_heads = 2},
                 Plans(1, 1, QuantMethod::kKivi, d, false, 8, 8, 0), settings);
  std::map<int64_t, std::vector<float>> decoded;  // Position -> decoded K row, once quantized.
  for (int t = 0; t < total; ++t) {
    REQUIRE(s.Append(seq, t, 1, false).ok());
    INFO("token " << t);
    const HeadBlocks b = seq.Blocks(0, 0);
    CHECK(b.sink_rows == std::min(4u, static_cast<uint32_t>(t + 1)));
    const DenseKv dense = seq.FetchDense(0, 1);
    CHECK(dense.counts[0] <= 36);
    for (uint32_t i = b.sink_rows; i < b.sink_rows + b.records * 8; ++i) {
      const std::vector<float> row(dense.k.begin() + i * d, dense.k.begin() + (i + 1) * d);
      auto [it, inserted] = decoded.emplace(dense.positions[i], row);
      CHECK(it->second == row);  // A kept record decodes to the same values as before.
    }
    CHECK(pool->Stats().pages_used == testing::PackedPages(seq, 1, 1, 2 * d * 2, page));
  }
  CHECK(seq.HeadUsageOf(0, 0).evicted_tokens > 0);
  CHECK(seq.HeadUsageOf(0, 0).requantized_tokens == 0);  // Records moved, never decoded.
  CHECK(seq.HeadUsageOf(0, 0).evicted_bytes % (BlockLayoutOf(seq.HeadSpec(0, 0)).record_bytes) ==
        0);
}

TEST_CASE("Eviction: a held page table is reused while its records stay, listed whole after",
          "[controller][evict]") {
  // Streaming drops whole oldest records; SnapKV and H2O drop tokens from the middle of records
  // and re-pack the kept ones. Compactions re-pack into the front slots of the list, so a pair's
  // ids change only where its list shrinks: a table held from before must then be listed whole,
  // and every step in between reuses it (the tag is tested with forged tags in
  // blocks_reply_test). Whatever the daemon lists, the merge is the whole table.
  const int d = 32, total = 120;
  const Stream s(1, total, 1, 2, d, 13);
  const ipc::Geometry g{1, 1, 2, d, DType::kF32};
  for (const auto& [policy, method, budget] :
       {std::tuple{EvictPolicy::kStreaming, QuantMethod::kKivi, 36},
        {EvictPolicy::kSnapKV, QuantMethod::kTurbo, 48},
        {EvictPolicy::kSnapKV, QuantMethod::kKivi, 48},
        {EvictPolicy::kH2O, QuantMethod::kKivi, 64}}) {
    INFO(QuantMethodName(method));
    auto pool = testing::MakeTestPool(4 << 20, 4096);
    EvictionSettings settings = Settings(policy, budget, 4, 8, 8);
    settings.compression_period = 8;
    KvSequence seq(pool.get(), F32Geometry(1, 1, d, 2), Plans(1, 1, method, d, false, 8, 8, 0),
                   settings);
    // Tables of every step so far: a client that FETCHes every step holds the previous one, one
    // that FETCHes every 8 steps the one from 8 steps ago.
    std::vector<ipc::FetchBlocksReply> history;
    BlocksTagCache cache;  // As the controller keeps one per sequence, across the FETCHes.
    int reused = 0, relisted = 0;
    for (int t = 0; t < total; ++t) {
      REQUIRE(s.Append(seq, t, 1).ok());
      INFO("token " << t);
      const ipc::FetchBlocksReply whole = BuildBlocksReply(seq, g, 0, 1, 4096, pool->pages_total());
      for (const size_t lag : {size_t{1}, size_t{8}}) {
        if (history.size() < lag || history[history.size() - lag].indices.empty()) continue;
        const ipc::FetchBlocksReply& held = history[history.size() - lag];
        INFO("held from " << lag << " steps before");
        const uint32_t held_records = held.indptr[1];
        const uint32_t known_records[1] = {held_records};
        // With the cache the tags are those computed from the first record (whole, no cache).
        const ipc::FetchBlocksReply since = BuildBlocksReply(
            seq, g, 0, 1, 4096, pool->pages_total(), {known_records, held.table_tags}, &cache);
        REQUIRE(ipc::Encode(1, ipc::FetchBlocksReply(since)).ok());
        // Reused exactly when the held ids are still the front of the list.
        const bool front =
            whole.indices.size() >= held_records &&
            std::equal(held.indices.begin(), held.indices.end(), whole.indices.begin());
        CHECK(since.record_base[0] == (front ? held_records : 0));
        (front ? reused : relisted) += 1;
        StatusOr<ipc::FetchBlocksReply> merged = ipc::MergeBlocksReply(held, since);
        REQUIRE(merged.ok());
        CHECK(merged->indices == whole.indices);
        CHECK(merged->indptr == whole.indptr);
        CHECK(merged->table_tags == whole.table_tags);
      }
      history.push_back(whole);
    }
    CHECK(reused > 0);
    CHECK(relisted > 0);
  }
}

TEST_CASE("Eviction: token-separable records re-pack kept tokens without changing their values",
          "[controller][evict]") {
  // SnapKV drops tokens from the middle of records. TurboQuant's and QuaRot's kept tokens move
  // into the new records byte for byte (kernels/quant_types.h TokenSeparable): every kept token
  // decodes to the same K and V rows after every compression, and only a remainder of fewer
  // than a record's tokens (which joins the fp16 tail) is ever quantized again. KIVI, whose K
  // groups span tokens, re-quantizes every re-packed token.
  const int d = 32, total = 120;
  const Stream s(1, total, 1, 2, d, 21);
  // Flush 32: a remainder waits in the fp16 tail (flush 8 quantizes it again at once).
  for (const auto& [m, flush] : {std::pair{QuantMethod::kTurbo, 8},
                                 {QuantMethod::kQuaRot, 8},
                                 {QuantMethod::kKivi, 8},
                                 {QuantMethod::kTurbo, 32},
                                 {QuantMethod::kKivi, 32}}) {
    INFO(QuantMethodName(m) << " flush " << flush);
    auto pool = testing::MakeTestPool(4 << 20, 4096);
    EvictionSettings settings = Settings(EvictPolicy::kSnapKV, 48, 4, 8, 8);
    settings.compression_period = 8;
    KvSequence seq(pool.get(), F32Geometry(1, 1, d, 2), Plans(1, 1, m, d, false, 8, flush, 4),
                   settings);
    std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>> decoded;
    int changed = 0, to_tail = 0;
    for (int t = 0; t < total; ++t) {
      REQUIRE(s.Append(seq, t, 1).ok());
      const HeadBlocks b = seq.Blocks(0, 0);
      const DenseKv dense = seq.FetchDense(0, 1);
      std::set<int64_t> in_records;
      for (uint32_t i = b.sink_rows; i < b.sink_rows + b.records * 8; ++i) {
        const auto at = static_cast<std::ptrdiff_t>(i) * d;
        std::vector<float> k(dense.k.begin() + at, dense.k.begin() + at + d);
        std::vector<float> v(dense.v.begin() + at, dense.v.begin() + at + d);
        in_records.insert(dense.positions[i]);
        auto [it, inserted] = decoded.emplace(dense.positions[i], std::pair{k, v});
        if (!inserted && (it->second.first != k || it->second.second != v)) ++changed;
        it->second = {k, v};
      }
      // Positions that left the records without being evicted went back to the fp16 tail, as
      // the fp16 rounding of their last decoded K and V (the compaction decodes the V of such a
      // record only when it needs it: KvSequence::RecordValues).
      std::map<int64_t, size_t> row_of;
      for (size_t i = 0; i < dense.positions.size(); ++i) row_of[dense.positions[i]] = i;
      for (auto it = decoded.begin(); it != decoded.end();) {
        if (in_records.count(it->first)) {
          ++it;
          continue;
        }
        const auto row = row_of.find(it->first);
        if (row != row_of.end()) {
          const auto at = static_cast<std::ptrdiff_t>(row->second) * d;
          for (int c = 0; c < d; ++c) {
            CHECK(dense.k[at + c] == HalfToFloat(FloatToHalf(it->second.first[c])));
            CHECK(dense.v[at + c] == HalfToFloat(FloatToHalf(it->second.second[c])));
          }
          ++to_tail;
        }
        it = decoded.erase(it);
      }
    }
    if (flush == 32) CHECK(to_tail > 0);
    const HeadUsage u = seq.HeadUsageOf(0, 0);
    CHECK(u.evicted_tokens > 0);
    CHECK(u.compressions > 0);
    if (m == QuantMethod::kKivi) {
      CHECK(changed > 0);  // Re-quantized on a new grid.
      CHECK(u.requantized_tokens > 0);
    } else {
      CHECK(changed == 0);
      // At most the remainder of each compression (fewer than 8 tokens) is quantized again.
      CHECK(u.requantized_tokens < 8 * u.compressions);
    }
  }
}

TEST_CASE("Budget config: quant-only takes per-head widths from the RateQuant profile",
          "[controller][config][evict]") {
  const std::string path = testing::WriteTwoHeadProfile(1);
  Config c = WithToml(
      "[quant]\nmethod = \"kivi\"\n[budget]\nmode = \"quant-only\"\navg_bits = "
      "4.0\nprofile = \"" +
      path + "\"\n");
  REQUIRE(ValidateConfig(c).ok());
  std::vector<LayerPlan> plans = Plans(1, 2, QuantMethod::kKivi, 32, false);
  REQUIRE(ApplyBudgetWidths(c, {1, 2, 0, 32, 0}, &plans, nullptr).ok());
  // kivi at head_dim 32 costs 3 b/e at 2 bits and 5 at 4: a 4.0 budget lifts the head with the
  // larger alpha only.
  CHECK(plans[0].head_specs[0].k_bits == 2);
  CHECK(plans[0].head_specs[0].v_bits == 2);
  CHECK(plans[0].head_specs[1].k_bits == 4);
  CHECK(plans[0].head_specs[1].v_bits == 4);
  const Status wrong = ApplyBudgetWidths(c, {2, 2, 0, 32, 0}, &plans, nullptr);
  CHECK(wrong.message().find("fitted for 1 layers") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("Budget config: joint plans per-head widths and token caps that the sequence enforces",
          "[controller][config][evict]") {
  const std::string path = testing::WriteTwoHeadProfile(1);
  Config c = WithToml(
      "[quant]\nmethod = \"kivi\"\nflush_tokens = 32\n[budget]\nmode = "
      "\"joint\"\nfp16_fraction = 0.15\nplan_tokens = 256\nprofile = \"" +
      path + "\"\n");
  REQUIRE(ValidateConfig(c).ok());
  const SequenceShape shape{1, 2, 0, 32, 0};
  std::vector<LayerPlan> plans = Plans(1, 2, QuantMethod::kKivi, 32, false, 0, 32, 0);
  std::vector<int64_t> caps;
  const Status applied = ApplyBudgetWidths(c, shape, &plans, &caps);
  INFO(applied.ToString());
  REQUIRE(applied.ok());
  REQUIRE(caps.size() == 2);
  StatusOr<EvictionSettings> ev = ResolveEviction(c, shape, caps);
  REQUIRE(ev.ok());
  CHECK(ev->head_caps == caps);
  // 15% of fp16 cannot keep 256 tokens of both heads even at 2 bits (3 b/e = 19%): the plan
  // evicts, and every cap keeps the protected sinks + window.
  CHECK(caps[0] + caps[1] < 512);
  for (int64_t cap : caps) CHECK(cap >= ev->floor);
  auto pool = testing::MakeTestPool(4 << 20, 4096);
  KvSequence seq(pool.get(), {.layers = 1, .kv_heads = 2, .head_dim = 32, .dtype = DType::kF32},
                 plans, *ev);
  const Stream s(1, 300, 2, 2, 32, 17);
  for (int t = 0; t < 300; t += 20) REQUIRE(s.Append(seq, t, 20, false).ok());
  for (int h = 0; h < 2; ++h) {
    CHECK(seq.HeadUsageOf(0, h).tokens <= caps[h]);
    CHECK(seq.HeadUsageOf(0, h).budget == caps[h]);
  }
  CHECK(seq.LayerBudget(0) == caps[0] + caps[1]);
  // A budget below the cheapest plan is refused at OPEN time, naming the keys.
  Config tiny = c;
  tiny.budget.fp16_fraction = 0.001;
  std::vector<LayerPlan> plans2 = Plans(1, 2, QuantMethod::kKivi, 32, false, 0, 32, 0);
  const Status refused = ApplyBudgetWidths(tiny, shape, &plans2, nullptr);
  CHECK(!refused.ok());
  CHECK(refused.message().find("budget.bytes / budget.fp16_fraction") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("Budget config: joint payload never exceeds budget.bytes, fp16 tail included",
          "[controller][config][evict]") {
  // Flush every 32 tokens, window 8: up to 31 unflushed fp16 rows per head, 23 more than the
  // window the planner counts at fp16 anyway. The budget is tight enough that the plan spends it.
  // With 8 layers spread over 8 appends (quant.flush_spread_steps), one layer flushes per append
  // and the last one's tail holds 7 rows more, while those flushed first hold fewer: the plan
  // needs no charge for it (docs/budgets.md).
  // The 8-layer plan leaves more slack (its fullest payload is 71,680 bytes with S = 1 too);
  // staggered compressions (evict.stagger_layers) keep the layers from peaking on one step.
  const auto [layers, spread, budget, least_tenths] =
      GENERATE(std::tuple{2, 1, int64_t{30000}, 7}, std::tuple{8, 8, int64_t{96000}, 7});
  INFO(layers << " layers, flush_spread_steps " << spread);
  const std::string path = testing::WriteTwoHeadProfile(layers);
  Config c = WithToml(
      "[quant]\nmethod = \"kivi\"\nflush_tokens = 32\n[evict]\nwindow = 8\n[budget]\nmode = "
      "\"joint\"\nbytes = " +
      std::to_string(budget) + "\nplan_tokens = 256\nprofile = \"" + path + "\"\n");
  REQUIRE(ValidateConfig(c).ok());
  const SequenceShape shape{layers, 2, 0, 32, 0};
  std::vector<LayerPlan> plans = Plans(layers, 2, QuantMethod::kKivi, 32, false, 0, 32, 0);
  std::vector<int64_t> caps;
  const Status applied = ApplyBudgetWidths(c, shape, &plans, &caps);
  INFO(applied.ToString());
  REQUIRE(applied.ok());
  StatusOr<EvictionSettings> ev = ResolveEviction(c, shape, caps);
  REQUIRE(ev.ok());
  CHECK(ev->head_caps == caps);  // The planner used the daemon's floor: no cap was raised.
  auto pool = testing::MakeTestPool(4 << 20, 4096);
  KvSequence seq(pool.get(),
                 {.layers = layers,
                  .kv_heads = 2,
                  .head_dim = 32,
                  .dtype = DType::kF32,
                  .flush_spread_steps = spread},
                 plans, *ev);
  const int prefill = 100, total = 520;  // 420 single-token appends: 13 flushes per head.
  const Stream s(layers, total, 2, 2, 32, 23);
  uint64_t most = 0;
  int over = 0;
  for (int t = 0; t < total; t += t == 0 ? prefill : 1) {
    REQUIRE(s.Append(seq, t, t == 0 ? prefill : 1, false).ok());
    const uint64_t payload = seq.Usage().payload_bytes;
    most = std::max(most, payload);
    if (payload > static_cast<uint64_t>(budget)) {
      ++over;
      UNSCOPED_INFO("after token " << t << ": payload " << payload << " > budget " << budget);
    }
  }
  CHECK(over == 0);
  // Not vacuous: at its fullest the cache uses most of the budget.
  INFO("largest payload " << most);
  CHECK(most > static_cast<uint64_t>(budget) * least_tenths / 10);
  CHECK(seq.Usage().evicted_tokens > 0);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvctl

namespace kvctl {
namespace {

// Not a test: `controller_test "[.bench]"` prints the mean decode APPEND time per policy for a
// SmolLM2-135M-like geometry (docs/budgets.md quotes it).
TEST_CASE("Eviction bench: decode APPEND time per policy", "[.bench]") {
  // Mean, p99 and max of the decode APPENDs after a prefill (steady clock, one sample per step;
  // not asserted). `stagger`: evict.stagger_layers; `whole`: evict.whole_records.
  const int layers = 30, kv_heads = 3, q_heads = 9, d = 64, prefill = 1024, decode = 256;
  const Stream s(layers, prefill + decode, kv_heads, q_heads, d, 21);
  struct Case {
    const char* name;
    bool evict;
    EvictPolicy policy;
    int64_t period;
    bool stagger = false, whole = false;
    QuantMethod method = QuantMethod::kKivi;
  };
  const QuantMethod kvarn = QuantMethod::kKvarn;
  for (const Case& c :
       {Case{"none", false, EvictPolicy::kStreaming, 1},
        Case{"streaming", true, EvictPolicy::kStreaming, 1},
        Case{"streaming/32", true, EvictPolicy::kStreaming, 32},
        Case{"h2o", true, EvictPolicy::kH2O, 1}, Case{"h2o/32", true, EvictPolicy::kH2O, 32},
        Case{"h2o/32 stag", true, EvictPolicy::kH2O, 32, true},
        Case{"snapkv/32", true, EvictPolicy::kSnapKV, 32},
        Case{"snapkv/32 stag", true, EvictPolicy::kSnapKV, 32, true},
        Case{"rkv/32", true, EvictPolicy::kRKV, 32},
        Case{"rkv/32 stag", true, EvictPolicy::kRKV, 32, true},
        Case{"kvarn none", false, EvictPolicy::kStreaming, 1, false, false, kvarn},
        Case{"kvarn str/32", true, EvictPolicy::kStreaming, 32, false, false, kvarn},
        Case{"kvarn str/32 w", true, EvictPolicy::kStreaming, 32, false, true, kvarn},
        Case{"kvarn str/32 ws", true, EvictPolicy::kStreaming, 32, true, true, kvarn},
        Case{"kvarn snap/32", true, EvictPolicy::kSnapKV, 32, false, false, kvarn},
        Case{"kvarn snap/32 s", true, EvictPolicy::kSnapKV, 32, true, false, kvarn}}) {
    auto pool = testing::MakeTestPool(512 << 20, 64 << 10);
    EvictionSettings settings = Settings(c.policy, 512, 4, 32, 8);
    settings.enabled = c.evict;
    settings.compression_period = c.period;
    settings.stagger_layers = c.stagger;
    settings.whole_records = c.whole;
    // KVarN: its 128-token records, flushed at 128, with 4 sink rows like the evict sinks.
    KvSequence seq(pool.get(), F32Geometry(layers, kv_heads, d, q_heads),
                   Plans(layers, kv_heads, c.method, d, false, 0, 128, 4), settings);
    REQUIRE(s.Append(seq, 0, prefill).ok());
    std::vector<double> us;
    for (int t = prefill; t < prefill + decode; ++t) {
      const auto t0 = std::chrono::steady_clock::now();
      REQUIRE(s.Append(seq, t, 1).ok());
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    double mean = 0;
    for (double x : us) mean += x / decode;
    std::sort(us.begin(), us.end());
    std::printf(
        "%-16s mean %9.1f  p99 %9.1f  max %9.1f us per decode append (budget 512, %d "
        "tokens, requantized %llu)\n",
        c.name, mean, us[us.size() * 99 / 100], us.back(), prefill + decode,
        static_cast<unsigned long long>(seq.HeadUsageOf(0, 0).requantized_tokens));
  }
}

}  // namespace
}  // namespace kvctl
