// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Lowering the code widths of stored records (KvSequence::LowerWidth) and the pool pressure
// relief built on it (budget.pressure = "requantize", docs/budgets.md).
#include <cstring>

#include "common/half.h"
#include "controller/kv_sequence.h"
#include "controller/kv_sequence_internal.h"
#include "kernels/quantize.h"

namespace kvctl {

Status KvSequence::LowerWidth(int layer, int head, int k_bits, int v_bits) {
  if (layer < 0 || layer >= geometry_.layers) {
    return InvalidArgument("layer: got ", layer, ", expected 0..", geometry_.layers - 1);
  }
  if (head < 0 || head >= geometry_.kv_heads) {
    return InvalidArgument("head: got ", head, ", expected 0..", geometry_.kv_heads - 1);
  }
  LayerState& l = *layers_[layer];
  if (l.plan.lossless) {
    return InvalidArgument("layer ", layer, ": lossless (quant.method = \"none\"), no widths");
  }
  HeadStream& h = l.heads[head];
  if (k_bits > h.spec.k_bits || v_bits > h.spec.v_bits ||
      (k_bits == h.spec.k_bits && v_bits == h.spec.v_bits)) {
    return InvalidArgument("k_bits/v_bits: got ", k_bits, "/", v_bits, ", expected at most ",
                           h.spec.k_bits, "/", h.spec.v_bits,
                           " (the current widths) with one lower");
  }
  QuantSpec next = h.spec;
  next.k_bits = k_bits;
  next.v_bits = v_bits;
  if (Status valid = ValidateQuantSpec(next); !valid.ok()) {
    return InvalidArgument("layer ", layer, ", head ", head, ": ", valid.message());
  }

  // Everything is re-quantized into temporary memory first, so an error changes nothing.
  const int g = h.spec.block_tokens, d = geometry_.head_dim;
  const size_t records = h.records.size();
  const size_t rb = BlockLayoutOf(next).record_bytes;
  std::vector<uint8_t> packed(records * rb);
  std::vector<float> k(static_cast<size_t>(g) * d), v(k.size());
  for (size_t r = 0; r < records; ++r) {
    const float* norms =
        l.norms.size() > 0 ? reinterpret_cast<const float*>(l.norms.Slot(r)) : nullptr;
    DequantizeBlock(h.spec, h.records.Slot(r), norms, k.data(), v.data());
    // Records are made from fp16 rows; decoded tokens re-enter as fp16, as in compaction.
    for (size_t i = 0; i < k.size(); ++i) k[i] = RoundToHalf(k[i]), v[i] = RoundToHalf(v[i]);
    Status s = QuantizeBlock(next, {k.data(), v.data(), d, norms}, packed.data() + r * rb);
    if (!s.ok()) {
      return Status(s.code(),
                    internal::StrCat("layer ", layer, ", head ", head, ": ", s.message()));
    }
  }
  h.records.Reslot(rb);
  for (size_t r = 0; r < records; ++r) std::memcpy(h.records.Slot(r), packed.data() + r * rb, rb);
  h.spec = next;
  l.plan.head_specs[head] = next;
  h.usage.requantized_tokens += records * g;
  ++h.usage.width_lowerings;
  return OkStatus();
}

Status KvSequence::RelieveByLowering(int64_t shortfall_pages) {
  std::vector<ReliefHead> heads;
  for (int l = 0; l < geometry_.layers; ++l) {
    const LayerState& layer = *layers_[l];
    if (layer.plan.lossless) continue;
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      ReliefHead r;
      r.layer = l;
      r.head = h;
      r.spec = layer.heads[h].spec;
      r.records = static_cast<int64_t>(layer.heads[h].records.size());
      if (!pressure_.curves.empty()) {
        r.curve = pressure_.curves[static_cast<size_t>(l) * geometry_.kv_heads + h];
      }
      heads.push_back(r);
    }
  }
  KVCTL_ASSIGN_OR_RETURN(WidthRelief relief,
                         PlanWidthRelief(heads, {.page_bytes = pool_->page_bytes(),
                                                 .min_bits = pressure_.min_bits,
                                                 .shortfall_pages = shortfall_pages}));
  for (const ReliefStep& step : relief.steps) {
    KVCTL_RETURN_IF_ERROR(LowerWidth(step.layer, step.head, step.to_k_bits, step.to_v_bits));
  }
  ++pressure_reliefs_;
  return OkStatus();
}

}  // namespace kvctl
