// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/pool/slot_array.h"

#include <algorithm>
#include <utility>

namespace kvctl {

SlotArray::SlotArray(Slab* slab) : slab_(slab) { slab_->Attach(this); }

SlotArray::~SlotArray() {
  if (slab_ == nullptr) return;  // Moved from.
  Clear();
  slab_->Detach(this);
}

SlotArray::SlotArray(SlotArray&& other) noexcept : slab_(other.slab_), ids_(std::move(other.ids_)) {
  slab_->Detach(&other);
  slab_->Attach(this);
  other.slab_ = nullptr;
  other.ids_.clear();
}

void SlotArray::Resize(size_t n, std::vector<uint32_t>* reserved) {
  while (ids_.size() > n) {
    slab_->Give(ids_.back());
    ids_.pop_back();
  }
  // Geometric growth: a decode step grows arrays by one slot, and an exact reserve would copy
  // every id on every step.
  if (n > ids_.capacity()) ids_.reserve(std::max(n, 2 * ids_.capacity()));
  while (ids_.size() < n) ids_.push_back(slab_->Take(reserved));
}

void SlotArray::Rehome(Slab* target) {
  Clear();
  slab_->Detach(this);
  slab_ = target;
  slab_->Attach(this);
}

}  // namespace kvctl
