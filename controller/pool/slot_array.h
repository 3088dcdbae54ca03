// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/pool/slot_array.h
// SlotArray: a growable array of fixed-size slots stored in pool pages that belong to one stream
// (one (layer, head) of one sequence). A slot never straddles pages, so a page id plus a slot index
// is enough for a reader that maps the pool (blocks-mode FETCH). Growing takes pages from a
// reservation the caller made in one AllocateMany, so an append either gets every page it needs or
// changes nothing; shrinking returns whole pages to the pool at once.
//
// Thread safety: none; the owning sequence serialises access.
//
//   SlotArray records(pool, record_bytes);
//   records.Resize(n + 4, &reserved_pages);
//   uint8_t* rec = records.MutableSlot(n);
#ifndef KVCTL_CONTROLLER_POOL_SLOT_ARRAY_H_
#define KVCTL_CONTROLLER_POOL_SLOT_ARRAY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "controller/pool/pool.h"

namespace kvctl {

class SlotArray {
 public:
  // As many slots per page as fit. REQUIRES: 0 < slot_bytes <= pool->page_bytes().
  SlotArray(PageAllocator* pool, size_t slot_bytes);
  ~SlotArray();
  SlotArray(SlotArray&& other) noexcept;
  SlotArray& operator=(SlotArray&&) = delete;
  SlotArray(const SlotArray&) = delete;
  SlotArray& operator=(const SlotArray&) = delete;

  size_t size() const { return size_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t slots_per_page() const { return per_page_; }
  const std::vector<uint32_t>& pages() const { return pages_; }
  // Pool bytes held (whole pages).
  uint64_t bytes_held() const { return pages_.size() * page_bytes_; }

  // Pages the array would hold with n slots.
  size_t PagesFor(size_t n) const { return (n + per_page_ - 1) / per_page_; }
  // Extra pages Resize(n) takes from the reservation (0 when shrinking).
  size_t PagesNeeded(size_t n) const;
  // Pages Resize(n) releases (0 when growing).
  size_t PagesReleased(size_t n) const;

  // REQUIRES: i < size(). MutableSlot marks the slot's bytes changed (PageAllocator::MarkDirty),
  // so every write goes through it and the owner publishes the array (Publish) afterwards.
  const uint8_t* Slot(size_t i) const;
  uint8_t* MutableSlot(size_t i);
  // Appends the array's pages to *pages (for PageAllocator::PublishPages).
  void CollectPages(std::vector<uint32_t>* pages) const {
    pages->insert(pages->end(), pages_.begin(), pages_.end());
  }

  // Grows (taking PagesNeeded(n) pages from the back of *reserved) or shrinks (releasing pages
  // onto *reserved, or to the pool when reserved is null; the last page's dead slots leave its
  // checksum, PageAllocator::TrimSealed).
  // REQUIRES: reserved holds enough pages when growing.
  void Resize(size_t n, std::vector<uint32_t>* reserved);
  void Clear();
  // Narrows every slot to `slot_bytes` in place: the size stays, slots are re-packed per page
  // from the first page on and the pages no longer needed go back to the pool. Slot contents are
  // undefined afterwards (the caller rewrites every slot). REQUIRES: 0 < slot_bytes <=
  // slot_bytes().
  void Reslot(size_t slot_bytes);

 private:
  PageAllocator* pool_;
  size_t slot_bytes_;
  size_t per_page_;
  uint64_t page_bytes_;
  size_t size_ = 0;
  std::vector<uint32_t> pages_;
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_POOL_SLOT_ARRAY_H_
