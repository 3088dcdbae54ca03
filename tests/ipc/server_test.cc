// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Transport tests: a real ZmqServer (ROUTER) and real Clients (DEALER) over ipc:// and loopback
// TCP. The handler is a small fake daemon: these tests are about the transport, not the daemon.
#include "ipc/server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>
#include <zmq_addon.hpp>

#include "common/thread_annotations.h"
#include "ipc/client.h"
#include "tests/ipc/ipc_test_util.h"

namespace kvctl::ipc {
namespace {

using namespace std::chrono_literals;
using testing::FrameOf;
using testing::MustEncode;
using testing::TempDir;

// OPEN answers from a worker thread (sequence ids >= 1000 sleep id - 1000 ms first); CLOSE 999 is
// dropped unanswered, 998 fails with NOT_FOUND, 997 throws; PING echoes its session id.
class FakeDaemon {
 public:
  explicit FakeDaemon(std::string endpoint) { options_.endpoint = std::move(endpoint); }
  ~FakeDaemon() { Stop(); }

  Status Start() {
    KVCTL_ASSIGN_OR_RETURN(server_, ZmqServer::Bind(options_));
    return server_->Start([this](Request req, Responder r) { Handle(std::move(req), r); });
  }

  void Stop() {
    if (server_) server_->Stop();
    MutexLock lock(&mu_);
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  ZmqServer& server() { return *server_; }
  ServerOptions options_;

 private:
  void Handle(Request req, Responder r) {
    std::visit([&](auto& m) { On(m, r); }, req.body);
  }
  void On(HelloRequest& m, Responder& r) {
    HelloReply reply = testing::SampleHelloReply();
    reply.session_id = 1000 + m.geometry.layers;
    r.Reply(reply);
  }
  void On(PingRequest& m, Responder& r) { r.Reply(PingReply{m.session_id}); }
  void On(OpenRequest& m, Responder& r) {
    const uint64_t seq = m.sequence_id;
    MutexLock lock(&mu_);
    workers_.emplace_back([seq, r]() mutable {
      if (seq >= 1000) std::this_thread::sleep_for(std::chrono::milliseconds(seq - 1000));
      r.Reply(OpenReply{});
    });
  }
  void On(CloseRequest& m, Responder& r) {
    if (m.sequence_id == 999) return;  // The Responder dies unanswered.
    if (m.sequence_id == 998) {
      r.Error(NotFound("sequence_id: 998 is not open"));
      return;
    }
    if (m.sequence_id == 997) throw std::runtime_error("boom");
    r.Reply(CloseReply{m.sequence_id * 10});
  }
  void On(AppendRequest& m, Responder& r) {
    const Status shape = CheckAppendShape(m, testing::SampleGeometry());
    if (!shape.ok()) {
      r.Error(shape);
      return;
    }
    r.Reply(AppendReply{m.first_position + m.n_tokens, 0, m.k.size() + m.v.size() + m.q.size()});
  }
  void On(FetchRequest& m, Responder& r) {
    if (m.mode != FetchMode::kDense) {
      r.Error(Unimplemented("mode: blocks not in the fake"));
      return;
    }
    FetchDenseReply reply{.layer_begin = m.layer_begin,
                          .n_layers = m.layer_end - m.layer_begin,
                          .kv_heads = 2,
                          .head_dim = 8,
                          .dtype = m.out_dtype};
    reply.counts.assign(reply.n_layers * 2, static_cast<uint32_t>(m.sequence_id % 5));
    const size_t rows = reply.counts.size() * (m.sequence_id % 5);
    reply.positions = testing::PositionsFrame(rows, 0);
    reply.k = testing::PatternFrame(rows * 8 * DTypeSize(m.out_dtype), 1);
    reply.v = testing::PatternFrame(rows * 8 * DTypeSize(m.out_dtype), 2);
    r.Reply(std::move(reply));
  }
  void On(ByeRequest& m, Responder& r) { r.Reply(ByeReply{2, m.session_id}); }
  void On(SavePrefixRequest& m, Responder& r) {
    r.Reply(SavePrefixReply{m.tokens.size() / sizeof(int32_t), m.sequence_id});
  }
  void On(OpenPrefixRequest& m, Responder& r) {
    r.Reply(OpenPrefixReply{m.tokens.size() / sizeof(int32_t)});
  }
  void On(StatsRequest& m, Responder& r) {
    r.Reply(StatsReply{"# IPC\nsection:" + m.section + "\n"});
  }

  std::unique_ptr<ZmqServer> server_;
  Mutex mu_;
  std::vector<std::thread> workers_ KVCTL_GUARDED_BY(mu_);
};

std::string IpcEndpoint(const TempDir& dir) { return "ipc://" + dir.File("kvctl.sock"); }

std::unique_ptr<Client> MustConnect(const std::string& endpoint, int timeout_ms = 5000) {
  StatusOr<std::unique_ptr<Client>> c = Client::Connect(endpoint, timeout_ms);
  REQUIRE(c.ok());
  return std::move(c).value();
}

// Sends raw frames on a DEALER and decodes the one reply.
StatusOr<Reply> RawCall(zmq::socket_t& dealer, Frames frames) {
  REQUIRE(zmq::send_multipart(dealer, frames));
  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, 5000ms);
  REQUIRE((item.revents & ZMQ_POLLIN));
  Frames reply;
  REQUIRE(zmq::recv_multipart(dealer, std::back_inserter(reply)));
  return DecodeReply(std::move(reply));
}

TEST_CASE("ZmqServer: replies match requests whether answered inline or from a worker thread",
          "[ipc]") {
  TempDir dir;
  FakeDaemon daemon(IpcEndpoint(dir));
  REQUIRE(daemon.Start().ok());
  auto client = MustConnect(IpcEndpoint(dir));

  StatusOr<HelloReply> hello = client->Hello(testing::SampleHello());
  REQUIRE(hello.ok());
  CHECK(hello->session_id == 1002);
  CHECK(hello->shm_name == "/kvctl-pool");
  for (uint64_t i = 1; i <= 20; ++i) {
    StatusOr<PingReply> ping = client->Ping(i);
    REQUIRE(ping.ok());
    CHECK(ping->server_time_us == i);
    CHECK(client->Open(1002, i).ok());  // Worker thread.
  }
  StatusOr<CloseReply> close = client->Close(1002, 4);
  REQUIRE(close.ok());
  CHECK(close->bytes_freed == 40);

  AppendRequest sample = testing::SampleAppendInline();
  StatusOr<AppendReply> append = client->AppendInline({1002, 1, 100, 3}, FrameBytes(sample.k),
                                                      FrameBytes(sample.v), FrameBytes(sample.q));
  REQUIRE(append.ok());
  CHECK(append->tokens_total == 103);
  CHECK(append->pool_bytes_used == sample.k.size() * 2 + sample.q.size());
  // The server checks the geometry: 3 tokens declared, tensors sized for 1.5.
  append = client->AppendInline({1002, 1, 100, 3}, FrameBytes(sample.k).first(96),
                                FrameBytes(sample.v).first(96));
  CHECK(append.status().code() == StatusCode::kInvalidArgument);
  CHECK(append.status().message().find("k: frame has 96 bytes, expected 192") != std::string::npos);
  CHECK(client->AppendStaging({1002, 1, 103, 1}, 0, false).ok());

  StatusOr<FetchDenseReply> fetch = client->FetchDense(1002, 3, 0, 2, DType::kBF16);
  REQUIRE(fetch.ok());
  CHECK(fetch->counts == std::vector<uint32_t>(4, 3));
  CHECK(fetch->k.size() == 12 * 8 * 2);
  CHECK(client->FetchBlocks(1002, 3, 0, 2).status().code() == StatusCode::kUnimplemented);

  StatusOr<ByeReply> bye = client->Bye(1002);
  REQUIRE(bye.ok());
  CHECK((bye->sequences_closed == 2 && bye->bytes_freed == 1002));
  CHECK(client->Bye(0).status().code() == StatusCode::kInvalidArgument);  // Never sent.

  StatusOr<std::string> stats = client->Stats(0, "ipc");
  REQUIRE(stats.ok());
  CHECK(*stats == "# IPC\nsection:ipc\n");

  // The I/O thread counts a reply just after handing it to ZeroMQ, so the client can hold the
  // last reply a moment before the counter moves: wait for it (bounded) instead of racing it.
  ServerCounters c = daemon.server().counters();
  for (int i = 0; i < 200 && c.replies_total < 49; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    c = daemon.server().counters();
  }
  CHECK(c.requests_total == 49);
  CHECK(c.replies_total == 49);
  CHECK(c.errors_total == 2);
  CHECK(c.rejected_total == 0);
  CHECK(c.in_flight == 0);
  CHECK(c.bytes_in_total > 2 * sample.k.size());
  CHECK(c.bytes_out_total > fetch->k.size() * 2);
}

TEST_CASE("ZmqServer: eight concurrent clients each get their own replies", "[ipc]") {
  TempDir dir;
  FakeDaemon daemon(IpcEndpoint(dir));
  REQUIRE(daemon.Start().ok());
  constexpr int kClients = 8, kCalls = 100;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&, t] {
      // No Catch2 assertions off the main thread: Catch2 v2 is not thread-safe.
      StatusOr<std::unique_ptr<Client>> connected = Client::Connect(IpcEndpoint(dir), 5000);
      if (!connected.ok()) return;
      Client* client = connected->get();
      const AppendRequest sample = testing::SampleAppendInline();
      for (int i = 0; i < kCalls; ++i) {
        const uint64_t tag = uint64_t(t) * 1000000 + i;
        StatusOr<PingReply> ping = client->Ping(tag);
        StatusOr<OpenReply> open = client->Open(1, i);  // < 1000: answered without delay.
        StatusOr<AppendReply> append = client->AppendInline(
            {1, tag, tag, 3}, FrameBytes(sample.k), FrameBytes(sample.v), FrameBytes(sample.q));
        if (ping.ok() && ping->server_time_us == tag && open.ok() && append.ok() &&
            append->tokens_total == tag + 3) {
          ++good;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(good.load() == kClients * kCalls);
  CHECK(daemon.server().counters().requests_total == 3 * kClients * kCalls);
}

TEST_CASE("Client: times out on a stopped server and works again after a restart", "[ipc]") {
  TempDir dir;
  auto daemon = std::make_unique<FakeDaemon>(IpcEndpoint(dir));
  REQUIRE(daemon->Start().ok());
  auto client = MustConnect(IpcEndpoint(dir), 300);
  REQUIRE(client->Ping(1).ok());

  // A reply later than the timeout: the call fails, and the late reply never confuses the next.
  StatusOr<OpenReply> slow = client->Open(1, 1000 + 800);
  CHECK(slow.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(client->socket_resets() == 1);
  StatusOr<PingReply> ping = client->Ping(2);
  REQUIRE(ping.ok());
  CHECK(ping->server_time_us == 2);

  daemon.reset();
  const auto t0 = std::chrono::steady_clock::now();
  ping = client->Ping(3);
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(ping.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(ping.status().message().find("within 300 ms") != std::string::npos);
  CHECK(waited >= 250ms);
  CHECK(waited < 3s);
  CHECK(client->socket_resets() == 2);

  daemon = std::make_unique<FakeDaemon>(IpcEndpoint(dir));
  REQUIRE(daemon->Start().ok());
  client->set_timeout_ms(5000);
  ping = client->Ping(4);
  INFO(ping.status().ToString());
  REQUIRE(ping.ok());
  CHECK(ping->server_time_us == 4);
}

TEST_CASE("Client: drops stale replies and reports malformed ones", "[ipc]") {
  TempDir dir;
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind(IpcEndpoint(dir));
  // A hand-written server: per request, first a reply to another request id, then the answer
  // (round 0: valid; round 1: truncated). No Catch2 assertions in this thread.
  std::thread server([&] {
    for (int round = 0; round < 2; ++round) {
      Frames in;
      if (!zmq::recv_multipart(router, std::back_inserter(in)) || in.size() != 2) return;
      const uint64_t id = PeekRequestId(in[1]);
      std::string bytes = testing::Bytes(MustEncode(PingReply{111})[0]);
      bytes[8] = static_cast<char>(id + 50);  // Another request id.
      Frames out;
      out.push_back(FrameOf(testing::Bytes(in[0])));
      out.push_back(FrameOf(bytes));
      (void)zmq::send_multipart(router, out);
      out.clear();
      out.push_back(FrameOf(testing::Bytes(in[0])));
      if (round == 0) {
        std::string good = testing::Bytes(MustEncode(PingReply{222})[0]);
        good[8] = static_cast<char>(id);
        out.push_back(FrameOf(good));
      } else {
        std::string bad = testing::Bytes(MustEncode(PingReply{222})[0]);
        bad[8] = static_cast<char>(id);
        out.push_back(FrameOf(bad.substr(0, bad.size() - 1)));  // Truncated body.
      }
      (void)zmq::send_multipart(router, out);
    }
  });
  auto client = MustConnect(IpcEndpoint(dir));
  StatusOr<PingReply> ping = client->Ping();
  REQUIRE(ping.ok());
  CHECK(ping->server_time_us == 222);
  CHECK(client->stale_replies_dropped() == 1);
  ping = client->Ping();
  CHECK(ping.status().code() == StatusCode::kInternal);
  CHECK(ping.status().message().find("malformed reply") != std::string::npos);
  CHECK(client->stale_replies_dropped() == 2);
  server.join();
}

TEST_CASE("ZmqServer: malformed requests get ERROR replies from the transport", "[ipc]") {
  TempDir dir;
  FakeDaemon daemon(IpcEndpoint(dir));
  REQUIRE(daemon.Start().ok());
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(IpcEndpoint(dir));

  const auto expect_error = [&](Frames frames, uint64_t id, StatusCode code,
                                const std::string& text) {
    StatusOr<Reply> reply = RawCall(dealer, std::move(frames));
    REQUIRE(reply.ok());
    CHECK(reply->request_id == id);
    REQUIRE(std::holds_alternative<ErrorReply>(reply->body));
    const ErrorReply& e = std::get<ErrorReply>(reply->body);
    INFO(e.message);
    CHECK(e.code == code);
    CHECK(e.message.find(text) != std::string::npos);
  };
  Frames garbage;
  garbage.push_back(FrameOf("hello, world! not kvctl"));
  expect_error(std::move(garbage), 0, StatusCode::kInvalidArgument, "magic: got");

  std::string unknown = testing::Bytes(MustEncode(PingRequest{1})[0]);
  unknown[6] = 11;
  Frames f;
  f.push_back(FrameOf(unknown));
  expect_error(std::move(f), 7, StatusCode::kUnimplemented, "type: got 0x000B");

  std::string v2 = testing::Bytes(MustEncode(PingRequest{1})[0]);
  v2[4] = 2;
  f.clear();
  f.push_back(FrameOf(v2));
  expect_error(std::move(f), 7, StatusCode::kInvalidArgument, "version: got 2, expected 1");

  f = MustEncode(PingRequest{1});
  for (int i = 0; i < 5; ++i) f.push_back(FrameOf("x"));
  expect_error(std::move(f), 7, StatusCode::kInvalidArgument, "frame count");

  AppendRequest append = testing::SampleAppendInline();
  append.q = testing::PatternFrame(append.q.size() / 2, 0);
  expect_error(MustEncode(std::move(append)), 7, StatusCode::kInvalidArgument,
               "q: frame has 192 bytes, expected 384");

  // The server keeps serving.
  auto client = MustConnect(IpcEndpoint(dir));
  CHECK(client->Ping(5).ok());
  const ServerCounters c = daemon.server().counters();
  CHECK(c.rejected_total == 4);
  CHECK(c.errors_total == 5);
}

TEST_CASE("ZmqServer: dropped or failing or throwing handlers still answer", "[ipc]") {
  TempDir dir;
  FakeDaemon daemon(IpcEndpoint(dir));
  REQUIRE(daemon.Start().ok());
  auto client = MustConnect(IpcEndpoint(dir));
  StatusOr<CloseReply> r = client->Close(1, 999);
  CHECK(r.status().code() == StatusCode::kInternal);
  CHECK(r.status().message().find("dropped CLOSE request") != std::string::npos);
  r = client->Close(1, 998);
  CHECK(r.status().code() == StatusCode::kNotFound);
  CHECK(r.status().message() == "sequence_id: 998 is not open");
  r = client->Close(1, 997);
  CHECK(r.status().code() == StatusCode::kInternal);
  CHECK(r.status().message() == "request handler threw: boom");
  CHECK(client->Close(1, 5).ok());
}

TEST_CASE("ZmqServer: Stop waits for in-flight replies", "[ipc]") {
  TempDir dir;
  FakeDaemon daemon(IpcEndpoint(dir));
  REQUIRE(daemon.Start().ok());
  Status result = Internal("not run");
  StatusOr<std::unique_ptr<Client>> client = Client::Connect(IpcEndpoint(dir), 5000);
  REQUIRE(client.ok());
  std::thread caller([&] { result = (*client)->Open(1, 1000 + 300).status(); });
  for (int i = 0; i < 500 && daemon.server().counters().in_flight == 0; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(daemon.server().counters().in_flight == 1);
  daemon.server().Stop();
  caller.join();
  CHECK(result.ok());
}

TEST_CASE("ZmqServer: REQ clients are answered through their envelope", "[ipc]") {
  TempDir dir;
  FakeDaemon daemon(IpcEndpoint(dir));
  REQUIRE(daemon.Start().ok());
  zmq::context_t ctx;
  zmq::socket_t req(ctx, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.connect(IpcEndpoint(dir));
  StatusOr<Reply> reply = RawCall(req, MustEncode(PingRequest{77}));
  REQUIRE(reply.ok());
  CHECK(std::get<PingReply>(reply->body).server_time_us == 77);
}

TEST_CASE("ZmqServer: the ipc socket file is 0600 and removed on Stop", "[ipc]") {
  TempDir dir;
  const std::string path = dir.File("kvctl.sock");
  FakeDaemon daemon("ipc://" + path);
  REQUIRE(daemon.Start().ok());
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);
  daemon.Stop();
  CHECK(stat(path.c_str(), &st) != 0);
}

TEST_CASE("ZmqServer: refuses a live server's path and replaces a stale socket but no file",
          "[ipc]") {
  TempDir dir;
  FakeDaemon live(IpcEndpoint(dir));
  REQUIRE(live.Start().ok());
  FakeDaemon second(IpcEndpoint(dir));
  const Status s = second.Start();
  CHECK(s.code() == StatusCode::kAlreadyExists);
  CHECK(s.message().find("already listening") != std::string::npos);
  CHECK(MustConnect(IpcEndpoint(dir))->Ping(1).ok());  // The first server is untouched.

  // A socket file left by a crashed process: bound, never unlinked, nobody listening.
  const std::string stale = dir.File("stale.sock");
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, stale.c_str());
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  close(fd);
  FakeDaemon replacing("ipc://" + stale);
  REQUIRE(replacing.Start().ok());
  CHECK(MustConnect("ipc://" + stale)->Ping(2).ok());

  const std::string regular = dir.File("notes.txt");
  std::ofstream(regular) << "keep me";
  FakeDaemon refused("ipc://" + regular);
  CHECK(refused.Start().code() == StatusCode::kFailedPrecondition);
  std::ifstream in(regular);
  std::string content;
  std::getline(in, content);
  CHECK(content == "keep me");
}

TEST_CASE("ZmqServer: refuses non-loopback TCP and serves loopback TCP", "[ipc]") {
  for (const char* endpoint :
       {"tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://192.168.1.10:5555", "tcp://eth0:5555",
        "tcp://[::]:5555", "tcp://128.0.0.1:5555", "tcp://localhost.evil.com:1"}) {
    INFO(endpoint);
    StatusOr<std::unique_ptr<ZmqServer>> s = ZmqServer::Bind({.endpoint = endpoint});
    CHECK(s.status().code() == StatusCode::kInvalidArgument);
    CHECK(s.status().message().find("not a loopback address") != std::string::npos);
  }
  for (const char* endpoint : {"udp://127.0.0.1:1", "inproc://x", "ipc://@abstract", "ipc://",
                               "tcp://127.0.0.1:0", "tcp://127.0.0.1:99999", "tcp://127.0.0.1"}) {
    INFO(endpoint);
    CHECK(ZmqServer::Bind({.endpoint = endpoint}).status().code() == StatusCode::kInvalidArgument);
  }
  CHECK(ZmqServer::Bind({.endpoint = "ipc:///" + std::string(200, 'x')})
            .status()
            .message()
            .find("Unix socket limit") != std::string::npos);

  for (const char* endpoint : {"tcp://127.0.0.1:*", "tcp://localhost:*"}) {
    INFO(endpoint);
    FakeDaemon daemon(endpoint);
    REQUIRE(daemon.Start().ok());
    const std::string bound = daemon.server().endpoint();
    CHECK(bound.starts_with("tcp://127.0.0.1:"));
    StatusOr<PingReply> ping = MustConnect(bound)->Ping(9);
    REQUIRE(ping.ok());
    CHECK(ping->server_time_us == 9);
  }
}

TEST_CASE("Client: refuses bad endpoints and invalid requests without sending", "[ipc]") {
  CHECK(Client::Connect("http://x", 100).status().code() == StatusCode::kInvalidArgument);
  CHECK(Client::Connect("tcp://host:*", 100).status().code() == StatusCode::kInvalidArgument);
  CHECK(Client::Connect("ipc:///tmp/x", 0).status().code() == StatusCode::kInvalidArgument);
  TempDir dir;
  auto client = MustConnect(IpcEndpoint(dir), 60000);  // Nobody listens: a send would hang.
  const auto t0 = std::chrono::steady_clock::now();
  HelloRequest bad = testing::SampleHello();
  bad.geometry.kv_heads = 0;
  CHECK(client->Hello(bad).status().message() == "HELLO: kv_heads: got 0, expected 1..1024");
  CHECK(client->Open(0, 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(client->AppendInline({1, 1, 0, 3}, {}, {}).status().code() == StatusCode::kInvalidArgument);
  // Half the client's 60 s timeout: a send would have waited all of it, however loaded the
  // machine is.
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
}

TEST_CASE("ZmqServer: a request over max_request_bytes in several frames gets a named error",
          "[ipc]") {
  TempDir dir;
  FakeDaemon daemon(IpcEndpoint(dir));
  daemon.options_.max_request_bytes = 1 << 20;
  daemon.options_.max_frame_bytes = 1 << 20;
  REQUIRE(daemon.Start().ok());
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(IpcEndpoint(dir));
  // Three frames of 700 KB: each under the frame limit, together over the request limit.
  AppendRequest append = testing::SampleAppendInline();
  Frames frames = MustEncode(std::move(append));
  for (size_t i = 1; i < frames.size(); ++i) frames[i] = testing::PatternFrame(700'000, 1);
  StatusOr<Reply> reply = RawCall(dealer, std::move(frames));
  REQUIRE(reply.ok());
  REQUIRE(std::holds_alternative<ErrorReply>(reply->body));
  const ErrorReply& e = std::get<ErrorReply>(reply->body);
  INFO(e.message);
  CHECK(e.code == StatusCode::kInvalidArgument);
  CHECK(e.message.find("expected at most 1048576 (server.max_message_bytes)") != std::string::npos);
  CHECK(daemon.server().counters().rejected_total == 1);
  CHECK(MustConnect(IpcEndpoint(dir))->Ping(3).ok());  // Still serving.
}

TEST_CASE("ZmqServer: replies a client leaves unread are counted as dropped, never lost silently",
          "[ipc]") {
  TempDir dir;
  FakeDaemon daemon(IpcEndpoint(dir));
  daemon.options_.send_hwm = 10;
  REQUIRE(daemon.Start().ok());
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvhwm, 10);
  dealer.connect(IpcEndpoint(dir));
  constexpr uint64_t kSent = 3000;
  for (uint64_t i = 1; i <= kSent; ++i) {
    Frames f = MustEncode(PingRequest{i});
    REQUIRE(dealer.send(f[0], zmq::send_flags::none));
  }
  // Every request is answered or counted as dropped; wait for that (bounded), then read.
  ServerCounters c = daemon.server().counters();
  for (int i = 0; i < 6000 && c.replies_total + c.replies_dropped_total < kSent; ++i) {
    std::this_thread::sleep_for(5ms);
    c = daemon.server().counters();
  }
  REQUIRE(c.requests_total == kSent);
  REQUIRE(c.replies_total + c.replies_dropped_total == kSent);
  CHECK(c.replies_dropped_total > 0);  // 3000 unread replies cannot fit in 10 + 10 + pipes.
  dealer.set(zmq::sockopt::rcvtimeo, 2000);
  uint64_t received = 0;
  zmq::message_t m;
  while (dealer.recv(m)) ++received;
  CHECK(received == c.replies_total);
}

}  // namespace
}  // namespace kvctl::ipc
