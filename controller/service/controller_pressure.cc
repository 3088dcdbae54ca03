// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Pool pressure beyond one sequence (docs/budgets.md "Pool pressure: lower widths before
// failing"): when an APPEND finds the pool full, Controller::Append frees pages in rounds,
// cheapest lever first. Round 0 drops cached prefixes no sequence reads and spills idle sequences
// to the tier (FreeForPool); then the sequence relieves itself (KvSequence's width lowering or
// joint caps); round 1 lowers the widths of other open sequences (LowerOthersForPool,
// budget.pressure_scope = "pool").
#include "controller/service/controller.h"
#include "controller/service/controller_internal.h"

namespace kvctl {

int64_t Controller::FreeForPool(const SequenceEntry& self, int64_t pages, SteadyTime now) {
  if (pages < 1) return 0;
  const int64_t shed = prefix_cache_ ? prefix_cache_->Shed(pages, pool_->page_bytes()) : 0;
  return shed + SpillOthersForPool(self, pages - shed, now);
}

int64_t Controller::LowerOthersForPool(const SequenceEntry& self, int64_t pages) {
  if (pages < 1) return 0;
  {
    MutexLock lock(&mu_);
    if (config_.budget.pressure_scope != PressureScope::kPool) return 0;
  }
  // try_lock: the caller holds its own sequence's mutex, and another APPEND may be doing the
  // same the other way round; a busy sequence is skipped rather than waited for.
  int64_t freed = 0;
  for (const OpenSequenceRef& ref : OpenSequences(&self)) {
    SequenceEntry* other = ref.entry.get();
    if (freed >= pages) break;
    if (!other->mu.TryLock()) continue;
    MutexLock other_lock(&other->mu, AdoptLock{});
    if (other->seq) freed += other->seq->LowerWidthsForOthers(pages - freed);
  }
  return freed;
}

}  // namespace kvctl
