// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// ReplyBufferPool: a released frame's buffer serves the next frame of about its size, the idle
// cap frees what exceeds it, small frames bypass the pool, and frames may outlive the pool.
#include "controller/service/reply_buffers.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

namespace kvctl {
namespace {

TEST_CASE("ReplyBufferPool: a released buffer is reused for the next frame of about its size",
          "[controller]") {
  ReplyBufferPool pool(/*max_idle_bytes=*/8 << 20, /*min_frame_bytes=*/64 << 10);
  void* first_data = nullptr;
  {
    zmq::message_t a = pool.Frame(3 << 20);
    REQUIRE(a.size() == size_t{3} << 20);
    first_data = a.data();
    CHECK(reinterpret_cast<uintptr_t>(first_data) % 64 == 0);
    std::memset(a.data(), 1, a.size());  // Writable over its whole size.
    CHECK(pool.counters().allocated == 1);
    CHECK(pool.counters().idle_bytes == 0);
  }
  CHECK(pool.counters().idle_bytes >= size_t{3} << 20);
  {
    // A little larger (the sequence grew): the same buffer, its capacity has the slack.
    zmq::message_t b = pool.Frame((3 << 20) + 4096);
    CHECK(b.data() == first_data);
    CHECK(pool.counters().reused == 1);
    CHECK(pool.counters().idle_bytes == 0);
    // A second frame while the first is in flight needs a buffer of its own.
    zmq::message_t c = pool.Frame(3 << 20);
    CHECK(c.data() != b.data());
    CHECK(pool.counters().allocated == 2);
  }
  // Far smaller than the idle buffers: not served by them (they stay for the big replies).
  zmq::message_t small = pool.Frame(256 << 10);
  CHECK(pool.counters().allocated == 3);
  CHECK(pool.counters().reused == 1);
}

TEST_CASE("ReplyBufferPool: idle buffers stay under the cap, small frames bypass the pool",
          "[controller]") {
  ReplyBufferPool pool(/*max_idle_bytes=*/5 << 20, /*min_frame_bytes=*/64 << 10);
  {
    std::vector<zmq::message_t> frames;
    for (int i = 0; i < 4; ++i) frames.push_back(pool.Frame(2 << 20));
  }
  // Four buffers of 2 MiB + 1/8 slack released; two fit under 5 MiB, the others were freed.
  CHECK(pool.counters().idle_bytes == 2 * ((size_t{2} << 20) + (size_t{2} << 20) / 8));
  {
    zmq::message_t tiny = pool.Frame(1000);
    CHECK(tiny.size() == 1000);
    zmq::message_t empty = pool.Frame(0);
    CHECK(empty.size() == 0);
  }
  CHECK(pool.counters().allocated == 4);
  CHECK(pool.counters().reused == 0);
}

TEST_CASE("ReplyBufferPool: frames may outlive the pool", "[controller]") {
  zmq::message_t frame;
  {
    ReplyBufferPool pool(8 << 20, 64 << 10);
    frame = pool.Frame(1 << 20);
  }
  std::memset(frame.data(), 7, frame.size());  // Still owned by the frame (ASan would object).
  CHECK(static_cast<const uint8_t*>(frame.data())[frame.size() - 1] == 7);
}

}  // namespace
}  // namespace kvctl
