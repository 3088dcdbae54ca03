// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Slabs and slot arrays: streams of one size share pages, freed slots are packed away by
// Compact with every array's contents intact, and the pool's accounting and checksums follow.
#include "controller/pool/slab.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "controller/pool/slot_array.h"

namespace kvctl {
namespace {

constexpr uint64_t kPage = 64 << 10;

std::unique_ptr<PageAllocator> MakePool(
    uint64_t bytes, bool checksums,
    PageAllocator::FetchVerify fetch_verify = PageAllocator::FetchVerify::kAll) {
  static std::atomic<int> n{0};
  const std::string name = "/kvctl-slab-" + std::to_string(getpid()) + "-" + std::to_string(n++);
  StatusOr<std::unique_ptr<ShmArena>> arena = ShmArena::Create(name, bytes);
  REQUIRE(arena.ok());
  StatusOr<std::unique_ptr<PageAllocator>> pool = PageAllocator::Create(
      std::move(*arena),
      {.page_bytes = kPage, .checksums = checksums, .fetch_verify = fetch_verify});
  REQUIRE(pool.ok());
  return std::move(*pool);
}

// Grows `array` to n slots with pages from the pool, writing byte (tag, index) into each new one.
void Grow(PageAllocator* pool, SlotArray* array, size_t n, uint8_t tag) {
  const size_t before = array->size();
  std::vector<uint32_t> reserved;
  const size_t pages = array->slab()->PagesFor(n - before);
  if (pages > 0) {
    StatusOr<std::vector<uint32_t>> got = pool->AllocateMany(static_cast<uint32_t>(pages));
    REQUIRE(got.ok());
    reserved = std::move(*got);
  }
  array->Resize(n, &reserved);
  CHECK(reserved.empty());  // PagesFor is exact.
  for (size_t i = before; i < n; ++i) {
    std::memset(array->MutableSlot(i), static_cast<uint8_t>(tag * 31 + i), array->slot_bytes());
  }
}

bool Intact(const SlotArray& array, uint8_t tag) {
  for (size_t i = 0; i < array.size(); ++i) {
    const uint8_t want = static_cast<uint8_t>(tag * 31 + i);
    const uint8_t* slot = array.Slot(i);
    for (size_t b = 0; b < array.slot_bytes(); ++b) {
      if (slot[b] != want) return false;
    }
  }
  return true;
}

TEST_CASE("Slab: streams of one slot size share pages instead of a page each", "[pool][slab]") {
  auto pool = MakePool(64 << 20, false);
  {
    Slab rows(pool.get(), 256);  // 256 slots per 64 KiB page.
    std::vector<std::unique_ptr<SlotArray>> streams;
    for (int s = 0; s < 90; ++s) {
      streams.push_back(std::make_unique<SlotArray>(&rows));
      Grow(pool.get(), streams.back().get(), 144, static_cast<uint8_t>(s));
    }
    // 90 * 144 slots = 50.6 pages: 51 pages, where a page per stream would hold 90.
    CHECK(rows.pages_held() == 51);
    CHECK(pool->Stats().pages_used == 51);
    CHECK(rows.free_slots() == 51 * 256 - 90 * 144);
    for (int s = 0; s < 90; ++s) CHECK(Intact(*streams[s], static_cast<uint8_t>(s)));
    // Every id is distinct: no two streams alias a slot.
    std::set<uint32_t> ids;
    for (const auto& a : streams) ids.insert(a->ids().begin(), a->ids().end());
    CHECK(ids.size() == 90 * 144);
  }
  CHECK(pool->Stats().pages_used == 0);
}

TEST_CASE("Slab: Take hands out the lowest free slot, empty pages go back", "[pool][slab]") {
  auto pool = MakePool(8 << 20, false);
  Slab slab(pool.get(), 1024);  // 64 per page.
  SlotArray a(&slab), b(&slab);
  Grow(pool.get(), &a, 64, 1);
  Grow(pool.get(), &b, 64, 2);
  REQUIRE(slab.pages_held() == 2);
  const uint32_t first_of_b = b.ids()[0];
  b.Resize(0, nullptr);
  // b's page is empty but held until released; a new slot reuses it, lowest id first.
  CHECK(slab.pages_held() == 2);
  b.Resize(1, nullptr);  // No reservation needed: free slots exist.
  CHECK(b.ids()[0] == first_of_b);
  b.Resize(0, nullptr);
  slab.ReleaseEmptyPages(nullptr);
  CHECK(slab.pages_held() == 1);
  CHECK(pool->Stats().pages_used == 1);
  CHECK(Intact(a, 1));
}

TEST_CASE("Slab: TakeTouchedPages names each written page once, and only pages still held",
          "[pool][slab]") {
  auto pool = MakePool(8 << 20, true);
  Slab slab(pool.get(), 1024);  // 64 per page.
  SlotArray a(&slab), b(&slab);
  Grow(pool.get(), &a, 64, 1);   // Page of a.
  Grow(pool.get(), &b, 128, 2);  // Two pages of b.
  std::vector<uint32_t> touched, held;
  slab.TakeTouchedPages(&touched);
  slab.CollectPages(&held);
  CHECK(touched == held);  // Every page written, sorted, each once.
  REQUIRE(pool->SealPages(touched).ok());
  touched.clear();
  slab.TakeTouchedPages(&touched);
  CHECK(touched.empty());  // Taken: forgotten.
  // Writes to a's page and b's second page, interleaved and repeated.
  const uint32_t page_a = a.ids()[0] / 64, page_b2 = b.ids()[64] / 64;
  for (int i = 0; i < 5; ++i) {
    std::memset(a.MutableSlot(3), 7, a.slot_bytes());
    std::memset(b.MutableSlot(70), 8, b.slot_bytes());
  }
  slab.TakeTouchedPages(&touched);
  std::vector<uint32_t> want = {page_a, page_b2};
  std::sort(want.begin(), want.end());
  CHECK(touched == want);
  REQUIRE(pool->SealPages(touched).ok());
  // A page written and then let go is not reported: it may be another owner's by now.
  touched.clear();
  std::memset(b.MutableSlot(70), 9, b.slot_bytes());
  b.Resize(64, nullptr);
  slab.ReleaseEmptyPages(nullptr);
  REQUIRE(slab.pages_held() == 2);
  slab.TakeTouchedPages(&touched);
  CHECK(touched.empty());
  // Many writes between two takes (past the point where the list is compacted) still name each
  // page once.
  for (int i = 0; i < 10000; ++i) {
    std::memset(a.MutableSlot(static_cast<size_t>(i % 2)), 1, 16);
    std::memset(b.MutableSlot(static_cast<size_t>(i % 2)), 1, 16);
  }
  slab.TakeTouchedPages(&touched);
  CHECK(touched.size() == 2);
  CHECK(pool->SealPages(touched).ok());
  held.clear();
  slab.CollectPages(&held);
  CHECK(pool->VerifyPages(held, PageAllocator::VerifyReason::kFetch).ok());
}

TEST_CASE("Slab: Compact packs freed slots away, contents and checksums intact", "[pool][slab]") {
  auto pool = MakePool(64 << 20, true);
  Slab slab(pool.get(), 4160);  // A KVarN-sized record: 15 per page, 64 bytes of slack.
  std::vector<std::unique_ptr<SlotArray>> heads;
  for (int h = 0; h < 30; ++h) {
    heads.push_back(std::make_unique<SlotArray>(&slab));
    Grow(pool.get(), heads.back().get(), 10, static_cast<uint8_t>(h));
  }
  std::vector<uint32_t> pages;
  slab.CollectPages(&pages);
  REQUIRE(pool->SealPages(pages).ok());
  // Stamps (SlotArray::stamp): one per array, kept while an array only grows.
  std::vector<uint64_t> stamps, ids_before;
  for (const auto& head : heads) stamps.push_back(head->stamp());
  CHECK(std::set<uint64_t>(stamps.begin(), stamps.end()).size() == heads.size());
  Grow(pool.get(), heads[1].get(), 11, 1);
  CHECK(heads[1]->stamp() == stamps[1]);
  heads[1]->Resize(10, nullptr);
  CHECK(heads[1]->stamp() != stamps[1]);
  // Evict: every other head keeps 2 of its 10 records; the holes span many pages. A shrink
  // renews the stamp.
  for (int h = 0; h < 30; h += 2) heads[h]->Resize(2, nullptr);
  for (int h = 0; h < 30; h += 2) CHECK(heads[h]->stamp() != stamps[h]);
  for (const auto& head : heads) stamps[&head - &heads[0]] = head->stamp();
  std::vector<std::vector<uint32_t>> ids;
  for (const auto& head : heads) ids.push_back(head->ids());
  REQUIRE(slab.free_slots() >= slab.slots_per_page());
  const size_t live = slab.live_slots();
  REQUIRE(slab.Compact(nullptr).ok());
  // Exactly the arrays whose ids the compaction moved got a new stamp.
  for (size_t h = 0; h < heads.size(); ++h) {
    INFO("head " << h);
    CHECK((heads[h]->stamp() != stamps[h]) == (heads[h]->ids() != ids[h]));
  }
  CHECK(slab.free_slots() < slab.slots_per_page());
  CHECK(slab.pages_held() == (live + 14) / 15);
  CHECK(pool->Stats().pages_used == slab.pages_held());
  CHECK(slab.slots_moved() > 0);
  for (int h = 0; h < 30; ++h) {
    INFO("head " << h);
    CHECK(Intact(*heads[h], static_cast<uint8_t>(h)));
  }
  pages.clear();
  slab.CollectPages(&pages);
  CHECK(pool->SealPages(pages).ok());
  CHECK(pool->VerifyPages(pages, PageAllocator::VerifyReason::kFetch).ok());
  // Below a page's worth of free slots Compact moves nothing.
  const uint64_t moved = slab.slots_moved();
  heads[1]->Resize(slab.free_slots() + 1 < slab.slots_per_page() ? 9 : 10, nullptr);
  REQUIRE(slab.free_slots() < slab.slots_per_page());
  REQUIRE(slab.Compact(nullptr).ok());
  CHECK(slab.slots_moved() == moved);
}

TEST_CASE("Slab: Compact refuses to move slots out of a page changed behind its back",
          "[pool][slab]") {
  auto pool = MakePool(16 << 20, true);
  Slab slab(pool.get(), 4096);  // 16 per page.
  std::vector<std::unique_ptr<SlotArray>> heads;
  for (int h = 0; h < 8; ++h) {
    heads.push_back(std::make_unique<SlotArray>(&slab));
    Grow(pool.get(), heads.back().get(), 8, static_cast<uint8_t>(h));
  }
  std::vector<uint32_t> pages;
  slab.CollectPages(&pages);
  REQUIRE(pool->SealPages(pages).ok());
  for (int h = 0; h < 8; h += 2) heads[h]->Resize(0, nullptr);  // 32 free slots: two pages.
  // The pages left emptiest hold what compaction would move: change a byte in each of them.
  const std::vector<uint32_t> before = heads[7]->ids();
  for (uint32_t page : pages) pool->PagePointer(page)[kPage - 1] ^= 0xff;
  const Status s = slab.Compact(nullptr);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(heads[7]->ids() == before);  // Nothing moved.
  CHECK(slab.slots_moved() == 0);
}

TEST_CASE("Slab: with verify-once FETCHes, moved slots are verified again and copies check all",
          "[pool][slab]") {
  auto pool = MakePool(16 << 20, true, PageAllocator::FetchVerify::kUnverified);
  constexpr auto kFetch = PageAllocator::VerifyReason::kFetch;
  constexpr uint32_t kChunk = PageAllocator::kChecksumChunkBytes;
  Slab slab(pool.get(), 4160);  // 15 per page: slots straddle chunks.
  std::vector<std::unique_ptr<SlotArray>> heads;
  for (int h = 0; h < 16; ++h) {
    heads.push_back(std::make_unique<SlotArray>(&slab));
    Grow(pool.get(), heads.back().get(), 10, static_cast<uint8_t>(h));
  }
  std::vector<uint32_t> pages;
  slab.CollectPages(&pages);
  REQUIRE(pool->SealPages(pages).ok());
  REQUIRE(pool->VerifyPages(pages, kFetch).ok());  // Every chunk verified.
  const uint64_t verified = pool->Stats().verified_bytes_total;
  REQUIRE(pool->VerifyPages(pages, kFetch).ok());
  REQUIRE(pool->Stats().verified_bytes_total == verified);
  for (int h = 0; h < 16; h += 2) heads[h]->Resize(2, nullptr);

  SECTION("the chunks slots moved into are unverified, and a change there is found") {
    std::vector<std::vector<uint32_t>> before;
    for (const auto& head : heads) before.push_back(head->ids());
    REQUIRE(slab.Compact(nullptr).ok());
    REQUIRE(slab.slots_moved() > 0);
    pages.clear();
    slab.CollectPages(&pages);
    REQUIRE(pool->SealPages(pages).ok());
    std::vector<PageAllocator::PageRange> moved;
    for (size_t h = 0; h < heads.size(); ++h) {
      for (size_t i = 0; i < heads[h]->size(); ++i) {
        if (heads[h]->ids()[i] != before[h][i]) heads[h]->AppendRanges(i, i + 1, &moved);
      }
    }
    REQUIRE(moved.size() == slab.slots_moved());
    for (const PageAllocator::PageRange& r : moved) {
      for (uint32_t c = r.begin / kChunk; c * kChunk < r.end; ++c) {
        CHECK_FALSE(pool->ChunkVerified(r.page, c));
      }
    }
    for (int h = 0; h < 16; ++h) CHECK(Intact(*heads[h], static_cast<uint8_t>(h)));
    // A change to a moved slot after the move's seal, before any FETCH: the next FETCH finds it.
    pool->PagePointer(moved[0].page)[moved[0].begin + 1] ^= 0xff;
    CHECK(pool->VerifyPages(pages, kFetch).code() == StatusCode::kDataLoss);
  }
  SECTION("a change after the FETCH's check is not moved into a fresh checksum") {
    // Every page's last slot byte: some of them lie in slots the compaction moves.
    for (uint32_t page : pages) pool->PagePointer(page)[15 * 4160 - 1] ^= 0xff;
    CHECK(pool->VerifyPages(pages, kFetch).ok());  // Verified before the change: skipped.
    CHECK(slab.Compact(nullptr).code() == StatusCode::kDataLoss);
    CHECK(slab.slots_moved() == 0);
  }
}

TEST_CASE("Slab: random growth and shrinking keep contents, ids and the slack bound",
          "[pool][slab]") {
  auto pool = MakePool(64 << 20, false);
  std::mt19937 rng(7);
  for (size_t slot : {size_t{256}, size_t{1088}, size_t{4160}}) {
    Slab slab(pool.get(), slot);
    std::vector<std::unique_ptr<SlotArray>> arrays;
    std::vector<uint8_t> tags;
    for (int a = 0; a < 12; ++a) {
      arrays.push_back(std::make_unique<SlotArray>(&slab));
      tags.push_back(static_cast<uint8_t>(a));
    }
    for (int step = 0; step < 300; ++step) {
      const size_t a = rng() % arrays.size();
      const size_t size = arrays[a]->size();
      if (rng() % 3 == 0 && size > 0) {
        arrays[a]->Resize(rng() % size, nullptr);
      } else {
        Grow(pool.get(), arrays[a].get(), size + 1 + rng() % 40, tags[a]);
      }
      REQUIRE(slab.Compact(nullptr).ok());
      // After Compact fewer than a page's worth of slots are free.
      REQUIRE(slab.free_slots() < slab.slots_per_page());
      REQUIRE(pool->Stats().pages_used == slab.pages_held());
    }
    std::set<uint32_t> ids;
    size_t total = 0;
    for (size_t a = 0; a < arrays.size(); ++a) {
      INFO("slot " << slot << " array " << a);
      CHECK(Intact(*arrays[a], tags[a]));
      ids.insert(arrays[a]->ids().begin(), arrays[a]->ids().end());
      total += arrays[a]->size();
    }
    CHECK(ids.size() == total);
    CHECK(slab.live_slots() == total);
    arrays.clear();
  }
  CHECK(pool->Stats().pages_used == 0);
}

TEST_CASE("SlotDivider: the same quotient as a division, every divisor, edge and random ids",
          "[pool][slab]") {
  std::mt19937 rng(14);
  uint64_t checked = 0, wrong = 0;
  uint32_t first_wrong_divisor = 0, first_wrong_id = 0;
  for (uint32_t d = 1; d <= 70000; ++d) {
    const SlotDivider divide(d);
    const uint32_t ids[] = {0u,
                            1u,
                            d - 1,
                            d,
                            d + 1,
                            2 * d - 1,
                            static_cast<uint32_t>(rng()),
                            static_cast<uint32_t>(rng()),
                            UINT32_MAX / d * d,
                            UINT32_MAX / d * d - 1,
                            UINT32_MAX - 1,
                            UINT32_MAX};
    for (uint32_t id : ids) {
      ++checked;
      if (divide.Quotient(id) != id / d && wrong++ == 0) {
        first_wrong_divisor = d;
        first_wrong_id = id;
      }
    }
  }
  for (uint32_t d : {1u << 20, (1u << 31) - 1, 1u << 31, UINT32_MAX - 1, UINT32_MAX}) {
    const SlotDivider divide(d);
    for (uint32_t id : {0u, d - 1, d, UINT32_MAX}) {
      ++checked;
      wrong += divide.Quotient(id) != id / d;
    }
  }
  INFO("first mismatch: " << first_wrong_id << " / " << first_wrong_divisor);
  CHECK(wrong == 0);
  CHECK(checked > 800000);
}

TEST_CASE("CheckSlotIdSpace: slot ids must fit the wire's uint32 record ids", "[pool][slab]") {
  // 256 MiB of 64 KiB pages: 4096 pages; 32-byte rows give 2048 per page, 2^23 ids.
  CHECK(CheckSlotIdSpace("head_dim", 256 << 20, 64 << 10, 32).ok());
  // 1 TiB of 64 KiB pages with 32-byte rows (head_dim 8, fp16): 2^34 ids.
  const Status big = CheckSlotIdSpace("head_dim", uint64_t{1} << 40, 64 << 10, 32);
  CHECK(big.code() == StatusCode::kInvalidArgument);
  CHECK(big.message().find("head_dim") != std::string::npos);
  CHECK(big.message().find("2^32") != std::string::npos);
  // Exactly 2^32 ids is the last that fits; one page more is not.
  CHECK(CheckSlotIdSpace("x", uint64_t{1} << 39, 4096, 128).ok());  // 2^27 pages x 32.
  CHECK(!CheckSlotIdSpace("x", (uint64_t{1} << 39) + 4096, 4096, 128).ok());
  CHECK(!CheckSlotIdSpace("x", 1 << 20, 4096, 8192).ok());  // A slot larger than a page.
  CHECK(!CheckSlotIdSpace("x", 1 << 20, 4096, 0).ok());
}

}  // namespace
}  // namespace kvctl
