// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/reply_buffers.h
// Reply frames (ZeroMQ zero-copy messages) over reused buffers. A dense FETCH reply of a few MB
// in a fresh malloc is mmapped, or trimmed back to the kernel when freed, so each request paid
// for faulting its pages in again (docs/kvbench_ipc.md, "fetch dense"). Here a frame's buffer
// goes back to an idle list when ZeroMQ releases the message (after it was sent), and the next
// frame of about that size takes it, its pages still mapped. Idle buffers are capped
// (max_idle_bytes, the daemon's worst case of extra memory): a buffer that would exceed the cap
// is freed instead. Frames under min_frame_bytes are plain messages (small mallocs come from the
// allocator's arenas, already mapped).
//
// Thread safety: Frame may be called from any thread; frames may be released on any thread
// (ZeroMQ's I/O thread) and may outlive the pool object (its state is shared with them).
//
//   zmq::message_t k = ReplyBufferPool::Default().Frame(rows * row_bytes);  // Uninitialized.
#ifndef KVCTL_CONTROLLER_SERVICE_REPLY_BUFFERS_H_
#define KVCTL_CONTROLLER_SERVICE_REPLY_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <zmq.hpp>

namespace kvctl {

class ReplyBufferPool {
 public:
  ReplyBufferPool(size_t max_idle_bytes, size_t min_frame_bytes);
  ~ReplyBufferPool();
  ReplyBufferPool(const ReplyBufferPool&) = delete;
  ReplyBufferPool& operator=(const ReplyBufferPool&) = delete;

  // The daemon's pool (the Controller's replies): 64 MiB idle at most, frames from 64 KiB on.
  static ReplyBufferPool& Default();

  // A frame of exactly `bytes` bytes, contents undefined, data() aligned to 64 bytes when it comes
  // from the pool.
  zmq::message_t Frame(size_t bytes);

  struct Counters {
    uint64_t allocated = 0;  // Pooled frames that needed a new buffer.
    uint64_t reused = 0;     // Pooled frames served from an idle buffer.
    size_t idle_bytes = 0;   // Capacity of the idle buffers now.
  };
  Counters counters() const;

 private:
  struct State;
  struct Lease;  // A pooled frame's free-callback hint.
  std::shared_ptr<State> state_;
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_REPLY_BUFFERS_H_
