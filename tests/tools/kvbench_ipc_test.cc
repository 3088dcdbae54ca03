// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/kvbench_ipc.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kvctl {
namespace {

using Catch::Matchers::Contains;

void CheckLatency(const LatencyStats& l, int64_t n) {
  CHECK(l.n == n);
  CHECK(l.min_us > 0);
  CHECK(l.min_us <= l.p50_us);
  CHECK(l.p50_us <= l.p99_us);
  CHECK(l.p99_us <= l.max_us);
  CHECK(l.mean_us >= l.min_us);
  CHECK(l.mean_us <= l.max_us);
}

TEST_CASE("KvbenchIpc: Percentile is nearest rank and SummarizeLatency orders its fields",
          "[tools]") {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  CHECK(Percentile(v, 0.50) == 50);
  CHECK(Percentile(v, 0.99) == 99);
  CHECK(Percentile(v, 1.0) == 100);
  std::vector<double> one = {7};
  CHECK(Percentile(one, 0.5) == 7);
  CHECK(Percentile(one, 0.99) == 7);
  std::vector<double> none;
  CHECK(Percentile(none, 0.5) == 0);

  const LatencyStats s = SummarizeLatency({4, 1, 3, 2});
  CHECK(s.n == 4);
  CHECK(s.p50_us == 2);
  CHECK(s.p99_us == 4);
  CHECK(s.min_us == 1);
  CHECK(s.max_us == 4);
  CHECK(s.mean_us == 2.5);
  CHECK(SummarizeLatency({}).n == 0);
}

TEST_CASE("KvbenchIpc: a small run through the real daemon answers every request", "[tools]") {
  IpcBenchOptions options;
  options.iterations = 6;
  options.warmup = 2;
  // 700 tokens: with KVarN's 128 sinks and flushes of 128 a partial tail stays fp16, so the
  // blocks reply carries sinks, records and tail; chunks of 256 make the prefill several APPENDs.
  options.fetch_tokens = {300, 700};
  options.prefill_chunk = 256;
  // The frame sizes below are laid out by 128 sinks: set them, not the registry's default.
  options.settings = {"quant.sink_tokens=128"};
  StatusOr<IpcBenchReport> report = RunIpcBench(options);
  INFO(report.status().message());
  REQUIRE(report.ok());
  const IpcBenchReport& r = *report;

  // Every APPEND/FETCH the benchmark sent (prefill, probes, warm-up and timed) reached the daemon
  // and succeeded: its own STATS counters agree.
  CHECK(r.requests_sent > 0);
  CHECK(r.daemon_requests == r.requests_sent);
  CHECK(r.daemon_errors == 0);
  CHECK_THAT(r.quantizer, Contains("kvarn k2v2"));
  CHECK(r.cpu != "");

  std::map<std::string, const IpcBenchRow*> rows;
  for (const IpcBenchRow& row : r.rows) rows[row.name] = &row;
  REQUIRE(r.rows.size() == 11);
  for (const IpcBenchRow& row : r.rows) {
    INFO(row.name);
    CheckLatency(row.kvctl, 6);
    CheckLatency(row.raw_same, 6);
    CheckLatency(row.handler, 6);
    if (row.baseline_64) {
      CheckLatency(row.raw_64, 6);
    } else {
      CHECK(row.raw_64.n == 0);
    }
    const LatencyStats& base = row.baseline_64 ? row.raw_64 : row.raw_same;
    CHECK(row.ratio_p50 == Approx(row.kvctl.p50_us / base.p50_us));
    CHECK(row.ratio_p99 == Approx(row.kvctl.p99_us / base.p99_us));
    CHECK(row.met == (row.target > 0 && row.ratio_p50 <= row.target));
    CHECK(row.request_bytes > 0);
    CHECK(row.reply_bytes > 0);
  }

  const IpcBenchRow* ping = rows.at("ping (diagnostic)");
  CHECK(ping->target == 0);  // A diagnostic: no target, never PASS.
  CHECK_FALSE(ping->met);
  CHECK(ping->request_frames == std::vector<uint64_t>{18 + 8});

  // The raw baseline carries exactly the kvctl frames: header + body, then the tensor frames.
  const IpcBenchRow* inline_append = rows.at("append inline, 1 token");
  CHECK(inline_append->request_frames == std::vector<uint64_t>{18 + 38, 11520, 11520});
  CHECK(inline_append->reply_frames == std::vector<uint64_t>{18 + 24});
  CHECK(inline_append->target == 1.3);
  const IpcBenchRow* staging = rows.at("append staging, 1 token");
  CHECK(staging->request_frames == std::vector<uint64_t>{18 + 38});
  CHECK(staging->baseline_64);
  CHECK(staging->target == 1.2);
  for (const char* name : {"fetch dense 700, kvarn k2v2", "fetch dense 700, lossless"}) {
    INFO(name);
    const IpcBenchRow* dense = rows.at(name);
    // Body: mode, 4 u32, dtype, 3 counts; then positions, K and V of 700 tokens x 3 heads.
    CHECK(dense->reply_frames == std::vector<uint64_t>{18 + 1 + 16 + 1 + 12, 700 * 3 * 8,
                                                       700 * 3 * 64 * 2, 700 * 3 * 64 * 2});
    CHECK(dense->request_frames == std::vector<uint64_t>{18 + 30});
  }
  const IpcBenchRow* blocks = rows.at("fetch blocks 700, kvarn k2v2");
  CHECK(blocks->baseline_64);
  // A page table only: 512 tokens in 4 records per head, and 128 sinks + 60 tail tokens per head
  // as window row slot ids (4 bytes each) with two position runs (12 bytes each) per head.
  // Body: mode, 8 u32, n_layouts, one 64-byte layout, 3 layout_index, indptr, 12 indices,
  // last_page_len, window_indptr, 564 window ids, window_sinks, run_indptr, 6 runs.
  REQUIRE(blocks->reply_frames.size() == 1);
  // Then record_base and table_tags per head.
  const uint64_t whole = 18 + 1 + 32 + 2 + 64 + 3 * 2 + 4 * 4 + 12 * 4 + 3 * 4 + 4 * 4 +
                         188 * 3 * 4 + 3 * 4 + 4 * 4 + 6 * 12 + 3 * 4 + 3 * 8;
  CHECK(blocks->reply_frames[0] == whole);
  CHECK(blocks->target == 1.3);
  CHECK(rows.count("fetch blocks 300, kvarn k2v2") == 1);
  // Holding the whole table, the request carries it (12 bytes per head) and the reply lists
  // none of the 12 records again.
  const IpcBenchRow* held = rows.at("fetch blocks held 700, kvarn k2v2");
  CHECK(held->baseline_64);
  CHECK(held->target == 1.3);
  CHECK(held->request_frames == std::vector<uint64_t>{18 + 30 + 3 * 12});
  CHECK(held->reply_frames == std::vector<uint64_t>{whole - 12 * 4});
  CHECK(rows.count("fetch blocks held 300, kvarn k2v2") == 1);

  const std::string table = FormatIpcTable(r);
  const std::string json = FormatIpcJson(r);
  for (const IpcBenchRow& row : r.rows) {
    CHECK_THAT(table, Contains(row.name));
    CHECK_THAT(json, Contains("\"name\": \"" + row.name + "\""));
  }
  CHECK_THAT(json, Contains("\"command\": \"ipc\""));

  // Nothing of the run is left behind: socket files (daemon and raw baseline) and shm pools.
  const std::string prefix = "kvbench-ipc-" + std::to_string(getpid()) + "-";
  for (const auto& dir :
       {std::filesystem::temp_directory_path(), std::filesystem::path("/dev/shm")}) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      INFO(entry.path());
      CHECK(entry.path().filename().string().rfind(prefix, 0) == std::string::npos);
    }
  }
}

TEST_CASE("KvbenchIpc: --rows selects row groups", "[tools]") {
  StatusOr<IpcBenchReport> report = RunIpcBench(
      {.iterations = 3, .warmup = 0, .fetch_tokens = {200}, .rows = {"append_staging"}});
  INFO(report.status().message());
  REQUIRE(report.ok());
  REQUIRE(report->rows.size() == 1);
  CHECK(report->rows[0].group == "append_staging");
  CHECK(report->requests_sent == 3);  // No prefill: no FETCH row was asked for.
  CHECK(report->daemon_requests == 3);
}

TEST_CASE("KvbenchIpc: --evict-mib runs every side after the caches were written over", "[tools]") {
  StatusOr<IpcBenchReport> report = RunIpcBench({.iterations = 3,
                                                 .warmup = 1,
                                                 .fetch_tokens = {200},
                                                 .evict_mib = 1,
                                                 .rows = {"ping", "append_staging"}});
  INFO(report.status().message());
  REQUIRE(report.ok());
  CHECK(report->evict_mib == 1);
  REQUIRE(report->rows.size() == 2);
  for (const IpcBenchRow& row : report->rows) {
    INFO(row.group);
    CHECK(row.kvctl.n == 3);
    CHECK(row.handler.n == 3);
    CHECK(row.raw_64.n == 3);
  }
  CHECK(report->daemon_errors == 0);
  CHECK(FormatIpcJson(*report).find("\"evict_mib\": 1,") != std::string::npos);
}

TEST_CASE("KvbenchIpc: bad options are refused with the flag named", "[tools]") {
  const std::vector<std::pair<IpcBenchOptions, std::string>> cases = {
      {{.iterations = 0}, "--iterations: got 0"},
      {{.warmup = -1}, "--warmup: got -1"},
      {{.fetch_tokens = {}}, "--tokens: got none"},
      {{.fetch_tokens = {1024, 0}}, "--tokens: got 0"},
      {{.prefill_chunk = 0}, "--prefill-chunk: got 0"},
      {{.workers = 65}, "--workers: got 65"},
      {{.evict_mib = -1}, "--evict-mib: got -1"},
      {{.evict_mib = 4097}, "--evict-mib: got 4097"},
      {{.rows = {"fetch_dense", "bogus"}}, "--rows: got \"bogus\""},
  };
  for (const auto& [options, message] : cases) {
    StatusOr<IpcBenchReport> report = RunIpcBench(options);
    INFO(message);
    REQUIRE_FALSE(report.ok());
    CHECK(report.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(report.status().message(), Contains(message));
  }
}

}  // namespace
}  // namespace kvctl
