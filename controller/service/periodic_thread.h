// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/periodic_thread.h
// A background thread that runs one pass every interval until it is destroyed: the page scrubber
// (scrubber.h) and the tier's spill pass (Controller::TierPass) run on these. A pass in progress
// finishes before the destructor returns; stopping never waits out a whole interval.
//
// Thread safety: construct and destroy from one thread; `pass` runs on the thread alone.
//
//   PeriodicThread t(std::chrono::milliseconds(100), /*nice=*/19, [&] { DoOnePass(); });
#ifndef KVCTL_CONTROLLER_SERVICE_PERIODIC_THREAD_H_
#define KVCTL_CONTROLLER_SERVICE_PERIODIC_THREAD_H_

#include <chrono>
#include <functional>
#include <thread>

#include "common/thread_annotations.h"

namespace kvctl {

class PeriodicThread {
 public:
  // nice: the thread's own Linux nice value (19 = only when nothing else wants the CPU).
  PeriodicThread(std::chrono::milliseconds interval, int nice, std::function<void()> pass);
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  void Loop() KVCTL_EXCLUDES(mu_);
  // Sleeps one interval; false when told to stop meanwhile.
  bool WaitInterval() KVCTL_EXCLUDES(mu_);

  const std::chrono::milliseconds interval_;
  const int nice_;
  const std::function<void()> pass_;
  Mutex mu_;
  CondVar wake_;
  bool stop_ KVCTL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_PERIODIC_THREAD_H_
