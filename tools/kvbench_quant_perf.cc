// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvbench quant: one-thread throughput (quantize, dequantize, scalar reference, memcpy) and the
// driver that runs every selected row.
#include <time.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/half.h"
#include "common/tensor.h"
#include "kernels/quantize.h"
#include "tools/kvbench_command.h"
#include "tools/kvbench_quant.h"

namespace kvctl {
namespace {

using QuantizeFn = Status (*)(const QuantSpec&, const BlockInput&, uint8_t*);
using QuantizeBatchFn = Status (*)(const QuantSpec&, const BlockBatch&, uint8_t*);

// A quantizer as both loops call it: block by block over the [T, H, D] tensor, one batch per head
// over head rows (as the daemon's flush does).
struct QuantizePath {
  QuantizeFn block;
  QuantizeBatchFn batch;
};

// The scalar reference has no batch entry point of its own (nothing in the daemon runs it).
Status QuantizeBlocksRef(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records) {
  const size_t record_bytes = BlockLayoutOf(spec).record_bytes;
  for (int b = 0; b < batch.n_blocks; ++b) {
    KVCTL_RETURN_IF_ERROR(
        QuantizeBlockRef(spec, BatchBlock(spec, batch, b), records + b * record_bytes));
  }
  return OkStatus();
}
using DequantizeFn = void (*)(const QuantSpec&, const uint8_t*, const float*, float*, float*);

// CPU time of the calling thread: on a shared machine a wall clock also counts the time the
// thread waits for a core, which swamped every figure here (docs/kvbench_quant.md); CPU time
// does not, for the quantizers and memcpy alike (it still counts cache and memory contention).
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Runs `run` once to warm caches, page in buffers and settle the clock, then `reps` timed times;
// returns the median thread CPU time in seconds.
template <typename Fn>
double MedianSeconds(int reps, Fn&& run) {
  run();
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    const double start = ThreadCpuSeconds();
    run();
    seconds.push_back(ThreadCpuSeconds() - start);
  }
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  return n % 2 == 1 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
}

// Where the quantizer's input rows lie. kHeadRows is what the daemon hands the quantizer
// (KvSequence::EncodeNewRecords: each head's flushed rows contiguous, row_stride = head_dim, one
// QuantizeBlocks batch per head); kTokenRows is the engine's [T, H, D] tensor read in place
// (row_stride = H * D: a block's rows of one head lie H * D elements apart).
enum class InputRows { kHeadRows, kTokenRows };

// The pure-mode workload: every full block of every head. OScaR's token norms are part of the
// quantize work, so they are computed inside the timed loop (over all tokens first, as the daemon
// does before its per-head batches).
class Workload {
 public:
  Workload(const QuantBenchContext& ctx, const QuantSpec& spec, QuantInputForm form)
      : in_(ctx.input),
        spec_(spec),
        f16_(form == QuantInputForm::kF16),
        layout_(BlockLayoutOf(spec)),
        needs_norms_(TraitsOf(spec.method).needs_token_norms),
        g_(spec.block_tokens),
        blocks_(in_.tokens / g_),
        records_(static_cast<size_t>(blocks_ * in_.heads) * layout_.record_bytes),
        norms_(static_cast<size_t>(blocks_ * g_), 1.0f),
        k_heads_(static_cast<size_t>(blocks_ * g_ * in_.heads * in_.head_dim)),
        v_heads_(k_heads_.size()),
        k_out_(k_heads_.size()),
        v_out_(k_heads_.size()) {
    // The head-major copy the daemon's flush path quantizes from (not timed).
    const int64_t h_kv = in_.heads, d = in_.head_dim, tq = tokens();
    for (int64_t h = 0; h < h_kv; ++h) {
      for (int64_t t = 0; t < tq; ++t) {
        std::memcpy(&k_heads_[(h * tq + t) * d], &in_.k[(t * h_kv + h) * d], sizeof(float) * d);
        std::memcpy(&v_heads_[(h * tq + t) * d], &in_.v[(t * h_kv + h) * d], sizeof(float) * d);
      }
    }
    if (f16_) {  // The same rows as fp16 (and the [T, H, D] tensor), the engines' own form.
      k_heads16_ = ToHalves(k_heads_);
      v_heads16_ = ToHalves(v_heads_);
      k_tokens16_ = ToHalves(in_.k);
      v_tokens16_ = ToHalves(in_.v);
    }
  }

  int64_t tokens() const { return blocks_ * g_; }

  Status Quantize(const QuantizePath& path, InputRows rows) {
    return rows == InputRows::kHeadRows ? QuantizeHeadRows(path.batch)
                                        : QuantizeTokenRows(path.block);
  }

  void Dequantize(DequantizeFn fn) {
    const int64_t rows = g_ * in_.head_dim;
    for (int64_t h = 0; h < in_.heads; ++h) {
      for (int64_t b = 0; b < blocks_; ++b) {
        const float* norms = needs_norms_ ? &norms_[b * g_] : nullptr;
        const int64_t r = h * blocks_ + b;
        fn(spec_, Record(b, h), norms, &k_out_[r * rows], &v_out_[r * rows]);
      }
    }
  }

 private:
  // One batch per head over its contiguous rows, as KvSequence::EncodeNewRecords hands them over.
  Status QuantizeHeadRows(QuantizeBatchFn fn) {
    const int64_t h_kv = in_.heads, d = in_.head_dim, tq = tokens();
    if (needs_norms_) {
      KvTensorView view{f16_ ? static_cast<const void*>(k_heads16_.data()) : k_heads_.data(),
                        f16_ ? DType::kF16 : DType::kF32,
                        tq,
                        h_kv,
                        d,
                        d,
                        tq * d};
      ComputeTokenNorms(view, norms_.data());
    }
    for (int64_t h = 0; h < h_kv; ++h) {
      const BlockInput rows = Input(k_heads_, v_heads_, k_heads16_, v_heads16_, h * tq * d, d,
                                    needs_norms_ ? norms_.data() : nullptr);
      const BlockBatch batch{.k = rows.k,
                             .v = rows.v,
                             .row_stride = d,
                             .block_stride = g_ * d,
                             .token_norms = rows.token_norms,
                             .n_blocks = static_cast<int>(blocks_),
                             .k_f16 = rows.k_f16,
                             .v_f16 = rows.v_f16};
      KVCTL_RETURN_IF_ERROR(fn(spec_, batch, Record(0, h)));
    }
    return OkStatus();
  }

  // Block-major over the [T, H, D] tensor in place, every head of a block before the next block.
  Status QuantizeTokenRows(QuantizeFn fn) {
    const int64_t h_kv = in_.heads, d = in_.head_dim;
    const KvTensorView k_view =
        KvTensorView::Contiguous(f16_ ? static_cast<const void*>(k_tokens16_.data()) : in_.k.data(),
                                 f16_ ? DType::kF16 : DType::kF32, in_.tokens, h_kv, d);
    for (int64_t b = 0; b < blocks_; ++b) {
      const int64_t s = b * g_;
      const float* norms = nullptr;
      if (needs_norms_) {
        ComputeTokenNorms(k_view.Tokens(s, g_), &norms_[s]);
        norms = &norms_[s];
      }
      for (int64_t h = 0; h < h_kv; ++h) {
        const BlockInput block =
            Input(in_.k, in_.v, k_tokens16_, v_tokens16_, (s * h_kv + h) * d, h_kv * d, norms);
        KVCTL_RETURN_IF_ERROR(fn(spec_, block, Record(b, h)));
      }
    }
    return OkStatus();
  }

  static std::vector<uint16_t> ToHalves(const std::vector<float>& x) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = FloatToHalf(x[i]);
    return h;
  }

  // Rows from element `first` on, fp32 or fp16 as the workload's form says.
  BlockInput Input(const std::vector<float>& k, const std::vector<float>& v,
                   const std::vector<uint16_t>& k16, const std::vector<uint16_t>& v16,
                   int64_t first, int64_t stride, const float* norms) const {
    if (f16_) return {nullptr, nullptr, stride, norms, k16.data() + first, v16.data() + first};
    return {k.data() + first, v.data() + first, stride, norms};
  }

  // Records of one head back to back, as the daemon keeps them.
  uint8_t* Record(int64_t b, int64_t h) {
    return &records_[static_cast<size_t>(h * blocks_ + b) * layout_.record_bytes];
  }

  const QuantBenchInput& in_;
  const QuantSpec spec_;
  const bool f16_;
  const BlockLayout layout_;
  const bool needs_norms_;
  const int64_t g_, blocks_;
  std::vector<uint8_t> records_;
  std::vector<float> norms_, k_heads_, v_heads_, k_out_, v_out_;
  std::vector<uint16_t> k_heads16_, v_heads16_, k_tokens16_, v_tokens16_;  // fp16 form only.
};

StatusOr<double> QuantizeGbps(Workload& w, const QuantizePath& path, InputRows rows, double bytes,
                              int reps) {
  Status status;
  const double s = MedianSeconds(reps, [&] {
    Status st = w.Quantize(path, rows);
    if (status.ok() && !st.ok()) status = std::move(st);
  });
  KVCTL_RETURN_IF_ERROR(status);
  return bytes / s / 1e9;
}

double DequantizeGbps(Workload& w, DequantizeFn fn, double bytes, int reps) {
  return bytes / MedianSeconds(reps, [&] { w.Dequantize(fn); }) / 1e9;
}

// Every KVarN row once per value of `iters` (in that order, where the row stood); other rows as
// they are. INVALID_ARGUMENT for a value outside 1..64.
StatusOr<std::vector<QuantRowSpec>> WithSinkhornIters(const std::vector<QuantRowSpec>& rows,
                                                      const std::vector<int>& iters) {
  for (int it : iters) {
    if (it < 1 || it > 64) {
      return InvalidArgument("--sinkhorn-iters: got ", it, ", expected 1..64");
    }
  }
  std::vector<QuantRowSpec> out;
  for (const QuantRowSpec& row : rows) {
    if (row.method != QuantMethod::kKvarn) {
      out.push_back(row);
      continue;
    }
    for (int it : iters) {
      out.push_back(row);
      out.back().sinkhorn_iters = it;
    }
  }
  return out;
}

}  // namespace

StatusOr<QuantThroughput> MeasureQuantThroughput(const QuantBenchContext& ctx,
                                                 const QuantSpec& spec, int reps,
                                                 QuantInputForm form) {
  Workload w(ctx, spec, form);
  QuantThroughput p;
  p.tokens = w.tokens();
  p.bytes = 2.0 * static_cast<double>(p.tokens) * ctx.input.heads * ctx.input.head_dim * 2;
  if (p.tokens == 0) {
    return InvalidArgument("tokens: got ", ctx.input.tokens, ", expected at least block_tokens ",
                           spec.block_tokens);
  }
  const QuantizePath simd{&QuantizeBlock, &QuantizeBlocks};
  const QuantizePath ref{&QuantizeBlockRef, &QuantizeBlocksRef};
  KVCTL_ASSIGN_OR_RETURN(p.token_rows_quantize_gbps,
                         QuantizeGbps(w, simd, InputRows::kTokenRows, p.bytes, reps));
  KVCTL_ASSIGN_OR_RETURN(p.quantize_gbps,
                         QuantizeGbps(w, simd, InputRows::kHeadRows, p.bytes, reps));
  p.dequantize_gbps = DequantizeGbps(w, &DequantizeBlock, p.bytes, reps);
  KVCTL_ASSIGN_OR_RETURN(p.ref_quantize_gbps,
                         QuantizeGbps(w, ref, InputRows::kHeadRows, p.bytes, reps));
  p.ref_dequantize_gbps = DequantizeGbps(w, &DequantizeBlockRef, p.bytes, reps);
  return p;
}

double MeasureReadGbps(const QuantBenchContext& ctx, QuantInputForm form, int reps) {
  const std::vector<float>& k = ctx.input.k;
  const std::vector<float>& v = ctx.input.v;
  std::vector<uint16_t> k16, v16;
  if (form == QuantInputForm::kF16) {
    k16.resize(k.size());
    v16.resize(v.size());
    for (size_t i = 0; i < k.size(); ++i) k16[i] = FloatToHalf(k[i]);
    for (size_t i = 0; i < v.size(); ++i) v16[i] = FloatToHalf(v[i]);
  }
  const size_t elem = form == QuantInputForm::kF16 ? 2 : 4;
  // OR of every 16-byte piece into four independent accumulators: one vector OR per load at the
  // baseline ISA, so the loop is bound by the loads, not by arithmetic.
  typedef uint64_t V2 __attribute__((vector_size(16)));
  auto read = [elem](const void* x, size_t n) {
    V2 acc[4] = {};
    const auto* bytes = static_cast<const char*>(x);
    const size_t pieces = n * elem / sizeof(V2) / 4 * 4;
    for (size_t i = 0; i < pieces; i += 4) {
      for (int j = 0; j < 4; ++j) {
        V2 piece;
        std::memcpy(&piece, bytes + (i + j) * sizeof(V2), sizeof(V2));
        acc[j] |= piece;
      }
    }
    const V2 all = (acc[0] | acc[1]) | (acc[2] | acc[3]);
    return all[0] | all[1];
  };
  volatile uint64_t sink = 0;
  const double s = MedianSeconds(std::max(reps, 25), [&] {
    if (elem == 2) {
      sink = sink | read(k16.data(), k16.size()) | read(v16.data(), v16.size());
    } else {
      sink = sink | read(k.data(), k.size()) | read(v.data(), v.size());
    }
  });
  // fp16 bytes of the same elements, the unit of every GB/s figure here.
  return static_cast<double>(k.size() + v.size()) * 2 / s / 1e9;
}

double MeasureMemcpyGbps(size_t bytes, int reps) {
  std::vector<uint8_t> src(bytes), dst(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 131u + 7u);
  std::memset(dst.data(), 0, bytes);
  // A copy is far cheaper than a quantize call of the same data, so more repetitions than the
  // quantizers get cost little and steady the median (docs/kvbench_quant.md).
  const double s =
      MedianSeconds(std::max(reps, 25), [&] { std::memcpy(dst.data(), src.data(), bytes); });
  // Reading the copy keeps the compiler from treating the memcpy as dead.
  volatile uint8_t sink = dst[bytes / 2];
  (void)sink;
  return static_cast<double>(bytes) / s / 1e9;
}

double QuantizeTarget(const QuantSpec& spec) {
  switch (spec.method) {
    case QuantMethod::kKivi:
    case QuantMethod::kQuaRot:
    case QuantMethod::kOscar:
      return 0.5;
    case QuantMethod::kKvarn:
      return spec.sinkhorn_iters == TraitsOf(QuantMethod::kKvarn).defaults.sinkhorn_iters ? 0.1
                                                                                          : 0.0;
    default:
      return 0.0;
  }
}

StatusOr<QuantBenchReport> RunQuantBench(const QuantBenchOptions& o) {
  if (o.reps < 1 || o.reps > 1000) {
    return InvalidArgument("--reps: got ", o.reps, ", expected 1..1000");
  }
  if (o.input_form != "fp32" && o.input_form != "fp16") {
    return InvalidArgument("--input-form: got \"", o.input_form, "\", expected fp32 or fp16");
  }
  const QuantInputForm form = o.input_form == "fp16" ? QuantInputForm::kF16 : QuantInputForm::kF32;
  KVCTL_RETURN_IF_ERROR(ApplySimdFlag(o.simd));
  KVCTL_ASSIGN_OR_RETURN(std::vector<QuantRowSpec> rows, SelectQuantRows(o.methods, o.bits));
  if (!o.sinkhorn_iters.empty()) {
    KVCTL_ASSIGN_OR_RETURN(rows, WithSinkhornIters(rows, o.sinkhorn_iters));
  }
  QuantBenchInput input;
  if (o.input_dir.empty()) {
    KVCTL_ASSIGN_OR_RETURN(input, MakeSyntheticInput(o.synthetic));
  } else {
    KVCTL_ASSIGN_OR_RETURN(input, LoadQuantBenchInput(o.input_dir, o.synthetic.seed));
  }
  // Reject rows that cannot run on this input before spending minutes on the others.
  for (const QuantRowSpec& row : rows) {
    StatusOr<QuantSpec> spec = MakeQuantSpec(row.method, input.head_dim, row.k_bits, row.v_bits);
    if (!spec.ok()) {
      return InvalidArgument(QuantRowLabel(row), ": ", spec.status().message(),
                             " (drop it with --methods/--bits)");
    }
    if (input.tokens < spec->block_tokens) {
      return InvalidArgument(QuantRowLabel(row), ": tokens: got ", input.tokens,
                             ", expected at least block_tokens ", spec->block_tokens);
    }
  }
  KVCTL_ASSIGN_OR_RETURN(QuantBenchContext ctx,
                         PrepareQuantBench(std::move(input), o.attn_queries));

  QuantBenchReport report;
  report.detected_simd = std::string(SimdLevelName(DetectSimdLevel()));
  report.active_simd = std::string(SimdLevelName(ActiveSimdLevel()));
  const QuantBenchInput& in = ctx.input;
  report.input.source = in.source;
  report.input.description = in.description;
  report.input.queries = in.queries;
  report.input.tokens = in.tokens;
  report.input.heads = in.heads;
  report.input.q_heads = in.q_heads;
  report.input.head_dim = in.head_dim;
  report.input.seed = in.seed;
  report.attn_queries = o.attn_queries;
  report.reps = o.reps;
  report.throughput = o.throughput;
  report.quick = o.quick;
  report.input_form = o.input_form;
  report.memcpy_bytes = 2.0 * static_cast<double>(in.tokens) * in.heads * in.head_dim * 2;
  if (o.throughput) {
    report.memcpy_gbps = MeasureMemcpyGbps(static_cast<size_t>(report.memcpy_bytes), o.reps);
    report.read_gbps = MeasureReadGbps(ctx, form, o.reps);
  }
  for (const QuantRowSpec& row : rows) {
    QuantBenchRow r;
    KVCTL_ASSIGN_OR_RETURN(r.accuracy, ComputeQuantRow(ctx, row));
    r.target = QuantizeTarget(r.accuracy.spec);
    if (o.throughput) {
      KVCTL_ASSIGN_OR_RETURN(r.perf, MeasureQuantThroughput(ctx, r.accuracy.spec, o.reps, form));
    }
    report.rows.push_back(std::move(r));
  }
  return report;
}

}  // namespace kvctl
