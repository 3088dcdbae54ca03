// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvbench_cuda.cu
// kvbench_cuda: the GPU measurements of tools/gpu_check.sh (docs/gpu.md), written as one JSON
// object. Three parts, all in one run on one device:
//   copy       cudaMemcpy device-to-device bandwidth (read + write bytes / time): the yardstick.
//   quantize   EnqueueQuantizeBlocksCuda on Llama-3-8B geometry (8 KV heads x D128), fp32 K/V in,
//              records out, per method at 2 bits; (input + output bytes) / time vs copy.
//   attention  CudaAttentionPlan (fused decode attention on records) at 8K/32K/128K tokens for
//              SmolLM2 (3 KV heads x D64, 9 q heads) and Llama-3-8B (8 x D128, 32 q heads), per
//              method at 2 bits plus fp16 records (a dense baseline through the same kernel).
// Timing: CUDA events around the enqueued work, warm-up first, median of repeats (at least 5,
// up to ~0.3 s per item). Data: GenerateSyntheticKv chunks of 4096 tokens quantized on the
// device, replicated to the full length (distinct memory, so no cache reuse beyond the L2's own).
// Without a CUDA device it prints "no CUDA device" to stderr and exits 2.
//
// Thread safety: a single-threaded program.
//
//   kvbench_cuda --json results/kvbench_cuda.json [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/half.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/quant_cuda.h"
#include "kernels/quantize.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

constexpr int64_t kChunkTokens = 4096;  // Synthetic tokens generated per head, then replicated.

struct Options {
  std::string json_path;
  bool quick = false;  // 8K only, fewer methods: a smoke run.
};

#define BENCH_CHECK_CUDA(expr)                                                         \
  do {                                                                                 \
    const cudaError_t e_ = (expr);                                                     \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "kvbench_cuda: %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                                            \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

void CheckStatus(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "kvbench_cuda: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Median time in microseconds of `fn` (which enqueues work on the default stream): two warm-up
// calls, then at least 5 timed calls and more while the total stays under ~0.3 s.
template <class Fn>
double MedianUs(Fn fn) {
  cudaEvent_t a, b;
  BENCH_CHECK_CUDA(cudaEventCreate(&a));
  BENCH_CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) fn();
  BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> us;
  double total = 0;
  while (us.size() < 5 || (total < 3e5 && us.size() < 200)) {
    BENCH_CHECK_CUDA(cudaEventRecord(a));
    fn();
    BENCH_CHECK_CUDA(cudaEventRecord(b));
    BENCH_CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1e3);
    total += ms * 1e3;
  }
  BENCH_CHECK_CUDA(cudaEventDestroy(a));
  BENCH_CHECK_CUDA(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

QuantSpec Spec(QuantMethod m, int d, int bits) {
  const int b = m == QuantMethod::kFp16 ? 16 : bits;
  StatusOr<QuantSpec> s = MakeQuantSpec(m, d, b, b);
  CheckStatus(s.status(), "MakeQuantSpec");
  return *s;
}

// Fills device rows [heads][rows][d] by repeating each head's kChunkTokens host rows (host layout
// [heads][kChunkTokens][d]) along the rows: the synthetic cache is generated once, then tiled.
template <typename T>
void UploadTiled(T* device, const T* host, int heads, size_t rows, int d) {
  const size_t chunk = static_cast<size_t>(kChunkTokens) * d;
  for (int h = 0; h < heads; ++h) {
    for (size_t r0 = 0; r0 < rows; r0 += kChunkTokens) {
      const size_t len = std::min<size_t>(kChunkTokens, rows - r0) * d;
      BENCH_CHECK_CUDA(cudaMemcpy(device + (h * rows + r0) * d, host + h * chunk, len * sizeof(T),
                                  cudaMemcpyHostToDevice));
    }
  }
}

// Device-to-device copy bandwidth, counting the bytes read and written.
double CopyGbps(size_t bytes, std::ostringstream& js) {
  DeviceBuffer<uint8_t> src, dst;
  BENCH_CHECK_CUDA(src.Allocate(bytes));
  BENCH_CHECK_CUDA(dst.Allocate(bytes));
  BENCH_CHECK_CUDA(cudaMemset(src.ptr, 1, bytes));
  const double us = MedianUs([&] {
    BENCH_CHECK_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice));
  });
  const double gbps = 2.0 * bytes / (us * 1e3);
  js << "\"copy\": {\"bytes\": " << bytes << ", \"us\": " << us << ", \"gbps_read_write\": " << gbps
     << "}";
  std::fprintf(stderr, "copy D2D %zu MiB: %.1f us, %.0f GB/s (read + write)\n", bytes >> 20, us,
               gbps);
  return gbps;
}

// [heads, tokens, D] fp32 K and V on the device: the synthetic chunk of each head repeated.
struct DeviceKv {
  int heads = 0, d = 0;
  int64_t tokens = 0;
  DeviceBuffer<float> k, v, norms;           // norms: [tokens], layer-wide (OScaR).
  std::vector<float> q;                      // [q_heads, D] of the last chunk token, host.
  std::vector<uint16_t> window_k, window_v;  // Host fp16 [heads][kChunkTokens][D] for windows.
  std::vector<uint16_t> bf16_k, bf16_v;      // The same rows in bf16 (the dense baseline).
};

void MakeDeviceKv(int heads, int q_heads, int d, int64_t tokens, DeviceKv* out) {
  const SyntheticKv kv = GenerateSyntheticKv(
      {.tokens = kChunkTokens, .heads = heads, .head_dim = d, .q_heads = q_heads, .seed = 1});
  std::vector<float> norms(kChunkTokens);
  ComputeTokenNorms(kv.KView(), norms.data());
  // Head-major chunk [heads, chunk, D].
  std::vector<float> hk(static_cast<size_t>(heads) * kChunkTokens * d), hv(hk.size());
  out->window_k.resize(hk.size());
  out->window_v.resize(hk.size());
  out->bf16_k.resize(hk.size());
  out->bf16_v.resize(hk.size());
  for (int h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < kChunkTokens; ++t) {
      for (int c = 0; c < d; ++c) {
        const size_t src = (t * heads + h) * d + c, dst = (h * kChunkTokens + t) * d + c;
        hk[dst] = kv.k[src];
        hv[dst] = kv.v[src];
        out->window_k[dst] = FloatToHalf(kv.k[src]);
        out->window_v[dst] = FloatToHalf(kv.v[src]);
        out->bf16_k[dst] = FloatToBf16(kv.k[src]);
        out->bf16_v[dst] = FloatToBf16(kv.v[src]);
      }
    }
  }
  out->heads = heads;
  out->d = d;
  out->tokens = tokens;
  const size_t n = static_cast<size_t>(heads) * tokens * d;
  BENCH_CHECK_CUDA(out->k.Allocate(n));
  BENCH_CHECK_CUDA(out->v.Allocate(n));
  BENCH_CHECK_CUDA(out->norms.Allocate(tokens));
  UploadTiled(out->k.ptr, hk.data(), heads, static_cast<size_t>(tokens), d);
  UploadTiled(out->v.ptr, hv.data(), heads, static_cast<size_t>(tokens), d);
  UploadTiled(out->norms.ptr, norms.data(), 1, static_cast<size_t>(tokens), 1);
  const float* ql = kv.q.data() + (kChunkTokens - 1) * q_heads * d;
  out->q.assign(ql, ql + static_cast<size_t>(q_heads) * d);
}

// Quantizes tokens [first, first + n_blocks * G) of every head into back-to-back records
// ([heads][n_blocks]); returns the records buffer.
void QuantizeAll(const QuantSpec& spec, const DeviceKv& kv, int64_t first, int64_t n_blocks,
                 DeviceBuffer<uint8_t>* records, DeviceBuffer<float>* scratch,
                 DeviceBuffer<int>* overflow) {
  const int gt = spec.block_tokens;
  const size_t rb = BlockLayoutOf(spec).record_bytes;
  BENCH_CHECK_CUDA(records->Allocate(rb * kv.heads * n_blocks));
  BENCH_CHECK_CUDA(scratch->Allocate(QuantizeScratchFloats(spec, static_cast<int>(n_blocks))));
  BENCH_CHECK_CUDA(overflow->Allocate(1));
  BENCH_CHECK_CUDA(cudaMemset(overflow->ptr, 0, sizeof(int)));
  for (int h = 0; h < kv.heads; ++h) {
    BlockBatch b;
    b.k = kv.k.ptr + (static_cast<size_t>(h) * kv.tokens + first) * kv.d;
    b.v = kv.v.ptr + (static_cast<size_t>(h) * kv.tokens + first) * kv.d;
    b.row_stride = kv.d;
    b.block_stride = static_cast<int64_t>(gt) * kv.d;
    b.token_norms = spec.method == QuantMethod::kOscar ? kv.norms.ptr + first : nullptr;
    b.n_blocks = static_cast<int>(n_blocks);
    CheckStatus(EnqueueQuantizeBlocksCuda(spec, b, records->ptr + rb * h * n_blocks, scratch->ptr,
                                          overflow->ptr, nullptr),
                "quantize");
  }
  BENCH_CHECK_CUDA(cudaDeviceSynchronize());
}

void BenchQuantize(const Options& opt, double copy_gbps, std::ostringstream& js) {
  const int heads = 8, d = 128;
  const int64_t tokens = opt.quick ? 8192 : 32768;
  DeviceKv kv;
  MakeDeviceKv(heads, heads, d, tokens, &kv);
  js << "\"quantize\": [";
  bool first_item = true;
  for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kKivi, QuantMethod::kQuaRot,
                        QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo}) {
    const QuantSpec spec = Spec(m, d, 2);
    const int64_t n_blocks = heads * tokens / spec.block_tokens;
    const size_t rb = BlockLayoutOf(spec).record_bytes;
    DeviceBuffer<uint8_t> records;
    DeviceBuffer<float> scratch;
    DeviceBuffer<int> overflow;
    BENCH_CHECK_CUDA(records.Allocate(rb * n_blocks));
    BENCH_CHECK_CUDA(scratch.Allocate(QuantizeScratchFloats(spec, static_cast<int>(n_blocks))));
    BENCH_CHECK_CUDA(overflow.Allocate(1));
    BENCH_CHECK_CUDA(cudaMemset(overflow.ptr, 0, sizeof(int)));
    // All heads in one launch: [heads, tokens, D] is a uniform sequence of G-token blocks.
    BlockBatch b;
    b.k = kv.k.ptr;
    b.v = kv.v.ptr;
    b.row_stride = d;
    b.block_stride = static_cast<int64_t>(spec.block_tokens) * d;
    b.token_norms = nullptr;
    b.n_blocks = static_cast<int>(n_blocks);
    DeviceBuffer<float> norms;
    if (m == QuantMethod::kOscar) {  // Per block: the norms of its tokens, heads alike.
      BENCH_CHECK_CUDA(norms.Allocate(static_cast<size_t>(heads) * tokens));
      for (int h = 0; h < heads; ++h) {
        BENCH_CHECK_CUDA(
            cudaMemcpy(norms.ptr + h * tokens, kv.norms.ptr, tokens * 4, cudaMemcpyDeviceToDevice));
      }
      b.token_norms = norms.ptr;
    }
    const double us = MedianUs([&] {
      CheckStatus(
          EnqueueQuantizeBlocksCuda(spec, b, records.ptr, scratch.ptr, overflow.ptr, nullptr),
          "quantize");
    });
    int host_overflow = 0;
    BENCH_CHECK_CUDA(cudaMemcpy(&host_overflow, overflow.ptr, sizeof(int), cudaMemcpyDeviceToHost));
    const double in_bytes = 2.0 * heads * tokens * d * 4;
    const double out_bytes = static_cast<double>(rb) * n_blocks;
    const double gbps = (in_bytes + out_bytes) / (us * 1e3);
    js << (first_item ? "" : ", ") << "{\"method\": \"" << QuantMethodName(m)
       << "\", \"bits\": " << (m == QuantMethod::kFp16 ? 16 : 2) << ", \"kv_heads\": " << heads
       << ", \"head_dim\": " << d << ", \"tokens\": " << tokens << ", \"records\": " << n_blocks
       << ", \"us\": " << us << ", \"input_bytes\": " << in_bytes
       << ", \"output_bytes\": " << out_bytes << ", \"gbps_read_write\": " << gbps
       << ", \"fraction_of_copy\": " << gbps / copy_gbps
       << ", \"fp16_overflow\": " << (host_overflow ? "true" : "false") << "}";
    first_item = false;
    std::fprintf(stderr,
                 "quantize %-6s 2-bit %lld tokens x %d heads: %.1f us, %.0f GB/s = %.3f of copy\n",
                 std::string(QuantMethodName(m)).c_str(), static_cast<long long>(tokens), heads, us,
                 gbps, gbps / copy_gbps);
  }
  js << "]";
}

struct Geometry {
  const char* model;
  int kv_heads, q_heads, d;
};

// One attention row of the JSON and the log.
struct AttnRow {
  const Geometry* geo;
  int64_t tokens;
  std::string method;
  int bits;
  int64_t records, window_rows;
  int splits;
  double us, bytes;
  bool finite;
};

void EmitAttention(const AttnRow& r, bool* first_item, std::ostringstream& js) {
  js << (*first_item ? "" : ", ") << "{\"model\": \"" << r.geo->model
     << "\", \"kv_heads\": " << r.geo->kv_heads << ", \"q_heads\": " << r.geo->q_heads
     << ", \"head_dim\": " << r.geo->d << ", \"tokens\": " << r.tokens << ", \"method\": \""
     << r.method << "\", \"bits\": " << r.bits << ", \"records\": " << r.records
     << ", \"window_rows\": " << r.window_rows << ", \"splits\": " << r.splits
     << ", \"us\": " << r.us << ", \"bytes_read\": " << r.bytes
     << ", \"gbps\": " << r.bytes / (r.us * 1e3)
     << ", \"output_finite\": " << (r.finite ? "true" : "false") << "}";
  *first_item = false;
  std::fprintf(stderr, "attention %-12s T=%-6lld %-10s: %8.1f us  %6.0f GB/s  splits %d\n",
               r.geo->model, static_cast<long long>(r.tokens), r.method.c_str(), r.us,
               r.bytes / (r.us * 1e3), r.splits);
}

// Runs the plan, returns its median time and whether every output is finite.
double TimePlan(const CudaAttentionPlan& plan, const float* d_out, size_t n, bool* finite) {
  const double us = MedianUs([&] { CheckStatus(plan.Enqueue(nullptr), "enqueue"); });
  BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> out(n);
  BENCH_CHECK_CUDA(cudaMemcpy(out.data(), d_out, n * 4, cudaMemcpyDeviceToHost));
  *finite = true;
  for (float x : out) *finite &= std::isfinite(x);
  return us;
}

// The dense baseline through the same kernel: every token a bf16 window row (no records), the
// window split across parts like records.
void BenchDenseBf16(const Geometry& geo, const DeviceKv& kv, int64_t tokens, bool* first_item,
                    std::ostringstream& js) {
  const int g = geo.q_heads / geo.kv_heads;
  const size_t rows = static_cast<size_t>(tokens);
  DeviceBuffer<uint16_t> d_k, d_v;
  DeviceBuffer<float> d_q, d_out, d_lse;
  BENCH_CHECK_CUDA(d_k.Allocate(rows * geo.kv_heads * geo.d));
  BENCH_CHECK_CUDA(d_v.Allocate(rows * geo.kv_heads * geo.d));
  UploadTiled(d_k.ptr, kv.bf16_k.data(), geo.kv_heads, rows, geo.d);
  UploadTiled(d_v.ptr, kv.bf16_v.data(), geo.kv_heads, rows, geo.d);
  BENCH_CHECK_CUDA(d_q.Allocate(kv.q.size()));
  BENCH_CHECK_CUDA(d_out.Allocate(kv.q.size()));
  BENCH_CHECK_CUDA(d_lse.Allocate(geo.q_heads));
  BENCH_CHECK_CUDA(cudaMemcpy(d_q.ptr, kv.q.data(), kv.q.size() * 4, cudaMemcpyHostToDevice));
  std::vector<CudaAttentionHead> heads(geo.kv_heads);
  for (int h = 0; h < geo.kv_heads; ++h) {
    CudaAttentionHead& hd = heads[h];
    hd.window_k = reinterpret_cast<const uint8_t*>(d_k.ptr + h * rows * geo.d);
    hd.window_v = reinterpret_cast<const uint8_t*>(d_v.ptr + h * rows * geo.d);
    hd.window_k_row_bytes = hd.window_v_row_bytes = 2 * geo.d;
    hd.window_rows = tokens;
    hd.q = d_q.ptr + h * g * geo.d;
    hd.out = d_out.ptr + h * g * geo.d;
    hd.lse = d_lse.ptr + h * g;
  }
  auto plan = CudaAttentionPlan::Create(Spec(QuantMethod::kFp16, geo.d, 16), heads, g,
                                        1.0f / std::sqrt(static_cast<float>(geo.d)), DType::kBF16);
  CheckStatus(plan.status(), "CudaAttentionPlan::Create (dense bf16)");
  bool finite = false;
  const double us = TimePlan(**plan, d_out.ptr, kv.q.size(), &finite);
  EmitAttention({&geo, tokens, "dense-bf16", 16, 0, tokens, (*plan)->splits(), us,
                 2.0 * tokens * geo.d * 2 * geo.kv_heads, finite},
                first_item, js);
}

void BenchAttention(const Options& opt, std::ostringstream& js) {
  const Geometry geos[] = {{"SmolLM2-135M", 3, 9, 64}, {"Llama-3-8B", 8, 32, 128}};
  std::vector<int64_t> lengths = {8192, 32768, 131072};
  if (opt.quick) lengths = {8192};
  js << "\"attention\": [";
  bool first_item = true;
  for (const Geometry& geo : geos) {
    const int g = geo.q_heads / geo.kv_heads;
    DeviceKv kv;
    MakeDeviceKv(geo.kv_heads, geo.q_heads, geo.d, kChunkTokens, &kv);
    for (int64_t tokens : lengths) {
      BenchDenseBf16(geo, kv, tokens, &first_item, js);
      for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kKivi, QuantMethod::kQuaRot,
                            QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo}) {
        if (opt.quick && (m == QuantMethod::kQuaRot || m == QuantMethod::kOscar)) continue;
        const QuantSpec spec = Spec(m, geo.d, 2);
        const int gt = spec.block_tokens;
        const int sinks = TraitsOf(m).streaming.sink_tokens;
        const int64_t nrec = (tokens - sinks - 64) / gt;
        const int64_t window = tokens - nrec * gt;  // Sinks + a tail of 64..64+G-1 rows.
        // Records of one chunk per head, then a pointer table that cycles through them over
        // distinct copies so the whole length occupies its own memory.
        const int64_t chunk_rec = (kChunkTokens - sinks) / gt;
        DeviceBuffer<uint8_t> chunk, records;
        DeviceBuffer<float> scratch;
        DeviceBuffer<int> overflow;
        QuantizeAll(spec, kv, sinks, chunk_rec, &chunk, &scratch, &overflow);
        const size_t rb = BlockLayoutOf(spec).record_bytes;
        BENCH_CHECK_CUDA(records.Allocate(rb * geo.kv_heads * nrec));
        std::vector<const uint8_t*> ptrs;
        for (int h = 0; h < geo.kv_heads; ++h) {
          for (int64_t r0 = 0; r0 < nrec; r0 += chunk_rec) {
            const int64_t len = std::min(chunk_rec, nrec - r0);
            BENCH_CHECK_CUDA(cudaMemcpy(records.ptr + rb * (h * nrec + r0),
                                        chunk.ptr + rb * h * chunk_rec, rb * len,
                                        cudaMemcpyDeviceToDevice));
          }
          for (int64_t r = 0; r < nrec; ++r) ptrs.push_back(records.ptr + rb * (h * nrec + r));
        }
        DeviceBuffer<const uint8_t*> d_ptrs;
        BENCH_CHECK_CUDA(d_ptrs.Allocate(ptrs.size()));
        BENCH_CHECK_CUDA(cudaMemcpy(d_ptrs.ptr, ptrs.data(), ptrs.size() * sizeof(ptrs[0]),
                                    cudaMemcpyHostToDevice));
        // OScaR norms: one G-float slice per record (the chunk's norms, reused).
        DeviceBuffer<const float*> d_norm_ptrs;
        if (m == QuantMethod::kOscar) {
          std::vector<const float*> nptrs;
          for (int h = 0; h < geo.kv_heads; ++h) {
            for (int64_t r = 0; r < nrec; ++r)
              nptrs.push_back(kv.norms.ptr + sinks + (r % chunk_rec) * gt);
          }
          BENCH_CHECK_CUDA(d_norm_ptrs.Allocate(nptrs.size()));
          BENCH_CHECK_CUDA(cudaMemcpy(d_norm_ptrs.ptr, nptrs.data(),
                                      nptrs.size() * sizeof(nptrs[0]), cudaMemcpyHostToDevice));
        }
        // Window rows (fp16) per head, queries, outputs.
        DeviceBuffer<uint16_t> d_wk, d_wv;
        DeviceBuffer<float> d_q, d_out, d_lse;
        const size_t wrows = static_cast<size_t>(window);
        BENCH_CHECK_CUDA(d_wk.Allocate(wrows * geo.kv_heads * geo.d));
        BENCH_CHECK_CUDA(d_wv.Allocate(wrows * geo.kv_heads * geo.d));
        UploadTiled(d_wk.ptr, kv.window_k.data(), geo.kv_heads, wrows, geo.d);
        UploadTiled(d_wv.ptr, kv.window_v.data(), geo.kv_heads, wrows, geo.d);
        BENCH_CHECK_CUDA(d_q.Allocate(kv.q.size()));
        BENCH_CHECK_CUDA(d_out.Allocate(kv.q.size()));
        BENCH_CHECK_CUDA(d_lse.Allocate(geo.q_heads));
        BENCH_CHECK_CUDA(cudaMemcpy(d_q.ptr, kv.q.data(), kv.q.size() * 4, cudaMemcpyHostToDevice));
        std::vector<CudaAttentionHead> heads(geo.kv_heads);
        for (int h = 0; h < geo.kv_heads; ++h) {
          CudaAttentionHead& hd = heads[h];
          hd.records = d_ptrs.ptr + h * nrec;
          hd.record_norms = m == QuantMethod::kOscar ? d_norm_ptrs.ptr + h * nrec : nullptr;
          hd.num_records = nrec;
          hd.window_k = reinterpret_cast<const uint8_t*>(d_wk.ptr + h * wrows * geo.d);
          hd.window_v = reinterpret_cast<const uint8_t*>(d_wv.ptr + h * wrows * geo.d);
          hd.window_k_row_bytes = hd.window_v_row_bytes = 2 * geo.d;
          hd.window_rows = window;
          hd.q = d_q.ptr + h * g * geo.d;
          hd.out = d_out.ptr + h * g * geo.d;
          hd.lse = d_lse.ptr + h * g;
        }
        auto plan = CudaAttentionPlan::Create(
            spec, heads, g, 1.0f / std::sqrt(static_cast<float>(geo.d)), DType::kF16);
        CheckStatus(plan.status(), "CudaAttentionPlan::Create");
        bool finite = false;
        const double us = TimePlan(**plan, d_out.ptr, kv.q.size(), &finite);
        const double bytes =
            static_cast<double>(rb) * nrec * geo.kv_heads + 2.0 * window * geo.d * 2 * geo.kv_heads;
        EmitAttention(
            {&geo, tokens, std::string(QuantMethodName(m)), m == QuantMethod::kFp16 ? 16 : 2, nrec,
             window, (*plan)->splits(), us, bytes, finite},
            &first_item, js);
      }
    }
  }
  js << "]";
}

int Main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      opt.json_path = argv[++i];
    } else if (a == "--quick") {
      opt.quick = true;
    } else {
      std::fprintf(stderr, "usage: kvbench_cuda [--json PATH] [--quick]\n");
      return 64;
    }
  }
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    std::fprintf(stderr, "kvbench_cuda: no CUDA device (%s); nothing measured\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 2;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::ostringstream js;
  js.precision(6);
  js << "{\"device\": {\"name\": \"" << prop.name << "\", \"compute_capability\": \"" << prop.major
     << "." << prop.minor << "\", \"sms\": " << prop.multiProcessorCount
     << ", \"global_mem_bytes\": " << prop.totalGlobalMem
     << "}, \"quick\": " << (opt.quick ? "true" : "false") << ", ";
  const double copy = CopyGbps(size_t{1} << 30, js);
  js << ", ";
  BenchQuantize(opt, copy, js);
  js << ", ";
  BenchAttention(opt, js);
  js << "}\n";
  if (opt.json_path.empty()) {
    std::fputs(js.str().c_str(), stdout);
  } else {
    std::ofstream f(opt.json_path);
    f << js.str();
    if (!f) {
      std::fprintf(stderr, "kvbench_cuda: cannot write %s\n", opt.json_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvctl

int main(int argc, char** argv) { return kvctl::Main(argc, argv); }
