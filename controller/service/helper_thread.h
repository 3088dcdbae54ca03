// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/helper_thread.h
// A second pair of hands for one request at a time: RunShared runs parts 0..n-1 of a job, each
// exactly once, on the calling thread and a helper thread together, and returns when all are done.
// The controller decodes a large dense FETCH this way (server.dense_fetch_split_rows): the engine
// waits for that reply, so a second core shortens what it waits.
//
// Both threads take the next part from one counter, so the work balances itself, and a caller
// never waits for more than the one part the helper is inside (but it must wait for that one:
// a helper stalled mid-part stalls the caller, which is why the split is off by default,
// docs/kvbench_ipc.md): when the helper is busy with
// another caller's job, starts late or is preempted, the caller takes the parts it has not taken.
// Callers cannot deadlock on each other (the helper serves one job at a time; the others run
// alone).
//
// Thread safety: RunShared from any number of threads at once; construct and destroy from one.
//
//   HelperThread helper;
//   helper.RunShared(chunks, [&](size_t c) { DecodeChunk(c); });
#ifndef KVCTL_CONTROLLER_SERVICE_HELPER_THREAD_H_
#define KVCTL_CONTROLLER_SERVICE_HELPER_THREAD_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>

#include "common/thread_annotations.h"

namespace kvctl {

class HelperThread {
 public:
  HelperThread();   // No thread yet: the first RunShared of two or more parts starts it.
  ~HelperThread();  // Waits for a part in progress.
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  void RunShared(size_t parts, const std::function<void(size_t part)>& run) KVCTL_EXCLUDES(mu_);

  // Parts the helper ran, and jobs its callers ran alone (the helper busy with another job).
  struct Counters {
    uint64_t helper_parts = 0;
    uint64_t jobs_alone = 0;
  };
  Counters counters() const KVCTL_EXCLUDES(mu_);

 private:
  // One RunShared call the helper may join; lives on the caller's stack.
  struct Job {
    size_t parts = 0;
    const std::function<void(size_t)>* run = nullptr;
    std::atomic<size_t> next{0};  // The next part to take.
  };
  enum class State { kIdle, kPending, kRunning, kDone };
  // Takes and runs parts of `job` until none is left; how many it ran.
  static uint64_t Drain(Job& job);
  void Loop() KVCTL_EXCLUDES(mu_);

  mutable Mutex mu_;
  CondVar work_;  // The helper waits here for kPending or stop_.
  CondVar done_;  // A caller waits here for kDone.
  State state_ KVCTL_GUARDED_BY(mu_) = State::kIdle;
  Job* job_ KVCTL_GUARDED_BY(mu_) = nullptr;
  bool stop_ KVCTL_GUARDED_BY(mu_) = false;
  Counters counters_ KVCTL_GUARDED_BY(mu_);
  std::thread thread_ KVCTL_GUARDED_BY(mu_);  // Started by the first RunShared of 2+ parts.
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_HELPER_THREAD_H_
