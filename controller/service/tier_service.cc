// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/tier_service.h"

#include <cstdio>
#include <string_view>

#include "common/log.h"
#include "common/secure_random.h"
#include "tier/blob_store.h"
#include "tier/redis_cluster.h"

namespace kvctl {
namespace {

constexpr std::chrono::seconds kReconnectPause{1};
// Prefixes one daemon tracks against tier.prefix_quota_bytes at most (their bookkeeping is host
// memory: about 150 bytes each).
constexpr size_t kMaxPrefixesHeld = 100000;

std::vector<std::string> SplitNodes(std::string_view nodes) {
  std::vector<std::string> out;
  while (!nodes.empty()) {
    const size_t comma = nodes.find(',');
    out.emplace_back(nodes.substr(0, comma));
    if (comma == std::string_view::npos) break;
    nodes.remove_prefix(comma + 1);
  }
  return out;
}

std::string RandomHex() {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx",
                static_cast<unsigned long long>(SecureRandomU64()));  // NOLINT(runtime/int)
  return text;
}

}  // namespace

std::unique_ptr<TierService> TierService::Create(const TierConfig& config) {
  if (config.nodes.empty()) return nullptr;
  return std::unique_ptr<TierService>(new TierService(config));
}

TierService::TierService(const TierConfig& config) : config_(config), instance_(RandomHex()) {}

TierService::~TierService() = default;

std::chrono::milliseconds TierService::Ttl() const {
  return std::chrono::milliseconds(int64_t{config_.ttl_seconds} * 1000);
}

StatusOr<tier::BlobStore*> TierService::Store() {
  {
    MutexLock lock(&mu_);
    if (store_) return store_.get();
  }
  MutexLock connecting(&connect_mu_);
  {
    MutexLock lock(&mu_);
    if (store_) return store_.get();  // Another thread connected meanwhile.
    if (!last_connect_error_.ok() &&
        std::chrono::steady_clock::now() - last_failed_connect_ < kReconnectPause) {
      return Unavailable("tier: cluster unreachable (", last_connect_error_.message(),
                         "); next attempt within a second");
    }
  }
  tier::ClusterOptions options;
  options.seeds = SplitNodes(config_.nodes);
  options.connect_timeout = std::chrono::milliseconds(config_.connect_timeout_ms);
  options.command_timeout = std::chrono::milliseconds(config_.timeout_ms);
  StatusOr<std::unique_ptr<tier::RedisCluster>> cluster = tier::RedisCluster::Connect(options);
  MutexLock lock(&mu_);
  if (!cluster.ok()) {
    if (last_connect_error_.ok()) {
      Log(LogSeverity::kWarning, "tier: cannot reach the cluster: {}", cluster.status().message());
    }
    last_connect_error_ = cluster.status();
    last_failed_connect_ = std::chrono::steady_clock::now();
    return Unavailable("tier: ", cluster.status().message());
  }
  Log(LogSeverity::kInfo, "tier: connected to the cluster through {}", config_.nodes);
  last_connect_error_ = OkStatus();
  cluster_ = std::move(cluster).value();
  store_ = std::make_unique<tier::BlobStore>(cluster_.get(), config_.chunk_bytes);
  counters_.connected = true;
  return store_.get();
}

Status TierService::PutPrefix(const std::string& key, std::span<const uint8_t> value) {
  const auto now = std::chrono::steady_clock::now();
  const auto ttl = Ttl();
  {
    MutexLock lock(&mu_);
    // What this daemon wrote and the cluster still holds: saves whose TTL has not run out (all of
    // them with tier.ttl_seconds = 0); a key saved again counts once.
    for (auto it = prefixes_held_.begin(); it != prefixes_held_.end();) {
      if (ttl.count() > 0 && it->second.expires <= now) {
        counters_.prefix_held_bytes -= it->second.bytes;
        it = prefixes_held_.erase(it);
      } else {
        ++it;
      }
    }
    const auto same = prefixes_held_.find(key);
    const uint64_t replaced = same == prefixes_held_.end() ? 0 : same->second.bytes;
    if (same == prefixes_held_.end() && prefixes_held_.size() >= kMaxPrefixesHeld) {
      ++counters_.prefix_save_failures;
      ++counters_.prefix_saves_over_quota;
      return ResourceExhausted("tier: this daemon already holds ", kMaxPrefixesHeld,
                               " saved prefixes whose TTL has not run out");
    }
    if (counters_.prefix_held_bytes - replaced + value.size() > config_.prefix_quota_bytes) {
      ++counters_.prefix_save_failures;
      ++counters_.prefix_saves_over_quota;
      return ResourceExhausted("tier: saving ", value.size(),
                               " bytes of prefix would pass tier.prefix_quota_bytes (",
                               config_.prefix_quota_bytes, "; ", counters_.prefix_held_bytes,
                               " held by prefixes this daemon saved)");
    }
  }
  StatusOr<tier::BlobStore*> store = Store();
  Status put = store.ok() ? (*store)->Put(key, value, ttl) : store.status();
  MutexLock lock(&mu_);
  if (put.ok()) {
    ++counters_.prefix_saves;
    counters_.prefix_saved_bytes += value.size();
    PrefixHeld& held = prefixes_held_[key];
    counters_.prefix_held_bytes += value.size();
    counters_.prefix_held_bytes -= held.bytes;
    held = {.bytes = value.size(), .expires = now + ttl};
  } else {
    ++counters_.prefix_save_failures;
  }
  return put;
}

StatusOr<int> TierService::LongestPresent(const std::vector<std::string>& keys) {
  if (keys.empty()) return -1;
  KVCTL_ASSIGN_OR_RETURN(tier::BlobStore * store, Store());
  KVCTL_ASSIGN_OR_RETURN(std::vector<bool> present, store->Exists(keys));
  for (int i = static_cast<int>(present.size()) - 1; i >= 0; --i) {
    if (present[i]) return i;
  }
  return -1;
}

StatusOr<std::vector<uint8_t>> TierService::Get(const std::string& key) {
  KVCTL_ASSIGN_OR_RETURN(tier::BlobStore * store, Store());
  return store->Get(key);
}

std::string TierService::NewSpillKey() {
  MutexLock lock(&mu_);
  return config_.key_prefix + ":s:" + instance_ + ":" + std::to_string(next_spill_++);
}

Status TierService::PutSpill(const std::string& key, std::span<const uint8_t> image) {
  {
    MutexLock lock(&mu_);
    if (counters_.spilled_bytes + image.size() > config_.quota_bytes) {
      ++counters_.spills_over_quota;
      return ResourceExhausted("tier: spilling ", image.size(),
                               " bytes would pass tier.quota_bytes (", config_.quota_bytes, "; ",
                               counters_.spilled_bytes, " held)");
    }
    counters_.spilled_bytes += image.size();  // Reserved now, so two spills cannot both fit.
  }
  StatusOr<tier::BlobStore*> store = Store();
  Status put = store.ok() ? (*store)->Put(key, image, Ttl()) : store.status();
  MutexLock lock(&mu_);
  if (put.ok()) {
    ++counters_.spilled_sequences;
  } else {
    counters_.spilled_bytes -= image.size();
    deletes_.push_back(key);  // Chunks written before the failure.
  }
  return put;
}

void TierService::ForgetSpill(const std::string& key, uint64_t bytes) {
  MutexLock lock(&mu_);
  counters_.spilled_bytes -= std::min(counters_.spilled_bytes, bytes);
  if (counters_.spilled_sequences > 0) --counters_.spilled_sequences;
  deletes_.push_back(key);
}

void TierService::DrainDeletes() {
  std::vector<std::string> keys;
  {
    MutexLock lock(&mu_);
    keys.swap(deletes_);
  }
  if (keys.empty()) return;
  StatusOr<tier::BlobStore*> store = Store();
  uint64_t failed = 0;
  for (const std::string& key : keys) {
    if (!store.ok() || !(*store)->Del(key).ok()) ++failed;
  }
  MutexLock lock(&mu_);
  counters_.delete_failures += failed;
}

void TierService::CountLookup(bool hit, bool failed, uint64_t restored_tokens) {
  MutexLock lock(&mu_);
  ++counters_.prefix_lookups;
  if (failed) ++counters_.prefix_lookup_failures;
  if (hit) {
    ++counters_.prefix_hits;
    counters_.prefix_restored_tokens += restored_tokens;
  } else {
    ++counters_.prefix_misses;
  }
}

void TierService::CountSpill(bool ok, std::chrono::microseconds took) {
  MutexLock lock(&mu_);
  if (ok) {
    ++counters_.spills;
    counters_.spill_us_total += static_cast<uint64_t>(took.count());
  } else {
    ++counters_.spill_failures;
  }
}

void TierService::CountSpillRefused() {
  MutexLock lock(&mu_);
  ++counters_.spills_refused;
}

void TierService::CountRestore(bool ok, bool lost, std::chrono::microseconds took) {
  MutexLock lock(&mu_);
  if (ok) {
    ++counters_.restores;
    counters_.restore_us_total += static_cast<uint64_t>(took.count());
  } else {
    ++counters_.restore_failures;
  }
  if (lost) ++counters_.spilled_lost;
}

TierCounters TierService::counters() const {
  TierCounters c;
  const tier::RedisCluster* cluster = nullptr;
  {
    MutexLock lock(&mu_);
    c = counters_;
    c.deletes_pending = deletes_.size();
    cluster = cluster_.get();  // Never replaced once set.
  }
  if (cluster != nullptr) {
    const tier::ClusterCounters k = cluster->counters();
    c.commands_total = k.commands;
    c.errors_total = k.errors;
    c.moved_total = k.moved;
    c.ask_total = k.ask;
    c.reconnects_total = k.reconnects;
    c.bytes_written_total = k.bytes_written;
    c.bytes_read_total = k.bytes_read;
  }
  return c;
}

}  // namespace kvctl
