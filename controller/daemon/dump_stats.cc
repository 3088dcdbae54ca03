// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/daemon/dump_stats.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>

#include "controller/service/controller.h"
#include "ipc/client.h"

namespace kvctl {
namespace {

using internal::StrCat;

// The value of a `field:value` line of a STATS text; "?" if there is none.
std::string Field(std::string_view text, std::string_view field) {
  const std::string key = StrCat(field, ":");
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    if (line.starts_with(key)) return std::string(line.substr(key.size()));
    at = end + 1;
  }
  return "?";
}

// What is at an ipc:// endpoint's socket file, for the error when nothing answered there.
std::string DescribeIpcPath(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return StrCat("the socket file ", path, " does not exist (", std::strerror(errno), ")");
  }
  if (!S_ISSOCK(st.st_mode)) return StrCat(path, " exists but is not a socket");
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool listening =
      fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  const int error = errno;
  if (fd >= 0) close(fd);
  if (!listening) {
    return StrCat("the socket file ", path, " exists but nothing accepts connections on it (",
                  std::strerror(error),
                  "): a daemon that died left it, or this user may not "
                  "open it (mode 0600, the daemon's user only)");
  }
  return StrCat("a process listens on ", path, " but sent no reply (a busy daemon, or not kvctl)");
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

int DumpStats(const Config& config, int timeout_ms, std::FILE* out, std::FILE* err) {
  const std::string& endpoint = config.server.endpoint;
  StatusOr<std::unique_ptr<ipc::Client>> client = ipc::Client::Connect(endpoint, timeout_ms);
  if (!client.ok()) {
    std::fprintf(err, "kvctl: --dump-stats: server.endpoint %s: %s\n", endpoint.c_str(),
                 client.status().message().c_str());
    return 1;
  }
  StatusOr<std::string> stats = (*client)->Stats();
  if (!stats.ok()) {
    const StatusCode code = stats.status().code();
    if (code == StatusCode::kDeadlineExceeded || code == StatusCode::kUnavailable) {
      const std::string found =
          endpoint.starts_with("ipc://") ? DescribeIpcPath(endpoint.substr(6)) : "";
      std::fprintf(err,
                   "kvctl: --dump-stats: no kvctl daemon answered on %s within %d ms%s%s.\n"
                   "Check that the daemon runs (systemctl status kvctl, or pgrep -a kvctl), that "
                   "it serves this endpoint (server.endpoint, from --config, --set or "
                   "KVCTL_SERVER_ENDPOINT as given to the daemon; its log says \"serving on "
                   "...\"), and that this user may open it; --timeout-ms waits longer.\n",
                   endpoint.c_str(), timeout_ms, found.empty() ? "" : ": ", found.c_str());
    } else {
      std::fprintf(err, "kvctl: --dump-stats: the daemon on %s refused STATS: %s\n",
                   endpoint.c_str(), stats.status().ToString().c_str());
    }
    return 1;
  }
  // A daemon older than the "config" section answers INVALID_ARGUMENT: then the config this
  // command resolved is the best there is, and the report says so.
  StatusOr<std::string> daemon_config = (*client)->Stats(0, "config");
  std::fprintf(out,
               "# kvctl --dump-stats: a support snapshot of the daemon on %s, taken %s\n"
               "# this tool: kvctl %s, protocol %u\n"
               "# daemon: kvctl %s, protocol %s, pid %s, up %s s\n",
               endpoint.c_str(), UtcNow().c_str(), kKvctlVersion,
               static_cast<unsigned>(ipc::kProtocolVersion), Field(*stats, "kvctl_version").c_str(),
               Field(*stats, "protocol_version").c_str(), Field(*stats, "pid").c_str(),
               Field(*stats, "uptime_s").c_str());
  if (daemon_config.ok()) {
    std::fprintf(out, "\n# ---- The daemon's effective config (STATS section \"config\")\n%s",
                 daemon_config->c_str());
  } else {
    std::fprintf(out,
                 "\n# ---- The daemon did not send its config (%s); this is the config this "
                 "command resolved from --config, --set and KVCTL_*, which may differ\n%s",
                 daemon_config.status().ToString().c_str(), PrintConfig(config).c_str());
  }
  std::fprintf(out, "\n# ---- STATS\n%s", stats->c_str());
  return std::fflush(out) == 0 ? 0 : 1;
}

}  // namespace kvctl
