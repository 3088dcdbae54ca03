// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvtop_ui.h
// kvtop's live mode: a feed thread subscribes to the daemon's stats PUB stream (falling back to
// STATS requests on the request socket when the stream is silent) and the ncurses UI thread paints
// tools/kvtop_render.h layouts once a second and on every key. A daemon that goes away shows a
// "kvctl not reachable at ...; retrying" screen; when it comes back on the same endpoints the SUB
// socket reconnects by itself and the data returns.
//
// Thread safety: StatsFeed's public methods may be called from any thread; RunUi owns the terminal
// and must run on one thread, once at a time.
//
//   UiOptions options{.stats_endpoint = "ipc:///tmp/kvctl-stats.sock",
//                     .endpoint = "ipc:///tmp/kvctl.sock"};
//   return RunUi(options);
#ifndef KVCTL_TOOLS_KVTOP_UI_H_
#define KVCTL_TOOLS_KVTOP_UI_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "common/thread_annotations.h"

namespace kvctl::kvtop {

struct UiOptions {
  std::string stats_endpoint;    // ZeroMQ PUB endpoint of the daemon; "" = requests only.
  std::string endpoint;          // Request endpoint, for the STATS fallback.
  bool color = true;             // false: bold/reverse only (--no-color).
  int request_timeout_ms = 500;  // Per fallback STATS request.
};

// The stats feed: newest stats text with its arrival time and source.
class StatsFeed {
 public:
  using Clock = std::chrono::steady_clock;
  struct Message {
    uint64_t seq = 0;  // Increases by one per message.
    std::string text;
    Clock::time_point at;
    bool from_pub = true;  // false: from a STATS request.
  };

  // Starts the feed thread.
  explicit StatsFeed(UiOptions options);
  ~StatsFeed();  // Stops and joins the thread.
  StatsFeed(const StatsFeed&) = delete;
  StatsFeed& operator=(const StatsFeed&) = delete;

  // The newest message if its seq is above `after`.
  std::optional<Message> Newest(uint64_t after) const KVCTL_EXCLUDES(mu_);
  // How long to wait without a message before calling the daemon unreachable: 3 s, or 3 observed
  // publish intervals when those are longer.
  std::chrono::milliseconds StaleAfter() const KVCTL_EXCLUDES(mu_);
  // The last failure of a fallback request ("" if none).
  std::string LastError() const KVCTL_EXCLUDES(mu_);

 private:
  void Loop() KVCTL_EXCLUDES(mu_);
  void Publish(std::string text, bool from_pub) KVCTL_EXCLUDES(mu_);
  void SetError(std::string error) KVCTL_EXCLUDES(mu_);

  const UiOptions options_;
  std::atomic<bool> stop_{false};
  mutable Mutex mu_;
  Message newest_ KVCTL_GUARDED_BY(mu_);
  // The last gap between PUB messages.
  std::chrono::milliseconds interval_ KVCTL_GUARDED_BY(mu_){0};
  std::string last_error_ KVCTL_GUARDED_BY(mu_);
  std::thread thread_;  // Last member: started when the rest is ready.
};

// Runs the full-screen monitor until q (or SIGINT/SIGTERM). Returns the process exit code.
int RunUi(const UiOptions& options);

}  // namespace kvctl::kvtop

#endif  // KVCTL_TOOLS_KVTOP_UI_H_
