// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// TierService's own rules, with no cluster running: quotas are checked before anything is sent,
// a dead cluster is retried at most once a second, spill keys are this process's own.
#include "controller/service/tier_service.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string_view>
#include <vector>

namespace kvctl {
namespace {

TierConfig DeadCluster() {
  return TierConfig{.nodes = "127.0.0.1:1",  // Nothing listens on port 1.
                    .key_prefix = "tier",
                    .ttl_seconds = 60,
                    .quota_bytes = 1000,
                    .prefix_quota_bytes = 1000,
                    .prefix_block_tokens = 16,
                    .timeout_ms = 100,
                    .connect_timeout_ms = 100,
                    .chunk_bytes = 4096};
}

TEST_CASE("TierService: none without nodes", "[controller][tier]") {
  TierConfig c = DeadCluster();
  c.nodes = "";
  CHECK(TierService::Create(c) == nullptr);
}

TEST_CASE("TierService: quotas refuse before any network call", "[controller][tier]") {
  auto tier = TierService::Create(DeadCluster());
  REQUIRE(tier != nullptr);
  const std::vector<uint8_t> big(1001, 7);
  Status spill = tier->PutSpill(tier->NewSpillKey(), big);
  CHECK(spill.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(spill.message(), Catch::Contains("tier.quota_bytes"));
  Status save = tier->PutPrefix("tier:p:x", big);
  CHECK(save.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(save.message(), Catch::Contains("tier.prefix_quota_bytes"));
  const TierCounters c = tier->counters();
  CHECK(c.spills_over_quota == 1);
  CHECK(c.prefix_saves_over_quota == 1);
  CHECK(c.commands_total == 0);  // Never connected.
  CHECK(!c.connected);
}

TEST_CASE("TierService: a dead cluster answers UNAVAILABLE, then fast until a second passed",
          "[controller][tier]") {
  auto tier = TierService::Create(DeadCluster());
  const std::vector<uint8_t> small(10, 1);
  Status first = tier->PutSpill(tier->NewSpillKey(), small);
  CHECK(first.code() == StatusCode::kUnavailable);
  CHECK_THAT(first.message(), Catch::Contains("127.0.0.1:1"));
  Status again = tier->PutPrefix("tier:p:y", small);
  CHECK(again.code() == StatusCode::kUnavailable);
  CHECK_THAT(again.message(), Catch::Contains("next attempt within a second"));
  StatusOr<int> lookup = tier->LongestPresent({"tier:p:a", "tier:p:b"});
  CHECK(lookup.status().code() == StatusCode::kUnavailable);
  CHECK(tier->LongestPresent({}).value() == -1);  // Nothing to ask: no call at all.
  const TierCounters c = tier->counters();
  CHECK(c.spilled_bytes == 0);  // The failed spill's reservation was given back.
  CHECK(c.spilled_sequences == 0);
  CHECK(c.deletes_pending == 1);  // Whatever the failed spill may have written, deleted later.
  tier->DrainDeletes();
  CHECK(tier->counters().deletes_pending == 0);
  CHECK(tier->counters().delete_failures == 1);
}

TEST_CASE("TierService: spill keys are unique and carry this process's instance",
          "[controller][tier]") {
  auto a = TierService::Create(DeadCluster());
  auto b = TierService::Create(DeadCluster());
  const std::string k1 = a->NewSpillKey(), k2 = a->NewSpillKey(), k3 = b->NewSpillKey();
  // "tier:s:<instance>:<n>": the part before the last ':' names the process.
  const auto instance = [](std::string_view key) { return key.substr(0, key.rfind(':')); };
  CHECK(k1.rfind("tier:s:", 0) == 0);
  CHECK(k1 != k2);
  CHECK(instance(k1) == instance(k2));
  CHECK(instance(k1) != instance(k3));
}

}  // namespace
}  // namespace kvctl
