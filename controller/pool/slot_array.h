// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/pool/slot_array.h
// SlotArray: a growable array of fixed-size slots of one stream (one (layer, head) of one
// sequence), each slot taken from the stream's Slab (controller/pool/slab.h), which shares its
// pages with the other streams of the sequence that have the same slot size. The array keeps the
// slot ids in order; a slot never straddles pages, so its id is all a reader that maps the pool
// needs (blocks-mode FETCH). Growing takes slots (and, when the slab has none free, pages from a
// reservation the caller made in one AllocateMany), so an append either gets every slot it needs
// or changes nothing; shrinking gives the last slots back to the slab.
//
// Borrowed slots (copy-on-write sharing, docs/tier.md "Shared prefix pages"): an array may start
// with slots of another array of the same slot size (Borrow), e.g. the records of a frozen prefix
// that several sequences read. They are read like the array's own, but never written, never given
// to this array's slab and never moved by its compaction; whoever borrows keeps their pages alive
// (KvSequence holds the lender). Writing one is a bug (MutableSlot checks): a writer first moves
// the array to fresh slots (Rehome drops the borrowed ones).
//
// Thread safety: none; the owning sequence serialises access.
//
//   SlotArray records(slabs.Get(record_bytes));
//   records.Resize(n + 4, &reserved_pages);
//   uint8_t* rec = records.MutableSlot(n);
#ifndef KVCTL_CONTROLLER_POOL_SLOT_ARRAY_H_
#define KVCTL_CONTROLLER_POOL_SLOT_ARRAY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "controller/pool/slab.h"

namespace kvctl {

class SlotArray {
 public:
  explicit SlotArray(Slab* slab);
  ~SlotArray();
  SlotArray(SlotArray&& other) noexcept;
  SlotArray& operator=(SlotArray&&) = delete;
  SlotArray(const SlotArray&) = delete;
  SlotArray& operator=(const SlotArray&) = delete;

  size_t size() const { return ids_.size(); }
  // The first borrowed() slots are borrowed; the rest are the array's own, from its slab.
  size_t borrowed() const { return borrowed_; }
  size_t own_size() const { return ids_.size() - borrowed_; }
  size_t slot_bytes() const { return slab_->slot_bytes(); }
  size_t slots_per_page() const { return slab_->slots_per_page(); }
  // Slot ids in array order (page * slots_per_page + index in the page).
  const std::vector<uint32_t>& ids() const { return ids_; }
  // Changes whenever an id the array held may have changed or gone (a shrink, a compaction of its
  // slab that moved one of its slots, Rehome, Borrow, ShareFrom); growing keeps it. So while it
  // is equal, the first k ids for any k up to an earlier size() are what they were then (what a
  // blocks FETCH's table tags rely on). Unique in the process: two arrays never share one.
  uint64_t stamp() const { return stamp_; }
  Slab* slab() const { return slab_; }

  // Slots Resize(n) takes (0 when shrinking) and gives back to the slab (0 when growing; borrowed
  // slots dropped are not given back).
  size_t SlotsNeeded(size_t n) const { return n > ids_.size() ? n - ids_.size() : 0; }
  size_t SlotsReleased(size_t n) const {
    const size_t keep = n > borrowed_ ? n : borrowed_;
    return keep < ids_.size() ? ids_.size() - keep : 0;
  }

  // REQUIRES: i < size(). MutableSlot marks the slot's bytes changed (PageAllocator::MarkDirty),
  // so every write goes through it and the owner publishes the slab's pages afterwards.
  const uint8_t* Slot(size_t i) const {
    KVCTL_CHECK(i < ids_.size());
    return slab_->Slot(ids_[i]);
  }
  uint8_t* MutableSlot(size_t i) {
    KVCTL_CHECK(i < ids_.size() && i >= borrowed_);
    return slab_->MutableSlot(ids_[i]);
  }

  // Appends the byte range of slots [begin, end) to *ranges (what VerifyRanges checks).
  // REQUIRES: begin <= end <= size().
  void AppendRanges(size_t begin, size_t end, std::vector<PageAllocator::PageRange>* ranges) const;

  // Grows (taking slots from the slab, which takes pages from the back of *reserved when it has
  // no free slot) or shrinks (giving the last slots back; the slab keeps their pages until its
  // owner compacts it). REQUIRES: when growing, reserved holds the pages Slab::PagesFor counts.
  void Resize(size_t n, std::vector<uint32_t>* reserved);
  void Clear() { Resize(0, nullptr); }
  // Gives every own slot back, drops the borrowed ones and attaches the now empty array to
  // `target` (another slot size, or the same slab to stop borrowing); the caller compacts the old
  // slab and grows the array again.
  void Rehome(Slab* target);
  // Makes the first `count` slots of `lender` this array's first slots, borrowed. REQUIRES: this
  // array is empty, count <= lender.size(), both have the same slot size and page size (one pool).
  // The caller keeps the lender's pages alive and unchanged while this array holds them.
  void Borrow(const SlotArray& lender, size_t count);
  // Replaces this array's first `count` slots by `lender`'s first `count`, borrowed: the own ones
  // among them go back to the slab (compact it afterwards). REQUIRES: borrowed() <= count <=
  // min(size(), lender.size()), the same slot and page size, and the caller checked that the
  // slots hold the same bytes.
  void ShareFrom(const SlotArray& lender, size_t count);

 private:
  friend class Slab;
  void Restamp();  // A new stamp (the slab calls it when its compaction moves a slot).

  Slab* slab_;
  std::vector<uint32_t> ids_;
  size_t borrowed_ = 0;  // ids_[0, borrowed_) are another array's slots.
  uint64_t stamp_ = 0;
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_POOL_SLOT_ARRAY_H_
