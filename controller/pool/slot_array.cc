// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/pool/slot_array.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <utility>

namespace kvctl {

void SlotArray::Restamp() {
  static std::atomic<uint64_t> next{1};
  stamp_ = next.fetch_add(1, std::memory_order_relaxed);
}

SlotArray::SlotArray(Slab* slab) : slab_(slab) {
  slab_->Attach(this);
  Restamp();
}

SlotArray::~SlotArray() {
  if (slab_ == nullptr) return;  // Moved from.
  Clear();
  slab_->Detach(this);
}

SlotArray::SlotArray(SlotArray&& other) noexcept
    : slab_(other.slab_),
      ids_(std::move(other.ids_)),
      borrowed_(other.borrowed_),
      stamp_(other.stamp_) {
  other.Restamp();
  slab_->Detach(&other);
  slab_->Attach(this);
  other.slab_ = nullptr;
  other.ids_.clear();
  other.borrowed_ = 0;
}

void SlotArray::Resize(size_t n, std::vector<uint32_t>* reserved) {
  if (ids_.size() > n) Restamp();
  while (ids_.size() > n) {
    if (ids_.size() > borrowed_) {
      slab_->Give(ids_.back());
    } else {
      --borrowed_;  // Not ours: only dropped.
    }
    ids_.pop_back();
  }
  // Geometric growth: a decode step grows arrays by one slot, and an exact reserve would copy
  // every id on every step.
  if (n > ids_.capacity()) ids_.reserve(std::max(n, 2 * ids_.capacity()));
  while (ids_.size() < n) ids_.push_back(slab_->Take(reserved));
}

void SlotArray::Rehome(Slab* target) {
  Clear();
  Restamp();
  slab_->Detach(this);
  slab_ = target;
  slab_->Attach(this);
}

void SlotArray::AppendRanges(size_t begin, size_t end,
                             std::vector<PageAllocator::PageRange>* ranges) const {
  KVCTL_CHECK(begin <= end && end <= ids_.size());
  const auto bytes = static_cast<uint32_t>(slot_bytes());
  const auto per_page = static_cast<uint32_t>(slots_per_page());
  const SlotDivider divide(per_page);
  for (size_t i = begin; i < end; ++i) {
    const uint32_t id = ids_[i];
    const uint32_t page = divide.Quotient(id);
    const uint32_t first = (id - page * per_page) * bytes;
    ranges->push_back({page, first, first + bytes});
  }
}

void SlotArray::Borrow(const SlotArray& lender, size_t count) {
  KVCTL_CHECK(ids_.empty() && count <= lender.size());
  KVCTL_CHECK(lender.slot_bytes() == slot_bytes() && lender.slots_per_page() == slots_per_page());
  ids_.assign(lender.ids_.begin(), lender.ids_.begin() + static_cast<std::ptrdiff_t>(count));
  borrowed_ = count;
  Restamp();
}

void SlotArray::ShareFrom(const SlotArray& lender, size_t count) {
  KVCTL_CHECK(borrowed_ <= count && count <= ids_.size() && count <= lender.size());
  KVCTL_CHECK(lender.slot_bytes() == slot_bytes() && lender.slots_per_page() == slots_per_page());
  for (size_t i = borrowed_; i < count; ++i) slab_->Give(ids_[i]);
  std::copy(lender.ids_.begin(), lender.ids_.begin() + static_cast<std::ptrdiff_t>(count),
            ids_.begin());
  borrowed_ = count;
  Restamp();
}

}  // namespace kvctl
