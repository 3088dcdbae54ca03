// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/reply_buffers.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <new>

#include "common/thread_annotations.h"
#include "common/tsan_hand_off.h"

namespace kvctl {
namespace {

constexpr size_t kAlign = 64;

// Capacity of a new buffer: an eighth more than asked, whole pages, so a sequence that grows by
// some tokens between FETCHes keeps fitting the buffer its last reply used.
size_t CapacityFor(size_t bytes) {
  constexpr size_t kPage = 4096;
  return (bytes + bytes / 8 + kPage - 1) / kPage * kPage;
}

}  // namespace

struct ReplyBufferPool::State {
  State(size_t max_idle, size_t min_frame) : max_idle_bytes(max_idle), min_frame_bytes(min_frame) {}
  ~State() {
    for (const auto& [capacity, data] : idle) std::free(data);
  }

  const size_t max_idle_bytes;
  const size_t min_frame_bytes;
  mutable Mutex mu;
  std::multimap<size_t, void*> idle KVCTL_GUARDED_BY(mu);  // Capacity -> buffer.
  Counters counters KVCTL_GUARDED_BY(mu);
};

// What a pooled frame's free callback needs: the pool's state (kept alive by the frame) and the
// buffer's capacity.
struct ReplyBufferPool::Lease {
  std::shared_ptr<State> state;
  size_t capacity = 0;
};

ReplyBufferPool::ReplyBufferPool(size_t max_idle_bytes, size_t min_frame_bytes)
    : state_(std::make_shared<State>(max_idle_bytes, min_frame_bytes)) {}

ReplyBufferPool::~ReplyBufferPool() = default;

ReplyBufferPool& ReplyBufferPool::Default() {
  // Never destroyed: frames of the last replies may still be in ZeroMQ's queues at exit.
  static ReplyBufferPool* pool = new ReplyBufferPool(size_t{64} << 20, size_t{64} << 10);
  return *pool;
}

zmq::message_t ReplyBufferPool::Frame(size_t bytes) {
  State& s = *state_;
  if (bytes < s.min_frame_bytes) return zmq::message_t(bytes);
  void* data = nullptr;
  size_t capacity = 0;
  {
    MutexLock lock(&s.mu);
    // The smallest idle buffer that fits, unless it is more than twice the size: a big buffer
    // stays for the big replies it was made for.
    auto it = s.idle.lower_bound(bytes);
    if (it != s.idle.end() && it->first <= 2 * bytes) {
      capacity = it->first;
      data = it->second;
      s.idle.erase(it);
      s.counters.idle_bytes -= capacity;
      ++s.counters.reused;
    } else {
      ++s.counters.allocated;
    }
  }
  if (data == nullptr) {
    capacity = CapacityFor(bytes);
    data = std::aligned_alloc(kAlign, capacity);
    if (data == nullptr) throw std::bad_alloc();
  }
  auto* lease = new Lease{state_, capacity};
  auto release = [](void* buffer, void* hint) {
    TsanTakeBack(buffer);  // ZeroMQ's I/O thread, after the sender's TsanHandOff.
    std::unique_ptr<Lease> l(static_cast<Lease*>(hint));
    State& st = *l->state;
    {
      MutexLock lock(&st.mu);
      if (st.counters.idle_bytes + l->capacity <= st.max_idle_bytes) {
        st.idle.emplace(l->capacity, buffer);
        st.counters.idle_bytes += l->capacity;
        return;
      }
    }
    std::free(buffer);
  };
  return zmq::message_t(data, bytes, release, lease);
}

ReplyBufferPool::Counters ReplyBufferPool::counters() const {
  MutexLock lock(&state_->mu);
  return state_->counters;
}

}  // namespace kvctl
