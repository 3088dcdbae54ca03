// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// kvbench attention: see tools/kvbench_attention.h.
#include "tools/kvbench_attention.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "common/half.h"
#include "kernels/attention.h"
#include "kernels/quant_types.h"
#include "kernels/quantize.h"
#include "tests/support/synthetic_kv.h"
#include "tools/kvbench_command.h"

namespace kvctl {
namespace {

struct Geometry {
  const char* name;
  int kv_heads, q_heads, head_dim;
};
constexpr Geometry kGeometries[] = {
    {"smollm2", 3, 9, 64},      // SmolLM2-135M/360M: 3 KV heads x 64, 9 query heads.
    {"llama3-8b", 8, 32, 128},  // Llama-3-8B: 8 KV heads x 128, 32 query heads.
};

std::string LoadAvg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

// One unit of parallel work: KV head `head`, records [first, first + count), window rows
// [win_first, win_first + win_count), into part buffer `part` (parts of a head are merged).
struct Task {
  int head;
  int64_t first, count, win_first, win_count;
  int part;
};

// Parts per head so that every thread gets about four tasks, none smaller than `min_items`.
int PartsPerHead(int threads, int heads, int64_t items, int64_t min_items) {
  if (threads <= 1) return 1;
  const int64_t want = (4 * int64_t{threads} + heads - 1) / heads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, items / min_items)));
}

// A layer's attention, run as split-K tasks on OpenMP threads plus one merge per head. Either
// over records (fused; the window rides with the last part) or over a dense window only.
class LayerAttention {
 public:
  LayerAttention(const QuantSpec& spec, int heads, int group, int threads)
      : spec_(spec), heads_(heads), group_(group), threads_(threads) {}

  // Head h's inputs: records (and OScaR norms) and a window view with window_head = h.
  void SetHead(int h, std::vector<const uint8_t*> records, std::vector<const float*> norms,
               KvTensorView window_k, KvTensorView window_v) {
    if (static_cast<int>(inputs_.size()) <= h) inputs_.resize(h + 1);
    inputs_[h] = {std::move(records), std::move(norms), window_k, window_v};
  }

  // Splits records (or, with none, the window) into parts. Call after every SetHead.
  void Plan() {
    tasks_.clear();
    parts_ = 0;
    for (int h = 0; h < heads_; ++h) {
      const Input& in = inputs_[h];
      const int64_t n = static_cast<int64_t>(in.records.size());
      const bool dense = n == 0;
      const int64_t items = dense ? in.window_k.tokens : n;
      const int p = PartsPerHead(threads_, heads_, items, dense ? 2048 : 8);
      for (int i = 0; i < p; ++i) {
        const int64_t a = items * i / p, b = items * (i + 1) / p;
        Task t{h, 0, 0, 0, 0, parts_ + i};
        if (dense) {
          t.win_first = a;
          t.win_count = b - a;
        } else {
          t.first = a;
          t.count = b - a;
          if (i == p - 1) t.win_count = in.window_k.tokens;
        }
        tasks_.push_back(t);
      }
      head_parts_.resize(heads_ + 1);
      head_parts_[h] = parts_;
      parts_ += p;
    }
    head_parts_[heads_] = parts_;
    part_out_.assign(static_cast<size_t>(parts_) * group_ * spec_.head_dim, 0.0f);
    part_lse_.assign(static_cast<size_t>(parts_) * group_, 0.0f);
  }

  // q [heads * group, D] -> out [heads * group, D].
  Status Run(const float* q, float* out, float* lse) {
    const int d = spec_.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<Status> status(tasks_.size());
    const int64_t n = static_cast<int64_t>(tasks_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
    for (int64_t i = 0; i < n; ++i) {
      const Task& t = tasks_[i];
      const Input& in = inputs_[t.head];
      AttentionKv kv;
      kv.records = in.records.data() + t.first;
      kv.record_norms = in.norms.empty() ? nullptr : in.norms.data() + t.first;
      kv.num_records = t.count;
      if (t.win_count > 0) {
        kv.window_k = in.window_k.Tokens(t.win_first, t.win_count);
        kv.window_v = in.window_v.Tokens(t.win_first, t.win_count);
        kv.window_head = t.head;
      }
      status[i] = DecodeAttention(
          spec_, kv, {q + int64_t{t.head} * group_ * d, group_, scale},
          {part_out_.data() + int64_t{t.part} * group_ * d, part_lse_.data() + t.part * group_});
    }
    for (const Status& s : status) KVCTL_RETURN_IF_ERROR(s);
    for (int h = 0; h < heads_; ++h) {
      const int a = head_parts_[h], p = head_parts_[h + 1] - a;
      std::vector<const float*> outs(p), lses(p);
      for (int i = 0; i < p; ++i) {
        outs[i] = part_out_.data() + int64_t{a + i} * group_ * d;
        lses[i] = part_lse_.data() + (a + i) * group_;
      }
      KVCTL_RETURN_IF_ERROR(MergeAttentionParts(
          group_, d, p, outs.data(), lses.data(),
          {out + int64_t{h} * group_ * d, lse == nullptr ? scratch_lse(h) : lse + h * group_}));
    }
    return OkStatus();
  }

 private:
  struct Input {
    std::vector<const uint8_t*> records;
    std::vector<const float*> norms;
    KvTensorView window_k, window_v;
  };
  float* scratch_lse(int h) {
    lse_scratch_.resize(static_cast<size_t>(heads_) * group_);
    return lse_scratch_.data() + h * group_;
  }

  QuantSpec spec_;
  int heads_, group_, threads_;
  std::vector<Input> inputs_;
  std::vector<Task> tasks_;
  std::vector<int> head_parts_;
  int parts_ = 0;
  std::vector<float> part_out_, part_lse_, lse_scratch_;
};

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double{a[i]} - b[i]));
    ref = std::max(ref, std::fabs(double{b[i]}));
  }
  return ref > 0 ? diff / ref : diff;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// Everything one fused method needs at one length: records of every head (tiled from the base
// records), OScaR norms, and the fp16 window (sinks + tail rows of the dense cache).
struct FusedCase {
  FusedResult result;
  QuantSpec spec;
  std::vector<uint8_t> records;              // [H][N][record_bytes].
  std::vector<float> norms;                  // [N * G] (OScaR).
  std::vector<uint16_t> window_k, window_v;  // [H][Tw][D] fp16.
  std::unique_ptr<LayerAttention> attention;
  std::vector<double> samples;
};

// The dense cache [H, T, D] fp32 with token t = base token t mod P.
struct DenseCache {
  int heads = 0, dim = 0;
  int64_t tokens = 0, period = 0;
  std::vector<float> k, v;
  const float* Row(const std::vector<float>& x, int h, int64_t t) const {
    return x.data() + (int64_t{h} * tokens + t) * dim;
  }
};

StatusOr<FusedCase> MakeFusedCase(const std::string& method_name, int bits, const DenseCache& c,
                                  const SyntheticKv& base, int group, int threads) {
  KVCTL_ASSIGN_OR_RETURN(QuantMethod method, ParseQuantMethod(method_name));
  FusedCase fc;
  KVCTL_ASSIGN_OR_RETURN(fc.spec, MakeQuantSpec(method, c.dim, bits, bits));
  const StreamingRules& rules = TraitsOf(method).streaming;
  const int64_t g = fc.spec.block_tokens;
  const int64_t quantized = QuantizedTokenCount(fc.spec, rules, c.tokens);
  const int64_t sinks = std::min<int64_t>(rules.sink_tokens, c.tokens);
  const int64_t n = quantized / g, tw = c.tokens - quantized;
  if (c.period % g != 0) {
    return InvalidArgument("--base-tokens: got ", c.period,
                           ", expected a multiple of block_tokens ", g, " for ", method_name);
  }
  const size_t rb = BlockLayoutOf(fc.spec).record_bytes;
  // Base records: one per (head, block of the period), quantized once, then tiled. Records start
  // at token sinks + b * g, so the period is read from phase = sinks mod g on (wrapping around):
  // base block m then holds the tokens of every record whose start is phase + m * g mod period.
  const int64_t phase = sinks % g;
  const int64_t base_blocks = c.period / g;
  const size_t row_floats = static_cast<size_t>(c.heads) * c.dim;
  std::vector<float> rot_k(base.k.size()), rot_v(base.v.size());
  for (int64_t t = 0; t < c.period; ++t) {
    const size_t src = static_cast<size_t>((phase + t) % c.period) * row_floats;
    std::copy_n(base.k.data() + src, row_floats, rot_k.data() + t * row_floats);
    std::copy_n(base.v.data() + src, row_floats, rot_v.data() + t * row_floats);
  }
  std::vector<uint8_t> base_records(static_cast<size_t>(c.heads * base_blocks) * rb);
  std::vector<float> base_norms, rot_norms;
  if (TraitsOf(method).needs_token_norms) {
    base_norms.resize(static_cast<size_t>(c.period));
    ComputeTokenNorms(base.KView(), base_norms.data());
    rot_norms.resize(base_norms.size());
    for (int64_t t = 0; t < c.period; ++t) rot_norms[t] = base_norms[(phase + t) % c.period];
  }
  for (int h = 0; h < c.heads; ++h) {
    for (int64_t b = 0; b < base_blocks; ++b) {
      const int64_t row = (b * g * c.heads + h) * c.dim;
      BlockInput in{rot_k.data() + row, rot_v.data() + row, int64_t{c.heads} * c.dim,
                    rot_norms.empty() ? nullptr : rot_norms.data() + b * g};
      KVCTL_RETURN_IF_ERROR(
          QuantizeBlock(fc.spec, in, base_records.data() + (h * base_blocks + b) * rb));
    }
  }
  fc.records.resize(static_cast<size_t>(c.heads * n) * rb);
  for (int h = 0; h < c.heads; ++h) {
    for (int64_t b = 0; b < n; ++b) {
      const int64_t src = ((sinks + b * g) % c.period) / g;
      std::copy_n(base_records.data() + (h * base_blocks + src) * rb, rb,
                  fc.records.data() + (h * n + b) * rb);
    }
  }
  if (!base_norms.empty()) {
    fc.norms.resize(static_cast<size_t>(n * g));
    for (int64_t t = 0; t < n * g; ++t) fc.norms[t] = base_norms[(sinks + t) % c.period];
  }
  // Window: tokens [0, sinks) and [sinks + quantized, T), stored fp16 like the daemon's.
  fc.window_k.resize(static_cast<size_t>(c.heads * tw * c.dim));
  fc.window_v.resize(fc.window_k.size());
  for (int h = 0; h < c.heads; ++h) {
    for (int64_t i = 0; i < tw; ++i) {
      const int64_t t = i < sinks ? i : quantized + i;
      for (int d = 0; d < c.dim; ++d) {
        fc.window_k[(h * tw + i) * c.dim + d] = FloatToHalf(c.Row(c.k, h, t)[d]);
        fc.window_v[(h * tw + i) * c.dim + d] = FloatToHalf(c.Row(c.v, h, t)[d]);
      }
    }
  }
  fc.attention = std::make_unique<LayerAttention>(fc.spec, c.heads, group, threads);
  for (int h = 0; h < c.heads; ++h) {
    std::vector<const uint8_t*> recs(n);
    std::vector<const float*> norms;
    for (int64_t b = 0; b < n; ++b) {
      recs[b] = fc.records.data() + (h * n + b) * rb;
      if (!fc.norms.empty()) norms.push_back(fc.norms.data() + b * g);
    }
    KvTensorView wk{fc.window_k.data(), DType::kF16, tw, c.heads, c.dim, c.dim, tw * c.dim};
    KvTensorView wv{fc.window_v.data(), DType::kF16, tw, c.heads, c.dim, c.dim, tw * c.dim};
    if (tw == 0) wk = wv = KvTensorView{};
    fc.attention->SetHead(h, std::move(recs), std::move(norms), wk, wv);
  }
  fc.attention->Plan();
  fc.result.method = method_name;
  fc.result.k_bits = fc.result.v_bits = bits;
  fc.result.quantized_tokens = quantized;
  fc.result.window_tokens = tw;
  fc.result.cache_mib =
      static_cast<double>(fc.records.size() + fc.norms.size() * 4 + fc.window_k.size() * 4) /
      (1 << 20);
  return fc;
}

template <typename F>
double TimeUs(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

StatusOr<AttentionBenchRow> RunRow(const Geometry& geo, int64_t tokens,
                                   const AttentionBenchOptions& o, const SyntheticKv& base,
                                   int threads) {
  AttentionBenchRow row;
  row.geometry = geo.name;
  row.kv_heads = geo.kv_heads;
  row.q_heads = geo.q_heads;
  row.head_dim = geo.head_dim;
  row.tokens = tokens;
  row.reps = o.reps > 0 ? o.reps : tokens <= 8192 ? 41 : tokens <= 65536 ? 15 : 7;
  const int group = geo.q_heads / geo.kv_heads;
  DenseCache c;
  c.heads = geo.kv_heads;
  c.dim = geo.head_dim;
  c.tokens = tokens;
  c.period = base.tokens;
  c.k.resize(static_cast<size_t>(c.heads * tokens * c.dim));
  c.v.resize(c.k.size());
  for (int h = 0; h < c.heads; ++h) {
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t src = ((t % c.period) * c.heads + h) * c.dim;
      std::copy_n(base.k.data() + src, c.dim, c.k.data() + (h * tokens + t) * c.dim);
      std::copy_n(base.v.data() + src, c.dim, c.v.data() + (h * tokens + t) * c.dim);
    }
  }
  row.dense_mib = static_cast<double>(c.k.size() * 8) / (1 << 20);
  // The decode query: the synthetic query rows of the last base position.
  std::vector<float> q(base.q.end() - int64_t{geo.q_heads} * geo.head_dim, base.q.end());
  const size_t out_size = q.size();

  // Our SIMD fp32 baseline: the whole cache as an fp32 window, the fused code's primitives.
  KVCTL_ASSIGN_OR_RETURN(QuantSpec dense_spec, MakeQuantSpec(QuantMethod::kFp16, c.dim, 16, 16));
  LayerAttention dense(dense_spec, c.heads, group, threads);
  const KvTensorView dk{c.k.data(), DType::kF32, tokens, c.heads, c.dim, c.dim, tokens * c.dim};
  const KvTensorView dv{c.v.data(), DType::kF32, tokens, c.heads, c.dim, c.dim, tokens * c.dim};
  for (int h = 0; h < c.heads; ++h) dense.SetHead(h, {}, {}, dk, dv);
  dense.Plan();
  std::vector<float> simd_out(out_size), sdpa_out(out_size), fused_out(out_size);

  StatusOr<std::unique_ptr<DenseSdpa>> sdpa =
      MakeTorchSdpa(c.k.data(), c.v.data(), c.heads, tokens, c.dim, group, threads);
  if (!sdpa.ok() && sdpa.status().code() != StatusCode::kUnimplemented) return sdpa.status();
  std::vector<FusedCase> cases;
  for (const std::string& m : o.methods) {
    KVCTL_ASSIGN_OR_RETURN(FusedCase fc, MakeFusedCase(m, o.bits, c, base, group, threads));
    cases.push_back(std::move(fc));
  }

  // Interleaved: every repetition runs each variant once, in a rotating order, after one untimed
  // round; medians per variant.
  std::vector<double> sdpa_samples, simd_samples;
  Status failure;
  const int variants = 2 + static_cast<int>(cases.size());
  for (int rep = -1; rep < row.reps; ++rep) {
    for (int j = 0; j < variants; ++j) {
      const int which = (j + std::max(rep, 0)) % variants;
      double us = 0;
      if (which == 0) {
        if (!sdpa.ok()) continue;
        us = TimeUs([&] { (*sdpa)->Run(q.data(), sdpa_out.data()); });
        if (rep >= 0) sdpa_samples.push_back(us);
      } else if (which == 1) {
        us = TimeUs([&] { failure = dense.Run(q.data(), simd_out.data(), nullptr); });
        if (rep >= 0) simd_samples.push_back(us);
      } else {
        FusedCase& fc = cases[which - 2];
        us = TimeUs([&] { failure = fc.attention->Run(q.data(), fused_out.data(), nullptr); });
        if (rep >= 0) fc.samples.push_back(us);
        if (rep == -1) fc.result.rel_err_fp32 = MaxRelDiff(fused_out, simd_out);
      }
      KVCTL_RETURN_IF_ERROR(failure);
    }
  }
  row.simd_fp32_us = Median(simd_samples);
  row.simd_fp32_min_us = Min(simd_samples);
  if (sdpa.ok()) {
    row.sdpa_us = Median(sdpa_samples);
    row.sdpa_min_us = Min(sdpa_samples);
    row.dense_agreement = MaxRelDiff(simd_out, sdpa_out);
    if (row.dense_agreement > 1e-3) {
      return Internal("SIMD fp32 and torch SDPA disagree: ", row.dense_agreement, " at ", geo.name,
                      " T=", tokens);
    }
  }
  for (FusedCase& fc : cases) {
    fc.result.median_us = Median(fc.samples);
    fc.result.min_us = Min(fc.samples);
    row.fused.push_back(fc.result);
  }
  return row;
}

}  // namespace

StatusOr<AttentionBenchReport> RunAttentionBench(const AttentionBenchOptions& options) {
  AttentionBenchOptions o = options;
  if (o.quick) {
    o.tokens = {4096};
    if (o.reps == 0) o.reps = 3;
  }
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.bits != 2 && o.bits != 3 && o.bits != 4 && o.bits != 8) {
    return InvalidArgument("--bits: got ", o.bits, ", expected 2, 3, 4 or 8");
  }
  if (o.base_tokens < 256 || o.base_tokens > 65536 || o.base_tokens % 256 != 0) {
    return InvalidArgument("--base-tokens: got ", o.base_tokens,
                           ", expected a multiple of 256 in 256..65536");
  }
  for (int64_t t : o.tokens) {
    if (t < 1 || t > (int64_t{1} << 20)) {
      return InvalidArgument("--tokens: got ", t, ", expected 1..1048576");
    }
  }
  if (o.methods.empty()) {
    o.methods = {"kivi", "kvarn", "quarot", "oscar"};
    if (o.bits <= 4) o.methods.push_back("turbo");
  }
  for (const std::string& m : o.methods) {
    KVCTL_ASSIGN_OR_RETURN(const QuantMethod method, ParseQuantMethod(m));
    if (method == QuantMethod::kTurbo && o.bits > 4) {
      return InvalidArgument("--methods: turbo has widths 2, 3 and 4, but --bits is ", o.bits);
    }
  }
  std::vector<Geometry> geos;
  for (const std::string& name : o.geometries) {
    const auto it = std::find_if(std::begin(kGeometries), std::end(kGeometries),
                                 [&](const Geometry& g) { return name == g.name; });
    if (it == std::end(kGeometries)) {
      return InvalidArgument("--geometries: unknown \"", name, "\", expected smollm2 or llama3-8b");
    }
    geos.push_back(*it);
  }
  KVCTL_RETURN_IF_ERROR(ApplySimdFlag(o.simd));
  AttentionBenchReport report;
  report.threads = threads;
  report.simd = std::string(SimdLevelName(ActiveSimdLevel()));
  report.torch_version = TorchVersion();
  report.load_before = LoadAvg();
  for (const Geometry& geo : geos) {
    const SyntheticKv base = GenerateSyntheticKv({.tokens = o.base_tokens,
                                                  .heads = geo.kv_heads,
                                                  .head_dim = geo.head_dim,
                                                  .q_heads = geo.q_heads,
                                                  .seed = o.seed});
    for (int64_t t : o.tokens) {
      KVCTL_ASSIGN_OR_RETURN(AttentionBenchRow row, RunRow(geo, t, o, base, threads));
      report.rows.push_back(std::move(row));
    }
  }
  report.load_after = LoadAvg();
  return report;
}

std::string FormatAttentionTable(const AttentionBenchReport& r) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(0);
  s << "kvbench attention: one decode step of one layer, " << r.threads << " threads, SIMD "
    << r.simd << ", torch " << (r.torch_version.empty() ? "not linked" : r.torch_version)
    << ", loadavg " << r.load_before << " -> " << r.load_after << "\n";
  s << "us per layer, median (min) of the repetitions; x = speed-up of the medians\n";
  s << "geometry   tokens     torch_sdpa_fp32     simd_fp32 | method         fused  x_sdpa x_simd"
       "  cache_MiB dense_MiB rel_err\n";
  for (const AttentionBenchRow& row : r.rows) {
    for (const FusedResult& f : row.fused) {
      char line[256];
      std::snprintf(line, sizeof(line),
                    "%-10s %7lld %9.0f (%7.0f) %7.0f (%6.0f) | %-6s %7.0f (%6.0f) %6.2f %6.2f "
                    "%10.1f %9.1f %7.3f\n",
                    row.geometry.c_str(), static_cast<long long>(row.tokens), row.sdpa_us,
                    row.sdpa_min_us, row.simd_fp32_us, row.simd_fp32_min_us, f.method.c_str(),
                    f.median_us, f.min_us, row.sdpa_us > 0 ? row.sdpa_us / f.median_us : 0.0,
                    row.simd_fp32_us / f.median_us, f.cache_mib, row.dense_mib, f.rel_err_fp32);
      s << line;
    }
  }
  return s.str();
}

std::string FormatAttentionJson(const AttentionBenchReport& r) {
  std::ostringstream s;
  s.precision(6);
  s << "{\"benchmark\": \"kvbench attention\", \"threads\": " << r.threads << ", \"simd\": \""
    << r.simd << "\", \"torch\": "
    << (r.torch_version.empty() ? std::string("null") : "\"" + r.torch_version + "\"")
    << ", \"loadavg_before\": \"" << r.load_before << "\", \"loadavg_after\": \"" << r.load_after
    << "\", \"unit\": \"microseconds per layer (every head), median\", \"rows\": [";
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const AttentionBenchRow& row = r.rows[i];
    s << (i ? ", " : "") << "\n  {\"geometry\": \"" << row.geometry
      << "\", \"kv_heads\": " << row.kv_heads << ", \"q_heads\": " << row.q_heads
      << ", \"head_dim\": " << row.head_dim << ", \"tokens\": " << row.tokens
      << ", \"reps\": " << row.reps << ", \"dense_fp32_mib\": " << row.dense_mib
      << ", \"torch_sdpa_fp32_us\": ";
    if (row.sdpa_us >= 0) {
      s << row.sdpa_us;
    } else {
      s << "null";
    }
    s << ", \"torch_sdpa_fp32_min_us\": ";
    if (row.sdpa_min_us >= 0) {
      s << row.sdpa_min_us;
    } else {
      s << "null";
    }
    s << ", \"simd_fp32_us\": " << row.simd_fp32_us
      << ", \"simd_fp32_min_us\": " << row.simd_fp32_min_us
      << ", \"simd_vs_sdpa_max_rel_diff\": " << row.dense_agreement << ", \"fused\": [";
    for (size_t j = 0; j < row.fused.size(); ++j) {
      const FusedResult& f = row.fused[j];
      s << (j ? ", " : "") << "\n    {\"method\": \"" << f.method << "\", \"k_bits\": " << f.k_bits
        << ", \"v_bits\": " << f.v_bits << ", \"quantized_tokens\": " << f.quantized_tokens
        << ", \"window_tokens\": " << f.window_tokens << ", \"cache_mib\": " << f.cache_mib
        << ", \"us\": " << f.median_us << ", \"min_us\": " << f.min_us
        << ", \"speedup_vs_torch_sdpa\": ";
      if (row.sdpa_us > 0) {
        s << row.sdpa_us / f.median_us;
      } else {
        s << "null";
      }
      s << ", \"speedup_vs_simd_fp32\": " << row.simd_fp32_us / f.median_us
        << ", \"max_rel_err_vs_fp32\": " << f.rel_err_fp32 << "}";
    }
    s << "]}";
  }
  s << "]}\n";
  return s.str();
}

int RunAttentionCommand(const AttentionBenchOptions& options, bool json, std::FILE* out,
                        std::FILE* err) {
  return RunBenchCommand(
      "kvbench attention", [&] { return RunAttentionBench(options); },
      [&](const auto& report) {
        return json ? FormatAttentionJson(report) : FormatAttentionTable(report);
      },
      out, err);
}

}  // namespace kvctl
