// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvbench_pool.h
// The engine of `kvbench pool`: what a sequence really costs the pool. A KvSequence on a real shm
// pool (64 KiB pages unless --page-bytes) is filled the way an engine fills it (a prefill chunk,
// then single-token decode steps) with synthetic K/V of a model geometry, and at each checkpoint
// the report gives, against an fp16 cache of the same tokens:
//  * payload: records, rows and norms in use (what bits/element counts);
//  * reserved: the pool pages the sequence holds (its slabs, docs/algorithms.md §16);
//  * per-stream pages: the pages the same slots would take if every (layer, head) stream and kind
//    held pages of its own (the allocator before slabs), computed from the same slot counts;
//  * slots moved by compaction so far, per appended token.
// See docs/kvbench_pool.md.
//
// Thread safety: RunPoolBench may run concurrently with itself (shm names are unique per call).
//
//   KVCTL_ASSIGN_OR_RETURN(PoolBenchReport r, RunPoolBench({.quick = true}));
//   std::fputs(FormatPoolTable(r).c_str(), stdout);
#ifndef KVCTL_TOOLS_KVBENCH_POOL_H_
#define KVCTL_TOOLS_KVBENCH_POOL_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvctl {

struct PoolBenchOptions {
  std::vector<std::string> geometries;  // smollm2, llama3-8b; empty = both.
  std::vector<std::string> methods;     // kvarn2, kivi2, kivi4, quarot4, fp16; empty = all.
  std::vector<int64_t> tokens;          // Checkpoints; empty = 256,512,1024,2048 (+8192 full).
  int64_t prefill = 128;                // Tokens of the first APPEND; decode steps after it.
  uint64_t page_bytes = 64 << 10;
  bool quick = false;  // SmolLM2, kvarn2 and kivi2, up to 512 tokens.
};

struct PoolBenchRow {
  std::string geometry, method;
  int64_t tokens = 0;
  uint64_t fp16_bytes = 0, payload_bytes = 0, reserved_bytes = 0, per_stream_bytes = 0;
  double slots_moved_per_token = 0;
};

struct PoolBenchReport {
  uint64_t page_bytes = 0;
  std::vector<PoolBenchRow> rows;
};

StatusOr<PoolBenchReport> RunPoolBench(const PoolBenchOptions& options);
std::string FormatPoolTable(const PoolBenchReport& report);
std::string FormatPoolJson(const PoolBenchReport& report);
// Runs, prints (table or JSON) and returns the exit status (0, or 1 with one line on err).
int RunPoolCommand(const PoolBenchOptions& options, bool json, std::FILE* out, std::FILE* err);

}  // namespace kvctl

#endif  // KVCTL_TOOLS_KVBENCH_POOL_H_
