// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/pool/slab.h
// Slab: the slots of one size that one owner (a sequence) holds, carved from pool pages the slab
// shares between every SlotArray of that size (controller/pool/slot_array.h). Streams of one
// sequence grow together, so sharing pages leaves at most about one page of slack per slot size
// instead of a partly filled page per stream (docs/algorithms.md §16 has the accounting).
//
// A slot is named by its id: page * slots_per_page() + index in the page, which is also the id a
// reader that maps the pool uses (blocks-mode FETCH: record id x lives at byte
// (x / slots_per_page) * page_bytes + (x % slots_per_page) * slot_bytes). Take hands out the
// lowest free id, so the live slots stay packed into few pages; Compact moves live slots out of
// the emptiest pages when a page's worth of slots is free, and returns the emptied pages, so a
// slab holds fewer than slots_per_page free slots after it: at most one page of slack.
//
// Thread safety: none; the owning sequence serialises access.
//
//   SlabSet slabs(pool);
//   Slab* records = slabs.Get(record_bytes);
//   SlotArray a(records);  a.Resize(4, &reserved);  uint8_t* r = a.MutableSlot(0);
//   KVCTL_RETURN_IF_ERROR(slabs.Compact());  // After frees: slack back to the pool.
#ifndef KVCTL_CONTROLLER_POOL_SLAB_H_
#define KVCTL_CONTROLLER_POOL_SLAB_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "controller/pool/pool.h"

namespace kvctl {

class SlotArray;

// id / divisor for 32-bit ids without a division instruction: a multiply-high by
// ceil(2^64 / divisor), exact for every 32-bit id and divisor (Lemire, Kaser and Kurz, "Faster
// remainder by direct computation", 2019). A FETCH walks every slot of its layers to find the
// pool chunks to verify, and a division per slot was most of that walk.
class SlotDivider {
 public:
  // REQUIRES: divisor > 0.
  explicit SlotDivider(uint32_t divisor)
      : divisor_(divisor), magic_(divisor == 1 ? 0 : UINT64_MAX / divisor + 1) {}
  uint32_t Quotient(uint32_t id) const {
    if (divisor_ == 1) return id;  // ceil(2^64 / 1) does not fit 64 bits.
    return static_cast<uint32_t>((static_cast<unsigned __int128>(magic_) * id) >> 64);
  }

 private:
  uint32_t divisor_;
  uint64_t magic_;
};

// Slot ids are uint32 on the wire (blocks FETCH record ids). OK when every slot of `slot_bytes` in
// a pool of `pool_bytes` cut into `page_bytes` pages has an id below 2^32; otherwise
// INVALID_ARGUMENT naming `field` (the setting that chose the slot size) and the pool settings.
// Callers check each slot size before a sequence uses it, so Slab::Take never meets a larger id.
Status CheckSlotIdSpace(std::string_view field, uint64_t pool_bytes, uint64_t page_bytes,
                        uint64_t slot_bytes);

class Slab {
 public:
  // REQUIRES: 0 < slot_bytes <= pool->page_bytes().
  Slab(PageAllocator* pool, size_t slot_bytes);
  // Returns every page to the pool. REQUIRES: no SlotArray uses the slab any more.
  ~Slab();
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;

  size_t slot_bytes() const { return slot_bytes_; }
  size_t slots_per_page() const { return per_page_; }
  size_t free_slots() const { return free_count_; }
  size_t live_slots() const { return pages_held() * per_page_ - free_count_; }
  size_t pages_held() const { return pages_.size(); }
  uint64_t bytes_held() const { return pages_held() * page_bytes_; }

  // Pages taking `more` slots (after the frees already done) draws from a reservation.
  size_t PagesFor(size_t more) const {
    return more > free_count_ ? (more - free_count_ + per_page_ - 1) / per_page_ : 0;
  }

  // The lowest free slot id, taking a page from the back of *reserved when none is free.
  // REQUIRES: a free slot, or reserved holds a page.
  uint32_t Take(std::vector<uint32_t>* reserved);
  // Returns a slot. Its page stays held until Compact or ReleaseEmptyPages.
  // REQUIRES: `id` was taken and not given back.
  void Give(uint32_t id);

  const uint8_t* Slot(uint32_t id) const {
    const uint32_t page = per_page_divider_.Quotient(id);
    return pool_->PagePointer(page) + (id - page * per_page_) * slot_bytes_;
  }
  // Marks the slot's bytes changed (PageAllocator::MarkDirty): every write goes through it.
  uint8_t* MutableSlot(uint32_t id);
  // MutableSlot calls so far: a reader can tell whether anything was written since it looked.
  uint64_t writes() const { return writes_; }

  // Pages with no live slot leave the slab: onto *released, or back to the pool when null.
  void ReleaseEmptyPages(std::vector<uint32_t>* released);
  // Whether Compact checks the checksums of the pages slots move out of first, so that a change
  // made behind the daemon's back is not sealed into fresh checksums at the new place. kSkip only
  // for a caller that verified the slab's pages itself in this request.
  enum class Verify { kCheck, kSkip };
  // When a page's worth of slots is free: moves live slots out of the emptiest pages into free
  // slots of the others (rewriting the ids the SlotArrays hold) until fewer than a page's worth
  // is free, then releases the emptied pages as ReleaseEmptyPages does; the slab then holds
  // ceil(live / slots_per_page) pages. OK, or the DATA_LOSS of the verification, with nothing
  // moved.
  Status Compact(std::vector<uint32_t>* released, Verify verify = Verify::kCheck);
  // Pages the slab would hold after Compact if `extra_free` more slots were given back first.
  size_t PagesAfterCompaction(size_t extra_free) const;
  uint64_t slots_moved() const { return slots_moved_; }

  // Appends the slab's pages, in id order, to *pages.
  void CollectPages(std::vector<uint32_t>* pages) const;
  // Appends the held pages MutableSlot wrote to since the last call, each once, and forgets them:
  // what the owner seals or publishes after a request, in time proportional to what it changed
  // rather than to what it holds. Pages written and then let go are not reported (they may
  // belong to another owner by now).
  void TakeTouchedPages(std::vector<uint32_t>* pages);

 private:
  friend class SlotArray;
  void Attach(SlotArray* array) { arrays_.insert(array); }
  void Detach(SlotArray* array) { arrays_.erase(array); }
  // The pages (emptiest first) whose live slots fit the free slots of the others, chosen until
  // fewer than a page's worth of free slots would be left.
  std::vector<uint32_t> PickVictims() const;
  // Takes the lowest free slot of the lowest page with one. REQUIRES: with_free_ not empty.
  uint32_t TakeLowest();

  struct PageSlots {
    uint32_t live = 0;
    bool listed = false;              // In with_free_.
    std::vector<uint64_t> free_bits;  // Bit i set: slot i of the page is free.
  };
  // The held page `page` (a flush gives back runs of slots of one page: the last one looked up
  // is remembered). REQUIRES: held.
  PageSlots& Held(uint32_t page);

  PageAllocator* const pool_;
  const size_t slot_bytes_;
  const size_t per_page_;
  const SlotDivider per_page_divider_;  // id / per_page_ without a division (every slot write).
  const uint64_t page_bytes_;
  // Held pages. Take takes the lowest free id: the lowest page with a free slot, its lowest
  // free bit (O(log pages) per slot, no allocation per slot).
  std::map<uint32_t, PageSlots> pages_;
  // Held pages with at least one free slot, each with its entry of pages_ (map nodes do not move;
  // an entry leaves here before it leaves pages_), so taking a slot costs no page lookup.
  std::map<uint32_t, PageSlots*> with_free_;
  size_t free_count_ = 0;        // Free slots of held pages (victims excluded during Compact).
  size_t empty_pages_ = 0;       // Held pages with no live slot (ReleaseEmptyPages' work).
  std::set<SlotArray*> arrays_;  // Who holds ids (Compact rewrites them).
  uint64_t slots_moved_ = 0;
  // Pages written since TakeTouchedPages, with repeats (a run of writes to one page is recorded
  // once); deduplicated when it outgrows the pages held, so an owner that never takes it stays
  // bounded.
  std::vector<uint32_t> touched_;
  uint32_t last_touched_ = UINT32_MAX;
  uint64_t writes_ = 0;
  // Held's memo: map nodes do not move, and it is reset whenever a page leaves pages_.
  uint32_t memo_page_ = UINT32_MAX;
  PageSlots* memo_slots_ = nullptr;
};

// One slab per slot size, created on first use; what a sequence holds its pool bytes in.
class SlabSet {
 public:
  explicit SlabSet(PageAllocator* pool) : pool_(pool) {}

  Slab* Get(size_t slot_bytes);
  uint64_t bytes_held() const;
  // Compact of every slab (pages back to the pool): the first error, after trying them all.
  Status Compact();
  uint64_t slots_moved() const;
  void CollectPages(std::vector<uint32_t>* pages) const;
  // Slab::TakeTouchedPages of every slab.
  void TakeTouchedPages(std::vector<uint32_t>* pages);
  // The sum of Slab::writes over every slab (slabs are never removed, so it only grows).
  uint64_t writes() const;

 private:
  PageAllocator* const pool_;
  std::map<size_t, std::unique_ptr<Slab>> slabs_;
};

// The slots one append gives back (arrays that shrink, committed first) and takes (arrays that
// grow, committed after) per slab, and the pool pages that needs.
class SlabPlan {
 public:
  void Count(const SlotArray& array, size_t size_after);
  // Pages to reserve when the shrinks only give slots back to their own slabs.
  size_t Pages() const;
  // Pages to reserve when every slab that shrinks is compacted between the shrinks and the
  // growth (CompactShrunk), so that the pages it empties serve the growth of any slab.
  size_t PagesCompacting() const;
  // The pages of the slabs that shrink (to verify before CompactShrunk moves their slots).
  std::vector<uint32_t> ShrunkPages() const;
  // Compact(reserved, kSkip) of every slab that shrinks. REQUIRES: the shrinks are committed and
  // ShrunkPages() were verified.
  void CompactShrunk(std::vector<uint32_t>* reserved) const;

 private:
  struct Growth {
    size_t give = 0, take = 0;
  };
  std::vector<std::pair<Slab*, Growth>> slabs_;  // In the order first counted.
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_POOL_SLAB_H_
