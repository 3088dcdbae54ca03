// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// APPEND_CONTINUES inside KvSequence: a prefill appended in flagged pieces, then one unflagged
// append, keeps exactly what one append of it all keeps (every policy, lossless and quantized
// layers, fixed and fractional budgets with head re-allocation, joint caps); the cap; the no-op
// without eviction; image export refused mid-prefill.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "controller/sequence/sequence_image.h"
#include "tests/controller/sequence/compare_test_util.h"
#include "tests/controller/sequence/evict_test_util.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl {
namespace {

constexpr int kLayers = 2, kKvHeads = 2, kQHeads = 4, kDim = 32;

SequenceGeometry Geometry() { return testing::GqaGeometry(kLayers, kKvHeads, kQHeads, kDim); }

std::vector<LayerPlan> Plans(bool lossless) {
  return testing::SmallPlans(kLayers, kKvHeads, kDim, lossless, /*sinks=*/0);
}

// Budget schedules: a fixed average, a fraction of the tokens seen with head re-allocation, or
// joint's fixed per-(layer, head) caps.
enum class Schedule { kFixed, kFractionRealloc, kJointCaps };

EvictionSettings Settings(EvictPolicy policy, Schedule schedule) {
  EvictionSettings s = testing::EvictOn(policy, 2, 8, 8);
  s.compression_period = 4;
  s.max_deferred_tokens = 1000;
  if (schedule == Schedule::kFractionRealloc) {
    s.token_fraction = 0.3;
    s.realloc_period = 16;  // Re-allocation between heads, due at the end of the prefill.
  } else {
    s.tokens_per_head = 24;
  }
  if (schedule == Schedule::kJointCaps) s.head_caps = {20, 28, 32, 18};
  return s;
}

void RequireSameContents(const KvSequence& a, const KvSequence& b) {
  testing::RequireSameContents(a, b, kLayers, kKvHeads);
}

TEST_CASE("Deferred eviction: flagged pieces keep exactly what one append keeps",
          "[controller][evict]") {
  const int prefill = 96, decode = 6;
  const testing::Stream data(kLayers, prefill + decode, kKvHeads, kQHeads, kDim, 11);
  // The last piece shorter than the observation window too (its query rows join the kept ones).
  const std::vector<std::vector<int>> splits = {{40, 30, 20, 6}, {50, 41, 5}, {95, 1}};
  for (EvictPolicy policy :
       {EvictPolicy::kStreaming, EvictPolicy::kH2O, EvictPolicy::kSnapKV, EvictPolicy::kRKV}) {
    for (bool lossless : {true, false}) {
      for (Schedule schedule :
           {Schedule::kFixed, Schedule::kFractionRealloc, Schedule::kJointCaps}) {
        for (const std::vector<int>& split : splits) {
          INFO(EvictPolicyName(policy)
               << (lossless ? " lossless" : " kivi") << " schedule " << static_cast<int>(schedule)
               << " split of " << split.size());
          const bool with_q = policy != EvictPolicy::kStreaming;
          auto pool = testing::MakeTestPool(8 << 20, 4096);
          const EvictionSettings settings = Settings(policy, schedule);
          KvSequence one(pool.get(), Geometry(), Plans(lossless), settings);
          KvSequence parts(pool.get(), Geometry(), Plans(lossless), settings);
          REQUIRE(data.Append(one, 0, prefill, with_q, false).ok());
          REQUIRE(one.Usage().evicted_tokens > 0);
          int at = 0;
          for (size_t i = 0; i < split.size(); ++i) {
            const bool last = i + 1 == split.size();
            REQUIRE(data.Append(parts, at, split[i], with_q, !last).ok());
            at += split[i];
            if (!last) {
              // Stored whole, nothing evicted or flushed yet.
              CHECK(parts.deferred_tokens() == at);
              CHECK(parts.Usage().evicted_tokens == 0);
              CHECK(parts.Usage().quantized_tokens == 0);
              CHECK(parts.Usage().kept_tokens == int64_t{at} * kLayers * kKvHeads);
            }
          }
          REQUIRE(at == prefill);
          CHECK(parts.deferred_tokens() == 0);
          CHECK(parts.Usage().deferred_appends == split.size() - 1);
          RequireSameContents(one, parts);
          // The scorer state is the same too: the decode steps after it evict alike.
          for (int t = prefill; t < prefill + decode; ++t) {
            REQUIRE(data.Append(one, t, 1, with_q, false).ok());
            REQUIRE(data.Append(parts, t, 1, with_q, false).ok());
          }
          RequireSameContents(one, parts);
        }
      }
    }
  }
}

TEST_CASE("Deferred eviction: past max_deferred_tokens an append evicts as if unflagged",
          "[controller][evict]") {
  const testing::Stream data(kLayers, 120, kKvHeads, kQHeads, kDim, 5);
  auto pool = testing::MakeTestPool(8 << 20, 4096);
  EvictionSettings settings = Settings(EvictPolicy::kSnapKV, Schedule::kFixed);
  settings.max_deferred_tokens = 50;
  KvSequence seq(pool.get(), Geometry(), Plans(true), settings);
  REQUIRE(data.Append(seq, 0, 40, true, true).ok());
  CHECK(seq.deferred_tokens() == 40);
  CHECK(seq.Usage().kept_tokens == 40 * kLayers * kKvHeads);
  REQUIRE(data.Append(seq, 40, 20, true, true).ok());  // 60 > 50: evicts.
  CHECK(seq.deferred_tokens() == 0);
  CHECK(seq.Usage().deferral_cap_hits == 1);
  CHECK(seq.Usage().evicted_tokens > 0);
  for (uint32_t count : seq.DenseCounts(0, kLayers)) CHECK(count <= 24u);
  REQUIRE(data.Append(seq, 60, 30, true, true).ok());  // Counted from 0 again: deferred.
  CHECK(seq.deferred_tokens() == 30);
  CHECK(seq.Usage().deferred_appends == 2);

  // Mid-prefill the sequence cannot be exported (spill, SAVE_PREFIX); after its end it can be
  // asked again (snapkv's kept query rows are then what refuses it, as before).
  const Status refused = ExportImage(seq, seq.tokens(), "m").status();
  CHECK(refused.code() == StatusCode::kFailedPrecondition);
  CHECK(refused.message().find("APPEND_CONTINUES") != std::string::npos);

  EvictionSettings never = settings;
  never.max_deferred_tokens = 0;
  KvSequence eager(pool.get(), Geometry(), Plans(true), never);
  REQUIRE(data.Append(eager, 0, 40, true, true).ok());
  CHECK(eager.deferred_tokens() == 0);
  CHECK(eager.Usage().deferral_cap_hits == 1);
  CHECK(eager.Usage().evicted_tokens > 0);
}

TEST_CASE("Deferred eviction: without eviction the flag changes nothing", "[controller][evict]") {
  const testing::Stream data(kLayers, 64, kKvHeads, kQHeads, kDim, 9);
  auto pool = testing::MakeTestPool(8 << 20, 4096);
  KvSequence flagged(pool.get(), Geometry(), Plans(false));
  KvSequence plain(pool.get(), Geometry(), Plans(false));
  REQUIRE(data.Append(flagged, 0, 40, false, true).ok());
  REQUIRE(data.Append(plain, 0, 40, false, false).ok());
  CHECK(flagged.deferred_tokens() == 0);
  CHECK(flagged.Usage().deferred_appends == 0);
  CHECK(flagged.Usage().quantized_tokens == 32);  // Flushes run as usual.
  RequireSameContents(flagged, plain);
}

}  // namespace
}  // namespace kvctl
