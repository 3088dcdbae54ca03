// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/sequence/host_memory.h"

#include <algorithm>

#include "controller/sequence/kv_sequence_internal.h"

namespace kvctl {
namespace {

// Allocator overhead and the small vectors each structure owns (page lists of a few entries).
constexpr uint64_t kPerAllocationSlack = 64;
constexpr uint64_t kMinHostMemoryBytes = 64ull << 20;

}  // namespace

uint64_t KvSequence::HostBytesAtOpen(const HostShape& s) {
  const uint64_t streams = s.layers * s.kv_heads;
  // A HeadStream per stream; OPEN also builds a LayerPlan (one QuantSpec per head) and the budget
  // planner's per-head arrays, which the sequence then owns.
  const uint64_t per_stream =
      sizeof(HeadStream) + sizeof(QuantSpec) + 4 * sizeof(int64_t) + 2 * kPerAllocationSlack;
  // The kept query rows: the window, up to half as many dropped ones before CommitQueries moves
  // the kept ones down, and one append's (QueryRows): twice the window.
  const uint64_t per_layer = sizeof(LayerState) + 4 * kPerAllocationSlack +
                             2 * s.obs_window * s.q_heads * s.head_dim * sizeof(float);
  return sizeof(KvSequence) + 4 * kPerAllocationSlack + streams * per_stream + s.layers * per_layer;
}

uint64_t HostBytesPerKeptToken(const HostShape& s) {
  return s.layers * s.kv_heads * kHostBytesPerStreamToken;
}

uint64_t EffectiveHostMemoryBytes(const Config& config) {
  if (config.limits.host_memory_bytes > 0) return config.limits.host_memory_bytes;
  return std::max(kMinHostMemoryBytes, config.pool.bytes / 4);
}

Status HostMemoryBudget::Reserve(std::string_view what, uint64_t bytes) {
  uint64_t used = used_.load();
  for (;;) {
    const uint64_t limit = limit_.load();
    if (bytes > limit || used > limit - bytes) {
      return ResourceExhausted(what, ": needs ", bytes, " bytes of host memory, ", used,
                               " of limits.host_memory_bytes ", limit,
                               " are in use; close sequences or raise limits.host_memory_bytes");
    }
    if (used_.compare_exchange_weak(used, used + bytes)) return OkStatus();
  }
}

void HostMemoryBudget::Release(uint64_t bytes) { used_.fetch_sub(bytes); }

}  // namespace kvctl
