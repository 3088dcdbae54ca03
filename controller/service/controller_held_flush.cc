// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Controller::RunHeldFlushes (quant.flush_after_reply): the records of the flushes a decode
// step's APPEND held so that its reply did not wait for them, encoded by the daemon on a worker
// after the reply (KvSequence::PrepareHeldFlushStep) and written by the sequence's next APPEND.
#include "common/log.h"
#include "controller/service/controller.h"

namespace kvctl {

int64_t Controller::RunHeldFlushes() {
  int64_t layers_prepared = 0;
  for (;;) {
    std::shared_ptr<SequenceEntry> entry;
    {
      MutexLock lock(&held_flush_mu_);
      if (held_flushes_.empty()) break;
      entry = held_flushes_.front().lock();
      held_flushes_.pop_front();
      held_flushes_queued_.fetch_sub(1);
    }
    if (!entry) continue;  // Closed meanwhile.
    // Cleared first: an APPEND meanwhile that leaves a flush pending queues it again.
    entry->held_flush_queued.store(false);
    // One layer per hold of the sequence's lock, so a FETCH or APPEND waits for one layer's
    // encoding at most. An APPEND meanwhile discards the work and this pass starts over, at most
    // once more; the APPEND has queued the sequence again if its flush is still pending.
    for (int step = 0;; ++step) {
      MutexLock seq_lock(&entry->mu);
      if (!entry->seq || step > 2 * entry->seq->geometry().layers) break;
      if (!entry->seq->HeldFlushPending()) break;
      StatusOr<bool> done = entry->seq->PrepareHeldFlushStep();
      if (!done.ok()) {
        Log(LogSeverity::kDebug, "held flush: {}", done.status().message());
        break;
      }
      ++layers_prepared;
      if (*done) break;
    }
  }
  held_flush_layers_.fetch_add(static_cast<uint64_t>(layers_prepared));
  return layers_prepared;
}

}  // namespace kvctl
