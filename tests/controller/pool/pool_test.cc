// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/pool/pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>

namespace kvctl {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;

// Unique per process and call, so parallel ctest runs never collide.
std::string ShmName() {
  static std::atomic<int> n{0};
  return "/kvctl-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

bool ShmExists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::unique_ptr<PageAllocator> MakePool(uint64_t arena_bytes, PageAllocatorOptions options) {
  StatusOr<std::unique_ptr<ShmArena>> arena = ShmArena::Create(ShmName(), arena_bytes);
  INFO(arena.status().ToString());
  REQUIRE(arena.ok());
  StatusOr<std::unique_ptr<PageAllocator>> pool = PageAllocator::Create(std::move(*arena), options);
  INFO(pool.status().ToString());
  REQUIRE(pool.ok());
  return std::move(*pool);
}

TEST_CASE("ShmArena: creates a 0600 object in /dev/shm and removes it on destruction",
          "[controller][pool]") {
  const std::string name = ShmName();
  const mode_t old_umask = umask(0);  // The mode must not depend on the caller's umask.
  StatusOr<std::unique_ptr<ShmArena>> arena = ShmArena::Create(name, 2 * kMiB);
  umask(old_umask);
  REQUIRE(arena.ok());
  struct stat st {};
  REQUIRE(stat(("/dev/shm" + name).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(static_cast<uint64_t>(st.st_size) == 2 * kMiB);
  CHECK((*arena)->bytes() == 2 * kMiB);
  CHECK((*arena)->name() == name);

  // Another process's view: open by name and map; bytes written on one side show on the other.
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  auto* peer =
      static_cast<uint8_t*>(mmap(nullptr, 2 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  REQUIRE(peer != MAP_FAILED);
  (*arena)->base()[12345] = 0x5a;
  peer[2 * kMiB - 1] = 0xa5;
  CHECK(peer[12345] == 0x5a);
  CHECK((*arena)->base()[2 * kMiB - 1] == 0xa5);
  munmap(peer, 2 * kMiB);

  arena->reset();
  CHECK(!ShmExists(name));
}

TEST_CASE("ShmArena: a name held by a running daemon is refused, even with unlink_stale",
          "[controller][pool]") {
  const std::string name = ShmName();
  StatusOr<std::unique_ptr<ShmArena>> first = ShmArena::Create(name, kMiB);
  REQUIRE(first.ok());
  (*first)->base()[0] = 42;
  for (StaleShm stale : {StaleShm::kRefuse, StaleShm::kUnlink}) {
    StatusOr<std::unique_ptr<ShmArena>> second = ShmArena::Create(name, kMiB, stale);
    CHECK(second.status().code() == StatusCode::kAlreadyExists);
    CHECK(Has(second.status().message(), name));
    CHECK(Has(second.status().message(), "in use by a running kvctl daemon"));
  }
  // The first daemon's object is untouched.
  CHECK(ShmExists(name));
  CHECK((*first)->base()[0] == 42);
  first->reset();
  CHECK(!ShmExists(name));
}

// What a daemon killed with SIGKILL leaves: the object, with nobody holding its lock.
void LeaveStaleObject(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 4096) == 0);
  close(fd);
}

TEST_CASE("ShmArena: a dead daemon's object is removed by default, kept with kRefuse",
          "[controller][pool]") {
  const std::string name = ShmName();
  LeaveStaleObject(name);

  StatusOr<std::unique_ptr<ShmArena>> refused = ShmArena::Create(name, kMiB, StaleShm::kRefuse);
  CHECK(refused.status().code() == StatusCode::kAlreadyExists);
  CHECK(Has(refused.status().message(), "no process holds it"));
  CHECK(Has(refused.status().message(), "pool.unlink_stale"));
  CHECK(Has(refused.status().message(), "rm /dev/shm" + name));
  CHECK(ShmExists(name));

  StatusOr<std::unique_ptr<ShmArena>> replaced = ShmArena::Create(name, kMiB);
  INFO(replaced.status().ToString());
  REQUIRE(replaced.ok());
  struct stat st {};
  REQUIRE(stat(("/dev/shm" + name).c_str(), &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_size) == kMiB);  // The new object, not the 4KiB leftover.
  replaced->reset();
  CHECK(!ShmExists(name));
}

TEST_CASE("ShmArena: a failed start leaves nothing, and a live object survives failed starts",
          "[controller][pool]") {
  const std::string name = ShmName();
  LeaveStaleObject(name);
  // Too big for /dev/shm: Create removes the leftover, creates its own object, then fails to
  // reserve the memory and removes what it created, nothing else.
  StatusOr<std::unique_ptr<ShmArena>> huge = ShmArena::Create(name, uint64_t{1} << 50);
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
  CHECK(!ShmExists(name));
  // A running daemon's object survives any number of failed starts on its name.
  StatusOr<std::unique_ptr<ShmArena>> live = ShmArena::Create(name, kMiB);
  REQUIRE(live.ok());
  (*live)->base()[7] = 9;
  for (int i = 0; i < 3; ++i) {
    CHECK(ShmArena::Create(name, kMiB).status().code() == StatusCode::kAlreadyExists);
  }
  CHECK(ShmExists(name));
  CHECK((*live)->base()[7] == 9);
  live->reset();
  CHECK(!ShmExists(name));
}

TEST_CASE("ShmArena: rejects bad names and sizes it cannot reserve", "[controller][pool]") {
  for (const char* bad : {"", "/", "kvctl", "/a/b", "/.."}) {
    INFO(bad);
    StatusOr<std::unique_ptr<ShmArena>> a = ShmArena::Create(bad, kMiB);
    CHECK(a.status().code() == StatusCode::kInvalidArgument);
  }
  CHECK(ShmArena::Create(ShmName(), 0).status().code() == StatusCode::kInvalidArgument);
  // More than any /dev/shm holds: refused at startup, and nothing is left behind.
  const std::string name = ShmName();
  StatusOr<std::unique_ptr<ShmArena>> huge = ShmArena::Create(name, uint64_t{1} << 50);
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
  CHECK(Has(huge.status().message(), "pool.bytes"));
  CHECK(!ShmExists(name));
}

TEST_CASE("PageAllocator: exhaustion is exact to the page", "[controller][pool]") {
  auto pool = MakePool(kMiB, {.page_bytes = 64 * kKiB});
  REQUIRE(pool->pages_total() == 16);
  std::set<uint32_t> got;
  for (int i = 0; i < 16; ++i) {
    StatusOr<uint32_t> page = pool->Allocate();
    REQUIRE(page.ok());
    CHECK(*page == static_cast<uint32_t>(i));  // A fresh pool hands out ids in order.
    got.insert(*page);
  }
  CHECK(got.size() == 16);
  StatusOr<uint32_t> none = pool->Allocate();
  CHECK(none.status().code() == StatusCode::kResourceExhausted);
  CHECK(Has(none.status().message(), "requested 65536 bytes (1 page), free 0 bytes"));
  CHECK(Has(none.status().message(), "16 pages of 65536 bytes"));
  PoolStats s = pool->Stats();
  CHECK(s.pages_used == 16);
  CHECK(s.bytes_free == 0);
  CHECK(s.alloc_failures_total == 1);

  REQUIRE(pool->Free(7).ok());
  StatusOr<uint32_t> again = pool->Allocate();
  REQUIRE(again.ok());
  CHECK(*again == 7);
  CHECK(!pool->Allocate().ok());
}

TEST_CASE("PageAllocator: free returns pages, double free and bad ids change nothing",
          "[controller][pool]") {
  auto pool = MakePool(kMiB, {.page_bytes = 64 * kKiB});
  const uint32_t a = *pool->Allocate();
  const uint32_t b = *pool->Allocate();
  CHECK(pool->IsAllocated(a));
  REQUIRE(pool->Free(a).ok());
  CHECK(!pool->IsAllocated(a));
  CHECK(pool->Stats().pages_used == 1);

  Status twice = pool->Free(a);
  CHECK(twice.code() == StatusCode::kFailedPrecondition);
  CHECK(Has(twice.message(), "not allocated"));
  Status out = pool->Free(16);
  CHECK(out.code() == StatusCode::kFailedPrecondition);
  CHECK(Has(out.message(), "below 16"));
  CHECK(pool->Free(UINT32_MAX).code() == StatusCode::kFailedPrecondition);
  CHECK(!pool->IsAllocated(UINT32_MAX));

  // The free list is intact: exactly the 15 free pages come back, each once, never b.
  CHECK(pool->Stats().pages_used == 1);
  std::set<uint32_t> rest;
  for (int i = 0; i < 15; ++i) rest.insert(*pool->Allocate());
  CHECK(rest.size() == 15);
  CHECK(rest.count(b) == 0);
  CHECK(!pool->Allocate().ok());
}

TEST_CASE("PageAllocator: AllocateMany is all or nothing", "[controller][pool]") {
  auto pool = MakePool(kMiB, {.page_bytes = 64 * kKiB});
  StatusOr<std::vector<uint32_t>> ten = pool->AllocateMany(10);
  REQUIRE(ten.ok());
  CHECK(std::set<uint32_t>(ten->begin(), ten->end()).size() == 10);
  StatusOr<std::vector<uint32_t>> seven = pool->AllocateMany(7);
  CHECK(seven.status().code() == StatusCode::kResourceExhausted);
  CHECK(Has(seven.status().message(), "requested 458752 bytes (7 pages), free 393216 bytes"));
  CHECK(pool->Stats().pages_used == 10);  // Nothing taken by the failed call.
  CHECK(pool->AllocateMany(6).ok());
  CHECK(pool->AllocateMany(0)->empty());
  CHECK(pool->Stats().pages_high_water == 16);
}

TEST_CASE("PageAllocator: accounting matches a model under random allocate/free",
          "[controller][pool]") {
  constexpr uint64_t kPage = 4 * kKiB;
  auto pool = MakePool(kMiB, {.page_bytes = kPage});
  const uint32_t total = pool->pages_total();
  REQUIRE(total == 256);
  std::set<uint32_t> model;
  uint32_t high_water = 0;
  uint64_t failures = 0;
  std::mt19937 rng(1234);
  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 5) {  // Allocate; more often than free while the pool is low, so it fills up.
      StatusOr<uint32_t> page = pool->Allocate();
      if (model.size() == total) {
        REQUIRE(!page.ok());
        ++failures;
      } else {
        REQUIRE(page.ok());
        REQUIRE(*page < total);
        REQUIRE(model.insert(*page).second);  // Never handed out twice.
      }
    } else if (op < 9 && !model.empty()) {  // Free a random allocated page.
      auto it = model.begin();
      std::advance(it, rng() % model.size());
      REQUIRE(pool->Free(*it).ok());
      model.erase(it);
    } else {  // Free something that is not allocated: rejected, nothing changes.
      uint32_t page = static_cast<uint32_t>(rng() % (total + 8));
      if (model.count(page)) continue;
      REQUIRE(pool->Free(page).code() == StatusCode::kFailedPrecondition);
    }
    high_water = std::max<uint32_t>(high_water, static_cast<uint32_t>(model.size()));
    const PoolStats s = pool->Stats();
    REQUIRE(s.pages_used == model.size());
    REQUIRE(s.bytes_used == model.size() * kPage);
    REQUIRE(s.bytes_free == (total - model.size()) * kPage);
    REQUIRE(s.bytes_used + s.bytes_free == s.pages_total * s.page_bytes);
    REQUIRE(s.pages_high_water == high_water);
    REQUIRE(s.alloc_failures_total == failures);
  }
  CHECK(failures > 0);  // The sequence did reach exhaustion.
  for (uint32_t page = 0; page < total; ++page) CHECK(pool->IsAllocated(page) == model.count(page));
}

TEST_CASE("PageAllocator: staging slots are carved from the arena and never overlap pages",
          "[controller][pool]") {
  // 2 slots of 100000 bytes -> 2 x 102400 (4KiB strides) at the end; 12 pages of 64KiB before.
  auto pool =
      MakePool(kMiB, {.page_bytes = 64 * kKiB, .staging_slots = 2, .staging_slot_bytes = 100000});
  const PoolStats s = pool->Stats();
  CHECK(s.staging_slots_total == 2);
  CHECK(s.staging_bytes_total == 204800);
  CHECK(s.pages_total == (kMiB - 204800) / (64 * kKiB));
  CHECK(s.pages_total * s.page_bytes + s.staging_bytes_total <= s.arena_bytes);

  StatusOr<StagingSlot> a = pool->AllocateStaging(100000);
  StatusOr<StagingSlot> b = pool->AllocateStaging(10);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->bytes == 100000);
  CHECK(a->offset % 4096 == 0);
  CHECK(b->offset % 4096 == 0);
  CHECK(a->offset + a->bytes <= kMiB);
  CHECK(b->offset + b->bytes <= kMiB);
  CHECK(pool->Stats().staging_slots_used == 2);

  // Fill every page and both slots with distinct bytes, then read all back: no overlap.
  std::vector<uint32_t> pages = *pool->AllocateMany(pool->pages_total());
  for (uint32_t p : pages) std::memset(pool->PagePointer(p), 1 + p, pool->page_bytes());
  std::memset(pool->StagingPointer(a->id), 0xee, a->bytes);
  std::memset(pool->StagingPointer(b->id), 0xdd, b->bytes);
  for (uint32_t p : pages) {
    const uint8_t* q = pool->PagePointer(p);
    CHECK(q == pool->arena().base() + pool->PageOffset(p));
    for (uint64_t i = 0; i < pool->page_bytes(); i += 997) REQUIRE(q[i] == uint8_t(1 + p));
  }
  for (uint64_t i = 0; i < a->bytes; i += 997) REQUIRE(pool->StagingPointer(a->id)[i] == 0xee);

  // All slots taken; then a freed slot comes back.
  StatusOr<StagingSlot> c = pool->AllocateStaging(1);
  CHECK(c.status().code() == StatusCode::kResourceExhausted);
  CHECK(Has(c.status().message(), "all 2 slots of 100000 bytes are in use"));
  REQUIRE(pool->FreeStaging(a->id).ok());
  CHECK(pool->FreeStaging(a->id).code() == StatusCode::kFailedPrecondition);
  CHECK(pool->FreeStaging(2).code() == StatusCode::kFailedPrecondition);
  StatusOr<StagingSlot> d = pool->AllocateStaging(50000);
  REQUIRE(d.ok());
  CHECK(d->id == a->id);
  // Too big for a slot.
  CHECK(pool->AllocateStaging(100001).status().code() == StatusCode::kInvalidArgument);
  CHECK(pool->AllocateStaging(0).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("PageAllocator: staging disabled and impossible layouts", "[controller][pool]") {
  auto none = MakePool(kMiB, {.page_bytes = 64 * kKiB, .staging_slots = 4});
  CHECK(none->pages_total() == 16);  // slot bytes 0: no staging, every byte is pages.
  StatusOr<StagingSlot> s = none->AllocateStaging(1);
  CHECK(s.status().code() == StatusCode::kFailedPrecondition);
  CHECK(Has(s.status().message(), "disabled"));

  for (PageAllocatorOptions bad :
       {PageAllocatorOptions{.page_bytes = 3000}, PageAllocatorOptions{.page_bytes = 2048},
        PageAllocatorOptions{.page_bytes = 2 * kMiB},
        PageAllocatorOptions{
            .page_bytes = 64 * kKiB, .staging_slots = 16, .staging_slot_bytes = 64 * kKiB},
        PageAllocatorOptions{
            .page_bytes = 64 * kKiB, .staging_slots = 1000, .staging_slot_bytes = 64 * kKiB}}) {
    StatusOr<std::unique_ptr<ShmArena>> arena = ShmArena::Create(ShmName(), kMiB);
    REQUIRE(arena.ok());
    CHECK(PageAllocator::Create(std::move(*arena), bad).status().code() ==
          StatusCode::kInvalidArgument);
  }
}

TEST_CASE("PageAllocator: concurrent allocate/free keeps exact accounting", "[controller][pool]") {
  auto pool = MakePool(kMiB, {.page_bytes = 4 * kKiB});
  constexpr int kThreads = 4, kRounds = 5000;
  std::atomic<bool> bad{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<uint32_t> mine;
      for (int i = 0; i < kRounds; ++i) {
        if (rng() % 2 == 0) {
          StatusOr<uint32_t> p = pool->Allocate();
          if (p.ok()) {
            // Write our thread id into the page: another owner would overwrite it.
            std::memset(pool->PagePointer(*p), t, 64);
            mine.push_back(*p);
          }
        } else if (!mine.empty()) {
          const uint32_t p = mine.back();
          mine.pop_back();
          if (pool->PagePointer(p)[63] != t) bad = true;
          if (!pool->Free(p).ok()) bad = true;
        }
      }
      for (uint32_t p : mine) {
        if (pool->PagePointer(p)[0] != t || !pool->Free(p).ok()) bad = true;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(!bad);
  const PoolStats s = pool->Stats();
  CHECK(s.pages_used == 0);
  CHECK(s.bytes_free == s.pages_total * s.page_bytes);
  CHECK(pool->AllocateMany(s.pages_total).ok());
}

}  // namespace
}  // namespace kvctl
