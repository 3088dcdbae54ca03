// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvcalib fit / plan / dump-synthetic as functions (see kvcalib_commands.h).
#include "tools/kvcalib_commands.h"

#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

namespace kvctl {
namespace {

using internal::StrCat;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Reads the profile for `plan`, recording its path and read time in *info.
StatusOr<CalibProfile> ReadProfileTimed(const std::string& path, PlanReportInfo* info) {
  const Clock::time_point t0 = Clock::now();
  StatusOr<CalibProfile> profile = ReadCalibProfile(path);
  info->profile = path;
  info->read_ms = Seconds(t0) * 1e3;
  return profile;
}

double CpuSeconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return Internal(path, ": cannot open for writing");
  f << text;
  f.close();
  if (!f) return Internal(path, ": write failed");
  return OkStatus();
}

// "data[2][5].k: ..." -> "... (data[2] is calib/seq_2)".
Status AnnotateSequence(const Status& s, const std::vector<std::string>& sources) {
  const std::string& m = s.message();
  size_t s_index = 0;
  if (m.rfind("data[", 0) != 0 || std::sscanf(m.c_str(), "data[%zu]", &s_index) != 1 ||
      s_index >= sources.size()) {
    return s;
  }
  return Status(s.code(), StrCat(m, " (data[", s_index, "] is ", sources[s_index], ")"));
}

std::string FormatBits(const std::vector<int>& bits) {
  std::string s;
  for (size_t i = 0; i < bits.size(); ++i) {
    if (i) s += ',';  // Not operator+ on a literal: GCC 12 warns falsely (-Wrestrict).
    s += std::to_string(bits[i]);
  }
  return s;
}

StatusOr<RateQuantFitOptions> MakeFitOptions(const FitCommandOptions& o, bool has_queries) {
  RateQuantFitOptions f;
  StatusOr<QuantMethod> method = ParseQuantMethod(o.method);
  if (!method.ok() || *method == QuantMethod::kFp16) {
    return InvalidArgument("--method: got '", o.method,
                           "', expected kivi, quarot, kvarn, oscar or turbo (a quantizer with "
                           "widths)");
  }
  f.method = *method;
  const uint32_t allowed = TraitsOf(f.method).allowed_bits;
  std::vector<int> widths;
  for (int w = 1; w < 32; ++w) {
    if (allowed & (1u << w)) widths.push_back(w);
  }
  const std::vector<int>& bits = o.bits.empty() ? widths : o.bits;
  if (bits.size() < 2) {
    return InvalidArgument("--bits: got ", bits.size(),
                           " widths, expected at least 2 to fit a slope");
  }
  for (size_t j = 0; j < bits.size(); ++j) {
    const int b = bits[j];
    if (b < 1 || b > 31 || !(allowed & (1u << b)) || (j > 0 && b <= bits[j - 1])) {
      return InvalidArgument("--bits: got ", FormatBits(bits), ", expected ascending widths ",
                             "among ", FormatBits(widths), " (", o.method, ")");
    }
  }
  f.bits = bits;
  if (o.target == "mse") {
    f.target = DistortionTarget::kMse;
  } else if (o.target == "attention") {
    f.target = DistortionTarget::kAttention;
  } else {
    return InvalidArgument("--target: got '", o.target, "', expected mse or attention");
  }
  if (o.importance == "attention") {
    f.importance = ImportanceMode::kAttention;
  } else if (o.importance == "uniform") {
    f.importance = ImportanceMode::kUniform;
  } else {
    return InvalidArgument("--importance: got '", o.importance, "', expected attention or uniform");
  }
  if (f.target == DistortionTarget::kAttention && f.importance == ImportanceMode::kAttention) {
    return InvalidArgument(
        "--importance: got 'attention' with --target attention, expected "
        "uniform (the attention target already carries the weight)");
  }
  if (!has_queries &&
      (f.target == DistortionTarget::kAttention || f.importance == ImportanceMode::kAttention)) {
    return InvalidArgument(f.target == DistortionTarget::kAttention ? "--target" : "--importance",
                           " attention: the input has no q.npy, expected queries (or pass "
                           "--importance uniform and --target mse)");
  }
  f.per_kind_beta = o.per_kind_beta;
  f.probe_queries = o.probe_queries;
  f.decode_flush_tokens = o.decode_flush_tokens;
  f.relative_to_output = !o.absolute_errors;
  f.block_tokens = o.block_tokens;
  f.k_group_tokens = o.k_group_tokens;
  f.v_group_channels = o.v_group_channels;
  f.sinkhorn_iters = o.sinkhorn_iters;
  return f;
}

}  // namespace

StatusOr<FitResult> RunFit(const FitCommandOptions& o) {
  if (o.synthetic > 0 && !o.inputs.empty()) {
    return InvalidArgument("--synthetic: got ", o.synthetic,
                           " with --input, expected one source of calibration data");
  }
  if (o.synthetic <= 0 && o.inputs.empty()) {
    return InvalidArgument(
        "--input: got none, expected one directory per sequence "
        "(or --synthetic N)");
  }
  // Flags that do not depend on the data are checked before anything is loaded.
  KVCTL_RETURN_IF_ERROR(MakeFitOptions(o, true).status());
  const double cpu0 = CpuSeconds();
  FitResult r;
  Clock::time_point t0 = Clock::now();
  CalibrationData data;
  if (o.synthetic > 0) {
    SyntheticCalibOptions s = o.synth;
    s.sequences = o.synthetic;
    KVCTL_ASSIGN_OR_RETURN(data, GenerateSyntheticCalibration(s));
    r.source =
        StrCat(o.synthetic, " synthetic sequences of ", s.tokens, " tokens (seed ", s.seed, ")");
  } else {
    KVCTL_ASSIGN_OR_RETURN(data, LoadCalibrationDirs(o.inputs));
    r.source = StrCat(o.inputs.size(), " sequences from ", o.inputs.front(),
                      o.inputs.size() > 1 ? " ..." : "", " (", data.total_tokens(), " tokens)");
  }
  r.q_heads = data.q_heads;
  r.timings.load_s = Seconds(t0);
  if (o.demand && !data.has_queries()) {
    return InvalidArgument("--input: no q.npy in ", data.sources.front(),
                           "/layer_0, expected queries for the layer demand (or pass --no-demand)");
  }
  KVCTL_ASSIGN_OR_RETURN(RateQuantFitOptions fit_options, MakeFitOptions(o, data.has_queries()));
  fit_options.work = &r.work;
  t0 = Clock::now();
  StatusOr<RateQuantFit> fit = FitRateQuant(data.set, fit_options);
  if (!fit.ok()) return AnnotateSequence(fit.status(), data.sources);
  r.profile.fit = std::move(*fit);
  r.timings.fit_s = Seconds(t0);
  if (o.demand) {
    t0 = Clock::now();
    StatusOr<LayerDemandProfile> d = ComputeLayerDemand(data.set, o.demand_options);
    if (!d.ok()) return AnnotateSequence(d.status(), data.sources);
    r.profile.demand = std::move(*d);
    r.timings.demand_s = Seconds(t0);
  }
  r.timings.cpu_s = CpuSeconds() - cpu0;
  return r;
}

int RunFitCommand(const FitCommandOptions& o, std::FILE* out, std::FILE* err) {
  const Clock::time_point t0 = Clock::now();
  StatusOr<FitResult> r = RunFit(o);
  Status written =
      r.ok() ? (o.out.empty() ? OkStatus() : WriteText(o.out, FormatCalibProfile(r->profile)))
             : r.status();
  if (!written.ok()) {
    std::fprintf(err, "kvcalib fit: %s\n", written.message().c_str());
    return 1;
  }
  const RateQuantFit& f = r->profile.fit;
  std::ostringstream s;
  s << "kvcalib fit: " << r->source << "\n"
    << "geometry: " << f.layers << " layers x " << f.kv_heads << " KV heads";
  if (r->q_heads > 0) s << " (" << r->q_heads << " query heads)";
  s << ", head_dim " << f.spec.head_dim << "\n";
  char line[320];
  std::snprintf(line, sizeof line,
                "ratequant: %s, widths %s, target %s, importance %s: beta %.4f (K only %.4f, V "
                "only %.4f), rms ln residual %.4f\n",
                std::string(QuantMethodName(f.spec.method)).c_str(), FormatBits(f.bits).c_str(),
                std::string(DistortionTargetName(f.target)).c_str(),
                std::string(ImportanceModeName(f.importance)).c_str(), f.beta, f.beta_k_only,
                f.beta_v_only, f.rms_log_residual);
  s << line;
  if (const auto& d = r->profile.demand) {
    s << "reasonalloc: " << DemandMeasureName(d->measure) << " size at tau " << d->tau << " ("
      << GroupReduceName(d->reduce) << " over the group, " << d->queries_per_sequence
      << " query positions per sequence); demand per layer:";
    for (double v : d->demand) {
      std::snprintf(line, sizeof line, " %.1f", v);
      s << line;
    }
    s << "\n";
  } else {
    s << "reasonalloc: skipped (--no-demand)\n";
  }
  s << "work: " << r->work.blocks_quantized << " blocks quantized and dequantized ("
    << f.bits.size() << " widths), " << r->work.attention_softmaxes
    << " attention-error softmaxes\n";
  if (!o.out.empty()) s << "wrote " << o.out << "\n";
  const FitTimings& t = r->timings;
  std::snprintf(line, sizeof line,
                "time: load %.3f s, fit %.3f s, demand %.3f s, total %.3f s wall (%.3f s CPU)\n",
                t.load_s, t.fit_s, t.demand_s, Seconds(t0), t.cpu_s);
  s << line;
  std::fputs(s.str().c_str(), out);
  return 0;
}

namespace {

// plan --mode: the joint planner's byte budget.
int RunJointPlan(const PlanCommandOptions& o, std::FILE* out, std::FILE* err) {
  StatusOr<JointMode> mode = ParseJointMode(o.mode);
  if (!mode.ok()) {
    std::fprintf(err, "kvcalib plan: --%s\n", mode.status().message().c_str());
    return 1;
  }
  const char* unused = o.plan.quant.budget_bpe != 0      ? "--budget-bpe"
                       : o.plan.layer_budget_tokens != 0 ? "--layer-budget-tokens"
                       : !o.overrides_toml.empty()       ? "--overrides-toml"
                                                         : nullptr;
  if (unused != nullptr) {
    std::fprintf(err,
                 "kvcalib plan: %s: not used with --mode, expected --budget-bytes or "
                 "--budget-fraction and --tokens\n",
                 unused);
    return 1;
  }
  if ((o.joint.budget_bytes > 0) == (o.joint.budget_fraction > 0)) {
    std::fprintf(err,
                 "kvcalib plan: --budget-bytes/--budget-fraction: expected exactly one of them "
                 "with --mode\n");
    return 1;
  }
  JointProfileOptions jo = o.joint;
  jo.window = o.plan.window;
  jo.min_bits = o.plan.quant.min_bits;
  jo.max_bits = o.plan.quant.max_bits;
  jo.beta_override = o.plan.quant.beta_override;
  jo.uniform_importance = o.plan.quant.uniform_importance;
  PlanReportInfo info;
  StatusOr<CalibProfile> profile = ReadProfileTimed(o.profile, &info);
  if (!profile.ok()) {
    std::fprintf(err, "kvcalib plan: %s\n", profile.status().message().c_str());
    return 1;
  }
  const Clock::time_point t0 = Clock::now();
  StatusOr<KvcalibJointPlan> plan = BuildKvcalibJointPlan(*profile, *mode, jo);
  info.plan_ms = Seconds(t0) * 1e3;
  if (!plan.ok()) {
    std::fprintf(err, "kvcalib plan: %s\n", plan.status().message().c_str());
    return 1;
  }
  const std::string report =
      o.json ? FormatJointPlanJson(*plan, info) : FormatJointPlanTable(*plan, info);
  std::fputs(report.c_str(), out);
  std::fflush(out);
  if (!plan->ok()) {
    std::fprintf(err,
                 "kvcalib plan: budget check failed: achieved %.0f bytes for %.0f requested, "
                 "expected within one allocation unit (%.0f bytes) below it\n",
                 plan->check.achieved_bytes, plan->check.requested_bytes, plan->check.unit_bytes);
    return 2;
  }
  return 0;
}

}  // namespace

int RunPlanCommand(const PlanCommandOptions& o, std::FILE* out, std::FILE* err) {
  if (o.overrides_table != "quant.override" && o.overrides_table != "model.override") {
    std::fprintf(err,
                 "kvcalib plan: --overrides-table: got '%s', expected quant.override or "
                 "model.override\n",
                 o.overrides_table.c_str());
    return 1;
  }
  if (!o.mode.empty()) return RunJointPlan(o, out, err);
  if (o.plan.quant.budget_bpe == 0) {
    std::fprintf(err,
                 "kvcalib plan: --budget-bpe: missing, expected a b/e budget (or --mode with "
                 "--budget-bytes or --budget-fraction)\n");
    return 1;
  }
  PlanReportInfo info;
  StatusOr<CalibProfile> profile = ReadProfileTimed(o.profile, &info);
  if (!profile.ok()) {
    std::fprintf(err, "kvcalib plan: %s\n", profile.status().message().c_str());
    return 1;
  }
  const Clock::time_point t0 = Clock::now();
  StatusOr<KvcalibPlan> plan = BuildKvcalibPlan(*profile, o.plan);
  info.plan_ms = Seconds(t0) * 1e3;
  if (!plan.ok()) {
    std::fprintf(err, "kvcalib plan: %s\n", plan.status().message().c_str());
    return 1;
  }
  const std::string report = o.json ? FormatPlanJson(*plan, info) : FormatPlanTable(*plan, info);
  std::fputs(report.c_str(), out);
  std::fflush(out);
  if (!plan->bits.ok) {
    std::fprintf(err,
                 "kvcalib plan: budget check failed: achieved %.9g b/e for %.9g requested, "
                 "expected within one allocation unit (%.3g b/e) below it\n",
                 plan->bits.achieved_bpe, plan->bits.requested_bpe, plan->bits.unit_step_bpe);
    return 2;
  }
  if (plan->tokens && !plan->tokens->ok) {
    std::fprintf(err,
                 "kvcalib plan: token check failed: layer budgets sum to %lld for %lld "
                 "requested (%s schedule, tolerance %lld)\n",
                 static_cast<long long>(plan->tokens->achieved_tokens),
                 static_cast<long long>(plan->tokens->requested_tokens),
                 std::string(LayerScheduleName(plan->tokens->schedule)).c_str(),
                 static_cast<long long>(plan->tokens->tolerance_tokens));
    return 2;
  }
  if (!o.overrides_toml.empty()) {
    Status w = WriteText(o.overrides_toml, FormatOverridesToml(plan->quant, o.overrides_table));
    if (!w.ok()) {
      std::fprintf(err, "kvcalib plan: --overrides-toml: %s\n", w.message().c_str());
      return 1;
    }
  }
  return 0;
}

int RunDumpCommand(const DumpCommandOptions& o, std::FILE* out, std::FILE* err) {
  NpyDType dtype;
  if (o.dtype == "float32") {
    dtype = NpyDType::kF32;
  } else if (o.dtype == "float16") {
    dtype = NpyDType::kF16;
  } else {
    std::fprintf(err, "kvcalib dump-synthetic: --dtype: got '%s', expected float32 or float16\n",
                 o.dtype.c_str());
    return 1;
  }
  StatusOr<CalibrationData> data = GenerateSyntheticCalibration(o.synth);
  StatusOr<std::vector<std::string>> dirs = data.ok()
                                                ? WriteCalibrationDump(*data, o.out, dtype)
                                                : StatusOr<std::vector<std::string>>(data.status());
  if (!dirs.ok()) {
    std::fprintf(err, "kvcalib dump-synthetic: %s\n", dirs.status().message().c_str());
    return 1;
  }
  for (const std::string& d : *dirs) std::fprintf(out, "%s\n", d.c_str());
  return 0;
}

}  // namespace kvctl
