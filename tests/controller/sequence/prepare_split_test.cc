// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// KvSequence::SetPrepareRunner: an append of at least min_tokens tokens prepares its layers on
// two threads (the controller's HelperThread), and the sequence afterwards holds exactly what
// one layer after another gives (every policy, lossless and quantized layers), through the
// decode steps after it; smaller appends never reach the runner; a layer that fails on either
// thread fails the whole append as one thread would, leaving nothing of it behind. The sanitizer
// build runs these under TSan (tools/sanitize.sh tsan-controller).
#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "controller/service/helper_thread.h"
#include "tests/controller/sequence/compare_test_util.h"
#include "tests/controller/sequence/evict_test_util.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl {
namespace {

constexpr int kLayers = 6, kKvHeads = 2, kQHeads = 4, kDim = 32;

SequenceGeometry Geometry() { return testing::GqaGeometry(kLayers, kKvHeads, kQHeads, kDim); }

// KIVI 2-bit records of 8 tokens flushed every 16 after 2 sinks, or lossless rows.
std::vector<LayerPlan> Plans(bool lossless) {
  return testing::SmallPlans(kLayers, kKvHeads, kDim, lossless, /*sinks=*/2);
}

void RequireSameContents(const KvSequence& a, const KvSequence& b) {
  testing::RequireSameContents(a, b, kLayers, kKvHeads);
}

TEST_CASE("KvSequence: prepared on two threads, a prefill keeps what one thread keeps",
          "[controller][threads]") {
  const int prefill = 120, decode = 20;
  const testing::Stream data(kLayers, prefill + decode, kKvHeads, kQHeads, kDim, 23);
  HelperThread helper;
  std::atomic<int> runs{0}, parts{0};
  const KvSequence::PartsRunner runner = [&](size_t n, const std::function<void(size_t)>& run) {
    runs.fetch_add(1);
    parts.fetch_add(static_cast<int>(n));
    helper.RunShared(n, run);
  };
  for (bool evict : {false, true}) {
    for (EvictPolicy policy :
         {EvictPolicy::kStreaming, EvictPolicy::kH2O, EvictPolicy::kSnapKV, EvictPolicy::kRKV}) {
      if (!evict && policy != EvictPolicy::kStreaming) continue;
      for (bool lossless : {true, false}) {
        INFO((evict ? EvictPolicyName(policy) : "no eviction")
             << (lossless ? " lossless" : " kivi"));
        const bool with_q = evict && policy != EvictPolicy::kStreaming;
        EvictionSettings settings;
        if (evict) {
          settings = testing::EvictOn(policy, 2, 8, 8);
          settings.tokens_per_head = 40;
          settings.compression_period = 4;
        }
        auto pool = testing::MakeTestPool(8 << 20, 4096);
        KvSequence alone(pool.get(), Geometry(), Plans(lossless), settings);
        KvSequence split(pool.get(), Geometry(), Plans(lossless), settings);
        split.SetPrepareRunner(&runner, 64);
        runs = parts = 0;
        // A light append (rows only: lossless without eviction) takes no Prepare stage at all.
        const int expected_runs = split.AppendIsLight(prefill) ? 0 : 1;
        CHECK(expected_runs == (!evict && lossless ? 0 : 1));
        REQUIRE(data.Append(alone, 0, prefill, with_q).ok());
        REQUIRE(data.Append(split, 0, prefill, with_q).ok());
        CHECK(runs == expected_runs);  // The prefill, one part per layer.
        CHECK(parts == expected_runs * kLayers);
        if (evict) CHECK(split.Usage().evicted_tokens > 0);
        RequireSameContents(alone, split);
        // Decode steps, below min_tokens: one thread, and still the same.
        for (int t = prefill; t < prefill + decode; ++t) {
          REQUIRE(data.Append(alone, t, 1, with_q).ok());
          REQUIRE(data.Append(split, t, 1, with_q).ok());
        }
        CHECK(runs == expected_runs);
        RequireSameContents(alone, split);
      }
    }
  }
  CHECK(helper.counters().helper_parts + helper.counters().jobs_alone > 0);
}

TEST_CASE("KvSequence: prepared on two threads, the piece that ends a deferred prefill counts all",
          "[controller][threads]") {
  // Pieces of 40 tokens sent with APPEND_CONTINUES only store; the unflagged last one evicts over
  // all 120, which is what min_tokens is compared with.
  const testing::Stream data(kLayers, 120, kKvHeads, kQHeads, kDim, 37);
  HelperThread helper;
  int runs = 0;
  auto pool = testing::MakeTestPool(8 << 20, 4096);
  EvictionSettings settings = testing::EvictOn(EvictPolicy::kSnapKV, 2, 8, 8);
  settings.tokens_per_head = 40;
  settings.max_deferred_tokens = 1000;
  KvSequence alone(pool.get(), Geometry(), Plans(false), settings);
  KvSequence split(pool.get(), Geometry(), Plans(false), settings);
  const KvSequence::PartsRunner runner = [&](size_t n, const std::function<void(size_t)>& run) {
    ++runs;
    helper.RunShared(n, run);
  };
  split.SetPrepareRunner(&runner, 100);
  REQUIRE(data.Append(alone, 0, 120).ok());
  for (int first : {0, 40, 80}) {
    REQUIRE(data.Append(split, first, 40, true, /*continues=*/first < 80).ok());
    CHECK(runs == (first < 80 ? 0 : 1));
  }
  CHECK(split.Usage().evicted_tokens > 0);
  RequireSameContents(alone, split);
}

TEST_CASE("KvSequence: prepared on two threads, one layer's DATA_LOSS fails the append whole",
          "[controller][threads]") {
  // A stored slot of one layer changed behind the daemon's back (a byte written straight into
  // the page, not through the pool): the layer's Prepare finds it when its compression reads the
  // layer, on whichever thread runs it. The append must fail with the one-thread answer, the
  // sequence end lost, and no page or token of the failed append remain.
  const int prefill = 60, step = 64;
  const testing::Stream data(kLayers, prefill + step, kKvHeads, kQHeads, kDim, 41);
  HelperThread helper;
  int runs = 0;
  const KvSequence::PartsRunner runner = [&](size_t n, const std::function<void(size_t)>& run) {
    ++runs;
    helper.RunShared(n, run);
  };
  for (int bad_layer : {0, kLayers / 2, kLayers - 1}) {
    std::string alone_answer;
    for (bool split : {false, true}) {
      INFO("layer " << bad_layer << (split ? ", two threads" : ", one thread"));
      auto created = testing::MakeTestPool(8 << 20, 4096, /*checksums=*/true);
      PageAllocator& pool = *created;
      EvictionSettings settings = testing::EvictOn(EvictPolicy::kSnapKV, 2, 8, 8);
      settings.tokens_per_head = 40;
      settings.compression_period = 4;
      KvSequence seq(&pool, Geometry(), Plans(false), settings);
      seq.SetPrepareRunner(split ? &runner : nullptr, 32);
      REQUIRE(data.Append(seq, 0, prefill).ok());
      REQUIRE(seq.Verify(0, kLayers).ok());
      const uint32_t pages_before = pool.Stats().pages_used;
      const SequenceUsage usage_before = seq.Usage();
      // A code byte of the first record of (bad_layer, head 1) flipped in place. A record, not
      // a row: the rows about to be flushed are checked before any layer is prepared.
      const HeadBlocks blocks = seq.Blocks(bad_layer, 1);
      REQUIRE(blocks.records > 0);
      const uint32_t id = blocks.record_ids[0];
      const BlockLayout layout = BlockLayoutOf(seq.HeadSpec(bad_layer, 1));
      pool.PagePointer(
          id / blocks.records_per_page)[(id % blocks.records_per_page) * layout.record_bytes +
                                        layout.k_codes_offset] ^= 0x40;
      runs = 0;
      const Status appended = data.Append(seq, prefill, step);
      CHECK(runs == (split ? 1 : 0));
      CHECK(appended.code() == StatusCode::kDataLoss);
      CHECK_THAT(appended.message(), Catch::Contains("changed outside the daemon"));
      CHECK(seq.integrity().code() == StatusCode::kDataLoss);
      // Nothing of the failed append stayed: no pages, no tokens, no evictions.
      CHECK(pool.Stats().pages_used == pages_before);
      CHECK(seq.Usage().tokens == usage_before.tokens);
      CHECK(seq.Usage().kept_tokens == usage_before.kept_tokens);
      CHECK(seq.Usage().evicted_tokens == usage_before.evicted_tokens);
      // The sequence stays lost: a later append answers the same, on one thread or two.
      CHECK(data.Append(seq, prefill, 1).code() == StatusCode::kDataLoss);
      if (!split) {
        alone_answer = appended.ToString();
      } else {
        CHECK(appended.ToString() == alone_answer);
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
