// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/stats/stats.h
// Request counters and latency histograms per request type, for STATS (and later kvtop and
// /metrics). Latencies keep the most recent 4096 samples per type; p50/p99 are read from them,
// max and counts cover the daemon's whole life.
//
// Thread safety: internally synchronized.
#ifndef KVCTL_CONTROLLER_STATS_STATS_H_
#define KVCTL_CONTROLLER_STATS_STATS_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kvctl {

struct RequestTypeStats {
  std::string name;  // "append", "fetch", ...
  uint64_t requests_total = 0;
  uint64_t errors_total = 0;
  uint64_t latency_p50_us = 0, latency_p99_us = 0, latency_max_us = 0;
};

class ServerStats {
 public:
  static constexpr size_t kSamples = 4096;

  // `type` is the wire request type (1..7); others count under "other".
  void Record(uint16_t type, std::chrono::microseconds latency, bool error);
  std::vector<RequestTypeStats> Snapshot() const;

 private:
  struct PerType {
    uint64_t requests = 0, errors = 0, max_us = 0;
    std::vector<uint32_t> samples;  // Ring of the latest kSamples latencies.
    size_t next = 0;
  };
  static constexpr int kTypes = 9;  // 0 = other, 1..7 request types, 8 spare.

  mutable std::mutex mu_;
  std::array<PerType, kTypes> types_;  // Guarded by mu_.
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_STATS_STATS_H_
