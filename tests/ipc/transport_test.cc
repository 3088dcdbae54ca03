// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// WaitForInput (ipc/transport.h): the wait ZmqServer, Client and kvbench's raw baseline share,
// checked against real ZeroMQ sockets; and what the blocks reply's encoder and decoder do to stay
// cheap: the reserved body size is exact, and a nested field still names itself in errors.
#include "ipc/transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>

#include "ipc/protocol.h"
#include "ipc/protocol_internal.h"
#include "tests/ipc/ipc_test_util.h"

namespace kvctl::ipc {
namespace {

using Clock = std::chrono::steady_clock;

struct Pair {
  zmq::context_t ctx;
  zmq::socket_t router{ctx, zmq::socket_type::router};
  zmq::socket_t dealer{ctx, zmq::socket_type::dealer};
  explicit Pair(const std::string& endpoint) {
    router.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::linger, 0);
    router.bind(endpoint);
    dealer.connect(endpoint);
  }
};

class EventFd {
 public:
  EventFd() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) { REQUIRE(fd_ >= 0); }
  ~EventFd() { close(fd_); }
  int fd() const { return fd_; }
  void Signal() {
    const uint64_t one = 1;
    REQUIRE(write(fd_, &one, sizeof(one)) == sizeof(one));
  }

 private:
  int fd_;
};

// Waits until `socket` is readable, at most 5 s.
bool WaitReadable(zmq::socket_t& socket, int wake_fd = -1) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline) {
    if (WaitForInput(socket, wake_fd, 100).readable) return true;
  }
  return false;
}

TEST_CASE("WaitForInput: a message queued behind one received is seen without a new edge",
          "[ipc]") {
  testing::TempDir dir;
  Pair p("ipc://" + dir.File("w.sock"));
  // Two messages arrive together: ZMQ_FD signals once. After the first is received, poll(2) on
  // ZMQ_FD alone would wait for the full timeout although the second is already there; the
  // ZMQ_EVENTS check first is what finds it.
  REQUIRE(p.dealer.send(zmq::str_buffer("one"), zmq::send_flags::none));
  REQUIRE(p.dealer.send(zmq::str_buffer("two"), zmq::send_flags::none));
  for (const char* want : {"one", "two"}) {
    REQUIRE(WaitReadable(p.router));
    Frames frames;
    size_t discarded = 0;
    // Both may already be queued: the first wait only makes sure they arrived.
    const auto start = Clock::now();
    const WaitResult r = WaitForInput(p.router, -1, 2000);
    CHECK(r.readable);
    CHECK(!r.woken);
    CHECK(Clock::now() - start < std::chrono::milliseconds(1000));
    REQUIRE(RecvMessage(p.router, &frames, 4, &discarded));
    REQUIRE(frames.size() == 2);  // Routing id, body.
    CHECK(testing::Bytes(frames[1]) == want);
  }
  // Nothing left: a short wait times out empty.
  const WaitResult none = WaitForInput(p.router, -1, 20);
  CHECK(!none.readable);
  CHECK(!none.woken);
}

TEST_CASE("WaitForInput: the wake fd ends the wait and is reported", "[ipc]") {
  testing::TempDir dir;
  Pair p("ipc://" + dir.File("w.sock"));
  EventFd wake;
  wake.Signal();
  const auto start = Clock::now();
  const WaitResult r = WaitForInput(p.router, wake.fd(), 5000);
  CHECK(r.woken);
  CHECK(!r.readable);
  CHECK(Clock::now() - start < std::chrono::milliseconds(2500));
  // A message and a wake-up: the message is reported even while the fd stays signalled.
  REQUIRE(p.dealer.send(zmq::str_buffer("x"), zmq::send_flags::none));
  CHECK(WaitReadable(p.router, wake.fd()));
  // A negative wake fd is ignored.
  Frames frames;
  size_t discarded = 0;
  REQUIRE(RecvMessage(p.router, &frames, 4, &discarded));
  CHECK(!WaitForInput(p.router, -1, 10).woken);
}

TEST_CASE("FETCH blocks reply: the reserved body size is the encoded one", "[ipc]") {
  FetchBlocksReply with_side = testing::SampleFetchBlocks();
  FetchBlocksReply no_side = with_side;
  for (RecordLayout& l : no_side.layouts) l.side_bytes_per_token = 0;
  no_side.side_records_per_page = 0;
  no_side.side_indices.clear();
  for (const FetchBlocksReply& m : {with_side, no_side}) {
    const size_t want = BodyBytes(m);
    const Frames frames = testing::MustEncode(m);
    CHECK(frames[0].size() == kHeaderBytes + want);
  }
}

TEST_CASE("FETCH blocks reply: a bad field inside a layout is named with its path", "[ipc]") {
  const FetchBlocksReply m = testing::SampleFetchBlocks();
  const Frames frames = testing::MustEncode(m);
  const std::string bytes = testing::Bytes(frames[0]);
  // Body: mode (1), eight u32 fields, n_layouts (2), then 64-byte layouts; row_dtype is byte 3.
  const size_t layouts = kHeaderBytes + 1 + 4 * 8 + 2;
  const auto decode_error = [](const std::string& frame0) {
    Frames f;
    f.emplace_back(frame0.data(), frame0.size());
    StatusOr<Reply> r = DecodeReply(std::move(f));
    REQUIRE(!r.ok());
    return std::string(r.status().message());
  };
  std::string bad_dtype = bytes;
  bad_dtype[layouts + 64 + 3] = 9;
  CHECK(decode_error(bad_dtype) == "FETCH_REPLY: layouts[1].row_dtype: got 9, expected 0..2");
  // Cut inside layouts[1].record_bytes (bytes 12..15 of the layout).
  const std::string cut = bytes.substr(0, layouts + 64 + 13);
  CHECK(decode_error(cut).starts_with("FETCH_REPLY: truncated at layouts[1].record_bytes: need 4"));
}

}  // namespace
}  // namespace kvctl::ipc
