// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/daemon/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace kvctl {

Status SdNotify(std::string_view state) {
  const char* env = std::getenv("NOTIFY_SOCKET");
  if (env == nullptr || env[0] == '\0') return OkStatus();
  const std::string_view name(env);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if ((name[0] != '/' && name[0] != '@') || name.size() > sizeof(addr.sun_path) - 1) {
    return InvalidArgument("NOTIFY_SOCKET: got \"", name,
                           "\", expected an absolute socket path "
                           "or an @abstract name of at most ",
                           sizeof(addr.sun_path) - 1, " bytes");
  }
  std::memcpy(addr.sun_path, name.data(), name.size());
  // An abstract name starts with a NUL byte and is exactly as long as given (no terminator).
  if (name[0] == '@') addr.sun_path[0] = '\0';
  const socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() +
                                                  (name[0] == '@' ? 0 : 1));
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable("NOTIFY_SOCKET: socket(): ", std::strerror(errno));
  const ssize_t sent = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                              reinterpret_cast<const sockaddr*>(&addr), length);
  const int error = errno;
  close(fd);
  if (sent != static_cast<ssize_t>(state.size())) {
    return Unavailable("NOTIFY_SOCKET ", name, ": cannot send \"", state,
                       "\": ", sent < 0 ? std::strerror(error) : "short write");
  }
  return OkStatus();
}

std::string SdReloadingState() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const long long usec = static_cast<long long>(now.tv_sec) * 1000000 + now.tv_nsec / 1000;
  return "RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec);
}

}  // namespace kvctl
