// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "ipc/server.h"

#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "common/thread_annotations.h"
#include "common/tsan_hand_off.h"
#include "ipc/transport.h"

namespace kvctl::ipc {
namespace internal {

// A reply on its way from any thread to the I/O thread.
struct Outgoing {
  std::string routing_id;
  bool delimiter = false;  // The request came from a REQ socket: echo the empty frame.
  Frames frames;
  bool is_error = false;
};

// The queue between Responders (any thread) and the I/O thread. Pushing and the in-flight count
// change under one mutex, so the I/O thread never sees "nothing in flight, queue empty" while an
// answer is on its way. An eventfd wakes the I/O thread: it polls it beside the ROUTER's ZMQ_FD
// (WaitForInput), which costs less per request than a second ZeroMQ socket in zmq_poll.
class ReplyChannel {
 public:
  ReplyChannel() : wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~ReplyChannel() { Close(); }

  // False if the eventfd could not be made (Bind fails then).
  bool ok() const { return wake_fd_ >= 0; }
  // The I/O thread polls it; valid until Close.
  int wake_fd() const { return wake_fd_; }

  void BeginRequest() KVCTL_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    ++in_flight_;
  }

  // Queues an answer to a request counted by BeginRequest. False once closed. An answer given on
  // the I/O thread while it runs the handler (`inline_answer`) wakes nobody: that thread sends it
  // as soon as the handler returns (ZmqServer::HandleIncoming), behind anything queued earlier.
  bool Answer(Outgoing out, bool inline_answer) KVCTL_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    --in_flight_;
    if (closed_) return false;
    const bool was_empty = items_.empty();
    items_.push_back(std::move(out));
    if (was_empty && !inline_answer) WakeLocked();
    return true;
  }

  // Moves everything queued into *out (REQUIRES: empty; its capacity goes back to the queue, so
  // that a steady stream of replies allocates nothing) and returns the number of requests still
  // unanswered after it.
  int64_t TakeAll(std::vector<Outgoing>* out) KVCTL_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    items_.swap(*out);
    return in_flight_;
  }

  int64_t in_flight() const KVCTL_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return in_flight_;
  }

  void Wake() KVCTL_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (!closed_) WakeLocked();
  }

  // I/O thread, after WaitForInput said woken: resets the eventfd (its counter; one read).
  void ClearWake() {
    uint64_t count = 0;
    (void)!read(wake_fd_, &count, sizeof(count));
  }

  void Close() KVCTL_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    closed_ = true;
    items_.clear();
    if (wake_fd_ >= 0) close(wake_fd_);
    wake_fd_ = -1;
  }

  // Written by the I/O thread only; read by counters().
  std::atomic<uint64_t> requests{0}, rejected{0}, errors{0}, replies{0}, dropped{0}, bytes_in{0},
      bytes_out{0};

 private:
  void WakeLocked() KVCTL_REQUIRES(mu_) {
    // Adds 1 to the counter; it cannot overflow (the I/O thread clears it), and a write that
    // would block finds the counter already non-zero, which is all a wake-up needs.
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  mutable Mutex mu_;
  // Not guarded: set before any thread sees the channel, -1 after Close (closed_ guards writers;
  // the I/O thread, its only reader, calls Close itself when it has stopped polling).
  int wake_fd_;
  std::vector<Outgoing> items_ KVCTL_GUARDED_BY(mu_);
  int64_t in_flight_ KVCTL_GUARDED_BY(mu_) = 0;
  bool closed_ KVCTL_GUARDED_BY(mu_) = false;
};

// The channel whose I/O thread is running a handler on this thread right now, else null: set by
// ZmqServer::HandleIncoming around the handler call.
thread_local const ReplyChannel* tls_handler_channel = nullptr;

struct PendingRequest {
  std::shared_ptr<ReplyChannel> channel;
  std::string routing_id;
  bool delimiter = false;
  uint64_t request_id = 0;
  MsgType type = MsgType::kPing;
  std::atomic<bool> answered{false};

  bool Answer(Frames frames, bool is_error) {
    if (answered.exchange(true)) return false;
    return channel->Answer({std::move(routing_id), delimiter, std::move(frames), is_error},
                           /*inline_answer=*/tls_handler_channel == channel.get());
  }

  ~PendingRequest() {
    if (!answered.load()) {
      Answer(EncodeError(request_id, Internal("the server dropped ", TypeName(uint16_t(type)),
                                              " request ", request_id, " without a reply")),
             true);
    }
  }
};

}  // namespace internal

// ---- Responder
// -----------------------------------------------------------------------------------

Responder::Responder(std::shared_ptr<internal::PendingRequest> pending)
    : pending_(std::move(pending)) {}

uint64_t Responder::request_id() const { return pending_->request_id; }
MsgType Responder::request_type() const { return pending_->type; }

bool Responder::Error(const Status& status) {
  return Deliver(EncodeError(request_id(), status), /*is_error=*/true);
}

bool Responder::Deliver(Frames frames, bool is_error) {
  return pending_->Answer(std::move(frames), is_error);
}

// ---- ZmqServer
// -----------------------------------------------------------------------------------

StatusOr<std::unique_ptr<ZmqServer>> ZmqServer::Bind(ServerOptions options) {
  KVCTL_ASSIGN_OR_RETURN(Endpoint ep, ParseBindEndpoint(options.endpoint));
  if (ep.kind == Endpoint::Kind::kIpc) KVCTL_RETURN_IF_ERROR(ClaimIpcPath(ep.ipc_path));
  std::unique_ptr<ZmqServer> s(new ZmqServer());
  s->options_ = options;
  try {
    s->ctx_ = zmq::context_t(1);
    s->router_ = zmq::socket_t(s->ctx_, zmq::socket_type::router);
    s->router_.set(zmq::sockopt::linger, options.linger_ms);
    s->router_.set(zmq::sockopt::sndhwm, options.send_hwm);
    s->router_.set(zmq::sockopt::rcvhwm, options.recv_hwm);
    s->router_.set(zmq::sockopt::maxmsgsize, options.max_frame_bytes);
    // Without it ROUTER drops a reply to a full or vanished peer silently; with it the send fails
    // and SendDirect counts the drop.
    s->router_.set(zmq::sockopt::router_mandatory, 1);
    if (ep.ipv6) s->router_.set(zmq::sockopt::ipv6, 1);
    s->router_.bind(ep.address);
    s->endpoint_ = s->router_.get(zmq::sockopt::last_endpoint);
    s->channel_ = std::make_shared<internal::ReplyChannel>();
    if (!s->channel_->ok()) {
      return Unavailable("bind ", options.endpoint, ": eventfd: ", std::strerror(errno));
    }
  } catch (const zmq::error_t& e) {
    return Unavailable("bind ", options.endpoint, ": ", e.what());
  }
  if (ep.kind == Endpoint::Kind::kIpc) {
    s->ipc_path_ = ep.ipc_path;
    struct stat st;
    if (lstat(ep.ipc_path.c_str(), &st) != 0) {
      return Unavailable("ipc path ", ep.ipc_path, ": missing after bind: ", std::strerror(errno));
    }
    s->ipc_inode_ = st.st_ino;  // Recorded first, so that a failed chmod still removes the file.
    // Clients of other users must not reach the pool; the window before chmod is the bind call.
    if (chmod(ep.ipc_path.c_str(), 0600) != 0) {
      return FailedPrecondition("ipc path ", ep.ipc_path,
                                ": cannot set mode 0600: ", std::strerror(errno));
    }
  }
  return s;
}

ZmqServer::~ZmqServer() { Stop(); }

Status ZmqServer::Start(Handler handler) {
  if (started_ || shut_down_) {
    return FailedPrecondition("ZmqServer::Start: already ", started_ ? "started" : "stopped");
  }
  if (!handler) return InvalidArgument("ZmqServer::Start: handler is empty");
  handler_ = std::move(handler);
  started_ = true;
  io_thread_ = std::thread([this] { Run(); });
  return OkStatus();
}

void ZmqServer::Stop() {
  if (shut_down_) return;
  shut_down_ = true;
  if (started_) {
    stopping_.store(true);
    channel_->Wake();
    io_thread_.join();
  } else {
    Shutdown();
  }
  // Remove only the file this server created: a new server may already own the path.
  struct stat st;
  if (!ipc_path_.empty() && lstat(ipc_path_.c_str(), &st) == 0 && st.st_ino == ipc_inode_) {
    unlink(ipc_path_.c_str());
  }
  ctx_.close();
}

ServerCounters ZmqServer::counters() const {
  const internal::ReplyChannel& c = *channel_;
  ServerCounters out;
  out.requests_total = c.requests.load();
  out.rejected_total = c.rejected.load();
  out.errors_total = c.errors.load();
  out.replies_total = c.replies.load();
  out.replies_dropped_total = c.dropped.load();
  out.bytes_in_total = c.bytes_in.load();
  out.bytes_out_total = c.bytes_out.load();
  out.in_flight = static_cast<uint64_t>(c.in_flight());
  return out;
}

void ZmqServer::Shutdown() {
  router_.close();  // Lingers up to linger_ms for replies already queued.
  if (channel_) channel_->Close();
}

void ZmqServer::SendDirect(const std::string& routing_id, bool delimiter, Frames& frames,
                           bool is_error) {
  zmq::message_t prefix[2] = {zmq::message_t(routing_id.data(), routing_id.size()),
                              zmq::message_t()};
  const uint64_t bytes = TotalBytes(frames);
  for (const zmq::message_t& frame : frames) TsanHandOff(frame.data());
  bool sent = false;
  try {
    // Never blocks: a reply to a vanished client (EHOSTUNREACH) or to one whose send_hwm replies
    // are unread (EAGAIN) is dropped and counted, so one slow reader cannot stall the others.
    sent = SendMessage(router_, std::span(prefix, delimiter ? 2 : 1), frames);
  } catch (const zmq::error_t&) {
    sent = false;
  }
  if (!sent) {
    channel_->dropped.fetch_add(1);
    return;
  }
  channel_->replies.fetch_add(1);
  channel_->bytes_out.fetch_add(bytes);
  if (is_error) channel_->errors.fetch_add(1);
}

void ZmqServer::HandleIncoming(Frames frames, size_t discarded, bool draining) {
  if (frames.empty()) return;
  std::string routing_id(static_cast<const char*>(frames[0].data()), frames[0].size());
  frames.erase(frames.begin());
  // A REQ client puts an empty delimiter first; a header frame is never empty.
  const bool delimiter = !frames.empty() && frames[0].size() == 0;
  if (delimiter) frames.erase(frames.begin());

  const uint64_t peek_id = frames.empty() ? 0 : PeekRequestId(frames[0]);
  const uint64_t request_bytes = TotalBytes(frames);
  channel_->bytes_in.fetch_add(request_bytes);
  Status reject;
  if (frames.empty()) {
    reject = InvalidArgument("message: no frames after the routing envelope");
  } else if (request_bytes > options_.max_request_bytes) {
    reject = InvalidArgument("request: ", request_bytes, " bytes in ", frames.size(),
                             " frames, expected at most ", options_.max_request_bytes,
                             " (server.max_message_bytes)");
  } else if (discarded > 0) {
    reject = InvalidArgument("frame count: got more than ", kMaxFrames, " (", discarded,
                             " extra), expected at most ", kMaxFrames);
  } else if (draining) {
    reject = Unavailable("the server is stopping");
  }
  StatusOr<Request> request = reject.ok() ? DecodeRequest(std::move(frames)) : reject;
  if (!request.ok()) {
    channel_->rejected.fetch_add(1);
    Frames error = EncodeError(peek_id, request.status());
    SendDirect(routing_id, delimiter, error, true);
    return;
  }
  auto pending = std::make_shared<internal::PendingRequest>();
  pending->channel = channel_;
  pending->routing_id = std::move(routing_id);
  pending->delimiter = delimiter;
  pending->request_id = request->request_id;
  pending->type = TypeOf(request->body);
  channel_->BeginRequest();
  channel_->requests.fetch_add(1);
  internal::tls_handler_channel = channel_.get();
  {
    Responder responder(std::move(pending));
    try {
      handler_(std::move(request).value(), responder);
    } catch (const std::exception& e) {
      // Exceptions stop at the ipc edge; the client still gets an answer.
      responder.Error(Internal("request handler threw: ", e.what()));
    }
  }  // A Responder dropped unanswered here answers INTERNAL, inline too.
  internal::tls_handler_channel = nullptr;
  // A reply given by the handler on this thread goes out now, with no wake-up and no second poll
  // (it was queued behind any earlier replies from other threads, which go first).
  FlushReplies();
}

int64_t ZmqServer::FlushReplies() {
  const int64_t in_flight = channel_->TakeAll(&flushing_);
  for (internal::Outgoing& out : flushing_) {
    SendDirect(out.routing_id, out.delimiter, out.frames, out.is_error);
  }
  flushing_.clear();
  return in_flight;
}

void ZmqServer::Run() {
  using Clock = std::chrono::steady_clock;
  bool draining = false;
  Clock::time_point deadline;
  Frames frames;
  for (;;) {
    if (!draining && stopping_.load()) {
      draining = true;
      deadline = Clock::now() + std::chrono::milliseconds(options_.stop_timeout_ms);
    }
    const int64_t in_flight = FlushReplies();
    int timeout_ms = -1;
    if (draining) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (in_flight == 0 || left.count() <= 0) break;
      timeout_ms = static_cast<int>(left.count());
    }
    try {
      // One request per turn: replies other threads queued go out between requests, and the
      // ZMQ_EVENTS check at the top of WaitForInput is the only test for the next request (a
      // receive that fails would cost one more mailbox poll).
      const WaitResult wait = WaitForInput(router_, channel_->wake_fd(), timeout_ms);
      if (wait.woken) channel_->ClearWake();
      size_t discarded = 0;
      if (wait.readable && RecvMessage(router_, &frames, kMaxFrames + 2, &discarded)) {
        HandleIncoming(std::move(frames), discarded, draining);
        frames = Frames();
      }
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) break;  // ETERM cannot happen: Stop joins before closing the context.
    }
  }
  Shutdown();
}

}  // namespace kvctl::ipc
