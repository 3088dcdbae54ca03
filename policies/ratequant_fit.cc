// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// RateQuant calibration: measurement, the pooled regression and the TOML profile.
//
// Measurement, per layer and sequence (the header gives the reasons and provenance):
//  1. Load K and V of every head to per-head fp32 [T, D] buffers (the views may be fp16/bf16 and
//     strided). OScaR gets ComputeTokenNorms over all heads of the layer, once per sequence.
//  2. With queries: pick the probe positions, compute exact causal attention for every probe and
//     query head (scores, weights, output) and, if asked, accumulate the importance weights.
//  3. For each width b: quantize and dequantize every full block after the sinks with
//     MakeQuantSpec(method, D, b, b) (plus the option overrides), sum the squared errors of K and
//     V, and with queries the attention-output error of quantizing only K of head h (scores of the
//     quantized keys recomputed, softmax redone: do = sum_j (a^_j - a_j) v_j) and only V of head h
//     (do = sum_{j quantized} a_j (v^_j - v_j)). K and V live in one record, and their codecs are
//     independent, so one record per block gives both K's and V's error at b.
// Sums are in double; scores, rows and the attention deltas in float (D-long dot products with
// eight partial sums), which is far below the 8-bit errors we fit.
//
// The cost is dominated by the attention probes: about (2 + 3 * widths) * probes * Hq * T/2 * D
// multiply-adds per layer and sequence, on top of the codec calls.
#include "policies/ratequant_fit.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "common/file_util.h"
#include "kernels/quantize.h"
#include "policies/toml_text.h"

namespace kvctl {
namespace {

using internal::StrCat;

Status Prefixed(std::string_view prefix, const Status& s) {
  return Status(s.code(), StrCat(prefix, s.message()));
}

float Dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; i += 8) {  // n is a multiple of 8 (the registry requires it of D).
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// sum (a - b)^2 over n floats, n a multiple of 8; partial sums in float (one block at a time).
double SquaredDistance(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += (a[i + k] - b[i + k]) * (a[i + k] - b[i + k]);
  }
  double sum = 0;
  for (float x : acc) sum += x;
  return sum;
}

// Softmax of scores[0..n) into w (double), max-subtracted.
void Softmax(const float* scores, int64_t n, double* w) {
  float mx = scores[0];
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, scores[j]);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (w[j] = std::exp(static_cast<double>(scores[j] - mx)));
  for (int64_t j = 0; j < n; ++j) w[j] /= sum;
}

struct Geometry {
  int layers = 0;
  int heads = 0;
  int head_dim = 0;
  int q_heads = 0;  // 0 without queries.
};

Status CheckView(const KvTensorView& view, const std::string& name) {
  KVCTL_RETURN_IF_ERROR(view.Validate(name));
  return view.CheckFinite(name);
}

StatusOr<Geometry> ValidateData(const CalibrationSet& data) {
  if (data.empty()) return InvalidArgument("data: got 0 sequences, expected >= 1");
  Geometry g;
  g.layers = static_cast<int>(data[0].size());
  if (g.layers < 1 || g.layers > 4096) {
    return InvalidArgument("data[0]: got ", data[0].size(), " layers, expected 1..4096");
  }
  const bool has_q = data[0][0].q.data != nullptr;
  for (size_t s = 0; s < data.size(); ++s) {
    if (data[s].size() != data[0].size()) {
      return InvalidArgument("data[", s, "]: got ", data[s].size(), " layers, expected ", g.layers,
                             " as data[0]");
    }
    for (size_t l = 0; l < data[s].size(); ++l) {
      const CalibrationLayer& cl = data[s][l];
      const std::string at = StrCat("data[", s, "][", l, "].");
      KVCTL_RETURN_IF_ERROR(CheckView(cl.k, at + "k"));
      KVCTL_RETURN_IF_ERROR(CheckView(cl.v, at + "v"));
      if (s == 0 && l == 0) {
        g.heads = static_cast<int>(cl.k.heads);
        g.head_dim = static_cast<int>(cl.k.head_dim);
      }
      if (cl.k.heads != g.heads || cl.k.head_dim != g.head_dim) {
        return InvalidArgument(at, "k: shape [", cl.k.tokens, ", ", cl.k.heads, ", ", cl.k.head_dim,
                               "], expected [T, ", g.heads, ", ", g.head_dim, "] as data[0][0].k");
      }
      if (cl.v.tokens != cl.k.tokens || cl.v.heads != cl.k.heads ||
          cl.v.head_dim != cl.k.head_dim) {
        return InvalidArgument(at, "v: shape [", cl.v.tokens, ", ", cl.v.heads, ", ", cl.v.head_dim,
                               "], expected k's [", cl.k.tokens, ", ", cl.k.heads, ", ",
                               cl.k.head_dim, "]");
      }
      if ((cl.q.data != nullptr) != has_q) {
        return InvalidArgument(at, "q: ", has_q ? "missing" : "given",
                               ", expected queries for every (sequence, layer) or for none");
      }
      if (!has_q) continue;
      KVCTL_RETURN_IF_ERROR(CheckView(cl.q, at + "q"));
      if (s == 0 && l == 0) g.q_heads = static_cast<int>(cl.q.heads);
      if (cl.q.tokens != cl.k.tokens || cl.q.heads != g.q_heads || cl.q.head_dim != g.head_dim ||
          g.q_heads % g.heads != 0) {
        return InvalidArgument(at, "q: shape [", cl.q.tokens, ", ", cl.q.heads, ", ", cl.q.head_dim,
                               "], expected [", cl.k.tokens, ", ", g.q_heads, " (a multiple of ",
                               g.heads, "), ", g.head_dim, "]");
      }
    }
  }
  return g;
}

StatusOr<QuantSpec> BuildSpec(const RateQuantFitOptions& o, int head_dim) {
  if (o.method == QuantMethod::kFp16) {
    return InvalidArgument("method: got fp16, expected a quantizing method");
  }
  if (o.bits.size() < 2) {
    return InvalidArgument("bits: got ", o.bits.size(), " widths, expected >= 2 to fit a slope");
  }
  KVCTL_ASSIGN_OR_RETURN(QuantSpec spec, MakeQuantSpec(o.method, head_dim, o.bits[0], o.bits[0]));
  for (const auto& [name, value, field] :
       {std::tuple{"block_tokens", o.block_tokens, &spec.block_tokens},
        std::tuple{"k_group_tokens", o.k_group_tokens, &spec.k_group_tokens},
        std::tuple{"v_group_channels", o.v_group_channels, &spec.v_group_channels},
        std::tuple{"sinkhorn_iters", o.sinkhorn_iters, &spec.sinkhorn_iters}}) {
    if (value < 0) return InvalidArgument(name, ": got ", value, ", expected 0 (default) or > 0");
    if (value > 0) *field = value;
  }
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  QuantSpec s = spec;
  for (size_t j = 0; j < o.bits.size(); ++j) {
    if (j > 0 && o.bits[j] <= o.bits[j - 1]) {
      return InvalidArgument("bits[", j, "]: got ", o.bits[j], ", expected > ", o.bits[j - 1],
                             " (ascending, no repeats)");
    }
    s.k_bits = s.v_bits = o.bits[j];
    Status st = ValidateQuantSpec(s);
    if (!st.ok()) return Prefixed(StrCat("bits[", j, "]: "), st);
  }
  return spec;
}

// Sums for one layer over all sequences. Index (h * 2 + kind) * widths + j.
struct LayerSums {
  std::vector<double> sse, attn, importance;  // importance: index h * 2 + kind.
  double elements = 0;                        // Quantized elements per unit.
  double probes = 0;                          // Probe positions (per query head).
  double output_energy = 0;  // Sum over probes and query heads of the exact ||o||^2.
};

class LayerMeasurer {
 public:
  LayerMeasurer(const RateQuantFitOptions& o, const QuantSpec& spec, const Geometry& g, int sinks,
                int64_t flush)
      : o_(o),
        spec_(spec),
        g_(g),
        sinks_(sinks),
        d_(g.head_dim),
        scale_(1.0f / std::sqrt(static_cast<float>(g.head_dim))),
        flush_(flush) {}

  Status Add(const CalibrationLayer& cl, LayerSums& sums);

 private:
  void ExactAttention(LayerSums& sums);
  Status MeasureWidth(size_t j, LayerSums& sums);

  const RateQuantFitOptions& o_;
  const QuantSpec& spec_;
  const Geometry& g_;
  const int sinks_, d_;
  const float scale_;
  bool use_q_ = false, importance_ = false;
  // Quantized keys [q0_, QuantizedEnd(n)) as a decoding query with n visible tokens sees them.
  int64_t QuantizedEnd(int64_t n) const {
    const int64_t end = std::min(n, q1_);
    if (flush_ <= 0 || end <= q0_) return end;
    return std::min(end, q0_ + (n - q0_) / flush_ * flush_);
  }

  int64_t t_ = 0, q0_ = 0, q1_ = 0, flush_ = 0;
  std::vector<float> k_, v_, norms_, khat_, vhat_, q_, scores_, o_exact_, delta_;
  std::vector<double> w_, w_hat_;  // Exact weights [probe][qh][t]; scratch.
  std::vector<int64_t> probe_;
  std::vector<uint8_t> record_;
};

Status LayerMeasurer::Add(const CalibrationLayer& cl, LayerSums& sums) {
  const int h_count = g_.heads;
  t_ = cl.k.tokens;
  const int64_t g = spec_.block_tokens;
  q0_ = sinks_;
  q1_ = q0_ + (t_ - q0_) / g * g;
  k_.resize(static_cast<size_t>(h_count * t_ * d_));
  v_.resize(k_.size());
  for (int h = 0; h < h_count; ++h) {
    for (int64_t t = 0; t < t_; ++t) {
      cl.k.LoadRow(t, h, &k_[static_cast<size_t>((h * t_ + t) * d_)]);
      cl.v.LoadRow(t, h, &v_[static_cast<size_t>((h * t_ + t) * d_)]);
    }
  }
  if (TraitsOf(spec_.method).needs_token_norms) {
    norms_.resize(static_cast<size_t>(t_));
    ComputeTokenNorms(cl.k, norms_.data());
  }
  use_q_ = cl.q.data != nullptr &&
           (o_.measure_attention || o_.importance == ImportanceMode::kAttention ||
            o_.target == DistortionTarget::kAttention);
  importance_ = o_.importance == ImportanceMode::kAttention;
  if (use_q_) {
    // Probes evenly spaced over [max(sinks, T/2), T): every probe sees quantized keys.
    const int64_t lo = std::max<int64_t>(q0_, t_ / 2), span = t_ - lo;
    probe_.resize(static_cast<size_t>(o_.probe_queries));
    q_.resize(probe_.size() * g_.q_heads * d_);
    for (size_t p = 0; p < probe_.size(); ++p) {
      probe_[p] = t_ - 1 - static_cast<int64_t>(p) * span / o_.probe_queries;
      for (int qh = 0; qh < g_.q_heads; ++qh) {
        cl.q.LoadRow(probe_[p], qh, &q_[(p * g_.q_heads + qh) * d_]);
      }
    }
    ExactAttention(sums);
    sums.probes += static_cast<double>(probe_.size());
  }
  sums.elements += static_cast<double>((q1_ - q0_) * d_);
  khat_.resize(static_cast<size_t>((q1_ - q0_) * d_));
  vhat_.resize(khat_.size());
  for (size_t j = 0; j < o_.bits.size(); ++j) KVCTL_RETURN_IF_ERROR(MeasureWidth(j, sums));
  return OkStatus();
}

void LayerMeasurer::ExactAttention(LayerSums& sums) {
  const size_t cells = probe_.size() * g_.q_heads * t_;
  scores_.assign(cells, 0);
  w_.assign(cells, 0);
  o_exact_.assign(probe_.size() * g_.q_heads * d_, 0);
  const int group = g_.q_heads / g_.heads;
  for (size_t p = 0; p < probe_.size(); ++p) {
    const int64_t n = probe_[p] + 1;
    for (int qh = 0; qh < g_.q_heads; ++qh) {
      const int h = qh / group;
      const size_t row = p * g_.q_heads + qh;
      const float* q = &q_[row * d_];
      float* s = &scores_[row * t_];
      double* w = &w_[row * t_];
      float* o = &o_exact_[row * d_];
      for (int64_t j = 0; j < n; ++j) s[j] = Dot(q, &k_[(h * t_ + j) * d_], d_) * scale_;
      Softmax(s, n, w);
      for (int64_t j = 0; j < n; ++j) {
        const float a = static_cast<float>(w[j]);
        const float* v = &v_[(h * t_ + j) * d_];
        for (int c = 0; c < d_; ++c) o[c] += a * v[c];
      }
      sums.output_energy += Dot(o, o, d_);
      if (!importance_) continue;
      // w_V += D sum_{j in Q} a^2; w_K += ||q||^2 / D * sum_{j in Q} a^2 ||v_j - o||^2.
      double sum_a2 = 0, sum_k = 0;
      for (int64_t j = q0_; j < QuantizedEnd(n); ++j) {
        const float* v = &v_[(h * t_ + j) * d_];
        double dist = 0;
        for (int c = 0; c < d_; ++c) dist += (v[c] - o[c]) * (v[c] - o[c]);
        sum_a2 += w[j] * w[j];
        sum_k += w[j] * w[j] * dist;
      }
      sums.importance[static_cast<size_t>(h) * 2 + 1] += d_ * sum_a2;
      sums.importance[static_cast<size_t>(h) * 2] += Dot(q, q, d_) / d_ * sum_k;
    }
  }
}

Status LayerMeasurer::MeasureWidth(size_t j, LayerSums& sums) {
  QuantSpec spec = spec_;
  spec.k_bits = spec.v_bits = o_.bits[j];
  const int64_t g = spec.block_tokens;
  const size_t widths = o_.bits.size();
  const int group = use_q_ ? g_.q_heads / g_.heads : 1;
  record_.resize(BlockLayoutOf(spec).record_bytes);  // Grows with the width.
  delta_.resize(static_cast<size_t>(d_));
  w_hat_.resize(static_cast<size_t>(t_));
  std::vector<float> s_hat(static_cast<size_t>(t_));
  for (int h = 0; h < g_.heads; ++h) {
    double sse_k = 0, sse_v = 0;
    for (int64_t b0 = q0_; b0 < q1_; b0 += g) {
      const float* norms = norms_.empty() ? nullptr : &norms_[static_cast<size_t>(b0)];
      const BlockInput in{&k_[(h * t_ + b0) * d_], &v_[(h * t_ + b0) * d_], d_, norms};
      Status st = QuantizeBlock(spec, in, record_.data());
      if (!st.ok()) return Prefixed(StrCat("head ", h, " tokens ", b0, "..: "), st);
      float* kh = &khat_[(b0 - q0_) * d_];
      float* vh = &vhat_[(b0 - q0_) * d_];
      DequantizeBlock(spec, record_.data(), norms, kh, vh);
      if (o_.work != nullptr) ++o_.work->blocks_quantized;
      sse_k += SquaredDistance(in.k, kh, g * d_);
      sse_v += SquaredDistance(in.v, vh, g * d_);
    }
    const size_t uk = (static_cast<size_t>(h) * 2) * widths + j, uv = uk + widths;
    sums.sse[uk] += sse_k;
    sums.sse[uv] += sse_v;
    if (!use_q_ || !o_.measure_attention) continue;
    double err_k = 0, err_v = 0;
    for (size_t p = 0; p < probe_.size(); ++p) {
      const int64_t n = probe_[p] + 1, qend = QuantizedEnd(n);
      for (int qh = h * group; qh < (h + 1) * group; ++qh) {
        const size_t row = p * g_.q_heads + qh;
        const float* q = &q_[row * d_];
        const double* w = &w_[row * t_];
        // K quantized: new scores for the quantized keys, softmax again.
        std::copy_n(&scores_[row * t_], n, s_hat.begin());
        for (int64_t t = q0_; t < qend; ++t) s_hat[t] = Dot(q, &khat_[(t - q0_) * d_], d_) * scale_;
        Softmax(s_hat.data(), n, w_hat_.data());
        if (o_.work != nullptr) ++o_.work->attention_softmaxes;
        std::fill(delta_.begin(), delta_.end(), 0.0f);
        for (int64_t t = 0; t < n; ++t) {
          const float da = static_cast<float>(w_hat_[t] - w[t]);
          const float* v = &v_[(h * t_ + t) * d_];
          for (int c = 0; c < d_; ++c) delta_[c] += da * v[c];
        }
        for (int c = 0; c < d_; ++c) err_k += static_cast<double>(delta_[c]) * delta_[c];
        // V quantized: do = sum_{j quantized} a_j (v^_j - v_j).
        std::fill(delta_.begin(), delta_.end(), 0.0f);
        for (int64_t t = q0_; t < qend; ++t) {
          const float a = static_cast<float>(w[t]);
          const float* v = &v_[(h * t_ + t) * d_];
          const float* vh = &vhat_[(t - q0_) * d_];
          for (int c = 0; c < d_; ++c) delta_[c] += a * (vh[c] - v[c]);
        }
        for (int c = 0; c < d_; ++c) err_v += static_cast<double>(delta_[c]) * delta_[c];
      }
    }
    sums.attn[uk] += err_k;
    sums.attn[uv] += err_v;
  }
  return OkStatus();
}

// Slope and intercepts of the units in `ids` (indices into the measured table).
StatusOr<CurveFit> FitSubset(const std::vector<int>& bits, const std::vector<double>& measured,
                             const std::vector<size_t>& ids) {
  const size_t m = bits.size();
  double sxx = 0, sxy = 0;
  std::vector<double> mean_b(ids.size()), mean_y(ids.size());
  std::vector<int> count(ids.size());
  for (size_t u = 0; u < ids.size(); ++u) {
    for (size_t j = 0; j < m; ++j) {
      const double y = measured[ids[u] * m + j];
      if (!(y > 0)) continue;
      mean_b[u] += bits[j];
      mean_y[u] += std::log(y);
      ++count[u];
    }
    if (count[u] == 0) continue;
    mean_b[u] /= count[u];
    mean_y[u] /= count[u];
    for (size_t j = 0; j < m; ++j) {
      const double y = measured[ids[u] * m + j];
      if (!(y > 0)) continue;
      sxx += (bits[j] - mean_b[u]) * (bits[j] - mean_b[u]);
      sxy += (bits[j] - mean_b[u]) * (std::log(y) - mean_y[u]);
    }
  }
  if (!(sxx > 0)) {
    return FailedPrecondition(
        "measured: no unit has a positive distortion at two widths; "
        "nothing to fit a slope to");
  }
  const double ln_beta = -sxy / sxx;
  if (!(ln_beta > 0)) {
    return FailedPrecondition("beta: fitted ", std::exp(ln_beta),
                              " per bit, expected > 1 (distortion does not fall with bits)");
  }
  CurveFit fit;
  fit.beta = std::exp(ln_beta);
  fit.alpha.assign(ids.size(), 0);
  double ss = 0;
  for (size_t u = 0; u < ids.size(); ++u) {
    if (count[u] == 0) continue;
    const double ln_alpha = mean_y[u] + mean_b[u] * ln_beta;
    fit.alpha[u] = std::exp(ln_alpha);
    for (size_t j = 0; j < m; ++j) {
      const double y = measured[ids[u] * m + j];
      if (!(y > 0)) continue;
      const double r = std::log(y) - (ln_alpha - bits[j] * ln_beta);
      ss += r * r;
      ++fit.points;
    }
  }
  fit.rms_log_residual = std::sqrt(ss / static_cast<double>(fit.points));
  return fit;
}

}  // namespace

StatusOr<CurveFit> FitDistortionCurves(const std::vector<int>& bits,
                                       const std::vector<double>& measured, size_t units) {
  if (bits.size() < 2) {
    return InvalidArgument("bits: got ", bits.size(), " widths, expected >= 2");
  }
  if (units == 0 || measured.size() != units * bits.size()) {
    return InvalidArgument("measured: got ", measured.size(),
                           " values, expected units * bits = ", units, " * ", bits.size());
  }
  for (size_t i = 0; i < measured.size(); ++i) {
    if (!std::isfinite(measured[i])) {
      return InvalidArgument("measured[", i, "]: got ", measured[i], ", expected finite");
    }
  }
  std::vector<size_t> ids(units);
  for (size_t i = 0; i < units; ++i) ids[i] = i;
  return FitSubset(bits, measured, ids);
}

StatusOr<RateQuantFit> FitRateQuant(const CalibrationSet& data, const RateQuantFitOptions& o) {
  KVCTL_ASSIGN_OR_RETURN(Geometry g, ValidateData(data));
  KVCTL_ASSIGN_OR_RETURN(QuantSpec spec, BuildSpec(o, g.head_dim));
  const bool has_q = g.q_heads > 0;
  if (o.target == DistortionTarget::kAttention && !has_q) {
    return InvalidArgument("target: got attention, expected mse when no queries are given");
  }
  if (o.importance == ImportanceMode::kAttention && !has_q) {
    return InvalidArgument("importance: got attention, expected uniform when no queries are given");
  }
  if (o.target == DistortionTarget::kAttention && o.importance == ImportanceMode::kAttention) {
    return InvalidArgument(
        "importance: got attention with target attention, expected uniform "
        "(the attention error already carries that weight)");
  }
  if (o.target == DistortionTarget::kAttention && !o.measure_attention) {
    return InvalidArgument("measure_attention: got false, expected true for target attention");
  }
  const int sinks = TraitsOf(o.method).streaming.sink_tokens;
  if (o.decode_flush_tokens < -1) {
    return InvalidArgument("decode_flush_tokens: got ", o.decode_flush_tokens,
                           ", expected -1 (the method's flush), 0 or a token count");
  }
  const int64_t flush =
      o.decode_flush_tokens < 0 ? TraitsOf(o.method).streaming.flush_tokens : o.decode_flush_tokens;
  int64_t tokens = 0;
  for (size_t s = 0; s < data.size(); ++s) {
    const int64_t t = data[s][0].k.tokens;
    tokens += t;
    if (t < sinks + spec.block_tokens) {
      return InvalidArgument("data[", s, "][0].k: tokens: got ", t,
                             ", expected >= ", sinks + spec.block_tokens, " (", sinks, " ",
                             QuantMethodName(o.method), " sink tokens + one ", spec.block_tokens,
                             "-token block)");
    }
    for (size_t l = 1; l < data[s].size(); ++l) {
      if (data[s][l].k.tokens != t) {
        return InvalidArgument("data[", s, "][", l, "].k: tokens: got ", data[s][l].k.tokens,
                               ", expected ", t, " as data[", s, "][0].k");
      }
    }
    const bool weighted =
        o.importance == ImportanceMode::kAttention || o.target == DistortionTarget::kAttention;
    if (has_q && weighted && flush > 0 && t < sinks + flush) {
      return InvalidArgument("data[", s, "][0].k: tokens: got ", t, ", expected >= ", sinks + flush,
                             " (", sinks, " sinks + decode_flush_tokens ", flush,
                             ": a decoding query sees no key quantized before that; use longer "
                             "sequences or decode_flush_tokens 0)");
    }
    const int64_t span = t - std::max<int64_t>(sinks, t / 2);
    if (has_q && (o.probe_queries < 1 || o.probe_queries > span)) {
      return InvalidArgument("probe_queries: got ", o.probe_queries, ", expected 1..", span,
                             " (positions in the second half of data[", s, "], after the sinks)");
    }
  }

  RateQuantFit fit;
  fit.spec = spec;
  fit.layers = g.layers;
  fit.kv_heads = g.heads;
  fit.bits = o.bits;
  fit.target = o.target;
  fit.importance = o.importance;
  fit.per_kind_beta = o.per_kind_beta;
  fit.sequences = static_cast<int64_t>(data.size());
  fit.tokens = tokens;
  const size_t widths = o.bits.size();
  const bool record_attention = has_q && o.measure_attention;
  LayerMeasurer measurer(o, spec, g, sinks, flush);
  for (int l = 0; l < g.layers; ++l) {
    LayerSums sums;
    sums.sse.assign(static_cast<size_t>(g.heads) * 2 * widths, 0);
    sums.attn.assign(sums.sse.size(), 0);
    sums.importance.assign(static_cast<size_t>(g.heads) * 2, 0);
    for (size_t s = 0; s < data.size(); ++s) {
      Status st = measurer.Add(data[s][static_cast<size_t>(l)], sums);
      if (!st.ok()) return Prefixed(StrCat("data[", s, "][", l, "]: "), st);
    }
    // Relative to the layer's output: the mean exact ||o||^2 of one GQA group at one probe.
    const double energy = sums.output_energy / (sums.probes * g.heads);
    const double per_energy = o.relative_to_output && energy > 0 ? 1.0 / energy : 1.0;
    for (int h = 0; h < g.heads; ++h) {
      for (int kind = 0; kind < 2; ++kind) {
        RateQuantUnit u;
        u.layer = l;
        u.head = h;
        u.kind = static_cast<UnitKind>(kind);
        const size_t base = (static_cast<size_t>(h) * 2 + kind) * widths;
        for (size_t j = 0; j < widths; ++j) {
          u.mse.push_back(sums.sse[base + j] / sums.elements);
          if (record_attention) {
            u.attention.push_back(sums.attn[base + j] / sums.probes * per_energy);
          }
        }
        if (o.importance == ImportanceMode::kAttention) {
          u.importance =
              sums.importance[static_cast<size_t>(h) * 2 + kind] / sums.probes * per_energy;
        }
        fit.units.push_back(std::move(u));
      }
    }
  }
  // Regression on the target, pooled over all units and over K / V units alone.
  std::vector<double> table;
  std::vector<size_t> all, keys, values;
  for (size_t i = 0; i < fit.units.size(); ++i) {
    const RateQuantUnit& u = fit.units[i];
    const std::vector<double>& y = o.target == DistortionTarget::kMse ? u.mse : u.attention;
    table.insert(table.end(), y.begin(), y.end());
    all.push_back(i);
    (u.kind == UnitKind::kKey ? keys : values).push_back(i);
  }
  KVCTL_ASSIGN_OR_RETURN(CurveFit pooled, FitSubset(o.bits, table, all));
  KVCTL_ASSIGN_OR_RETURN(CurveFit k_fit, FitSubset(o.bits, table, keys));
  KVCTL_ASSIGN_OR_RETURN(CurveFit v_fit, FitSubset(o.bits, table, values));
  fit.beta = pooled.beta;
  fit.beta_k_only = k_fit.beta;
  fit.beta_v_only = v_fit.beta;
  if (o.per_kind_beta) {
    fit.beta_k = k_fit.beta;
    fit.beta_v = v_fit.beta;
    for (size_t u = 0; u < keys.size(); ++u) fit.units[keys[u]].alpha = k_fit.alpha[u];
    for (size_t u = 0; u < values.size(); ++u) fit.units[values[u]].alpha = v_fit.alpha[u];
    const double n = static_cast<double>(k_fit.points + v_fit.points);
    fit.rms_log_residual =
        std::sqrt((k_fit.rms_log_residual * k_fit.rms_log_residual * k_fit.points +
                   v_fit.rms_log_residual * v_fit.rms_log_residual * v_fit.points) /
                  n);
  } else {
    fit.beta_k = fit.beta_v = pooled.beta;
    for (size_t u = 0; u < all.size(); ++u) fit.units[u].alpha = pooled.alpha[u];
    fit.rms_log_residual = pooled.rms_log_residual;
  }
  return fit;
}

// ---- Profile ------------------------------------------------------------------------------

namespace {

constexpr double kMax = std::numeric_limits<double>::max();

// Typed reads from one TOML table; `path` is the table's dotted name for errors.
class TableReader {
 public:
  TableReader(const toml::table& t, std::string path) : t_(t), path_(std::move(path)) {}

  // Unknown keys are errors, like the daemon's config.
  Status CheckKeys(const std::set<std::string_view>& known) const {
    for (const auto& [key, node] : t_) {
      if (!known.count(key.str())) return InvalidArgument(path_, ".", key.str(), ": unknown key");
    }
    return OkStatus();
  }
  const toml::node* Find(std::string_view key) const { return t_.get(key); }
  Status Bad(std::string_view key, const toml::node& n, std::string_view expected) const {
    std::ostringstream got;
    if (n.is_string()) {
      got << '"' << n.as_string()->get() << '"';
    } else if (n.is_table() || n.is_array()) {
      got << (n.is_table() ? "a table" : "an array");
    } else {
      n.visit([&](const auto& v) { got << v; });
    }
    return InvalidArgument(path_, ".", key, ": got ", got.str(), ", expected ", expected);
  }

  // `key` as T within [lo, hi] (numbers), or `def` when absent; integers are read as doubles.
  template <typename T>
  StatusOr<T> Get(std::string_view key, std::optional<T> def, T lo = T(), T hi = T()) const {
    const toml::node* n = Find(key);
    if (!n && def) return *def;
    const std::string expected = Expected<T>(lo, hi);
    if (!n) return InvalidArgument(path_, ".", key, ": missing, expected ", expected);
    std::optional<T> v = Convert<T>(*n, lo, hi);
    if (!v) return Bad(key, *n, expected);
    return *v;
  }
  // An array of T within [lo, hi]; absent is an empty list.
  template <typename T>
  StatusOr<std::vector<T>> List(std::string_view key, T lo, T hi) const {
    std::vector<T> out;
    const toml::node* n = Find(key);
    if (!n) return out;
    const toml::array* a = n->as_array();
    if (!a) return Bad(key, *n, "an array of " + Expected<T>(lo, hi));
    for (size_t i = 0; i < a->size(); ++i) {
      std::optional<T> v = Convert<T>(*a->get(i), lo, hi);
      if (!v) return Bad(StrCat(key, "[", i, "]"), *a->get(i), Expected<T>(lo, hi));
      out.push_back(*v);
    }
    return out;
  }

 private:
  template <typename T>
  static std::optional<T> Convert(const toml::node& n, T lo, T hi) {
    if constexpr (std::is_same_v<T, double>) {
      std::optional<double> v = n.is_number() ? n.value<double>() : std::nullopt;
      return v && std::isfinite(*v) && *v >= lo && *v <= hi ? v : std::nullopt;
    } else if constexpr (std::is_same_v<T, int64_t>) {
      std::optional<int64_t> v = n.value_exact<int64_t>();
      return v && *v >= lo && *v <= hi ? v : std::nullopt;
    } else {
      return n.value_exact<T>();
    }
  }
  template <typename T>
  static std::string Expected(T lo, T hi) {
    if constexpr (std::is_same_v<T, double>) return StrCat("a finite number >= ", lo);
    if constexpr (std::is_same_v<T, int64_t>) return StrCat("an integer in ", lo, "..", hi);
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    return "a string";
  }

  const toml::table& t_;
  std::string path_;
};

StatusOr<RateQuantFit> ParseProfileRoot(const toml::table& root) {
  for (const auto& [key, node] : root) {
    if (key.str() != "ratequant") return InvalidArgument(key.str(), ": unknown key");
  }
  const toml::table* rt = root.get_as<toml::table>("ratequant");
  if (!rt) return InvalidArgument("ratequant: missing, expected a [ratequant] table");
  const TableReader r(*rt, "ratequant");
  KVCTL_RETURN_IF_ERROR(r.CheckKeys({"version",          "method",
                                     "head_dim",         "block_tokens",
                                     "k_group_tokens",   "v_group_channels",
                                     "sinkhorn_iters",   "layers",
                                     "kv_heads",         "bits",
                                     "target",           "importance",
                                     "per_kind_beta",    "beta",
                                     "beta_k",           "beta_v",
                                     "beta_k_only",      "beta_v_only",
                                     "rms_log_residual", "sequences",
                                     "tokens",           "units"}));
  KVCTL_ASSIGN_OR_RETURN(int64_t version, r.Get<int64_t>("version", std::nullopt, 1, 1));
  (void)version;
  RateQuantFit fit;
  KVCTL_ASSIGN_OR_RETURN(std::string method_name, r.Get<std::string>("method", std::nullopt));
  StatusOr<QuantMethod> method = ParseQuantMethod(method_name);
  if (!method.ok()) return Prefixed("ratequant.method: ", method.status());
  KVCTL_ASSIGN_OR_RETURN(int64_t head_dim, r.Get<int64_t>("head_dim", std::nullopt, 8, 1024));
  KVCTL_ASSIGN_OR_RETURN(std::vector<int64_t> bits, r.List<int64_t>("bits", 1, 16));
  if (bits.empty()) return InvalidArgument("ratequant.bits: missing or empty, expected widths");
  fit.bits.assign(bits.begin(), bits.end());
  StatusOr<QuantSpec> spec =
      MakeQuantSpec(*method, static_cast<int>(head_dim), fit.bits[0], fit.bits[0]);
  if (!spec.ok()) return Prefixed("ratequant: ", spec.status());
  fit.spec = *spec;
  for (const auto& [key, field] : {std::pair{"block_tokens", &fit.spec.block_tokens},
                                   std::pair{"k_group_tokens", &fit.spec.k_group_tokens},
                                   std::pair{"v_group_channels", &fit.spec.v_group_channels},
                                   std::pair{"sinkhorn_iters", &fit.spec.sinkhorn_iters}}) {
    KVCTL_ASSIGN_OR_RETURN(int64_t v, r.Get<int64_t>(key, *field, 0, 1 << 20));
    *field = static_cast<int>(v);
  }
  KVCTL_ASSIGN_OR_RETURN(int64_t layers, r.Get<int64_t>("layers", std::nullopt, 1, 4096));
  KVCTL_ASSIGN_OR_RETURN(int64_t kv_heads, r.Get<int64_t>("kv_heads", std::nullopt, 1, 1024));
  fit.layers = static_cast<int>(layers);
  fit.kv_heads = static_cast<int>(kv_heads);
  KVCTL_ASSIGN_OR_RETURN(std::string target, r.Get<std::string>("target", "mse"));
  if (target != "mse" && target != "attention") {
    return r.Bad("target", *r.Find("target"), "\"mse\" or \"attention\"");
  }
  fit.target = target == "mse" ? DistortionTarget::kMse : DistortionTarget::kAttention;
  KVCTL_ASSIGN_OR_RETURN(std::string importance, r.Get<std::string>("importance", "uniform"));
  if (importance != "uniform" && importance != "attention") {
    return r.Bad("importance", *r.Find("importance"), "\"uniform\" or \"attention\"");
  }
  fit.importance = importance == "uniform" ? ImportanceMode::kUniform : ImportanceMode::kAttention;
  KVCTL_ASSIGN_OR_RETURN(fit.per_kind_beta, r.Get<bool>("per_kind_beta", false));
  KVCTL_ASSIGN_OR_RETURN(fit.beta_k, r.Get<double>("beta_k", std::nullopt, 0, kMax));
  KVCTL_ASSIGN_OR_RETURN(fit.beta_v, r.Get<double>("beta_v", std::nullopt, 0, kMax));
  KVCTL_ASSIGN_OR_RETURN(fit.beta, r.Get<double>("beta", 0.0, 0, kMax));
  KVCTL_ASSIGN_OR_RETURN(fit.beta_k_only, r.Get<double>("beta_k_only", 0.0, 0, kMax));
  KVCTL_ASSIGN_OR_RETURN(fit.beta_v_only, r.Get<double>("beta_v_only", 0.0, 0, kMax));
  KVCTL_ASSIGN_OR_RETURN(fit.rms_log_residual, r.Get<double>("rms_log_residual", 0.0, 0, kMax));
  KVCTL_ASSIGN_OR_RETURN(fit.sequences, r.Get<int64_t>("sequences", 0, 0, INT64_MAX));
  KVCTL_ASSIGN_OR_RETURN(fit.tokens, r.Get<int64_t>("tokens", 0, 0, INT64_MAX));

  const toml::node* units = r.Find("units");
  const toml::array* ua = units ? units->as_array() : nullptr;
  if (!ua || !ua->is_array_of_tables()) {
    return InvalidArgument("ratequant.units: ", units ? "not" : "missing",
                           ", expected [[ratequant.units]] tables");
  }
  for (size_t i = 0; i < ua->size(); ++i) {
    const TableReader u(*ua->get(i)->as_table(), StrCat("ratequant.units[", i, "]"));
    KVCTL_RETURN_IF_ERROR(
        u.CheckKeys({"layer", "head", "kind", "alpha", "importance", "mse", "attention"}));
    RateQuantUnit unit;
    KVCTL_ASSIGN_OR_RETURN(int64_t layer, u.Get<int64_t>("layer", std::nullopt, 0, 4095));
    KVCTL_ASSIGN_OR_RETURN(int64_t head, u.Get<int64_t>("head", std::nullopt, 0, 1023));
    unit.layer = static_cast<int>(layer);
    unit.head = static_cast<int>(head);
    KVCTL_ASSIGN_OR_RETURN(std::string kind, u.Get<std::string>("kind", std::nullopt));
    if (kind != "k" && kind != "v") return u.Bad("kind", *u.Find("kind"), "\"k\" or \"v\"");
    unit.kind = kind == "k" ? UnitKind::kKey : UnitKind::kValue;
    KVCTL_ASSIGN_OR_RETURN(unit.alpha, u.Get<double>("alpha", std::nullopt, 0, kMax));
    KVCTL_ASSIGN_OR_RETURN(unit.importance, u.Get<double>("importance", 1.0, 0, kMax));
    KVCTL_ASSIGN_OR_RETURN(unit.mse, u.List<double>("mse", 0, kMax));
    KVCTL_ASSIGN_OR_RETURN(unit.attention, u.List<double>("attention", 0, kMax));
    fit.units.push_back(std::move(unit));
  }
  Status st = ValidateRateQuantFit(fit);
  if (!st.ok()) return Prefixed("ratequant.", st);
  return fit;
}

}  // namespace

std::string FormatRateQuantProfile(const RateQuantFit& fit) {
  std::ostringstream out;
  const QuantSpec& s = fit.spec;
  out << "# kvctl RateQuant profile (policies/ratequant_fit.h): D(b) = alpha * beta^-b per\n"
      << "# (layer, KV head, k|v) unit, fitted by running the quantizer at each width.\n"
      << "[ratequant]\nversion = 1\n"
      << "method = \"" << QuantMethodName(s.method) << "\"\n"
      << "head_dim = " << s.head_dim << "\nblock_tokens = " << s.block_tokens
      << "\nk_group_tokens = " << s.k_group_tokens << "\nv_group_channels = " << s.v_group_channels
      << "\nsinkhorn_iters = " << s.sinkhorn_iters << "\nlayers = " << fit.layers
      << "\nkv_heads = " << fit.kv_heads << "\nbits = [";
  for (size_t j = 0; j < fit.bits.size(); ++j) out << (j ? ", " : "") << fit.bits[j];
  out << "]\ntarget = \"" << DistortionTargetName(fit.target) << "\"\nimportance = \""
      << ImportanceModeName(fit.importance)
      << "\"\nper_kind_beta = " << (fit.per_kind_beta ? "true" : "false")
      << "\nbeta = " << TomlDouble(fit.beta) << "\nbeta_k = " << TomlDouble(fit.beta_k)
      << "\nbeta_v = " << TomlDouble(fit.beta_v)
      << "\nbeta_k_only = " << TomlDouble(fit.beta_k_only)
      << "\nbeta_v_only = " << TomlDouble(fit.beta_v_only)
      << "\nrms_log_residual = " << TomlDouble(fit.rms_log_residual)
      << "\nsequences = " << fit.sequences << "\ntokens = " << fit.tokens << "\n";
  for (const RateQuantUnit& u : fit.units) {
    out << "\n[[ratequant.units]]\nlayer = " << u.layer << "\nhead = " << u.head << "\nkind = \""
        << UnitKindName(u.kind) << "\"\nalpha = " << TomlDouble(u.alpha)
        << "\nimportance = " << TomlDouble(u.importance) << "\n";
    if (!u.mse.empty()) out << "mse = " << TomlList(u.mse) << "\n";
    if (!u.attention.empty()) out << "attention = " << TomlList(u.attention) << "\n";
  }
  return out.str();
}

StatusOr<RateQuantFit> ParseRateQuantProfile(std::string_view text, std::string_view name) {
  KVCTL_ASSIGN_OR_RETURN(toml::table root, ParseTomlText(text, name));
  StatusOr<RateQuantFit> fit = ParseProfileRoot(root);
  if (!fit.ok()) return Prefixed(StrCat(name, ": "), fit.status());
  return fit;
}

StatusOr<RateQuantFit> ReadRateQuantProfile(const std::string& path) {
  KVCTL_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "the RateQuant profile"));
  return ParseRateQuantProfile(text, path);
}

}  // namespace kvctl
