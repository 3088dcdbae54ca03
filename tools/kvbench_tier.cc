// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvbench_tier.cc
// kvbench_tier: the cluster tier's client throughput (docs/tier.md "Client throughput").
// For each value size it times BlobStore Put/Get (chunked, pipelined per master) against one raw
// SET/GET of the whole value, both through the same RedisCluster (the same hiredis connections),
// interleaved round by round so drift hits both alike, and prints MB/s (10^6 bytes per second,
// from the median round) and the ratios blob/raw. Needs a running cluster:
//
//   tools/redis_cluster.sh start /tmp/kvbench-tier 7300 3
//   build/bin/kvbench_tier --seeds 127.0.0.1:7300 --sizes 65536,1048576,8388608,33554432
//   tools/redis_cluster.sh stop /tmp/kvbench-tier
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tier/blob_store.h"
#include "tier/redis_cluster.h"
#include "tools/kvbench_command.h"

namespace kvctl {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  size_t bytes = 0;
  int rounds = 0;
  double raw_set = 0, raw_get = 0, blob_put = 0, blob_get = 0;  // MB/s.
};

double Median(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

template <typename F>
Status Timed(std::vector<double>& seconds, F f) {
  const auto start = Clock::now();
  Status status = f();
  seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  return status;
}

StatusOr<std::vector<Row>> Run(const std::vector<std::string>& seeds,
                               const std::vector<size_t>& sizes, size_t chunk_bytes,
                               size_t bytes_per_size, int min_rounds) {
  tier::ClusterOptions options;
  options.seeds = seeds;
  options.command_timeout = std::chrono::milliseconds(10000);
  KVCTL_ASSIGN_OR_RETURN(std::unique_ptr<tier::RedisCluster> cluster,
                         tier::RedisCluster::Connect(options));
  tier::BlobStore blobs(cluster.get(), chunk_bytes);
  std::mt19937_64 rng(42);
  std::vector<Row> rows;
  for (size_t size : sizes) {
    std::vector<uint8_t> value(size);
    for (auto& b : value) b = static_cast<uint8_t>(rng());
    const std::string raw_key = "kvbench/raw/" + std::to_string(size);
    const std::string blob_name = "kvbench/blob/" + std::to_string(size);
    Row row;
    row.bytes = size;
    row.rounds =
        std::max<int>(min_rounds, static_cast<int>(bytes_per_size / std::max<size_t>(size, 1)));
    std::vector<double> set_s, get_s, put_s, blob_get_s;
    for (int round = -1; round < row.rounds; ++round) {  // Round -1 warms up and checks.
      std::vector<double> discard;
      auto& set_t = round < 0 ? discard : set_s;
      auto& get_t = round < 0 ? discard : get_s;
      auto& put_t = round < 0 ? discard : put_s;
      auto& blob_get_t = round < 0 ? discard : blob_get_s;
      KVCTL_RETURN_IF_ERROR(
          Timed(set_t, [&] { return cluster->Set(raw_key, value, std::chrono::milliseconds(0)); }));
      KVCTL_RETURN_IF_ERROR(Timed(get_t, [&]() -> Status {
        KVCTL_ASSIGN_OR_RETURN(auto got, cluster->Get(raw_key));
        if (!got || got->size() != size) return Internal("raw GET returned the wrong size");
        return OkStatus();
      }));
      KVCTL_RETURN_IF_ERROR(
          Timed(put_t, [&] { return blobs.Put(blob_name, value, std::chrono::milliseconds(0)); }));
      KVCTL_RETURN_IF_ERROR(Timed(blob_get_t, [&]() -> Status {
        KVCTL_ASSIGN_OR_RETURN(std::vector<uint8_t> got, blobs.Get(blob_name));
        if (round < 0 && got != value) return Internal("BlobStore Get returned other bytes");
        return OkStatus();
      }));
    }
    const double mb = static_cast<double>(size) / 1e6;
    row.raw_set = mb / Median(set_s);
    row.raw_get = mb / Median(get_s);
    row.blob_put = mb / Median(put_s);
    row.blob_get = mb / Median(blob_get_s);
    rows.push_back(row);
    const std::string raw[] = {raw_key};
    KVCTL_RETURN_IF_ERROR(cluster->Del(raw));
    KVCTL_RETURN_IF_ERROR(blobs.Del(blob_name));
  }
  return rows;
}

std::string Format(const std::vector<Row>& rows, size_t chunk_bytes) {
  std::string out;
  Appendf(&out, "kvbench tier: BlobStore (chunks of %zu bytes) vs one raw SET/GET, MB/s (median)\n",
          chunk_bytes);
  Appendf(&out, "%10s %6s %9s %9s %9s %9s %8s %8s\n", "bytes", "rounds", "raw SET", "blob Put",
          "raw GET", "blob Get", "Put/SET", "Get/GET");
  for (const Row& r : rows) {
    Appendf(&out, "%10zu %6d %9.1f %9.1f %9.1f %9.1f %7.2fx %7.2fx\n", r.bytes, r.rounds, r.raw_set,
            r.blob_put, r.raw_get, r.blob_get, r.blob_put / r.raw_set, r.blob_get / r.raw_get);
  }
  return out;
}

}  // namespace
}  // namespace kvctl

int main(int argc, char** argv) {
  CLI::App app{"kvbench_tier: cluster tier client throughput (docs/tier.md)"};
  std::string seeds_text = "127.0.0.1:7100";
  std::vector<size_t> sizes = {64 << 10, 1 << 20, 8 << 20, 32 << 20};
  size_t chunk_bytes = 1 << 20;
  size_t bytes_per_size = 256 << 20;
  int min_rounds = 5;
  app.add_option("--seeds", seeds_text, "comma-separated host:port of cluster nodes");
  app.add_option("--sizes", sizes, "value sizes in bytes")->delimiter(',');
  app.add_option("--chunk", chunk_bytes, "BlobStore chunk size in bytes")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--bytes-per-size", bytes_per_size,
                 "bytes moved per size and operation (sets rounds)");
  app.add_option("--min-rounds", min_rounds, "at least this many timed rounds per size")
      ->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> seeds;
  for (size_t start = 0; start <= seeds_text.size();) {
    const size_t comma = std::min(seeds_text.find(',', start), seeds_text.size());
    if (comma > start) seeds.push_back(seeds_text.substr(start, comma - start));
    start = comma + 1;
  }
  return kvctl::RunBenchCommand(
      "kvbench_tier",
      [&] { return kvctl::Run(seeds, sizes, chunk_bytes, bytes_per_size, min_rounds); },
      [&](const std::vector<kvctl::Row>& rows) { return kvctl::Format(rows, chunk_bytes); }, stdout,
      stderr);
}
