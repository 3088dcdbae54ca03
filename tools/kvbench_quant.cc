// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvbench quant: inputs, row selection and the accuracy half (pure and streaming modes).
#include "tools/kvbench_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>

#include "common/half.h"
#include "common/tensor.h"
#include "kernels/quantize.h"
#include "tools/npy.h"

namespace kvctl {
namespace {

constexpr int64_t kMaxTokens = int64_t{1} << 22;
constexpr int kMaxHeads = 1024;

Status CheckHeadDim(int64_t d, std::string_view what) {
  if (d < 8 || d > 1024 || d % 8 != 0) {
    return InvalidArgument(what, ": got ", d, ", expected a multiple of 8 in 8..1024");
  }
  return OkStatus();
}

// Where each token of a query's causal window comes from: tokens in [lo, hi) read the quantized
// reconstruction, the others the fp16-rounded originals (sinks, tail, leftover).
struct CacheSources {
  const float* k_q;
  const float* v_q;
  const float* k_h;
  const float* v_h;
};
struct QuantRange {
  int64_t lo = 0, hi = 0;
};

float Dot(const float* a, const float* b, int64_t n) {
  // Eight independent sums vectorize without -ffast-math; head_dim is a multiple of 8.
  float acc[8] = {};
  for (int64_t i = 0; i < n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Causal softmax(q k^T / sqrt(D)) V for every probe query and query head; query head qh reads KV
// head qh / (Hq / H). `range(t)` says which tokens of position t's window are quantized.
template <typename RangeFn>
void ProbeAttention(const QuantBenchContext& ctx, const CacheSources& src, RangeFn range,
                    std::vector<float>* out) {
  const QuantBenchInput& in = ctx.input;
  const int64_t h_kv = in.heads, h_q = in.q_heads, d = in.head_dim;
  const int64_t group = h_q / h_kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> scores(static_cast<size_t>(in.tokens));
  std::vector<double> acc(static_cast<size_t>(d));
  out->assign(ctx.probe_positions.size() * h_q * d, 0.0f);
  for (size_t i = 0; i < ctx.probe_positions.size(); ++i) {
    const int64_t t = ctx.probe_positions[i];
    const QuantRange r = range(t);
    for (int64_t qh = 0; qh < h_q; ++qh) {
      const int64_t h = qh / group;
      const float* q = &ctx.probe_q[(i * h_q + qh) * d];
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= t; ++j) {
        const float* k = (j >= r.lo && j < r.hi ? src.k_q : src.k_h) + (j * h_kv + h) * d;
        scores[j] = Dot(q, k, d) * scale;
        max_score = std::max(max_score, scores[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        const double p = std::exp(scores[j] - max_score);
        sum += p;
        const float* v = (j >= r.lo && j < r.hi ? src.v_q : src.v_h) + (j * h_kv + h) * d;
        for (int64_t c = 0; c < d; ++c) acc[c] += p * v[c];
      }
      float* o = &(*out)[(i * h_q + qh) * d];
      for (int64_t c = 0; c < d; ++c) o[c] = static_cast<float>(acc[c] / sum);
    }
  }
}

double RelativeError(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = static_cast<double>(ref[i]) - got[i];
    num += e * e;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

// ||x - y||^2 / ||x||^2 over tokens [first, first + count) of [T, H, D] tensors.
double RelativeMse(const std::vector<float>& x, const std::vector<float>& y, int64_t first,
                   int64_t count, int64_t row_elems) {
  double num = 0, den = 0;
  for (int64_t i = first * row_elems; i < (first + count) * row_elems; ++i) {
    const double e = static_cast<double>(x[i]) - y[i];
    num += e * e;
    den += static_cast<double>(x[i]) * x[i];
  }
  return den > 0 ? num / den : 0.0;
}

// Quantizes n_blocks blocks of every head, the first starting at token `first`, and writes the
// dequantized rows into k_out / v_out ([T, H, D]; other tokens untouched). Returns the bytes the
// quantizer produced: records plus the OScaR side record. Every record is written into a buffer
// with a guard zone behind record_bytes, so a record longer than the registry says is caught.
StatusOr<int64_t> RoundTrip(const QuantBenchContext& ctx, const QuantSpec& spec,
                            std::string_view label, int64_t first, int64_t n_blocks, float* k_out,
                            float* v_out) {
  constexpr size_t kGuard = 64;
  constexpr uint8_t kCanary = 0xA5;
  const QuantBenchInput& in = ctx.input;
  const int64_t h_kv = in.heads, d = in.head_dim, g = spec.block_tokens;
  const BlockLayout layout = BlockLayoutOf(spec);
  const bool needs_norms = TraitsOf(spec.method).needs_token_norms;
  std::vector<uint8_t> record(layout.record_bytes + kGuard);
  std::vector<float> k_block(static_cast<size_t>(g * d)), v_block(k_block.size());
  int64_t bytes = 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t s = first + b * g;
    const float* norms = needs_norms ? ctx.token_norms.data() + s : nullptr;
    for (int64_t h = 0; h < h_kv; ++h) {
      std::memset(record.data() + layout.record_bytes, kCanary, kGuard);
      const BlockInput block{in.k.data() + (s * h_kv + h) * d, in.v.data() + (s * h_kv + h) * d,
                             h_kv * d, norms};
      const Status st = QuantizeBlock(spec, block, record.data());
      if (!st.ok()) {
        return Status(st.code(), internal::StrCat(label, ": tokens ", s, "..", s + g - 1, ", head ",
                                                  h, ": ", st.message()));
      }
      for (size_t i = layout.record_bytes; i < record.size(); ++i) {
        if (record[i] != kCanary) {
          return Internal(label, ": QuantizeBlock wrote byte ", i, " past record_bytes ",
                          layout.record_bytes, " of the registry layout");
        }
      }
      bytes += static_cast<int64_t>(layout.record_bytes);
      DequantizeBlock(spec, record.data(), norms, k_block.data(), v_block.data());
      for (int64_t t = 0; t < g; ++t) {
        std::memcpy(k_out + ((s + t) * h_kv + h) * d, &k_block[t * d], d * sizeof(float));
        std::memcpy(v_out + ((s + t) * h_kv + h) * d, &v_block[t * d], d * sizeof(float));
      }
    }
    bytes += g * static_cast<int64_t>(layout.side_bytes_per_token);  // Once per layer.
  }
  return bytes;
}

Status CheckBits(std::string_view label, std::string_view what, double counted, double registry) {
  if (std::fabs(counted - registry) > 1e-9 * std::max(1.0, std::fabs(registry))) {
    return Internal(label, ": ", what, " bits/element from the bytes written is ", counted,
                    " but the registry says ", registry,
                    "; the layout and the accounting disagree");
  }
  return OkStatus();
}

}  // namespace

StatusOr<QuantBenchInput> MakeSyntheticInput(const SyntheticKvOptions& o) {
  if (o.tokens < 1 || o.tokens > kMaxTokens) {
    return InvalidArgument("--tokens: got ", o.tokens, ", expected 1..", kMaxTokens);
  }
  if (o.heads < 1 || o.heads > kMaxHeads) {
    return InvalidArgument("--heads: got ", o.heads, ", expected 1..", kMaxHeads);
  }
  KVCTL_RETURN_IF_ERROR(CheckHeadDim(o.head_dim, "--head-dim"));
  const int q_heads = o.q_heads > 0 ? o.q_heads : o.heads;
  if (o.q_heads < 0 || q_heads % o.heads != 0 || q_heads > kMaxHeads) {
    return InvalidArgument("--q-heads: got ", o.q_heads, ", expected 0 (same as --heads) or a ",
                           "multiple of --heads ", o.heads, " up to ", kMaxHeads);
  }
  if (o.tokens * q_heads * o.head_dim > kMaxBenchElements) {
    return InvalidArgument("--tokens x --q-heads x --head-dim: got ",
                           o.tokens * q_heads * o.head_dim, " elements, expected at most ",
                           kMaxBenchElements);
  }
  SyntheticKv kv = GenerateSyntheticKv(o);
  QuantBenchInput in;
  in.source = "synthetic";
  in.queries = "synthetic";
  in.tokens = kv.tokens;
  in.heads = kv.heads;
  in.q_heads = kv.q_heads;
  in.head_dim = kv.head_dim;
  in.seed = o.seed;
  in.k = std::move(kv.k);
  in.v = std::move(kv.v);
  in.q = std::move(kv.q);
  std::ostringstream desc;
  desc << "synthetic LLM-like K/V/Q (GenerateSyntheticKv, seed " << o.seed << "): T=" << in.tokens
       << ", H=" << in.heads << ", Hq=" << in.q_heads << ", D=" << in.head_dim;
  in.description = desc.str();
  return in;
}

StatusOr<QuantBenchInput> LoadQuantBenchInput(const std::string& dir, uint64_t seed) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound("--input: ", dir, ": no such directory");
  const std::string k_path = (fs::path(dir) / "k.npy").string();
  const std::string v_path = (fs::path(dir) / "v.npy").string();
  const std::string q_path = (fs::path(dir) / "q.npy").string();

  KVCTL_ASSIGN_OR_RETURN(NpyArray k, ReadNpy(k_path));
  if (k.shape.size() != 3 || k.shape[0] < 1 || k.shape[1] < 1) {
    return InvalidArgument(k_path, ": shape: got ", FormatNpyShape(k.shape),
                           ", expected (tokens, heads, head_dim) with tokens, heads >= 1");
  }
  const int64_t t = k.shape[0], h = k.shape[1], d = k.shape[2];
  KVCTL_RETURN_IF_ERROR(CheckHeadDim(d, k_path + ": head_dim"));
  if (t > kMaxTokens || h > kMaxHeads || k.ElementCount() > kMaxBenchElements) {
    return InvalidArgument(k_path, ": shape: got ", FormatNpyShape(k.shape), ", expected at most ",
                           kMaxTokens, " tokens, ", kMaxHeads, " heads and ", kMaxBenchElements,
                           " elements");
  }
  KVCTL_ASSIGN_OR_RETURN(NpyArray v, ReadNpy(v_path));
  KVCTL_RETURN_IF_ERROR(ExpectNpyShape(v, v_path, k.shape));

  QuantBenchInput in;
  in.source = dir;
  in.seed = seed;
  in.tokens = t;
  in.heads = static_cast<int>(h);
  in.head_dim = static_cast<int>(d);
  in.q_heads = in.heads;
  std::ostringstream desc;
  desc << "dir " << dir << ": k.npy " << NpyDescr(k.dtype) << " " << FormatNpyShape(k.shape)
       << ", v.npy " << NpyDescr(v.dtype);
  if (fs::exists(q_path, ec)) {
    KVCTL_ASSIGN_OR_RETURN(NpyArray q, ReadNpy(q_path));
    KVCTL_RETURN_IF_ERROR(ExpectNpyShape(q, q_path, {t, -1, d}));
    const int64_t hq = q.shape[1];
    if (hq < 1 || hq % h != 0 || hq > kMaxHeads || q.ElementCount() > kMaxBenchElements) {
      return InvalidArgument(q_path, ": shape: got ", FormatNpyShape(q.shape),
                             ", expected query heads a multiple of the ", h,
                             " KV heads of k.npy (GQA), at most ", kMaxHeads);
    }
    KVCTL_RETURN_IF_ERROR(
        KvTensorView::Contiguous(q.data.data(), DType::kF32, t, hq, d).CheckFinite(q_path));
    in.q_heads = static_cast<int>(hq);
    in.q = std::move(q.data);
    in.queries = "q.npy";
    desc << ", q.npy " << NpyDescr(q.dtype) << " " << FormatNpyShape(q.shape);
  } else {
    in.queries = "gaussian";
    desc << ", no q.npy (Gaussian queries, seed " << seed << ")";
  }
  KVCTL_RETURN_IF_ERROR(
      KvTensorView::Contiguous(k.data.data(), DType::kF32, t, h, d).CheckFinite(k_path));
  KVCTL_RETURN_IF_ERROR(
      KvTensorView::Contiguous(v.data.data(), DType::kF32, t, h, d).CheckFinite(v_path));
  in.k = std::move(k.data);
  in.v = std::move(v.data);
  in.description = desc.str();
  return in;
}

std::string QuantRowBits(const QuantRowSpec& row) {
  if (row.k_bits == row.v_bits) return std::to_string(row.k_bits);
  std::ostringstream out;  // Not operator+: GCC 12 warns falsely (-Wrestrict) on "k" + string.
  out << "k" << row.k_bits << "v" << row.v_bits;
  return out.str();
}

std::string QuantRowLabel(const QuantRowSpec& row) {
  if (row.method == QuantMethod::kFp16) return "fp16";
  std::string label = std::string(QuantMethodName(row.method)) + " " + QuantRowBits(row);
  if (row.sinkhorn_iters > 0) label += " it" + std::to_string(row.sinkhorn_iters);
  return label;
}

std::vector<QuantRowSpec> DefaultQuantRows() {
  using M = QuantMethod;
  return {{M::kFp16, 16, 16}, {M::kKivi, 2, 2},   {M::kKivi, 3, 3},   {M::kKivi, 4, 4},
          {M::kKivi, 8, 8},   {M::kQuaRot, 2, 2}, {M::kQuaRot, 3, 3}, {M::kQuaRot, 4, 4},
          {M::kKvarn, 2, 2},  {M::kKvarn, 3, 3},  {M::kKvarn, 4, 4},  {M::kKvarn, 4, 2},
          {M::kOscar, 2, 2},  {M::kOscar, 3, 3},  {M::kOscar, 4, 4},  {M::kTurbo, 2, 2},
          {M::kTurbo, 3, 3},  {M::kTurbo, 4, 4}};
}

StatusOr<std::vector<QuantRowSpec>> SelectQuantRows(const std::vector<std::string>& methods,
                                                    const std::vector<std::string>& bits) {
  const std::vector<QuantRowSpec> all = DefaultQuantRows();
  std::vector<QuantMethod> wanted;
  for (const std::string& m : methods) {
    StatusOr<QuantMethod> parsed = ParseQuantMethod(m);
    if (!parsed.ok()) return InvalidArgument("--methods: ", parsed.status().message());
    wanted.push_back(*parsed);
  }
  for (const std::string& b : bits) {
    const bool known = std::any_of(all.begin(), all.end(),
                                   [&](const QuantRowSpec& r) { return QuantRowBits(r) == b; });
    if (!known) {
      return InvalidArgument("--bits: got \"", b, "\", expected one of 2, 3, 4, 8, k4v2, 16");
    }
  }
  const auto listed = [](const auto& list, const auto& x) {
    return std::find(list.begin(), list.end(), x) != list.end();
  };
  // fp16 is the baseline: the bits filter does not apply to it, but it is no row of its own unless
  // asked for (--methods fp16 or --bits 16).
  const bool fp16_asked = listed(wanted, QuantMethod::kFp16) || listed(bits, std::string("16"));
  std::vector<QuantRowSpec> rows;
  bool any_quantizer = false;
  for (const QuantRowSpec& r : all) {
    const bool fp16 = r.method == QuantMethod::kFp16;
    const bool method_ok = wanted.empty() || listed(wanted, r.method);
    const bool bits_ok = bits.empty() || fp16 || listed(bits, QuantRowBits(r));
    if (!method_ok || !bits_ok) continue;
    rows.push_back(r);
    any_quantizer = any_quantizer || !fp16;
  }
  if (rows.empty() || (!any_quantizer && !fp16_asked)) {
    return InvalidArgument(
        "--methods/--bits: no quantizer row matches (rows: kivi 2/3/4/8, "
        "quarot 2/3/4, kvarn 2/3/4/k4v2, oscar 2/3/4, fp16)");
  }
  return rows;
}

StatusOr<QuantBenchContext> PrepareQuantBench(QuantBenchInput input, int attn_queries) {
  if (attn_queries < 1 || attn_queries > input.tokens) {
    return InvalidArgument("--attn-queries: got ", attn_queries, ", expected 1..tokens (",
                           input.tokens, ")");
  }
  QuantBenchContext ctx;
  ctx.input = std::move(input);
  const QuantBenchInput& in = ctx.input;
  const int64_t h_q = in.q_heads, d = in.head_dim;
  ctx.k_half.resize(in.k.size());
  ctx.v_half.resize(in.v.size());
  for (size_t i = 0; i < in.k.size(); ++i) ctx.k_half[i] = RoundToHalf(in.k[i]);
  for (size_t i = 0; i < in.v.size(); ++i) ctx.v_half[i] = RoundToHalf(in.v[i]);
  ctx.token_norms.resize(static_cast<size_t>(in.tokens));
  ComputeTokenNorms(KvTensorView::Contiguous(in.k.data(), DType::kF32, in.tokens, in.heads, d),
                    ctx.token_norms.data());

  std::mt19937_64 rng(in.seed ^ 0x9E3779B97F4A7C15ull);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t t = in.tokens - attn_queries; t < in.tokens; ++t) {
    ctx.probe_positions.push_back(t);
    for (int64_t i = 0; i < h_q * d; ++i) {
      ctx.probe_q.push_back(in.q.empty() ? normal(rng) : in.q[t * h_q * d + i]);
    }
  }
  const CacheSources exact{in.k.data(), in.v.data(), in.k.data(), in.v.data()};
  ProbeAttention(
      ctx, exact, [](int64_t) { return QuantRange{}; }, &ctx.probe_out);
  return ctx;
}

StatusOr<QuantRowAccuracy> ComputeQuantRow(const QuantBenchContext& ctx, const QuantRowSpec& row) {
  const QuantBenchInput& in = ctx.input;
  const std::string label = QuantRowLabel(row);
  StatusOr<QuantSpec> spec_or = MakeQuantSpec(row.method, in.head_dim, row.k_bits, row.v_bits);
  if (!spec_or.ok()) {
    return Status(spec_or.status().code(),
                  internal::StrCat(label, ": ", spec_or.status().message()));
  }
  QuantRowAccuracy acc;
  acc.row = row;
  acc.spec = *spec_or;
  if (row.sinkhorn_iters > 0) {
    acc.spec.sinkhorn_iters = row.sinkhorn_iters;
    const Status valid = ValidateQuantSpec(acc.spec);
    if (!valid.ok()) return Status(valid.code(), internal::StrCat(label, ": ", valid.message()));
  }
  acc.rules = TraitsOf(row.method).streaming;
  KVCTL_RETURN_IF_ERROR(ValidateStreamingRules(acc.spec, acc.rules));
  const QuantSpec& spec = acc.spec;
  const int64_t g = spec.block_tokens, t_all = in.tokens;
  const int64_t row_elems = static_cast<int64_t>(in.heads) * in.head_dim;
  const int64_t t_pure = t_all / g * g;
  if (t_pure == 0) {
    return InvalidArgument(label, ": tokens: got ", t_all, ", expected at least block_tokens ", g);
  }
  acc.registry_bpe = BitsPerElement(spec, in.heads);
  acc.registry_effective_bpe = EffectiveBitsPerElement(spec, acc.rules, in.heads, t_all);

  std::vector<float> k_rec = ctx.k_half, v_rec = ctx.v_half;
  const CacheSources src{k_rec.data(), v_rec.data(), ctx.k_half.data(), ctx.v_half.data()};
  std::vector<float> out;

  // Pure: every full block quantized from token 0, as if the whole sequence were prefilled.
  ModeAccuracy& pure = acc.pure;
  KVCTL_ASSIGN_OR_RETURN(pure.bytes,
                         RoundTrip(ctx, spec, label, 0, t_pure / g, k_rec.data(), v_rec.data()));
  pure.quantized_tokens = t_pure;
  pure.records = t_pure / g * in.heads;
  pure.bits_per_element =
      static_cast<double>(pure.bytes) * 8 / (2.0 * static_cast<double>(t_pure * row_elems));
  KVCTL_RETURN_IF_ERROR(CheckBits(label, "pure", pure.bits_per_element, acc.registry_bpe.average));
  pure.k_rel_mse = RelativeMse(in.k, k_rec, 0, t_pure, row_elems);
  pure.v_rel_mse = RelativeMse(in.v, v_rec, 0, t_pure, row_elems);
  ProbeAttention(
      ctx, src,
      [&](int64_t) {
        return QuantRange{0, t_pure};
      },
      &out);
  pure.attn_rel_err = RelativeError(ctx.probe_out, out);

  // Streaming: sinks stay fp16, the tail flushes every flush_tokens, the rest of the tail is fp16.
  ModeAccuracy& stream = acc.streaming;
  const int64_t sinks = std::min<int64_t>(acc.rules.sink_tokens, t_all);
  const int64_t t_stream = QuantizedTokenCount(spec, acc.rules, t_all);
  k_rec = ctx.k_half;
  v_rec = ctx.v_half;
  KVCTL_ASSIGN_OR_RETURN(
      const int64_t record_bytes,
      RoundTrip(ctx, spec, label, sinks, t_stream / g, k_rec.data(), v_rec.data()));
  stream.quantized_tokens = t_stream;
  stream.records = t_stream / g * in.heads;
  stream.bytes = record_bytes + (t_all - t_stream) * row_elems * 2 * 2;  // fp16 K and V.
  stream.bits_per_element =
      static_cast<double>(stream.bytes) * 8 / (2.0 * static_cast<double>(t_all * row_elems));
  KVCTL_RETURN_IF_ERROR(
      CheckBits(label, "streaming", stream.bits_per_element, acc.registry_effective_bpe));
  stream.k_rel_mse = RelativeMse(in.k, k_rec, 0, t_all, row_elems);
  stream.v_rel_mse = RelativeMse(in.v, v_rec, 0, t_all, row_elems);
  ProbeAttention(
      ctx, src,
      [&](int64_t t) {
        return QuantRange{sinks, sinks + QuantizedTokenCount(spec, acc.rules, t + 1)};
      },
      &out);
  stream.attn_rel_err = RelativeError(ctx.probe_out, out);
  return acc;
}

}  // namespace kvctl
