// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_block.h"
#include "kernels/quantize.h"

namespace kvctl {
namespace attn {
// The SIMD instances (attention_simd_avx2.cc, attention_simd_avx512.cc): Attend<Ops> with
// register-blocked primitives. Only called when the CPU has the ISA.
void AttendAvx2(const Problem& p);
void AttendAvx512(const Problem& p);
}  // namespace attn

namespace {

bool CpuHasFma() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

Status ValidateWindow(const QuantSpec& spec, const AttentionKv& kv) {
  const KvTensorView& k = kv.window_k;
  const KvTensorView& v = kv.window_v;
  if (k.tokens != v.tokens) {
    return InvalidArgument("window_v.tokens: got ", v.tokens, ", expected window_k.tokens ",
                           k.tokens);
  }
  if (k.tokens == 0) return OkStatus();
  for (const auto& [view, name] : {std::pair{&k, "window_k"}, std::pair{&v, "window_v"}}) {
    KVCTL_RETURN_IF_ERROR(view->Validate(name));
    if (view->head_dim != spec.head_dim) {
      return InvalidArgument(name, ".head_dim: got ", view->head_dim, ", expected ", spec.head_dim,
                             " (the spec's head_dim)");
    }
    if (kv.window_head < 0 || kv.window_head >= view->heads) {
      return InvalidArgument("window_head: got ", kv.window_head, ", expected 0..", view->heads - 1,
                             " (", name, ".heads = ", view->heads, ")");
    }
  }
  return OkStatus();
}

attn::Problem MakeProblem(const QuantSpec& spec, const AttentionKv& kv, const AttentionQuery& q,
                          const AttentionResult& r, float* scratch) {
  attn::Problem p;
  p.spec = spec;
  p.layout = BlockLayoutOf(spec);
  p.rotates = TraitsOf(spec.method).rotates;
  p.records = kv.records;
  p.norms = spec.method == QuantMethod::kOscar ? kv.record_norms : nullptr;
  p.num_records = kv.num_records;
  p.window_rows = kv.window_k.tokens;
  if (p.window_rows > 0) {
    const KvTensorView& k = kv.window_k;
    const KvTensorView& v = kv.window_v;
    const int64_t ks = static_cast<int64_t>(DTypeSize(k.dtype));
    const int64_t vs = static_cast<int64_t>(DTypeSize(v.dtype));
    p.window_k = static_cast<const uint8_t*>(k.data) + kv.window_head * k.head_stride * ks;
    p.window_v = static_cast<const uint8_t*>(v.data) + kv.window_head * v.head_stride * vs;
    p.window_k_row_bytes = k.token_stride * ks;
    p.window_v_row_bytes = v.token_stride * vs;
    p.window_k_format = attn::WindowFormat(k.dtype);
    p.window_v_format = attn::WindowFormat(v.dtype);
  }
  p.q = q.q;
  p.group = q.group;
  p.scale = q.scale;
  p.out = r.out;
  p.lse = r.lse;
  p.scratch = scratch;
  return p;
}

enum class Path { kScalar, kAvx2, kAvx512 };

Status Run(const QuantSpec& spec, const AttentionKv& kv, const AttentionQuery& query,
           const AttentionResult& result, Path path) {
  KVCTL_RETURN_IF_ERROR(ValidateAttention(spec, kv, query, result));
  std::vector<float> scratch(static_cast<size_t>(attn::ScratchFloats(spec, query.group)));
  const attn::Problem p = MakeProblem(spec, kv, query, result, scratch.data());
  switch (path) {
    case Path::kAvx512:
      attn::AttendAvx512(p);
      break;
    case Path::kAvx2:
      attn::AttendAvx2(p);
      break;
    case Path::kScalar:
      attn::Attend<attn::ScalarOps>(p);
      break;
  }
  return OkStatus();
}

}  // namespace

Status ValidateAttention(const QuantSpec& spec, const AttentionKv& kv, const AttentionQuery& query,
                         const AttentionResult& result) {
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  if (kv.num_records < 0) {
    return InvalidArgument("num_records: got ", kv.num_records, ", expected >= 0");
  }
  if (kv.num_records > 0 && kv.records == nullptr) {
    return InvalidArgument("records: got null with num_records = ", kv.num_records);
  }
  const bool oscar = spec.method == QuantMethod::kOscar;
  if (!oscar && kv.record_norms != nullptr) {
    return InvalidArgument("record_norms: got non-null for ", QuantMethodName(spec.method),
                           ", expected null (only oscar stores token norms)");
  }
  if (oscar && kv.num_records > 0 && kv.record_norms == nullptr) {
    return InvalidArgument("record_norms: got null, expected ", kv.num_records,
                           " norm pointers for oscar");
  }
  for (int64_t r = 0; r < kv.num_records; ++r) {
    if (kv.records[r] == nullptr) {
      return InvalidArgument("records[", r, "]: got null, expected a record");
    }
    if (oscar && kv.record_norms[r] == nullptr) {
      return InvalidArgument("record_norms[", r, "]: got null, expected ", spec.block_tokens,
                             " fp32 norms");
    }
  }
  KVCTL_RETURN_IF_ERROR(ValidateWindow(spec, kv));
  if (query.q == nullptr) return InvalidArgument("query.q: got null, expected [group, head_dim]");
  if (query.group < 1 || query.group > kMaxAttentionGroup) {
    return InvalidArgument("query.group: got ", query.group, ", expected 1..", kMaxAttentionGroup);
  }
  if (!(query.scale > 0.0f) || !std::isfinite(query.scale)) {
    return InvalidArgument("query.scale: got ", query.scale, ", expected a finite value > 0");
  }
  for (int i = 0; i < query.group * spec.head_dim; ++i) {
    if (!std::isfinite(query.q[i])) {
      return InvalidArgument("query.q: row ", i / spec.head_dim, " channel ", i % spec.head_dim,
                             " is ", query.q[i], ", expected a finite value");
    }
  }
  if (result.out == nullptr) return InvalidArgument("result.out: got null");
  if (result.lse == nullptr) return InvalidArgument("result.lse: got null");
  return OkStatus();
}

Status DecodeAttentionRef(const QuantSpec& spec, const AttentionKv& kv, const AttentionQuery& query,
                          const AttentionResult& result) {
  return Run(spec, kv, query, result, Path::kScalar);
}

Status DecodeAttention(const QuantSpec& spec, const AttentionKv& kv, const AttentionQuery& query,
                       const AttentionResult& result) {
  static const bool fma = CpuHasFma();
  Path path = Path::kScalar;
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      path = Path::kAvx512;
      break;
    case SimdLevel::kAvx2:
      path = fma ? Path::kAvx2 : Path::kScalar;
      break;
    case SimdLevel::kScalar:
      break;
  }
  return Run(spec, kv, query, result, path);
}

AttentionKv AttentionPart(const AttentionKv& kv, int64_t first, int64_t count, bool with_window) {
  AttentionKv part = kv;
  if (first < 0 || count < 0 || first > kv.num_records - count) {
    part.num_records = -1;
    return part;
  }
  part.records = kv.records ? kv.records + first : nullptr;
  part.record_norms = kv.record_norms ? kv.record_norms + first : nullptr;
  part.num_records = count;
  if (!with_window) {
    part.window_k = KvTensorView{};
    part.window_v = KvTensorView{};
    part.window_head = 0;
  }
  return part;
}

Status MergeAttentionParts(int group, int head_dim, int parts, const float* const* outs,
                           const float* const* lses, const AttentionResult& result) {
  if (group < 1 || group > kMaxAttentionGroup) {
    return InvalidArgument("group: got ", group, ", expected 1..", kMaxAttentionGroup);
  }
  if (head_dim < 1) return InvalidArgument("head_dim: got ", head_dim, ", expected >= 1");
  if (parts < 1) return InvalidArgument("parts: got ", parts, ", expected >= 1");
  if (outs == nullptr || lses == nullptr) {
    return InvalidArgument("outs/lses: got null, expected ", parts, " pointers each");
  }
  for (int k = 0; k < parts; ++k) {
    if (outs[k] == nullptr || lses[k] == nullptr) {
      return InvalidArgument("part ", k, ": got a null out or lse pointer");
    }
    for (int i = 0; i < group; ++i) {
      if (std::isnan(lses[k][i]) || lses[k][i] == INFINITY) {
        return InvalidArgument("lses[", k, "][", i, "]: got ", lses[k][i],
                               ", expected a finite value or -inf");
      }
    }
  }
  if (result.out == nullptr || result.lse == nullptr) {
    return InvalidArgument("result: got a null out or lse pointer");
  }
  attn::MergeParts(group, head_dim, parts, outs, lses, result.out, result.lse);
  return OkStatus();
}

Status DecodeAttentionSplitK(const QuantSpec& spec, const AttentionKv& kv,
                             const AttentionQuery& query, int splits,
                             const AttentionResult& result) {
  if (splits < 1) return InvalidArgument("splits: got ", splits, ", expected >= 1");
  KVCTL_RETURN_IF_ERROR(ValidateAttention(spec, kv, query, result));
  const size_t rows = static_cast<size_t>(query.group);
  const size_t d = static_cast<size_t>(spec.head_dim);
  std::vector<float> outs(splits * rows * d), lses(splits * rows);
  std::vector<const float*> out_ptrs(splits), lse_ptrs(splits);
  const int64_t n = kv.num_records;
  for (int k = 0; k < splits; ++k) {
    const int64_t first = n * k / splits, last = n * (k + 1) / splits;
    const AttentionKv part = AttentionPart(kv, first, last - first, k == splits - 1);
    float* out = outs.data() + k * rows * d;
    float* lse = lses.data() + k * rows;
    KVCTL_RETURN_IF_ERROR(DecodeAttention(spec, part, query, {out, lse}));
    out_ptrs[k] = out;
    lse_ptrs[k] = lse;
  }
  return MergeAttentionParts(query.group, spec.head_dim, splits, out_ptrs.data(), lse_ptrs.data(),
                             result);
}

}  // namespace kvctl
