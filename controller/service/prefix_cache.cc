// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "common/log.h"

namespace kvctl {

bool PrefixCache::Insert(const std::string& key, std::vector<int32_t> tokens,
                         std::shared_ptr<KvSequence> prefix) {
  const uint64_t bytes = prefix->Usage().pool_bytes;
  MutexLock lock(&mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    held_bytes_ -= it->second.pool_bytes;
    entries_.erase(it);
  }
  while (held_bytes_ + bytes > max_bytes_ && DropOneLocked()) {
  }
  if (held_bytes_ + bytes > max_bytes_) {
    ++counters_.inserts_refused;
    return false;
  }
  entries_[key] = Entry{std::move(prefix), std::move(tokens), bytes, ++tick_};
  held_bytes_ += bytes;
  ++counters_.inserts;
  return true;
}

PrefixCache::Opened PrefixCache::OpenLongest(std::span<const std::string> keys,
                                             std::span<const int32_t> prompt, const OpenFn& open) {
  MutexLock lock(&mu_);
  ++counters_.lookups;
  Opened out;
  for (int i = static_cast<int>(keys.size()) - 1; i >= 0; --i) {
    auto it = entries_.find(keys[i]);
    if (it == entries_.end()) continue;
    Entry& e = it->second;
    // The key is a hash: the ids themselves decide.
    if (e.tokens.size() > prompt.size() ||
        !std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) {
      continue;
    }
    out.index = i;
    out.seq = open(e.prefix);
    if (out.seq.ok()) {
      e.last_used = ++tick_;
      ++counters_.hits;
      counters_.hit_tokens += e.tokens.size();
    } else if (!e.prefix->integrity().ok()) {
      Log(LogSeverity::kError, "prefix cache: a prefix of {} tokens is lost and dropped: {}",
          e.tokens.size(), e.prefix->integrity().message());
      ++counters_.lost;
      held_bytes_ -= e.pool_bytes;
      entries_.erase(it);
    }
    return out;
  }
  return out;
}

bool PrefixCache::DropOneLocked() {
  auto victim = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (!Read(it->second) &&
        (victim == entries_.end() || it->second.last_used < victim->second.last_used)) {
      victim = it;
    }
  }
  if (victim == entries_.end()) return false;
  held_bytes_ -= victim->second.pool_bytes;
  entries_.erase(victim);  // No reader: its pages go back to the pool now.
  ++counters_.dropped;
  return true;
}

std::shared_ptr<KvSequence> PrefixCache::Find(const std::string& key,
                                              std::span<const int32_t> tokens) {
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !std::equal(it->second.tokens.begin(), it->second.tokens.end(),
                                          tokens.begin(), tokens.end())) {
    return nullptr;
  }
  it->second.last_used = ++tick_;
  return it->second.prefix;
}

int64_t PrefixCache::Shed(int64_t pages, uint64_t page_bytes) {
  MutexLock lock(&mu_);
  int64_t freed = 0;
  while (freed < pages) {
    const uint64_t before = held_bytes_;
    if (!DropOneLocked()) break;
    freed += static_cast<int64_t>((before - held_bytes_) / page_bytes);
  }
  counters_.shed_pages += static_cast<uint64_t>(freed);
  return freed;
}

uint64_t PrefixCache::Scrub(uint64_t max_bytes) {
  MutexLock lock(&mu_);
  uint64_t verified = 0;
  auto it = entries_.lower_bound(scrub_next_);
  for (size_t visited = 0; visited < entries_.size() && verified < max_bytes; ++visited) {
    if (it == entries_.end()) it = entries_.begin();
    bool wrapped = false;
    StatusOr<uint64_t> bytes = it->second.prefix->Scrub(max_bytes - verified, &wrapped);
    if (!bytes.ok()) {
      Log(LogSeverity::kError,
          "prefix cache: a prefix of {} tokens failed its page checksums and is "
          "dropped: {}",
          it->second.tokens.size(), bytes.status().message());
      ++counters_.lost;
      held_bytes_ -= it->second.pool_bytes;
      it = entries_.erase(it);
      continue;
    }
    verified += *bytes;
    if (!wrapped) break;  // This entry goes on next time.
    ++it;
  }
  scrub_next_ = it == entries_.end() ? std::string() : it->first;
  return verified;
}

PrefixCacheCounters PrefixCache::counters() const {
  MutexLock lock(&mu_);
  PrefixCacheCounters c = counters_;
  c.entries = entries_.size();
  c.held_bytes = held_bytes_;
  c.read_entries = static_cast<uint64_t>(std::count_if(
      entries_.begin(), entries_.end(), [this](const auto& kv) { return Read(kv.second); }));
  return c;
}

}  // namespace kvctl
