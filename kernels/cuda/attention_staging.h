// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/cuda/attention_staging.h
// Host half of DecodeAttentionCudaHost (kernels/cuda/attention_cuda.h): packs the CPU API's inputs
// of several heads (records, OScaR norms, each head's window rows compacted to [rows, D], queries)
// into one image per kind, and builds the record pointer tables and the CudaAttentionHead table
// for wherever those images are placed. Plain host code with no CUDA dependency, so the CPU
// emulation test (tests/kernels_cuda/warp_ops_emulation_test.cc) places the images in host memory
// and runs the kernels' bodies over exactly what the GPU path would upload.
//
// Thread safety: pure functions over caller-owned memory.
//
//   AttentionStaging st;
//   KVCTL_RETURN_IF_ERROR(StageAttention(spec, heads, group, scale, &st));
//   std::vector<const uint8_t*> rec_ptrs(st.total_records);  // placed, then filled:
//   BuildAttentionTables(spec, st, group, placement, rec_ptrs.data(), norm_ptrs.data(), &table);
#ifndef KVCTL_KERNELS_CUDA_ATTENTION_STAGING_H_
#define KVCTL_KERNELS_CUDA_ATTENTION_STAGING_H_

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/quant_types.h"

namespace kvctl {

struct AttentionStaging {
  struct Head {
    size_t rec = 0;   // Byte offset of the head's first record in `records`.
    size_t norm = 0;  // Float offset in `norms` (OScaR).
    size_t wk = 0;    // Byte offsets of its window K and V rows in `windows`.
    size_t wv = 0;
    size_t q = 0;  // Float offset of its [group, D] rows in `q` (and in the output image).
    int64_t num_records = 0;
    int64_t window_rows = 0;
  };
  std::vector<uint8_t> records;  // Every head's records, back to back, in the given order.
  std::vector<float> norms;      // OScaR: block_tokens floats per record.
  std::vector<uint8_t> windows;  // Per head: K rows then V rows, [rows, D] in window_dtype.
  std::vector<float> q;          // [heads][group][D]; the output image has the same shape.
  DType window_dtype = DType::kF32;
  std::vector<Head> heads;
  int64_t total_records = 0;
};

// Validates every head (ValidateAttention, one window dtype for all non-empty windows) and packs.
inline Status StageAttention(const QuantSpec& spec, std::span<const HostAttentionHead> heads,
                             int group, float scale, AttentionStaging* st) {
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  if (heads.empty()) return InvalidArgument("heads: got 0, expected at least one head");
  const BlockLayout layout = BlockLayoutOf(spec);
  const int d = spec.head_dim, gt = spec.block_tokens;
  const bool oscar = spec.method == QuantMethod::kOscar;
  bool have_dtype = false;
  *st = AttentionStaging{};
  st->heads.resize(heads.size());
  for (size_t h = 0; h < heads.size(); ++h) {
    const HostAttentionHead& hh = heads[h];
    KVCTL_RETURN_IF_ERROR(ValidateAttention(spec, hh.kv, {hh.q, group, scale}, hh.result));
    const AttentionKv& kv = hh.kv;
    AttentionStaging::Head& o = st->heads[h];
    o.rec = st->records.size();
    o.norm = st->norms.size();
    o.num_records = kv.num_records;
    st->total_records += kv.num_records;
    for (int64_t r = 0; r < kv.num_records; ++r) {
      st->records.insert(st->records.end(), kv.records[r], kv.records[r] + layout.record_bytes);
      if (oscar) st->norms.insert(st->norms.end(), kv.record_norms[r], kv.record_norms[r] + gt);
    }
    o.window_rows = kv.window_k.tokens;
    if (o.window_rows > 0) {
      if (have_dtype && kv.window_k.dtype != st->window_dtype) {
        return InvalidArgument("heads[", h, "].kv.window_k.dtype: got ",
                               static_cast<int>(kv.window_k.dtype), ", expected ",
                               static_cast<int>(st->window_dtype), " (one window dtype per call)");
      }
      if (kv.window_v.dtype != kv.window_k.dtype) {
        return InvalidArgument("heads[", h, "].kv.window_v.dtype: got ",
                               static_cast<int>(kv.window_v.dtype), ", expected window_k's ",
                               static_cast<int>(kv.window_k.dtype));
      }
      st->window_dtype = kv.window_k.dtype;
      have_dtype = true;
      const size_t es = DTypeSize(st->window_dtype);
      for (const KvTensorView* view : {&kv.window_k, &kv.window_v}) {
        (view == &kv.window_k ? o.wk : o.wv) = st->windows.size();
        const uint8_t* base = static_cast<const uint8_t*>(view->data);
        for (int64_t t = 0; t < o.window_rows; ++t) {
          const uint8_t* row =
              base + (t * view->token_stride + kv.window_head * view->head_stride) * es;
          st->windows.insert(st->windows.end(), row, row + d * es);
        }
      }
    }
    o.q = st->q.size();
    st->q.insert(st->q.end(), hh.q, hh.q + static_cast<size_t>(group) * d);
  }
  return OkStatus();
}

// Addresses of the images once placed (device memory for the GPU path).
struct AttentionPlacement {
  const uint8_t* records = nullptr;
  const float* norms = nullptr;
  const uint8_t* windows = nullptr;
  const float* q = nullptr;
  float* out = nullptr;                      // Same shape as the q image.
  float* lse = nullptr;                      // [heads][group].
  const uint8_t* const* rec_ptrs = nullptr;  // Where the record pointer table will live.
  const float* const* norm_ptrs = nullptr;   // Where the norm pointer table will live (OScaR).
};

// Fills the pointer tables (st.total_records entries each; norm_ptrs only for OScaR, else may be
// null) with placed addresses -- each head's records in reverse order, which softmax must not
// notice -- and the head table (one entry per staged head).
inline void BuildAttentionTables(const QuantSpec& spec, const AttentionStaging& st, int group,
                                 const AttentionPlacement& at, const uint8_t** rec_ptrs,
                                 const float** norm_ptrs, std::vector<CudaAttentionHead>* table) {
  const size_t rb = BlockLayoutOf(spec).record_bytes;
  const int d = spec.head_dim, gt = spec.block_tokens;
  const bool oscar = spec.method == QuantMethod::kOscar;
  table->assign(st.heads.size(), CudaAttentionHead{});
  int64_t next = 0;
  for (size_t h = 0; h < st.heads.size(); ++h) {
    const AttentionStaging::Head& o = st.heads[h];
    CudaAttentionHead& t = (*table)[h];
    if (o.num_records > 0) {
      t.records = at.rec_ptrs + next;
      if (oscar) t.record_norms = at.norm_ptrs + next;
    }
    for (int64_t r = o.num_records - 1; r >= 0; --r, ++next) {
      rec_ptrs[next] = at.records + o.rec + r * rb;
      if (oscar) norm_ptrs[next] = at.norms + o.norm + r * gt;
    }
    t.num_records = o.num_records;
    if (o.window_rows > 0) {
      const int64_t row_bytes = static_cast<int64_t>(d) * DTypeSize(st.window_dtype);
      t.window_k = at.windows + o.wk;
      t.window_v = at.windows + o.wv;
      t.window_k_row_bytes = t.window_v_row_bytes = row_bytes;
      t.window_rows = o.window_rows;
    }
    t.q = at.q + o.q;
    t.out = at.out + o.q;
    t.lse = at.lse + h * group;
  }
}

}  // namespace kvctl

#endif  // KVCTL_KERNELS_CUDA_ATTENTION_STAGING_H_
