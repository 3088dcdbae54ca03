// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/daemon/daemon.h
// Daemon: the long-running kvctl process around a Controller. A Boost.Asio io_context owns the
// signals (SIGTERM/SIGINT stop, SIGHUP reloads the config file) and the lease timer; the ZeroMQ
// ROUTER runs on its own I/O thread (ipc/server.h) and hands requests over: PING is answered right
// there, STATS goes to a thread of its own (with the PUB feed), everything else to a pool of
// server.workers threads, so neither a big prefill nor a big STATS stalls another client's ping.
//
// Operators see the same stats three ways: the STATS request, a ZeroMQ PUB stream
// (server.stats_endpoint, topic "stats", one frame of INFO text) and, when server.http_address is
// set, Prometheus /metrics and /healthz over loopback HTTP. The daemon logs one line per event on
// stderr (a SIGHUP logs each changed key with its old and new value) and tells a service manager
// READY=1, RELOADING=1 / READY=1 around a reload and STOPPING=1 (sd_notify.h); docs/operations.md.
//
// Stop order: stop reading requests, answer those in flight, join the workers, free every
// sequence and the shm pool, remove the socket file.
//
// Thread safety: Run() is called once, from one thread; RequestStop() from any thread.
//
//   KVCTL_ASSIGN_OR_RETURN(auto daemon, Daemon::Create(load_options));
//   return daemon->Run();  // Exit code.
#ifndef KVCTL_CONTROLLER_DAEMON_DAEMON_H_
#define KVCTL_CONTROLLER_DAEMON_DAEMON_H_

#include <atomic>
#include <memory>

#include "common/status.h"
#include "controller/config/config.h"
#include "controller/service/controller.h"
#include "ipc/server.h"

namespace kvctl {

class Daemon {
 public:
  // Loads nothing itself: `config` is already validated; `reload` says how SIGHUP rebuilds it
  // (the same file, environment and command-line overrides).
  static StatusOr<std::unique_ptr<Daemon>> Create(const Config& config, ConfigLoadOptions reload);
  ~Daemon();

  // Serves until SIGTERM/SIGINT or RequestStop(); returns the process exit code (0 on a clean
  // stop).
  int Run();
  void RequestStop();

  const std::string& endpoint() const { return server_->endpoint(); }

 private:
  Daemon(std::unique_ptr<Controller> controller, std::unique_ptr<ipc::ZmqServer> server,
         ConfigLoadOptions reload);
  void Handle(ipc::Request request, ipc::Responder responder);
  void Serve(ipc::Request& request, ipc::Responder& responder);
  // On the I/O thread: answers a light APPEND or blocks FETCH (Controller::Append / Fetch with
  // `deferred`) and returns true, or returns false with nothing done.
  bool ServeLight(ipc::Request& request, ipc::Responder& responder);
  // After a reply: hands the flushes an APPEND held (quant.flush_after_reply) to a worker.
  void RunHeldFlushesAfterReply();
  void Reload();
  // ZeroMQ PUB of the STATS text every server.stats_interval_ms (kvtop's feed); off when the
  // endpoint is "".
  Status StartStatsPublisher(const Config& config);

  std::unique_ptr<Controller> controller_;
  std::unique_ptr<ipc::ZmqServer> server_;
  ConfigLoadOptions reload_;
  struct Impl;  // Asio objects.
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_DAEMON_DAEMON_H_
