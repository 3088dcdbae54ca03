// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The cluster tier's side of the controller (docs/tier.md): SAVE_PREFIX and OPEN_PREFIX, spilling
// idle sequences and restoring them on their next request, kept apart from controller.cc's
// request logic. Network waits never happen under mu_: a request waits on the tier only while it
// holds its own sequence's lock (or none), so resident sequences are never blocked by the tier.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "common/checked_math.h"
#include "controller/sequence/sequence_image.h"
#include "controller/service/controller.h"
#include "controller/service/controller_internal.h"
#include "controller/service/prefix_keys.h"

namespace kvctl {
namespace {

// A prompt's longest stored prefix is tried first; if its value fails its checks (expired
// between EXISTS and GET, written by an incompatible daemon), this many shorter ones after it.
constexpr int kPrefixAttempts = 3;

std::vector<int32_t> TokensOf(const zmq::message_t& frame) {
  std::vector<int32_t> ids(frame.size() / sizeof(int32_t));
  std::memcpy(ids.data(), frame.data(), ids.size() * sizeof(int32_t));  // Any alignment.
  return ids;
}

std::chrono::microseconds Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

PrefixNamespace NamespaceOf(const TierConfig& tier, const std::string& model_name,
                            const ipc::Geometry& g) {
  return {.key_prefix = tier.key_prefix,
          .model_name = model_name,
          .geometry = g,
          .block_tokens = tier.prefix_block_tokens};
}

}  // namespace

StatusOr<ipc::SavePrefixReply> Controller::SavePrefix(const ipc::SavePrefixRequest& request,
                                                      SteadyTime now) {
  ipc::Geometry g;
  std::string model_name;
  {
    MutexLock lock(&mu_);
    KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                           FindSessionLocked(request.session_id, now));
    g = session->geometry;
    model_name = session->model_name;
  }
  // The sequence is checked first, so a client learns about a wrong id before it learns there is
  // no tier.
  KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry,
                         FindSequence(request.session_id, request.sequence_id, now));
  if (!tier_) {
    return FailedPrecondition("SAVE_PREFIX: this daemon has no cluster tier (tier.nodes is \"\")");
  }
  const std::vector<int32_t> tokens = TokensOf(request.tokens);
  int64_t cut = 0;
  std::vector<uint8_t> image;
  {
    MutexLock seq_lock(&entry->mu);
    KVCTL_RETURN_IF_ERROR(EnsureResident(*entry, request.sequence_id));
    if (!entry->seq) return NotFound("sequence_id: ", request.sequence_id, " was just closed");
    entry->last_used = now;
    const KvSequence& seq = *entry->seq;
    KVCTL_RETURN_IF_ERROR(seq.integrity());
    if (seq.first_position() != 0 && seq.tokens() > 0) {
      return FailedPrecondition("SAVE_PREFIX: sequence_id ", request.sequence_id,
                                " starts at position ", seq.first_position(),
                                ", expected 0 (token ids name positions from 0)");
    }
    if (static_cast<int64_t>(tokens.size()) != seq.tokens()) {
      return InvalidArgument("tokens: got ", tokens.size(), " ids, expected ", seq.tokens(),
                             " (the tokens sequence_id ", request.sequence_id, " holds)");
    }
    if (const SequenceUsage usage = seq.Usage(); usage.evicted_tokens > 0) {
      return FailedPrecondition("SAVE_PREFIX: sequence_id ", request.sequence_id, " evicted ",
                                usage.evicted_tokens,
                                " tokens; only a sequence that kept every token can be a prefix");
    }
    cut = LargestExactCut(seq, seq.tokens(), tier_->config().prefix_block_tokens);
    if (cut == 0) return ipc::SavePrefixReply{0, 0};
    KVCTL_ASSIGN_OR_RETURN(image, ExportImage(seq, cut, model_name));
  }
  const std::span<const int32_t> kept(tokens.data(), static_cast<size_t>(cut));
  const std::vector<std::string> keys =
      PrefixKeys(NamespaceOf(tier_->config(), model_name, g), kept);
  const std::vector<uint8_t> value = EncodePrefixValue(kept, image);
  if (Status put = tier_->PutPrefix(keys.back(), value); !put.ok()) {
    return Status(put.code(), "SAVE_PREFIX: " + put.message());
  }
  return ipc::SavePrefixReply{static_cast<uint64_t>(cut), value.size()};
}

StatusOr<ipc::OpenPrefixReply> Controller::OpenPrefix(const ipc::OpenPrefixRequest& request,
                                                      SteadyTime now) {
  if (!tier_) {
    KVCTL_RETURN_IF_ERROR(Open(ipc::OpenRequest{request.session_id, request.sequence_id}, now));
    return ipc::OpenPrefixReply{0};
  }
  KVCTL_ASSIGN_OR_RETURN(OpenTicket t, ReserveOpen(request.session_id, request.sequence_id, now));
  StatusOr<OpenPlan> plan = PlanOpen(t.config, t.model_name, t.geometry);
  if (!plan.ok()) {
    host_memory_.Release(t.open_bytes);
    return plan.status();
  }
  const std::vector<int32_t> tokens = TokensOf(request.tokens);
  const std::vector<std::string> keys =
      PrefixKeys(NamespaceOf(tier_->config(), t.model_name, t.geometry), tokens);
  std::unique_ptr<KvSequence> seq;
  uint64_t host_bytes = t.open_bytes;
  bool failed = false;
  StatusOr<int> longest = tier_->LongestPresent(keys);
  if (!longest.ok()) {
    failed = true;
    spdlog::warn("OPEN_PREFIX: tier lookup failed, opening empty: {}", longest.status().message());
  }
  for (int i = longest.ok() ? *longest : -1, tries = 0; i >= 0 && tries < kPrefixAttempts;
       --i, ++tries) {
    const int64_t restored = int64_t{i + 1} * tier_->config().prefix_block_tokens;
    StatusOr<std::vector<uint8_t>> value = tier_->Get(keys[i]);
    StatusOr<PrefixValue> decoded =
        value.ok() ? DecodePrefixValue(*value) : StatusOr<PrefixValue>(value.status());
    Status checked = decoded.status();
    if (checked.ok() &&
        (static_cast<int64_t>(decoded->tokens.size()) != restored ||
         !std::equal(decoded->tokens.begin(), decoded->tokens.end(), tokens.begin()))) {
      checked = DataLoss("stored token ids differ from the prompt's first ", restored);
    }
    StatusOr<ImageInfo> info =
        checked.ok() ? ReadImageInfo(decoded->image) : StatusOr<ImageInfo>(checked);
    if (info.ok() && (info->tokens != restored || info->first_position != 0)) {
      info = DataLoss("image holds ", info->tokens, " tokens from ", info->first_position,
                      ", expected ", restored, " from 0");
    }
    uint64_t growth = 0;
    if (info.ok()) {
      StatusOr<uint64_t> bytes =
          CheckedMul("OPEN_PREFIX host memory", HostBytesPerKeptToken(t.shape), restored);
      Status reserved = bytes.ok() ? host_memory_.Reserve("OPEN_PREFIX", *bytes) : bytes.status();
      if (reserved.ok()) {
        growth = *bytes;
      } else {
        info = reserved;
      }
    }
    StatusOr<std::unique_ptr<KvSequence>> imported =
        info.ok() ? ImportImage(pool_.get(), decoded->image, plan->geometry, t.model_name,
                                plan->eviction, plan->pressure)
                  : StatusOr<std::unique_ptr<KvSequence>>(info.status());
    if (imported.ok()) {
      seq = std::move(imported).value();
      host_bytes += growth;
      break;
    }
    host_memory_.Release(growth);
    failed = true;
    spdlog::warn("OPEN_PREFIX: stored prefix of {} tokens not restored: {}", restored,
                 imported.status().message());
    if (imported.status().code() == StatusCode::kResourceExhausted) break;  // Shorter ones too.
  }
  tier_->CountLookup(seq != nullptr, failed, seq ? static_cast<uint64_t>(seq->tokens()) : 0);
  const uint64_t restored_tokens = seq ? static_cast<uint64_t>(seq->tokens()) : 0;
  if (!seq) {
    seq = std::make_unique<KvSequence>(pool_.get(), plan->geometry, std::move(plan->plans),
                                       std::move(plan->eviction), std::move(plan->pressure));
  }
  auto entry = std::make_shared<SequenceEntry>(now, std::move(seq), t.shape, t.open_bytes,
                                               std::move(plan->outlook));
  {
    MutexLock seq_lock(&entry->mu);
    entry->host_bytes = host_bytes;  // RetireSequence releases all of it.
  }
  KVCTL_RETURN_IF_ERROR(
      InsertSequence(request.session_id, request.sequence_id, now, std::move(entry)));
  return ipc::OpenPrefixReply{restored_tokens};
}

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
    spdlog::error("tier: {}", s.lost.message());
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
  StatusOr<std::vector<uint8_t>> image = ExportImage(seq, seq.tokens(), model_name);
  if (!image.ok()) {
    entry.spill_refused = true;  // Its settings cannot be exported; not tried again.
    tier_->CountSpillRefused();
    spdlog::info("tier: sequence {} stays in the pool: {}", sequence_id, image.status().message());
    return false;
  }
  const std::string key = tier_->NewSpillKey();
  if (Status put = tier_->PutSpill(key, *image); !put.ok()) {
    tier_->CountSpill(false, {});
    spdlog::warn("tier: sequence {} not spilled, it stays in the pool: {}", sequence_id,
                 put.message());
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
