// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: ipc/server.h
// ZmqServer: the daemon's side of the wire. One ROUTER socket on a local endpoint (ipc:// socket
// file with mode 0600, or loopback TCP), owned by one I/O thread that receives and decodes
// requests, calls the handler, and sends replies. Requests that do not decode get an ERROR reply
// from the transport itself; the handler only sees well-formed requests.
//
// Thread safety: the handler runs on the I/O thread and must not block it for long; to do slow
// work it hands the Request and its Responder to another thread. Responder is copyable and
// thread-safe: replying from any thread queues the frames and wakes the I/O thread, which sends
// them. A reply given while the handler runs on the I/O thread is sent as soon as the handler
// returns, without a wake-up (behind replies queued earlier). A request whose Responders are all
// destroyed unanswered gets an INTERNAL error reply, so a client never waits on a lost request.
// Bind, Start and Stop are for the owning thread.
//
//   KVCTL_ASSIGN_OR_RETURN(auto server, ZmqServer::Bind({.endpoint = "ipc:///run/kvctl.sock"}));
//   KVCTL_RETURN_IF_ERROR(server->Start([](Request req, Responder r) { r.Reply(PingReply{1}); }));
//   ...; server->Stop();
#ifndef KVCTL_IPC_SERVER_H_
#define KVCTL_IPC_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "ipc/messages.h"
#include "ipc/protocol.h"

namespace kvctl::ipc {

struct ServerOptions {
  std::string endpoint;  // ipc://PATH, tcp://127.0.0.1:PORT, tcp://localhost:PORT ("*" = any).
  int send_hwm = 1000;   // Replies queued per client; beyond it replies to that client are dropped.
  int recv_hwm = 1000;   // Requests queued per client before ZeroMQ stops reading from it.
  // ZMQ_MAXMSGSIZE: a peer that sends a bigger frame is disconnected (it sees a timeout).
  int64_t max_frame_bytes = kMaxTensorFrameBytes;
  // All frames of one request together; a bigger request is answered INVALID_ARGUMENT before the
  // handler sees it (max_frame_bytes alone would let kMaxFrames frames of that size through).
  uint64_t max_request_bytes = kMaxHeaderFrameBytes + 3 * uint64_t{kMaxTensorFrameBytes};
  int linger_ms = 1000;        // On close, how long unsent replies may still go out.
  int stop_timeout_ms = 5000;  // Stop(): how long to wait for unanswered requests.
};

// Monotonic counters (INFO "# IPC" section material).
struct ServerCounters {
  uint64_t requests_total = 0;  // Well-formed requests handed to the handler.
  uint64_t rejected_total = 0;  // Requests the transport answered with ERROR (malformed, stopping).
  uint64_t errors_total = 0;    // ERROR replies sent, transport and handler.
  uint64_t replies_total = 0;   // All replies sent.
  // Replies ZeroMQ refused: the client is gone, or it left send_hwm replies unread (a client that
  // pipelines requests must read its replies). Never counted in replies_total.
  uint64_t replies_dropped_total = 0;
  uint64_t bytes_in_total = 0;   // Request frames, routing envelope excluded.
  uint64_t bytes_out_total = 0;  // Reply frames, routing envelope excluded.
  uint64_t in_flight = 0;        // Handed to the handler, not answered yet (a gauge).
};

namespace internal {
class ReplyChannel;
struct Outgoing;
struct PendingRequest;
}  // namespace internal

class Responder {
 public:
  uint64_t request_id() const;
  MsgType request_type() const;

  // Encodes `msg` (any reply struct) and queues it. Only the first Reply or Error of a request is
  // sent; later calls return false. A reply that fails validation is our bug: the client gets an
  // INTERNAL error naming the bad field instead. Returns false if the server has shut down.
  template <typename M>
  bool Reply(M msg) {
    StatusOr<Frames> frames = Encode(request_id(), std::move(msg));
    if (!frames.ok()) {
      return Error(Internal("server built an invalid reply: ", frames.status().message()));
    }
    return Deliver(std::move(frames).value(), /*is_error=*/false);
  }

  // Queues an ERROR reply carrying `status` (an OK status is sent as INTERNAL).
  bool Error(const Status& status);

 private:
  friend class ZmqServer;
  explicit Responder(std::shared_ptr<internal::PendingRequest> pending);
  bool Deliver(Frames frames, bool is_error);

  std::shared_ptr<internal::PendingRequest> pending_;
};

class ZmqServer {
 public:
  using Handler = std::function<void(Request, Responder)>;

  // Validates the endpoint, claims the ipc path (ALREADY_EXISTS if a live server answers there,
  // a stale socket file is removed), binds the ROUTER and sets the socket file to 0600.
  // Errors: INVALID_ARGUMENT (endpoint, e.g. non-loopback TCP), ALREADY_EXISTS,
  // FAILED_PRECONDITION (path is not a socket), UNAVAILABLE (bind failed).
  static StatusOr<std::unique_ptr<ZmqServer>> Bind(ServerOptions options);

  // Stops (see Stop) and releases the endpoint.
  ~ZmqServer();

  // Starts the I/O thread. REQUIRES: called once, before Stop. FAILED_PRECONDITION otherwise.
  Status Start(Handler handler);

  // Stops reading new work (requests arriving now get UNAVAILABLE), waits up to stop_timeout_ms
  // for unanswered requests, sends what was answered, closes the socket and removes the socket
  // file. Idempotent. Responders that answer later are ignored.
  void Stop();

  // The bound endpoint, with a wildcard TCP port resolved ("tcp://127.0.0.1:40123").
  const std::string& endpoint() const { return endpoint_; }

  ServerCounters counters() const;

  ZmqServer(const ZmqServer&) = delete;
  ZmqServer& operator=(const ZmqServer&) = delete;

 private:
  ZmqServer() = default;
  void Run();
  void HandleIncoming(Frames frames, size_t discarded, bool draining);
  void SendDirect(const std::string& routing_id, bool delimiter, Frames& frames, bool is_error);
  // Sends every queued reply; returns the requests still unanswered. I/O thread only.
  int64_t FlushReplies();
  void Shutdown();

  // Constant after Bind.
  ServerOptions options_;
  std::string endpoint_;
  std::string ipc_path_;  // Empty for TCP.
  uint64_t ipc_inode_ = 0;
  // router_ belongs to the I/O thread once started.
  zmq::context_t ctx_;
  zmq::socket_t router_;
  std::shared_ptr<internal::ReplyChannel> channel_;
  std::vector<internal::Outgoing> flushing_;  // FlushReplies' buffer, reused (I/O thread only).
  Handler handler_;
  std::thread io_thread_;
  bool started_ = false;
  bool shut_down_ = false;
  std::atomic<bool> stopping_{false};
};

}  // namespace kvctl::ipc

#endif  // KVCTL_IPC_SERVER_H_
