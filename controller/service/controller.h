// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/controller.h
// Controller: the daemon's state and request logic, with no sockets, signals or threads of its own
// (controller/daemon/daemon.h wires it to ZeroMQ and Boost.Asio). It owns the pool, the sessions a
// HELLO opens, their sequences and their leases, and answers each request with a reply struct or a
// Status whose message names the field, the value and what was expected. A request can never
// corrupt stored data: KvSequence::Append is all or nothing, and a client only reaches its own
// session's sequences.
//
// Thread safety: every method may be called from any thread. The session table is guarded by one
// mutex held only for lookups; work on a sequence holds that sequence's own mutex, so appends and
// fetches of different sequences run in parallel and a small request never waits for a big one.
//
//   KVCTL_ASSIGN_OR_RETURN(auto controller, Controller::Create(config));
//   StatusOr<ipc::HelloReply> hello = controller->Hello(request, Now());
#ifndef KVCTL_CONTROLLER_SERVICE_CONTROLLER_H_
#define KVCTL_CONTROLLER_SERVICE_CONTROLLER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "controller/config/config.h"
#include "controller/pool/pool.h"
#include "controller/pool/staging_shm.h"
#include "controller/sequence/budget_resolve.h"
#include "controller/sequence/host_memory.h"
#include "controller/sequence/kv_sequence.h"
#include "controller/service/blocks_reply.h"
#include "controller/service/helper_thread.h"
#include "controller/service/prefix_cache.h"
#include "controller/service/tier_service.h"
#include "controller/stats/stats.h"
#include "ipc/messages.h"
#include "ipc/server.h"

namespace kvctl {

using SteadyTime = std::chrono::steady_clock::time_point;

inline constexpr const char* kKvctlVersion = "0.1.0";

class Controller {
 public:
  // Creates the shm pool (pool.bytes, pool.page_bytes, staging slots). FAILED_PRECONDITION for
  // pool.backend = "cuda" when the build or the machine has no CUDA device.
  static StatusOr<std::unique_ptr<Controller>> Create(const Config& config);
  // The host memory an OPEN reserves for an empty sequence: KvSequence::HostBytesAtOpen and its
  // entry's per-stream FETCH state (the blocks reply's tag cache).
  static uint64_t SequenceHostBytesAtOpen(const HostShape& shape);
  ~Controller();

  StatusOr<ipc::HelloReply> Hello(const ipc::HelloRequest& request, SteadyTime now)
      KVCTL_EXCLUDES(mu_);
  Status Open(const ipc::OpenRequest& request, SteadyTime now) KVCTL_EXCLUDES(mu_);
  StatusOr<ipc::CloseReply> Close(const ipc::CloseRequest& request, SteadyTime now)
      KVCTL_EXCLUDES(mu_);
  StatusOr<ipc::PingReply> Ping(const ipc::PingRequest& request, SteadyTime now)
      KVCTL_EXCLUDES(mu_);
  // With `deferred` (the daemon's I/O thread): only an append that is cheap now is done, one
  // that only stores rows (KvSequence::AppendIsLight), whose sequence lock is free and that
  // needs no pressure relief. Anything else sets *deferred and returns with nothing changed, for
  // the caller to run it on a worker without `deferred`.
  StatusOr<ipc::AppendReply> Append(const ipc::AppendRequest& request, SteadyTime now,
                                    bool* deferred = nullptr) KVCTL_EXCLUDES(mu_);
  // With `deferred` (the daemon's I/O thread): only a FETCH that is cheap now is done, a
  // blocks-mode FETCH (a page-table walk) or a dense one of at most `max_dense_rows` rows in all
  // (0: no dense FETCH), whose sequence lock is free and whose pool chunks left to verify hold at
  // most kInlineFetchVerifyBytes (about 3-6 us of CRC32C; with pool.verify_on_fetch =
  // "unverified" a decode step's worth). Anything else sets *deferred and returns with nothing
  // verified, for the caller to run it on a worker.
  static constexpr uint64_t kInlineFetchVerifyBytes = 64 << 10;
  StatusOr<ipc::ReplyBody> Fetch(const ipc::FetchRequest& request, SteadyTime now,
                                 bool* deferred = nullptr, int64_t max_dense_rows = 0)
      KVCTL_EXCLUDES(mu_);
  // Ends a session: closes its sequences, frees their pages and its staging slot. NOT_FOUND for
  // an unknown session. Waits for requests in flight on its sequences, without holding the
  // session table's lock meanwhile.
  StatusOr<ipc::ByeReply> Bye(const ipc::ByeRequest& request, SteadyTime now) KVCTL_EXCLUDES(mu_);
  // Prefix reuse (controller_prefix.cc, PROTOCOL.md 4.9-4.10, docs/tier.md): SavePrefix keeps a
  // prefix in the local prefix cache (tier.local_prefix_fraction) and the cluster tier
  // (tier.nodes); OpenPrefix opens a sequence from the longest stored prefix of its prompt,
  // sharing a cached one's pages copy-on-write. With neither, SavePrefix answers
  // FAILED_PRECONDITION and OpenPrefix opens the sequence empty, as OPEN does.
  StatusOr<ipc::SavePrefixReply> SavePrefix(const ipc::SavePrefixRequest& request, SteadyTime now)
      KVCTL_EXCLUDES(mu_);
  StatusOr<ipc::OpenPrefixReply> OpenPrefix(const ipc::OpenPrefixRequest& request, SteadyTime now)
      KVCTL_EXCLUDES(mu_);
  // INFO-style text; `section` empty for all.
  StatusOr<std::string> Stats(const ipc::StatsRequest& request, SteadyTime now)
      KVCTL_EXCLUDES(mu_, retired_mu_);

  // One pass of the cluster tier's housekeeping (controller_tier.cc), run by the daemon every
  // tier.spill_idle_ms / 4 (at most once a second): sends queued key deletions and spills the
  // sequences idle for tier.spill_idle_ms (a sequence busy with a request is skipped). No-op
  // without a tier.
  void TierPass(SteadyTime now) KVCTL_EXCLUDES(mu_);
  // The interval the daemon runs TierPass at; 0 = it need not.
  std::chrono::milliseconds TierPassInterval() const;

  // Frees every session whose lease ran out by `now`; returns how many.
  int ExpireLeases(SteadyTime now) KVCTL_EXCLUDES(mu_);

  // One pass of the page-checksum scrubber (controller/service/scrubber.cc): verifies about
  // max_bytes of stored pages, taking the open sequences in turn from where the last pass stopped
  // (each at most once per pass; a sequence busy with a request is skipped) and marks a sequence
  // whose pages changed lost. Returns the bytes verified. No-op without pool.checksums.
  uint64_t Scrub(uint64_t max_bytes) KVCTL_EXCLUDES(mu_, scrub_mu_);

  // Applies a reloaded config (quantizer and budget settings reach sequences opened afterwards).
  // Refuses, with a message, changes to keys that are fixed for the daemon's life. `changes`, if
  // not null, receives every difference from the config it replaces (or would have replaced).
  Status Reload(const Config& config, std::vector<ConfigChange>* changes = nullptr)
      KVCTL_EXCLUDES(mu_);

  // quant.flush_after_reply (SequenceGeometry::flush_after_reply): a decode step whose tails
  // reach flush_tokens only stores its rows, and its sequence is queued (once) for
  // RunHeldFlushes, which the caller runs after the reply has left. Only a caller that called
  // EnableHeldFlushQueue (the daemon, before serving) gets the queue; without one the APPEND
  // whose tails reach flush_tokens + kMaxHeldFlushRows flushes, on the request path.
  void EnableHeldFlushQueue() { held_flush_queue_on_.store(true); }
  bool HeldFlushesQueued() const { return held_flushes_queued_.load() > 0; }
  // Encodes the records of every queued sequence's held flush (KvSequence::PrepareHeldFlushStep),
  // one layer per hold of its lock, so a FETCH or APPEND on it waits for one layer at most; the
  // sequence's next APPEND writes them. Page tables an engine holds stay valid meanwhile. Returns
  // the layers prepared.
  int64_t RunHeldFlushes() KVCTL_EXCLUDES(held_flush_mu_);

  // Records one served request for STATS (type, latency, error or not).
  void RecordRequest(uint16_t type, std::chrono::microseconds latency, bool error);

  // What the daemon knows and the controller does not: its endpoints and transport counters.
  void SetServerInfo(std::string endpoint, std::function<ipc::ServerCounters()> counters);
  // The HTTP server's bound HOST:PORT (server.http_address may ask for port 0); STATS shows it.
  // Callable while STATS is served.
  void SetHttpAddress(std::string bound_address) KVCTL_EXCLUDES(http_address_mu_);

  Config config() const KVCTL_EXCLUDES(mu_);
  // The pool's page and staging counters (a cpu pool's staging is its StagingObjects).
  PoolStats pool_stats() const;
  // Pool bytes of the frozen prefixes alive (STATS kv_prefix_frozen_bytes): with no sequence
  // open, every page in use is theirs.
  uint64_t prefix_frozen_bytes() const { return prefix_frozen_bytes_.load(); }
  const std::string& shm_name() const { return shm_name_; }

 private:
  // One open sequence. Requests on it hold its mutex; its table entry (Session::sequences) is
  // guarded by mu_. Taken in the order mu_, then a sequence's (try-locks may go the other way).
  struct SequenceEntry {
    SequenceEntry(SteadyTime opened, std::unique_ptr<KvSequence> seq, const HostShape& shape,
                  uint64_t open_host_bytes, CompressionOutlook outlook = {})
        : opened(opened),
          shape(shape),
          open_host_bytes(open_host_bytes),
          outlook(std::move(outlook)),
          seq(std::move(seq)),
          host_bytes(open_host_bytes) {}

    // A sequence written to the cluster tier, its pool pages freed (controller_tier.cc): what
    // restoring it needs besides the image.
    struct Spilled {
      std::string key;          // Its tier key.
      uint64_t bytes = 0;       // Image bytes stored.
      int64_t kept_tokens = 0;  // Summed over (layer, head): its host memory when restored.
      SequenceGeometry geometry;
      std::string model_name;
      EvictionSettings eviction;
      PressureSettings pressure;
      HeadUsage quality;  // QualityTotals at the spill, for the lifetime totals if never restored.
      Status lost;        // Once a restore found the tier lost it: what every request answers.
    };

    const SteadyTime opened;
    const HostShape shape;
    const uint64_t open_host_bytes;    // KvSequence::HostBytesAtOpen(shape).
    const CompressionOutlook outlook;  // Whether its settings can compress (STATS, the log).
    Mutex mu;
    // Null once retired, or while spilled.
    std::unique_ptr<KvSequence> seq KVCTL_GUARDED_BY(mu);
    std::optional<Spilled> spilled KVCTL_GUARDED_BY(mu);  // Set while in the tier.
    bool spill_refused KVCTL_GUARDED_BY(mu) = false;      // Its image cannot be exported.
    SteadyTime last_used KVCTL_GUARDED_BY(mu) = opened;   // Last APPEND, FETCH or SAVE_PREFIX.
    // Charged to the host budget now (0 once retired).
    uint64_t host_bytes KVCTL_GUARDED_BY(mu);
    std::atomic<bool> held_flush_queued{false};  // In Controller::held_flushes_.
    // Blocks FETCH's table tags so far (BuildBlocksReply): a FETCH hashes only new records.
    BlocksTagCache blocks_tags KVCTL_GUARDED_BY(mu);
  };
  struct Session;

  Controller(const Config& config, std::unique_ptr<PageAllocator> pool, std::string shm_name,
             std::unique_ptr<StagingObjects> staging);
  StatusOr<std::shared_ptr<SequenceEntry>> FindSequence(uint64_t session_id, uint64_t sequence_id,
                                                        SteadyTime now) KVCTL_EXCLUDES(mu_);
  StatusOr<std::shared_ptr<Session>> FindSessionLocked(uint64_t session_id, SteadyTime now)
      KVCTL_REQUIRES(mu_);
  void FreeSessionLocked(Session& session) KVCTL_REQUIRES(mu_);

  // APPEND's steps (controller_append.cc, in the order Append runs them).
  // Where the request's tensors are: its inline frames (staged_bytes 0), a cpu pool session's
  // own staging object, or a cuda pool's slot in the pool (device_slot, on the host copy).
  struct AppendSource {
    ipc::Geometry geometry;
    uint64_t staged_bytes = 0;  // From request.staging_offset, inside the session's slot.
    std::shared_ptr<StagingObject> object;  // Keeps the mapping while it is copied.
    const uint8_t* device_slot = nullptr;
    int64_t prepare_split_tokens = 0;  // server.prepare_split_tokens when the request came.
  };
  // Under mu_: the session, the request's shape against its geometry, the staging span.
  StatusOr<AppendSource> ResolveAppendSource(const ipc::AppendRequest& request, SteadyTime now)
      KVCTL_EXCLUDES(mu_);
  // The staged bytes the append reads: a private copy in `snapshot` (cpu pool), or the host
  // copy of the device slot once pulled; null for inline frames. With `deferred`, sets it
  // instead of copying more than a decode step's rows or pulling from the device.
  StatusOr<const uint8_t*> ReadStaged(const ipc::AppendRequest& request, const AppendSource& source,
                                      StagingSnapshot& snapshot, bool* deferred);
  // KvSequence::Append, then relief by others in rounds while the pool is short; the sequence's
  // lock is let go during a round. With `deferred`, a short pool defers instead.
  Status AppendWithRelief(SequenceEntry& entry, const ipc::AppendRequest& request,
                          const std::vector<KvTensorView>& k, const std::vector<KvTensorView>& v,
                          const std::vector<KvTensorView>* q, SteadyTime now, bool* deferred)
      KVCTL_REQUIRES(entry.mu) KVCTL_EXCLUDES(mu_);
  // quant.flush_after_reply: queues the sequence (once) for RunHeldFlushes.
  void QueueHeldFlush(const std::shared_ptr<SequenceEntry>& entry) KVCTL_REQUIRES(entry->mu)
      KVCTL_EXCLUDES(held_flush_mu_);
  // Gives the session's staging slot back: its own object (cpu pool) or its slot in the pool.
  void ReleaseStaging(Session& session);
  // Frees a sequence, keeping its quality telemetry in the daemon's lifetime totals.
  void RetireSequence(SequenceEntry& entry) KVCTL_REQUIRES(entry.mu) KVCTL_EXCLUDES(retired_mu_);
  // budget.pressure_scope = "pool": after `self`'s APPEND lacked `pages` pool pages, lowers the
  // widths of other open sequences (those opened with budget.pressure = "requantize") until
  // that many are free; returns the pages freed. It takes mu_, then try-locks the others.
  int64_t LowerOthersForPool(const SequenceEntry& self, int64_t pages) KVCTL_EXCLUDES(mu_, self.mu);

  // What OPEN resolves from the config for a new sequence of geometry g (controller.cc).
  struct OpenPlan {
    SequenceGeometry geometry;
    std::vector<LayerPlan> plans;
    EvictionSettings eviction;
    PressureSettings pressure;
    CompressionOutlook outlook;
  };
  static StatusOr<OpenPlan> PlanOpen(const Config& config, const std::string& model_name,
                                     const ipc::Geometry& g);
  // OPEN's checks and host-memory reservation under mu_: the config, geometry and model of the
  // session, and the bytes reserved (released by RetireSequence once the entry exists).
  struct OpenTicket {
    Config config;
    ipc::Geometry geometry;
    std::string model_name;
    HostShape shape;
    uint64_t open_bytes = 0;
  };
  StatusOr<OpenTicket> ReserveOpen(uint64_t session_id, uint64_t sequence_id, SteadyTime now)
      KVCTL_EXCLUDES(mu_);
  // Puts a built sequence in its session's table (the session may have ended or the id been
  // taken meanwhile: then the sequence is retired and the error returned).
  Status InsertSequence(uint64_t session_id, uint64_t sequence_id, SteadyTime now,
                        std::shared_ptr<SequenceEntry> entry) KVCTL_EXCLUDES(mu_);
  // Restores a spilled sequence into the pool (controller_tier.cc): OK when it is resident,
  // UNAVAILABLE when the tier cannot be reached now (still spilled), RESOURCE_EXHAUSTED when the
  // pool lacks pages (still spilled), DATA_LOSS once the tier lost it.
  Status EnsureResident(SequenceEntry& entry, uint64_t sequence_id) KVCTL_REQUIRES(entry.mu);
  // Writes a resident sequence to the tier and frees its pool pages; false when it stays
  // resident (export refused, quota, cluster error: counted and logged).
  bool SpillLocked(SequenceEntry& entry, uint64_t sequence_id, const std::string& model_name)
      KVCTL_REQUIRES(entry.mu);
  // Keeps a frozen copy of a saved prefix (`image`, the first tokens.size() tokens) in the local
  // prefix cache and returns it; null when the host budget, the pool or the cache's bound
  // refuses it.
  std::shared_ptr<KvSequence> KeepLocalPrefix(const std::string& key,
                                              std::span<const int32_t> tokens,
                                              std::span<const uint8_t> image,
                                              const SequenceGeometry& geometry,
                                              const std::string& model_name, const HostShape& shape)
      KVCTL_EXCLUDES(mu_);
  // A frozen prefix made from a stored image, its host memory charged (released when it goes).
  StatusOr<std::shared_ptr<KvSequence>> FreezePrefix(std::span<const uint8_t> image,
                                                     const SequenceGeometry& geometry,
                                                     const std::string& model_name,
                                                     const HostShape& shape);
  // Pool pressure, first lever: drops prefixes no sequence reads from the local cache, then
  // (tier.spill_on_pressure_idle_ms) spills idle sequences; returns the pages freed.
  int64_t FreeForPool(const SequenceEntry& self, int64_t pages, SteadyTime now)
      KVCTL_EXCLUDES(mu_, self.mu);
  // tier.spill_on_pressure_idle_ms: after `self`'s APPEND lacked `pages` pool pages, spills other
  // sequences idle at least that long, least recently used first, until that many pages are
  // free; returns the pages freed.
  int64_t SpillOthersForPool(const SequenceEntry& self, int64_t pages, SteadyTime now)
      KVCTL_EXCLUDES(mu_, self.mu);

  // One open sequence as a background pass (scrubber, tier pass, pressure relief) sees it: a copy
  // of its table entry, taken under mu_; the pass then locks each entry itself.
  struct OpenSequenceRef {
    uint64_t session_number = 0;  // What logs show (never the session id).
    uint64_t sequence_id = 0;
    std::string model_name;
    std::shared_ptr<SequenceEntry> entry;
  };
  // Every open sequence but `except` (may be null); mu_ is held for the copy only.
  std::vector<OpenSequenceRef> OpenSequences(const SequenceEntry* except = nullptr)
      KVCTL_EXCLUDES(mu_);

  // The session record's own host memory (controller.cc).
  static uint64_t SessionHostBytes();
  // HELLO's checks that a geometry can be served at all: each (layer, KV head) stream needs a
  // pool page of its own, and an empty sequence must fit the host budget.
  Status CheckGeometryFits(const ipc::Geometry& g, const HostShape& shape) const;
  // The STATS sections made of the controller's own state (controller_stats.cc).
  void WriteServerSection(const Config& config, SteadyTime now, std::ostream& out) const
      KVCTL_EXCLUDES(http_address_mu_);
  void WritePoolSection(std::ostream& out) const;

  const std::unique_ptr<PageAllocator> pool_;
  const std::unique_ptr<TierService> tier_;  // Null without a tier (tier.nodes = "").
  HostMemoryBudget host_memory_;             // limits.host_memory_bytes; internally synchronized.
  // Pool bytes of the frozen prefixes alive: held by the cache or read by sequences forked from
  // them (a dropped prefix lives on while read). Part of every "memory" figure in STATS.
  std::atomic<uint64_t> prefix_frozen_bytes_{0};
  // Null when tier.local_prefix_fraction is 0. Its frozen prefixes release host memory when they
  // go, so it is declared after host_memory_.
  const std::unique_ptr<PrefixCache> prefix_cache_;
  const std::string shm_name_;
  // cpu pool: one shm object per session with staging (a cuda pool's slots are in the pool).
  const std::unique_ptr<StagingObjects> staging_;
  const SteadyTime started_;
  ServerStats stats_;  // Internally synchronized.
  // Takes parts of a dense FETCH above server.dense_fetch_split_rows (when that is set).
  HelperThread fetch_helper_;
  // Prepares layers of an APPEND of server.prepare_split_tokens or more (when that is set), as
  // prepare_runner_, which every such APPEND hands its sequence.
  HelperThread prepare_helper_;
  const KvSequence::PartsRunner prepare_runner_ = [this](size_t parts,
                                                         const std::function<void(size_t)>& run) {
    prepare_helper_.RunShared(parts, run);
  };
  std::string endpoint_;  // Set once before serving.
  mutable Mutex http_address_mu_;
  // Bound address; "" = off or not started.
  std::string http_address_ KVCTL_GUARDED_BY(http_address_mu_);
  std::function<ipc::ServerCounters()> server_counters_;  // Set once before serving.

  mutable Mutex mu_;
  Config config_ KVCTL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Session>> sessions_ KVCTL_GUARDED_BY(mu_);
  uint64_t sessions_expired_ KVCTL_GUARDED_BY(mu_) = 0;
  uint64_t sessions_ended_ KVCTL_GUARDED_BY(mu_) = 0;  // By BYE.
  uint64_t next_session_number_ KVCTL_GUARDED_BY(mu_) = 1;
  // Compression warnings already logged (each message once; a reload that changes the numbers
  // logs again).
  std::set<std::string> compression_warnings_logged_ KVCTL_GUARDED_BY(mu_);
  Mutex scrub_mu_;                                     // One scrub pass at a time.
  size_t scrub_next_ KVCTL_GUARDED_BY(scrub_mu_) = 0;  // Where the next pass starts.
  Mutex retired_mu_;
  HeadUsage retired_quality_ KVCTL_GUARDED_BY(retired_mu_);  // Quality of freed sequences.
  // Sequences whose flushes wait for RunHeldFlushes (quant.flush_after_reply); each at most once
  // (SequenceEntry::held_flush_queued), so the queue is bounded by the open sequences.
  std::atomic<bool> held_flush_queue_on_{false};
  std::atomic<int64_t> held_flushes_queued_{0};  // held_flushes_.size(), read without the lock.
  std::atomic<uint64_t> held_flush_layers_{0};   // Layers prepared after replies (STATS).
  Mutex held_flush_mu_;
  std::deque<std::weak_ptr<SequenceEntry>> held_flushes_ KVCTL_GUARDED_BY(held_flush_mu_);
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_CONTROLLER_H_
