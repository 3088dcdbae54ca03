// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Prefix reuse (docs/tier.md "Prefixes" and "Shared prefix pages"): SAVE_PREFIX keeps a
// sequence's longest exact prefix in the local prefix cache (frozen in the pool) and in the
// cluster tier; OPEN_PREFIX opens a sequence from the longest stored prefix of its prompt: a
// cached one is shared copy-on-write (KvSequence::Fork), a longer one in the tier is restored,
// kept in the cache and shared the same way. An opener with eviction on gets a copy instead
// (eviction rewrites records in place). Network waits never happen under mu_.
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

// A prompt's longest stored prefix in the tier is tried first; if its value fails its checks
// (expired between EXISTS and GET, written by an incompatible daemon), this many shorter ones.
constexpr int kPrefixAttempts = 3;

std::vector<int32_t> TokensOf(const zmq::message_t& frame) {
  std::vector<int32_t> ids(frame.size() / sizeof(int32_t));
  std::memcpy(ids.data(), frame.data(), ids.size() * sizeof(int32_t));  // Any alignment.
  return ids;
}

PrefixNamespace NamespaceOf(const TierConfig& tier, const std::string& model_name,
                            const ipc::Geometry& g) {
  return {.key_prefix = tier.key_prefix,
          .model_name = model_name,
          .geometry = g,
          .block_tokens = tier.prefix_block_tokens};
}

}  // namespace

StatusOr<std::shared_ptr<KvSequence>> Controller::FreezePrefix(std::span<const uint8_t> image,
                                                               const SequenceGeometry& geometry,
                                                               const std::string& model_name,
                                                               const HostShape& shape) {
  KVCTL_ASSIGN_OR_RETURN(ImageInfo info, ReadImageInfo(image));
  KVCTL_ASSIGN_OR_RETURN(uint64_t per_token, CheckedMul("prefix host memory",
                                                        HostBytesPerKeptToken(shape), info.tokens));
  KVCTL_ASSIGN_OR_RETURN(
      uint64_t host_bytes,
      CheckedAdd("prefix host memory", KvSequence::HostBytesAtOpen(shape), per_token));
  KVCTL_RETURN_IF_ERROR(host_memory_.Reserve("prefix cache", host_bytes));
  SequenceGeometry frozen_geometry = geometry;
  frozen_geometry.quality_sample_period = 0;
  StatusOr<std::unique_ptr<KvSequence>> frozen =
      ImportImage(pool_.get(), image, frozen_geometry, model_name);
  if (!frozen.ok()) {
    host_memory_.Release(host_bytes);
    return frozen.status();
  }
  // The last reader (the cache, or a sequence forked from it) gives the memory back.
  const uint64_t pool_bytes = (*frozen)->Usage().pool_bytes;
  prefix_frozen_bytes_ += pool_bytes;
  HostMemoryBudget* budget = &host_memory_;
  std::atomic<uint64_t>* frozen_bytes = &prefix_frozen_bytes_;
  return std::shared_ptr<KvSequence>(
      frozen->release(), [budget, host_bytes, frozen_bytes, pool_bytes](KvSequence* seq) {
        delete seq;
        budget->Release(host_bytes);
        *frozen_bytes -= pool_bytes;
      });
}

std::shared_ptr<KvSequence> Controller::KeepLocalPrefix(
    const std::string& key, std::span<const int32_t> tokens, std::span<const uint8_t> image,
    const SequenceGeometry& geometry, const std::string& model_name, const HostShape& shape) {
  StatusOr<std::shared_ptr<KvSequence>> frozen = FreezePrefix(image, geometry, model_name, shape);
  if (!frozen.ok()) {
    Log(LogSeverity::kInfo, "prefix cache: a prefix of {} tokens is not kept: {}", tokens.size(),
        frozen.status().message());
    return nullptr;
  }
  if (!prefix_cache_->Insert(key, std::vector<int32_t>(tokens.begin(), tokens.end()), *frozen)) {
    return nullptr;
  }
  return std::move(frozen).value();
}

StatusOr<ipc::SavePrefixReply> Controller::SavePrefix(const ipc::SavePrefixRequest& request,
                                                      SteadyTime now) {
  ipc::Geometry g;
  std::string model_name;
  TierConfig tier_config;
  {
    MutexLock lock(&mu_);
    KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                           FindSessionLocked(request.session_id, now));
    g = session->geometry;
    model_name = session->model_name;
    tier_config = config_.tier;
  }
  // The sequence is checked first, so a client learns about a wrong id before it learns there is
  // nowhere to keep prefixes.
  KVCTL_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry,
                         FindSequence(request.session_id, request.sequence_id, now));
  if (!tier_ && !prefix_cache_) {
    return FailedPrecondition(
        "SAVE_PREFIX: this daemon keeps no prefixes (tier.nodes is \"\" and "
        "tier.local_prefix_fraction is 0)");
  }
  const std::vector<int32_t> tokens = TokensOf(request.tokens);
  int64_t cut = 0;
  std::vector<uint8_t> image;
  SequenceGeometry geometry;
  HostShape shape;
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
    if (seq.deferred_tokens() > 0) {
      return FailedPrecondition("SAVE_PREFIX: sequence_id ", request.sequence_id, " holds ",
                                seq.deferred_tokens(),
                                " tokens of a prefill sent with APPEND_CONTINUES that has not "
                                "ended; send its last APPEND (without the flag) first");
    }
    if (const SequenceUsage usage = seq.Usage(); usage.evicted_tokens > 0) {
      return FailedPrecondition("SAVE_PREFIX: sequence_id ", request.sequence_id, " evicted ",
                                usage.evicted_tokens,
                                " tokens; only a sequence that kept every token can be a prefix");
    }
    cut = LargestExactCut(seq, seq.tokens(), tier_config.prefix_block_tokens);
    if (cut == 0) return ipc::SavePrefixReply{0, 0};
    KVCTL_ASSIGN_OR_RETURN(image, ExportImage(seq, cut, model_name));
    geometry = seq.geometry();
    shape = entry->shape;
  }
  const std::span<const int32_t> kept(tokens.data(), static_cast<size_t>(cut));
  const std::vector<std::string> keys = PrefixKeys(NamespaceOf(tier_config, model_name, g), kept);
  // A prompt already held is not copied again (no second frozen copy while readers hold the
  // first, and the first saver's prefix stays what every reader reads).
  std::shared_ptr<KvSequence> frozen =
      prefix_cache_ ? prefix_cache_->Find(keys.back(), kept) : nullptr;
  if (prefix_cache_ && !frozen) {
    frozen = KeepLocalPrefix(keys.back(), kept, image, geometry, model_name, shape);
  }
  const bool kept_locally = frozen != nullptr;
  if (frozen) {
    // The saver then holds the prefix once with the sequences opened from it: its own copies go
    // back to the pool. The bytes are compared first, so whatever happened to the sequence since
    // the export, nothing it holds changes.
    MutexLock seq_lock(&entry->mu);
    if (entry->seq) {
      StatusOr<uint64_t> freed = entry->seq->ShareWith(std::move(frozen));
      if (!freed.ok()) {
        Log(LogSeverity::kInfo, "SAVE_PREFIX: sequence {} keeps its own copy of the prefix: {}",
            request.sequence_id, freed.status().message());
      }
    }
  }
  if (!tier_) {
    if (!kept_locally) {
      return ResourceExhausted("SAVE_PREFIX: the local prefix cache cannot hold a prefix of ", cut,
                               " tokens (", image.size(),
                               " bytes as an image; tier.local_prefix_fraction, pool and host "
                               "memory; see the daemon log)");
    }
    return ipc::SavePrefixReply{static_cast<uint64_t>(cut), image.size()};
  }
  const std::vector<uint8_t> value = EncodePrefixValue(kept, image);
  if (Status put = tier_->PutPrefix(keys.back(), value); !put.ok()) {
    // The engine learns that other daemons cannot restore it, even when this one kept it.
    return Status(
        put.code(),
        internal::StrCat("SAVE_PREFIX: ", put.message(),
                         kept_locally ? " (kept in this daemon's prefix cache only)" : ""));
  }
  return ipc::SavePrefixReply{static_cast<uint64_t>(cut), value.size()};
}

StatusOr<ipc::OpenPrefixReply> Controller::OpenPrefix(const ipc::OpenPrefixRequest& request,
                                                      SteadyTime now) {
  if (!tier_ && !prefix_cache_) {
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
      PrefixKeys(NamespaceOf(t.config.tier, t.model_name, t.geometry), tokens);
  // What the opened sequence holds beyond an empty one: its positions lists (host memory,
  // charged like an APPEND's), and pages for its tails (Fork) or for everything (a copy).
  uint64_t growth = 0;
  const auto open_from =
      [&](std::shared_ptr<const KvSequence> prefix) -> StatusOr<std::unique_ptr<KvSequence>> {
    KVCTL_ASSIGN_OR_RETURN(
        uint64_t bytes,
        CheckedMul("OPEN_PREFIX host memory", HostBytesPerKeptToken(t.shape), prefix->tokens()));
    KVCTL_RETURN_IF_ERROR(host_memory_.Reserve("OPEN_PREFIX", bytes));
    StatusOr<std::unique_ptr<KvSequence>> seq = [&]() -> StatusOr<std::unique_ptr<KvSequence>> {
      if (!plan->eviction.enabled) {
        return KvSequence::Fork(std::move(prefix), plan->geometry.quality_sample_period,
                                plan->pressure);
      }
      KVCTL_ASSIGN_OR_RETURN(std::vector<uint8_t> image,
                             ExportImage(*prefix, prefix->tokens(), t.model_name));
      return ImportImage(pool_.get(), image, plan->geometry, t.model_name, plan->eviction,
                         plan->pressure);
    }();
    if (seq.ok()) {
      growth = bytes;
    } else {
      host_memory_.Release(bytes);
    }
    return seq;
  };

  std::unique_ptr<KvSequence> seq;
  int found = -1;  // Index into keys of the prefix seq holds.
  if (prefix_cache_) {
    PrefixCache::Opened local = prefix_cache_->OpenLongest(keys, tokens, open_from);
    if (local.seq.ok() && *local.seq) {
      seq = std::move(local.seq).value();
      found = local.index;
    } else if (!local.seq.ok()) {
      Log(LogSeverity::kWarning, "OPEN_PREFIX: cached prefix of {} tokens not opened: {}",
          int64_t{local.index + 1} * t.config.tier.prefix_block_tokens,
          local.seq.status().message());
    }
  }
  // The tier is asked only for prefixes longer than the one found here.
  if (tier_ && found + 1 < static_cast<int>(keys.size())) {
    const std::vector<std::string> longer(keys.begin() + (found + 1), keys.end());
    bool failed = false;
    StatusOr<int> present = tier_->LongestPresent(longer);
    if (!present.ok()) {
      failed = true;
      Log(LogSeverity::kWarning, "OPEN_PREFIX: tier lookup failed: {}", present.status().message());
    }
    bool restored = false;
    for (int j = present.ok() ? *present : -1, tries = 0; j >= 0 && tries < kPrefixAttempts;
         --j, ++tries) {
      const int i = found + 1 + j;
      const int64_t length = int64_t{i + 1} * t.config.tier.prefix_block_tokens;
      StatusOr<std::vector<uint8_t>> value = tier_->Get(keys[i]);
      StatusOr<PrefixValue> decoded =
          value.ok() ? DecodePrefixValue(*value) : StatusOr<PrefixValue>(value.status());
      Status checked = decoded.status();
      if (checked.ok() &&
          (static_cast<int64_t>(decoded->tokens.size()) != length ||
           !std::equal(decoded->tokens.begin(), decoded->tokens.end(), tokens.begin()))) {
        checked = DataLoss("stored token ids differ from the prompt's first ", length);
      }
      StatusOr<ImageInfo> info =
          checked.ok() ? ReadImageInfo(decoded->image) : StatusOr<ImageInfo>(checked);
      if (info.ok() && (info->tokens != length || info->first_position != 0)) {
        info = DataLoss("image holds ", info->tokens, " tokens from ", info->first_position,
                        ", expected ", length, " from 0");
      }
      // Kept frozen in this daemon and forked, so its next opener here shares it; an opener
      // that evicts, or a daemon without a cache, imports it as its own.
      StatusOr<std::unique_ptr<KvSequence>> opened = info.status();
      const uint64_t growth_before = growth;
      if (info.ok() && prefix_cache_ && !plan->eviction.enabled) {
        StatusOr<std::shared_ptr<KvSequence>> frozen =
            FreezePrefix(decoded->image, plan->geometry, t.model_name, t.shape);
        opened = frozen.ok() ? open_from(*frozen)
                             : StatusOr<std::unique_ptr<KvSequence>>(frozen.status());
        if (opened.ok()) {
          prefix_cache_->Insert(keys[i], decoded->tokens, std::move(frozen).value());
        }
      } else if (info.ok()) {
        StatusOr<uint64_t> bytes =
            CheckedMul("OPEN_PREFIX host memory", HostBytesPerKeptToken(t.shape), length);
        Status reserved = bytes.ok() ? host_memory_.Reserve("OPEN_PREFIX", *bytes) : bytes.status();
        opened = reserved.ok() ? ImportImage(pool_.get(), decoded->image, plan->geometry,
                                             t.model_name, plan->eviction, plan->pressure)
                               : StatusOr<std::unique_ptr<KvSequence>>(reserved);
        if (opened.ok()) {
          growth = *bytes;
        } else if (reserved.ok()) {
          host_memory_.Release(*bytes);
        }
      }
      if (opened.ok()) {
        if (seq) host_memory_.Release(growth_before);  // The shorter local one goes.
        seq = std::move(opened).value();
        restored = true;
        break;
      }
      failed = true;
      Log(LogSeverity::kWarning, "OPEN_PREFIX: stored prefix of {} tokens not restored: {}", length,
          opened.status().message());
      if (opened.status().code() == StatusCode::kResourceExhausted) break;  // Shorter ones too.
    }
    tier_->CountLookup(restored, failed, restored ? static_cast<uint64_t>(seq->tokens()) : 0);
  }
  const uint64_t restored_tokens = seq ? static_cast<uint64_t>(seq->tokens()) : 0;
  if (!seq) {
    seq = std::make_unique<KvSequence>(pool_.get(), plan->geometry, std::move(plan->plans),
                                       std::move(plan->eviction), std::move(plan->pressure));
  }
  auto entry = std::make_shared<SequenceEntry>(now, std::move(seq), t.shape, t.open_bytes,
                                               std::move(plan->outlook));
  {
    MutexLock seq_lock(&entry->mu);
    entry->host_bytes = t.open_bytes + growth;  // RetireSequence releases all of it.
  }
  KVCTL_RETURN_IF_ERROR(
      InsertSequence(request.session_id, request.sequence_id, now, std::move(entry)));
  return ipc::OpenPrefixReply{restored_tokens};
}

}  // namespace kvctl
