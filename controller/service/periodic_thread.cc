// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/periodic_thread.h"

#include <sys/resource.h>
#include <unistd.h>

namespace kvctl {

PeriodicThread::PeriodicThread(std::chrono::milliseconds interval, int nice,
                               std::function<void()> pass)
    : interval_(interval), nice_(nice), pass_(std::move(pass)) {
  thread_ = std::thread([this] { Loop(); });
}

PeriodicThread::~PeriodicThread() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.NotifyAll();
  thread_.join();
}

void PeriodicThread::Loop() {
  // Linux nice values are per thread: only this one changes priority.
  if (nice_ != 0) setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), nice_);
  while (WaitInterval()) pass_();
}

bool PeriodicThread::WaitInterval() {
  MutexLock lock(&mu_);
  const std::chrono::steady_clock::time_point deadline =
      std::chrono::steady_clock::now() + interval_;
  while (!stop_) {
    if (!wake_.WaitUntil(&mu_, deadline)) return !stop_;
  }
  return false;
}

}  // namespace kvctl
