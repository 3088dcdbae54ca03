// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/kvbench_pool.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>

#include "controller/pool/pool.h"
#include "controller/sequence/kv_sequence.h"
#include "kernels/quant_types.h"
#include "tests/support/synthetic_kv.h"
#include "tools/kvbench_command.h"

namespace kvctl {
namespace {

struct Geometry {
  const char* name;
  int layers, kv_heads, head_dim;
};
constexpr Geometry kGeometries[] = {{"smollm2", 30, 3, 64}, {"llama3-8b", 32, 8, 128}};

struct Method {
  const char* name;
  QuantMethod method;
  int bits;
};
constexpr Method kMethods[] = {{"kvarn2", QuantMethod::kKvarn, 2},
                               {"kivi2", QuantMethod::kKivi, 2},
                               {"kivi4", QuantMethod::kKivi, 4},
                               {"quarot4", QuantMethod::kQuaRot, 4}};

// The entries of `all` named in `names` (all of them when empty); INVALID_ARGUMENT naming `flag`.
template <typename T, size_t N>
StatusOr<std::vector<const T*>> Select(const T (&all)[N], const std::vector<std::string>& names,
                                       const char* flag) {
  std::vector<const T*> out;
  for (const T& entry : all) {
    if (names.empty() || std::find(names.begin(), names.end(), entry.name) != names.end()) {
      out.push_back(&entry);
    }
  }
  for (const std::string& name : names) {
    bool known = false;
    for (const T& entry : all) known |= name == entry.name;
    if (!known) return InvalidArgument(flag, ": unknown \"", name, "\"");
  }
  return out;
}

// Pages the same slots take when every stream and kind holds pages of its own.
uint64_t PerStreamPages(const KvSequence& seq, const Geometry& g, uint64_t page_bytes) {
  const uint64_t row_slot = 2 * static_cast<uint64_t>(g.head_dim) * 2;
  uint64_t pages = 0;
  for (int l = 0; l < g.layers; ++l) {
    for (int h = 0; h < g.kv_heads; ++h) {
      const HeadBlocks b = seq.Blocks(l, h);
      const uint64_t rows = b.sink_rows + b.tail_rows, per_row_page = page_bytes / row_slot;
      pages += (rows + per_row_page - 1) / per_row_page;
      pages += (b.records + b.records_per_page - 1) / b.records_per_page;
    }
  }
  return pages;
}

StatusOr<std::vector<PoolBenchRow>> RunOne(const Geometry& g, const Method& m,
                                           const std::vector<int64_t>& checkpoints,
                                           const PoolBenchOptions& options) {
  static std::atomic<int> counter{0};
  const int64_t tokens = checkpoints.back();
  const uint64_t fp16_max = 2ull * g.layers * g.kv_heads * g.head_dim * 2 * tokens;
  KVCTL_ASSIGN_OR_RETURN(auto arena,
                         ShmArena::Create("/kvctl-kvbench-pool-" + std::to_string(getpid()) + "-" +
                                              std::to_string(counter++),
                                          fp16_max + 256 * options.page_bytes));
  KVCTL_ASSIGN_OR_RETURN(
      auto pool, PageAllocator::Create(std::move(arena), {.page_bytes = options.page_bytes}));
  KVCTL_ASSIGN_OR_RETURN(QuantSpec spec, MakeQuantSpec(m.method, g.head_dim, m.bits, m.bits));
  std::vector<LayerPlan> plans(static_cast<size_t>(g.layers));
  for (LayerPlan& p : plans) {
    p.rules = TraitsOf(m.method).streaming;
    p.head_specs.assign(static_cast<size_t>(g.kv_heads), spec);
  }
  KvSequence seq(pool.get(), {g.layers, g.kv_heads, g.head_dim, DType::kF32}, std::move(plans));
  const SyntheticKv kv = GenerateSyntheticKv(
      {.tokens = tokens, .heads = g.kv_heads, .head_dim = g.head_dim, .seed = 11});
  auto views = [&](const KvTensorView& all, int64_t first, int64_t count) {
    return std::vector<KvTensorView>(static_cast<size_t>(g.layers), all.Tokens(first, count));
  };
  std::vector<PoolBenchRow> rows;
  int64_t t = 0;
  for (int64_t checkpoint : checkpoints) {
    while (t < checkpoint) {
      const int64_t n = t == 0 ? std::min(options.prefill, checkpoint) : 1;
      KVCTL_RETURN_IF_ERROR(seq.Append(t, views(kv.KView(), t, n), views(kv.VView(), t, n)));
      t += n;
    }
    const SequenceUsage u = seq.Usage();
    PoolBenchRow row;
    row.geometry = g.name;
    row.method = m.name;
    row.tokens = t;
    row.fp16_bytes = 2ull * g.layers * g.kv_heads * g.head_dim * 2 * static_cast<uint64_t>(t);
    row.payload_bytes = u.payload_bytes;
    row.reserved_bytes = u.pool_bytes;
    row.per_stream_bytes = PerStreamPages(seq, g, options.page_bytes) * options.page_bytes;
    row.slots_moved_per_token = static_cast<double>(seq.slots_moved()) / static_cast<double>(t);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

StatusOr<PoolBenchReport> RunPoolBench(const PoolBenchOptions& options) {
  PoolBenchOptions o = options;
  if (o.quick) {
    if (o.geometries.empty()) o.geometries = {"smollm2"};
    if (o.methods.empty()) o.methods = {"kvarn2", "kivi2"};
    if (o.tokens.empty()) o.tokens = {256, 512};
  }
  if (o.tokens.empty()) o.tokens = {256, 512, 1024, 2048};
  std::sort(o.tokens.begin(), o.tokens.end());
  if (o.tokens.front() < 1 || o.tokens.back() > (1 << 20)) {
    return InvalidArgument("--tokens: got ", o.tokens.front(), "..", o.tokens.back(),
                           ", expected 1..1048576");
  }
  if (o.prefill < 1) return InvalidArgument("--prefill: got ", o.prefill, ", expected >= 1");
  KVCTL_ASSIGN_OR_RETURN(auto geometries, Select(kGeometries, o.geometries, "--geometries"));
  KVCTL_ASSIGN_OR_RETURN(auto methods, Select(kMethods, o.methods, "--methods"));
  PoolBenchReport report;
  report.page_bytes = o.page_bytes;
  for (const Geometry* g : geometries) {
    for (const Method* m : methods) {
      KVCTL_ASSIGN_OR_RETURN(std::vector<PoolBenchRow> rows, RunOne(*g, *m, o.tokens, o));
      report.rows.insert(report.rows.end(), rows.begin(), rows.end());
    }
  }
  return report;
}

std::string FormatPoolTable(const PoolBenchReport& report) {
  std::string out;
  Appendf(&out, "kvbench pool: one sequence, prefill then decode steps, %llu-byte pages\n",
          static_cast<unsigned long long>(report.page_bytes));
  Appendf(&out, "%-10s %-8s %6s %10s %10s %10s %10s %8s %8s %8s %7s\n", "geometry", "method",
          "tokens", "fp16", "payload", "reserved", "per-strm", "pay/fp16", "res/fp16", "res/pay",
          "moved/t");
  for (const PoolBenchRow& r : report.rows) {
    auto ratio = [](uint64_t a, uint64_t b) {
      return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b);
    };
    Appendf(&out, "%-10s %-8s %6lld %10llu %10llu %10llu %10llu %8.3f %8.3f %8.3f %7.2f\n",
            r.geometry.c_str(), r.method.c_str(), static_cast<long long>(r.tokens),
            static_cast<unsigned long long>(r.fp16_bytes),
            static_cast<unsigned long long>(r.payload_bytes),
            static_cast<unsigned long long>(r.reserved_bytes),
            static_cast<unsigned long long>(r.per_stream_bytes),
            ratio(r.payload_bytes, r.fp16_bytes), ratio(r.reserved_bytes, r.fp16_bytes),
            ratio(r.reserved_bytes, r.payload_bytes), r.slots_moved_per_token);
  }
  return out;
}

std::string FormatPoolJson(const PoolBenchReport& report) {
  std::string out = "{\"page_bytes\": " + std::to_string(report.page_bytes) + ", \"rows\": [";
  for (size_t i = 0; i < report.rows.size(); ++i) {
    const PoolBenchRow& r = report.rows[i];
    Appendf(&out,
            "%s{\"geometry\": \"%s\", \"method\": \"%s\", \"tokens\": %lld, \"fp16_bytes\": %llu, "
            "\"payload_bytes\": %llu, \"reserved_bytes\": %llu, \"per_stream_bytes\": %llu, "
            "\"slots_moved_per_token\": %.4f}",
            i == 0 ? "" : ", ", r.geometry.c_str(), r.method.c_str(),
            static_cast<long long>(r.tokens), static_cast<unsigned long long>(r.fp16_bytes),
            static_cast<unsigned long long>(r.payload_bytes),
            static_cast<unsigned long long>(r.reserved_bytes),
            static_cast<unsigned long long>(r.per_stream_bytes), r.slots_moved_per_token);
  }
  return out + "]}\n";
}

int RunPoolCommand(const PoolBenchOptions& options, bool json, std::FILE* out, std::FILE* err) {
  return RunBenchCommand(
      "kvbench pool", [&] { return RunPoolBench(options); },
      [json](const PoolBenchReport& r) { return json ? FormatPoolJson(r) : FormatPoolTable(r); },
      out, err);
}

}  // namespace kvctl
