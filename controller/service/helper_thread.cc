// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/helper_thread.h"

#include <utility>

namespace kvctl {

HelperThread::HelperThread() = default;

HelperThread::~HelperThread() {
  std::thread thread;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    thread = std::move(thread_);
  }
  work_.NotifyAll();
  if (thread.joinable()) thread.join();
}

uint64_t HelperThread::Drain(Job& job) {
  uint64_t ran = 0;
  for (size_t part = job.next.fetch_add(1); part < job.parts; part = job.next.fetch_add(1)) {
    (*job.run)(part);
    ++ran;
  }
  return ran;
}

void HelperThread::RunShared(size_t parts, const std::function<void(size_t part)>& run) {
  Job job;
  job.parts = parts;
  job.run = &run;
  bool shared = false;
  if (parts > 1) {
    MutexLock lock(&mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });  // On first use.
    if (state_ == State::kIdle) {
      state_ = State::kPending;
      job_ = &job;
      shared = true;
    } else {
      ++counters_.jobs_alone;
    }
  }
  if (shared) work_.NotifyAll();
  Drain(job);
  if (!shared) return;
  // Every part is taken; the helper may still be inside one, and must be out of `job` (on this
  // stack) before it goes.
  MutexLock lock(&mu_);
  if (state_ == State::kPending) {  // Never started: nothing of `job` is in its hands.
    state_ = State::kIdle;
    job_ = nullptr;
    return;
  }
  while (state_ != State::kDone) done_.Wait(&mu_);
  state_ = State::kIdle;
  job_ = nullptr;
}

HelperThread::Counters HelperThread::counters() const {
  MutexLock lock(&mu_);
  return counters_;
}

void HelperThread::Loop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && state_ != State::kPending) work_.Wait(&mu_);
    if (stop_) return;
    state_ = State::kRunning;
    Job* job = job_;
    lock.Unlock();
    const uint64_t ran = Drain(*job);
    lock.Lock();
    counters_.helper_parts += ran;
    state_ = State::kDone;
    done_.NotifyAll();
  }
}

}  // namespace kvctl
