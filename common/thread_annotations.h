// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/thread_annotations.h
// Clang's thread-safety analysis for kvctl: the capability macros, and Mutex / MutexLock / CondVar,
// thin wrappers over std::mutex and std::condition_variable that carry the annotations libstdc++'s
// types lack. Every member a mutex protects is declared with KVCTL_GUARDED_BY(mu_), every function
// that expects a lock held with KVCTL_REQUIRES(mu_), and tools/thread_safety.sh compiles every
// library and the daemon with clang -Wthread-safety -Werror, so an access without the lock, or a
// lock not released on some path, fails the build. Under other compilers the macros are empty and
// the wrappers cost nothing over the std types.
//
// Thread safety: Mutex and CondVar are what other classes use to be thread safe; MutexLock is a
// scope, owned by one thread.
//
//   class Counter {
//    public:
//     void Add(int n) KVCTL_EXCLUDES(mu_) {
//       MutexLock lock(&mu_);
//       total_ += n;
//     }
//     bool TryAdd(int n) KVCTL_EXCLUDES(mu_) {  // Skips when another thread holds it.
//       if (!mu_.TryLock()) return false;
//       MutexLock lock(&mu_, AdoptLock{});
//       total_ += n;
//       return true;
//     }
//    private:
//     Mutex mu_;
//     int total_ KVCTL_GUARDED_BY(mu_) = 0;
//   };
#ifndef KVCTL_COMMON_THREAD_ANNOTATIONS_H_
#define KVCTL_COMMON_THREAD_ANNOTATIONS_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define KVCTL_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVCTL_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (Mutex), and a type whose objects hold one for their scope (MutexLock).
#define KVCTL_CAPABILITY(x) KVCTL_THREAD_ANNOTATION(capability(x))
#define KVCTL_SCOPED_CAPABILITY KVCTL_THREAD_ANNOTATION(scoped_lockable)
// A member read or written only with the lock held.
#define KVCTL_GUARDED_BY(x) KVCTL_THREAD_ANNOTATION(guarded_by(x))
// Functions that take, release or try to take a lock (true: the return value that means taken).
#define KVCTL_ACQUIRE(...) KVCTL_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define KVCTL_RELEASE(...) KVCTL_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define KVCTL_TRY_ACQUIRE(...) KVCTL_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// Functions called with the lock held, or without it (they take it themselves).
#define KVCTL_REQUIRES(...) KVCTL_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define KVCTL_EXCLUDES(...) KVCTL_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

namespace kvctl {

// std::mutex with the annotations. Not recursive.
class KVCTL_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() KVCTL_ACQUIRE() { mu_.lock(); }
  void Unlock() KVCTL_RELEASE() { mu_.unlock(); }
  // Takes the lock if it is free; true when taken.
  bool TryLock() KVCTL_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// MutexLock's tag for a mutex the caller already holds (a TryLock that returned true).
struct AdoptLock {};

// Holds `mu` from construction to the end of the scope, except between an Unlock and the next
// Lock (a scope that lets the mutex go while it waits for another one).
class KVCTL_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) KVCTL_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  // Takes over `mu`, held by the caller, and releases it at the end of the scope.
  MutexLock(Mutex* mu, AdoptLock) KVCTL_REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() KVCTL_RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() KVCTL_RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() KVCTL_ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// std::condition_variable over a Mutex the caller holds. A wait releases the mutex while it
// sleeps and holds it again when it returns; wake-ups may be spurious, so callers re-check what
// they wait for.
class CondVar {
 public:
  void NotifyAll() { cv_.notify_all(); }

  // Until notified (or a spurious wake-up).
  void Wait(Mutex* mu) KVCTL_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // Still held: the caller's.
  }

  // Until notified (or a spurious wake-up) or `deadline`; false once the deadline has passed.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) KVCTL_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const std::cv_status status = cv_.wait_until(lock, deadline);
    lock.release();  // Still held: the caller's.
    return status == std::cv_status::no_timeout;
  }

 private:
  std::condition_variable cv_;
};

}  // namespace kvctl

#endif  // KVCTL_COMMON_THREAD_ANNOTATIONS_H_
