// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvbench: benchmarks of kvctl's building blocks, one subcommand each.
//   kvbench quant [--input DIR | --tokens N --heads H --head-dim D --seed S] [--methods ...]
//                 [--bits ...] [--simd scalar|avx2|avx512] [--input-form fp32|fp16] [--json]
//                 [--quick]
//   kvbench ipc [--iterations N] [--warmup N] [--tokens 1024,8192] [--rows ...] [--workers N]
//               [--think-us N]
//               [--json] [--quick]
//   kvbench attention [--tokens 4096,32768,131072] [--geometries smollm2,llama3-8b]
//                     [--methods kivi,kvarn,quarot,oscar,turbo] [--bits 2] [--threads N] [--reps N]
//                     [--simd scalar|avx2|avx512]
//                     [--json] [--quick]
//   kvbench pool [--geometries smollm2,llama3-8b] [--methods kvarn2,kivi2,kivi4,quarot4]
//                [--tokens 256,512,...] [--prefill N] [--page-bytes B] [--json] [--quick]
// Exit status: 0 on success, 1 on any error (bad flags, bad input), with one message on stderr.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "tools/kvbench_attention.h"
#include "tools/kvbench_ipc.h"
#include "tools/kvbench_pool.h"
#include "tools/kvbench_quant.h"

namespace {

// The quant subcommand's flags, bound into `options`. Returns the subcommand.
CLI::App* AddQuantCommand(CLI::App& app, kvctl::QuantBenchOptions& options, bool& json) {
  CLI::App* cmd = app.add_subcommand(
      "quant",
      "Quantizers: bits/element, K/V relative MSE and attention error (pure and streaming), "
      "one-thread quantize/dequantize GB/s against memcpy");
  options.synthetic.tokens = 4096;
  options.synthetic.heads = 8;
  options.synthetic.head_dim = 128;
  options.synthetic.seed = 1;
  CLI::Option* input =
      cmd->add_option("--input", options.input_dir,
                      "Directory with k.npy and v.npy ([T, H, D], float16 or float32) and "
                      "optionally q.npy ([T, Hq, D], Hq a multiple of H); default: synthetic");
  CLI::Option* tokens =
      cmd->add_option("--tokens", options.synthetic.tokens, "Synthetic input: tokens T")
          ->capture_default_str();
  CLI::Option* heads =
      cmd->add_option("--heads", options.synthetic.heads, "Synthetic input: KV heads H")
          ->capture_default_str();
  CLI::Option* head_dim =
      cmd->add_option("--head-dim", options.synthetic.head_dim, "Synthetic input: head_dim D")
          ->capture_default_str();
  CLI::Option* q_heads = cmd->add_option("--q-heads", options.synthetic.q_heads,
                                         "Synthetic input: query heads (GQA), 0 = same as --heads")
                             ->capture_default_str();
  cmd->add_option("--seed", options.synthetic.seed,
                  "Seed of the synthetic input (and of Gaussian queries when q.npy is absent)")
      ->capture_default_str();
  for (CLI::Option* opt : {tokens, heads, head_dim, q_heads}) input->excludes(opt);
  cmd->add_option("--methods", options.methods,
                  "Comma-separated subset of fp16,kivi,quarot,kvarn,oscar,turbo (default: all)")
      ->delimiter(',');
  cmd->add_option(
         "--bits", options.bits,
         "Comma-separated subset of 2,3,4,8,k4v2,16 (default: all; the fp16 baseline ignores it)")
      ->delimiter(',');
  cmd->add_option("--sinkhorn-iters", options.sinkhorn_iters,
                  "Comma-separated KVarN Sinkhorn iteration counts (1..64): each KVarN row once "
                  "per value (default: the registry's)")
      ->delimiter(',');
  cmd->add_option("--simd", options.simd,
                  "Force the SIMD path: scalar, avx2 or avx512 (default: best the CPU has)");
  cmd->add_option("--input-form", options.input_form,
                  "Element type of the rows the quantizers read: fp32 or fp16 (the engines' and "
                  "the daemon's stored rows)")
      ->capture_default_str();
  CLI::Option* reps =
      cmd->add_option("--reps", options.reps, "Timed repetitions per measurement (median)")
          ->capture_default_str();
  cmd->add_option("--attn-queries", options.attn_queries, "Attention probe: the last N positions")
      ->capture_default_str();
  cmd->add_flag("--json", json, "Print one JSON object instead of the table");
  cmd->add_flag("--quick", options.quick,
                "Small sizes for a CI smoke run (T=512, H=2, 2 reps unless given)");
  cmd->add_flag_callback(
      "--no-throughput", [&options] { options.throughput = false; },
      "Skip the timing runs (accuracy only)");
  cmd->callback([&options, tokens, heads, reps] {
    if (!options.quick) return;
    if (tokens->count() == 0) options.synthetic.tokens = 512;
    if (heads->count() == 0) options.synthetic.heads = 2;
    if (reps->count() == 0) options.reps = 2;
  });
  return cmd;
}

// The ipc subcommand's flags, bound into `options`. Returns the subcommand.
CLI::App* AddIpcCommand(CLI::App& app, kvctl::IpcBenchOptions& options, bool& json) {
  CLI::App* cmd = app.add_subcommand(
      "ipc",
      "Request round trips through an in-process kvctl daemon (APPEND inline and staging, dense "
      "and blocks FETCH) against raw ZeroMQ DEALER/ROUTER round trips of the same bytes");
  CLI::Option* iterations =
      cmd->add_option("--iterations", options.iterations, "Timed samples per row and side")
          ->capture_default_str();
  CLI::Option* warmup =
      cmd->add_option("--warmup", options.warmup, "Untimed samples per row and side first")
          ->capture_default_str();
  cmd->add_option("--tokens", options.fetch_tokens,
                  "Comma-separated sequence lengths of the FETCH rows (default: 1024,8192)")
      ->delimiter(',');
  cmd->add_option("--append-context", options.append_context,
                  "Tokens the APPEND rows' sequences hold before the first timed step")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", options.prefill_chunk,
                  "Tokens per APPEND when filling the FETCH sequences")
      ->capture_default_str();
  cmd->add_option("--workers", options.workers, "The daemon's server.workers")
      ->capture_default_str();
  cmd->add_option("--think-us", options.think_us,
                  "Untimed pause before each iteration, in us: the engine's own step between "
                  "decode steps (what quant.flush_after_reply overlaps with)")
      ->capture_default_str();
  cmd->add_option("--evict-mib", options.evict_mib,
                  "MiB written untimed before each timed call of every side (kvctl, raw, "
                  "handler): caches and TLB as a CPU engine's step leaves them; 0 = warm")
      ->capture_default_str();
  cmd->add_option("--rows", options.rows,
                  "Comma-separated subset of ping, append_inline, append_staging, fetch_dense, "
                  "fetch_dense_lossless, fetch_blocks, fetch_blocks_held (default: all)")
      ->delimiter(',');
  cmd->add_option(
      "--set", options.settings,
      "KEY=VALUE config setting of the daemons (repeatable), e.g. pool.checksums=false");
  cmd->add_flag("--json", json, "Print one JSON object instead of the table");
  cmd->add_flag("--quick", options.quick,
                "A CI smoke run: 30 samples after 5 warm-up unless given");
  cmd->callback([&options, iterations, warmup] {
    if (!options.quick) return;
    if (iterations->count() == 0) options.iterations = 30;
    if (warmup->count() == 0) options.warmup = 5;
  });
  return cmd;
}

// The attention subcommand's flags, bound into `options`. Returns the subcommand.
CLI::App* AddAttentionCommand(CLI::App& app, kvctl::AttentionBenchOptions& options, bool& json) {
  CLI::App* cmd = app.add_subcommand(
      "attention",
      "Decode attention of one layer at long contexts: fused attention on 2-bit records against "
      "fp32 attention on the uncompressed cache (torch SDPA through libtorch and our SIMD "
      "kernel), same threads, same run");
  cmd->add_option("--tokens", options.tokens,
                  "Comma-separated context lengths (default: 4096,32768,131072)")
      ->delimiter(',');
  cmd->add_option("--geometries", options.geometries,
                  "Comma-separated subset of smollm2 (3 KV heads x D64, 9 q heads), llama3-8b "
                  "(8 x D128, 32 q heads)")
      ->delimiter(',');
  cmd->add_option("--methods", options.methods,
                  "Comma-separated fused methods (default: kivi,kvarn,quarot,oscar, and turbo "
                  "at 2-4 bits)")
      ->delimiter(',');
  cmd->add_option("--bits", options.bits, "Code width of K and V (2, 3, 4 or 8)")
      ->capture_default_str();
  cmd->add_option("--threads", options.threads, "Threads for every variant, 0 = every core")
      ->capture_default_str();
  cmd->add_option("--reps", options.reps, "Timed repetitions (median), 0 = 41 / 15 / 7 by length")
      ->capture_default_str();
  cmd->add_option("--base-tokens", options.base_tokens,
                  "Synthetic tokens generated and tiled along the sequence")
      ->capture_default_str();
  cmd->add_option("--seed", options.seed, "Seed of the synthetic K/V/Q")->capture_default_str();
  cmd->add_option("--simd", options.simd,
                  "Force the fused kernels' SIMD path: scalar, avx2 or avx512 (default: best the "
                  "CPU has)");
  cmd->add_flag("--json", json, "Print one JSON object instead of the table");
  cmd->add_flag("--quick", options.quick, "A CI smoke run: 4K tokens, 3 reps unless given");
  return cmd;
}

// The pool subcommand's flags, bound into `options`. Returns the subcommand.
CLI::App* AddPoolCommand(CLI::App& app, kvctl::PoolBenchOptions& options, bool& json) {
  CLI::App* cmd = app.add_subcommand(
      "pool",
      "Pool bytes one sequence reserves (its slabs) against its payload, an fp16 cache and the "
      "pages of one page set per stream, after a prefill and single-token decode steps");
  cmd->add_option("--geometries", options.geometries,
                  "Comma-separated subset of smollm2 (30 layers x 3 KV heads x D64), llama3-8b "
                  "(32 x 8 x D128)")
      ->delimiter(',');
  cmd->add_option("--methods", options.methods,
                  "Comma-separated subset of kvarn2, kivi2, kivi4, quarot4 (default: all)")
      ->delimiter(',');
  cmd->add_option("--tokens", options.tokens,
                  "Comma-separated checkpoints (default: 256,512,1024,2048)")
      ->delimiter(',');
  cmd->add_option("--prefill", options.prefill, "Tokens of the first APPEND")
      ->capture_default_str();
  cmd->add_option("--page-bytes", options.page_bytes, "Pool page size")->capture_default_str();
  cmd->add_flag("--json", json, "Print one JSON object instead of the table");
  cmd->add_flag("--quick", options.quick, "A CI smoke run: smollm2, kvarn2 and kivi2, 256,512");
  return cmd;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    CLI::App app{"kvbench: benchmarks for kvctl"};
    app.require_subcommand(1);
    // One line per error, like every other failure of kvbench.
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
      return "kvbench: " + std::string(e.what()) + " (see --help)\n";
    });
    kvctl::QuantBenchOptions quant;
    bool quant_json = false;
    CLI::App* quant_cmd = AddQuantCommand(app, quant, quant_json);
    kvctl::IpcBenchOptions ipc;
    bool ipc_json = false;
    CLI::App* ipc_cmd = AddIpcCommand(app, ipc, ipc_json);
    kvctl::AttentionBenchOptions attention;
    bool attention_json = false;
    CLI::App* attention_cmd = AddAttentionCommand(app, attention, attention_json);
    kvctl::PoolBenchOptions pool;
    bool pool_json = false;
    CLI::App* pool_cmd = AddPoolCommand(app, pool, pool_json);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e) == 0 ? 0 : 1;  // --help is a success; every parse error exits 1.
    }
    if (quant_cmd->parsed()) return kvctl::RunQuantCommand(quant, quant_json, stdout, stderr);
    if (ipc_cmd->parsed()) return kvctl::RunIpcCommand(ipc, ipc_json, stdout, stderr);
    if (pool_cmd->parsed()) return kvctl::RunPoolCommand(pool, pool_json, stdout, stderr);
    if (attention_cmd->parsed()) {
      return kvctl::RunAttentionCommand(attention, attention_json, stdout, stderr);
    }
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvbench: %s\n", e.what());
    return 1;
  }
}
