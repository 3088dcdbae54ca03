// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Controller::Append: resolves the request's tensors (inline frames, or a private copy of the
// session's staging slot), takes the sequence's lock and stores them, relieving a full pool in
// rounds (controller_pressure.cc). The steps, in order:
//   ResolveAppendSource   under mu_: the session, the shape, the staging span
//   ReadStaged            the slot's bytes copied (cpu pool) or pulled to the host (cuda pool)
//   AppendTensors         per-layer views of K, V (and Q) over those bytes or the inline frames
//   (Append itself)       the sequence locked and resident, host memory reserved
//   AppendWithRelief      KvSequence::Append, then relief rounds while the pool is short
//   QueueHeldFlush        quant.flush_after_reply: the sequence queued for RunHeldFlushes

#include "common/checked_math.h"
#include "common/log.h"
#include "controller/pool/staging_shm.h"
#include "controller/service/controller.h"
#include "controller/service/controller_internal.h"
#include "ipc/protocol.h"

namespace kvctl {
namespace {

// The reply of a deferred append is never sent: the caller runs it again.
Status Defer(bool* deferred) {
  *deferred = true;
  return Unavailable("deferred to a worker");
}

// Per-layer views of one APPEND's K, V and (with has_q) Q rows.
struct AppendTensors {
  std::vector<KvTensorView> k, v, q;
  const std::vector<KvTensorView>* q_or_null() const { return q.empty() ? nullptr : &q; }
};

// Views over `staged` (the staging layout of the request) or, when it is null, over the
// request's inline frames (whose sizes ipc::CheckAppendShape checked).
StatusOr<AppendTensors> ViewAppendTensors(const ipc::AppendRequest& request, const ipc::Geometry& g,
                                          const uint8_t* staged) {
  // Bounded by the protocol limits (2^20 tokens x 2^10 heads x 2^10 dims x 4 bytes), checked all
  // the same (AppendStagingLayout): these sizes become pointer offsets.
  KVCTL_ASSIGN_OR_RETURN(const ipc::StagingLayout layout,
                         ipc::AppendStagingLayout(g, request.n_tokens, request.has_q));
  const uint8_t* k_bytes = staged;
  const uint8_t* v_bytes = nullptr;
  const uint8_t* q_bytes = nullptr;
  if (staged != nullptr) {
    v_bytes = staged + layout.v_offset;
    if (request.has_q) q_bytes = staged + layout.q_offset;
  } else {
    k_bytes = static_cast<const uint8_t*>(request.k.data());
    v_bytes = static_cast<const uint8_t*>(request.v.data());
    if (request.has_q) q_bytes = static_cast<const uint8_t*>(request.q.data());
  }
  AppendTensors t;
  t.k.reserve(g.layers);
  t.v.reserve(g.layers);
  if (q_bytes != nullptr) t.q.reserve(g.layers);
  for (uint32_t l = 0; l < g.layers; ++l) {
    t.k.push_back(KvTensorView::Contiguous(k_bytes + l * layout.layer_bytes, g.dtype,
                                           request.n_tokens, g.kv_heads, g.head_dim));
    t.v.push_back(KvTensorView::Contiguous(v_bytes + l * layout.layer_bytes, g.dtype,
                                           request.n_tokens, g.kv_heads, g.head_dim));
    if (q_bytes != nullptr) {
      t.q.push_back(KvTensorView::Contiguous(q_bytes + l * layout.q_layer_bytes, g.dtype,
                                             request.n_tokens, g.q_heads, g.head_dim));
    }
  }
  return t;
}

}  // namespace

StatusOr<Controller::AppendSource> Controller::ResolveAppendSource(
    const ipc::AppendRequest& request, SteadyTime now) {
  MutexLock lock(&mu_);
  KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                         FindSessionLocked(request.session_id, now));
  AppendSource source;
  source.geometry = session->geometry;
  source.prepare_split_tokens = config_.server.prepare_split_tokens;
  KVCTL_RETURN_IF_ERROR(ipc::CheckAppendShape(request, source.geometry));
  if (request.source != ipc::AppendSource::kStaging) return source;
  if (!session->has_staging) {
    return FailedPrecondition("source: staging, but session ", request.session_id,
                              " has no staging slot (HELLO returned staging_bytes 0); send "
                              "tensors inline");
  }
  KVCTL_ASSIGN_OR_RETURN(
      const ipc::StagingLayout layout,
      ipc::AppendStagingLayout(source.geometry, request.n_tokens, request.has_q));
  const StagingSlot& slot = session->staging;
  KVCTL_RETURN_IF_ERROR(CheckSpanInside("staging_offset (this session's staging slot)",
                                        request.staging_offset, layout.total_bytes, slot.offset,
                                        slot.bytes));
  source.staged_bytes = layout.total_bytes;
  source.object = session->staging_object;
  if (!source.object) {
    source.device_slot = pool_->StagingPointer(slot.id) + (request.staging_offset - slot.offset);
  }
  return source;
}

StatusOr<const uint8_t*> Controller::ReadStaged(const ipc::AppendRequest& request,
                                                const AppendSource& source,
                                                StagingSnapshot& snapshot, bool* deferred) {
  if (source.staged_bytes == 0) return nullptr;  // Inline frames.
  if (source.object) {
    // A cpu pool's slot is the engine's to write at any moment: everything after this reads a
    // private copy, taken once (outside mu_: a prefill chunk's copy takes milliseconds). More
    // than a decode step's rows is a worker's to copy and store.
    if (deferred != nullptr && source.staged_bytes > StagingSnapshot::kRetainBytes) {
      return Defer(deferred);
    }
    return snapshot.Copy(*source.object, request.staging_offset, source.staged_bytes);
  }
  // A device pool's slot was written on the device: bring the bytes to the host copy, which
  // is the daemon's own (outside mu_: a device copy must not stall every other request).
  if (deferred != nullptr) return Defer(deferred);  // A device copy is not for the I/O thread.
  KVCTL_RETURN_IF_ERROR(pool_->PullStaging(request.staging_offset, source.staged_bytes));
  return source.device_slot;
}

StatusOr<ipc::AppendReply> Controller::Append(const ipc::AppendRequest& request, SteadyTime now,
                                              bool* deferred) {
  KVCTL_ASSIGN_OR_RETURN(const AppendSource source, ResolveAppendSource(request, now));
  thread_local StagingSnapshot snapshot;
  struct TrimSnapshot {
    StagingSnapshot& snapshot;
    bool more_pieces;
    ~TrimSnapshot() { snapshot.Trim(more_pieces); }
  } trim_snapshot{snapshot, request.continues};
  KVCTL_ASSIGN_OR_RETURN(const uint8_t* staged, ReadStaged(request, source, snapshot, deferred));
  KVCTL_ASSIGN_OR_RETURN(const AppendTensors tensors,
                         ViewAppendTensors(request, source.geometry, staged));
  KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry,
                         FindSequence(request.session_id, request.sequence_id, now));
  if (deferred == nullptr) {
    entry->mu.Lock();
  } else if (!entry->mu.TryLock()) {
    return Defer(deferred);
  }
  MutexLock seq_lock(&entry->mu, AdoptLock{});
  if (deferred != nullptr && entry->spilled) return Defer(deferred);  // Restoring: a worker's.
  KVCTL_RETURN_IF_ERROR(EnsureResident(*entry, request.sequence_id));
  if (!entry->seq) return NotFound("sequence_id: ", request.sequence_id, " was just closed");
  entry->last_used = now;
  if (deferred != nullptr && !entry->seq->AppendIsLight(request.n_tokens)) return Defer(deferred);
  if (request.first_position > static_cast<uint64_t>(ipc::kMaxPosition)) {
    return InvalidArgument("first_position: got ", request.first_position, ", expected < 2^62");
  }
  // Host memory for the new tokens is reserved before the sequence grows, then settled to what
  // the sequence keeps after its evictions (Settle, on every path out).
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
  // A worker's large APPEND (a prefill) prepares its layers with the prepare helper too; the I/O
  // thread hands those to a worker anyway.
  const bool split = deferred == nullptr && source.prepare_split_tokens > 0;
  entry->seq->SetPrepareRunner(split ? &prepare_runner_ : nullptr, source.prepare_split_tokens);
  KVCTL_RETURN_IF_ERROR(
      AppendWithRelief(*entry, request, tensors.k, tensors.v, tensors.q_or_null(), now, deferred));
  QueueHeldFlush(entry);
  return ipc::AppendReply{static_cast<uint64_t>(entry->seq->tokens()),
                          static_cast<uint64_t>(entry->seq->QuantizedTokens()),
                          pool_->Stats().bytes_used};
}

Status Controller::AppendWithRelief(SequenceEntry& entry, const ipc::AppendRequest& request,
                                    const std::vector<KvTensorView>& k,
                                    const std::vector<KvTensorView>& v,
                                    const std::vector<KvTensorView>* q, SteadyTime now,
                                    bool* deferred) {
  const bool was_lost = !entry.seq->integrity().ok();
  // With a local prefix cache or tier.spill_on_pressure_idle_ms, a full pool first drops cached
  // prefixes no one reads and spills idle sequences to the tier, before this sequence's own
  // widths are lowered (its relief waits for the retry).
  const bool free_first =
      prefix_cache_ != nullptr || (tier_ && tier_->config().spill_on_pressure_idle_ms > 0);
  const auto first_position = static_cast<int64_t>(request.first_position);
  Status appended =
      entry.seq->Append(first_position, k, v, q,
                        /*allow_relief=*/deferred == nullptr && !free_first, request.continues);
  // A full pool: the append changed nothing; relieving it is a worker's job.
  if (deferred != nullptr && appended.code() == StatusCode::kResourceExhausted) {
    return Defer(deferred);
  }
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
    const int64_t shortfall = entry.seq->last_shortfall_pages();
    entry.mu.Unlock();
    const int64_t freed =
        round == 0 ? FreeForPool(entry, shortfall, now) : LowerOthersForPool(entry, shortfall);
    entry.mu.Lock();
    KVCTL_RETURN_IF_ERROR(EnsureResident(entry, request.sequence_id));
    if (!entry.seq) return NotFound("sequence_id: ", request.sequence_id, " was just closed");
    // After the spills the sequence's own relief gets its turn even if nothing was spilled.
    if (round == 0 || freed > 0) {
      appended =
          entry.seq->Append(first_position, k, v, q, /*allow_relief=*/true, request.continues);
    }
  }
  return appended;
}

void Controller::QueueHeldFlush(const std::shared_ptr<SequenceEntry>& entry) {
  if (held_flush_queue_on_.load(std::memory_order_relaxed) && entry->seq->HeldFlushPending() &&
      !entry->held_flush_queued.exchange(true)) {
    MutexLock lock(&held_flush_mu_);
    held_flushes_.push_back(entry);
    held_flushes_queued_.fetch_add(1);
  }
}

}  // namespace kvctl
