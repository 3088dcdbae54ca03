// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/controller.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/checked_math.h"
#include "common/half.h"
#include "common/log.h"
#include "common/secure_random.h"
#include "controller/pool/cuda_arena.h"
#include "controller/pool/slab.h"
#include "controller/sequence/budget_resolve.h"
#include "controller/service/blocks_reply.h"
#include "controller/service/controller_internal.h"
#include "controller/service/dense_reply.h"
#include "ipc/protocol.h"

namespace kvctl {

static_assert(kNumQuantMethods == ipc::kNumWireQuantMethods,
              "ipc/messages.h must list every kernels/quant_types.h method");

namespace {

int64_t Micros(SteadyTime t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::string ShmNameFor(const Config& config) { return config.pool.shm_name; }

SequenceShape ShapeOf(const ipc::Geometry& g, const StreamingRules& rules, bool lossless) {
  return SequenceShape{static_cast<int>(g.layers), static_cast<int>(g.kv_heads),
                       static_cast<int>(g.q_heads), static_cast<int>(g.head_dim),
                       lossless ? 0 : rules.sink_tokens};
}

HostShape HostShapeOf(const Config& config, const ipc::Geometry& g) {
  return HostShape{.layers = g.layers,
                   .kv_heads = g.kv_heads,
                   .q_heads = g.q_heads,
                   .head_dim = g.head_dim,
                   .obs_window = g.q_heads == 0 ? 0u
                                 : config.evict.obs_window > 0
                                     ? static_cast<uint64_t>(config.evict.obs_window)
                                     : 64u};
}

// Builds every layer's plan for a new sequence from the config in force; joint budgets also give
// each head's kept-token cap (into *head_caps when not null).
StatusOr<std::vector<LayerPlan>> PlanLayers(const Config& config, const std::string& model,
                                            const ipc::Geometry& g,
                                            std::vector<int64_t>* head_caps = nullptr,
                                            JointPlanInput* joint_input = nullptr) {
  const QuantSettings q = EffectiveQuantSettings(config, FindModel(config, model));
  std::vector<LayerPlan> plans(g.layers);
  const bool lossless = q.lossless;
  StreamingRules rules;
  if (!lossless) {
    KVCTL_ASSIGN_OR_RETURN(rules, ResolveStreamingRules(config, model, g.head_dim));
  }
  const uint64_t row_bytes =
      2ull * g.head_dim * (lossless ? DTypeSize(g.dtype) : DTypeSize(DType::kF16));
  if (row_bytes > config.pool.page_bytes) {
    return InvalidArgument("head_dim: got ", g.head_dim, ": one K+V row takes ", row_bytes,
                           " bytes, more than pool.page_bytes ", config.pool.page_bytes,
                           "; raise pool.page_bytes");
  }
  // A small head_dim in a huge pool gives more row slots than uint32 ids can name.
  KVCTL_RETURN_IF_ERROR(
      CheckSlotIdSpace("head_dim", config.pool.bytes, config.pool.page_bytes, row_bytes));
  for (uint32_t l = 0; l < g.layers; ++l) {
    plans[l].lossless = lossless;
    plans[l].rules = rules;
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      if (lossless) {
        // A lossless layer has no records; any valid spec with this head_dim describes it.
        KVCTL_ASSIGN_OR_RETURN(QuantSpec spec,
                               MakeQuantSpec(QuantMethod::kFp16, g.head_dim, 16, 16));
        plans[l].head_specs.push_back(spec);
        continue;
      }
      StatusOr<QuantSpec> spec = ResolveQuantSpec(config, model, g.head_dim, l, h);
      if (!spec.ok()) {
        return Status(spec.status().code(),
                      internal::StrCat("quantizer for layer ", l, ", head ", h, " (head_dim ",
                                       g.head_dim, "): ", spec.status().message()));
      }
      const BlockLayout layout = BlockLayoutOf(*spec);
      const uint64_t norm_bytes = layout.side_bytes_per_token * spec->block_tokens;
      if (layout.record_bytes > config.pool.page_bytes || norm_bytes > config.pool.page_bytes) {
        return InvalidArgument("quantizer for layer ", l, ", head ", h, ": a ",
                               QuantMethodName(spec->method), " k", spec->k_bits, "v", spec->v_bits,
                               " block record of ", spec->block_tokens, " tokens x head_dim ",
                               g.head_dim, " takes ", layout.record_bytes,
                               " bytes, more than pool.page_bytes ", config.pool.page_bytes,
                               "; raise pool.page_bytes or lower quant.block_tokens");
      }
      KVCTL_RETURN_IF_ERROR(CheckSlotIdSpace("quant.block_tokens", config.pool.bytes,
                                             config.pool.page_bytes, layout.record_bytes));
      if (norm_bytes > 0) {
        KVCTL_RETURN_IF_ERROR(CheckSlotIdSpace("quant.block_tokens", config.pool.bytes,
                                               config.pool.page_bytes, norm_bytes));
      }
      plans[l].head_specs.push_back(*spec);
    }
  }
  KVCTL_RETURN_IF_ERROR(
      ApplyBudgetWidths(config, ShapeOf(g, rules, lossless), &plans, head_caps, joint_input));
  return plans;
}

}  // namespace

Controller::Controller(const Config& config, std::unique_ptr<PageAllocator> pool,
                       std::string shm_name, std::unique_ptr<StagingObjects> staging)
    : pool_(std::move(pool)),
      tier_(TierService::Create(config.tier)),
      host_memory_(EffectiveHostMemoryBytes(config)),
      prefix_cache_(config.tier.local_prefix_fraction > 0
                        ? std::make_unique<PrefixCache>(static_cast<uint64_t>(
                              config.tier.local_prefix_fraction *
                              static_cast<double>(pool_->pages_total() * pool_->page_bytes())))
                        : nullptr),
      shm_name_(std::move(shm_name)),
      staging_(std::move(staging)),
      started_(std::chrono::steady_clock::now()),
      config_(config) {}

Controller::~Controller() {
  {
    MutexLock lock(&mu_);
    for (auto& [id, session] : sessions_) FreeSessionLocked(*session);
    sessions_.clear();
  }
  // The spilled sequences just freed leave no keys behind (each delete is bounded by the tier's
  // timeouts; what fails is left to tier.ttl_seconds).
  if (tier_) tier_->DrainDeletes();
}

StatusOr<std::unique_ptr<Controller>> Controller::Create(const Config& config) {
  KVCTL_RETURN_IF_ERROR(ValidateConfig(config));
  std::unique_ptr<Arena> arena;
  std::string shm_name;
  PageAllocatorOptions options;
  options.page_bytes = config.pool.page_bytes;
  options.checksums = config.pool.checksums;
  options.fetch_verify = config.pool.verify_on_fetch == VerifyOnFetch::kAll
                             ? PageAllocatorOptions::FetchVerify::kAll
                             : PageAllocatorOptions::FetchVerify::kUnverified;
  auto staging = std::make_unique<StagingObjects>("", 0, 0);
  if (config.pool.backend == PoolBackend::kCuda) {
    KVCTL_ASSIGN_OR_RETURN(arena, CreateCudaArena(config.pool.bytes, config.pool.cuda_device));
    // The device pool keeps its staging slots inside the pool (device memory engines write).
    if (config.pool.staging_bytes_per_session > 0) {
      options.staging_slots = static_cast<uint32_t>(config.pool.staging_slots);
      options.staging_slot_bytes = config.pool.staging_bytes_per_session;
    }
  } else {
    shm_name = ShmNameFor(config);
    if (shm_name.size() + StagingObjects::kSuffixChars > 255) {
      return InvalidArgument("pool.shm_name: got ", shm_name.size(),
                             " characters, expected at most ", 255 - StagingObjects::kSuffixChars,
                             " (staging objects are named after it with a ",
                             StagingObjects::kSuffixChars, "-character suffix)");
    }
    // Staging lives in per-session objects, so clients map the pool read-only; their bytes come
    // out of pool.bytes as the slots at the pool's end used to (same page count).
    const uint64_t staging_bytes =
        config.pool.staging_bytes_per_session > 0
            ? uint64_t(config.pool.staging_slots) *
                  ((config.pool.staging_bytes_per_session + 4095) / 4096 * 4096)
            : 0;
    const StaleShm stale = config.pool.unlink_stale ? StaleShm::kUnlink : StaleShm::kRefuse;
    KVCTL_ASSIGN_OR_RETURN(auto shm,
                           ShmArena::Create(shm_name, config.pool.bytes - staging_bytes, stale));
    KVCTL_RETURN_IF_ERROR(shm->RestrictToReaders());
    arena = std::move(shm);
    staging =
        std::make_unique<StagingObjects>(shm_name, static_cast<uint32_t>(config.pool.staging_slots),
                                         config.pool.staging_bytes_per_session);
    // We hold the pool now, so objects with our prefix are a dead daemon's.
    if (const int removed = staging->RemoveLeftovers(); removed > 0) {
      Log(LogSeverity::kWarning, "removed {} staging object(s) left by a previous daemon", removed);
    }
  }
  KVCTL_ASSIGN_OR_RETURN(std::unique_ptr<PageAllocator> pool,
                         PageAllocator::Create(std::move(arena), options));
  return std::unique_ptr<Controller>(
      new Controller(config, std::move(pool), std::move(shm_name), std::move(staging)));
}

Config Controller::config() const {
  MutexLock lock(&mu_);
  return config_;
}

Status Controller::Reload(const Config& config, std::vector<ConfigChange>* changes) {
  KVCTL_RETURN_IF_ERROR(ValidateConfig(config));
  MutexLock lock(&mu_);
  if (changes != nullptr) *changes = DiffConfig(config_, config);
  KVCTL_RETURN_IF_ERROR(CheckReload(config_, config));
  config_ = config;
  host_memory_.set_limit(EffectiveHostMemoryBytes(config));
  return OkStatus();
}

void Controller::RecordRequest(uint16_t type, std::chrono::microseconds latency, bool error) {
  stats_.Record(type, latency, error);
}

void Controller::RetireSequence(SequenceEntry& entry) {
  if (!entry.seq && !entry.spilled) return;
  host_memory_.Release(entry.host_bytes);
  entry.host_bytes = 0;
  HeadUsage q;
  if (entry.spilled) {
    // Its tier key is deleted by the next tier pass, never under the caller's locks.
    if (entry.spilled->lost.ok()) tier_->ForgetSpill(entry.spilled->key, entry.spilled->bytes);
    q = entry.spilled->quality;
    entry.spilled.reset();
  } else {
    q = entry.seq->QualityTotals();
  }
  {
    MutexLock lock(&retired_mu_);
    retired_quality_.quality_samples += q.quality_samples;
    retired_quality_.k_rel_error_sum += q.k_rel_error_sum;
    retired_quality_.v_rel_error_sum += q.v_rel_error_sum;
  }
  entry.seq.reset();
}

std::vector<Controller::OpenSequenceRef> Controller::OpenSequences(const SequenceEntry* except) {
  std::vector<OpenSequenceRef> out;
  MutexLock lock(&mu_);
  for (const auto& [id, session] : sessions_) {
    for (const auto& [seq_id, entry] : session->sequences) {
      if (entry.get() != except)
        out.push_back({session->number, seq_id, session->model_name, entry});
    }
  }
  return out;
}

PoolStats Controller::pool_stats() const {
  PoolStats s = pool_->Stats();
  if (staging_->slots() > 0) {
    s.staging_slots_total = staging_->slots();
    s.staging_slots_used = staging_->used();
    s.staging_slot_bytes = staging_->slot_bytes();
    s.alloc_failures_total += staging_->failures();
    s.staging_bytes_total =
        uint64_t{staging_->slots()} * ((staging_->slot_bytes() + 4095) / 4096 * 4096);
  }
  return s;
}

void Controller::ReleaseStaging(Session& session) {
  if (session.staging_object) {
    session.staging_object.reset();  // Unlinks it; an APPEND in flight keeps its mapping.
  } else if (session.has_staging) {
    KVCTL_CHECK(pool_->FreeStaging(session.staging.id).ok());
  }
  session.has_staging = false;
}

void Controller::FreeSessionLocked(Session& session) {
  for (auto& [id, entry] : session.sequences) {
    MutexLock seq_lock(&entry->mu);  // Waits for an append in flight.
    RetireSequence(*entry);
  }
  session.sequences.clear();
  ReleaseStaging(session);
  host_memory_.Release(session.host_bytes);
  session.host_bytes = 0;
}

uint64_t Controller::SequenceHostBytesAtOpen(const HostShape& shape) {
  return KvSequence::HostBytesAtOpen(shape) + shape.layers * shape.kv_heads * sizeof(PairTagCache) +
         64;  // + the vector's slack.
}

uint64_t Controller::SessionHostBytes() {
  return sizeof(Session) + 2 * ipc::kMaxNameBytes + 256;  // Names, map node, allocator slack.
}

Status Controller::CheckGeometryFits(const ipc::Geometry& g, const HostShape& shape) const {
  const uint64_t streams = shape.layers * shape.kv_heads;
  const uint64_t pages = pool_->Stats().pages_total;
  if (streams > pages) {
    return ResourceExhausted(
        "geometry: ", g.layers, " layers x ", g.kv_heads, " kv_heads = ", streams,
        " streams, each needing a pool page of its own, but the pool", " has ", pages, " pages of ",
        pool_->page_bytes(), " bytes; raise pool.bytes or lower pool.page_bytes");
  }
  const uint64_t open_bytes = SequenceHostBytesAtOpen(shape);
  if (open_bytes > host_memory_.limit()) {
    return ResourceExhausted("geometry: one empty sequence of ", g.layers, " layers x ", g.kv_heads,
                             " kv_heads needs ", open_bytes,
                             " bytes of host memory, more than limits.host_memory_bytes ",
                             host_memory_.limit());
  }
  return OkStatus();
}

StatusOr<std::shared_ptr<Controller::Session>> Controller::FindSessionLocked(uint64_t session_id,
                                                                             SteadyTime now) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return NotFound("session_id: ", session_id,
                    " is not an open session (never opened, closed, or its lease expired); "
                    "send HELLO again");
  }
  it->second->last_seen = now;
  return it->second;
}

StatusOr<std::shared_ptr<Controller::SequenceEntry>> Controller::FindSequence(uint64_t session_id,
                                                                              uint64_t sequence_id,
                                                                              SteadyTime now) {
  MutexLock lock(&mu_);
  KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, FindSessionLocked(session_id, now));
  auto it = session->sequences.find(sequence_id);
  if (it == session->sequences.end()) {
    return NotFound("sequence_id: ", sequence_id, " is not open in session ", session_id,
                    " (OPEN it first; sequences of other sessions are not visible)");
  }
  return it->second;
}

StatusOr<ipc::HelloReply> Controller::Hello(const ipc::HelloRequest& request, SteadyTime now) {
  KVCTL_RETURN_IF_ERROR(ipc::ValidateGeometry(request.geometry));
  const Config config = this->config();
  KVCTL_RETURN_IF_ERROR(CheckGeometryFits(request.geometry, HostShapeOf(config, request.geometry)));
  // Resolve once now (outside mu_: planning allocates per head) so a geometry the config cannot
  // serve fails at HELLO, not at OPEN.
  KVCTL_RETURN_IF_ERROR(PlanLayers(config, request.model_name, request.geometry).status());
  // cpu pool: the session's own staging object, made before the lock (it reserves memory).
  std::shared_ptr<StagingObject> staging_object;
  if (staging_->slots() > 0) {
    StatusOr<std::shared_ptr<StagingObject>> got = staging_->Acquire();
    if (got.ok()) staging_object = std::move(got).value();  // Else the client sends inline.
  }
  MutexLock lock(&mu_);
  if (sessions_.size() >= static_cast<size_t>(config_.limits.max_sessions)) {
    return ResourceExhausted(
        "HELLO: ", sessions_.size(), " sessions are open, limits.max_sessions ", "is ",
        config_.limits.max_sessions, "; end idle sessions (BYE) or raise the limit");
  }
  KVCTL_RETURN_IF_ERROR(host_memory_.Reserve("HELLO", SessionHostBytes()));
  auto session = std::make_shared<Session>();
  session->host_bytes = SessionHostBytes();
  // Session ids are random, so an id from before a restart never names a new session and one
  // client cannot guess another's (the id is the capability to its sequences).
  do {
    session->id = SecureRandomU64();
  } while (session->id == 0 || sessions_.count(session->id));
  session->number = next_session_number_++;
  session->client_name = request.client_name;
  session->model_name = request.model_name;
  session->geometry = request.geometry;
  session->last_seen = now;
  ipc::HelloReply reply;
  if (pool_->staging_slots() > 0) {
    StatusOr<ipc::StagingLayout> need =
        ipc::AppendStagingLayout(request.geometry, 1, request.geometry.q_heads > 0);
    StatusOr<StagingSlot> slot =
        pool_->AllocateStaging(need.ok() ? std::max<uint64_t>(need->total_bytes, 1) : 1);
    if (slot.ok()) {  // No free slot: the client sends tensors inline.
      session->has_staging = true;
      session->staging = *slot;
      reply.staging_offset = slot->offset;
      reply.staging_bytes = slot->bytes;
    }
  }
  if (staging_object) {
    session->has_staging = true;
    session->staging = StagingSlot{0, 0, staging_object->bytes()};
    reply.staging_shm_name = staging_object->name();
    reply.staging_offset = 0;
    reply.staging_bytes = staging_object->bytes();
    session->staging_object = std::move(staging_object);
  }
  sessions_[session->id] = session;
  reply.session_id = session->id;
  reply.lease_ms = static_cast<uint32_t>(config_.server.lease_ms);
  reply.server_version = kKvctlVersion;
  reply.pool_bytes = pool_->arena().bytes();
  reply.page_bytes = static_cast<uint32_t>(pool_->page_bytes());
  reply.shm_name = shm_name_;
  if (pool_->arena().cuda_device() >= 0) {
    reply.pool_location = ipc::PoolLocation::kCudaDevice;
    reply.cuda_device = static_cast<uint32_t>(pool_->arena().cuda_device());
    const std::string handle = pool_->arena().cuda_ipc_handle();
    KVCTL_CHECK(handle.size() == reply.cuda_ipc_handle.size());
    std::memcpy(reply.cuda_ipc_handle.data(), handle.data(), handle.size());
  }
  const QuantSettings q = EffectiveQuantSettings(config_, FindModel(config_, request.model_name));
  if (!q.lossless) {
    StatusOr<QuantSpec> spec =
        ResolveQuantSpec(config_, request.model_name, request.geometry.head_dim, 0, 0);
    StatusOr<StreamingRules> rules =
        ResolveStreamingRules(config_, request.model_name, request.geometry.head_dim);
    KVCTL_CHECK(spec.ok() && rules.ok());  // PlanLayers above resolved the same.
    reply.quant = ipc::QuantInfo{
        static_cast<uint8_t>(spec->method),        static_cast<uint8_t>(spec->k_bits),
        static_cast<uint8_t>(spec->v_bits),        static_cast<uint32_t>(spec->block_tokens),
        static_cast<uint32_t>(rules->sink_tokens), static_cast<uint32_t>(rules->flush_tokens)};
  } else {
    reply.quant = ipc::QuantInfo{static_cast<uint8_t>(QuantMethod::kFp16), 16, 16, 32, 0, 32};
  }
  return reply;
}

StatusOr<Controller::OpenTicket> Controller::ReserveOpen(uint64_t session_id, uint64_t sequence_id,
                                                         SteadyTime now) {
  MutexLock lock(&mu_);
  KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, FindSessionLocked(session_id, now));
  if (session->sequences.count(sequence_id)) {
    return AlreadyExists("sequence_id: ", sequence_id, " is already open in session ", session_id);
  }
  if (session->sequences.size() >= static_cast<size_t>(config_.limits.max_sequences_per_session)) {
    return ResourceExhausted("OPEN: session ", session_id, " has ", session->sequences.size(),
                             " open sequences, limits.max_sequences_per_session is ",
                             config_.limits.max_sequences_per_session);
  }
  OpenTicket ticket{.config = config_,
                    .geometry = session->geometry,
                    .model_name = session->model_name,
                    .shape = HostShapeOf(config_, session->geometry)};
  ticket.open_bytes = SequenceHostBytesAtOpen(ticket.shape);
  KVCTL_RETURN_IF_ERROR(host_memory_.Reserve("OPEN", ticket.open_bytes));
  return ticket;
}

StatusOr<Controller::OpenPlan> Controller::PlanOpen(const Config& config,
                                                    const std::string& model_name,
                                                    const ipc::Geometry& g) {
  OpenPlan plan;
  std::vector<int64_t> head_caps;
  JointPlanInput joint_input;
  KVCTL_ASSIGN_OR_RETURN(plan.plans, PlanLayers(config, model_name, g, &head_caps, &joint_input));
  const QuantSettings q = EffectiveQuantSettings(config, FindModel(config, model_name));
  const auto shape = ShapeOf(g, plan.plans[0].rules, plan.plans[0].lossless);
  KVCTL_ASSIGN_OR_RETURN(plan.eviction, ResolveEviction(config, shape, head_caps));
  AimEvictionAtMemory(config, plan.plans, static_cast<int>(g.head_dim), g.dtype, &plan.eviction);
  KVCTL_ASSIGN_OR_RETURN(plan.pressure, ResolvePressure(config, shape, &joint_input));
  plan.outlook = CompressionOutlookOf(config, shape, plan.plans, plan.eviction);
  plan.geometry = SequenceGeometry{.layers = static_cast<int>(g.layers),
                                   .kv_heads = static_cast<int>(g.kv_heads),
                                   .head_dim = static_cast<int>(g.head_dim),
                                   .dtype = g.dtype,
                                   .quality_sample_period = config.server.quality_sample_period,
                                   .q_heads = static_cast<int>(g.q_heads),
                                   .flush_spread_steps = q.flush_spread_steps,
                                   .flush_after_reply = q.flush_after_reply};
  return plan;
}

Status Controller::Open(const ipc::OpenRequest& request, SteadyTime now) {
  // Checks and the host-memory reservation under mu_; planning and building the sequence (the
  // allocations, which grow with the geometry) outside it, so a big OPEN never stalls others.
  KVCTL_ASSIGN_OR_RETURN(OpenTicket t, ReserveOpen(request.session_id, request.sequence_id, now));
  StatusOr<OpenPlan> plan = PlanOpen(t.config, t.model_name, t.geometry);
  if (!plan.ok()) {
    host_memory_.Release(t.open_bytes);
    return plan.status();
  }
  // Its host_bytes (open_bytes) are released by RetireSequence.
  auto entry = std::make_shared<SequenceEntry>(
      now,
      std::make_unique<KvSequence>(pool_.get(), plan->geometry, std::move(plan->plans),
                                   std::move(plan->eviction), std::move(plan->pressure)),
      t.shape, t.open_bytes, std::move(plan->outlook));
  return InsertSequence(request.session_id, request.sequence_id, now, std::move(entry));
}

Status Controller::InsertSequence(uint64_t session_id, uint64_t sequence_id, SteadyTime now,
                                  std::shared_ptr<SequenceEntry> entry) {
  MutexLock lock(&mu_);
  StatusOr<std::shared_ptr<Session>> session = FindSessionLocked(session_id, now);
  const std::string model_name = session.ok() ? (*session)->model_name : "";
  for (const CompressionWarning& w : entry->outlook.warnings) {
    if (compression_warnings_logged_.insert(w.message).second) {
      Log(LogSeverity::kWarning, "OPEN{}: this configuration cannot compress ({}): {}",
          model_name.empty() ? "" : " (model \"" + model_name + "\")", w.cause, w.message);
    }
  }
  // The session may have ended, or the same id been opened, while the sequence was built.
  Status inserted = session.status();
  if (inserted.ok() && (*session)->sequences.count(sequence_id)) {
    inserted =
        AlreadyExists("sequence_id: ", sequence_id, " is already open in session ", session_id);
  }
  if (!inserted.ok()) {
    MutexLock seq_lock(&entry->mu);
    RetireSequence(*entry);
    return inserted;
  }
  (*session)->sequences[sequence_id] = std::move(entry);
  return OkStatus();
}

StatusOr<ipc::CloseReply> Controller::Close(const ipc::CloseRequest& request, SteadyTime now) {
  std::shared_ptr<SequenceEntry> entry;
  {
    MutexLock lock(&mu_);
    KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                           FindSessionLocked(request.session_id, now));
    auto it = session->sequences.find(request.sequence_id);
    if (it == session->sequences.end()) {
      return NotFound("sequence_id: ", request.sequence_id, " is not open in session ",
                      request.session_id);
    }
    entry = it->second;
    session->sequences.erase(it);
  }
  MutexLock seq_lock(&entry->mu);
  ipc::CloseReply reply;
  if (entry->seq) reply.bytes_freed = entry->seq->Usage().pool_bytes;
  RetireSequence(*entry);
  return reply;
}

StatusOr<ipc::ByeReply> Controller::Bye(const ipc::ByeRequest& request, SteadyTime now) {
  std::shared_ptr<Session> session;
  {
    MutexLock lock(&mu_);
    KVCTL_ASSIGN_OR_RETURN(session, FindSessionLocked(request.session_id, now));
    // Out of the table first: from here no request can reach the session's sequences or start
    // using its staging slot, so what follows needs no global lock.
    sessions_.erase(request.session_id);
    ++sessions_ended_;
  }
  ipc::ByeReply reply;
  for (auto& [id, entry] : session->sequences) {
    MutexLock seq_lock(&entry->mu);                // Waits for an APPEND or FETCH in flight.
    if (!entry->seq && !entry->spilled) continue;  // Closed meanwhile by its own CLOSE.
    if (entry->seq) reply.bytes_freed += entry->seq->Usage().pool_bytes;
    ++reply.sequences_closed;
    RetireSequence(*entry);
  }
  session->sequences.clear();
  // The slot goes last: an APPEND from the slot that got its sequence before the erase above
  // has finished reading it once that sequence's lock was taken.
  ReleaseStaging(*session);
  host_memory_.Release(session->host_bytes);
  session->host_bytes = 0;
  return reply;
}

StatusOr<ipc::PingReply> Controller::Ping(const ipc::PingRequest& request, SteadyTime now) {
  if (request.session_id != 0) {
    MutexLock lock(&mu_);
    KVCTL_RETURN_IF_ERROR(FindSessionLocked(request.session_id, now).status());
  }
  return ipc::PingReply{static_cast<uint64_t>(Micros(now))};
}

StatusOr<ipc::ReplyBody> Controller::Fetch(const ipc::FetchRequest& request, SteadyTime now,
                                           bool* deferred, int64_t max_dense_rows) {
  // Dense decoding grows with the sequence: a worker's job past max_dense_rows.
  const bool dense = request.mode != ipc::FetchMode::kBlocks;
  if (deferred != nullptr && dense && max_dense_rows <= 0) {
    *deferred = true;
    return Unavailable("deferred to a worker");
  }
  ipc::Geometry g;
  size_t split_rows = 0;
  {
    MutexLock lock(&mu_);
    KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                           FindSessionLocked(request.session_id, now));
    g = session->geometry;
    split_rows = static_cast<size_t>(config_.server.dense_fetch_split_rows);
  }
  if (request.layer_begin >= request.layer_end || request.layer_end > g.layers) {
    return InvalidArgument("layers: got [", request.layer_begin, ", ", request.layer_end,
                           "), expected a non-empty range inside [0, ", g.layers, ")");
  }
  const uint64_t pairs = uint64_t{request.layer_end - request.layer_begin} * g.kv_heads;
  if (request.n_known != 0 && request.n_known != pairs) {
    return InvalidArgument("n_known: got ", request.n_known, ", expected 0 or the range's pairs (",
                           request.layer_end - request.layer_begin, " layers x ", g.kv_heads,
                           " heads = ", pairs, ")");
  }
  KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry,
                         FindSequence(request.session_id, request.sequence_id, now));
  if (deferred == nullptr) {
    entry->mu.Lock();
  } else if (!entry->mu.TryLock()) {
    *deferred = true;
    return Unavailable("deferred to a worker");
  }
  MutexLock seq_lock(&entry->mu, AdoptLock{});
  if (deferred != nullptr && entry->spilled) {  // Restoring is a worker's job.
    *deferred = true;
    return Unavailable("deferred to a worker");
  }
  KVCTL_RETURN_IF_ERROR(EnsureResident(*entry, request.sequence_id));
  if (!entry->seq) return NotFound("sequence_id: ", request.sequence_id, " was just closed");
  const int begin = static_cast<int>(request.layer_begin);
  const int end = static_cast<int>(request.layer_end);
  std::vector<uint32_t> dense_counts;
  size_t dense_rows = 0;
  if (dense) {
    dense_counts = entry->seq->DenseCounts(begin, end);
    for (uint32_t c : dense_counts) dense_rows += c;
    if (deferred != nullptr && dense_rows > static_cast<uint64_t>(max_dense_rows)) {
      *deferred = true;
      return Unavailable("deferred to a worker");
    }
  }
  entry->last_used = now;
  // Fail closed: nothing is read or referred to unless its pages still match their checksums.
  // On the I/O thread only when what is left to verify is small (pool.verify_on_fetch =
  // "unverified": the chunks written since the last FETCH, a decode step's worth).
  const bool was_lost = !entry->seq->integrity().ok();
  PageAllocator::VerifyBudget budget{.max_bytes = kInlineFetchVerifyBytes};
  if (Status verified = entry->seq->Verify(begin, end, deferred != nullptr ? &budget : nullptr);
      !verified.ok()) {
    if (!was_lost) {
      Log(LogSeverity::kError, "FETCH: sequence {} lost: {}", request.sequence_id,
          verified.message());
    }
    return verified;
  }
  if (budget.exceeded) {  // Nothing was verified; the worker runs it all again.
    *deferred = true;
    return Unavailable("deferred to a worker");
  }
  const KvSequence& seq = *entry->seq;
  if (request.mode == ipc::FetchMode::kDense) {
    return ipc::ReplyBody(BuildDenseReply(seq, g, begin, end, request.out_dtype,
                                          std::move(dense_counts), split_rows, fetch_helper_));
  }
  return ipc::ReplyBody(
      BuildBlocksReply(seq, g, begin, end, pool_->page_bytes(), pool_->pages_total(),
                       {request.known_records, request.known_tags}, &entry->blocks_tags));
}

int Controller::ExpireLeases(SteadyTime now) {
  MutexLock lock(&mu_);
  if (config_.server.lease_ms <= 0) return 0;
  const auto lease = std::chrono::milliseconds(config_.server.lease_ms);
  int expired = 0;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (now - it->second->last_seen > lease) {
      FreeSessionLocked(*it->second);
      it = sessions_.erase(it);
      ++expired;
      ++sessions_expired_;
    } else {
      ++it;
    }
  }
  return expired;
}

}  // namespace kvctl
