// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/pool/slab.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/checked_math.h"
#include "controller/pool/slot_array.h"

namespace kvctl {

Status CheckSlotIdSpace(std::string_view field, uint64_t pool_bytes, uint64_t page_bytes,
                        uint64_t slot_bytes) {
  if (page_bytes == 0 || slot_bytes == 0 || slot_bytes > page_bytes) {
    return InvalidArgument(field, ": a slot of ", slot_bytes, " bytes does not fit a page of ",
                           page_bytes, " bytes");
  }
  Status fits =
      CheckedProduct(field, {pool_bytes / page_bytes, page_bytes / slot_bytes}, uint64_t{1} << 32)
          .status();
  if (fits.ok()) return fits;
  return InvalidArgument(field, ": slots of ", slot_bytes, " bytes in a pool of ", pool_bytes,
                         " bytes (pool.bytes) cut into ", page_bytes,
                         "-byte pages (pool.page_bytes) need slot ids past 2^32, the wire's "
                         "record ids; lower pool.bytes or raise pool.page_bytes");
}

Slab::Slab(PageAllocator* pool, size_t slot_bytes)
    : pool_(pool),
      slot_bytes_(slot_bytes),
      per_page_(slot_bytes > 0 ? pool->page_bytes() / slot_bytes : 0),
      per_page_divider_(static_cast<uint32_t>(std::max<size_t>(per_page_, 1))),
      page_bytes_(pool->page_bytes()) {
  KVCTL_CHECK(slot_bytes > 0 && per_page_ > 0);
}

Slab::~Slab() {
  KVCTL_CHECK(arrays_.empty());
  for (const auto& [page, slots] : pages_) KVCTL_CHECK(pool_->Free(page).ok());
}

uint32_t Slab::TakeLowest() {
  const auto lowest = with_free_.begin();
  const uint32_t page = lowest->first;
  PageSlots& p = *lowest->second;
  size_t word = 0;
  while (p.free_bits[word] == 0) ++word;
  const size_t index = word * 64 + static_cast<size_t>(__builtin_ctzll(p.free_bits[word]));
  p.free_bits[word] &= p.free_bits[word] - 1;
  if (p.live++ == 0) --empty_pages_;
  --free_count_;
  if (p.live == per_page_) {
    p.listed = false;
    with_free_.erase(lowest);
  }
  return page * static_cast<uint32_t>(per_page_) + static_cast<uint32_t>(index);
}

Slab::PageSlots& Slab::Held(uint32_t page) {
  if (page != memo_page_) {
    auto it = pages_.find(page);
    KVCTL_CHECK(it != pages_.end());
    memo_page_ = page;
    memo_slots_ = &it->second;
  }
  return *memo_slots_;
}

uint32_t Slab::Take(std::vector<uint32_t>* reserved) {
  if (with_free_.empty()) {
    KVCTL_CHECK(reserved != nullptr && !reserved->empty());
    const uint32_t page = reserved->back();
    reserved->pop_back();
    // Slot ids are uint32 on the wire; CheckSlotIdSpace refused slot sizes that could pass it.
    KVCTL_CHECK((uint64_t{page} + 1) * per_page_ <= uint64_t{UINT32_MAX} + 1);
    PageSlots slots;
    slots.free_bits.assign((per_page_ + 63) / 64, ~uint64_t{0});
    if (per_page_ % 64 != 0) slots.free_bits.back() = (uint64_t{1} << (per_page_ % 64)) - 1;
    PageSlots& held = pages_.emplace(page, std::move(slots)).first->second;
    held.listed = true;
    with_free_.emplace(page, &held);
    free_count_ += per_page_;
    ++empty_pages_;
  }
  return TakeLowest();
}

void Slab::Give(uint32_t id) {
  // A flush gives back thousands of slots, mostly runs in one page: no map operation for them.
  const uint32_t page = per_page_divider_.Quotient(id);
  const size_t index = id - page * per_page_;
  PageSlots& p = Held(page);
  KVCTL_CHECK(p.live > 0);
  uint64_t& word = p.free_bits[index / 64];
  const uint64_t bit = uint64_t{1} << (index % 64);
  KVCTL_CHECK((word & bit) == 0);
  word |= bit;
  if (--p.live == 0) ++empty_pages_;
  ++free_count_;
  if (!p.listed) {
    p.listed = true;
    with_free_.emplace(page, &p);
  }
}

uint8_t* Slab::MutableSlot(uint32_t id) {
  const uint32_t page = per_page_divider_.Quotient(id);
  const size_t begin = (id - page * per_page_) * slot_bytes_;
  pool_->MarkDirty(page, static_cast<uint32_t>(begin), static_cast<uint32_t>(begin + slot_bytes_));
  ++writes_;
  if (page != last_touched_) {
    last_touched_ = page;
    touched_.push_back(page);
    if (touched_.size() > 2 * pages_.size() + 64) {
      std::sort(touched_.begin(), touched_.end());
      touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
    }
  }
  return pool_->PagePointer(page) + begin;
}

void Slab::TakeTouchedPages(std::vector<uint32_t>* pages) {
  std::sort(touched_.begin(), touched_.end());
  touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
  for (uint32_t page : touched_) {
    if (pages_.count(page) != 0) pages->push_back(page);
  }
  touched_.clear();
  last_touched_ = UINT32_MAX;
}

void Slab::ReleaseEmptyPages(std::vector<uint32_t>* released) {
  if (empty_pages_ == 0) return;  // The common case after a decode step: nothing to scan.
  for (auto it = pages_.begin(); it != pages_.end();) {
    if (it->second.live > 0) {
      ++it;
      continue;
    }
    with_free_.erase(it->first);
    free_count_ -= per_page_;
    if (released != nullptr) {
      released->push_back(it->first);
    } else {
      KVCTL_CHECK(pool_->Free(it->first).ok());
    }
    if (it->first == memo_page_) memo_page_ = UINT32_MAX;
    it = pages_.erase(it);
    --empty_pages_;
  }
  KVCTL_CHECK(empty_pages_ == 0);
}

size_t Slab::PagesAfterCompaction(size_t extra_free) const {
  const size_t live = live_slots() - std::min(extra_free, live_slots());
  return (live + per_page_ - 1) / per_page_;
}

std::vector<uint32_t> Slab::PickVictims() const {
  std::vector<std::pair<uint32_t, uint32_t>> by_live;  // (live slots, page)
  by_live.reserve(pages_.size());
  for (const auto& [page, slots] : pages_) by_live.emplace_back(slots.live, page);
  std::sort(by_live.begin(), by_live.end());
  std::vector<uint32_t> victims;
  size_t free_outside = free_count_, moving = 0;
  for (const auto& [live, page] : by_live) {
    if (free_outside - moving < per_page_) break;  // Nothing more to win.
    const size_t free_after = free_outside - (per_page_ - live);
    if (moving + live > free_after) break;
    victims.push_back(page);
    free_outside = free_after;
    moving += live;
  }
  return victims;
}

Status Slab::Compact(std::vector<uint32_t>* released, Verify verify) {
  if (free_count_ < per_page_) {
    ReleaseEmptyPages(released);
    return OkStatus();
  }
  std::vector<uint32_t> victims = PickVictims();
  if (verify == Verify::kCheck && pool_->checksums()) {
    // Only the victims slots move out of: an emptied page (a flush empties many) is released,
    // not read.
    std::vector<uint32_t> read;
    for (uint32_t page : victims) {
      if (Held(page).live > 0) read.push_back(page);
    }
    KVCTL_RETURN_IF_ERROR(pool_->VerifyPages(read, PageAllocator::VerifyReason::kCopy));
  }
  std::sort(victims.begin(), victims.end());
  auto is_victim = [&victims, this](uint32_t id) {
    return std::binary_search(victims.begin(), victims.end(),
                              static_cast<uint32_t>(id / per_page_));
  };
  // Destinations are the lowest free slots outside the victims: their free slots leave the
  // count and the victims leave the candidates.
  for (uint32_t page : victims) {
    with_free_.erase(page);
    PageSlots& p = Held(page);
    p.listed = false;
    free_count_ -= per_page_ - p.live;
  }
  for (SlotArray* array : arrays_) {
    // Borrowed slots live in another slab's pages: never victims here, skipped outright.
    bool moved = false;
    for (size_t i = array->borrowed_; i < array->ids_.size(); ++i) {
      uint32_t& id = array->ids_[i];
      if (!is_victim(id)) continue;
      KVCTL_CHECK(!with_free_.empty());
      const uint32_t to = TakeLowest();
      std::memcpy(MutableSlot(to), Slot(id), slot_bytes_);
      if (--Held(per_page_divider_.Quotient(id)).live == 0) ++empty_pages_;
      id = to;
      moved = true;
      ++slots_moved_;
    }
    if (moved) array->Restamp();  // Its ids changed (SlotArray::stamp).
  }
  memo_page_ = UINT32_MAX;  // The victims leave pages_.
  for (uint32_t page : victims) {
    KVCTL_CHECK(pages_.at(page).live == 0);
    pages_.erase(page);
    --empty_pages_;
    if (released != nullptr) {
      released->push_back(page);
    } else {
      KVCTL_CHECK(pool_->Free(page).ok());
    }
  }
  ReleaseEmptyPages(released);
  return OkStatus();
}

void Slab::CollectPages(std::vector<uint32_t>* pages) const {
  for (const auto& [page, slots] : pages_) pages->push_back(page);
}

Slab* SlabSet::Get(size_t slot_bytes) {
  std::unique_ptr<Slab>& slab = slabs_[slot_bytes];
  if (slab == nullptr) slab = std::make_unique<Slab>(pool_, slot_bytes);
  return slab.get();
}

uint64_t SlabSet::bytes_held() const {
  uint64_t bytes = 0;
  for (const auto& [size, slab] : slabs_) bytes += slab->bytes_held();
  return bytes;
}

uint64_t SlabSet::slots_moved() const {
  uint64_t moved = 0;
  for (const auto& [size, slab] : slabs_) moved += slab->slots_moved();
  return moved;
}

Status SlabSet::Compact() {
  Status first;
  for (const auto& [size, slab] : slabs_) {
    Status s = slab->Compact(nullptr);
    if (first.ok()) first = s;
  }
  return first;
}

void SlabSet::CollectPages(std::vector<uint32_t>* pages) const {
  for (const auto& [size, slab] : slabs_) slab->CollectPages(pages);
}

uint64_t SlabSet::writes() const {
  uint64_t writes = 0;
  for (const auto& [size, slab] : slabs_) writes += slab->writes();
  return writes;
}

void SlabSet::TakeTouchedPages(std::vector<uint32_t>* pages) {
  for (const auto& [size, slab] : slabs_) slab->TakeTouchedPages(pages);
}

void SlabPlan::Count(const SlotArray& array, size_t size_after) {
  // A sequence has a few slabs (one per slot size): a linear search beats a map's nodes.
  Slab* slab = array.slab();
  auto it = std::find_if(slabs_.begin(), slabs_.end(),
                         [slab](const auto& entry) { return entry.first == slab; });
  if (it == slabs_.end()) it = slabs_.insert(slabs_.end(), {slab, Growth{}});
  Growth& g = it->second;
  g.give += array.SlotsReleased(size_after);
  g.take += array.SlotsNeeded(size_after);
}

size_t SlabPlan::Pages() const {
  size_t pages = 0;
  for (const auto& [slab, g] : slabs_) {
    if (g.take > g.give) pages += slab->PagesFor(g.take - g.give);
  }
  return pages;
}

size_t SlabPlan::PagesCompacting() const {
  size_t need = 0, released = 0;
  for (const auto& [slab, g] : slabs_) {
    if (g.give == 0) {
      need += slab->PagesFor(g.take);
      continue;
    }
    // Compacted with `give` slots back, the slab holds ceil(live / per_page) pages and fewer
    // than a page's worth of free slots.
    const size_t per_page = slab->slots_per_page();
    const size_t held = slab->PagesAfterCompaction(g.give);
    const size_t free = held * per_page - (slab->live_slots() - g.give);
    released += slab->pages_held() - held;
    if (g.take > free) need += (g.take - free + per_page - 1) / per_page;
  }
  return need > released ? need - released : 0;
}

std::vector<uint32_t> SlabPlan::ShrunkPages() const {
  std::vector<uint32_t> pages;
  for (const auto& [slab, g] : slabs_) {
    if (g.give > 0) slab->CollectPages(&pages);
  }
  return pages;
}

void SlabPlan::CompactShrunk(std::vector<uint32_t>* reserved) const {
  for (const auto& [slab, g] : slabs_) {
    if (g.give > 0) KVCTL_CHECK(slab->Compact(reserved, Slab::Verify::kSkip).ok());
  }
}

}  // namespace kvctl
