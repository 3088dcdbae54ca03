// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/pool/slot_array.h"

#include <utility>

namespace kvctl {

SlotArray::SlotArray(PageAllocator* pool, size_t slot_bytes)
    : pool_(pool),
      slot_bytes_(slot_bytes),
      per_page_(slot_bytes > 0 ? pool->page_bytes() / slot_bytes : 0),
      page_bytes_(pool->page_bytes()) {
  KVCTL_CHECK(slot_bytes > 0 && per_page_ > 0);
}

SlotArray::~SlotArray() { Clear(); }

SlotArray::SlotArray(SlotArray&& other) noexcept
    : pool_(other.pool_),
      slot_bytes_(other.slot_bytes_),
      per_page_(other.per_page_),
      page_bytes_(other.page_bytes_),
      size_(other.size_),
      pages_(std::move(other.pages_)) {
  other.size_ = 0;
  other.pages_.clear();
}

size_t SlotArray::PagesNeeded(size_t n) const {
  const size_t want = PagesFor(n);
  return want > pages_.size() ? want - pages_.size() : 0;
}

size_t SlotArray::PagesReleased(size_t n) const {
  const size_t want = PagesFor(n);
  return want < pages_.size() ? pages_.size() - want : 0;
}

const uint8_t* SlotArray::Slot(size_t i) const {
  KVCTL_CHECK(i < size_);
  return pool_->PagePointer(pages_[i / per_page_]) + (i % per_page_) * slot_bytes_;
}

uint8_t* SlotArray::MutableSlot(size_t i) {
  KVCTL_CHECK(i < size_);
  const uint32_t page = pages_[i / per_page_];
  const size_t begin = (i % per_page_) * slot_bytes_;
  pool_->MarkDirty(page, static_cast<uint32_t>(begin), static_cast<uint32_t>(begin + slot_bytes_));
  return pool_->PagePointer(page) + begin;
}

void SlotArray::Resize(size_t n, std::vector<uint32_t>* reserved) {
  const size_t want = PagesFor(n);
  const bool shrinking = n < size_;
  while (pages_.size() < want) {
    KVCTL_CHECK(reserved != nullptr && !reserved->empty());
    pages_.push_back(reserved->back());
    reserved->pop_back();
  }
  while (pages_.size() > want) {
    if (reserved != nullptr) {
      reserved->push_back(pages_.back());
    } else {
      KVCTL_CHECK(pool_->Free(pages_.back()).ok());
    }
    pages_.pop_back();
  }
  size_ = n;
  // The slots past the new end of the last page are dead: its checksum stops covering them, so
  // refilling them (a tail after a flush) extends the checksum instead of redoing the page.
  if (shrinking && want > 0) {
    const size_t live = n - (want - 1) * per_page_;
    pool_->TrimSealed(pages_.back(), static_cast<uint32_t>(live * slot_bytes_));
  }
}

void SlotArray::Clear() { Resize(0, nullptr); }

void SlotArray::Reslot(size_t slot_bytes) {
  KVCTL_CHECK(slot_bytes > 0 && slot_bytes <= slot_bytes_);
  slot_bytes_ = slot_bytes;
  per_page_ = page_bytes_ / slot_bytes;
  Resize(size_, nullptr);  // Fewer pages hold the same slots now: only frees.
}

}  // namespace kvctl
