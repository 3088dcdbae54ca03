// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/daemon/daemon.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <zmq.hpp>

#include "common/log.h"
#include "controller/daemon/http_server.h"
#include "controller/daemon/sd_notify.h"
#include "controller/service/dispatch.h"
#include "controller/service/periodic_thread.h"
#include "controller/service/scrubber.h"
#include "controller/stats/metrics.h"
#include "ipc/transport.h"

namespace kvctl {

struct Daemon::Impl {
  boost::asio::io_context io;
  boost::asio::signal_set signals{io, SIGINT, SIGTERM, SIGHUP};
  boost::asio::steady_timer lease_timer{io};
  boost::asio::steady_timer stats_timer{io};
  std::unique_ptr<boost::asio::thread_pool> workers;
  // Requests posted to `workers` and not finished: a light APPEND is answered on the I/O thread
  // only when this is 0, so it never overtakes an earlier request.
  std::atomic<int64_t> on_workers{0};
  LightLimits light;  // server.inline_* (restart to change).
  // STATS (request, PUB feed and /metrics alike) on a thread of its own: however long a report
  // of a big daemon takes, it delays neither the socket nor APPEND/FETCH.
  std::unique_ptr<boost::asio::thread_pool> stats_worker;
  // The stats publisher: the socket is used only from stats_worker.
  zmq::context_t zmq_ctx;
  zmq::socket_t pub;
  std::atomic<bool> publishing{false};
  std::string pub_path;  // ipc:// socket file to remove at stop, if it is still ours:
  ino_t pub_inode = 0;   // a later daemon may have replaced a file this one left.
  std::unique_ptr<HttpServer> http;

  ~Impl() {
    if (stats_worker) stats_worker->join();  // The PUB socket's only user.
    RemoveStatsSocket();
  }
  // Closes the publisher and removes its socket file, only if the file is still the one it
  // bound (never another daemon's). REQUIRES: stats_worker joined.
  void RemoveStatsSocket() {
    if (pub) pub.close();
    struct stat st;
    if (!pub_path.empty() && lstat(pub_path.c_str(), &st) == 0 && st.st_ino == pub_inode) {
      unlink(pub_path.c_str());
    }
    pub_path.clear();
  }
};

namespace {

spdlog::level::level_enum SpdLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

// journald's priority prefix (sd-daemon(3): "<6>" = info), so `journalctl -p warning` works.
class SyslogPriorityFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string_view prefix = "<6>";
    if (msg.level <= spdlog::level::debug) prefix = "<7>";
    if (msg.level == spdlog::level::warn) prefix = "<4>";
    if (msg.level == spdlog::level::err) prefix = "<3>";
    if (msg.level == spdlog::level::critical) prefix = "<2>";
    dest.append(prefix.data(), prefix.data() + prefix.size());
  }
  std::unique_ptr<spdlog::custom_flag_formatter> clone() const override {
    return std::make_unique<SyslogPriorityFlag>();
  }
};

// Whether stderr is the journal's stream: systemd sets JOURNAL_STREAM to its "device:inode".
bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  struct stat st;
  if (stream == nullptr || fstat(STDERR_FILENO, &st) != 0) return false;
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) == stream;
}

// One line per event on stderr, never stdout (which --print-config and --dump-stats own). Under
// systemd the journal adds the time, so lines carry only a priority prefix and the level.
void LogToStderr() {
  auto logger =
      std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (StderrIsJournal()) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<SyslogPriorityFlag>('*').set_pattern("%*[%l] %v");
    logger->set_formatter(std::move(formatter));
  }
  spdlog::set_default_logger(std::move(logger));
}

// Tells the service manager (if any) about a state change; a manager that cannot be told is
// logged once, and the daemon goes on serving.
void Notify(const std::string& state) {
  static std::atomic<bool> warned{false};
  const Status s = SdNotify(state);
  if (!s.ok() && !warned.exchange(true)) Log(LogSeverity::kWarning, "sd_notify: {}", s.message());
}

std::chrono::milliseconds LeaseTick(const Config& config) {
  const int lease = config.server.lease_ms > 0 ? config.server.lease_ms : 1000;
  return std::chrono::milliseconds(std::clamp(lease / 4, 20, 1000));
}

}  // namespace

StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const Config& config, ConfigLoadOptions reload) {
  LogToStderr();
  spdlog::set_level(SpdLevel(config.server.log_level));
  KVCTL_ASSIGN_OR_RETURN(std::unique_ptr<Controller> controller, Controller::Create(config));
  ipc::ServerOptions options;
  options.endpoint = config.server.endpoint;
  options.max_frame_bytes = static_cast<int64_t>(config.server.max_message_bytes);
  options.max_request_bytes = config.server.max_message_bytes;
  KVCTL_ASSIGN_OR_RETURN(std::unique_ptr<ipc::ZmqServer> server,
                         ipc::ZmqServer::Bind(std::move(options)));
  return std::unique_ptr<Daemon>(
      new Daemon(std::move(controller), std::move(server), std::move(reload)));
}

Daemon::Daemon(std::unique_ptr<Controller> controller, std::unique_ptr<ipc::ZmqServer> server,
               ConfigLoadOptions reload)
    : controller_(std::move(controller)),
      server_(std::move(server)),
      reload_(std::move(reload)),
      impl_(std::make_unique<Impl>()) {}

Daemon::~Daemon() = default;

void Daemon::RequestStop() {
  boost::asio::post(impl_->io, [this] { impl_->io.stop(); });
}

void Daemon::Serve(ipc::Request& request, ipc::Responder& responder) {
  const auto start = std::chrono::steady_clock::now();
  const uint16_t type = static_cast<uint16_t>(ipc::TypeOf(request.body));
  StatusOr<ipc::ReplyBody> reply = Dispatch(*controller_, request.body, start);
  if (const auto* hello = std::get_if<ipc::HelloRequest>(&request.body); hello && reply.ok()) {
    Log(LogSeverity::kInfo, "hello from \"{}\" (model \"{}\")", hello->client_name,
        hello->model_name);
  }
  if (const auto* bye = reply.ok() ? std::get_if<ipc::ByeReply>(&*reply) : nullptr) {
    Log(LogSeverity::kInfo, "bye: session ended, {} sequence(s) and {} bytes freed",
        bye->sequences_closed, bye->bytes_freed);
  }
  // The request is counted before its reply leaves, so a STATS sent right after a reply always
  // sees it.
  controller_->RecordRequest(type,
                             std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now() - start),
                             !reply.ok());
  reply.ok() ? (void)responder.Reply(std::move(reply).value())
             : (void)responder.Error(reply.status());
  RunHeldFlushesAfterReply();
}

void Daemon::RunHeldFlushesAfterReply() {
  // quant.flush_after_reply: the APPEND just answered left flushes held; they run on a worker
  // while the engine computes its next step. Not counted in on_workers: no request waits for
  // them in order, and an APPEND that needs the sequence meanwhile waits for its lock.
  if (!controller_->HeldFlushesQueued()) return;
  boost::asio::post(*impl_->workers, [this] { controller_->RunHeldFlushes(); });
}

void Daemon::Handle(ipc::Request request, ipc::Responder responder) {
  // Only PING is answered on the socket's I/O thread: everything else may allocate, wait for a
  // sequence's lock (CLOSE behind an APPEND) or walk every sequence (STATS), and must not stall
  // other clients' requests.
  if (std::holds_alternative<ipc::PingRequest>(request.body)) {
    Serve(request, responder);
    return;
  }
  if (ServeLight(request, responder)) return;
  const bool stats = std::holds_alternative<ipc::StatsRequest>(request.body);
  auto shared = std::make_shared<std::pair<ipc::Request, ipc::Responder>>(std::move(request),
                                                                          std::move(responder));
  if (stats) {
    boost::asio::post(*impl_->stats_worker,
                      [this, shared] { Serve(shared->first, shared->second); });
    return;
  }
  impl_->on_workers.fetch_add(1);
  boost::asio::post(*impl_->workers, [this, shared] {
    Serve(shared->first, shared->second);
    impl_->on_workers.fetch_sub(1);
  });
}

bool Daemon::ServeLight(ipc::Request& request, ipc::Responder& responder) {
  // A decode step's APPEND that only stores rows costs about a copy of its bytes, and a blocks
  // FETCH without checksums a page-table walk: less than handing them to a worker and their
  // replies back (two cross-thread wake-ups, docs/kvbench_ipc.md). Only when nothing is on the
  // workers, so a light request never overtakes an earlier one.
  if (impl_->on_workers.load() != 0) return false;
  const auto start = std::chrono::steady_clock::now();
  bool deferred = false;
  StatusOr<ipc::ReplyBody> reply =
      DispatchLight(*controller_, request.body, start, impl_->light, &deferred);
  if (deferred) return false;
  controller_->RecordRequest(static_cast<uint16_t>(ipc::TypeOf(request.body)),
                             std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now() - start),
                             !reply.ok());
  reply.ok() ? (void)responder.Reply(std::move(reply).value())
             : (void)responder.Error(reply.status());
  RunHeldFlushesAfterReply();
  return true;
}

void Daemon::Reload() {
  Notify(SdReloadingState());
  std::vector<ConfigChange> changes;
  StatusOr<Config> config = LoadConfig(reload_);
  const Status s = config.ok() ? controller_->Reload(*config, &changes) : config.status();
  const bool restart_needed = std::any_of(changes.begin(), changes.end(),
                                          [](const ConfigChange& c) { return c.needs_restart; });
  // One line per changed key, with its old and new value and when it takes effect.
  if (s.ok()) {
    if (changes.empty()) Log(LogSeverity::kInfo, "reload: no change");
    for (const ConfigChange& c : changes) {
      Log(LogSeverity::kInfo, "reload: {} {} -> {} ({})", c.key, c.old_value, c.new_value,
          c.applies);
    }
    spdlog::set_level(SpdLevel(config->server.log_level));
  } else if (restart_needed) {
    for (const ConfigChange& c : changes) {
      if (c.needs_restart) {
        Log(LogSeverity::kError,
            "reload: refused: {} {} -> {} (fixed while the daemon runs; restart it to "
            "change this key)",
            c.key, c.old_value, c.new_value);
      } else {
        Log(LogSeverity::kWarning, "reload: not applied: {} {} -> {} (the reload was refused)",
            c.key, c.old_value, c.new_value);
      }
    }
    Log(LogSeverity::kError, "reload: refused; still serving with the previous config");
  } else {
    Log(LogSeverity::kError, "reload: refused; still serving with the previous config: {}",
        s.message());
  }
  Notify(internal::StrCat(
      "READY=1\nSTATUS=serving on ", server_->endpoint(), "; last reload ",
      s.ok() ? internal::StrCat(changes.size(), " key(s) changed") : std::string("refused")));
}

Status Daemon::StartStatsPublisher(const Config& config) {
  Impl& impl = *impl_;
  const std::string& endpoint = config.server.stats_endpoint;
  if (endpoint.empty()) return OkStatus();
  // The request endpoint's rules: loopback TCP only (parsed exactly, not by substring), and a
  // socket file another live daemon publishes on is never taken over.
  const auto named = [](const Status& s) {
    return Status(s.code(), "server.stats_endpoint: " + s.message());
  };
  StatusOr<ipc::Endpoint> parsed = ipc::ParseBindEndpoint(endpoint);
  if (!parsed.ok()) return named(parsed.status());
  if (parsed->kind == ipc::Endpoint::Kind::kIpc) {
    if (Status claimed = ipc::ClaimIpcPath(parsed->ipc_path); !claimed.ok()) return named(claimed);
  }
  impl.pub = zmq::socket_t(impl.zmq_ctx, zmq::socket_type::pub);
  impl.pub.set(zmq::sockopt::linger, 0);
  impl.pub.set(zmq::sockopt::sndhwm, 16);
  if (parsed->ipv6) impl.pub.set(zmq::sockopt::ipv6, 1);
  try {
    impl.pub.bind(parsed->address);
  } catch (const zmq::error_t& e) {
    return Unavailable("server.stats_endpoint: cannot bind ", endpoint, ": ", e.what());
  }
  if (parsed->kind == ipc::Endpoint::Kind::kIpc) {
    struct stat st;
    if (lstat(parsed->ipc_path.c_str(), &st) != 0) {
      return Unavailable("server.stats_endpoint: ", parsed->ipc_path,
                         " missing after bind: ", std::strerror(errno));
    }
    impl.pub_path = parsed->ipc_path;
    impl.pub_inode = st.st_ino;  // Recorded first, so that a failed chmod still removes it.
    if (chmod(parsed->ipc_path.c_str(), 0600) != 0) {
      return FailedPrecondition("server.stats_endpoint: cannot set mode 0600 on ", parsed->ipc_path,
                                ": ", std::strerror(errno));
    }
  }
  auto publish = std::make_shared<std::function<void(const boost::system::error_code&)>>();
  *publish = [this, publish](const boost::system::error_code& ec) {
    if (ec) return;
    // Built and sent on the stats thread (the only user of the PUB socket), so neither the signal
    // and lease loop nor the request socket waits for it; a report still being built when the
    // next period starts is not doubled.
    if (!impl_->publishing.exchange(true)) {
      boost::asio::post(*impl_->stats_worker, [this] {
        StatusOr<std::string> text =
            controller_->Stats(ipc::StatsRequest{}, std::chrono::steady_clock::now());
        if (text.ok()) {
          impl_->pub.send(zmq::str_buffer("stats"),
                          zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          impl_->pub.send(zmq::buffer(*text), zmq::send_flags::dontwait);
        }
        impl_->publishing.store(false);
      });
    }
    // Read every period, so a reloaded server.stats_interval_ms applies from the next publish.
    impl_->stats_timer.expires_after(
        std::chrono::milliseconds(controller_->config().server.stats_interval_ms));
    impl_->stats_timer.async_wait(*publish);
  };
  impl.stats_timer.expires_after(std::chrono::milliseconds(0));
  impl.stats_timer.async_wait(*publish);
  Log(LogSeverity::kInfo, "stats published on {} every {} ms", endpoint,
      config.server.stats_interval_ms);
  return OkStatus();
}

int Daemon::Run() {
  Impl& impl = *impl_;
  const Config config = controller_->config();
  impl.workers = std::make_unique<boost::asio::thread_pool>(config.server.workers);
  controller_->EnableHeldFlushQueue();  // Its flushes run on `workers` (RunHeldFlushesAfterReply).
  impl.light = {.append_tokens = config.server.inline_append_tokens,
                .blocks_fetch = config.server.inline_blocks_fetch,
                .dense_fetch_rows = config.server.inline_dense_fetch_rows};
  impl.stats_worker = std::make_unique<boost::asio::thread_pool>(1);
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& ec, int signo) {
        if (ec) return;
        if (signo == SIGHUP) {
          Reload();
          impl.signals.async_wait(on_signal);
          return;
        }
        Log(LogSeverity::kInfo, "signal {}: stopping", signo);
        impl.io.stop();
      };
  impl.signals.async_wait(on_signal);
  const auto tick = LeaseTick(config);
  std::function<void(const boost::system::error_code&)> on_tick =
      [&](const boost::system::error_code& ec) {
        if (ec) return;
        const int expired = controller_->ExpireLeases(std::chrono::steady_clock::now());
        if (expired > 0) Log(LogSeverity::kInfo, "lease expired: freed {} session(s)", expired);
        impl.lease_timer.expires_after(tick);
        impl.lease_timer.async_wait(on_tick);
      };
  impl.lease_timer.expires_after(tick);
  impl.lease_timer.async_wait(on_tick);

  controller_->SetServerInfo(server_->endpoint(),
                             [server = server_.get()] { return server->counters(); });
  if (Status s = StartStatsPublisher(config); !s.ok()) {
    Log(LogSeverity::kError, "cannot start the stats publisher: {}", s.ToString());
    return 1;
  }
  if (!config.server.http_address.empty()) {
    StatusOr<std::unique_ptr<HttpServer>> http =
        HttpServer::Start(config.server.http_address, [this] {
          StatusOr<std::string> text =
              controller_->Stats(ipc::StatsRequest{}, std::chrono::steady_clock::now());
          return text.ok() ? RenderPrometheus(*text) : std::string();
        });
    if (!http.ok()) {
      Log(LogSeverity::kError, "cannot start the HTTP server: {}", http.status().ToString());
      return 1;
    }
    impl.http = std::move(http).value();
    controller_->SetHttpAddress(impl.http->address());
    Log(LogSeverity::kInfo, "metrics on http://{}/metrics", impl.http->address());
  }

  Status started = server_->Start([this](ipc::Request request, ipc::Responder responder) {
    Handle(std::move(request), std::move(responder));
  });
  if (!started.ok()) {
    Log(LogSeverity::kError, "cannot start the server: {}", started.ToString());
    return 1;
  }
  if (controller_->shm_name().empty()) {
    Log(LogSeverity::kInfo,
        "kvctl {} serving on {} (pool {} bytes on CUDA device {}, with a host copy)", kKvctlVersion,
        server_->endpoint(), config.pool.bytes, config.pool.cuda_device);
  } else {
    Log(LogSeverity::kInfo, "kvctl {} serving on {} (pool {} bytes in /dev/shm{})", kKvctlVersion,
        server_->endpoint(), config.pool.bytes, controller_->shm_name());
  }
  std::unique_ptr<Scrubber> scrubber = Scrubber::Start(config.pool, controller_.get());
  std::unique_ptr<PeriodicThread> tier_pass;
  if (const auto interval = controller_->TierPassInterval(); interval.count() > 0) {
    tier_pass = std::make_unique<PeriodicThread>(
        interval, /*nice=*/0, [this] { controller_->TierPass(std::chrono::steady_clock::now()); });
  }
  Notify("READY=1\nSTATUS=serving on " + server_->endpoint());
  impl.io.run();
  Notify("STOPPING=1");

  tier_pass.reset();
  scrubber.reset();
  impl.http.reset();
  server_->Stop();  // Answers in-flight requests (workers are still running), removes the socket.
  impl.workers->join();
  impl.stats_worker->join();
  impl.RemoveStatsSocket();
  server_.reset();
  controller_.reset();  // Frees sequences, staging slots and the shm pool.
  Log(LogSeverity::kInfo, "stopped cleanly");
  return 0;
}

}  // namespace kvctl
