// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvbench_ipc.h
// The engine of `kvbench ipc`: the round-trip latency of kvctl requests through the real daemon
// (kvctl::Daemon on a background thread: ZmqServer I/O thread, worker pool, Controller, shm pool)
// and the C++ client, against a raw ZeroMQ DEALER/ROUTER round trip carrying the same bytes,
// measured in the same run with the samples interleaved (kvctl, raw, raw, handler per iteration),
// so both see the same machine load. Rows (SmolLM2-135M geometry: 30 layers, 3 KV heads,
// head_dim 64, fp16):
//  * APPEND of one decode step (23,040 B of K+V), inline and through the shm staging slot;
//  * dense FETCH of one layer at each --tokens length, default quantizer and lossless;
//  * blocks FETCH (page table) of one layer, against a 64-byte raw round trip;
//  * PING (no target), answered on the server's I/O thread without the worker hand-off.
// A third number per row, "handler", is the same Controller call made in-process on a second
// Controller holding identical data, with no sockets: what the request costs without transport.
// See docs/kvbench_ipc.md.
//
// Thread safety: RunIpcBench may run concurrently with itself (endpoints and shm names are unique
// per call); it starts and joins its own threads.
//
//   KVCTL_ASSIGN_OR_RETURN(IpcBenchReport r, RunIpcBench({.iterations = 50, .warmup = 5}));
//   std::fputs(FormatIpcTable(r).c_str(), stdout);
#ifndef KVCTL_TOOLS_KVBENCH_IPC_H_
#define KVCTL_TOOLS_KVBENCH_IPC_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvctl {

// Row groups, for --rows. "ping" is a diagnostic without a target: PING is answered on the
// server's I/O thread, so ping vs append_staging separates the worker hand-off from the transport.
inline constexpr const char* kIpcRowGroups[] = {
    "ping",         "append_inline",    "append_staging", "fetch_dense", "fetch_dense_lossless",
    "fetch_blocks", "fetch_blocks_held"};

struct IpcBenchOptions {
  int iterations = 1000;  // Timed samples per row and per side (kvctl, raw, handler).
  int warmup = 50;        // Untimed round trips per row and side first.
  std::vector<int64_t> fetch_tokens = {1024, 8192};  // Sequence lengths of the FETCH rows.
  int prefill_chunk = 512;                           // Tokens per APPEND when filling them.
  // Tokens the APPEND rows' sequences hold before their first timed step (a decode step at this
  // context length; 0: from an empty sequence).
  int64_t append_context = 0;
  int workers = 2;  // The daemon's server.workers.
  // Untimed pause before each iteration (microseconds): the engine's own step between two
  // requests, during which the daemon may finish work it does after a reply
  // (quant.flush_after_reply). 0 = back to back.
  int64_t think_us = 0;
  // MiB written (untimed) by the benchmark's thread before each timed call of every side: what an
  // engine's own step does to the caches and TLB between two decode steps when it shares the CPU
  // (a CPU engine's weights and activations). 0 = warm, back to back.
  int64_t evict_mib = 0;
  std::vector<std::string> rows{};  // Subset of kIpcRowGroups; empty = all.
  bool quick = false;               // Recorded in the report only.
  // KEY=VALUE config settings for both daemons, after the bench's own (e.g. pool.checksums=false).
  std::vector<std::string> settings{};
};

// Latency of one side of a row, microseconds, from `n` sorted samples (nearest rank).
struct LatencyStats {
  int64_t n = 0;
  double p50_us = 0, p99_us = 0, mean_us = 0, min_us = 0, max_us = 0;
};

// The `p` quantile (0 < p <= 1) of `samples` by nearest rank: sorted[ceil(p * n) - 1]. Sorts in
// place. Zero for no samples.
double Percentile(std::vector<double>& samples, double p);
LatencyStats SummarizeLatency(std::vector<double> samples_us);

struct IpcBenchRow {
  std::string group;  // One of kIpcRowGroups.
  std::string name;   // "append inline", "fetch dense 8K kvarn k2v2", ...
  // kvctl message bytes, every frame (request: what the client sends; reply: what it receives).
  uint64_t request_bytes = 0, reply_bytes = 0;
  std::vector<uint64_t> request_frames, reply_frames;  // Per frame, frame 0 (header) first.
  LatencyStats kvctl;        // Client call, end to end (staging: including the copy into the slot).
  LatencyStats raw_same;     // Raw DEALER/ROUTER round trip with exactly the frames above.
  LatencyStats raw_64;       // 64-byte request, 64-byte reply; measured for 64-B baseline rows.
  LatencyStats handler;      // The Controller call alone, in-process (no sockets, no copy-in).
  bool baseline_64 = false;  // The target compares against raw_64 instead of raw_same.
  double ratio_p50 = 0, ratio_p99 = 0;  // kvctl / baseline.
  double target = 0;                    // Maximum ratio_p50 the issue asks for; 0 = none.
  bool met = false;                     // ratio_p50 <= target (false when there is none).
};

struct IpcBenchReport {
  std::string cpu;        // /proc/cpuinfo model name.
  std::string quantizer;  // "kvarn k2v2, block 128, 128 sinks, flush 128".
  int iterations = 0, warmup = 0, workers = 0;
  int64_t think_us = 0, evict_mib = 0;
  int layers = 30, kv_heads = 3, head_dim = 64;
  bool quick = false;
  uint64_t pool_bytes = 0;
  // Every kvctl request the benchmark sent (setup included) was answered without error, and the
  // daemon's own STATS counters for APPEND and FETCH agree with what was sent.
  uint64_t requests_sent = 0;    // APPEND + FETCH requests sent to the daemon.
  uint64_t daemon_requests = 0;  // append_requests_total + fetch_requests_total from STATS.
  uint64_t daemon_errors = 0;    // append_errors_total + fetch_errors_total.
  double seconds = 0;            // Wall time of the whole run.
  // 1-minute load average (/proc/loadavg) at the start and the end: other work on the machine
  // shows in the tails.
  double load_start = 0, load_end = 0;
  std::vector<IpcBenchRow> rows;
};

// Starts the daemon, the raw echo server and the direct Controller, fills the FETCH sequences and
// measures every selected row. INVALID_ARGUMENT for bad options (naming the flag); any failed kvctl
// request fails the run with that request's status.
StatusOr<IpcBenchReport> RunIpcBench(const IpcBenchOptions& options);

// An aligned text table with a header naming the machine and the settings.
std::string FormatIpcTable(const IpcBenchReport& report);
// One JSON object: settings, request accounting and every row with all four latency summaries.
std::string FormatIpcJson(const IpcBenchReport& report);

// RunIpcBench, then the table or JSON on `out`. On error prints "kvbench ipc: <message>" on `err`
// and returns 1; 0 on success (missed targets are reported, not errors).
int RunIpcCommand(const IpcBenchOptions& options, bool json, std::FILE* out, std::FILE* err);

}  // namespace kvctl

#endif  // KVCTL_TOOLS_KVBENCH_IPC_H_
