// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/block_codec.h
// Encode and decode one block record per method from fp32 rows, in the layout of BlockLayoutOf()
// (documented in kernels/README.md). KVCTL_HOST_DEVICE: the CPU reference loops over records with
// these functions and the CUDA kernels call the very same ones (a warp or a thread per record).
//
// EncodeRecord REQUIRES: a validated spec, its layout, finite inputs, positive finite token norms
// for OScaR, a zeroed record and ScratchFloats(spec) floats of scratch. Returns false when stored
// fp16 metadata would overflow (the caller turns that into an error); the record is then invalid.
//
// Lanes: the encoders take a LaneSplit (kernels/quant_block.h). A caller with lanes > 1 (the CUDA
// warp-per-record encoder) runs the same call on every lane; lane l encodes rows l, l + lanes, ...
// of each code section (and computes KVarN's Sinkhorn statistics for those rows / columns), each
// exactly as the single-lane loop does (same bytes: rows never share a byte, and each row's
// metadata is its own), and `sync` is called where a lane reads what another lane wrote. The
// default (one lane, no sync) is the CPU reference's plain loop.
#ifndef KVCTL_KERNELS_BLOCK_CODEC_H_
#define KVCTL_KERNELS_BLOCK_CODEC_H_

#include "kernels/quant_block.h"

namespace kvctl::block {

KVCTL_HOST_DEVICE inline int64_t ScratchFloats(const QuantSpec& s) {
  return 2 * static_cast<int64_t>(s.block_tokens) * s.head_dim + 8 * (s.block_tokens + s.head_dim);
}

KVCTL_HOST_DEVICE inline int RowBytes(int n, int bits) { return n * bits / 8; }

// Copies `g` rows of `d` floats (source stride `stride`) into dst and rotates each row.
KVCTL_HOST_DEVICE inline void LoadRotated(const float* src, int64_t stride, int g, int d,
                                          float* dst, LaneSplit ls = {}) {
  for (int t = ls.lane; t < g; t += ls.lanes) {
    for (int c = 0; c < d; ++c) dst[t * d + c] = src[t * stride + c];
    FwhtRow(dst + t * d, d);
  }
}

// Per-channel groups along tokens (K of KIVI and OScaR): x[t * stride + c], rows = channels.
template <bool kOscar>
KVCTL_HOST_DEVICE inline bool EncodeChannelGroups(const float* x, int64_t stride, int g, int d,
                                                  int group, int bits, uint8_t* codes,
                                                  uint8_t* meta, LaneSplit ls = {}) {
  const float levels = static_cast<float>((1 << bits) - 1);
  const int groups = g / group;
  bool ok = true;
  for (int c = ls.lane; c < d; c += ls.lanes) {
    uint8_t* row = codes + c * RowBytes(g, bits);
    for (int j = 0; j < groups; ++j) {
      const int t0 = j * group;
      float lo = x[t0 * stride + c], hi = lo;
      for (int t = t0 + 1; t < t0 + group; ++t) {
        lo = fminf(lo, x[t * stride + c]);
        hi = fmaxf(hi, x[t * stride + c]);
      }
      lo += 0.0f, hi += 0.0f;
      Affine a;
      if constexpr (kOscar) {
        OscarAffine p;
        ok &= OscarParams(lo, hi, bits, &p);
        for (int t = t0; t < t0 + group; ++t)
          PutCode(row, t, bits, OscarCode(x[t * stride + c], p, levels));
        a = p.a;
      } else {
        ok &= MinMaxAffine(lo, hi, bits, &a);
        const float inv = a.scale > 0.0f ? 1.0f / a.scale : 0.0f;
        for (int t = t0; t < t0 + group; ++t) {
          PutCode(row, t, bits, MinMaxCode(x[t * stride + c], a, inv, levels));
        }
      }
      StoreHalf(meta, 2 * (c * groups + j), a.scale);
      StoreHalf(meta, 2 * (c * groups + j) + 1, a.zero);
    }
  }
  return ok;
}

// Per-token groups along channels (V of KIVI/OScaR, K and V of QuaRot): rows = tokens.
template <bool kOscar>
KVCTL_HOST_DEVICE inline bool EncodeTokenGroups(const float* x, int64_t stride, int g, int d,
                                                int group, int bits, uint8_t* codes, uint8_t* meta,
                                                LaneSplit ls = {}) {
  const float levels = static_cast<float>((1 << bits) - 1);
  const int groups = d / group;
  bool ok = true;
  for (int t = ls.lane; t < g; t += ls.lanes) {
    const float* r = x + t * stride;
    uint8_t* row = codes + t * RowBytes(d, bits);
    for (int j = 0; j < groups; ++j) {
      const int c0 = j * group;
      float lo = r[c0], hi = lo;
      for (int c = c0 + 1; c < c0 + group; ++c) lo = fminf(lo, r[c]), hi = fmaxf(hi, r[c]);
      lo += 0.0f, hi += 0.0f;
      Affine a;
      if constexpr (kOscar) {
        OscarAffine p;
        ok &= OscarParams(lo, hi, bits, &p);
        for (int c = c0; c < c0 + group; ++c) PutCode(row, c, bits, OscarCode(r[c], p, levels));
        a = p.a;
      } else {
        ok &= MinMaxAffine(lo, hi, bits, &a);
        const float inv = a.scale > 0.0f ? 1.0f / a.scale : 0.0f;
        for (int c = c0; c < c0 + group; ++c)
          PutCode(row, c, bits, MinMaxCode(r[c], a, inv, levels));
      }
      StoreHalf(meta, 2 * (t * groups + j), a.scale);
      StoreHalf(meta, 2 * (t * groups + j) + 1, a.zero);
    }
  }
  return ok;
}

KVCTL_HOST_DEVICE inline void DecodeChannelGroups(const uint8_t* codes, const uint8_t* meta, int g,
                                                  int d, int group, int bits, float* out) {
  const int groups = g / group;
  for (int c = 0; c < d; ++c) {
    const uint8_t* row = codes + c * RowBytes(g, bits);
    for (int t = 0; t < g; ++t) {
      const int j = t / group;
      const float scale = LoadHalf(meta, 2 * (c * groups + j));
      const float zero = LoadHalf(meta, 2 * (c * groups + j) + 1);
      out[t * d + c] = static_cast<float>(GetCode(row, t, bits)) * scale + zero;
    }
  }
}

KVCTL_HOST_DEVICE inline void DecodeTokenGroups(const uint8_t* codes, const uint8_t* meta, int g,
                                                int d, int group, int bits, float* out) {
  const int groups = d / group;
  for (int t = 0; t < g; ++t) {
    const uint8_t* row = codes + t * RowBytes(d, bits);
    for (int c = 0; c < d; ++c) {
      const int j = c / group;
      const float scale = LoadHalf(meta, 2 * (t * groups + j));
      const float zero = LoadHalf(meta, 2 * (t * groups + j) + 1);
      out[t * d + c] = static_cast<float>(GetCode(row, c, bits)) * scale + zero;
    }
  }
}

// KVarN tile (rows x cols, row-major in x): Sinkhorn, then RTN per row of the balanced tile with
// folded fp16 scales: row_scale[i] = r*[i] * delta_i, row_zero[i] = r*[i] * lo_i, col[j] = c*[j].
// Scratch: y[rows * cols] (must not alias x) and vecs[6 * (rows + cols)]. Lanes: x must be
// complete (synced) on entry; returns with every lane done (ends with sync).
template <class Sync = NoSync>
KVCTL_HOST_DEVICE inline bool EncodeKvarnTile(const float* x, int rows, int cols, int bits,
                                              int iters, float* y, float* vecs, uint8_t* codes,
                                              uint8_t* row_scale, uint8_t* row_zero,
                                              uint8_t* col_scale, LaneSplit ls = {},
                                              Sync sync = {}) {
  SinkhornScratch s;
  s.lr = vecs;
  s.lc = s.lr + rows;
  s.er = s.lc + cols;
  s.ec = s.er + rows;
  s.ir = s.ec + cols;
  s.ic = s.ir + rows;
  s.rp = s.ic + cols;
  s.cp = s.rp + rows;
  s.rs = s.cp + cols;
  s.cs = s.rs + rows;
  float* r_best = s.cs + cols;
  float* c_best = r_best + rows;
  Sinkhorn(x, rows, cols, iters, s, r_best, c_best, ls, sync);
  for (int i = ls.lane; i < rows; i += ls.lanes) s.ir[i] = 1.0f / r_best[i];
  for (int j = ls.lane; j < cols; j += ls.lanes) s.ic[j] = 1.0f / c_best[j];
  sync();
  ApplyScales(x, rows, cols, s.ir, s.ic, y, ls);
  const float levels = static_cast<float>((1 << bits) - 1);
  bool ok = true;
  for (int i = ls.lane; i < rows; i += ls.lanes) {  // Row i of y: this lane wrote it.
    const float* yi = y + i * cols;
    float lo = yi[0], hi = yi[0];
    for (int j = 1; j < cols; ++j) lo = fminf(lo, yi[j]), hi = fmaxf(hi, yi[j]);
    lo += 0.0f, hi += 0.0f;
    const KvarnRow p = KvarnRowParams(lo, hi, bits);
    uint8_t* row = codes + i * RowBytes(cols, bits);
    for (int j = 0; j < cols; ++j) PutCode(row, j, bits, KvarnCode(yi[j], p, levels));
    const float rs = r_best[i] * p.delta;
    const float rz = r_best[i] * p.lo;
    ok &= FitsHalf(rs) && FitsHalf(rz);
    StoreHalf(row_scale, i, rs);
    StoreHalf(row_zero, i, rz);
  }
  for (int j = ls.lane; j < cols; j += ls.lanes) StoreHalf(col_scale, j, c_best[j]);
  sync();
  return ok;
}

// out[i * cols + j] = (code * row_scale[i] + row_zero[i]) * col_scale[j].
KVCTL_HOST_DEVICE inline void DecodeKvarnTile(const uint8_t* codes, const uint8_t* row_scale,
                                              const uint8_t* row_zero, const uint8_t* col_scale,
                                              int rows, int cols, int bits, float* out) {
  for (int i = 0; i < rows; ++i) {
    const uint8_t* row = codes + i * RowBytes(cols, bits);
    const float rs = LoadHalf(row_scale, i);
    const float rz = LoadHalf(row_zero, i);
    for (int j = 0; j < cols; ++j) {
      out[i * cols + j] =
          (static_cast<float>(GetCode(row, j, bits)) * rs + rz) * LoadHalf(col_scale, j);
    }
  }
}

template <class Sync = NoSync>
KVCTL_HOST_DEVICE inline bool EncodeRecord(const QuantSpec& s, const BlockLayout& l, const float* k,
                                           const float* v, int64_t stride, const float* norms,
                                           float* scratch, uint8_t* rec, LaneSplit ls = {},
                                           Sync sync = {}) {
  const int g = s.block_tokens, d = s.head_dim;
  uint8_t* kc = rec + l.k_codes_offset;
  uint8_t* km = rec + l.k_meta_offset;
  uint8_t* vc = rec + l.v_codes_offset;
  uint8_t* vm = rec + l.v_meta_offset;
  float* kr = scratch;
  float* vr = scratch + g * d;
  switch (s.method) {
    case QuantMethod::kFp16: {
      bool ok = true;
      for (int t = ls.lane; t < g; t += ls.lanes) {
        for (int c = 0; c < d; ++c) {
          ok &= FitsHalf(k[t * stride + c]) && FitsHalf(v[t * stride + c]);
          StoreHalf(kc, t * d + c, k[t * stride + c]);
          StoreHalf(vc, t * d + c, v[t * stride + c]);
        }
      }
      return ok;
    }
    case QuantMethod::kKivi:
      return EncodeChannelGroups<false>(k, stride, g, d, s.k_group_tokens, s.k_bits, kc, km, ls) &
             EncodeTokenGroups<false>(v, stride, g, d, s.v_group_channels, s.v_bits, vc, vm, ls);
    case QuantMethod::kQuaRot:
      // Each lane rotates the token rows it then encodes: no sync needed.
      LoadRotated(k, stride, g, d, kr, ls);
      LoadRotated(v, stride, g, d, vr, ls);
      return EncodeTokenGroups<false>(kr, d, g, d, d, s.k_bits, kc, km, ls) &
             EncodeTokenGroups<false>(vr, d, g, d, d, s.v_bits, vc, vm, ls);
    case QuantMethod::kOscar: {
      LoadRotated(k, stride, g, d, kr, ls);
      for (int t = ls.lane; t < g; t += ls.lanes) {
        const float inv_norm = 1.0f / norms[t];
        for (int c = 0; c < d; ++c) kr[t * d + c] *= inv_norm;
      }
      LoadRotated(v, stride, g, d, vr, ls);
      sync();  // K is encoded per channel: every lane reads every token row.
      return EncodeChannelGroups<true>(kr, d, g, d, s.k_group_tokens, s.k_bits, kc, km, ls) &
             EncodeTokenGroups<true>(vr, d, g, d, s.v_group_channels, s.v_bits, vc, vm, ls);
    }
    case QuantMethod::kKvarn: {
      // K tile is [D channels x G tokens]: transpose the rotated rows into vr's space.
      LoadRotated(k, stride, g, d, kr, ls);
      for (int t = ls.lane; t < g; t += ls.lanes) {  // Token row t: rotated by this lane.
        for (int c = 0; c < d; ++c) vr[c * g + t] = kr[t * d + c];
      }
      sync();
      float* vecs = scratch + 2 * g * d;  // kr is free again and becomes the balanced tile.
      // K record order: sK[D] | zK[D] | tK[G].
      bool ok = EncodeKvarnTile(vr, d, g, s.k_bits, s.sinkhorn_iters, kr, vecs, kc, km, km + 2 * d,
                                km + 4 * d, ls, sync);
      // V tile is [G tokens x D channels]. Record order: uV[D] | sV[G] | zV[G].
      LoadRotated(v, stride, g, d, vr, ls);
      sync();
      ok &= EncodeKvarnTile(vr, g, d, s.v_bits, s.sinkhorn_iters, kr, vecs, vc, vm + 2 * d,
                            vm + 2 * d + 2 * g, vm, ls, sync);
      return ok;
    }
    case QuantMethod::kTurbo: {
      // Per token row (§20.3); lane l encodes tokens l, l + lanes, ... with its own row of scratch.
      bool ok = true;
      const int k_row = RowBytes(d, s.k_bits), v_row = RowBytes(d, s.v_bits);
      for (int t = ls.lane; t < g; t += ls.lanes) {
        const float* kt = k + t * stride;
        const float* vt = v + t * stride;
        ok &= TurboEncodeRow(kt, d, s.k_bits, l.turbo_k, TurboScale::kLeastSquares, kr + t * d,
                             kc + t * k_row, km, t);
        ok &= TurboEncodeRow(vt, d, s.v_bits, l.turbo_v, TurboScale::kUnbiased, vr + t * d,
                             vc + t * v_row, vm, t);
      }
      return ok;
    }
  }
  return false;
}

KVCTL_HOST_DEVICE inline void DecodeRecord(const QuantSpec& s, const BlockLayout& l,
                                           const uint8_t* rec, const float* norms, float* k_out,
                                           float* v_out) {
  const int g = s.block_tokens, d = s.head_dim;
  const uint8_t* kc = rec + l.k_codes_offset;
  const uint8_t* km = rec + l.k_meta_offset;
  const uint8_t* vc = rec + l.v_codes_offset;
  const uint8_t* vm = rec + l.v_meta_offset;
  switch (s.method) {
    case QuantMethod::kFp16:
      for (int i = 0; i < g * d; ++i) k_out[i] = LoadHalf(kc, i);
      for (int i = 0; i < g * d && v_out != nullptr; ++i) v_out[i] = LoadHalf(vc, i);
      return;
    case QuantMethod::kKivi:
      DecodeChannelGroups(kc, km, g, d, s.k_group_tokens, s.k_bits, k_out);
      if (v_out != nullptr) DecodeTokenGroups(vc, vm, g, d, s.v_group_channels, s.v_bits, v_out);
      return;
    case QuantMethod::kQuaRot:
      DecodeTokenGroups(kc, km, g, d, d, s.k_bits, k_out);
      if (v_out != nullptr) DecodeTokenGroups(vc, vm, g, d, d, s.v_bits, v_out);
      break;
    case QuantMethod::kOscar:
      DecodeChannelGroups(kc, km, g, d, s.k_group_tokens, s.k_bits, k_out);
      for (int t = 0; t < g; ++t) {
        for (int c = 0; c < d; ++c) k_out[t * d + c] *= norms[t];
      }
      if (v_out != nullptr) DecodeTokenGroups(vc, vm, g, d, s.v_group_channels, s.v_bits, v_out);
      break;
    case QuantMethod::kTurbo:
      for (int t = 0; t < g; ++t) {
        TurboDecodeRow(kc + t * RowBytes(d, s.k_bits), km, t, d, s.k_bits, l.turbo_k,
                       k_out + t * d);
        if (v_out == nullptr) continue;
        TurboDecodeRow(vc + t * RowBytes(d, s.v_bits), vm, t, d, s.v_bits, l.turbo_v,
                       v_out + t * d);
      }
      return;
    case QuantMethod::kKvarn:
      // K tile [D x G] decodes transposed: write element (c, t) to k_out[t * d + c].
      for (int c = 0; c < d; ++c) {
        const uint8_t* row = kc + c * RowBytes(g, s.k_bits);
        const float rs = LoadHalf(km, c);
        const float rz = LoadHalf(km + 2 * d, c);
        for (int t = 0; t < g; ++t) {
          k_out[t * d + c] =
              (static_cast<float>(GetCode(row, t, s.k_bits)) * rs + rz) * LoadHalf(km + 4 * d, t);
        }
      }
      if (v_out != nullptr) {
        DecodeKvarnTile(vc, vm + 2 * d, vm + 2 * d + 2 * g, vm, g, d, s.v_bits, v_out);
      }
      break;
  }
  for (int t = 0; t < g; ++t) {
    FwhtRow(k_out + t * d, d);
    if (v_out != nullptr) FwhtRow(v_out + t * d, d);
  }
}

}  // namespace kvctl::block

#endif  // KVCTL_KERNELS_BLOCK_CODEC_H_
