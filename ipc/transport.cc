// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "ipc/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace kvctl::ipc {
namespace {

constexpr std::string_view kIpcPrefix = "ipc://";
constexpr std::string_view kTcpPrefix = "tcp://";

Status ParseIpcPath(std::string_view endpoint, std::string_view path, Endpoint* out) {
  if (path.empty() || path == "*") {
    return InvalidArgument("endpoint ", endpoint, ": expected ipc://PATH with a socket file path");
  }
  if (path.front() == '@') {
    // Abstract sockets have no file, hence no 0600 mode: any local user could connect.
    return InvalidArgument("endpoint ", endpoint, ": abstract Unix sockets (@name) are not ",
                           "supported, expected a file path");
  }
  if (path.find('\0') != std::string_view::npos) {
    return InvalidArgument("endpoint ", endpoint, ": path contains a NUL byte");
  }
  constexpr size_t kMaxPath = sizeof(sockaddr_un::sun_path) - 1;
  if (path.size() > kMaxPath) {
    return InvalidArgument("endpoint ", endpoint, ": path is ", path.size(),
                           " bytes, expected at most ", kMaxPath, " (Unix socket limit)");
  }
  out->kind = Endpoint::Kind::kIpc;
  out->ipc_path = std::string(path);
  out->address = std::string(kIpcPrefix) + out->ipc_path;
  return OkStatus();
}

// Splits "HOST:PORT" or "[V6]:PORT"; checks PORT (1..65535, or "*" if allowed).
Status SplitHostPort(std::string_view endpoint, std::string_view rest, bool allow_wildcard_port,
                     std::string_view* host, std::string_view* port) {
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return InvalidArgument("endpoint ", endpoint, ": expected tcp://HOST:PORT");
  }
  *host = rest.substr(0, colon);
  *port = rest.substr(colon + 1);
  if (*port == "*" && allow_wildcard_port) return OkStatus();
  int value = 0;
  bool digits = !port->empty() && port->size() <= 5;
  for (char c : *port) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) value = value * 10 + (c - '0');
  }
  if (!digits || value < 1 || value > 65535) {
    return InvalidArgument("endpoint ", endpoint, ": port: got \"", *port, "\", expected 1..65535",
                           allow_wildcard_port ? " or *" : "");
  }
  return OkStatus();
}

// The part both sides share: an ipc:// endpoint is complete (returns true); a tcp:// one is split
// into host and port for the caller to finish.
StatusOr<bool> ParseIpcOrSplitTcp(std::string_view endpoint, bool bind, Endpoint* ep,
                                  std::string_view* host, std::string_view* port) {
  if (endpoint.starts_with(kIpcPrefix)) {
    KVCTL_RETURN_IF_ERROR(ParseIpcPath(endpoint, endpoint.substr(kIpcPrefix.size()), ep));
    return true;
  }
  if (!endpoint.starts_with(kTcpPrefix)) {
    return InvalidArgument("endpoint: got \"", endpoint, "\", expected ipc://PATH or ",
                           bind ? "tcp://127.0.0.1:PORT" : "tcp://HOST:PORT");
  }
  KVCTL_RETURN_IF_ERROR(
      SplitHostPort(endpoint, endpoint.substr(kTcpPrefix.size()), bind, host, port));
  ep->kind = Endpoint::Kind::kTcp;
  return false;
}

}  // namespace

StatusOr<Endpoint> ParseBindEndpoint(std::string_view endpoint) {
  Endpoint ep;
  std::string_view host, port;
  KVCTL_ASSIGN_OR_RETURN(const bool done,
                         ParseIpcOrSplitTcp(endpoint, /*bind=*/true, &ep, &host, &port));
  if (done) return ep;
  in_addr v4;
  const std::string host_str(host);
  if (host == "localhost") {
    ep.address = "tcp://127.0.0.1:" + std::string(port);
  } else if (host == "[::1]") {
    ep.address = "tcp://[::1]:" + std::string(port);
    ep.ipv6 = true;
  } else if (inet_pton(AF_INET, host_str.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) {
    ep.address = "tcp://" + host_str + ":" + std::string(port);
  } else {
    return InvalidArgument("endpoint ", endpoint, ": host \"", host, "\" is not a loopback ",
                           "address; kvctl serves TCP only on 127.0.0.0/8, localhost or [::1] ",
                           "(remote TCP needs CurveZMQ, which is not supported yet)");
  }
  return ep;
}

StatusOr<Endpoint> ParseConnectEndpoint(std::string_view endpoint) {
  Endpoint ep;
  std::string_view host, port;
  KVCTL_ASSIGN_OR_RETURN(const bool done,
                         ParseIpcOrSplitTcp(endpoint, /*bind=*/false, &ep, &host, &port));
  if (done) return ep;
  ep.ipv6 = host.starts_with('[');
  ep.address = std::string(endpoint);
  return ep;
}

Status ClaimIpcPath(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return OkStatus();
    return FailedPrecondition("ipc path ", path, ": stat failed: ", std::strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return FailedPrecondition("ipc path ", path, ": exists and is not a socket; refusing to ",
                              "replace it");
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return FailedPrecondition("ipc path ", path, ": socket(): ", std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());  // Length checked by ParseIpcPath.
  const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  close(fd);
  if (rc == 0 || err == EAGAIN) {  // EAGAIN: a listener whose backlog is full is still alive.
    return AlreadyExists("ipc path ", path, ": a server is already listening there");
  }
  if (err != ECONNREFUSED) {
    return FailedPrecondition("ipc path ", path,
                              ": cannot probe the existing socket: ", std::strerror(err));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return FailedPrecondition("ipc path ", path,
                              ": cannot remove the stale socket file: ", std::strerror(errno));
  }
  return OkStatus();
}

bool RecvMessage(zmq::socket_t& socket, Frames* out, size_t max_frames, size_t* discarded) {
  zmq::message_t msg;
  if (!socket.recv(msg, zmq::recv_flags::dontwait)) return false;
  out->clear();
  *discarded = 0;
  for (;;) {
    const bool more = msg.more();
    if (out->size() < max_frames) {
      out->push_back(std::move(msg));
    } else {
      ++*discarded;
    }
    if (!more) return true;
    msg = zmq::message_t();
    // The rest of a multipart message arrives atomically with its first part.
    if (!socket.recv(msg, zmq::recv_flags::dontwait)) return true;
  }
}

bool SendMessage(zmq::socket_t& socket, std::span<zmq::message_t> prefix, Frames& frames) {
  const size_t total = prefix.size() + frames.size();
  size_t sent = 0;
  for (std::span<zmq::message_t> part : {prefix, std::span<zmq::message_t>(frames)}) {
    for (zmq::message_t& frame : part) {
      const bool last = ++sent == total;
      const auto flags =
          last ? zmq::send_flags::dontwait : (zmq::send_flags::dontwait | zmq::send_flags::sndmore);
      if (!socket.send(frame, flags)) return false;
    }
  }
  return true;
}

uint64_t TotalBytes(const Frames& frames) {
  uint64_t total = 0;
  for (const zmq::message_t& f : frames) total += f.size();
  return total;
}

WaitResult WaitForInput(zmq::socket_t& socket, int wake_fd, int timeout_ms) {
  WaitResult r;
  if (socket.get(zmq::sockopt::events) & ZMQ_POLLIN) {
    r.readable = true;
    return r;
  }
  pollfd fds[2] = {{socket.get(zmq::sockopt::fd), POLLIN, 0}, {wake_fd, POLLIN, 0}};
  const int n = ::poll(fds, wake_fd >= 0 ? 2 : 1, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return r;
    throw zmq::error_t();
  }
  r.woken = wake_fd >= 0 && (fds[1].revents & POLLIN) != 0;
  // The ZMQ_FD edge (or a timeout) says only that the socket's state may have changed.
  if (n > 0 && (fds[0].revents & POLLIN) != 0) {
    r.readable = (socket.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  }
  return r;
}

}  // namespace kvctl::ipc
