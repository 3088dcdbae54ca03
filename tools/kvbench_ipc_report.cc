// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvbench ipc: the text table, the JSON object and the command entry point.
#include <cmath>
#include <cstdarg>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "common/json_text.h"
#include "tools/kvbench_command.h"
#include "tools/kvbench_ipc.h"

namespace kvctl {
namespace {

// Non-finite numbers have no JSON spelling.
std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  std::string s;
  Appendf(&s, "%.6g", x);
  return s;
}

std::string LatencyJson(const LatencyStats& l) {
  if (l.n == 0) return "null";
  std::string s;
  Appendf(&s, "{\"n\": %lld, ", static_cast<long long>(l.n));
  s += "\"p50_us\": " + Num(l.p50_us) + ", \"p99_us\": " + Num(l.p99_us) +
       ", \"mean_us\": " + Num(l.mean_us) + ", \"min_us\": " + Num(l.min_us) +
       ", \"max_us\": " + Num(l.max_us) + "}";
  return s;
}

std::string ListJson(const std::vector<uint64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const LatencyStats& Baseline(const IpcBenchRow& row) {
  return row.baseline_64 ? row.raw_64 : row.raw_same;
}

}  // namespace

std::string FormatIpcTable(const IpcBenchReport& r) {
  std::string out;
  Appendf(&out, "kvbench ipc%s: kvctl requests vs raw ZeroMQ DEALER/ROUTER round trips, one run\n",
          r.quick ? " (--quick)" : "");
  Appendf(&out, "machine:  %s, %u CPUs; load average %.2f at the start, %.2f at the end\n",
          r.cpu.c_str(), std::thread::hardware_concurrency(), r.load_start, r.load_end);
  Appendf(&out,
          "daemon:   in-process kvctl::Daemon on an ipc:// socket, %d workers, pool %.0f MiB\n",
          r.workers, static_cast<double>(r.pool_bytes) / (1 << 20));
  Appendf(&out, "quant:    %s (lossless rows: quant.lossless = true)\n", r.quantizer.c_str());
  Appendf(&out, "geometry: SmolLM2-135M, %d layers, %d KV heads, head_dim %d, fp16\n", r.layers,
          r.kv_heads, r.head_dim);
  Appendf(&out,
          "samples:  %d per row and side after %d warm-up, interleaved (kvctl, raw, handler); "
          "microseconds, nearest-rank p50/p99\n",
          r.iterations, r.warmup);
  if (r.think_us > 0) {
    Appendf(&out, "think:    %lld us untimed before each iteration (the engine's step)\n",
            static_cast<long long>(r.think_us));
  }
  if (r.evict_mib > 0) {
    Appendf(&out, "evict:    %lld MiB written untimed before each timed call (cold caches)\n",
            static_cast<long long>(r.evict_mib));
  }
  out += "\n";
  Appendf(&out, "%-34s %9s %9s | %8s %8s | %8s %8s %-5s | %6s %6s %-6s | %8s %8s %9s\n", "row",
          "req B", "reply B", "kvctl50", "kvctl99", "raw50", "raw99", "raw", "ratio", "target",
          "result", "same-B50", "handler", "hdl max");
  for (const IpcBenchRow& row : r.rows) {
    const LatencyStats& base = Baseline(row);
    Appendf(&out,
            "%-34s %9llu %9llu | %8.1f %8.1f | %8.1f %8.1f %-5s | %6.2f %6s %-6s | %8.1f %8.1f "
            "%9.1f\n",
            row.name.c_str(), static_cast<unsigned long long>(row.request_bytes),
            static_cast<unsigned long long>(row.reply_bytes), row.kvctl.p50_us, row.kvctl.p99_us,
            base.p50_us, base.p99_us, row.baseline_64 ? "64 B" : "same", row.ratio_p50,
            row.target > 0 ? ("<=" + Num(row.target)).c_str() : "-",
            row.target > 0 ? (row.met ? "PASS" : "MISS") : "-", row.raw_same.p50_us,
            row.handler.p50_us, row.handler.max_us);
  }
  out +=
      "  raw: the baseline round trip of the target, \"same\" = the same frames as the kvctl\n"
      "  request and reply, \"64 B\" = a 64-byte request and reply; ratio = kvctl p50 / raw p50.\n"
      "  same-B50: p50 of the same-frames raw round trip; handler: p50 of the same Controller\n"
      "  call in-process, no sockets; hdl max: its slowest sample (for APPEND rows, the decode\n"
      "  step that flushed: quant.flush_spread_steps spreads it). Staging APPEND times include\n"
      "  the copy into the slot.\n";
  Appendf(&out,
          "requests: %llu APPEND/FETCH sent, %llu counted by the daemon, %llu errors; %.1f s\n",
          static_cast<unsigned long long>(r.requests_sent),
          static_cast<unsigned long long>(r.daemon_requests),
          static_cast<unsigned long long>(r.daemon_errors), r.seconds);
  return out;
}

std::string FormatIpcJson(const IpcBenchReport& r) {
  std::string s = "{\n";
  s += "  \"command\": \"ipc\",\n";
  s += "  \"cpu\": " + JsonQuoted(r.cpu) + ",\n";
  Appendf(&s, "  \"cpus\": %u,\n", std::thread::hardware_concurrency());
  s += std::string("  \"quick\": ") + (r.quick ? "true" : "false") + ",\n";
  Appendf(&s, "  \"iterations\": %d,\n  \"warmup\": %d,\n  \"workers\": %d,\n", r.iterations,
          r.warmup, r.workers);
  Appendf(&s, "  \"think_us\": %lld,\n", static_cast<long long>(r.think_us));
  Appendf(&s, "  \"evict_mib\": %lld,\n", static_cast<long long>(r.evict_mib));
  Appendf(&s,
          "  \"geometry\": {\"layers\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
          "\"dtype\": \"float16\"},\n",
          r.layers, r.kv_heads, r.head_dim);
  s += "  \"quantizer\": " + JsonQuoted(r.quantizer) + ",\n";
  Appendf(&s, "  \"pool_bytes\": %llu,\n", static_cast<unsigned long long>(r.pool_bytes));
  Appendf(&s,
          "  \"requests_sent\": %llu,\n  \"daemon_requests\": %llu,\n  \"daemon_errors\": %llu,\n",
          static_cast<unsigned long long>(r.requests_sent),
          static_cast<unsigned long long>(r.daemon_requests),
          static_cast<unsigned long long>(r.daemon_errors));
  s += "  \"seconds\": " + Num(r.seconds) + ",\n";
  s += "  \"load_start\": " + Num(r.load_start) + ",\n  \"load_end\": " + Num(r.load_end) + ",\n";
  s += "  \"rows\": [";
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const IpcBenchRow& row = r.rows[i];
    s += i ? ",\n    {" : "\n    {";
    s += "\"group\": " + JsonQuoted(row.group) + ", \"name\": " + JsonQuoted(row.name) + ",\n     ";
    Appendf(&s, "\"request_bytes\": %llu, \"reply_bytes\": %llu, ",
            static_cast<unsigned long long>(row.request_bytes),
            static_cast<unsigned long long>(row.reply_bytes));
    s += "\"request_frames\": " + ListJson(row.request_frames) +
         ", \"reply_frames\": " + ListJson(row.reply_frames) + ",\n     ";
    s += std::string("\"baseline\": ") +
         (row.baseline_64 ? "\"raw_64_bytes\"" : "\"raw_same_bytes\"");
    s += ", \"ratio_p50\": " + Num(row.ratio_p50) + ", \"ratio_p99\": " + Num(row.ratio_p99) +
         ", \"target\": " + (row.target > 0 ? Num(row.target) : "null") +
         ", \"met\": " + (row.target > 0 ? (row.met ? "true" : "false") : "null") + ",\n     ";
    s += "\"kvctl\": " + LatencyJson(row.kvctl) + ",\n     ";
    s += "\"raw_same_bytes\": " + LatencyJson(row.raw_same) + ",\n     ";
    s += "\"raw_64_bytes\": " + LatencyJson(row.raw_64) + ",\n     ";
    s += "\"handler\": " + LatencyJson(row.handler) + "}";
  }
  s += "\n  ]\n}\n";
  return s;
}

int RunIpcCommand(const IpcBenchOptions& options, bool json, std::FILE* out, std::FILE* err) {
  return RunBenchCommand(
      "kvbench ipc", [&] { return RunIpcBench(options); },
      [&](const auto& report) { return json ? FormatIpcJson(report) : FormatIpcTable(report); },
      out, err);
}

}  // namespace kvctl
