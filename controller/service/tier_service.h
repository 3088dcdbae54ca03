// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/tier_service.h
// The daemon's side of the cluster tier (docs/tier.md): a Redis Cluster client (tier/) used for
// two kinds of values, saved prefixes (shared, named by their token chain: prefix_keys.h) and
// spilled sequences (this daemon's own, named by a per-process random instance id and a
// counter, so a restarted daemon never reads or overwrites another's). It connects lazily and
// fails fast while the cluster is unreachable (one connection attempt per second at most), so a
// dead cluster costs a request at most tier.connect_timeout_ms per seed, once a second, and
// otherwise an immediate UNAVAILABLE. Spilled bytes are bounded by tier.quota_bytes. Deleting a
// key never happens under a caller's lock: keys to delete are queued and DrainDeletes (the tier
// pass) sends them.
//
// Thread safety: every method may be called from any thread (the cluster client is internally
// synchronized; the rest is guarded by mu_).
//
//   std::unique_ptr<TierService> tier = TierService::Create(config.tier);  // null: no tier
//   KVCTL_RETURN_IF_ERROR(tier->Put(TierService::kPrefix, key, value));
#ifndef KVCTL_CONTROLLER_SERVICE_TIER_SERVICE_H_
#define KVCTL_CONTROLLER_SERVICE_TIER_SERVICE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "controller/config/config.h"

namespace kvctl {

namespace tier {
class RedisCluster;
class BlobStore;
}  // namespace tier

// What STATS `# Tier` shows (docs/stats.md).
struct TierCounters {
  bool connected = false;
  uint64_t prefix_saves = 0, prefix_save_failures = 0, prefix_saved_bytes = 0;
  uint64_t prefix_lookups = 0, prefix_hits = 0, prefix_misses = 0, prefix_lookup_failures = 0;
  uint64_t prefix_restored_tokens = 0;
  uint64_t spills = 0, spill_failures = 0, spills_over_quota = 0, spills_refused = 0;
  uint64_t restores = 0, restore_failures = 0, spilled_lost = 0;
  uint64_t spilled_sequences = 0, spilled_bytes = 0;  // Held in the tier now.
  uint64_t deletes_pending = 0, delete_failures = 0;
  uint64_t spill_us_total = 0, restore_us_total = 0;  // Wall time of successful ones.
  uint64_t commands_total = 0, errors_total = 0, moved_total = 0, ask_total = 0;
  uint64_t reconnects_total = 0, bytes_written_total = 0, bytes_read_total = 0;
};

class TierService {
 public:
  // Null when config.nodes is "" (no tier).
  static std::unique_ptr<TierService> Create(const TierConfig& config);
  ~TierService();
  TierService(const TierService&) = delete;
  TierService& operator=(const TierService&) = delete;

  const TierConfig& config() const { return config_; }

  // Stores a prefix value under `key` (with tier.ttl_seconds). UNAVAILABLE or RESOURCE_EXHAUSTED
  // (cluster full) naming the cluster's answer; counted either way.
  Status PutPrefix(const std::string& key, std::span<const uint8_t> value) KVCTL_EXCLUDES(mu_);
  // The index of the last of `keys` present in the tier (keys are a prompt's chain, shortest
  // first), or -1 when none is.
  StatusOr<int> LongestPresent(const std::vector<std::string>& keys) KVCTL_EXCLUDES(mu_);
  // NOT_FOUND when absent, DATA_LOSS when a chunk is missing or corrupt, UNAVAILABLE.
  StatusOr<std::vector<uint8_t>> Get(const std::string& key) KVCTL_EXCLUDES(mu_);

  // A fresh key for a spilled sequence.
  std::string NewSpillKey() KVCTL_EXCLUDES(mu_);
  // Stores a spilled sequence's image: RESOURCE_EXHAUSTED without trying when it would pass
  // tier.quota_bytes, else the cluster's answer. On OK the bytes count as spilled until
  // ForgetSpill.
  Status PutSpill(const std::string& key, std::span<const uint8_t> image) KVCTL_EXCLUDES(mu_);
  // The spill of `bytes` under `key` is over (restored, closed or lost): its bytes leave the
  // quota and the key is queued for deletion.
  void ForgetSpill(const std::string& key, uint64_t bytes) KVCTL_EXCLUDES(mu_);
  // Sends the queued deletions (a failed one is counted and dropped: the key's TTL ends it).
  void DrainDeletes() KVCTL_EXCLUDES(mu_);

  // Outcomes the controller reports (what the service cannot see itself).
  void CountLookup(bool hit, bool failed, uint64_t restored_tokens) KVCTL_EXCLUDES(mu_);
  void CountSpill(bool ok, std::chrono::microseconds took) KVCTL_EXCLUDES(mu_);
  void CountSpillRefused() KVCTL_EXCLUDES(mu_);
  void CountRestore(bool ok, bool lost, std::chrono::microseconds took) KVCTL_EXCLUDES(mu_);

  TierCounters counters() const KVCTL_EXCLUDES(mu_);

 private:
  explicit TierService(const TierConfig& config);
  // The blob store, connecting first if need be; UNAVAILABLE fast while the last attempt failed
  // less than a second ago.
  StatusOr<tier::BlobStore*> Store() KVCTL_EXCLUDES(mu_, connect_mu_);
  std::chrono::milliseconds Ttl() const;

  const TierConfig config_;
  const std::string instance_;  // Random hex, one per daemon process.
  // Held while connecting (which may take connect timeouts), so that mu_, which STATS takes,
  // is never held across network waits. Taken before mu_.
  Mutex connect_mu_;
  mutable Mutex mu_;
  std::unique_ptr<tier::RedisCluster> cluster_ KVCTL_GUARDED_BY(mu_);
  std::unique_ptr<tier::BlobStore> store_ KVCTL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_failed_connect_ KVCTL_GUARDED_BY(mu_){};
  Status last_connect_error_ KVCTL_GUARDED_BY(mu_);
  uint64_t next_spill_ KVCTL_GUARDED_BY(mu_) = 1;
  std::vector<std::string> deletes_ KVCTL_GUARDED_BY(mu_);
  TierCounters counters_ KVCTL_GUARDED_BY(mu_);
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_TIER_SERVICE_H_
