// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/cuda/attention_warp_ops.h
// attn::WarpOps<Warp>: the warp-cooperative Ops policy of kernels/attention_block.h that the CUDA
// attention kernel runs (kernels/cuda/attention_cuda.cu). The 32 lanes of a warp share one
// attn::Work; every primitive is called by all lanes with the same arguments and ends with
// Warp::Sync(), so its outputs are visible to every lane when it returns. Each output element is
// computed by one lane in ScalarOps' order (same products and additions), so without contraction
// (the CPU emulation, -ffp-contract=off) ChannelDots, TokenDots, TokenAxpys, LoadHalves and Fwht
// are bitwise ScalarOps; the CUDA build lets nvcc fuse multiply-adds (--fmad=true), which changes
// the last bits only. ExpSum and MaxOf reduce across lanes (ExpSum's order differs).
//
// `Warp` supplies Lane() (0..31), Sync() (a barrier of the 32 lanes with memory ordering) and
// ShflXor(v, mask) (the value of lane ^ mask; every lane calls it). The CUDA build uses the warp
// intrinsics; tests/kernels_cuda/warp_ops_emulation_test.cc runs the same code on 32 CPU threads
// with a std::barrier, so the lane partitioning and the barriers are tested without a GPU.
//
// Thread safety: pure functions over caller-owned memory, cooperative within one warp.
//
//   using Ops = attn::WarpOps<CudaWarp>;
//   attn::Attend<Ops>(problem);  // called by all 32 lanes, problem.scratch per warp
#ifndef KVCTL_KERNELS_CUDA_ATTENTION_WARP_OPS_H_
#define KVCTL_KERNELS_CUDA_ATTENTION_WARP_OPS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "common/host_device.h"
#include "kernels/attention_block.h"
#include "kernels/quant_block.h"

namespace kvctl::attn {

inline constexpr int kWarpLanes = 32;

// Element idx of a row in one of the CodeFormat encodings (what Load8 returns one at a time).
KVCTL_HOST_DEVICE inline float LoadElem(const uint8_t* row, int64_t idx, int fmt) {
  if (fmt <= kU8) return static_cast<float>(block::GetCode(row, static_cast<int>(idx), fmt));
  if (fmt == kF16) return block::LoadHalf(row, static_cast<int>(idx));
  if (fmt == kBF16) {
    const uint8_t* p = row + 2 * idx;
    return Bf16ToFloat(static_cast<uint16_t>(p[0] | (p[1] << 8)));
  }
  float v;
  memcpy(&v, row + 4 * idx, sizeof(v));
  return v;
}

template <class Warp>
struct WarpOps {
  static constexpr int kLanes = kWarpLanes;
  // Register tile of one lane per pass over the codes: kRows query rows x kCols tokens
  // (ChannelDots) or channels (TokenAxpys), 32 lanes apart.
  static constexpr int kRows = 4;
  static constexpr int kCols = 4;

  KVCTL_HOST_DEVICE static int Lane() { return Warp::Lane(); }
  KVCTL_HOST_DEVICE static void Sync() { Warp::Sync(); }

  // out[i][t] = sum_c coef[i][c] x(c, t0 + t): lane l owns tokens l, l + 32, ... (kCols of them
  // per pass) for kRows query rows per pass; channels in order, each coefficient loaded once per
  // pass and reused across the lane's tokens.
  KVCTL_HOST_DEVICE static void ChannelDots(const uint8_t* rows_base, int64_t row_bytes, int fmt,
                                            int rows, int t0, int nt, const float* coef,
                                            int coef_stride, int g, float* out, int out_stride) {
    for (int i0 = 0; i0 < g; i0 += kRows) {
      const int nr = g - i0 < kRows ? g - i0 : kRows;
      for (int tb = Lane(); tb < nt; tb += kLanes * kCols) {
        float a[kRows][kCols] = {};
        for (int c = 0; c < rows; ++c) {
          const uint8_t* row = rows_base + c * row_bytes;
          float co[kRows];
          for (int r = 0; r < kRows; ++r) co[r] = r < nr ? coef[(i0 + r) * coef_stride + c] : 0.0f;
          for (int j = 0; j < kCols; ++j) {
            const int t = tb + j * kLanes;
            if (t >= nt) break;
            const float v = LoadElem(row, t0 + t, fmt);
            for (int r = 0; r < kRows; ++r) a[r][j] += co[r] * v;
          }
        }
        for (int r = 0; r < nr; ++r) {
          for (int j = 0; j < kCols && tb + j * kLanes < nt; ++j) {
            out[(i0 + r) * out_stride + tb + j * kLanes] = a[r][j];
          }
        }
      }
    }
    Sync();
  }

  // out[i][t] = sum_c q[i][c] x(t, c): a lane per (token, row), in ScalarOps' chunks of 8.
  KVCTL_HOST_DEVICE static void TokenDots(const uint8_t* rows_base, int64_t row_bytes, int fmt,
                                          int ntok, int nch, const float* q, int q_stride, int g,
                                          float* out, int out_stride) {
    for (int k = Lane(); k < ntok * g; k += kLanes) {
      const int t = k / g, i = k % g;
      const uint8_t* row = rows_base + t * row_bytes;
      const float* qi = q + i * q_stride;
      float o = 0.0f;
      float v[8];
      for (int c = 0; c < nch; c += 8) {
        Load8(row, c, fmt, v);
        float s = 0.0f;
        for (int e = 0; e < 8; ++e) s += qi[c + e] * v[e];
        o += s;
      }
      out[i * out_stride + t] = o;
    }
    Sync();
  }

  // acc[i][c] += sum_t w[i][t] x(t, c0 + c): lane l owns channels l, l + 32, ... (kCols per
  // pass) for kRows query rows per pass; tokens in order, each weight loaded once per pass.
  KVCTL_HOST_DEVICE static void TokenAxpys(const uint8_t* rows_base, int64_t row_bytes, int fmt,
                                           int ntok, int c0, int nch, const float* w, int w_stride,
                                           int g, float* acc, int acc_stride) {
    for (int i0 = 0; i0 < g; i0 += kRows) {
      const int nr = g - i0 < kRows ? g - i0 : kRows;
      for (int cb = Lane(); cb < nch; cb += kLanes * kCols) {
        float a[kRows][kCols] = {};
        for (int r = 0; r < nr; ++r) {
          for (int j = 0; j < kCols && cb + j * kLanes < nch; ++j) {
            a[r][j] = acc[(i0 + r) * acc_stride + cb + j * kLanes];
          }
        }
        for (int t = 0; t < ntok; ++t) {
          const uint8_t* row = rows_base + t * row_bytes;
          float wt[kRows];
          for (int r = 0; r < kRows; ++r) wt[r] = r < nr ? w[(i0 + r) * w_stride + t] : 0.0f;
          for (int j = 0; j < kCols; ++j) {
            const int c = cb + j * kLanes;
            if (c >= nch) break;
            const float v = LoadElem(row, c0 + c, fmt);
            for (int r = 0; r < kRows; ++r) a[r][j] += wt[r] * v;
          }
        }
        for (int r = 0; r < nr; ++r) {
          for (int j = 0; j < kCols && cb + j * kLanes < nch; ++j) {
            acc[(i0 + r) * acc_stride + cb + j * kLanes] = a[r][j];
          }
        }
      }
    }
    Sync();
  }

  // x[i] = exp(x[i] - m); returns the sum, the same value in every lane (xor butterfly: each step
  // adds the same two numbers in every lane of a pair).
  KVCTL_HOST_DEVICE static float ExpSum(float* x, int n, float m) {
    float s = 0.0f;
    for (int i = Lane(); i < n; i += kLanes) {
      x[i] = expf(x[i] - m);
      s += x[i];
    }
    for (int off = kLanes / 2; off > 0; off >>= 1) s += Warp::ShflXor(s, off);
    Sync();
    return s;
  }

  KVCTL_HOST_DEVICE static float MaxOf(const float* x, int n) {
    float m = -INFINITY;
    for (int i = Lane(); i < n; i += kLanes) m = fmaxf(m, x[i]);
    for (int off = kLanes / 2; off > 0; off >>= 1) m = fmaxf(m, Warp::ShflXor(m, off));
    Sync();
    return m;
  }

  KVCTL_HOST_DEVICE static void LoadHalves(const uint8_t* p, int n, float* out) {
    for (int i = Lane(); i < n; i += kLanes) out[i] = block::LoadHalf(p, i);
    Sync();
  }

  // Once per query row and part: lane 0 runs the reference butterfly (bitwise the CPU's).
  KVCTL_HOST_DEVICE static void Fwht(float* x, int d) {
    Sync();
    if (Lane() == 0) block::FwhtRow(x, d);
    Sync();
  }
};

// The split-K decomposition of the CUDA kernels, written here so the CPU emulation test runs the
// same indexing. `Head` is CudaAttentionHead (kernels/cuda/attention_cuda.h): records,
// record_norms, num_records, window_k/v, window_k/v_row_bytes, window_rows, q, out, lse.
template <class Head>
struct PartsArgs {
  QuantSpec spec;
  BlockLayout layout;
  bool rotates = false;
  int window_format = kF16;
  int group = 1;
  float scale = 1.0f;
  const Head* heads = nullptr;
  int num_heads = 0;
  int splits = 1;  // Parts per head.
  int warps_per_block = 1;
  float* part_out = nullptr;        // [heads][splits][group][D]
  float* part_lse = nullptr;        // [heads][splits][group]
  float* global_scratch = nullptr;  // CUDA: null = per-warp Work in shared memory.
  int64_t scratch_floats = 0;       // Per warp, >= ScratchFloats(spec, group).
};

// Part `part` = head part / splits, k = part % splits: the head's records [n k / S, n (k + 1) / S)
// and window rows [W k / S, W (k + 1) / S) (so a long full-precision window is split too),
// through Attend<Ops> (the CPU reference's own driver) into part_out / part_lse. Called by all
// lanes of one warp.
template <class Ops, class Head>
KVCTL_HOST_DEVICE inline void AttendPart(const PartsArgs<Head>& a, int64_t part, float* scratch) {
  const int h = static_cast<int>(part / a.splits);
  const int k = static_cast<int>(part % a.splits);
  const Head& hd = a.heads[h];
  const int64_t first = hd.num_records * k / a.splits;
  const int64_t last = hd.num_records * (k + 1) / a.splits;
  Problem p;
  p.spec = a.spec;
  p.layout = a.layout;
  p.rotates = a.rotates;
  p.records = hd.records ? hd.records + first : nullptr;
  p.norms = hd.record_norms ? hd.record_norms + first : nullptr;
  p.num_records = last - first;
  const int64_t w0 = hd.window_rows * k / a.splits;
  const int64_t w1 = hd.window_rows * (k + 1) / a.splits;
  if (w1 > w0) {
    p.window_k = hd.window_k + w0 * hd.window_k_row_bytes;
    p.window_v = hd.window_v + w0 * hd.window_v_row_bytes;
    p.window_k_row_bytes = hd.window_k_row_bytes;
    p.window_v_row_bytes = hd.window_v_row_bytes;
    p.window_k_format = a.window_format;
    p.window_v_format = a.window_format;
    p.window_rows = w1 - w0;
  }
  p.q = hd.q;
  p.group = a.group;
  p.scale = a.scale;
  p.out = a.part_out + part * a.group * a.spec.head_dim;
  p.lse = a.part_lse + part * a.group;
  p.scratch = scratch;
  Attend<Ops>(p);
}

// Merge work items: one per (head, query row, 8 channels).
template <class Head>
KVCTL_HOST_DEVICE inline int64_t MergeChunks(const PartsArgs<Head>& a) {
  return static_cast<int64_t>(a.num_heads) * a.group * (a.spec.head_dim / 8);
}

// Item idx < MergeChunks(a): MergeParts over the head's parts for 8 channels of one query row
// into the head's out; the item holding channel 0 also writes lse. REQUIRES: splits <= kMaxParts.
template <int kMaxParts, class Head>
KVCTL_HOST_DEVICE inline void MergeChunk(const PartsArgs<Head>& a, int64_t idx) {
  const int d = a.spec.head_dim, chunks = d / 8;
  const int h = static_cast<int>(idx / (static_cast<int64_t>(a.group) * chunks));
  const int i = static_cast<int>(idx / chunks % a.group);
  const int c0 = static_cast<int>(idx % chunks) * 8;
  const float* outs[kMaxParts];
  const float* lses[kMaxParts];
  for (int k = 0; k < a.splits; ++k) {
    const int64_t part = static_cast<int64_t>(h) * a.splits + k;
    outs[k] = a.part_out + (part * a.group + i) * d + c0;
    lses[k] = a.part_lse + part * a.group + i;
  }
  float lse;
  MergeParts(1, 8, a.splits, outs, lses, a.heads[h].out + i * d + c0, &lse);
  if (c0 == 0) a.heads[h].lse[i] = lse;
}

}  // namespace kvctl::attn

#endif  // KVCTL_KERNELS_CUDA_ATTENTION_WARP_OPS_H_
