// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// KvSequence::Fork: a sequence opened from a frozen prefix that reads the prefix's records, sink
// rows and norms where they are (copy-on-write sharing, docs/tier.md "Shared prefix pages").
// What may be shared follows from how a sequence without eviction writes: records and OScaR norms
// are only ever appended after the existing ones (a flush) or moved wholesale to fresh slots
// (LowerWidth); sink rows are written once, and a lossless layer's rows only ever grow; only a
// quantized layer's fp16 tail is rewritten in place (each flush moves its remainder down), so it
// alone is copied.
#include <algorithm>
#include <cstring>
#include <utility>

#include "controller/sequence/kv_sequence.h"
#include "controller/sequence/kv_sequence_internal.h"

namespace kvctl {

size_t KvSequence::SharedRows(const LayerState& layer, const HeadStream& head) {
  // A lossless layer never flushes, so its rows only ever grow (all shared); a quantized layer
  // rewrites its tail at each flush, so only its sinks are.
  return layer.plan.lossless ? head.rows.size() : static_cast<size_t>(head.sink_rows);
}

StatusOr<std::unique_ptr<KvSequence>> KvSequence::Fork(std::shared_ptr<const KvSequence> source,
                                                       int quality_sample_period,
                                                       PressureSettings pressure) {
  KVCTL_CHECK(source != nullptr);
  const KvSequence& src = *source;
  if (!src.integrity_.ok()) {
    return FailedPrecondition("fork: the prefix is lost: ", src.integrity_.message());
  }
  if (src.eviction_.enabled) {
    return FailedPrecondition("fork: eviction: the prefix was stored with eviction on (evict.",
                              "policy = \"", EvictPolicyName(src.eviction_.policy),
                              "\"); eviction rewrites records in place, so it cannot be shared");
  }
  if (!pressure.curves.empty() &&
      pressure.curves.size() !=
          static_cast<size_t>(src.geometry_.layers) * src.geometry_.kv_heads) {
    return InvalidArgument("pressure.curves: got ", pressure.curves.size(), ", expected ",
                           src.geometry_.layers * src.geometry_.kv_heads,
                           " (layers x kv_heads) or none");
  }
  SequenceGeometry geometry = src.geometry_;
  geometry.quality_sample_period = quality_sample_period;
  std::vector<LayerPlan> plans;
  plans.reserve(src.layers_.size());
  for (const auto& layer : src.layers_) plans.push_back(layer->plan);
  auto seq = std::make_unique<KvSequence>(src.pool_, geometry, std::move(plans), EvictionSettings{},
                                          std::move(pressure));
  // Borrow first, then count what the tails need: every page in one allocation, all or nothing.
  SlabPlan slab_plan;
  for (size_t l = 0; l < src.layers_.size(); ++l) {
    const LayerState& from = *src.layers_[l];
    LayerState& to = *seq->layers_[l];
    to.norms.Borrow(from.norms, from.norms.size());
    for (size_t h = 0; h < from.heads.size(); ++h) {
      const HeadStream& a = from.heads[h];
      HeadStream& b = to.heads[h];
      b.rows.Borrow(a.rows, SharedRows(from, a));
      b.records.Borrow(a.records, a.records.size());
      slab_plan.Count(b.rows, a.rows.size());
    }
  }
  std::vector<uint32_t> reserved;
  if (const size_t pages = slab_plan.Pages(); pages > 0) {
    StatusOr<std::vector<uint32_t>> got = src.pool_->AllocateMany(static_cast<uint32_t>(pages));
    if (!got.ok()) {
      return ResourceExhausted("fork: the prefix's fp16 tails need ", pages,
                               " pool pages: ", got.status().message());
    }
    reserved = std::move(got).value();
  }
  for (size_t l = 0; l < src.layers_.size(); ++l) {
    const LayerState& from = *src.layers_[l];
    LayerState& to = *seq->layers_[l];
    for (size_t h = 0; h < from.heads.size(); ++h) {
      const HeadStream& a = from.heads[h];
      HeadStream& b = to.heads[h];
      b.rows.Resize(a.rows.size(), &reserved);
      const size_t slot = b.rows.slot_bytes();
      for (size_t i = SharedRows(from, a); i < a.rows.size(); ++i) {
        std::memcpy(b.rows.MutableSlot(i), a.rows.Slot(i), slot);
      }
      b.sink_rows = a.sink_rows;
      b.tail_rows = a.tail_rows;
      b.positions = a.positions;
      KVCTL_CHECK(b.count() == static_cast<int64_t>(b.positions.size()));
    }
  }
  for (uint32_t page : reserved) KVCTL_CHECK(src.pool_->Free(page).ok());  // Not needed after all.
  seq->tokens_ = src.tokens_;
  seq->first_position_ = src.first_position_;
  seq->since_realloc_ = src.tokens_;
  seq->lender_ = std::move(source);
  KVCTL_RETURN_IF_ERROR(seq->Publish());
  return seq;
}

StatusOr<uint64_t> KvSequence::ShareWith(std::shared_ptr<const KvSequence> prefix) {
  KVCTL_CHECK(prefix != nullptr);
  const KvSequence& p = *prefix;
  KVCTL_RETURN_IF_ERROR(integrity_);
  if (eviction_.enabled) {
    return FailedPrecondition("share: eviction: evict.policy = \"",
                              EvictPolicyName(eviction_.policy),
                              "\" rewrites records in place, so they cannot be shared");
  }
  if (p.layers_.size() != layers_.size() || p.geometry_.kv_heads != geometry_.kv_heads ||
      p.tokens_ > tokens_ || (p.tokens_ > 0 && p.first_position_ != first_position_)) {
    return FailedPrecondition("share: the prefix (", p.tokens_, " tokens from ", p.first_position_,
                              ") is not one of this sequence (", tokens_, " tokens from ",
                              first_position_, ")");
  }
  // Every slot to share must hold the same bytes, and every slot this sequence already borrows
  // must be among them (the old lender is let go). Nothing changes until all of it holds.
  auto same = [](const SlotArray& a, const SlotArray& b, size_t count) {
    if (count > b.size() || b.borrowed() > count || a.slot_bytes() != b.slot_bytes()) return false;
    for (size_t i = 0; i < count; ++i) {
      if (std::memcmp(a.Slot(i), b.Slot(i), a.slot_bytes()) != 0) return false;
    }
    return true;
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerState& from = *p.layers_[l];
    const LayerState& to = *layers_[l];
    bool ok =
        from.plan.lossless == to.plan.lossless && same(from.norms, to.norms, from.norms.size());
    for (size_t h = 0; ok && h < from.heads.size(); ++h) {
      const HeadStream& a = from.heads[h];
      const HeadStream& b = to.heads[h];
      ok = a.spec == b.spec && same(a.records, b.records, a.records.size()) &&
           same(a.rows, b.rows, SharedRows(from, a));
    }
    if (!ok) {
      return FailedPrecondition("share: layer ", l,
                                " of the prefix differs from this sequence's (plan, widths or "
                                "stored bytes)");
    }
  }
  const uint64_t held = slabs_.bytes_held();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerState& from = *p.layers_[l];
    LayerState& to = *layers_[l];
    to.norms.ShareFrom(from.norms, from.norms.size());
    for (size_t h = 0; h < from.heads.size(); ++h) {
      const HeadStream& a = from.heads[h];
      HeadStream& b = to.heads[h];
      b.records.ShareFrom(a.records, a.records.size());
      b.rows.ShareFrom(a.rows, SharedRows(from, a));
    }
  }
  lender_ = std::move(prefix);
  // The slots given back leave whole pages free once compacted.
  if (Status compacted = slabs_.Compact(); !compacted.ok()) return MarkLost(compacted);
  KVCTL_RETURN_IF_ERROR(Publish());
  return held - std::min(held, slabs_.bytes_held());
}

Status KvSequence::VerifyForCopy() const {
  if (!pool_->checksums()) return OkStatus();
  std::vector<uint32_t> pages;
  slabs_.CollectPages(&pages);
  KVCTL_RETURN_IF_ERROR(pool_->VerifyPages(pages, PageAllocator::VerifyReason::kCopy));
  std::vector<PageAllocator::PageRange> ranges;
  CollectBorrowedRanges(&ranges);
  if (ranges.empty()) return OkStatus();
  return pool_->VerifyRanges(ranges, PageAllocator::VerifyReason::kCopy);
}

void KvSequence::CollectBorrowedRanges(std::vector<PageAllocator::PageRange>* ranges) const {
  if (lender_ == nullptr) return;
  auto add_borrowed = [ranges](const SlotArray& array) {
    array.AppendRanges(0, array.borrowed(), ranges);
  };
  for (const auto& layer : layers_) {
    add_borrowed(layer->norms);
    for (const HeadStream& head : layer->heads) {
      add_borrowed(head.rows);
      add_borrowed(head.records);
    }
  }
}

}  // namespace kvctl
