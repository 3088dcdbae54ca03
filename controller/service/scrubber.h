// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/scrubber.h
// The page-checksum scrubber: a background thread that calls Controller::Scrub every
// pool.scrub_interval_ms with a byte budget of pool.scrub_bytes_per_second x the interval, so a
// page changed outside the daemon is found even if no one FETCHes it (docs/reliability.md "Page
// checksums"). The thread runs at the lowest CPU priority (nice 19), and a pass skips sequences
// busy with a request, so serving requests always comes first.
//
// Thread safety: Start and the destructor from one thread (the daemon's).
//
//   std::unique_ptr<Scrubber> scrubber = Scrubber::Start(config.pool, controller.get());
//   ...
//   scrubber.reset();  // Stops and joins before the controller goes.
#ifndef KVCTL_CONTROLLER_SERVICE_SCRUBBER_H_
#define KVCTL_CONTROLLER_SERVICE_SCRUBBER_H_

#include <chrono>
#include <cstdint>
#include <memory>

#include "controller/config/config.h"
#include "controller/service/controller.h"
#include "controller/service/periodic_thread.h"

namespace kvctl {

class Scrubber {
 public:
  // Null when the scrubber is off (pool.checksums false, or an interval or rate of 0).
  // REQUIRES: controller outlives the Scrubber.
  static std::unique_ptr<Scrubber> Start(const PoolConfig& pool, Controller* controller);
  ~Scrubber() = default;  // Stops the thread (a pass in progress finishes first) and joins it.
  Scrubber(const Scrubber&) = delete;
  Scrubber& operator=(const Scrubber&) = delete;

  // Bytes one pass verifies at most: scrub_bytes_per_second x scrub_interval_ms / 1000.
  static uint64_t BytesPerPass(const PoolConfig& pool);

 private:
  Scrubber(Controller* controller, std::chrono::milliseconds interval, uint64_t bytes_per_pass);

  PeriodicThread thread_;
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_SCRUBBER_H_
