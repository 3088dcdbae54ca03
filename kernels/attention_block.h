// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/attention_block.h
// The per-record math of fused decode attention, written once for the CPU reference, the CPU SIMD
// path and the CUDA kernels (KVCTL_HOST_DEVICE): scores of one block record for the query rows of
// a GQA group, the online-softmax update, and the weighted V accumulation of one record, all read
// straight from the packed codes and fp16 metadata without materialising the dequantized tile.
//
// The algorithm templates take an `Ops` policy of loop primitives over "rows of elements" in
// one of the CodeFormat encodings (packed codes, fp16, bf16, fp32). ScalarOps below is the spec;
// kernels/attention_simd_impl.inc supplies register-blocked AVX2/AVX-512 versions and
// kernels/cuda/attention_cuda.cu warp-cooperative ones (WarpOps).
// Everything here allocates nothing, validates nothing and never fails: kernels/attention.cc checks
// the inputs and carves the scratch (ScratchFloats floats).
//
// Cooperative policies: an Ops policy may also define Lane(), kLanes and Sync() (the CUDA WarpOps
// of kernels/cuda/attention_cuda.cu: the 32 lanes of a warp share one Work in shared memory).
// Then every primitive is called by all lanes with the same arguments and returns with its
// outputs visible to all of them, and the element-wise loops below are lane-strided and followed
// by Sync(); state written once per row (m, l, lse) is written by lane 0. Policies without them
// (ScalarOps, the CPU SIMD ops) are one lane: the loops are the plain loops, Sync() is nothing.
//
// Frames: rotating methods (QuaRot, KVarN, OScaR) score records with the rotated query and
// accumulate their V in the rotated frame (acc); the full-precision window rows are stored in the
// engine's frame, so they are scored with the unrotated query and accumulate in a second
// accumulator (acc2). Finalize rotates acc back once (H = H^-1) and adds acc2. Non-rotating
// methods use a single accumulator (acc2 == acc).
//
// Thread safety: pure functions over caller-owned memory.
//
//   attn::Problem p = ...;               // kernels/attention.cc fills it from validated inputs
//   attn::Attend<attn::ScalarOps>(p);    // p.out, p.lse written
#ifndef KVCTL_KERNELS_ATTENTION_BLOCK_H_
#define KVCTL_KERNELS_ATTENTION_BLOCK_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "common/host_device.h"
#include "common/tensor.h"
#include "kernels/block_codec.h"

namespace kvctl::attn {

// How the elements of a row are stored. Values 2, 3, 4, 8: LSB-first packed unsigned codes of that
// many bits (kernels/README.md, "Bit stream"). The others are little-endian floating point.
enum CodeFormat : int { kU2 = 2, kU3 = 3, kU4 = 4, kU8 = 8, kF16 = 16, kBF16 = 17, kF32 = 32 };

KVCTL_HOST_DEVICE inline int WindowFormat(DType dtype) {
  return dtype == DType::kF16 ? kF16 : (dtype == DType::kBF16 ? kBF16 : kF32);
}

// Loads elements idx .. idx+7 of a row into v. REQUIRES: idx % 8 == 0 (a group of 8 packed codes
// then starts on a byte boundary and spans exactly `bits` bytes).
KVCTL_HOST_DEVICE inline void Load8(const uint8_t* row, int64_t idx, int fmt, float* v) {
  if (fmt <= kU8) {
    const uint8_t* p = row + idx * fmt / 8;
    uint64_t w = 0;
    for (int b = 0; b < fmt; ++b) w |= static_cast<uint64_t>(p[b]) << (8 * b);
    const uint64_t mask = (uint64_t{1} << fmt) - 1;
    for (int k = 0; k < 8; ++k) v[k] = static_cast<float>((w >> (k * fmt)) & mask);
  } else if (fmt == kF16) {
    for (int k = 0; k < 8; ++k) v[k] = block::LoadHalf(row, static_cast<int>(idx) + k);
  } else if (fmt == kBF16) {
    const uint8_t* p = row + 2 * idx;
    for (int k = 0; k < 8; ++k) {
      v[k] = Bf16ToFloat(static_cast<uint16_t>(p[2 * k] | (p[2 * k + 1] << 8)));
    }
  } else {
    memcpy(v, row + 4 * idx, 8 * sizeof(float));
  }
}

// The loop primitives. Rows are `row_bytes` apart; element counts that index inside a row (nt,
// nch, t0, c0) are multiples of 8, counts of rows are arbitrary. g query rows are processed per
// call; out/acc/coef/w rows are `*_stride` floats apart.
struct ScalarOps {
  // out[i][t] = sum_c coef[i][c] * x(c, t0 + t) for t < nt, c < rows: the channel-major K tiles
  // (KIVI, OScaR, KVarN), where x(c, .) is row c.
  KVCTL_HOST_DEVICE static void ChannelDots(const uint8_t* rows_base, int64_t row_bytes, int fmt,
                                            int rows, int t0, int nt, const float* coef,
                                            int coef_stride, int g, float* out, int out_stride) {
    for (int i = 0; i < g; ++i) {
      for (int t = 0; t < nt; ++t) out[i * out_stride + t] = 0.0f;
    }
    float v[8];
    for (int c = 0; c < rows; ++c) {
      const uint8_t* row = rows_base + c * row_bytes;
      for (int t = 0; t < nt; t += 8) {
        Load8(row, t0 + t, fmt, v);
        for (int i = 0; i < g; ++i) {
          const float a = coef[i * coef_stride + c];
          float* o = out + i * out_stride + t;
          for (int k = 0; k < 8; ++k) o[k] += a * v[k];
        }
      }
    }
  }

  // out[i][t] = sum_c q[i][c] * x(t, c) for t < ntok, c < nch: token-major rows (QuaRot and fp16
  // K, the window's K).
  KVCTL_HOST_DEVICE static void TokenDots(const uint8_t* rows_base, int64_t row_bytes, int fmt,
                                          int ntok, int nch, const float* q, int q_stride, int g,
                                          float* out, int out_stride) {
    float v[8];
    for (int t = 0; t < ntok; ++t) {
      const uint8_t* row = rows_base + t * row_bytes;
      for (int i = 0; i < g; ++i) out[i * out_stride + t] = 0.0f;
      for (int c = 0; c < nch; c += 8) {
        Load8(row, c, fmt, v);
        for (int i = 0; i < g; ++i) {
          const float* qi = q + i * q_stride + c;
          float s = 0.0f;
          for (int k = 0; k < 8; ++k) s += qi[k] * v[k];
          out[i * out_stride + t] += s;
        }
      }
    }
  }

  // acc[i][c] += sum_t w[i][t] * x(t, c0 + c) for t < ntok, c < nch: the V of every method and the
  // window's V.
  KVCTL_HOST_DEVICE static void TokenAxpys(const uint8_t* rows_base, int64_t row_bytes, int fmt,
                                           int ntok, int c0, int nch, const float* w, int w_stride,
                                           int g, float* acc, int acc_stride) {
    float v[8];
    for (int t = 0; t < ntok; ++t) {
      const uint8_t* row = rows_base + t * row_bytes;
      for (int c = 0; c < nch; c += 8) {
        Load8(row, c0 + c, fmt, v);
        for (int i = 0; i < g; ++i) {
          const float a = w[i * w_stride + t];
          float* o = acc + i * acc_stride + c;
          for (int k = 0; k < 8; ++k) o[k] += a * v[k];
        }
      }
    }
  }

  // x[i] = exp(x[i] - m); returns the sum. REQUIRES: every x[i] <= m.
  KVCTL_HOST_DEVICE static float ExpSum(float* x, int n, float m) {
    float s = 0.0f;
    for (int i = 0; i < n; ++i) {
      x[i] = expf(x[i] - m);
      s += x[i];
    }
    return s;
  }

  KVCTL_HOST_DEVICE static float MaxOf(const float* x, int n) {
    float m = x[0];
    for (int i = 1; i < n; ++i) m = fmaxf(m, x[i]);
    return m;
  }

  KVCTL_HOST_DEVICE static void LoadHalves(const uint8_t* p, int n, float* out) {
    for (int i = 0; i < n; ++i) out[i] = block::LoadHalf(p, i);
  }

  KVCTL_HOST_DEVICE static void Fwht(float* x, int d) { block::FwhtRow(x, d); }
};

// One attention problem for one (layer, KV head), raw pointers only (attention.cc fills it).
struct Problem {
  QuantSpec spec;
  BlockLayout layout;
  bool rotates = false;
  const uint8_t* const* records = nullptr;  // num_records records, any token order.
  const float* const* norms = nullptr;      // OScaR: block_tokens norms per record; else null.
  int64_t num_records = 0;
  const uint8_t* window_k = nullptr;  // Row 0 of the window's K (engine frame).
  const uint8_t* window_v = nullptr;
  int64_t window_k_row_bytes = 0, window_v_row_bytes = 0;
  int window_k_format = kF32, window_v_format = kF32;
  int64_t window_rows = 0;
  const float* q = nullptr;  // [group, head_dim], engine frame.
  int group = 1;
  float scale = 1.0f;
  float* out = nullptr;  // [group, head_dim], engine frame.
  float* lse = nullptr;  // [group].
  float* scratch = nullptr;
};

// Scratch of one call, by region.
struct Work {
  float* qs;      // [g][D]: q * scale, engine frame (window).
  float* qr;      // [g][D]: rotated qs (== qs for non-rotating methods).
  float* qsum;    // [g]: sum of qr (QuaRot's per-token zero term).
  float* scores;  // [g][G]: scores, then softmax weights, of one record or window chunk.
  float* coef;    // [g][max(G, D)]: per-group folded query (K) or weights (V).
  float* consts;  // [g]: zero-point term of the current group.
  float* meta;    // max(K, V metadata) as floats, and tK / uV.
  float* tmp;     // [g][D]: KVarN's per-record V accumulator before uV.
  float* acc;     // [g][D]: output accumulator (rotated frame for rotating methods).
  float* acc2;    // [g][D]: window accumulator in the engine frame (== acc if not rotating).
  float* m;       // [g]: running max.
  float* l;       // [g]: running sum.
};

KVCTL_HOST_DEVICE inline int MaxInt(int a, int b) { return a > b ? a : b; }

// Lane of the caller inside a cooperative Ops policy, the number of lanes, and the barrier between
// them (see the file comment); 0, 1 and nothing for single-lane policies.
template <class Ops>
KVCTL_HOST_DEVICE inline int LaneOf() {
  if constexpr (requires { Ops::Lane(); }) {
    return Ops::Lane();
  } else {
    return 0;
  }
}
template <class Ops>
KVCTL_HOST_DEVICE inline constexpr int LanesOf() {
  if constexpr (requires { Ops::kLanes; }) {
    return Ops::kLanes;
  } else {
    return 1;
  }
}
template <class Ops>
KVCTL_HOST_DEVICE inline void SyncLanes() {
  if constexpr (requires { Ops::Sync(); }) Ops::Sync();
}

// Metadata as floats: the raw fp16 section plus, for (scale, zero) pairs, the pairs split into two
// arrays (RecordScores, RecordAccumulateV). Sized for the method and its group sizes, so that a
// CUDA warp's Work fits in shared memory.
KVCTL_HOST_DEVICE inline int64_t MetaFloats(const QuantSpec& s) {
  const int64_t g = s.block_tokens, d = s.head_dim;
  switch (s.method) {
    case QuantMethod::kKivi:
    case QuantMethod::kOscar: {
      const int64_t k = 4 * d * (g / s.k_group_tokens), v = 4 * g * (d / s.v_group_channels);
      return k > v ? k : v;
    }
    case QuantMethod::kQuaRot:
      return 4 * g;
    case QuantMethod::kKvarn:
      return 2 * (g + d);
    case QuantMethod::kTurbo:
      return g + g * d;  // Norms [G], then the codebook values of one K or V tile [G][D].
    case QuantMethod::kFp16:
      break;
  }
  return 0;
}

KVCTL_HOST_DEVICE inline int64_t ScratchFloats(const QuantSpec& s, int group) {
  const int64_t g = group, d = s.head_dim, gt = s.block_tokens;
  return 5 * g * d + g * gt + g * MaxInt(s.block_tokens, s.head_dim) + MetaFloats(s) + 4 * g;
}

KVCTL_HOST_DEVICE inline Work CarveWork(const QuantSpec& s, int g, bool rotates, float* p) {
  const int d = s.head_dim;
  Work w;
  w.qs = p;
  w.qr = rotates ? w.qs + g * d : w.qs;
  w.qsum = w.qs + 2 * g * d;
  w.scores = w.qsum + g;
  w.coef = w.scores + g * s.block_tokens;
  w.consts = w.coef + g * MaxInt(s.block_tokens, d);
  w.meta = w.consts + g;
  w.tmp = w.meta + MetaFloats(s);
  w.acc = w.tmp + g * d;
  w.acc2 = rotates ? w.acc + g * d : w.acc;
  w.m = w.acc + 2 * g * d;
  w.l = w.m + g;
  return w;
}

// Splits n interleaved (scale, zero) pairs, pair k = (row r, group j) with k = r * groups + j,
// into scale[j * rows + r] and zero[j * rows + r]: one contiguous vector per group.
template <class Ops>
KVCTL_HOST_DEVICE inline void SplitPairs(const float* pairs, int rows, int groups, float* scale,
                                         float* zero) {
  for (int j = 0; j < groups; ++j) {
    for (int r = LaneOf<Ops>(); r < rows; r += LanesOf<Ops>()) {
      scale[j * rows + r] = pairs[2 * (r * groups + j)];
      zero[j * rows + r] = pairs[2 * (r * groups + j) + 1];
    }
  }
  SyncLanes<Ops>();
}

// out[i] = sum_k a[i][k] * x[k] for the g rows of a (stride n): a dot product per query row.
template <class Ops>
KVCTL_HOST_DEVICE inline void RowDots(const float* a, int n, const float* x, int g, float* out) {
  Ops::TokenDots(reinterpret_cast<const uint8_t*>(x), 0, kF32, 1, n, a, n, g, out, 1);
}

// TurboQuant: tile[t][c] = centroid[code(t, c)], the record's K or V rows in the rotated unit-norm
// frame (docs/algorithms.md §20.5); lanes over tokens.
template <class Ops>
KVCTL_HOST_DEVICE inline void TurboTile(const uint8_t* codes, int bits, int gt, int d,
                                        const TurboCodebook& cb, float* tile) {
  const int row_bytes = block::RowBytes(d, bits);
  for (int t = LaneOf<Ops>(); t < gt; t += LanesOf<Ops>()) {
    const uint8_t* row = codes + t * row_bytes;
    for (int c = 0; c < d; ++c) tile[t * d + c] = cb.centroid[block::GetCode(row, c, bits)];
  }
  SyncLanes<Ops>();
}

// Scores of one record for the g prepared query rows (w.qr: rotated and scaled), into w.scores.
// KIVI / OScaR: per K group j, coef = q ⊙ scale[., j], consts = q · zero[., j]; OScaR then
// multiplies by the stored token norm. KVarN: q' = q ⊙ sK, c0 = q · zK,
// score = tK ⊙ (q'·codes + c0). QuaRot: score = scale_t (q · codes_t) + min_t sum(q).
// TurboQuant: score = n_t (q · centroid[codes_t]), q rotated with the random signs (§20.5).
// The derivation of each: docs/algorithms.md §9.2.
template <class Ops>
KVCTL_HOST_DEVICE inline void RecordScores(const QuantSpec& s, const BlockLayout& l,
                                           const uint8_t* rec, const float* norms, int g,
                                           const Work& w) {
  const int gt = s.block_tokens, d = s.head_dim;
  const int l0 = LaneOf<Ops>(), ln = LanesOf<Ops>();
  const uint8_t* kc = rec + l.k_codes_offset;
  const uint8_t* km = rec + l.k_meta_offset;
  switch (s.method) {
    case QuantMethod::kFp16:
      Ops::TokenDots(kc, 2 * d, kF16, gt, d, w.qr, d, g, w.scores, gt);
      return;
    case QuantMethod::kQuaRot: {
      Ops::TokenDots(kc, block::RowBytes(d, s.k_bits), s.k_bits, gt, d, w.qr, d, g, w.scores, gt);
      Ops::LoadHalves(km, 2 * gt, w.meta);  // (scale, min) per token.
      for (int i = 0; i < g; ++i) {
        float* sc = w.scores + i * gt;
        for (int t = l0; t < gt; t += ln) {
          sc[t] = w.meta[2 * t] * sc[t] + w.meta[2 * t + 1] * w.qsum[i];
        }
      }
      SyncLanes<Ops>();
      return;
    }
    case QuantMethod::kKivi:
    case QuantMethod::kOscar: {
      const int kg = s.k_group_tokens, groups = gt / kg;
      float* scale = w.meta + 2 * d * groups;
      float* zero = scale + d * groups;
      Ops::LoadHalves(km, 2 * d * groups, w.meta);  // [D][groups] x (scale, zero).
      SplitPairs<Ops>(w.meta, d, groups, scale, zero);
      for (int j = 0; j < groups; ++j) {
        const float* sj = scale + j * d;
        for (int i = 0; i < g; ++i) {
          for (int c = l0; c < d; c += ln) w.coef[i * d + c] = w.qr[i * d + c] * sj[c];
        }
        SyncLanes<Ops>();
        RowDots<Ops>(w.qr, d, zero + j * d, g, w.consts);
        Ops::ChannelDots(kc, block::RowBytes(gt, s.k_bits), s.k_bits, d, j * kg, kg, w.coef, d, g,
                         w.scores + j * kg, gt);
        for (int i = 0; i < g; ++i) {
          float* sc = w.scores + i * gt + j * kg;
          for (int t = l0; t < kg; t += ln) sc[t] += w.consts[i];
        }
        SyncLanes<Ops>();
      }
      if (s.method == QuantMethod::kOscar) {
        for (int i = 0; i < g; ++i) {
          for (int t = l0; t < gt; t += ln) w.scores[i * gt + t] *= norms[t];
        }
        SyncLanes<Ops>();
      }
      return;
    }
    case QuantMethod::kKvarn: {
      Ops::LoadHalves(km, 2 * d + gt, w.meta);  // sK[D] | zK[D] | tK[G].
      const float* sk = w.meta;
      const float* zk = w.meta + d;
      const float* tk = w.meta + 2 * d;
      for (int i = 0; i < g; ++i) {
        for (int c = l0; c < d; c += ln) w.coef[i * d + c] = w.qr[i * d + c] * sk[c];
      }
      SyncLanes<Ops>();
      RowDots<Ops>(w.qr, d, zk, g, w.consts);
      Ops::ChannelDots(kc, block::RowBytes(gt, s.k_bits), s.k_bits, d, 0, gt, w.coef, d, g,
                       w.scores, gt);
      for (int i = 0; i < g; ++i) {
        float* sc = w.scores + i * gt;
        for (int t = l0; t < gt; t += ln) sc[t] = tk[t] * (sc[t] + w.consts[i]);
      }
      SyncLanes<Ops>();
      return;
    }
    case QuantMethod::kTurbo: {
      float* tile = w.meta + gt;
      Ops::LoadHalves(km, gt, w.meta);  // n[G].
      TurboTile<Ops>(kc, s.k_bits, gt, d, l.turbo_k, tile);
      Ops::TokenDots(reinterpret_cast<const uint8_t*>(tile), 4 * d, kF32, gt, d, w.qr, d, g,
                     w.scores, gt);
      for (int i = 0; i < g; ++i) {
        for (int t = l0; t < gt; t += ln) w.scores[i * gt + t] *= w.meta[t];
      }
      SyncLanes<Ops>();
      return;
    }
  }
}

// acc[i] += sum_t p[i][t] * V_hat[t] (rotated frame for rotating methods), p = w.scores.
// KIVI / QuaRot / OScaR: per V group j, weights p ⊙ scale[., j] over the codes plus
// sum_t p_t zero[t, j] on the group's channels. KVarN (docs/algorithms.md §9.3):
// out_d += uV[d] (sum_t (p_t sV[t]) code[t, d] + sum_t p_t zV[t]). TurboQuant (§20.5):
// acc += sum_t (p_t n_t) centroid[codes_t], rotated back once in Finalize.
template <class Ops>
KVCTL_HOST_DEVICE inline void RecordAccumulateV(const QuantSpec& s, const BlockLayout& l,
                                                const uint8_t* rec, int g, const Work& w) {
  const int gt = s.block_tokens, d = s.head_dim;
  const int l0 = LaneOf<Ops>(), ln = LanesOf<Ops>();
  const uint8_t* vc = rec + l.v_codes_offset;
  const uint8_t* vm = rec + l.v_meta_offset;
  const float* p = w.scores;
  switch (s.method) {
    case QuantMethod::kFp16:
      Ops::TokenAxpys(vc, 2 * d, kF16, gt, 0, d, p, gt, g, w.acc, d);
      return;
    case QuantMethod::kKivi:
    case QuantMethod::kQuaRot:
    case QuantMethod::kOscar: {
      const int vg = s.method == QuantMethod::kQuaRot ? d : s.v_group_channels;
      const int groups = d / vg;
      float* scale = w.meta + 2 * gt * groups;
      float* zero = scale + gt * groups;
      Ops::LoadHalves(vm, 2 * gt * groups, w.meta);  // [G][groups] x (scale, zero).
      SplitPairs<Ops>(w.meta, gt, groups, scale, zero);
      for (int j = 0; j < groups; ++j) {
        const float* sj = scale + j * gt;
        for (int i = 0; i < g; ++i) {
          for (int t = l0; t < gt; t += ln) w.coef[i * gt + t] = p[i * gt + t] * sj[t];
        }
        SyncLanes<Ops>();
        RowDots<Ops>(p, gt, zero + j * gt, g, w.consts);
        Ops::TokenAxpys(vc, block::RowBytes(d, s.v_bits), s.v_bits, gt, j * vg, vg, w.coef, gt, g,
                        w.acc + j * vg, d);
        for (int i = 0; i < g; ++i) {
          float* a = w.acc + i * d + j * vg;
          for (int c = l0; c < vg; c += ln) a[c] += w.consts[i];
        }
        SyncLanes<Ops>();
      }
      return;
    }
    case QuantMethod::kKvarn: {
      Ops::LoadHalves(vm, d + 2 * gt, w.meta);  // uV[D] | sV[G] | zV[G].
      const float* uv = w.meta;
      const float* sv = w.meta + d;
      const float* zv = w.meta + d + gt;
      for (int i = 0; i < g; ++i) {
        for (int t = l0; t < gt; t += ln) w.coef[i * gt + t] = p[i * gt + t] * sv[t];
        for (int c = l0; c < d; c += ln) w.tmp[i * d + c] = 0.0f;
      }
      SyncLanes<Ops>();
      RowDots<Ops>(p, gt, zv, g, w.consts);
      Ops::TokenAxpys(vc, block::RowBytes(d, s.v_bits), s.v_bits, gt, 0, d, w.coef, gt, g, w.tmp,
                      d);
      for (int i = 0; i < g; ++i) {
        float* a = w.acc + i * d;
        const float* tmp = w.tmp + i * d;
        for (int c = l0; c < d; c += ln) a[c] += uv[c] * (tmp[c] + w.consts[i]);
      }
      SyncLanes<Ops>();
      return;
    }
    case QuantMethod::kTurbo: {
      float* tile = w.meta + gt;
      Ops::LoadHalves(vm, gt, w.meta);  // n[G].
      TurboTile<Ops>(vc, s.v_bits, gt, d, l.turbo_v, tile);
      for (int i = 0; i < g; ++i) {
        for (int t = l0; t < gt; t += ln) w.coef[i * gt + t] = p[i * gt + t] * w.meta[t];
      }
      SyncLanes<Ops>();
      Ops::TokenAxpys(reinterpret_cast<const uint8_t*>(tile), 4 * d, kF32, gt, 0, d, w.coef, gt, g,
                      w.acc, d);
      return;
    }
  }
}

// Online softmax over n new scores per row (w.scores, row stride `stride`): updates the running
// max and sum, turns the scores into weights exp(s - m_new) and rescales both accumulators by
// exp(m_old - m_new) where the max moved. Cooperative policies: MaxOf and ExpSum return the same
// value in every lane, so m_new and alpha agree; lane 0 writes m and l after every lane read them.
template <class Ops>
KVCTL_HOST_DEVICE inline void SoftmaxUpdate(int g, int d, int n, int stride, const Work& w) {
  const int l0 = LaneOf<Ops>(), ln = LanesOf<Ops>();
  for (int i = 0; i < g; ++i) {
    float* sc = w.scores + i * stride;
    const float m_old = w.m[i];
    const float l_old = w.l[i];
    const float m_new = fmaxf(m_old, Ops::MaxOf(sc, n));
    const float alpha = expf(m_old - m_new);  // exp(-inf) = 0 on the first update.
    const float sum = Ops::ExpSum(sc, n, m_new);
    if (l0 == 0) {
      w.l[i] = l_old * alpha + sum;
      w.m[i] = m_new;
    }
    if (alpha != 1.0f) {
      for (int c = l0; c < d; c += ln) w.acc[i * d + c] *= alpha;
      if (w.acc2 != w.acc) {
        for (int c = l0; c < d; c += ln) w.acc2[i * d + c] *= alpha;
      }
    }
  }
  SyncLanes<Ops>();
}

// Scales and (for rotating methods) rotates the query rows; zeroes the state. TurboQuant's rotation
// is H (s ⊙ q) (§20.5).
template <class Ops>
KVCTL_HOST_DEVICE inline void Prepare(const Problem& p, const Work& w) {
  const int g = p.group, d = p.spec.head_dim;
  const int l0 = LaneOf<Ops>(), ln = LanesOf<Ops>();
  for (int i = l0; i < g * d; i += ln) w.qs[i] = p.q[i] * p.scale;
  SyncLanes<Ops>();
  if (p.rotates) {
    const bool signs = p.spec.method == QuantMethod::kTurbo;
    for (int i = l0; i < g * d; i += ln) {
      w.qr[i] = signs && block::TurboSignNegative(i % d) ? -w.qs[i] : w.qs[i];
    }
    SyncLanes<Ops>();
    for (int i = 0; i < g; ++i) Ops::Fwht(w.qr + i * d, d);
  }
  for (int i = l0; i < g; i += ln) {
    float s = 0.0f;
    for (int c = 0; c < d; ++c) s += w.qr[i * d + c];
    w.qsum[i] = s;
    w.m[i] = -INFINITY;
    w.l[i] = 0.0f;
  }
  for (int i = l0; i < g * d; i += ln) w.acc[i] = 0.0f;
  if (w.acc2 != w.acc) {
    for (int i = l0; i < g * d; i += ln) w.acc2[i] = 0.0f;
  }
  SyncLanes<Ops>();
}

// One record: scores, online softmax, V. The unit a CUDA split-K kernel assigns to a worker.
template <class Ops>
KVCTL_HOST_DEVICE inline void AttendRecord(const Problem& p, const uint8_t* rec, const float* norms,
                                           const Work& w) {
  const QuantSpec& s = p.spec;
  RecordScores<Ops>(s, p.layout, rec, norms, p.group, w);
  SoftmaxUpdate<Ops>(p.group, s.head_dim, s.block_tokens, s.block_tokens, w);
  RecordAccumulateV<Ops>(s, p.layout, rec, p.group, w);
}

// Window rows [r0, r0 + n), n <= block_tokens: scored with the unrotated query, accumulated in the
// engine frame.
template <class Ops>
KVCTL_HOST_DEVICE inline void AttendWindowChunk(const Problem& p, int64_t r0, int n,
                                                const Work& w) {
  const int d = p.spec.head_dim, gt = p.spec.block_tokens, g = p.group;
  Ops::TokenDots(p.window_k + r0 * p.window_k_row_bytes, p.window_k_row_bytes, p.window_k_format, n,
                 d, w.qs, d, g, w.scores, gt);
  SoftmaxUpdate<Ops>(g, d, n, gt, w);
  Ops::TokenAxpys(p.window_v + r0 * p.window_v_row_bytes, p.window_v_row_bytes, p.window_v_format,
                  n, 0, d, w.scores, gt, g, w.acc2, d);
}

// out = (H acc + acc2) / l for rotating methods (TurboQuant: s ⊙ H acc in place of H acc), acc / l
// otherwise; lse = m + log(l). A row that saw no token gets out = 0 and lse = -inf (an empty
// split-K part).
template <class Ops>
KVCTL_HOST_DEVICE inline void Finalize(const Problem& p, const Work& w) {
  const int d = p.spec.head_dim;
  const int l0 = LaneOf<Ops>(), ln = LanesOf<Ops>();
  for (int i = 0; i < p.group; ++i) {
    float* out = p.out + i * d;
    if (!(w.l[i] > 0.0f)) {
      for (int c = l0; c < d; c += ln) out[c] = 0.0f;
      if (l0 == 0) p.lse[i] = -INFINITY;
      continue;
    }
    for (int c = l0; c < d; c += ln) out[c] = w.acc[i * d + c];
    SyncLanes<Ops>();
    if (p.rotates) {
      Ops::Fwht(out, d);
      const bool signs = p.spec.method == QuantMethod::kTurbo;
      for (int c = l0; c < d; c += ln) {
        out[c] = (signs && block::TurboSignNegative(c) ? -out[c] : out[c]) + w.acc2[i * d + c];
      }
    }
    const float inv = 1.0f / w.l[i];
    for (int c = l0; c < d; c += ln) out[c] *= inv;
    if (l0 == 0) p.lse[i] = w.m[i] + logf(w.l[i]);
  }
  SyncLanes<Ops>();
}

// The whole single-query attention of one (layer, KV head) over window + records.
template <class Ops>
KVCTL_HOST_DEVICE inline void Attend(const Problem& p) {
  const Work w = CarveWork(p.spec, p.group, p.rotates, p.scratch);
  Prepare<Ops>(p, w);
  const int gt = p.spec.block_tokens;
  for (int64_t r0 = 0; r0 < p.window_rows; r0 += gt) {
    const int64_t left = p.window_rows - r0;
    AttendWindowChunk<Ops>(p, r0, static_cast<int>(left < gt ? left : gt), w);
  }
  for (int64_t r = 0; r < p.num_records; ++r) {
    AttendRecord<Ops>(p, p.records[r], p.norms ? p.norms[r] : nullptr, w);
  }
  Finalize<Ops>(p, w);
}

// Merges split-K parts: out = sum_k e^(lse_k - M) out_k / sum_k e^(lse_k - M), lse = M + log(sum).
// Parts with lse = -inf (no tokens) weigh nothing; if all are empty, out = 0 and lse = -inf.
KVCTL_HOST_DEVICE inline void MergeParts(int g, int d, int parts, const float* const* outs,
                                         const float* const* lses, float* out, float* lse) {
  for (int i = 0; i < g; ++i) {
    float m = -INFINITY;
    for (int k = 0; k < parts; ++k) m = fmaxf(m, lses[k][i]);
    for (int c = 0; c < d; ++c) out[i * d + c] = 0.0f;
    if (m == -INFINITY) {
      lse[i] = -INFINITY;
      continue;
    }
    float sum = 0.0f;
    for (int k = 0; k < parts; ++k) {
      const float wk = expf(lses[k][i] - m);
      sum += wk;
      for (int c = 0; c < d; ++c) out[i * d + c] += wk * outs[k][i * d + c];
    }
    const float inv = 1.0f / sum;
    for (int c = 0; c < d; ++c) out[i * d + c] *= inv;
    lse[i] = m + logf(sum);
  }
}

}  // namespace kvctl::attn

#endif  // KVCTL_KERNELS_ATTENTION_BLOCK_H_
