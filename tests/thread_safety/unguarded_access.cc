// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/thread_safety/unguarded_access.cc
// Must NOT compile under tools/thread_safety.sh's flags: each function marked "Breaks:" breaks
// one rule of common/thread_annotations.h. The script compiles this file first and fails unless
// clang reports one thread-safety error per mark, so a build whose flags lost -Wthread-safety (or
// -Werror) cannot pass silently. Not part of any CMake target.
#include "common/thread_annotations.h"

namespace kvctl {

class Account {
 public:
  // Breaks: reads a guarded member without the lock.
  int UnguardedRead() const { return balance_; }
  // Breaks: writes one without the lock.
  void UnguardedWrite(int v) { balance_ = v; }
  // Breaks: calls a function that requires the lock without it.
  void MissingRequires() { AddLocked(1); }
  // Breaks: returns with the lock still held.
  void LeakedLock() { mu_.Lock(); }
  // Breaks: calls a function that takes the lock itself while holding it (a self-deadlock).
  void DoubleLock() KVCTL_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    Deposit(1);
  }
  void Deposit(int v) KVCTL_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    balance_ += v;
  }

 private:
  void AddLocked(int v) KVCTL_REQUIRES(mu_) { balance_ += v; }

  mutable Mutex mu_;
  int balance_ KVCTL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvctl
