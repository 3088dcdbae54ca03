// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Controller::Append: resolves the request's tensors (inline frames, or a private copy of the
// session's staging slot), takes the sequence's lock and stores them, relieving a full pool in
// rounds (controller_pressure.cc).

#include "common/checked_math.h"
#include "common/log.h"
#include "controller/pool/staging_shm.h"
#include "controller/service/controller.h"
#include "controller/service/controller_internal.h"
#include "ipc/protocol.h"

namespace kvctl {

StatusOr<ipc::AppendReply> Controller::Append(const ipc::AppendRequest& request, SteadyTime now,
                                              bool* deferred) {
  // The reply of a deferred append is never sent: the caller runs it again.
  const auto defer = [deferred] {
    *deferred = true;
    return Unavailable("deferred to a worker");
  };
  ipc::Geometry g;
  const uint8_t* k_bytes = nullptr;
  const uint8_t* v_bytes = nullptr;
  uint64_t staged_bytes = 0;                    // Of the slot, from request.staging_offset.
  std::shared_ptr<StagingObject> staging_hold;  // Keeps the mapping while it is copied.
  {
    MutexLock lock(&mu_);
    KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                           FindSessionLocked(request.session_id, now));
    g = session->geometry;
    KVCTL_RETURN_IF_ERROR(ipc::CheckAppendShape(request, g));
    if (request.source == ipc::AppendSource::kStaging) {
      if (!session->has_staging) {
        return FailedPrecondition("source: staging, but session ", request.session_id,
                                  " has no staging slot (HELLO returned staging_bytes 0); send "
                                  "tensors inline");
      }
      KVCTL_ASSIGN_OR_RETURN(const ipc::StagingLayout layout,
                             ipc::AppendStagingLayout(g, request.n_tokens, request.has_q));
      const uint64_t need = layout.total_bytes;
      const StagingSlot& slot = session->staging;
      KVCTL_RETURN_IF_ERROR(CheckSpanInside("staging_offset (this session's staging slot)",
                                            request.staging_offset, need, slot.offset, slot.bytes));
      staging_hold = session->staging_object;
      if (!staging_hold) {
        k_bytes = pool_->StagingPointer(slot.id) + (request.staging_offset - slot.offset);
      }
      staged_bytes = need;
    }
  }
  // A cpu pool's slot is the engine's to write at any moment: everything below reads a private
  // copy, taken once (outside mu_: a prefill chunk's copy takes milliseconds).
  thread_local StagingSnapshot snapshot;
  struct TrimSnapshot {
    StagingSnapshot& snapshot;
    ~TrimSnapshot() { snapshot.Trim(); }
  } trim_snapshot{snapshot};
  if (staging_hold) {
    // More than a decode step's rows is a worker's to copy and store.
    if (deferred != nullptr && staged_bytes > StagingSnapshot::kRetainBytes) return defer();
    KVCTL_ASSIGN_OR_RETURN(k_bytes,
                           snapshot.Copy(*staging_hold, request.staging_offset, staged_bytes));
  } else if (staged_bytes > 0) {
    // A device pool's slot was written on the device: bring the bytes to the host copy, which
    // is the daemon's own (outside mu_: a device copy must not stall every other request).
    if (deferred != nullptr) return defer();  // A device copy is not for the I/O thread.
    KVCTL_RETURN_IF_ERROR(pool_->PullStaging(request.staging_offset, staged_bytes));
  }
  // Bounded by the protocol limits (2^20 tokens x 2^10 heads x 2^10 dims x 4 bytes), checked all
  // the same (AppendStagingLayout): these sizes become pointer offsets.
  KVCTL_ASSIGN_OR_RETURN(const ipc::StagingLayout layout,
                         ipc::AppendStagingLayout(g, request.n_tokens, request.has_q));
  const uint64_t layer_bytes = layout.layer_bytes, q_layer_bytes = layout.q_layer_bytes;
  const uint8_t* q_bytes = nullptr;
  if (k_bytes != nullptr) {
    v_bytes = k_bytes + layout.v_offset;
    if (request.has_q) q_bytes = k_bytes + layout.q_offset;
  } else {
    k_bytes = static_cast<const uint8_t*>(request.k.data());
    v_bytes = static_cast<const uint8_t*>(request.v.data());
    if (request.has_q) q_bytes = static_cast<const uint8_t*>(request.q.data());
  }
  std::vector<KvTensorView> k, v, q;
  k.reserve(g.layers);
  v.reserve(g.layers);
  if (q_bytes != nullptr) q.reserve(g.layers);
  for (uint32_t l = 0; l < g.layers; ++l) {
    k.push_back(KvTensorView::Contiguous(k_bytes + l * layer_bytes, g.dtype, request.n_tokens,
                                         g.kv_heads, g.head_dim));
    v.push_back(KvTensorView::Contiguous(v_bytes + l * layer_bytes, g.dtype, request.n_tokens,
                                         g.kv_heads, g.head_dim));
    if (q_bytes != nullptr) {
      q.push_back(KvTensorView::Contiguous(q_bytes + l * q_layer_bytes, g.dtype, request.n_tokens,
                                           g.q_heads, g.head_dim));
    }
  }
  KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry,
                         FindSequence(request.session_id, request.sequence_id, now));
  if (deferred == nullptr) {
    entry->mu.Lock();
  } else if (!entry->mu.TryLock()) {
    return defer();
  }
  MutexLock seq_lock(&entry->mu, AdoptLock{});
  if (deferred != nullptr && entry->spilled) return defer();  // Restoring is a worker's job.
  KVCTL_RETURN_IF_ERROR(EnsureResident(*entry, request.sequence_id));
  if (!entry->seq) return NotFound("sequence_id: ", request.sequence_id, " was just closed");
  entry->last_used = now;
  if (deferred != nullptr && !entry->seq->AppendIsLight(request.n_tokens)) return defer();
  if (request.first_position > static_cast<uint64_t>(ipc::kMaxPosition)) {
    return InvalidArgument("first_position: got ", request.first_position, ", expected < 2^62");
  }
  // Host memory for the new tokens is reserved before the sequence grows, then settled to what
  // the sequence keeps after its evictions (SettleHostBytes below, on every path out).
  KVCTL_ASSIGN_OR_RETURN(
      const uint64_t growth,
      CheckedMul("APPEND host memory", HostBytesPerKeptToken(entry->shape), request.n_tokens));
  KVCTL_RETURN_IF_ERROR(host_memory_.Reserve("APPEND", growth));
  struct Settle {
    HostMemoryBudget& budget;
    SequenceEntry& entry;
    uint64_t reserved;
    ~Settle() {          // REQUIRES: entry.mu held.
      if (!entry.seq) {  // Closed meanwhile: RetireSequence released the sequence's charge.
        budget.Release(reserved);
        return;
      }
      const uint64_t now_bytes =
          entry.open_host_bytes +
          static_cast<uint64_t>(entry.seq->KeptTokens()) * kHostBytesPerStreamToken;
      const uint64_t held = entry.host_bytes + reserved;
      // Kept tokens grow by at most n_tokens per stream, so now_bytes <= held.
      budget.Release(held - std::min(held, now_bytes));
      entry.host_bytes = std::min(held, now_bytes);
    }
  } settle{host_memory_, *entry, growth};
  const std::vector<KvTensorView>* q_views = q_bytes != nullptr ? &q : nullptr;
  const bool was_lost = !entry->seq->integrity().ok();
  // With a local prefix cache or tier.spill_on_pressure_idle_ms, a full pool first drops cached
  // prefixes no one reads and spills idle sequences to the tier, before this sequence's own
  // widths are lowered (its relief waits for the retry).
  const bool free_first =
      prefix_cache_ != nullptr || (tier_ && tier_->config().spill_on_pressure_idle_ms > 0);
  const auto first_position = static_cast<int64_t>(request.first_position);
  Status appended =
      entry->seq->Append(first_position, k, v, q_views,
                         /*allow_relief=*/deferred == nullptr && !free_first, request.continues);
  // A full pool: the append changed nothing; relieving it is a worker's job.
  if (deferred != nullptr && appended.code() == StatusCode::kResourceExhausted) return defer();
  if (appended.code() == StatusCode::kDataLoss && !was_lost) {
    Log(LogSeverity::kError, "APPEND: sequence {} lost: {}", request.sequence_id,
        appended.message());
  }
  // Relief by others: round 0 frees cached prefixes and spills idle sequences (free_first),
  // round 1 lowers the widths of others (budget.pressure_scope = "pool"). The failed APPEND
  // changed nothing, so the sequence's lock can go meanwhile (taking mu_ while holding it would
  // invert the mu_ -> sequence order of STATS and CLOSE); the sequence may then be closed, or
  // spilled by someone else's relief.
  for (int round = free_first ? 0 : 1;
       round < 2 && appended.code() == StatusCode::kResourceExhausted; ++round) {
    const int64_t shortfall = entry->seq->last_shortfall_pages();
    seq_lock.Unlock();
    const int64_t freed =
        round == 0 ? FreeForPool(*entry, shortfall, now) : LowerOthersForPool(*entry, shortfall);
    seq_lock.Lock();
    KVCTL_RETURN_IF_ERROR(EnsureResident(*entry, request.sequence_id));
    if (!entry->seq) return NotFound("sequence_id: ", request.sequence_id, " was just closed");
    // After the spills the sequence's own relief gets its turn even if nothing was spilled.
    if (round == 0 || freed > 0) {
      appended = entry->seq->Append(first_position, k, v, q_views, /*allow_relief=*/true,
                                    request.continues);
    }
  }
  KVCTL_RETURN_IF_ERROR(appended);
  if (held_flush_queue_on_.load(std::memory_order_relaxed) && entry->seq->HeldFlushPending() &&
      !entry->held_flush_queued.exchange(true)) {
    MutexLock lock(&held_flush_mu_);
    held_flushes_.push_back(entry);
    held_flushes_queued_.fetch_add(1);
  }
  return ipc::AppendReply{static_cast<uint64_t>(entry->seq->tokens()),
                          static_cast<uint64_t>(entry->seq->QuantizedTokens()),
                          pool_->Stats().bytes_used};
}

}  // namespace kvctl
