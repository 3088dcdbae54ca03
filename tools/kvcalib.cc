// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvcalib: offline calibration for kvctl (docs/kvcalib.md).
//   kvcalib fit (--input DIR... | --synthetic N [--layers --heads --q-heads --head-dim --tokens])
//               --method M [--bits W,W,...] [--importance attention|uniform] [--tau 0.9]
//               --out profile.toml
//   kvcalib plan --profile P --budget-bpe X [--min-bits --max-bits --beta-override B
//                --uniform-importance] [--layer-budget-tokens B --schedule demand|uniform|pyramid]
//                [--json] [--overrides-toml FILE]
//   kvcalib plan --profile P --mode joint|quant-only|evict-only --tokens T
//                (--budget-bytes N | --budget-fraction F) [--window W --sinks S --min-tokens M
//                --min-bits --max-bits ...] [--json]
//   kvcalib dump-synthetic --out DIR [--sequences N --layers --heads ...]
// Exit status: 0 on success, 1 on bad flags or input (one message on stderr), 2 when plan's
// totals check fails.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "tools/kvcalib_commands.h"

namespace {

// Synthetic-data sizes shared by fit --synthetic and dump-synthetic. Returns the options added,
// so --quick can tell which were given.
struct SynthFlags {
  CLI::Option *layers, *heads, *q_heads, *head_dim, *tokens;
};
SynthFlags AddSynthFlags(CLI::App* cmd, kvctl::SyntheticCalibOptions& s) {
  SynthFlags f;
  f.layers = cmd->add_option("--layers", s.layers, "Synthetic: layers")->capture_default_str();
  f.heads = cmd->add_option("--heads", s.heads, "Synthetic: KV heads")->capture_default_str();
  f.q_heads = cmd->add_option("--q-heads", s.q_heads, "Synthetic: query heads, 0 = --heads")
                  ->capture_default_str();
  f.head_dim =
      cmd->add_option("--head-dim", s.head_dim, "Synthetic: head_dim")->capture_default_str();
  f.tokens = cmd->add_option("--tokens", s.tokens, "Synthetic: tokens per sequence")
                 ->capture_default_str();
  cmd->add_option("--seed", s.seed, "Synthetic: seed")->capture_default_str();
  return f;
}

// `quick` outlives parsing: the subcommand's callback reads it.
CLI::App* AddFitCommand(CLI::App& app, kvctl::FitCommandOptions& o, bool& quick) {
  CLI::App* cmd = app.add_subcommand(
      "fit",
      "Fit the RateQuant distortion model and importance, and the ReasonAlloc-like layer "
      "demand, from calibration dumps; write one profile TOML");
  CLI::Option* input = cmd->add_option(
      "--input", o.inputs,
      "Calibration sequences, one directory each: DIR/layer_<l>/{k,v[,q]}.npy, [T, H, D] / "
      "[T, Hq, D], float16 or float32");
  CLI::Option* synthetic = cmd->add_option(
      "--synthetic", o.synthetic, "Use N synthetic sequences (GenerateSyntheticKv) instead");
  input->excludes(synthetic);
  const SynthFlags sf = AddSynthFlags(cmd, o.synth);
  for (CLI::Option* opt : {sf.layers, sf.heads, sf.q_heads, sf.head_dim, sf.tokens}) {
    opt->needs(synthetic);
  }
  cmd->add_option("--method", o.method, "Quantizer: kivi, quarot, kvarn, oscar or turbo")
      ->required();
  cmd->add_option("--bits", o.bits,
                  "Widths to measure, ascending (default: every width of the method: 2,3,4,8; "
                  "turbo 2,3,4)")
      ->delimiter(',');
  cmd->add_option("--target", o.target, "Fitted distortion: mse or attention")
      ->capture_default_str();
  cmd->add_option("--importance", o.importance, "Unit importance: attention or uniform")
      ->capture_default_str();
  cmd->add_flag("--per-kind-beta", o.per_kind_beta, "Separate slopes for K and V");
  CLI::Option* probes =
      cmd->add_option("--probe-queries", o.probe_queries, "RateQuant attention probes/sequence")
          ->capture_default_str();
  cmd->add_option("--decode-flush", o.decode_flush_tokens,
                  "Importance from decode-time queries: keys count as quantized once flushed "
                  "every N tokens; -1 = the method's flush, 0 = every key before the probe")
      ->capture_default_str();
  cmd->add_flag("--absolute-errors", o.absolute_errors,
                "Importance and attention errors in absolute units, not relative to each "
                "layer's attention output");
  cmd->add_option("--block-tokens", o.block_tokens, "Spec override; 0 = registry default");
  cmd->add_option("--k-group-tokens", o.k_group_tokens, "Spec override; 0 = registry default");
  cmd->add_option("--v-group-channels", o.v_group_channels, "Spec override; 0 = default");
  cmd->add_option("--sinkhorn-iters", o.sinkhorn_iters, "Spec override; 0 = registry default");
  cmd->add_option("--tau", o.demand_options.tau, "Layer demand: attention mass covered")
      ->capture_default_str();
  CLI::Option* demand_queries =
      cmd->add_option("--demand-queries", o.demand_options.queries,
                      "Layer demand: query positions per sequence (second half)")
          ->capture_default_str();
  cmd->add_option_function<std::string>(
      "--group-reduce",
      [&o](const std::string& v) {
        if (v != "max" && v != "mean") {
          throw CLI::ValidationError("--group-reduce: got '" + v + "', expected max or mean");
        }
        o.demand_options.reduce = v == "max" ? kvctl::GroupReduce::kMax : kvctl::GroupReduce::kMean;
      },
      "Layer demand: reduce the GQA group's attention by max (default) or mean");
  cmd->add_flag_callback(
      "--entropy", [&o] { o.demand_options.measure = kvctl::DemandMeasure::kEntropy; },
      "Layer demand: exp(entropy) instead of the coverage size");
  cmd->add_flag_callback(
      "--no-demand", [&o] { o.demand = false; }, "Skip the layer demand (no [reasonalloc])");
  cmd->add_option("--out", o.out, "Profile TOML to write")->required();
  cmd->add_flag("--quick", quick,
                "Smoke-test sizes: 2 layers, 2 KV heads, 4 query heads, D 64, 256 tokens, "
                "4 probes (unless given)");
  cmd->callback([&o, &quick, sf, probes, demand_queries] {
    if (!quick) return;
    if (sf.layers->count() == 0) o.synth.layers = 2;
    if (sf.heads->count() == 0) o.synth.heads = 2;
    if (sf.q_heads->count() == 0) o.synth.q_heads = 4;
    if (sf.head_dim->count() == 0) o.synth.head_dim = 64;
    if (sf.tokens->count() == 0) o.synth.tokens = 256;
    if (probes->count() == 0) o.probe_queries = 4;
    if (demand_queries->count() == 0) o.demand_options.queries = 4;
  });
  return cmd;
}

CLI::App* AddPlanCommand(CLI::App& app, kvctl::PlanCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Per-(layer, head) K/V widths for a b/e budget (and per-layer token budgets), or with "
      "--mode the tokens kept and widths for one byte budget, from a profile, with the totals "
      "checked");
  cmd->add_option("--profile", o.profile, "Profile TOML written by kvcalib fit")->required();
  cmd->add_option("--budget-bpe", o.plan.quant.budget_bpe,
                  "Average bits per element over K and V, metadata included (the b/e plan)");
  // The joint planner (docs/joint_planner.md): one byte budget, tokens and widths per head.
  cmd->add_option("--mode", o.mode,
                  "Plan one byte budget with the joint planner: joint, quant-only or evict-only");
  cmd->add_option("--budget-bytes", o.joint.budget_bytes, "--mode: bytes for all heads");
  cmd->add_option("--budget-fraction", o.joint.budget_fraction,
                  "--mode: budget as a fraction of the fp16 bytes of every token seen");
  cmd->add_option("--tokens", o.joint.tokens, "--mode: tokens seen per head");
  cmd->add_option("--sinks", o.joint.sinks, "--mode: fp16 sink tokens per head; -1 = method's")
      ->capture_default_str();
  cmd->add_option("--flush-tokens", o.joint.flush_tokens,
                  "--mode: quant.flush_tokens, for the worst-case fp16 tail; 0 = method's")
      ->capture_default_str();
  cmd->add_option("--min-tokens", o.joint.min_tokens, "--mode: starvation floor per head")
      ->capture_default_str();
  cmd->add_option("--token-quantum", o.joint.token_quantum,
                  "--mode: kept counts move in steps of this; 0 = block_tokens")
      ->capture_default_str();
  cmd->add_option("--evict-k-bits", o.joint.evict_k_bits, "--mode: evict-only K width; 0 = widest");
  cmd->add_option("--evict-v-bits", o.joint.evict_v_bits, "--mode: evict-only V width; 0 = widest");
  cmd->add_option("--eviction-scale", o.joint.eviction_scale,
                  "--mode: distortion of a dropped token relative to a 0-bit one")
      ->capture_default_str();
  cmd->add_option("--kept-levels", o.joint.kept_levels, "--mode: kept counts per head in the hull")
      ->capture_default_str();
  cmd->add_option("--coverage-exponent", o.joint.coverage_exponent,
                  "--mode: layer demand scales with (tokens / calibration length)^this")
      ->capture_default_str();
  cmd->add_option("--min-bits", o.plan.quant.min_bits, "Lowest width allowed; 0 = no bound");
  cmd->add_option("--max-bits", o.plan.quant.max_bits, "Highest width allowed; 0 = no bound");
  cmd->add_option("--beta-override", o.plan.quant.beta_override,
                  "Allocate with this slope instead of the fit's (mismatch experiments)");
  cmd->add_flag("--uniform-importance", o.plan.quant.uniform_importance,
                "Ignore the fit's importance weights");
  cmd->add_flag_callback(
      "--greedy", [&o] { o.plan.quant.solver = kvctl::IntegerSolver::kGreedy; },
      "Convex-hull greedy only (no exactness proof)");
  cmd->add_option("--layer-budget-tokens", o.plan.layer_budget_tokens,
                  "Average tokens per (layer, head): also plan per-layer token budgets");
  cmd->add_option_function<std::string>(
      "--schedule",
      [&o](const std::string& v) {
        kvctl::StatusOr<kvctl::LayerSchedule> s = kvctl::ParseLayerSchedule(v);
        if (!s.ok()) throw CLI::ValidationError(s.status().message());
        o.plan.schedule = *s;
      },
      "Layer token schedule: demand (default, from [reasonalloc]), uniform or pyramid");
  cmd->add_option("--window", o.plan.window, "Protected recent tokens per head")
      ->capture_default_str();
  cmd->add_option("--floor", o.plan.floor,
                  "Demand schedule: tokens per head at least; default max(window + 8, B/4)");
  cmd->add_option("--seq-len", o.plan.seq_len, "Pyramid: sequence length T; 0 = unbounded")
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "Print one JSON object instead of the table");
  cmd->add_option("--overrides-toml", o.overrides_toml,
                  "Write the [[quant.override]] tables for the daemon config here");
  cmd->add_option("--overrides-table", o.overrides_table,
                  "quant.override (default) or model.override")
      ->capture_default_str();
  return cmd;
}

CLI::App* AddDumpCommand(CLI::App& app, kvctl::DumpCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "dump-synthetic",
      "Write synthetic calibration sequences as OUT/seq_<s>/layer_<l>/{k,v,q}.npy");
  cmd->add_option("--out", o.out, "Output directory")->required();
  cmd->add_option("--sequences", o.synth.sequences, "Sequences to write")->capture_default_str();
  AddSynthFlags(cmd, o.synth);
  cmd->add_option("--dtype", o.dtype, "float32 (bit-exact with fit --synthetic) or float16")
      ->capture_default_str();
  return cmd;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    CLI::App app{"kvcalib: offline RateQuant / ReasonAlloc calibration for kvctl"};
    app.require_subcommand(1);
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
      return "kvcalib: " + std::string(e.what()) + " (see --help)\n";
    });
    kvctl::FitCommandOptions fit;
    bool fit_quick = false;
    CLI::App* fit_cmd = AddFitCommand(app, fit, fit_quick);
    kvctl::PlanCommandOptions plan;
    CLI::App* plan_cmd = AddPlanCommand(app, plan);
    kvctl::DumpCommandOptions dump;
    CLI::App* dump_cmd = AddDumpCommand(app, dump);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e) == 0 ? 0 : 1;  // --help is a success; every parse error exits 1.
    }
    if (fit_cmd->parsed()) return kvctl::RunFitCommand(fit, stdout, stderr);
    if (plan_cmd->parsed()) return kvctl::RunPlanCommand(plan, stdout, stderr);
    if (dump_cmd->parsed()) return kvctl::RunDumpCommand(dump, stdout, stderr);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvcalib: %s\n", e.what());
    return 1;
  }
}
