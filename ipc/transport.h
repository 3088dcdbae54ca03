// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: ipc/transport.h
// Endpoint rules and socket helpers shared by ZmqServer and Client. The server binds only local
// endpoints: `ipc://PATH` (a Unix socket file) or loopback TCP (`tcp://127.0.0.1:PORT`,
// `tcp://localhost:PORT`, `tcp://[::1]:PORT`; PORT may be `*` for an ephemeral port). Remote TCP
// needs CurveZMQ, which kvctl does not do yet, so any other host is refused.
//
// Thread safety: free functions; the socket helpers need the caller to own the socket.
//
//   KVCTL_ASSIGN_OR_RETURN(Endpoint ep, ParseBindEndpoint("ipc:///run/kvctl/kvctl.sock"));
//   KVCTL_RETURN_IF_ERROR(ClaimIpcPath(ep.ipc_path));  // Refuses a live server, removes stale.
#ifndef KVCTL_IPC_TRANSPORT_H_
#define KVCTL_IPC_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <zmq.hpp>

#include "common/status.h"
#include "ipc/protocol.h"

namespace kvctl::ipc {

struct Endpoint {
  enum class Kind { kIpc, kTcp };
  Kind kind = Kind::kIpc;
  std::string address;   // What ZeroMQ binds or connects: "ipc:///x.sock", "tcp://127.0.0.1:5555".
  std::string ipc_path;  // kIpc only: the socket file.
  bool ipv6 = false;     // kTcp to an IPv6 address (sets ZMQ_IPV6).
};

// Server side. INVALID_ARGUMENT for a malformed endpoint, another transport, a path too long for
// a Unix socket, or a TCP host that is not loopback (the message says why).
StatusOr<Endpoint> ParseBindEndpoint(std::string_view endpoint);

// Client side: ipc://PATH or tcp://HOST:PORT with any host.
StatusOr<Endpoint> ParseConnectEndpoint(std::string_view endpoint);

// Makes `path` free for bind: OK if it does not exist; removes a stale socket file nobody listens
// on. ALREADY_EXISTS if a server accepts connections there; FAILED_PRECONDITION if the path is not
// a socket or cannot be probed or removed.
Status ClaimIpcPath(const std::string& path);

// Receives one multipart message without blocking; false if none was waiting. Keeps the first
// `max_frames` frames and discards the rest, counting them in *discarded.
bool RecvMessage(zmq::socket_t& socket, Frames* out, size_t max_frames, size_t* discarded);

// Queues `frames` as one multipart message without blocking; false if the socket would block.
// `prefix` frames (routing id, delimiter) go first.
bool SendMessage(zmq::socket_t& socket, std::span<zmq::message_t> prefix, Frames& frames);

uint64_t TotalBytes(const Frames& frames);

// What WaitForInput found.
struct WaitResult {
  bool readable = false;  // `socket` has a message to receive now.
  bool woken = false;     // `wake_fd` was readable (the caller clears it).
};

// Waits up to `timeout_ms` (-1: forever) until `socket` has a message to receive or `wake_fd`
// (ignored if < 0) is readable. It checks ZMQ_EVENTS first and returns at once if a message is
// waiting; otherwise it blocks in poll(2) on the socket's ZMQ_FD (edge-triggered: it only says
// "check ZMQ_EVENTS again", which this does) and `wake_fd`. zmq_poll first polls every item with
// timeout 0 and checks ZMQ_EVENTS of each ZeroMQ item before and after blocking (each check of an
// idle socket is a poll(2) and a getpid(2) inside libzmq): with this wait the daemon's I/O thread
// makes 13 system calls per request instead of 20 (docs/kvbench_ipc.md "The request path, third
// round"). May return with nothing to do (a signal, a timeout, a command that made nothing
// readable): callers loop.
// Throws zmq::error_t like the socket calls; EINTR from poll(2) returns an empty result.
WaitResult WaitForInput(zmq::socket_t& socket, int wake_fd, int timeout_ms);

}  // namespace kvctl::ipc

#endif  // KVCTL_IPC_TRANSPORT_H_
