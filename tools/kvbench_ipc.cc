// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvbench ipc: the daemon, the raw ZeroMQ echo baseline, the direct Controller and the
// interleaved measurement loop.
#include "tools/kvbench_ipc.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "common/half.h"
#include "controller/config/config.h"
#include "controller/daemon/daemon.h"
#include "controller/service/controller.h"
#include "ipc/client.h"
#include "ipc/protocol.h"
#include "ipc/transport.h"
#include "kernels/quant_types.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kLayers = 30, kHeads = 3, kHeadDim = 64;          // SmolLM2-135M.
constexpr size_t kRowElems = size_t{kHeads} * kHeadDim;         // One token of one layer.
constexpr size_t kStepBytes = size_t{kLayers} * kRowElems * 2;  // K (or V) of one decode step.
constexpr int64_t kDataTokens = 4096;  // Synthetic rows; longer sequences reuse them cyclically.
// Long enough for a prefill chunk on a loaded machine; short enough that a run whose daemon was
// stopped by Ctrl-C (Daemon::Run handles SIGINT/SIGTERM in this process) ends soon after.
constexpr int kClientTimeoutMs = 10000;
constexpr const char* kLosslessModel = "kvbench-lossless";
// Issue 14's targets: APPEND inline 1.3x, staging 1.2x, dense FETCH 1.5x, blocks FETCH 1.3x
// (until 2026-12-06 the table printed 1.5x for APPEND inline and blocks FETCH).
constexpr double kAppendTarget = 1.3, kStagingTarget = 1.2, kFetchTarget = 1.5;
constexpr double kBlocksFetchTarget = 1.3;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t start = line.find_first_not_of(" \t", line.find(':') + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown";
}

double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return load;
}

std::vector<uint64_t> FrameSizes(const ipc::Frames& frames) {
  std::vector<uint64_t> out;
  for (const zmq::message_t& f : frames) out.push_back(f.size());
  return out;
}

uint64_t Sum(const std::vector<uint64_t>& v) {
  uint64_t s = 0;
  for (uint64_t x : v) s += x;
  return s;
}

// ---- Raw ZeroMQ baseline ------------------------------------------------------------------------
// The raw request's frame 0 starts with the reply's shape: u32 frame count, then u32 per frame.
// The echo server answers with fresh frames of those sizes copied from a pre-filled buffer (a
// server has to produce its reply bytes somewhere; ZmqServer sends frames the handler built).

class RawEchoServer {
 public:
  // Binds a ROUTER with ZmqServer's socket options on `endpoint` (ipc://PATH) and starts its
  // thread.
  static StatusOr<std::unique_ptr<RawEchoServer>> Start(const std::string& endpoint,
                                                        size_t max_frame_bytes) {
    std::unique_ptr<RawEchoServer> s(new RawEchoServer());
    s->payload_.assign(max_frame_bytes, std::byte{0x5a});
    try {
      const ipc::ServerOptions defaults;
      s->router_ = zmq::socket_t(s->ctx_, zmq::socket_type::router);
      s->router_.set(zmq::sockopt::linger, defaults.linger_ms);
      s->router_.set(zmq::sockopt::sndhwm, defaults.send_hwm);
      s->router_.set(zmq::sockopt::rcvhwm, defaults.recv_hwm);
      s->router_.set(zmq::sockopt::maxmsgsize, defaults.max_frame_bytes);
      s->router_.bind(endpoint);
    } catch (const zmq::error_t& e) {
      return Unavailable("raw baseline: bind ", endpoint, ": ", e.what());
    }
    s->ipc_path_ = endpoint.substr(std::string_view("ipc://").size());
    s->thread_ = std::thread([p = s.get()] { p->Run(); });
    return s;
  }

  ~RawEchoServer() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    router_.close();
    ctx_.close();
    std::error_code ec;
    std::filesystem::remove(ipc_path_, ec);  // ZeroMQ leaves the socket file behind.
  }

 private:
  RawEchoServer() = default;

  void Run() {
    ipc::Frames frames;
    while (!stop_.load()) {
      try {
        // The loop of ZmqServer::Run: one message per turn, the wait of ipc/transport.h.
        const ipc::WaitResult wait = ipc::WaitForInput(router_, /*wake_fd=*/-1, 50);
        size_t discarded = 0;
        if (wait.readable && ipc::RecvMessage(router_, &frames, ipc::kMaxFrames + 1, &discarded)) {
          Answer(frames);
          frames = ipc::Frames();
        }
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return;  // The client then times out and reports it.
      }
    }
  }

  // frames[0] is the routing id, frames[1] the request's frame 0 with the reply shape.
  void Answer(ipc::Frames& frames) {
    if (frames.size() < 2 || frames[1].size() < 4) return;
    const auto* spec = static_cast<const uint8_t*>(frames[1].data());
    uint32_t n = 0;
    std::memcpy(&n, spec, 4);
    if (n == 0 || n > ipc::kMaxFrames || frames[1].size() < 4 + 4 * size_t{n}) return;
    ipc::Frames reply;
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t bytes = 0;
      std::memcpy(&bytes, spec + 4 + 4 * i, 4);
      if (bytes > payload_.size()) return;
      reply.emplace_back(payload_.data(), bytes);
    }
    ipc::Frames prefix;
    prefix.push_back(std::move(frames[0]));
    ipc::SendMessage(router_, prefix, reply);
  }

  zmq::context_t ctx_;
  zmq::socket_t router_;
  std::string ipc_path_;
  std::vector<std::byte> payload_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One raw message shape: the request frames to send and the reply frames to ask for.
struct RawShape {
  std::vector<uint64_t> request, reply;
};

// A DEALER with ipc::Client's socket options that sends a request and waits for its reply the way
// ipc::Client does (poll, then non-blocking receive).
class RawClient {
 public:
  static StatusOr<std::unique_ptr<RawClient>> Connect(const std::string& endpoint,
                                                      size_t max_frame_bytes) {
    std::unique_ptr<RawClient> c(new RawClient());
    c->source_.assign(max_frame_bytes, std::byte{0x33});
    try {
      c->socket_ = zmq::socket_t(c->ctx_, zmq::socket_type::dealer);
      c->socket_.set(zmq::sockopt::linger, 0);
      c->socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(ipc::kMaxTensorFrameBytes));
      c->socket_.connect(endpoint);
    } catch (const zmq::error_t& e) {
      return Unavailable("raw baseline: connect ", endpoint, ": ", e.what());
    }
    return c;
  }

  // One round trip. The request frames are copied from a buffer into fresh messages, as
  // ipc::Client copies K and V; frame 0 carries the reply shape in its first bytes.
  Status RoundTrip(const RawShape& shape) {
    if (shape.request.empty() || shape.request[0] < 4 + 4 * shape.reply.size()) {
      return Internal("raw baseline: request frame 0 too small for the reply shape");
    }
    ipc::Frames request;
    for (size_t i = 0; i < shape.request.size(); ++i) {
      request.emplace_back(source_.data(), shape.request[i]);
    }
    auto* head = static_cast<uint8_t*>(request[0].data());
    const uint32_t n = static_cast<uint32_t>(shape.reply.size());
    std::memcpy(head, &n, 4);
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t bytes = static_cast<uint32_t>(shape.reply[i]);
      std::memcpy(head + 4 + 4 * i, &bytes, 4);
    }
    ipc::Frames no_prefix;
    if (!ipc::SendMessage(socket_, no_prefix, request)) {
      return Unavailable("raw baseline: cannot queue the request");
    }
    const auto deadline = Clock::now() + std::chrono::milliseconds(kClientTimeoutMs);
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return DeadlineExceeded("raw baseline: no reply in time");
      ipc::WaitResult wait;
      try {
        wait = ipc::WaitForInput(socket_, /*wake_fd=*/-1, static_cast<int>(left.count()));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        return Unavailable("raw baseline: poll: ", e.what());
      }
      ipc::Frames reply;
      size_t discarded = 0;
      if (wait.readable && ipc::RecvMessage(socket_, &reply, ipc::kMaxFrames, &discarded)) {
        if (FrameSizes(reply) != shape.reply) {
          return Internal("raw baseline: reply frames differ from the requested shape");
        }
        return OkStatus();
      }
    }
  }

  ~RawClient() {
    socket_.close();
    ctx_.close();
  }

 private:
  RawClient() = default;
  zmq::context_t ctx_;
  zmq::socket_t socket_;
  std::vector<std::byte> source_;
};

// ---- The daemon and the direct Controller -------------------------------------------------------

// kvctl::Daemon serving on its own thread until destroyed.
class DaemonThread {
 public:
  static StatusOr<std::unique_ptr<DaemonThread>> Start(const Config& config) {
    std::unique_ptr<DaemonThread> d(new DaemonThread());
    KVCTL_ASSIGN_OR_RETURN(d->daemon_, Daemon::Create(config, {}));
    d->thread_ = std::thread([p = d.get()] { p->exit_code_ = p->daemon_->Run(); });
    return d;
  }
  // Stops the daemon and returns Run()'s exit code (0: a clean stop). Idempotent.
  int Stop() {
    if (thread_.joinable()) {
      daemon_->RequestStop();
      thread_.join();
    }
    return exit_code_;
  }
  ~DaemonThread() { Stop(); }

 private:
  DaemonThread() = default;
  std::unique_ptr<Daemon> daemon_;
  std::thread thread_;
  int exit_code_ = 0;
};

// A read-write mapping of a session's staging object (or, from daemons before staging objects,
// of the pool), as an engine makes it for the staging slot.
class PoolMapping {
 public:
  static StatusOr<std::unique_ptr<PoolMapping>> Map(const ipc::HelloReply& hello) {
    if (hello.staging_bytes < 2 * kStepBytes || hello.shm_name.empty()) {
      return FailedPrecondition("HELLO: staging_bytes ", hello.staging_bytes,
                                ", expected a staging slot of at least ", 2 * kStepBytes, " bytes");
    }
    const bool own = !hello.staging_shm_name.empty();
    const std::string& name = own ? hello.staging_shm_name : hello.shm_name;
    const uint64_t bytes = own ? hello.staging_offset + hello.staging_bytes : hello.pool_bytes;
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) return Unavailable("shm_open ", name, ": ", std::strerror(errno));
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return Unavailable("mmap ", name, ": ", std::strerror(errno));
    std::unique_ptr<PoolMapping> m(new PoolMapping());
    m->base_ = static_cast<uint8_t*>(p);
    m->bytes_ = bytes;
    m->slot_ = m->base_ + hello.staging_offset;
    return m;
  }
  ~PoolMapping() { munmap(base_, bytes_); }
  uint8_t* slot() const { return slot_; }

 private:
  PoolMapping() = default;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint8_t* slot_ = nullptr;
};

StatusOr<Config> MakeConfig(const std::string& endpoint, const std::string& shm_name,
                            uint64_t pool_bytes, int workers,
                            const std::vector<std::string>& settings) {
  ConfigLoadOptions load;  // No file and no environment: the built-in quantizer defaults.
  load.cli = {{"server.endpoint", endpoint},
              {"server.log_level", "error"},
              {"server.lease_ms", "3600000"},  // A row may leave a session idle for minutes.
              {"server.workers", std::to_string(workers)},
              {"server.max_message_bytes", "1GiB"},
              // No stats PUB socket: its default path is shared by every daemon on the machine.
              {"server.stats_endpoint", ""},
              {"pool.bytes", std::to_string(pool_bytes)},
              {"pool.shm_name", shm_name}};
  for (const std::string& s : settings) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument("--set: got \"", s, "\", expected KEY=VALUE");
    }
    load.cli.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  KVCTL_ASSIGN_OR_RETURN(Config config, LoadConfig(load));
  KVCTL_RETURN_IF_ERROR(ApplyToml(
      config, std::string("[[model]]\nname = \"") + kLosslessModel + "\"\nlossless = true\n",
      "kvbench ipc"));
  KVCTL_RETURN_IF_ERROR(ValidateConfig(config));
  return config;
}

// Synthetic K/V rows (fp16) of one layer, reused for every layer with a per-layer offset.
struct KvData {
  std::vector<uint16_t> k, v;  // [kDataTokens, kHeads, kHeadDim].

  // K and V of tokens [first, first + n) for every layer: [layers, n, heads, head_dim] each.
  void Fill(int64_t first, int64_t n, std::vector<uint16_t>* out_k,
            std::vector<uint16_t>* out_v) const {
    out_k->resize(size_t{kLayers} * n * kRowElems);
    out_v->resize(out_k->size());
    for (int l = 0; l < kLayers; ++l) {
      for (int64_t i = 0; i < n; ++i) {
        const size_t src = static_cast<size_t>((first + i + 97 * l) % kDataTokens) * kRowElems;
        const size_t dst = (static_cast<size_t>(l) * n + i) * kRowElems;
        std::memcpy(out_k->data() + dst, k.data() + src, kRowElems * 2);
        std::memcpy(out_v->data() + dst, v.data() + src, kRowElems * 2);
      }
    }
  }
};

KvData MakeKvData() {
  SyntheticKv kv =
      GenerateSyntheticKv({.tokens = kDataTokens, .heads = kHeads, .head_dim = kHeadDim});
  KvData d;
  for (float x : kv.k) d.k.push_back(FloatToHalf(x));
  for (float x : kv.v) d.v.push_back(FloatToHalf(x));
  return d;
}

std::span<const std::byte> Bytes(const std::vector<uint16_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * 2};
}

zmq::message_t Frame(const std::vector<uint16_t>& v) {
  return zmq::message_t(v.data(), v.size() * 2);
}

std::string TokensLabel(int64_t t) {
  return t % 1024 == 0 ? std::to_string(t / 1024) + "K" : std::to_string(t);
}

// A session of the same client in both places: the daemon (over the socket) and the direct
// Controller (in-process).
struct Sessions {
  uint64_t daemon = 0, direct = 0;
};

// Everything a run holds. Members are declared so that clients go before their servers.
struct Bench {
  const IpcBenchOptions& options;
  IpcBenchReport* report;
  KvData data;
  std::unique_ptr<DaemonThread> daemon;
  std::unique_ptr<Controller> direct;
  std::unique_ptr<RawEchoServer> raw_server;
  std::unique_ptr<ipc::Client> client;
  std::unique_ptr<RawClient> raw;
  ipc::HelloReply hello, direct_hello;
  Sessions quant, lossless;
  uint64_t next_sequence = 1;

  explicit Bench(const IpcBenchOptions& o, IpcBenchReport* r) : options(o), report(r) {}

  StatusOr<ipc::AppendReply> ClientAppend(const ipc::AppendArgs& args,
                                          const std::vector<uint16_t>& k,
                                          const std::vector<uint16_t>& v) {
    ++report->requests_sent;
    return client->AppendInline(args, Bytes(k), Bytes(v));
  }

  ipc::AppendRequest DirectAppendRequest(uint64_t session, uint64_t sequence, int64_t first,
                                         int64_t n, const std::vector<uint16_t>& k,
                                         const std::vector<uint16_t>& v) {
    ipc::AppendRequest req{.session_id = session,
                           .sequence_id = sequence,
                           .first_position = static_cast<uint64_t>(first),
                           .n_tokens = static_cast<uint32_t>(n)};
    req.k = Frame(k);
    req.v = Frame(v);
    return req;
  }

  // Opens the same new sequence id in both sessions.
  StatusOr<uint64_t> OpenBoth(const Sessions& s) {
    const uint64_t id = next_sequence++;
    KVCTL_RETURN_IF_ERROR(client->Open(s.daemon, id).status());
    KVCTL_RETURN_IF_ERROR(direct->Open({s.direct, id}, Clock::now()));
    return id;
  }

  // A sequence of `tokens` tokens in both places, appended in prefill chunks.
  StatusOr<uint64_t> Prefill(const Sessions& s, int64_t tokens) {
    KVCTL_ASSIGN_OR_RETURN(uint64_t id, OpenBoth(s));
    std::vector<uint16_t> k, v;
    for (int64_t first = 0; first < tokens; first += options.prefill_chunk) {
      const int64_t n = std::min<int64_t>(options.prefill_chunk, tokens - first);
      data.Fill(first, n, &k, &v);
      KVCTL_RETURN_IF_ERROR(
          ClientAppend({s.daemon, id, static_cast<uint64_t>(first), static_cast<uint32_t>(n)}, k, v)
              .status());
      KVCTL_RETURN_IF_ERROR(
          direct->Append(DirectAppendRequest(s.direct, id, first, n, k, v), Clock::now()).status());
    }
    return id;
  }
};

// What one row runs per iteration. `prepare` is untimed; the other two are timed.
struct RowOps {
  std::function<void(int64_t iteration)> prepare;
  std::function<Status()> kvctl;
  std::function<Status()> handler;
};

// Writes one byte per cache line of `buffer` (empty: nothing), so the next call finds the caches
// and the TLB as a step of a CPU engine leaves them.
void EvictCaches(std::vector<uint8_t>& buffer) {
  for (size_t i = 0; i < buffer.size(); i += 64) buffer[i] = static_cast<uint8_t>(buffer[i] + 1);
}

Status TimeOne(const std::function<Status()>& op, bool record, std::vector<double>* samples,
               std::vector<uint8_t>& evict) {
  EvictCaches(evict);
  const auto t0 = Clock::now();
  Status s = op();
  const auto t1 = Clock::now();
  if (record) samples->push_back(Micros(t1 - t0));
  return s;
}

// The interleaved loop: per iteration kvctl, raw same-bytes, raw 64-B (if the row's baseline),
// handler; warm-up iterations are not recorded.
Status MeasureRow(Bench& b, IpcBenchRow& row, const RawShape& shape, const RowOps& ops) {
  const RawShape raw64{{64}, {64}};
  std::vector<double> kvctl, raw_same, raw_64, handler;
  std::vector<uint8_t> evict(static_cast<size_t>(b.options.evict_mib) << 20, 1);
  const int total = b.options.warmup + b.options.iterations;
  for (int i = 0; i < total; ++i) {
    const bool record = i >= b.options.warmup;
    if (ops.prepare) ops.prepare(i);
    if (b.options.think_us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(b.options.think_us));
    Status s = TimeOne(ops.kvctl, record, &kvctl, evict);
    if (!s.ok()) return Status(s.code(), internal::StrCat(row.name, ": kvctl: ", s.message()));
    s = TimeOne([&] { return b.raw->RoundTrip(shape); }, record, &raw_same, evict);
    if (s.ok() && row.baseline_64) {
      s = TimeOne([&] { return b.raw->RoundTrip(raw64); }, record, &raw_64, evict);
    }
    if (!s.ok()) return Status(s.code(), internal::StrCat(row.name, ": ", s.message()));
    s = TimeOne(ops.handler, record, &handler, evict);
    if (!s.ok()) return Status(s.code(), internal::StrCat(row.name, ": handler: ", s.message()));
    // What the daemon does on a worker after the reply, untimed (the handler is the request).
    if (b.direct->HeldFlushesQueued()) b.direct->RunHeldFlushes();
  }
  row.request_frames = shape.request;
  row.reply_frames = shape.reply;
  row.request_bytes = Sum(shape.request);
  row.reply_bytes = Sum(shape.reply);
  row.kvctl = SummarizeLatency(std::move(kvctl));
  row.raw_same = SummarizeLatency(std::move(raw_same));
  row.raw_64 = SummarizeLatency(std::move(raw_64));
  row.handler = SummarizeLatency(std::move(handler));
  const LatencyStats& base = row.baseline_64 ? row.raw_64 : row.raw_same;
  row.ratio_p50 = base.p50_us > 0 ? row.kvctl.p50_us / base.p50_us : 0;
  row.ratio_p99 = base.p99_us > 0 ? row.kvctl.p99_us / base.p99_us : 0;
  row.met = row.target > 0 && row.ratio_p50 > 0 && row.ratio_p50 <= row.target;
  return OkStatus();
}

template <typename M>
StatusOr<std::vector<uint64_t>> EncodedSizes(M msg) {
  KVCTL_ASSIGN_OR_RETURN(ipc::Frames frames, ipc::Encode(1, std::move(msg)));
  return FrameSizes(frames);
}

// One decode step per iteration (positions 0, 1, ...), inline or through the staging slot.
Status RunAppendRow(Bench& b, bool staging) {
  IpcBenchRow row;
  row.group = staging ? "append_staging" : "append_inline";
  row.name = staging ? "append staging, 1 token" : "append inline, 1 token";
  row.baseline_64 = staging;
  row.target = staging ? kStagingTarget : kAppendTarget;
  const int64_t context = b.options.append_context;
  KVCTL_ASSIGN_OR_RETURN(const uint64_t seq, b.Prefill(b.quant, context));
  if (context > 0) row.name += internal::StrCat(" at ", TokensLabel(context));
  std::unique_ptr<PoolMapping> map, direct_map;
  if (staging) {
    KVCTL_ASSIGN_OR_RETURN(map, PoolMapping::Map(b.hello));
    KVCTL_ASSIGN_OR_RETURN(direct_map, PoolMapping::Map(b.direct_hello));
  }
  std::vector<uint16_t> k, v;
  ipc::AppendRequest direct_req;
  int64_t position = 0;
  RowOps ops;
  ops.prepare = [&](int64_t iteration) {
    const int64_t i = context + iteration;
    position = i;
    b.data.Fill(i, 1, &k, &v);
    if (staging) {
      direct_req = ipc::AppendRequest{.session_id = b.quant.direct,
                                      .sequence_id = seq,
                                      .first_position = static_cast<uint64_t>(i),
                                      .n_tokens = 1,
                                      .source = ipc::AppendSource::kStaging,
                                      .staging_offset = b.direct_hello.staging_offset};
      std::memcpy(direct_map->slot(), k.data(), kStepBytes);
      std::memcpy(direct_map->slot() + kStepBytes, v.data(), kStepBytes);
    } else {
      direct_req = b.DirectAppendRequest(b.quant.direct, seq, i, 1, k, v);
    }
  };
  ops.kvctl = [&]() -> Status {
    const ipc::AppendArgs args{b.quant.daemon, seq, static_cast<uint64_t>(position), 1};
    ++b.report->requests_sent;
    if (!staging) return b.client->AppendInline(args, Bytes(k), Bytes(v)).status();
    // The engine's side of staging: write K and V into the slot, then send the small request.
    std::memcpy(map->slot(), k.data(), kStepBytes);
    std::memcpy(map->slot() + kStepBytes, v.data(), kStepBytes);
    return b.client->AppendStaging(args, b.hello.staging_offset, false).status();
  };
  ops.handler = [&] { return b.direct->Append(direct_req, Clock::now()).status(); };

  RawShape shape;
  ipc::AppendRequest probe{.session_id = b.quant.daemon, .sequence_id = seq, .n_tokens = 1};
  if (staging) {
    probe.source = ipc::AppendSource::kStaging;
    probe.staging_offset = b.hello.staging_offset;
  } else {
    b.data.Fill(0, 1, &k, &v);
    probe.k = Frame(k);
    probe.v = Frame(v);
  }
  KVCTL_ASSIGN_OR_RETURN(shape.request, EncodedSizes(std::move(probe)));
  KVCTL_ASSIGN_OR_RETURN(shape.reply, EncodedSizes(ipc::AppendReply{}));
  KVCTL_RETURN_IF_ERROR(MeasureRow(b, row, shape, ops));
  b.report->rows.push_back(std::move(row));
  return OkStatus();
}

// PING of the session: no tensor, no worker thread, no sequence lock.
Status RunPingRow(Bench& b) {
  IpcBenchRow row;
  row.group = "ping";
  row.name = "ping (diagnostic)";
  row.baseline_64 = true;
  RawShape shape;
  KVCTL_ASSIGN_OR_RETURN(shape.request, EncodedSizes(ipc::PingRequest{b.quant.daemon}));
  KVCTL_ASSIGN_OR_RETURN(shape.reply, EncodedSizes(ipc::PingReply{1}));
  RowOps ops;
  ops.kvctl = [&] { return b.client->Ping(b.quant.daemon).status(); };
  ops.handler = [&] { return b.direct->Ping({b.quant.direct}, Clock::now()).status(); };
  KVCTL_RETURN_IF_ERROR(MeasureRow(b, row, shape, ops));
  b.report->rows.push_back(std::move(row));
  return OkStatus();
}

// What a FETCH row asks for: dense rows, the whole page table, or the table of a client that
// holds the one from its previous FETCH (nothing new since: the reply lists no record).
enum class FetchKind { kDense, kBlocks, kBlocksHeld };

// The FETCH request of layer 0 of `seq`; kBlocksHeld carries `held`'s known table.
ipc::FetchRequest FetchRequestOf(uint64_t session, uint64_t seq, FetchKind kind,
                                 const ipc::FetchBlocksReply& held) {
  ipc::FetchRequest r{session,
                      seq,
                      0,
                      1,
                      kind == FetchKind::kDense ? ipc::FetchMode::kDense : ipc::FetchMode::kBlocks,
                      DType::kF16};
  if (kind == FetchKind::kBlocksHeld) ipc::SetKnownTable(held, &r);
  return r;
}

// FETCH of layer 0 of sequence `seq` (the same id in both places).
Status RunFetchRow(Bench& b, const Sessions& s, uint64_t seq, int64_t tokens, FetchKind kind,
                   std::string group, std::string name) {
  IpcBenchRow row;
  row.group = std::move(group);
  row.name = std::move(name);
  row.baseline_64 = kind != FetchKind::kDense;
  row.target = kind == FetchKind::kDense ? kFetchTarget : kBlocksFetchTarget;
  // The whole tables once (not timed): what a held-table client keeps, on either side.
  ipc::FetchBlocksReply held, direct_held;
  if (kind == FetchKind::kBlocksHeld) {
    ++b.report->requests_sent;
    KVCTL_ASSIGN_OR_RETURN(held, b.client->FetchBlocks(s.daemon, seq, 0, 1));
    KVCTL_ASSIGN_OR_RETURN(
        ipc::ReplyBody body,
        b.direct->Fetch(FetchRequestOf(s.direct, seq, FetchKind::kBlocks, {}), Clock::now()));
    direct_held = std::get<ipc::FetchBlocksReply>(std::move(body));
  }
  RawShape shape;
  KVCTL_ASSIGN_OR_RETURN(shape.request, EncodedSizes(FetchRequestOf(s.daemon, seq, kind, held)));
  // The reply's exact frames, from one FETCH (not timed) re-encoded.
  ++b.report->requests_sent;
  if (kind == FetchKind::kBlocks) {
    KVCTL_ASSIGN_OR_RETURN(ipc::FetchBlocksReply reply, b.client->FetchBlocks(s.daemon, seq, 0, 1));
    KVCTL_ASSIGN_OR_RETURN(shape.reply, EncodedSizes(std::move(reply)));
  } else if (kind == FetchKind::kBlocksHeld) {
    KVCTL_ASSIGN_OR_RETURN(ipc::FetchBlocksReply reply,
                           b.client->FetchBlocksSince(s.daemon, seq, 0, 1, held));
    for (uint32_t base : reply.record_base) {
      if (base == 0 && !held.indices.empty()) {
        return Internal(row.name, ": the daemon listed a pair whole although nothing changed");
      }
    }
    KVCTL_ASSIGN_OR_RETURN(shape.reply, EncodedSizes(std::move(reply)));
  } else {
    KVCTL_ASSIGN_OR_RETURN(ipc::FetchDenseReply reply, b.client->FetchDense(s.daemon, seq, 0, 1));
    uint64_t rows = 0;
    for (uint32_t c : reply.counts) rows += c;
    if (rows != static_cast<uint64_t>(tokens) * kHeads) {
      return Internal(row.name, ": FETCH returned ", rows, " rows, expected ", tokens * kHeads);
    }
    KVCTL_ASSIGN_OR_RETURN(shape.reply, EncodedSizes(std::move(reply)));
  }
  RowOps ops;
  ops.kvctl = [&]() -> Status {
    ++b.report->requests_sent;
    switch (kind) {
      case FetchKind::kBlocks:
        return b.client->FetchBlocks(s.daemon, seq, 0, 1).status();
      case FetchKind::kBlocksHeld:  // Merged into a whole table, as an engine would use it.
        return b.client->FetchBlocks(s.daemon, seq, 0, 1, &held).status();
      case FetchKind::kDense:
        break;
    }
    return b.client->FetchDense(s.daemon, seq, 0, 1).status();
  };
  ops.handler = [&] {
    return b.direct->Fetch(FetchRequestOf(s.direct, seq, kind, direct_held), Clock::now()).status();
  };
  KVCTL_RETURN_IF_ERROR(MeasureRow(b, row, shape, ops));
  b.report->rows.push_back(std::move(row));
  return OkStatus();
}

Status ValidateOptions(const IpcBenchOptions& o) {
  if (o.iterations < 1 || o.iterations > 1000000) {
    return InvalidArgument("--iterations: got ", o.iterations, ", expected 1..1000000");
  }
  if (o.warmup < 0 || o.warmup > 1000000) {
    return InvalidArgument("--warmup: got ", o.warmup, ", expected 0..1000000");
  }
  if (o.fetch_tokens.empty()) return InvalidArgument("--tokens: got none, expected 1 or more");
  for (int64_t t : o.fetch_tokens) {
    if (t < 1 || t > 65536) return InvalidArgument("--tokens: got ", t, ", expected 1..65536");
  }
  if (o.append_context < 0 || o.append_context > 65536) {
    return InvalidArgument("--append-context: got ", o.append_context, ", expected 0..65536");
  }
  if (o.prefill_chunk < 1 || o.prefill_chunk > 4096) {
    return InvalidArgument("--prefill-chunk: got ", o.prefill_chunk, ", expected 1..4096");
  }
  if (o.workers < 1 || o.workers > 64) {
    return InvalidArgument("--workers: got ", o.workers, ", expected 1..64");
  }
  if (o.think_us < 0 || o.think_us > 1000000) {
    return InvalidArgument("--think-us: got ", o.think_us, ", expected 0..1000000");
  }
  if (o.evict_mib < 0 || o.evict_mib > 4096) {
    return InvalidArgument("--evict-mib: got ", o.evict_mib, ", expected 0..4096");
  }
  for (const std::string& r : o.rows) {
    if (std::find(std::begin(kIpcRowGroups), std::end(kIpcRowGroups), r) ==
        std::end(kIpcRowGroups)) {
      return InvalidArgument("--rows: got \"", r,
                             "\", expected ping, append_inline, append_staging, fetch_dense, "
                             "fetch_dense_lossless, fetch_blocks or fetch_blocks_held");
    }
  }
  return OkStatus();
}

// Pool bytes for everything a run stores: lossless sequences at fp16 size, quantized ones well
// under it, decode-step sequences, and page slack of every (layer, head) stream.
uint64_t PoolBytesFor(const IpcBenchOptions& o) {
  const uint64_t token_bytes = 2 * kStepBytes;
  uint64_t tokens = 0;
  for (int64_t t : o.fetch_tokens) tokens += static_cast<uint64_t>(t);
  tokens += 2 * static_cast<uint64_t>(o.append_context);  // Both APPEND rows' sequences.
  const uint64_t sequences = 2 + 2 * o.fetch_tokens.size();
  const uint64_t bytes = tokens * token_bytes * 5 / 4 +
                         2 * token_bytes * static_cast<uint64_t>(o.warmup + o.iterations) +
                         sequences * (24u << 20) + (96u << 20);
  const uint64_t mib = uint64_t{1} << 20;
  return std::max<uint64_t>(256 * mib, (bytes + mib - 1) / mib * mib);
}

// Reads "name:value" from INFO text; 0 if absent.
uint64_t StatsField(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + ":", 0) == 0) return std::stoull(line.substr(name.size() + 1));
  }
  return 0;
}

std::string QuantizerText(const ipc::QuantInfo& q) {
  return internal::StrCat(QuantMethodName(static_cast<QuantMethod>(q.method)), " k", int{q.k_bits},
                          "v", int{q.v_bits}, ", block ", q.block_tokens, " tokens, ",
                          q.sink_tokens, " sinks, flush every ", q.flush_tokens);
}

}  // namespace

double Percentile(std::vector<double>& samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double rank = std::ceil(p * static_cast<double>(samples.size()));
  const size_t index = static_cast<size_t>(std::clamp(rank, 1.0, double(samples.size()))) - 1;
  return samples[index];
}

LatencyStats SummarizeLatency(std::vector<double> samples_us) {
  LatencyStats s;
  s.n = static_cast<int64_t>(samples_us.size());
  if (samples_us.empty()) return s;
  s.p50_us = Percentile(samples_us, 0.50);
  s.p99_us = Percentile(samples_us, 0.99);
  s.min_us = samples_us.front();
  s.max_us = samples_us.back();
  double sum = 0;
  for (double x : samples_us) sum += x;
  s.mean_us = sum / static_cast<double>(samples_us.size());
  return s;
}

StatusOr<IpcBenchReport> RunIpcBench(const IpcBenchOptions& options) {
  KVCTL_RETURN_IF_ERROR(ValidateOptions(options));
  const auto started = Clock::now();
  auto wants = [&](const char* group) {
    return options.rows.empty() ||
           std::find(options.rows.begin(), options.rows.end(), group) != options.rows.end();
  };
  IpcBenchReport report;
  report.cpu = CpuModel();
  report.load_start = LoadAverage();
  report.iterations = options.iterations;
  report.warmup = options.warmup;
  report.workers = options.workers;
  report.think_us = options.think_us;
  report.evict_mib = options.evict_mib;
  report.quick = options.quick;
  report.pool_bytes = PoolBytesFor(options);

  static std::atomic<int> run_counter{0};
  const std::string tag = internal::StrCat("kvbench-ipc-", getpid(), "-", run_counter.fetch_add(1));
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string endpoint = "ipc://" + dir + "/" + tag + ".sock";
  const std::string raw_endpoint = "ipc://" + dir + "/" + tag + "-raw.sock";
  KVCTL_ASSIGN_OR_RETURN(Config config, MakeConfig(endpoint, "/" + tag, report.pool_bytes,
                                                   options.workers, options.settings));
  KVCTL_ASSIGN_OR_RETURN(Config direct_config,
                         MakeConfig(endpoint, "/" + tag + "-direct", report.pool_bytes,
                                    options.workers, options.settings));

  Bench b(options, &report);
  b.data = MakeKvData();
  KVCTL_ASSIGN_OR_RETURN(b.daemon, DaemonThread::Start(config));
  KVCTL_ASSIGN_OR_RETURN(b.direct, Controller::Create(direct_config));
  b.direct->EnableHeldFlushQueue();  // As the daemon; MeasureRow runs them after the handler.
  size_t max_reply = 1 << 20;
  for (int64_t t : options.fetch_tokens) {
    max_reply = std::max<size_t>(max_reply, static_cast<size_t>(t) * kHeads * kHeadDim * 4);
  }
  KVCTL_ASSIGN_OR_RETURN(b.raw_server, RawEchoServer::Start(raw_endpoint, max_reply));
  KVCTL_ASSIGN_OR_RETURN(b.client, ipc::Client::Connect(endpoint, kClientTimeoutMs));
  KVCTL_ASSIGN_OR_RETURN(b.raw, RawClient::Connect(raw_endpoint, max_reply));

  ipc::HelloRequest hello{.client_name = "kvbench-ipc",
                          .model_name = "SmolLM2-135M",
                          .geometry = {kLayers, kHeads, 0, kHeadDim, DType::kF16}};
  KVCTL_ASSIGN_OR_RETURN(b.hello, b.client->Hello(hello));
  KVCTL_ASSIGN_OR_RETURN(b.direct_hello, b.direct->Hello(hello, Clock::now()));
  b.quant = {b.hello.session_id, b.direct_hello.session_id};
  report.quantizer = QuantizerText(b.hello.quant);
  if (wants("fetch_dense_lossless")) {
    hello.model_name = kLosslessModel;
    KVCTL_ASSIGN_OR_RETURN(ipc::HelloReply h, b.client->Hello(hello));
    KVCTL_ASSIGN_OR_RETURN(ipc::HelloReply dh, b.direct->Hello(hello, Clock::now()));
    b.lossless = {h.session_id, dh.session_id};
  }

  if (wants("ping")) KVCTL_RETURN_IF_ERROR(RunPingRow(b));
  if (wants("append_inline")) KVCTL_RETURN_IF_ERROR(RunAppendRow(b, /*staging=*/false));
  if (wants("append_staging")) KVCTL_RETURN_IF_ERROR(RunAppendRow(b, /*staging=*/true));
  std::vector<int64_t> lengths = options.fetch_tokens;
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  const std::string method =
      std::string(QuantMethodName(static_cast<QuantMethod>(b.hello.quant.method)));
  const std::string bits =
      internal::StrCat(" k", int{b.hello.quant.k_bits}, "v", int{b.hello.quant.v_bits});
  for (int64_t t : lengths) {
    const std::string label = TokensLabel(t);
    if (wants("fetch_dense") || wants("fetch_blocks") || wants("fetch_blocks_held")) {
      KVCTL_ASSIGN_OR_RETURN(uint64_t seq, b.Prefill(b.quant, t));
      if (wants("fetch_dense")) {
        KVCTL_RETURN_IF_ERROR(RunFetchRow(b, b.quant, seq, t, FetchKind::kDense, "fetch_dense",
                                          "fetch dense " + label + ", " + method + bits));
      }
      if (wants("fetch_blocks")) {
        KVCTL_RETURN_IF_ERROR(RunFetchRow(b, b.quant, seq, t, FetchKind::kBlocks, "fetch_blocks",
                                          "fetch blocks " + label + ", " + method + bits));
      }
      if (wants("fetch_blocks_held")) {
        KVCTL_RETURN_IF_ERROR(RunFetchRow(b, b.quant, seq, t, FetchKind::kBlocksHeld,
                                          "fetch_blocks_held",
                                          "fetch blocks held " + label + ", " + method + bits));
      }
    }
    if (wants("fetch_dense_lossless")) {
      KVCTL_ASSIGN_OR_RETURN(uint64_t seq, b.Prefill(b.lossless, t));
      KVCTL_RETURN_IF_ERROR(RunFetchRow(b, b.lossless, seq, t, FetchKind::kDense,
                                        "fetch_dense_lossless",
                                        "fetch dense " + label + ", lossless"));
    }
  }

  // The daemon's own accounting must match what was sent: every request answered, none failed.
  KVCTL_ASSIGN_OR_RETURN(std::string stats, b.client->Stats(0, ""));
  report.daemon_requests =
      StatsField(stats, "append_requests_total") + StatsField(stats, "fetch_requests_total");
  report.daemon_errors =
      StatsField(stats, "append_errors_total") + StatsField(stats, "fetch_errors_total");
  if (report.daemon_requests != report.requests_sent || report.daemon_errors != 0) {
    return Internal("the daemon counted ", report.daemon_requests, " APPEND/FETCH requests and ",
                    report.daemon_errors, " errors; the benchmark sent ", report.requests_sent,
                    " and got no error");
  }
  b.client.reset();
  if (const int code = b.daemon->Stop(); code != 0) {
    return Internal("the daemon exited with code ", code, " instead of stopping cleanly");
  }
  report.load_end = LoadAverage();
  report.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return report;
}

}  // namespace kvctl
