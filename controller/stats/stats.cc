// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/stats/stats.h"

#include <algorithm>

namespace kvctl {
namespace {

const char* const kTypeNames[] = {"other",  "hello", "open",  "close", "ping",
                                  "append", "fetch", "stats", "other"};

uint64_t Percentile(std::vector<uint32_t> v, double p) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

}  // namespace

void ServerStats::Record(uint16_t type, std::chrono::microseconds latency, bool error) {
  const int t = type >= 1 && type <= 7 ? type : 0;
  const uint64_t us = static_cast<uint64_t>(std::max<int64_t>(0, latency.count()));
  std::lock_guard<std::mutex> lock(mu_);
  PerType& s = types_[t];
  ++s.requests;
  if (error) ++s.errors;
  s.max_us = std::max(s.max_us, us);
  const uint32_t sample = static_cast<uint32_t>(std::min<uint64_t>(us, UINT32_MAX));
  if (s.samples.size() < kSamples) {
    s.samples.push_back(sample);
  } else {
    s.samples[s.next] = sample;
  }
  s.next = (s.next + 1) % kSamples;
}

std::vector<RequestTypeStats> ServerStats::Snapshot() const {
  std::vector<RequestTypeStats> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (int t = 1; t < 8; ++t) {  // Request types; malformed requests never reach us.
    const PerType& s = types_[t];
    RequestTypeStats r;
    r.name = kTypeNames[t];
    r.requests_total = s.requests;
    r.errors_total = s.errors;
    r.latency_p50_us = Percentile(s.samples, 0.50);
    r.latency_p99_us = Percentile(s.samples, 0.99);
    r.latency_max_us = s.max_us;
    out.push_back(r);
  }
  return out;
}

}  // namespace kvctl
