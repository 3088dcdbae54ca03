// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/sequence/host_memory.h
// What sessions and sequences cost in host memory outside the pool, estimated from the geometry
// BEFORE anything is allocated, and the budget those estimates are charged against
// (limits.host_memory_bytes). The estimates are upper-side approximations built from the sizes
// of the real structures (kv_sequence_internal.h), so they follow the code when it changes;
// tests/controller/hostile_test.cc checks them against what an OPEN really allocates.
//
// Thread safety: HostMemoryBudget is internally synchronized; the estimates are pure.
//
//   KVCTL_RETURN_IF_ERROR(budget.Reserve("OPEN", KvSequence::HostBytesAtOpen(shape)));
#ifndef KVCTL_CONTROLLER_SEQUENCE_HOST_MEMORY_H_
#define KVCTL_CONTROLLER_SEQUENCE_HOST_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "controller/config/config.h"

namespace kvctl {

struct HostShape {
  uint64_t layers = 0, kv_heads = 0, q_heads = 0, head_dim = 0;
  uint64_t obs_window = 0;  // Query rows a layer's scorer keeps (0 without query scoring).
};

// An empty sequence costs KvSequence::HostBytesAtOpen(shape) (kv_sequence.h; defined in
// host_memory.cc beside these, since it sizes KvSequence's private structures).
inline constexpr uint64_t kHostBytesPerStreamToken =
    2 * (sizeof(int64_t) + sizeof(double) + sizeof(uint32_t));
// Each token kept by every (layer, KV head) stream: its position (int64), scorer state (the
// H2O accumulator, a double; or R-KV's partner and key hash, two 32-bit words) and at most one
// slot id (uint32: a row, or a record's share), counted at twice their size for vector growth.
uint64_t HostBytesPerKeptToken(const HostShape& shape);

// limits.host_memory_bytes, or its default from the pool size when 0.
uint64_t EffectiveHostMemoryBytes(const Config& config);

class HostMemoryBudget {
 public:
  explicit HostMemoryBudget(uint64_t limit) : limit_(limit) {}

  // Adds `bytes` to the used total, or RESOURCE_EXHAUSTED (naming `what`, the request, the bytes
  // asked, what is in use and limits.host_memory_bytes) without changing it.
  Status Reserve(std::string_view what, uint64_t bytes);
  void Release(uint64_t bytes);
  void set_limit(uint64_t limit) { limit_.store(limit); }
  uint64_t limit() const { return limit_.load(); }
  uint64_t used() const { return used_.load(); }

 private:
  std::atomic<uint64_t> limit_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SEQUENCE_HOST_MEMORY_H_
