// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Replies given on the I/O thread (while the handler runs there) leave without the inproc wake-up
// that replies from other threads take. These tests check that the two paths are
// indistinguishable to a client: the same bytes in the same frames for the same request id, the
// same errors, REQ envelopes, the counters, order behind replies queued earlier, and a client
// that is gone before its reply.
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>
#include <zmq_addon.hpp>

#include "ipc/server.h"
#include "tests/ipc/ipc_test_util.h"

namespace kvctl::ipc {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;

// PING, FETCH (dense) and CLOSE (an error) are answered on the I/O thread when their session id
// is odd and from a thread of their own when it is even, with the same reply. PING 4242 sleeps
// 300 ms on the I/O thread before its reply. OPEN waits for PING 77 (inline), which answers only
// once OPEN's reply has been queued by OPEN's thread.
class TwoPathServer {
 public:
  explicit TwoPathServer(const std::string& endpoint) {
    StatusOr<std::unique_ptr<ZmqServer>> s = ZmqServer::Bind({.endpoint = endpoint});
    REQUIRE(s.ok());
    server_ = std::move(s).value();
    REQUIRE(server_->Start([this](Request req, Responder r) { Handle(req, r); }).ok());
  }
  ~TwoPathServer() {
    server_->Stop();
    for (std::thread& t : threads_) t.join();
  }
  ZmqServer& server() { return *server_; }

 private:
  void Handle(Request& req, Responder& r) {
    if (std::holds_alternative<OpenRequest>(req.body)) {
      threads_.emplace_back([this, r]() mutable {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return open_may_answer_; });
        r.Reply(OpenReply{});
        open_answered_ = true;
        cv_.notify_all();
      });
      return;
    }
    if (auto* ping = std::get_if<PingRequest>(&req.body); ping && ping->session_id == 77) {
      std::unique_lock lock(mu_);
      open_may_answer_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_answered_; });  // OPEN's reply is queued now.
      r.Reply(PingReply{77});
      return;
    }
    if (auto* ping = std::get_if<PingRequest>(&req.body); ping && ping->session_id == 4242) {
      std::this_thread::sleep_for(300ms);
      r.Reply(PingReply{4242});
      return;
    }
    const uint64_t session = std::visit([](const auto& m) { return SessionOf(m); }, req.body);
    auto answer = [body = std::move(req.body)](Responder& out) mutable {
      if (auto* ping = std::get_if<PingRequest>(&body)) {
        out.Reply(PingReply{ping->session_id * 3});
      } else if (auto* fetch = std::get_if<FetchRequest>(&body)) {
        FetchDenseReply reply = testing::SampleFetchDense();
        reply.layer_begin = fetch->layer_begin;
        out.Reply(std::move(reply));
      } else {
        out.Error(
            NotFound("sequence_id: ", std::get<CloseRequest>(body).sequence_id, " is not open"));
      }
    };
    if (session % 2 == 1) {
      answer(r);
      return;
    }
    threads_.emplace_back([answer = std::move(answer), r]() mutable { answer(r); });
  }
  template <typename M>
  static uint64_t SessionOf(const M& m) {
    if constexpr (requires { m.session_id; }) {
      return m.session_id;
    } else {
      return 0;
    }
  }

  std::unique_ptr<ZmqServer> server_;
  std::vector<std::thread> threads_;  // I/O thread only (joined after Stop).
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_may_answer_ = false;
  bool open_answered_ = false;
};

Frames Encoded(uint64_t id, RequestBody body) {
  StatusOr<Frames> f = Encode(id, std::move(body));
  REQUIRE(f.ok());
  return std::move(f).value();
}

std::vector<std::string> Strings(const Frames& frames) {
  std::vector<std::string> out;
  for (const zmq::message_t& f : frames) out.push_back(testing::Bytes(f));
  return out;
}

// One multipart message, or an empty vector after 5 s.
Frames Receive(zmq::socket_t& socket) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, 5000ms);
  Frames out;
  if (!(item.revents & ZMQ_POLLIN)) return out;
  REQUIRE(zmq::recv_multipart(socket, std::back_inserter(out)));
  return out;
}

zmq::socket_t Connect(zmq::context_t& ctx, zmq::socket_type type, const std::string& endpoint) {
  zmq::socket_t s(ctx, type);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  return s;
}

TEST_CASE("ZmqServer: a reply from the I/O thread is byte for byte one from another thread",
          "[ipc]") {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.File("kvctl.sock");
  TwoPathServer server(endpoint);
  zmq::context_t ctx;
  zmq::socket_t dealer = Connect(ctx, zmq::socket_type::dealer, endpoint);
  zmq::socket_t req = Connect(ctx, zmq::socket_type::req, endpoint);

  struct Case {
    uint64_t session;  // Odd: answered inline; even: from a thread.
    std::function<RequestBody()> request;
    Frames expected;  // The reply, encoded here for the request id.
  };
  uint64_t id = 1000;
  std::vector<Case> cases;
  for (uint64_t session : {11, 12}) {
    ++id;
    cases.push_back({session, [session] { return RequestBody(PingRequest{session}); },
                     [&] {
                       StatusOr<Frames> f = Encode(id, PingReply{session * 3});
                       REQUIRE(f.ok());
                       return std::move(f).value();
                     }()});
    ++id;
    FetchDenseReply dense = testing::SampleFetchDense();
    dense.layer_begin = 1;
    StatusOr<Frames> fetch = Encode(id, std::move(dense));
    REQUIRE(fetch.ok());
    REQUIRE(fetch->size() == 4);  // Header + positions, K, V: a multipart reply.
    cases.push_back(
        {session,
         [session] {
           return RequestBody(FetchRequest{session, 7, 1, 2, FetchMode::kDense, DType::kF16});
         },
         std::move(fetch).value()});
    ++id;
    cases.push_back({session,
                     [session] {
                       return RequestBody(CloseRequest{session, 9});
                     },
                     EncodeError(id, NotFound("sequence_id: 9 is not open"))});
  }
  const ServerCounters before = server.server().counters();
  uint64_t request_id = 1000;
  for (Case& c : cases) {
    ++request_id;
    INFO("session " << c.session << ", request " << request_id);
    for (zmq::socket_t* socket : {&dealer, &req}) {
      Frames request = Encoded(request_id, c.request());
      REQUIRE(zmq::send_multipart(*socket, request));
      Frames reply = Receive(*socket);
      CHECK(Strings(reply) == Strings(c.expected));  // REQ's delimiter is stripped by REQ.
    }
  }
  // The counters move just after each send, so the last one may lag the client's read.
  ServerCounters after = server.server().counters();
  for (int i = 0; i < 200 && (after.in_flight != 0 ||
                              after.replies_total - before.replies_total < 2 * cases.size());
       ++i) {
    std::this_thread::sleep_for(5ms);
    after = server.server().counters();
  }
  CHECK(after.requests_total - before.requests_total == 2 * cases.size());
  CHECK(after.replies_total - before.replies_total == 2 * cases.size());
  CHECK(after.errors_total - before.errors_total == 4);  // CLOSE, inline and not, two sockets.
  CHECK(after.replies_dropped_total == 0);
  CHECK(after.in_flight == 0);
}

TEST_CASE("ZmqServer: a reply from the I/O thread leaves behind replies queued before it",
          "[ipc]") {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.File("kvctl.sock");
  TwoPathServer server(endpoint);
  zmq::context_t ctx;
  zmq::socket_t dealer = Connect(ctx, zmq::socket_type::dealer, endpoint);
  // OPEN (id 1) goes to a thread that answers only while PING 77 (id 2) holds the I/O thread; the
  // PING's reply is given after OPEN's was queued, so OPEN's must reach the client first.
  REQUIRE(zmq::send_multipart(dealer, Encoded(1, OpenRequest{5, 6})));
  REQUIRE(zmq::send_multipart(dealer, Encoded(2, PingRequest{77})));
  Frames first = Receive(dealer);
  Frames second = Receive(dealer);
  REQUIRE(!first.empty());
  REQUIRE(!second.empty());
  CHECK(PeekRequestId(first[0]) == 1);
  CHECK(PeekRequestId(second[0]) == 2);
  StatusOr<Reply> ping = DecodeReply(std::move(second));
  REQUIRE(ping.ok());
  CHECK(std::get<PingReply>(ping->body).server_time_us == 77);
}

TEST_CASE("ZmqServer: an inline reply to a client that left is counted as dropped", "[ipc]") {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.File("kvctl.sock");
  TwoPathServer server(endpoint);
  {
    zmq::context_t ctx;
    zmq::socket_t gone = Connect(ctx, zmq::socket_type::dealer, endpoint);
    REQUIRE(zmq::send_multipart(gone, Encoded(1, PingRequest{4242})));
    std::this_thread::sleep_for(50ms);  // The I/O thread is in the 300 ms handler now.
  }                                     // The client closes (linger 0) before its reply exists.
  ServerCounters c = server.server().counters();
  for (int i = 0; i < 400 && c.replies_total + c.replies_dropped_total < 1; ++i) {
    std::this_thread::sleep_for(5ms);
    c = server.server().counters();
  }
  CHECK(c.replies_dropped_total == 1);
  CHECK(c.replies_total == 0);
  CHECK(c.in_flight == 0);
  // The server goes on serving, inline and from threads.
  zmq::context_t ctx;
  zmq::socket_t dealer = Connect(ctx, zmq::socket_type::dealer, endpoint);
  for (uint64_t session : {3, 4}) {
    REQUIRE(zmq::send_multipart(dealer, Encoded(session, PingRequest{session})));
    StatusOr<Reply> reply = DecodeReply(Receive(dealer));
    REQUIRE(reply.ok());
    CHECK(reply->request_id == session);
    CHECK(std::get<PingReply>(reply->body).server_time_us == session * 3);
  }
}

}  // namespace
}  // namespace kvctl::ipc
