// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The scrubber thread, and the pass it runs (Controller::Scrub, kept here with it rather than in
// controller.cc's request logic).
#include "controller/service/scrubber.h"

#include <algorithm>
#include <vector>

#include "common/log.h"
#include "controller/service/controller_internal.h"

namespace kvctl {
namespace {

// Most bytes one sequence is verified for while its lock is held: an APPEND that arrives
// meanwhile waits at most for this much checksumming (well under a millisecond).
constexpr uint64_t kSliceBytes = 1 << 20;

}  // namespace

uint64_t Controller::Scrub(uint64_t max_bytes) {
  if (!pool_->checksums() || max_bytes == 0) return 0;
  MutexLock pass_lock(&scrub_mu_);
  uint64_t verified = 0;
  // Cached prefixes get the share of the pass their pages are of the pages in use, so every
  // byte is walked at the same rate.
  if (prefix_cache_) {
    const uint64_t held = prefix_cache_->counters().held_bytes;
    const uint64_t used = std::max<uint64_t>(pool_->Stats().bytes_used, held);
    if (held > 0) {
      const auto share = static_cast<uint64_t>(
          static_cast<double>(max_bytes) * static_cast<double>(held) / static_cast<double>(used));
      verified += prefix_cache_->Scrub(std::max<uint64_t>(share, 1));
    }
  }
  const std::vector<OpenSequenceRef> entries = OpenSequences();
  const size_t n = entries.size();
  if (n == 0) return verified;
  std::vector<bool> done(n, false);
  size_t done_count = 0, i = scrub_next_ % n;
  while (verified < max_bytes && done_count < n) {
    if (!done[i]) {
      SequenceEntry* entry = entries[i].entry.get();
      bool finished = true;
      if (entry->mu.TryLock()) {  // A sequence busy with a request is skipped this time.
        MutexLock seq_lock(&entry->mu, AdoptLock{});
        if (entry->seq) {
          const bool was_lost = !entry->seq->integrity().ok();
          StatusOr<uint64_t> bytes =
              entry->seq->Scrub(std::min(kSliceBytes, max_bytes - verified), &finished);
          if (bytes.ok()) {
            verified += *bytes;
          } else if (!was_lost) {
            Log(LogSeverity::kError, "scrubber: sequence {} of session #{} lost: {}",
                entries[i].sequence_id, entries[i].session_number, bytes.status().message());
          }
        }
      }
      if (finished) {
        done[i] = true;
        ++done_count;
      }
    }
    i = (i + 1) % n;
  }
  scrub_next_ = i;
  return verified;
}

uint64_t Scrubber::BytesPerPass(const PoolConfig& pool) {
  return pool.scrub_bytes_per_second * static_cast<uint64_t>(pool.scrub_interval_ms) / 1000;
}

std::unique_ptr<Scrubber> Scrubber::Start(const PoolConfig& pool, Controller* controller) {
  if (!pool.checksums || pool.scrub_interval_ms <= 0 || BytesPerPass(pool) == 0) return nullptr;
  return std::unique_ptr<Scrubber>(new Scrubber(
      controller, std::chrono::milliseconds(pool.scrub_interval_ms), BytesPerPass(pool)));
}

Scrubber::Scrubber(Controller* controller, std::chrono::milliseconds interval,
                   uint64_t bytes_per_pass)
    : thread_(interval, /*nice=*/19,
              [controller, bytes_per_pass] { controller->Scrub(bytes_per_pass); }) {}

}  // namespace kvctl
