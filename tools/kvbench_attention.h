// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvbench_attention.h
// The engine of `kvbench attention`: one decode step of one layer (every KV head, every query
// head of its GQA groups) at long contexts, fused attention on 2-bit block records
// (kernels/attention.h) against fp32 attention on the uncompressed cache, measured in the same
// run with the same thread count: torch's scaled_dot_product_attention through libtorch (when
// built with KVCTL_TORCH) and our own SIMD fp32 kernel (the same fused code with the whole cache
// as an fp32 window). See docs/attention.md for the method and the numbers.
//
// The cache at T tokens is what the daemon holds after streaming T tokens: the method's sinks and
// fp16 tail as the window, everything else as records (QuantizedTokenCount). Synthetic K/V
// (tests/support/synthetic_kv.h) of `base_tokens` tokens are tiled along the sequence, so long
// contexts cost no generation or quantization time; every record and row still has its own memory.
//
// Thread safety: RunAttentionBench sets process-wide thread counts (OpenMP, torch); one at a time.
//
//   AttentionBenchOptions o{.tokens = {4096}, .geometries = {"smollm2"}};
//   KVCTL_ASSIGN_OR_RETURN(AttentionBenchReport r, RunAttentionBench(o));
//   std::fputs(FormatAttentionJson(r).c_str(), stdout);
#ifndef KVCTL_TOOLS_KVBENCH_ATTENTION_H_
#define KVCTL_TOOLS_KVBENCH_ATTENTION_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvctl {

struct AttentionBenchOptions {
  std::vector<int64_t> tokens = {4096, 32768, 131072};
  std::vector<std::string> geometries = {"smollm2", "llama3-8b"};
  // Empty: every fused method with codes of `bits` (kivi, kvarn, quarot, oscar, and turbo at 2-4).
  std::vector<std::string> methods;
  int bits = 2;
  int threads = 0;             // 0: every core (std::thread::hardware_concurrency()).
  int reps = 0;                // 0: by length (41 at <= 8K, 15 at <= 64K, 7 beyond).
  int64_t base_tokens = 4096;  // Synthetic tokens generated, then tiled.
  uint64_t seed = 1;
  std::string simd;    // "", "scalar", "avx2" or "avx512": the fused kernels' level (SetSimdLevel).
  bool quick = false;  // CI smoke run: 4K only, 3 reps.
};

// One fused method at one length.
struct FusedResult {
  std::string method;
  int k_bits = 0, v_bits = 0;
  int64_t quantized_tokens = 0, window_tokens = 0;
  double cache_mib = 0;     // Records + fp16 window of the layer.
  double median_us = 0;     // One layer, every head.
  double min_us = 0;        // Fastest repetition: the least disturbed by other jobs.
  double rel_err_fp32 = 0;  // max |out - fp32 out| / max |fp32 out|: quantization error.
};

struct AttentionBenchRow {
  std::string geometry;
  int kv_heads = 0, q_heads = 0, head_dim = 0;
  int64_t tokens = 0;
  int reps = 0;
  double dense_mib = 0;  // fp32 K + V of the layer.
  double sdpa_us = -1;   // torch SDPA fp32; -1 when built without torch.
  double sdpa_min_us = -1;
  double simd_fp32_us = 0;  // Our SIMD kernel, the whole cache as an fp32 window.
  double simd_fp32_min_us = 0;
  double dense_agreement = 0;  // max |simd - sdpa| / max |sdpa| (0 without torch).
  std::vector<FusedResult> fused;
};

struct AttentionBenchReport {
  int threads = 0;
  std::string simd;                     // ActiveSimdLevel() name.
  std::string torch_version;            // Empty when kvbench was built without libtorch.
  std::string load_before, load_after;  // /proc/loadavg around the run.
  std::vector<AttentionBenchRow> rows;
};

StatusOr<AttentionBenchReport> RunAttentionBench(const AttentionBenchOptions& options);
std::string FormatAttentionTable(const AttentionBenchReport& report);
std::string FormatAttentionJson(const AttentionBenchReport& report);
// RunAttentionBench, then the table or JSON on `out`; "kvbench attention: <message>" on `err`
// and 1 on failure.
int RunAttentionCommand(const AttentionBenchOptions& options, bool json, std::FILE* out,
                        std::FILE* err);

// fp32 SDPA of one layer through libtorch on caller-owned dense buffers, K/V [H, T, D] and
// q [H * g, D]; out [H * g, D]. Implemented in kvbench_attention_torch.cc (KVCTL_TORCH) or
// kvbench_attention_notorch.cc (UNIMPLEMENTED).
class DenseSdpa {
 public:
  virtual ~DenseSdpa() = default;
  virtual void Run(const float* q, float* out) = 0;
};
StatusOr<std::unique_ptr<DenseSdpa>> MakeTorchSdpa(const float* k, const float* v, int heads,
                                                   int64_t tokens, int head_dim, int group,
                                                   int threads);
std::string TorchVersion();  // "" without libtorch.

}  // namespace kvctl

#endif  // KVCTL_TOOLS_KVBENCH_ATTENTION_H_
