// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/daemon/dump_stats.h
// `kvctl --dump-stats`: what support asks for, from the running daemon, in one text on stdout:
// this binary's version, the daemon's version, pid and uptime, the daemon's effective config (the
// STATS section "config"; a daemon without it gets the config this command resolved, marked as
// such) and one full STATS snapshot. When no daemon answers, one message on stderr names the
// endpoint, what was found there and what to check.
//
// Thread safety: call from one thread.
//
//   return DumpStats(config, /*timeout_ms=*/5000, stdout, stderr);  // Exit code.
#ifndef KVCTL_CONTROLLER_DAEMON_DUMP_STATS_H_
#define KVCTL_CONTROLLER_DAEMON_DUMP_STATS_H_

#include <cstdio>

#include "controller/config/config.h"

namespace kvctl {

// Asks the daemon on config.server.endpoint; returns 0 after printing the report on `out`, 1 after
// printing the reason on `err`.
int DumpStats(const Config& config, int timeout_ms, std::FILE* out, std::FILE* err);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_DAEMON_DUMP_STATS_H_
