// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The cluster tier's side of the controller (docs/tier.md): spilling idle sequences and restoring
// them on their next request, kept apart from controller.cc's request logic (SAVE_PREFIX and
// OPEN_PREFIX are in controller_prefix.cc). Network waits never happen under mu_: a request waits
// on the tier only while it holds its own sequence's lock (or none), so resident sequences are
// never blocked by the tier.
#include <algorithm>
#include <cstring>

#include "common/checked_math.h"
#include "common/log.h"
#include "controller/sequence/sequence_image.h"
#include "controller/service/controller.h"
#include "controller/service/controller_internal.h"
#include "controller/service/prefix_keys.h"

namespace kvctl {
namespace {

std::chrono::microseconds Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

}  // namespace

Status Controller::EnsureResident(SequenceEntry& entry, uint64_t sequence_id) {
  if (entry.seq || !entry.spilled) return OkStatus();
  SequenceEntry::Spilled& s = *entry.spilled;
  if (!s.lost.ok()) return s.lost;
  const auto start = std::chrono::steady_clock::now();
  StatusOr<std::vector<uint8_t>> image = tier_->Get(s.key);
  const auto lose = [&](const Status& why) {
    s.lost =
        DataLoss("sequence_id: ", sequence_id, " was spilled to the tier and the tier lost it (",
                 why.message(), "); CLOSE it and prefill again");
    Log(LogSeverity::kError, "tier: {}", s.lost.message());
    tier_->ForgetSpill(s.key, s.bytes);
    tier_->CountRestore(false, true, {});
    return s.lost;
  };
  if (!image.ok()) {
    const StatusCode code = image.status().code();
    if (code == StatusCode::kNotFound || code == StatusCode::kDataLoss) {
      return lose(image.status());
    }
    tier_->CountRestore(false, false, {});
    return Unavailable("sequence_id: ", sequence_id,
                       " is spilled to the tier, which cannot be read now (",
                       image.status().message(), "); retry");
  }
  // The host memory of its kept tokens was released at the spill; it is charged again before
  // the sequence is rebuilt.
  const uint64_t growth = static_cast<uint64_t>(s.kept_tokens) * kHostBytesPerStreamToken;
  if (Status reserved = host_memory_.Reserve("restore", growth); !reserved.ok()) {
    tier_->CountRestore(false, false, {});
    return reserved;
  }
  StatusOr<std::unique_ptr<KvSequence>> seq =
      ImportImage(pool_.get(), *image, s.geometry, s.model_name, s.eviction, s.pressure);
  if (!seq.ok()) {
    host_memory_.Release(growth);
    if (seq.status().code() == StatusCode::kResourceExhausted) {
      tier_->CountRestore(false, false, {});
      return ResourceExhausted("sequence_id: ", sequence_id,
                               " is spilled to the tier and the pool lacks the pages to restore "
                               "it: ",
                               seq.status().message());
    }
    return lose(seq.status());
  }
  entry.seq = std::move(seq).value();
  entry.host_bytes += growth;
  tier_->ForgetSpill(s.key, s.bytes);
  entry.spilled.reset();
  tier_->CountRestore(true, false, Since(start));
  return OkStatus();
}

bool Controller::SpillLocked(SequenceEntry& entry, uint64_t sequence_id,
                             const std::string& model_name) {
  const auto start = std::chrono::steady_clock::now();
  KvSequence& seq = *entry.seq;
  // In the middle of a deferred prefill (APPEND_CONTINUES): not now, but not refused for good
  // either; a later pass spills it once the prefill has ended.
  if (seq.deferred_tokens() > 0) return false;
  StatusOr<std::vector<uint8_t>> image = ExportImage(seq, seq.tokens(), model_name);
  if (!image.ok()) {
    entry.spill_refused = true;  // Its settings cannot be exported; not tried again.
    tier_->CountSpillRefused();
    Log(LogSeverity::kInfo, "tier: sequence {} stays in the pool: {}", sequence_id,
        image.status().message());
    return false;
  }
  const std::string key = tier_->NewSpillKey();
  if (Status put = tier_->PutSpill(key, *image); !put.ok()) {
    tier_->CountSpill(false, {});
    Log(LogSeverity::kWarning, "tier: sequence {} not spilled, it stays in the pool: {}",
        sequence_id, put.message());
    return false;
  }
  const SequenceUsage usage = seq.Usage();
  entry.spilled = SequenceEntry::Spilled{.key = key,
                                         .bytes = image->size(),
                                         .kept_tokens = usage.kept_tokens,
                                         .geometry = seq.geometry(),
                                         .model_name = model_name,
                                         .eviction = seq.eviction(),
                                         .pressure = seq.pressure(),
                                         .quality = seq.QualityTotals(),
                                         .lost = OkStatus()};
  entry.seq.reset();  // Its pages go back to the pool.
  host_memory_.Release(entry.host_bytes - entry.open_host_bytes);
  entry.host_bytes = entry.open_host_bytes;
  tier_->CountSpill(true, Since(start));
  return true;
}

std::chrono::milliseconds Controller::TierPassInterval() const {
  if (!tier_) return std::chrono::milliseconds(0);
  const int idle = tier_->config().spill_idle_ms;
  // Deletions are sent at least once a second; idle sequences are found within a quarter of
  // their idle time.
  return std::chrono::milliseconds(idle > 0 ? std::clamp(idle / 4, 10, 1000) : 1000);
}

void Controller::TierPass(SteadyTime now) {
  if (!tier_) return;
  tier_->DrainDeletes();
  const int idle_ms = tier_->config().spill_idle_ms;
  if (idle_ms <= 0) return;
  const auto idle = std::chrono::milliseconds(idle_ms);
  for (const OpenSequenceRef& ref : OpenSequences()) {
    SequenceEntry* entry = ref.entry.get();
    if (!entry->mu.TryLock()) continue;  // Busy with a request: not idle.
    MutexLock seq_lock(&entry->mu, AdoptLock{});
    if (!entry->seq || entry->spill_refused || now - entry->last_used < idle) continue;
    if (!entry->seq->integrity().ok()) continue;  // A lost sequence keeps answering its loss.
    SpillLocked(*entry, ref.sequence_id, ref.model_name);
  }
}

int64_t Controller::SpillOthersForPool(const SequenceEntry& self, int64_t pages, SteadyTime now) {
  if (!tier_ || pages < 1) return 0;
  const int idle_ms = tier_->config().spill_on_pressure_idle_ms;
  if (idle_ms <= 0) return 0;
  const std::vector<OpenSequenceRef> others = OpenSequences(&self);
  // Least recently used first; last_used is read under each entry's lock, so the order is
  // taken from a snapshot.
  std::vector<std::pair<SteadyTime, size_t>> order;
  for (size_t i = 0; i < others.size(); ++i) {
    SequenceEntry& other = *others[i].entry;
    if (!other.mu.TryLock()) continue;
    MutexLock other_lock(&other.mu, AdoptLock{});
    if (other.seq && !other.spill_refused &&
        now - other.last_used >= std::chrono::milliseconds(idle_ms)) {
      order.emplace_back(other.last_used, i);
    }
  }
  std::sort(order.begin(), order.end());
  const uint64_t page_bytes = pool_->page_bytes();
  int64_t freed = 0;
  for (const auto& [used, i] : order) {
    if (freed >= pages) break;
    const OpenSequenceRef& ref = others[i];
    SequenceEntry* other = ref.entry.get();
    if (!other->mu.TryLock()) continue;
    MutexLock other_lock(&other->mu, AdoptLock{});
    if (!other->seq || other->last_used != used) continue;  // Used or closed meanwhile.
    const uint64_t held = other->seq->Usage().pool_bytes;
    if (SpillLocked(*other, ref.sequence_id, ref.model_name)) {
      freed += static_cast<int64_t>(held / page_bytes);
    }
  }
  return freed;
}

}  // namespace kvctl
