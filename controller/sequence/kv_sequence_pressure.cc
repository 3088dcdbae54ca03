// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Lowering the code widths of stored records (KvSequence::LowerWidth) and the pool pressure
// relief built on it (budget.pressure = "requantize", docs/budgets.md).
#include <algorithm>
#include <cstring>

#include "common/half.h"
#include "controller/sequence/kv_sequence.h"
#include "controller/sequence/kv_sequence_internal.h"
#include "kernels/quantize.h"

namespace kvctl {

Status KvSequence::LowerWidth(int layer, int head, int k_bits, int v_bits) {
  KVCTL_RETURN_IF_ERROR(LowerWidthInPlace(layer, head, k_bits, v_bits));
  return Publish();
}

Status KvSequence::LowerWidthInPlace(int layer, int head, int k_bits, int v_bits) {
  // Re-quantizing lost data would seal the damage into fresh checksums.
  if (!integrity_.ok()) return integrity_;
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
  // Decoded in chunks (bounded temporary memory), each chunk encoded as one batch where the pool
  // lives (Arena::EncodeBlocks).
  constexpr size_t kChunk = 256;
  const size_t block_floats = static_cast<size_t>(g) * d;
  std::vector<float> k(std::min(records, kChunk) * block_floats), v(k.size()), norms;
  const bool has_norms = l.norms.size() > 0;
  for (size_t first = 0; first < records; first += kChunk) {
    const size_t count = std::min(kChunk, records - first);
    norms.clear();
    for (size_t i = 0; i < count; ++i) {
      const float* nr =
          has_norms ? reinterpret_cast<const float*>(l.norms.Slot(first + i)) : nullptr;
      if (nr != nullptr) norms.insert(norms.end(), nr, nr + g);
      float* kb = &k[i * block_floats];
      float* vb = &v[i * block_floats];
      DequantizeBlock(h.spec, h.records.Slot(first + i), nr, kb, vb);
      // Records are made from fp16 rows; decoded tokens re-enter as fp16, as in compaction.
      for (size_t j = 0; j < block_floats; ++j) {
        kb[j] = RoundToHalf(kb[j]);
        vb[j] = RoundToHalf(vb[j]);
      }
    }
    const BlockBatch batch{k.data(),
                           v.data(),
                           d,
                           static_cast<int64_t>(block_floats),
                           has_norms ? norms.data() : nullptr,
                           static_cast<int>(count)};
    Status s = pool_->EncodeBlocks(next, batch, packed.data() + first * rb);
    if (!s.ok()) {
      return Status(s.code(),
                    internal::StrCat("layer ", layer, ", head ", head, ": ", s.message()));
    }
  }
  KVCTL_RETURN_IF_ERROR(MoveRecords(&h.records, rb));
  for (size_t r = 0; r < records; ++r) {
    std::memcpy(h.records.MutableSlot(r), packed.data() + r * rb, rb);
  }
  h.spec = next;
  l.plan.head_specs[head] = next;
  h.usage.requantized_tokens += records * g;
  ++h.usage.width_lowerings;
  return OkStatus();
}

Status KvSequence::MoveRecords(SlotArray* records, size_t record_bytes) {
  Slab* source = records->slab();
  Slab* target = slabs_.Get(record_bytes);
  // The pages the narrower records need come first from what the old ones leave (their slab
  // compacted once they are given back), then from the pool; if the pool lacks them nothing has
  // changed yet.
  const size_t need = target->PagesFor(records->size());
  const size_t freed = source->pages_held() - source->PagesAfterCompaction(records->own_size());
  std::vector<uint32_t> reserved;
  if (need > freed) {
    StatusOr<std::vector<uint32_t>> got = pool_->AllocateMany(static_cast<uint32_t>(need - freed));
    if (!got.ok()) {
      return ResourceExhausted("narrower records need ", need - freed,
                               " more pool pages: ", got.status().message());
    }
    reserved = std::move(got).value();
  }
  // Compaction copies other heads' records: check the pages first, as a FETCH would, so nothing
  // changed behind the daemon's back is sealed at its new place.
  if (pool_->checksums()) {
    std::vector<uint32_t> pages;
    source->CollectPages(&pages);
    Status verified = pool_->VerifyPages(pages, PageAllocator::VerifyReason::kCopy);
    if (!verified.ok()) {
      for (uint32_t page : reserved) KVCTL_CHECK(pool_->Free(page).ok());
      return MarkLost(verified);
    }
  }
  const size_t count = records->size();
  records->Rehome(target);
  KVCTL_CHECK(source->Compact(&reserved, Slab::Verify::kSkip).ok());
  records->Resize(count, &reserved);
  for (uint32_t page : reserved) KVCTL_CHECK(pool_->Free(page).ok());
  return OkStatus();
}

Status KvSequence::RelievePressure(int64_t shortfall_pages) {
  if (pressure_.joint != nullptr && eviction_.enabled && !eviction_.head_caps.empty()) {
    Status joint = RelieveJoint(shortfall_pages);
    // A state the plan's model cannot describe (e.g. widths outside its bounds) falls back to
    // lowering widths alone.
    if (joint.code() != StatusCode::kInvalidArgument) return joint;
  }

  KVCTL_RETURN_IF_ERROR(LowerWidthsToFree(shortfall_pages, /*partial=*/false).status());
  ++pressure_reliefs_;
  return OkStatus();
}

int64_t KvSequence::LowerWidthsForOthers(int64_t pages) {
  if (!pressure_.lower_widths || pages < 1 || !integrity_.ok()) return 0;
  StatusOr<int64_t> freed = LowerWidthsToFree(pages, /*partial=*/true);
  // Not inside an APPEND of this sequence, so it publishes here. A device copy error counts as
  // no relief (the marks stay for this sequence's next request).
  const Status published = Publish();
  if (!freed.ok() || *freed == 0 || !published.ok()) return 0;
  ++lowered_for_others_;
  return *freed;
}

StatusOr<int64_t> KvSequence::LowerWidthsToFree(int64_t pages, bool partial) {
  std::vector<ReliefHead> heads;
  for (int l = 0; l < geometry_.layers; ++l) {
    const LayerState& layer = *layers_[l];
    if (layer.plan.lossless) continue;
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      // Records borrowed from a frozen prefix stay in its pages whatever this sequence does:
      // narrower copies would take pages, not free them.
      if (layer.heads[h].records.borrowed() > 0) continue;
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
                                                 .shortfall_pages = pages,
                                                 .partial = partial}));
  for (const ReliefStep& step : relief.steps) {
    KVCTL_RETURN_IF_ERROR(LowerWidthInPlace(step.layer, step.head, step.to_k_bits, step.to_v_bits));
  }
  return relief.pages_freed;
}

Status KvSequence::RelieveJoint(int64_t shortfall_pages) {
  // The planner's model at the sequence's current length: T = tokens appended so far (the plan
  // was made for budget.plan_tokens), each head holding min(cap, what it has) at its current
  // widths, no width below budget.pressure_min_bits. Pricing the plan's length instead would
  // "free" bytes of tokens not yet stored.
  JointPlanInput in = *pressure_.joint;
  in.min_bits = std::max(in.min_bits, pressure_.min_bits);
  in.evict_k_bits = in.evict_v_bits = 0;  // evict-only's widths: unused here, and maybe < min_bits.
  if (in.heads.size() != eviction_.head_caps.size()) {
    return InvalidArgument("joint: ", in.heads.size(), " planned heads, ",
                           eviction_.head_caps.size(), " caps");
  }
  JointPlan current;
  std::vector<int64_t> floors(in.heads.size());
  for (size_t i = 0; i < in.heads.size(); ++i) {
    JointHeadInput& h = in.heads[i];
    const HeadStream& stream = layers_[h.layer]->heads[h.head];
    h.tokens = std::max<int64_t>(1, tokens_);
    h.fixed_tokens = std::min(h.fixed_tokens, h.tokens);
    h.tail_tokens = std::min(h.tail_tokens, h.tokens - h.fixed_tokens);
    floors[i] = std::min(h.tokens, std::max(h.fixed_tokens, in.min_tokens));
    JointHeadPlan p;
    p.layer = h.layer;
    p.head = h.head;
    p.tokens = h.tokens;
    p.kept = std::clamp(std::min(eviction_.head_caps[i], stream.count()), floors[i], h.tokens);
    p.k_bits = stream.spec.k_bits;
    p.v_bits = stream.spec.v_bits;
    current.heads.push_back(p);
  }
  KVCTL_ASSIGN_OR_RETURN(
      ShortfallAdvice advice,
      AdviseShortfall(in, current, shortfall_pages * static_cast<int64_t>(pool_->page_bytes())));
  if (advice.requantize) {
    // Whole heads go to the narrowest widths their steps reach.
    std::vector<std::pair<int, int>> to(in.heads.size(), {0, 0});
    for (const ShortfallStep& step : advice.by_requantize.steps) {
      auto& w = to[static_cast<size_t>(step.layer) * geometry_.kv_heads + step.head];
      w.first = w.first == 0 ? step.to_k_bits : std::min(w.first, step.to_k_bits);
      w.second = w.second == 0 ? step.to_v_bits : std::min(w.second, step.to_v_bits);
    }
    for (size_t i = 0; i < to.size(); ++i) {
      if (to[i].first == 0) continue;
      const int k_bits = std::max(to[i].first, pressure_.min_bits);
      const int v_bits = std::max(to[i].second, pressure_.min_bits);
      const QuantSpec& spec = layers_[in.heads[i].layer]->heads[in.heads[i].head].spec;
      if (k_bits >= spec.k_bits && v_bits >= spec.v_bits) continue;
      KVCTL_RETURN_IF_ERROR(LowerWidthInPlace(in.heads[i].layer, in.heads[i].head,
                                              std::min(k_bits, spec.k_bits),
                                              std::min(v_bits, spec.v_bits)));
    }
  } else {
    // Lower the caps; the APPEND prepared again evicts down to them with the [evict] scorer.
    for (const ShortfallStep& step : advice.by_eviction.steps) {
      const size_t i = static_cast<size_t>(step.layer) * geometry_.kv_heads + step.head;
      eviction_.head_caps[i] = std::max(floors[i], current.heads[i].kept - step.tokens);
    }
    ++pressure_cap_cuts_;
  }
  ++pressure_reliefs_;
  return OkStatus();
}

}  // namespace kvctl
