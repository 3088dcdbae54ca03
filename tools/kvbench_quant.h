// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvbench_quant.h
// The engine of `kvbench quant`: for each quantizer row (method x bit widths) it measures what a
// record costs (bits/element from the bytes actually written, checked against the registry), what
// it loses (relative MSE of K and V, relative error of causal attention outputs) in two modes, and
// how fast it runs on one thread (quantize / dequantize GB/s against memcpy of the same fp16
// bytes).
//
// Modes (see docs/kvbench_quant.md):
//  * pure: tokens [0, Tq) quantized, Tq = T rounded down to a multiple of block_tokens; the
//    leftover T - Tq tokens stay fp16 in the attention probe and are left out of the MSE.
//  * streaming: the method's StreamingRules: sinks fp16 forever, full flushes quantized, the tail
//    fp16. The attention query at position t sees the cache as it was after t + 1 tokens.
//
// Thread safety: functions are reentrant, except RunQuantBench, which sets the process-wide SIMD
// level (SetSimdLevel) when options.simd asks for one.
//
//   KVCTL_ASSIGN_OR_RETURN(QuantBenchInput in, MakeSyntheticInput({.tokens = 512, .heads = 2}));
//   KVCTL_ASSIGN_OR_RETURN(QuantBenchContext ctx, PrepareQuantBench(std::move(in), 64));
//   KVCTL_ASSIGN_OR_RETURN(QuantRowAccuracy row, ComputeQuantRow(ctx, {QuantMethod::kKivi, 2, 2}));
#ifndef KVCTL_TOOLS_KVBENCH_QUANT_H_
#define KVCTL_TOOLS_KVBENCH_QUANT_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/quant_types.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {

// K, V (and Q) for the benchmark, dense fp32 [T, H, D] (Q: [T, Hq, D], Hq a multiple of H).
struct QuantBenchInput {
  std::string source;       // "synthetic" or the input directory.
  std::string description;  // One line for humans: sizes, dtypes, seed.
  std::string queries;      // Where probe queries come from: "synthetic", "q.npy" or "gaussian".
  int64_t tokens = 0;
  int heads = 0, q_heads = 0, head_dim = 0;
  uint64_t seed = 1;
  std::vector<float> k, v, q;  // q empty: Gaussian queries drawn from `seed`.
};

// Largest tensor we accept (elements of K; of Q with GQA), so buffers stay a few GiB at most.
inline constexpr int64_t kMaxBenchElements = int64_t{1} << 28;

// GenerateSyntheticKv after checking the sizes (the error names the flag: "--tokens: got 0, ...").
StatusOr<QuantBenchInput> MakeSyntheticInput(const SyntheticKvOptions& options);

// Reads dir/k.npy, dir/v.npy and, when present, dir/q.npy (float16/32/64; K and V [T, H, D], Q
// [T, Hq, D] with Hq a multiple of H). NOT_FOUND for a missing directory or k/v file;
// INVALID_ARGUMENT naming the file for wrong shapes, head_dim or non-finite values.
StatusOr<QuantBenchInput> LoadQuantBenchInput(const std::string& dir, uint64_t seed);

// One benchmark row: a method at K and V code widths (16/16 for fp16).
struct QuantRowSpec {
  QuantMethod method = QuantMethod::kFp16;
  int k_bits = 16;
  int v_bits = 16;
  int sinkhorn_iters = 0;  // KVarN only: 0 = the registry's default, else this many iterations.
};
// "fp16", "kivi 2", "kvarn k4v2"; "kvarn 2 it8" with sinkhorn_iters set.
std::string QuantRowLabel(const QuantRowSpec& row);
// The bits part of the label as --bits matches it: "16", "2", "k4v2".
std::string QuantRowBits(const QuantRowSpec& row);

// fp16; kivi 2, 3, 4, 8; quarot 2, 3, 4; kvarn 2, 3, 4, k4v2; oscar 2, 3, 4.
std::vector<QuantRowSpec> DefaultQuantRows();

// Filters DefaultQuantRows(): `methods` by name, `bits` by QuantRowBits ("2", "k4v2"); empty lists
// keep everything. The fp16 baseline row ignores `bits`; it goes only when `methods` omits fp16.
// INVALID_ARGUMENT for an unknown method or bits value, or when nothing is left.
StatusOr<std::vector<QuantRowSpec>> SelectQuantRows(const std::vector<std::string>& methods,
                                                    const std::vector<std::string>& bits);

// Everything rows share: the input, its fp16-rounded copy, OScaR token norms and the attention
// probe (the last `attn_queries` positions, their queries and exact fp32 outputs).
struct QuantBenchContext {
  QuantBenchInput input;
  std::vector<float> k_half, v_half;     // RoundToHalf of every element.
  std::vector<float> token_norms;        // ComputeTokenNorms over all T tokens.
  std::vector<int64_t> probe_positions;  // Ascending, the last attn_queries tokens.
  std::vector<float> probe_q;            // [probe, q_heads, head_dim].
  std::vector<float> probe_out;          // Exact attention outputs, same shape.
};

// INVALID_ARGUMENT unless 1 <= attn_queries <= tokens.
StatusOr<QuantBenchContext> PrepareQuantBench(QuantBenchInput input, int attn_queries);

struct ModeAccuracy {
  int64_t quantized_tokens = 0;  // Tokens held in records (per head).
  int64_t records = 0;           // Records written over all heads.
  int64_t bytes = 0;             // Record + side + fp16 bytes of K and V, all heads.
  double bits_per_element = 0;   // bytes * 8 / (2 * elements of the tokens the mode counts).
  double k_rel_mse = 0;          // ||k - k^||^2 / ||k||^2.
  double v_rel_mse = 0;
  double attn_rel_err = 0;  // sqrt(sum ||o - o^||^2 / sum ||o||^2) over probe and heads.
};

struct QuantRowAccuracy {
  QuantRowSpec row;
  QuantSpec spec;
  StreamingRules rules;
  BitsPerElementBreakdown registry_bpe;  // BitsPerElement(spec, heads).
  double registry_effective_bpe = 0;     // EffectiveBitsPerElement(spec, rules, heads, T).
  ModeAccuracy pure;                     // bits_per_element == registry_bpe.average, checked.
  ModeAccuracy streaming;                // bits_per_element == registry_effective_bpe, checked.
};

// Quantizes and dequantizes with QuantizeBlock/DequantizeBlock at the active SIMD level.
// INVALID_ARGUMENT when the spec does not fit the input (head_dim, fewer tokens than one block);
// INTERNAL when a record overruns record_bytes or the bits counted from the written bytes differ
// from the registry's.
StatusOr<QuantRowAccuracy> ComputeQuantRow(const QuantBenchContext& ctx, const QuantRowSpec& row);

// Median GB/s over `reps` timed runs (thread CPU time) after one warm-up, one thread, of
// quantizing (and then dequantizing) the pure-mode tokens of every head. GB counts fp16 input
// bytes: 2 * Tq * H * D * 2.
// The input is what the daemon's flush path hands the quantizer: rows of `form` (fp32, or fp16
// through BlockInput's k_f16/v_f16), each head's rows contiguous (row_stride = head_dim), one
// QuantizeBlocks batch per head; token_rows_quantize_gbps reads the [T, H, D] tensor in the same
// form in place instead (row_stride = H * head_dim, block-major). fp16 rows hold RoundToHalf of the
// input.
struct QuantThroughput {
  int64_t tokens = 0;                                     // Tq.
  double bytes = 0;                                       // fp16 bytes of K and V for Tq tokens.
  double quantize_gbps = 0, dequantize_gbps = 0;          // QuantizeBlocks / DequantizeBlock.
  double token_rows_quantize_gbps = 0;                    // QuantizeBlock on [T, H, D] rows.
  double ref_quantize_gbps = 0, ref_dequantize_gbps = 0;  // *Ref scalar reference.
};
enum class QuantInputForm { kF32, kF16 };
StatusOr<QuantThroughput> MeasureQuantThroughput(const QuantBenchContext& ctx,
                                                 const QuantSpec& spec, int reps,
                                                 QuantInputForm form = QuantInputForm::kF32);

// Median GB/s of memcpy of `bytes` bytes (bytes copied / thread CPU seconds), after a warm-up.
double MeasureMemcpyGbps(size_t bytes, int reps);

// GB/s (fp16 bytes, as the quantizers count them) of reading K and V once in `form`
// (elements each of K and V, 4 or 2 bytes each), sequentially, doing nothing but OR-ing the bits:
// what a quantizer that reads this input could reach at best. Median thread CPU time of `reps`
// reads after a warm-up.
double MeasureReadGbps(const QuantBenchContext& ctx, QuantInputForm form, int reps);

// Quantize speed goal relative to memcpy (benchmark, not asserted; issue 14): 0.5 for KIVI, QuaRot
// and OScaR, 0.1 for KVarN at the registry's Sinkhorn iterations, 0 (none) otherwise.
double QuantizeTarget(const QuantSpec& spec);

struct QuantBenchOptions {
  std::string input_dir;  // Empty: synthetic.
  SyntheticKvOptions synthetic;
  std::vector<std::string> methods, bits;  // Filters, see SelectQuantRows.
  std::vector<int> sinkhorn_iters;         // KVarN rows once per value; empty: the registry's.
  std::string simd;                        // "", "scalar", "avx2" or "avx512".
  std::string input_form = "fp32";         // "fp32" or "fp16": rows the quantizers read.
  int reps = 5;
  int attn_queries = 64;
  bool throughput = true;
  bool quick = false;  // Recorded in the report only; the CLI shrinks sizes.
};

struct QuantBenchRow {
  QuantRowAccuracy accuracy;
  QuantThroughput perf;  // Zero when options.throughput is false.
  double target = 0;     // QuantizeTarget(spec).
};

struct QuantBenchReport {
  std::string detected_simd, active_simd;
  QuantBenchInput input;  // Description and sizes; tensors cleared.
  int attn_queries = 0;
  int reps = 0;
  bool throughput = true;
  bool quick = false;
  double memcpy_bytes = 0, memcpy_gbps = 0;
  std::string input_form;  // "fp32" or "fp16".
  double read_gbps = 0;    // MeasureReadGbps of the input in that form.
  std::vector<QuantBenchRow> rows;
};

// Validates options, builds the input and measures every selected row.
StatusOr<QuantBenchReport> RunQuantBench(const QuantBenchOptions& options);

// An aligned text report (accuracy table, then throughput table).
std::string FormatQuantTable(const QuantBenchReport& report);
// One JSON object with the SIMD level, the input and every row; non-finite numbers become null.
std::string FormatQuantJson(const QuantBenchReport& report);

// RunQuantBench, then the table or JSON on `out`. On error prints "kvbench quant: <message>" on
// `err` and returns 1; 0 on success.
int RunQuantCommand(const QuantBenchOptions& options, bool json, std::FILE* out, std::FILE* err);

}  // namespace kvctl

#endif  // KVCTL_TOOLS_KVBENCH_QUANT_H_
