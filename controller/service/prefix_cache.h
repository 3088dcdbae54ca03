// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/prefix_cache.h
// The daemon's local prefix cache (docs/tier.md "Shared prefix pages"): prefixes that SAVE_PREFIX
// stored, or that OPEN_PREFIX restored from the cluster tier, kept frozen in the pool and named by
// the last key of their block-hash chain (controller/service/prefix_keys.h). OPEN_PREFIX opens a
// sequence from the longest one as a KvSequence::Fork: the sequence reads the prefix's records,
// sink rows and norms where they are (copy-on-write) and copies only the fp16 tails, so N
// sequences opened from one prompt hold its compressed KV once.
//
// Bounds: the entries the cache holds take at most max_bytes of pool pages together. Inserting
// drops the least recently used entries no sequence reads until the new one fits (or refuses it).
// A dropped entry that sequences still read leaves the cache at once but keeps its pages until
// the last of them closes (shared ownership). Under pool pressure Shed drops unread entries first,
// before any sequence's data is touched. Each entry's host memory (its positions lists) is
// charged to the daemon's HostMemoryBudget by the caller and released when the frozen sequence
// goes.
//
// Trust: an entry is found by a hash of model, geometry, key prefix and token ids, and its stored
// token ids are compared with the prompt's before it is used; the scrubber verifies its pages like
// a sequence's (Scrub), and an entry found changed is dropped (its readers find the loss through
// their own FETCH checks).
//
// Thread safety: internally synchronized; every method may be called from any thread. It never
// takes another lock while holding its own except the pool's (allocation inside Fork).
//
//   PrefixCache cache(256 << 20);
//   cache.Insert(keys.back(), tokens, std::move(frozen));
//   PrefixCache::Opened o = cache.OpenLongest(keys, prompt, [](auto prefix) {
//     return KvSequence::Fork(std::move(prefix), 0);
//   });
#ifndef KVCTL_CONTROLLER_SERVICE_PREFIX_CACHE_H_
#define KVCTL_CONTROLLER_SERVICE_PREFIX_CACHE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "controller/sequence/kv_sequence.h"

namespace kvctl {

struct PrefixCacheCounters {
  uint64_t entries = 0;
  uint64_t held_bytes = 0;    // Pool bytes of the entries the cache holds.
  uint64_t read_entries = 0;  // Of those, entries some sequence reads now.
  uint64_t inserts = 0;
  uint64_t inserts_refused = 0;  // Larger than what the cache may free for them.
  uint64_t lookups = 0;
  uint64_t hits = 0;
  uint64_t hit_tokens = 0;  // Tokens of the prefixes found.
  uint64_t dropped = 0;     // To make room, or shed under pool pressure.
  uint64_t shed_pages = 0;  // Pool pages Shed freed.
  uint64_t lost = 0;        // Found changed by Scrub or by an open.
};

class PrefixCache {
 public:
  // max_bytes: pool bytes the held entries may take together (0: nothing is ever held).
  explicit PrefixCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  uint64_t max_bytes() const { return max_bytes_; }

  // Holds `prefix` (frozen: nothing may change it from now on) under `key`, with the token ids it
  // holds, replacing an entry under the same key. Returns false, holding nothing, when it does not
  // fit in max_bytes even after dropping every entry no sequence reads.
  bool Insert(const std::string& key, std::vector<int32_t> tokens,
              std::shared_ptr<KvSequence> prefix) KVCTL_EXCLUDES(mu_);

  // What OpenLongest gives: the index into keys of the prefix used (-1: none held) and the
  // sequence `open` made of it, or open's error.
  struct Opened {
    int index = -1;
    StatusOr<std::unique_ptr<KvSequence>> seq = std::unique_ptr<KvSequence>{};
  };
  using OpenFn =
      std::function<StatusOr<std::unique_ptr<KvSequence>>(std::shared_ptr<const KvSequence>)>;
  // Finds the longest held prefix among `keys` (a prompt's chain, shortest first) whose token ids
  // are the first ones of `prompt`, and runs `open` on it (a Fork, or a copy) under the cache's
  // lock, so the scrubber never changes an entry while it is read. Counted as a lookup, and as a
  // hit when open succeeds; an entry open finds lost (DATA_LOSS or a lost prefix) is dropped.
  Opened OpenLongest(std::span<const std::string> keys, std::span<const int32_t> prompt,
                     const OpenFn& open) KVCTL_EXCLUDES(mu_);
  // The prefix held under `key` if its token ids are `tokens` (as used: it becomes the most
  // recently used), else null. SAVE_PREFIX of a prompt already held shares that one.
  std::shared_ptr<KvSequence> Find(const std::string& key, std::span<const int32_t> tokens)
      KVCTL_EXCLUDES(mu_);
  // Drops entries no sequence reads, least recently used first, until about `pages` pool pages
  // are free again; returns the pages freed.
  int64_t Shed(int64_t pages, uint64_t page_bytes) KVCTL_EXCLUDES(mu_);
  // Verifies the entries' pages, from where the last call stopped, until about max_bytes were
  // checksummed or every entry was; drops the ones found changed. Returns the bytes checksummed.
  uint64_t Scrub(uint64_t max_bytes) KVCTL_EXCLUDES(mu_);
  PrefixCacheCounters counters() const KVCTL_EXCLUDES(mu_);

 private:
  struct Entry {
    std::shared_ptr<KvSequence> prefix;
    std::vector<int32_t> tokens;
    uint64_t pool_bytes = 0;
    uint64_t last_used = 0;  // tick_ at its last insert or hit.
  };
  bool Read(const Entry& e) const { return e.prefix.use_count() > 1; }
  // Drops the least recently used unread entry; false when there is none.
  bool DropOneLocked() KVCTL_REQUIRES(mu_);

  const uint64_t max_bytes_;
  mutable Mutex mu_;
  std::map<std::string, Entry> entries_ KVCTL_GUARDED_BY(mu_);
  uint64_t held_bytes_ KVCTL_GUARDED_BY(mu_) = 0;
  uint64_t tick_ KVCTL_GUARDED_BY(mu_) = 0;
  std::string scrub_next_ KVCTL_GUARDED_BY(mu_);  // Key where the next Scrub starts.
  PrefixCacheCounters counters_ KVCTL_GUARDED_BY(mu_);
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_PREFIX_CACHE_H_
