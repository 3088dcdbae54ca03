// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvcalib_commands.h
// The three kvcalib subcommands as functions over option structs, so tests run them in-process
// and tools/kvcalib.cc only maps flags onto the structs:
//  * fit: calibration data (dump directories or synthetic) -> FitRateQuant + layer demand ->
//    one profile TOML (policies/calib_profile.h);
//  * plan: profile + b/e budget -> per-(layer, head) widths, optional layer token budgets, checked
//    totals (tools/kvcalib_plan.h), optional [[quant.override]] file;
//  * dump-synthetic: synthetic calibration data written in the dump layout.
// Run*Command print the report on `out` and exactly one line "kvcalib <cmd>: <message>" on `err`
// when something fails. Exit status: 0 ok, 1 bad input or I/O error, 2 (plan) the totals check
// failed.
//
// Thread safety: functions over their arguments (they read and write the named files).
//
//   FitCommandOptions fit{.synthetic = 2, .method = "kivi", .out = "p.toml"};
//   int rc = RunFitCommand(fit, stdout, stderr);
#ifndef KVCTL_TOOLS_KVCALIB_COMMANDS_H_
#define KVCTL_TOOLS_KVCALIB_COMMANDS_H_

#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/calib_profile.h"
#include "tools/kvcalib_data.h"
#include "tools/kvcalib_joint.h"
#include "tools/kvcalib_plan.h"

namespace kvctl {

struct FitCommandOptions {
  std::vector<std::string> inputs;  // One directory per sequence; or:
  int synthetic = 0;                // > 0: this many synthetic sequences instead.
  SyntheticCalibOptions synth;      // Sizes and seed of those (sequences is set from synthetic).
  std::string method;               // kivi, quarot, kvarn, oscar or turbo.
  std::vector<int> bits;            // Ascending; empty: every width of the method.
  std::string target = "mse";       // mse | attention.
  std::string importance = "attention";  // attention | uniform.
  bool per_kind_beta = false;
  int probe_queries = 8;
  int decode_flush_tokens =
      -1;  // Keys a probe sees quantized: -1 method flush, 0 all (fit option).
  bool absolute_errors = false;  // Importance not relative to the layer's output (fit option).
  int block_tokens = 0;          // Spec overrides; 0: the registry's default.
  int k_group_tokens = 0;
  int v_group_channels = 0;
  int sinkhorn_iters = 0;
  bool demand = true;  // Compute the [reasonalloc] table (needs queries).
  LayerDemandOptions demand_options;
  std::string out;  // Profile path; "" = do not write.
};

struct FitTimings {
  double load_s = 0, fit_s = 0, demand_s = 0;  // Wall time of each phase.
  double cpu_s = 0;                            // Process CPU time of the three together.
};

struct FitResult {
  CalibProfile profile;
  FitTimings timings;
  std::string source;  // What the data was, for the report.
  int q_heads = 0;
  RateQuantFitWork work;  // What FitRateQuant did (blocks quantized, softmaxes).
};

// Loads or generates the data, fits, computes the demand. Errors name the flag or file; errors
// of the fit that name a sequence ("data[2][5].k: ...") get that sequence's directory appended.
StatusOr<FitResult> RunFit(const FitCommandOptions& options);

// RunFit, writes options.out, prints a summary. Returns the exit status.
int RunFitCommand(const FitCommandOptions& options, std::FILE* out, std::FILE* err);

struct PlanCommandOptions {
  std::string profile;
  KvcalibPlanOptions plan;
  // Non-empty (joint, quant-only, evict-only): plan one byte budget with the joint planner
  // (tools/kvcalib_joint.h) instead of a b/e budget; `joint` holds its options (budget, tokens,
  // window; the width bounds, beta override and importance flags are copied from `plan.quant`).
  std::string mode;
  JointProfileOptions joint;
  bool json = false;
  std::string overrides_toml;                      // "" = do not write.
  std::string overrides_table = "quant.override";  // or model.override.
};

// Reads the profile, plans, prints the table or JSON; writes the overrides only when the checks
// pass. Returns 0, 1 (bad input) or 2 (totals check failed; the report is still printed). With
// `mode` the flags of the b/e plan (--budget-bpe, --layer-budget-tokens, --overrides-toml) are
// refused, and --tokens with one of --budget-bytes / --budget-fraction is required.
int RunPlanCommand(const PlanCommandOptions& options, std::FILE* out, std::FILE* err);

struct DumpCommandOptions {
  std::string out;
  SyntheticCalibOptions synth;
  std::string dtype = "float32";  // float32 | float16.
};
int RunDumpCommand(const DumpCommandOptions& options, std::FILE* out, std::FILE* err);

}  // namespace kvctl

#endif  // KVCTL_TOOLS_KVCALIB_COMMANDS_H_
