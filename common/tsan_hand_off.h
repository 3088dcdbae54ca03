// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/tsan_hand_off.h
// Marks a buffer's hand-over through ZeroMQ for ThreadSanitizer. libzmq is not built with TSan,
// so the happens-before edge of a message passed to ZeroMQ's own I/O thread (which later calls
// the message's free callback) is invisible to it: a reply buffer written by one worker, freed by
// ZeroMQ into a pool and reused by another worker then looks like a race between the two workers
// (tests/fuzz/tsan_suppressions.txt drops only reports with libzmq on a stack). The sender calls
// TsanHandOff on each frame it gives ZeroMQ, the free callback TsanTakeBack on the buffer, and TSan
// sees the edge ZeroMQ really provides. Outside TSan builds both are empty.
//
// Thread safety: both are safe from any thread.
//
//   for (const zmq::message_t& f : frames) TsanHandOff(f.data());   // before zmq_msg_send
//   TsanTakeBack(buffer);                                              // in the free callback
#ifndef KVCTL_COMMON_TSAN_HAND_OFF_H_
#define KVCTL_COMMON_TSAN_HAND_OFF_H_

#if defined(__SANITIZE_THREAD__)
#define KVCTL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVCTL_TSAN 1
#endif
#endif

#ifdef KVCTL_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace kvctl {

inline void TsanHandOff(const void* buffer) {
#ifdef KVCTL_TSAN
  if (buffer != nullptr) __tsan_release(const_cast<void*>(buffer));
#else
  (void)buffer;
#endif
}

inline void TsanTakeBack(const void* buffer) {
#ifdef KVCTL_TSAN
  if (buffer != nullptr) __tsan_acquire(const_cast<void*>(buffer));
#else
  (void)buffer;
#endif
}

}  // namespace kvctl

#endif  // KVCTL_COMMON_TSAN_HAND_OFF_H_
