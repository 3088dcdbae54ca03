// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Page checksums: what PageAllocator seals and verifies, and what the Controller answers when a
// page of the shm pool was changed through another mapping (as any process that can open the
// object could): FETCH (dense and blocks) and APPEND of that sequence fail closed with
// DATA_LOSS, the scrubber finds it without a FETCH, other sequences are unaffected, STATS counts.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/half.h"
#include "controller/pool/pool.h"
#include "controller/service/controller.h"
#include "controller/service/scrubber.h"

namespace kvctl {
namespace {

std::string UniqueShmName(const char* what) {
  static int counter = 0;
  return "/kvctl-crc-" + std::string(what) + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++);
}

// A second, writable mapping of a shm object: what a hostile or careless process holds.
class ForeignMapping {
 public:
  ForeignMapping(const std::string& name, uint64_t bytes) : bytes_(bytes) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(base != MAP_FAILED);
    base_ = static_cast<uint8_t*>(base);
  }
  ~ForeignMapping() { munmap(base_, bytes_); }
  void Flip(uint64_t offset) { base_[offset] ^= 0x5A; }

 private:
  uint8_t* base_ = nullptr;
  uint64_t bytes_;
};

struct TestPool {
  std::string name = UniqueShmName("pool");
  std::unique_ptr<PageAllocator> pool;
  explicit TestPool(bool checksums, uint64_t bytes = 1 << 20, uint64_t page_bytes = 4096,
                    PageAllocator::FetchVerify fetch_verify = PageAllocator::FetchVerify::kAll) {
    auto arena = ShmArena::Create(name, bytes);
    REQUIRE(arena.ok());
    auto created = PageAllocator::Create(
        std::move(*arena),
        {.page_bytes = page_bytes, .checksums = checksums, .fetch_verify = fetch_verify});
    REQUIRE(created.ok());
    pool = std::move(created).value();
  }
  // Writes `bytes` bytes of `value` at [begin, begin + bytes) of the page, as the daemon does.
  void Write(uint32_t page, uint32_t begin, uint32_t bytes, uint8_t value) {
    pool->MarkDirty(page, begin, begin + bytes);
    std::memset(pool->PagePointer(page) + begin, value, bytes);
  }
};

TEST_CASE("PageAllocator checksums: sealed pages verify, a byte changed elsewhere is DATA_LOSS",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true);
  REQUIRE(t.pool->checksums());
  StatusOr<std::vector<uint32_t>> pages = t.pool->AllocateMany(2);
  REQUIRE(pages.ok());
  const uint32_t a = (*pages)[0], b = (*pages)[1];
  // Slot by slot, sealed after each "request": the checksum is extended, never recomputed.
  for (uint32_t slot = 0; slot < 8; ++slot) {
    t.Write(a, slot * 100, 100, static_cast<uint8_t>(slot + 1));
    REQUIRE(t.pool->SealPages({a}).ok());
  }
  t.Write(b, 0, 4096, 7);
  REQUIRE(t.pool->SealPages({a, b}).ok());
  CHECK(t.pool->SealedBytes(a) == 800);
  CHECK(t.pool->VerifyPages({a, b}, PageAllocator::VerifyReason::kFetch).ok());
  CHECK(t.pool->Stats().verified_bytes_total == 800 + 4096);

  ForeignMapping foreign(t.name, 1 << 20);
  foreign.Flip(t.pool->PageOffset(a) + 900);  // Past the sealed prefix: bytes no one reads.
  CHECK(t.pool->VerifyPages({a}, PageAllocator::VerifyReason::kScrub).ok());
  foreign.Flip(t.pool->PageOffset(a) + 123);
  const Status lost = t.pool->VerifyPages({b, a}, PageAllocator::VerifyReason::kScrub);
  CHECK(lost.code() == StatusCode::kDataLoss);
  CHECK_THAT(lost.message(), Catch::Contains("page " + std::to_string(a) + " (pool offset " +
                                             std::to_string(t.pool->PageOffset(a))));
  CHECK_THAT(lost.message(), Catch::Contains("found by the scrubber"));
  const PoolStats stats = t.pool->Stats();
  CHECK(stats.checksum_failures_total == 1);
  CHECK(stats.scrubbed_bytes_total == 2 * 800 + 4096);
}

TEST_CASE("PageAllocator checksums: a rewrite checks the page first, so damage is not laundered",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  t.Write(*page, 0, 2000, 1);
  REQUIRE(t.pool->SealPages({*page}).ok());
  ForeignMapping foreign(t.name, 1 << 20);
  foreign.Flip(t.pool->PageOffset(*page) + 10);
  // The daemon rewrites bytes [1000, 1100) of the page (a tail rewritten at a flush, say): the
  // new checksum would cover the foreign change, so the seal reports it instead.
  t.Write(*page, 1000, 100, 2);
  const Status sealed = t.pool->SealPages({*page});
  CHECK(sealed.code() == StatusCode::kDataLoss);
  CHECK_THAT(sealed.message(), Catch::Contains("found when a request rewrote them"));
  CHECK(t.pool->Stats().checksum_failures_total == 1);
  // A freed page forgets its checksum: its next owner starts clean.
  REQUIRE(t.pool->Free(*page).ok());
  StatusOr<uint32_t> again = t.pool->Allocate();
  REQUIRE(again.ok());
  CHECK(t.pool->SealedBytes(*again) == 0);
  CHECK(t.pool->VerifyPages({*again}, PageAllocator::VerifyReason::kFetch).ok());
}

constexpr uint32_t kChunk = PageAllocator::kChecksumChunkBytes;

TEST_CASE("PageAllocator checksums: 64 KiB pages are checked chunk by chunk",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  const uint32_t p = *page;
  t.Write(p, 0, 10 * kChunk, 1);
  REQUIRE(t.pool->SealPages({p}).ok());
  CHECK(t.pool->SealedBytes(p) == 10 * kChunk);
  ForeignMapping foreign(t.name, 1 << 20);
  foreign.Flip(t.pool->PageOffset(p) + 7 * kChunk + 5);

  // A range check reads only the chunks its ranges touch (each once): chunk 7 is not among them.
  uint64_t before = t.pool->Stats().verified_bytes_total;
  CHECK(t.pool
            ->VerifyRanges({{p, 100, 200}, {p, 150, kChunk + 1}, {p, 3 * kChunk, 3 * kChunk + 9}},
                           PageAllocator::VerifyReason::kFetch)
            .ok());
  CHECK(t.pool->Stats().verified_bytes_total - before == 3 * kChunk);
  const Status lost = t.pool->VerifyRanges(
      {{p, 7 * kChunk + 100, 7 * kChunk + 200}, {p, 8 * kChunk, 8 * kChunk + 1}},
      PageAllocator::VerifyReason::kFetch);
  CHECK(lost.code() == StatusCode::kDataLoss);
  CHECK_THAT(lost.message(), Catch::Contains("bytes " + std::to_string(7 * kChunk) + ".." +
                                             std::to_string(8 * kChunk)));
  CHECK(t.pool->Stats().checksum_failures_total == 1);  // One page, however many chunks.

  // A rewrite of chunk 2 checks chunk 2 only, and its seal re-checksums chunk 2 only.
  before = t.pool->Stats().verified_bytes_total;
  const uint64_t sealed_before = t.pool->Stats().sealed_bytes_total;
  t.Write(p, 2 * kChunk + 10, 20, 3);
  CHECK(t.pool->Stats().verified_bytes_total - before == kChunk);
  REQUIRE(t.pool->SealPages({p}).ok());
  CHECK(t.pool->Stats().sealed_bytes_total - sealed_before == kChunk);
  // The foreign change in chunk 7 was neither checked nor laundered: a whole-page check finds it.
  CHECK(t.pool->VerifyPages({p}, PageAllocator::VerifyReason::kScrub).code() ==
        StatusCode::kDataLoss);
}

TEST_CASE("PageAllocator checksums: no chunk write launders a foreign change",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10);
  ForeignMapping foreign(t.name, 1 << 20);
  SECTION("an append into the chunk holding the sealed end extends its checksum") {
    StatusOr<uint32_t> page = t.pool->Allocate();
    REQUIRE(page.ok());
    t.Write(*page, 0, kChunk + 100, 1);
    REQUIRE(t.pool->SealPages({*page}).ok());
    foreign.Flip(t.pool->PageOffset(*page) + kChunk + 50);  // Sealed bytes of chunk 1.
    t.Write(*page, kChunk + 300, 100, 2);                   // Past the sealed end, in chunk 1.
    REQUIRE(t.pool->SealPages({*page}).ok());               // Not checked: only extended...
    CHECK(t.pool->SealedBytes(*page) == kChunk + 400);
    CHECK(t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kFetch).code() ==
          StatusCode::kDataLoss);  // ...so the change still shows.
  }
  SECTION("two writes far apart check every chunk between them") {
    StatusOr<uint32_t> page = t.pool->Allocate();
    REQUIRE(page.ok());
    t.Write(*page, 0, 12 * kChunk, 1);
    REQUIRE(t.pool->SealPages({*page}).ok());
    foreign.Flip(t.pool->PageOffset(*page) + 6 * kChunk);
    t.Write(*page, 10, 10, 2);
    t.Write(*page, 11 * kChunk, 10, 2);  // The seal re-checksums chunks 0..11.
    CHECK(t.pool->SealPages({*page}).code() == StatusCode::kDataLoss);
  }
  SECTION("a compaction's copy skips the chunks this request rewrote, checks the others") {
    StatusOr<uint32_t> page = t.pool->Allocate();
    REQUIRE(page.ok());
    t.Write(*page, 0, 4 * kChunk, 1);
    REQUIRE(t.pool->SealPages({*page}).ok());
    t.Write(*page, 0, 10, 2);  // Checks chunk 0.
    const uint64_t before = t.pool->Stats().verified_bytes_total;
    CHECK(t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kCopy).ok());
    CHECK(t.pool->Stats().verified_bytes_total - before == 3 * kChunk);
    foreign.Flip(t.pool->PageOffset(*page) + 3 * kChunk + 1);
    CHECK(t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kCopy).code() ==
          StatusCode::kDataLoss);
  }
}

TEST_CASE("PageAllocator checksums: random writes and foreign changes, none ever laundered",
          "[controller][checksum]") {
  // A model of the guarantee: a foreign change to bytes below the sealed end is reported either
  // by the seal of a request that rewrites its chunk or by a later check of the page; bytes past
  // the sealed end are not covered (nothing of the daemon's lives there yet).
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10);
  ForeignMapping foreign(t.name, 1 << 20);
  std::mt19937 rng(20261202);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  std::vector<uint8_t> changed(64 << 10, 0);  // XOR of foreign changes below the sealed end.
  auto pending = [&] {
    return std::any_of(changed.begin(), changed.end(), [](uint8_t x) { return x != 0; });
  };
  int reported = 0;
  for (int request = 0; request < 400; ++request) {
    const uint32_t sealed = static_cast<uint32_t>(t.pool->SealedBytes(*page));
    if (sealed > 0 && rng() % 3 == 0) {
      const uint32_t at = rng() % sealed;
      foreign.Flip(t.pool->PageOffset(*page) + at);
      changed[at] ^= 0x5A;
    }
    const int writes = static_cast<int>(rng() % 3);
    for (int w = 0; w < writes; ++w) {
      const uint32_t begin = rng() % ((64 << 10) - 300);
      t.Write(*page, begin, 1 + rng() % 300, static_cast<uint8_t>(request));
    }
    const Status sealed_status = t.pool->SealPages({*page});
    const Status checked = rng() % 4 == 0
                               ? t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kScrub)
                               : OkStatus();
    // Whatever the seal and the scrub said, a full check then agrees with the model: a change
    // is reported exactly while one is pending (a write over a changed byte checks it first).
    const Status full = t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kFetch);
    if (sealed_status.ok() && checked.ok() && full.ok()) {
      REQUIRE_FALSE(pending());
      continue;
    }
    REQUIRE(pending());
    ++reported;
    // The page is beyond repair for its owner: start over on a fresh one.
    REQUIRE(t.pool->Free(*page).ok());
    page = t.pool->Allocate();
    REQUIRE(page.ok());
    std::fill(changed.begin(), changed.end(), 0);
  }
  CHECK(reported > 10);
}

// ---- Verified since written (pool.verify_on_fetch = "unverified") -----------------------------

constexpr auto kUnverified = PageAllocator::FetchVerify::kUnverified;
constexpr auto kFetch = PageAllocator::VerifyReason::kFetch;
constexpr auto kScrub = PageAllocator::VerifyReason::kScrub;

TEST_CASE("PageAllocator verify-once: a FETCH checks a chunk once until it is written again",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10, kUnverified);
  ForeignMapping foreign(t.name, 1 << 20);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  const uint32_t p = *page;
  t.Write(p, 0, 6 * kChunk + 100, 1);
  REQUIRE(t.pool->SealPages({p}).ok());
  auto verified = [&] { return t.pool->Stats().verified_bytes_total; };

  SECTION("a chunk changed before any FETCH verified it is found by the next FETCH") {
    foreign.Flip(t.pool->PageOffset(p) + 2 * kChunk + 7);
    const Status lost = t.pool->VerifyRanges({{p, 0, 6 * kChunk + 100}}, kFetch);
    CHECK(lost.code() == StatusCode::kDataLoss);
    CHECK_FALSE(t.pool->ChunkVerified(p, 2));
    CHECK(t.pool->VerifyRanges({{p, 2 * kChunk, 2 * kChunk + 1}}, kFetch).code() ==
          StatusCode::kDataLoss);  // Found changed: not skipped by any later FETCH.
  }
  SECTION("a change after the FETCH's check is the scrubber's to find") {
    uint64_t before = verified();
    REQUIRE(t.pool->VerifyRanges({{p, 0, 6 * kChunk + 100}}, kFetch).ok());
    CHECK(verified() - before == 6 * kChunk + 100);
    for (uint32_t c = 0; c < 7; ++c) CHECK(t.pool->ChunkVerified(p, c));
    CHECK_FALSE(t.pool->ChunkVerified(p, 7));  // Nothing sealed there.
    before = verified();
    REQUIRE(t.pool->VerifyRanges({{p, 0, 6 * kChunk + 100}}, kFetch).ok());
    CHECK(verified() == before);  // Nothing written since: nothing to check.
    foreign.Flip(t.pool->PageOffset(p) + 3 * kChunk + 9);
    CHECK(t.pool->VerifyRanges({{p, 0, 6 * kChunk + 100}}, kFetch).ok());  // The contract.
    const Status scrubbed = t.pool->VerifyPages({p}, kScrub);
    CHECK(scrubbed.code() == StatusCode::kDataLoss);
    CHECK_THAT(scrubbed.message(), Catch::Contains("found by the scrubber"));
    // What the scrubber found changed is checked again by every FETCH that reads it.
    CHECK_FALSE(t.pool->ChunkVerified(p, 3));
    CHECK(t.pool->VerifyRanges({{p, 3 * kChunk, 3 * kChunk + 1}}, kFetch).code() ==
          StatusCode::kDataLoss);
  }
  SECTION("a write makes its chunks unverified; the next FETCH checks those and only those") {
    REQUIRE(t.pool->VerifyPages({p}, kFetch).ok());
    // A rewrite of chunk 1 (checked before it changes, as always) and an append that extends
    // the partial chunk 6.
    t.Write(p, kChunk + 10, 20, 2);
    t.Write(p, 6 * kChunk + 100, 50, 3);
    CHECK_FALSE(t.pool->ChunkVerified(p, 1));
    CHECK_FALSE(t.pool->ChunkVerified(p, 6));
    CHECK(t.pool->ChunkVerified(p, 0));
    REQUIRE(t.pool->SealPages({p}).ok());
    // A change between the seal and the next FETCH, in a chunk the request wrote.
    foreign.Flip(t.pool->PageOffset(p) + 6 * kChunk + 1);
    const uint64_t before = verified();
    CHECK(t.pool->VerifyPages({p}, kFetch).code() == StatusCode::kDataLoss);
    CHECK(verified() - before == kChunk + 150);  // Chunk 1, and chunk 6's 150 sealed bytes.
  }
  SECTION("a write after a hidden change launders nothing: the seal or the next FETCH sees it") {
    REQUIRE(t.pool->VerifyPages({p}, kFetch).ok());
    foreign.Flip(t.pool->PageOffset(p) + 6 * kChunk + 5);  // Hidden: chunk 6 was verified.
    t.Write(p, 6 * kChunk + 100, 50, 3);                   // Extends chunk 6's checksum.
    REQUIRE(t.pool->SealPages({p}).ok());
    CHECK(t.pool->VerifyPages({p}, kFetch).code() == StatusCode::kDataLoss);
  }
  SECTION("copies and the scrubber check verified chunks too, and set no bits") {
    REQUIRE(t.pool->VerifyPages({p}, kFetch).ok());
    foreign.Flip(t.pool->PageOffset(p) + 4 * kChunk);
    CHECK(t.pool->VerifyPages({p}, PageAllocator::VerifyReason::kCopy).code() ==
          StatusCode::kDataLoss);
    StatusOr<uint32_t> other = t.pool->Allocate();
    REQUIRE(other.ok());
    t.Write(*other, 0, kChunk, 4);
    REQUIRE(t.pool->SealPages({*other}).ok());
    REQUIRE(t.pool->VerifyPages({*other}, kScrub).ok());
    CHECK_FALSE(t.pool->ChunkVerified(*other, 0));
  }
  SECTION("a freed page forgets its bits") {
    REQUIRE(t.pool->VerifyPages({p}, kFetch).ok());
    REQUIRE(t.pool->Free(p).ok());
    StatusOr<uint32_t> again = t.pool->Allocate();
    REQUIRE(again.ok());
    REQUIRE(*again == p);  // The stack hands the page straight back.
    for (uint32_t c = 0; c < 16; ++c) CHECK_FALSE(t.pool->ChunkVerified(p, c));
  }
  SECTION("a budget: nothing checked when more than it is left, all of it otherwise") {
    PageAllocator::VerifyBudget small{.max_bytes = 6 * kChunk};
    uint64_t before = verified();
    REQUIRE(t.pool->VerifyPages({p}, kFetch, &small).ok());
    CHECK(small.exceeded);
    CHECK(verified() == before);
    CHECK_FALSE(t.pool->ChunkVerified(p, 0));
    REQUIRE(t.pool->VerifyRanges({{p, 0, 2 * kChunk}}, kFetch).ok());
    PageAllocator::VerifyBudget enough{.max_bytes = 6 * kChunk};  // 4 chunks + 100 B are left.
    before = verified();
    REQUIRE(t.pool->VerifyPages({p}, kFetch, &enough).ok());
    CHECK_FALSE(enough.exceeded);
    CHECK(verified() - before == 4 * kChunk + 100);
  }
}

TEST_CASE(
    "PageAllocator verify-once: FETCHes racing a scrub that finds a change leave it unverified",
    "[controller][checksum]") {
  // A cached prefix's chunk is checked by FETCHes of several sequences under their own locks
  // while the scrubber may find it changed: a FETCH whose check passed before the change must
  // not mark the chunk verified after the scrubber cleared it.
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10, kUnverified);
  ForeignMapping foreign(t.name, 1 << 20);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  const uint32_t p = *page;
  t.Write(p, 0, 4 * kChunk, 1);
  REQUIRE(t.pool->SealPages({p}).ok());
  for (int round = 0; round < 20; ++round) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> fetchers;
    for (int f = 0; f < 2; ++f) {
      fetchers.emplace_back([&] {
        while (!stop.load()) (void)t.pool->VerifyRanges({{p, 0, 4 * kChunk}}, kFetch);
      });
    }
    foreign.Flip(t.pool->PageOffset(p) + 2 * kChunk + round);
    while (t.pool->VerifyPages({p}, kScrub).ok()) {
    }
    stop = true;
    for (std::thread& f : fetchers) f.join();
    CHECK_FALSE(t.pool->ChunkVerified(p, 2));
    CHECK(t.pool->VerifyRanges({{p, 2 * kChunk, 2 * kChunk + 1}}, kFetch).code() ==
          StatusCode::kDataLoss);
    foreign.Flip(t.pool->PageOffset(p) + 2 * kChunk + round);  // Repaired for the next round.
    REQUIRE(t.pool->VerifyPages({p}, kScrub).ok());
    REQUIRE(t.pool->VerifyPages({p}, kFetch).ok());
  }
}

TEST_CASE("PageAllocator verify_on_fetch all: every FETCH checks every chunk",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10);
  CHECK(t.pool->fetch_verify() == PageAllocator::FetchVerify::kAll);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  t.Write(*page, 0, 3 * kChunk, 1);
  REQUIRE(t.pool->SealPages({*page}).ok());
  REQUIRE(t.pool->VerifyPages({*page}, kFetch).ok());
  const uint64_t before = t.pool->Stats().verified_bytes_total;
  REQUIRE(t.pool->VerifyPages({*page}, kFetch).ok());
  CHECK(t.pool->Stats().verified_bytes_total - before == 3 * kChunk);
  ForeignMapping foreign(t.name, 1 << 20);
  foreign.Flip(t.pool->PageOffset(*page) + 5);
  CHECK(t.pool->VerifyPages({*page}, kFetch).code() == StatusCode::kDataLoss);
}

TEST_CASE("PageAllocator verify-once: random writes, FETCHes, scrubs and foreign changes",
          "[controller][checksum]") {
  // A model of the weaker guarantee: a foreign change to a chunk no FETCH verified since it was
  // last written is reported by the next FETCH (or the seal of a request that rewrites it); one
  // made after a FETCH verified the chunk may pass FETCHes, but is reported by the scrubber and
  // by the first FETCH after any write to its chunk; no check reports a change that is not there.
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10, kUnverified);
  ForeignMapping foreign(t.name, 1 << 20);
  std::mt19937 rng(20261203);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  constexpr uint32_t kChunks = (64 << 10) / kChunk;
  std::vector<uint8_t> changed(64 << 10, 0);   // XOR of foreign changes below the sealed end.
  std::vector<uint8_t> must_find(kChunks, 0);  // Changed while the chunk was not verified.
  auto pending = [&](uint32_t c) {
    return std::any_of(changed.begin() + c * kChunk, changed.begin() + (c + 1) * kChunk,
                       [](uint8_t x) { return x != 0; });
  };
  auto any_pending = [&] {
    for (uint32_t c = 0; c < kChunks; ++c) {
      if (pending(c)) return true;
    }
    return false;
  };
  int reported = 0, hidden_passes = 0, fetches = 0;
  for (int request = 0; request < 600; ++request) {
    const uint32_t sealed = static_cast<uint32_t>(t.pool->SealedBytes(*page));
    if (sealed > 0 && rng() % 4 == 0) {
      const uint32_t at = rng() % sealed;
      if (!t.pool->ChunkVerified(*page, at / kChunk)) must_find[at / kChunk] = 1;
      foreign.Flip(t.pool->PageOffset(*page) + at);
      changed[at] ^= 0x5A;
    }
    const int writes = static_cast<int>(rng() % 3);
    for (int w = 0; w < writes; ++w) {
      const uint32_t begin = rng() % ((64 << 10) - 300);
      const uint32_t bytes = 1 + rng() % 300;
      t.Write(*page, begin, bytes, static_cast<uint8_t>(request));
      for (uint32_t c = begin / kChunk; c <= (begin + bytes - 1) / kChunk; ++c) {
        REQUIRE_FALSE(t.pool->ChunkVerified(*page, c));
        must_find[c] = 1;  // Written: whatever changed in it is the next check's to find.
      }
    }
    Status status = t.pool->SealPages({*page});
    // A seal may unverify more than the written chunks (the chunk of the old sealed end, when a
    // write past it leaves a gap): a FETCH then checks those too.
    for (uint32_t c = 0; c < kChunks; ++c) {
      if (!t.pool->ChunkVerified(*page, c)) must_find[c] = 1;
    }
    const int op = static_cast<int>(rng() % 3);
    if (status.ok() && op == 0) {
      ++fetches;
      status = t.pool->VerifyPages({*page}, kFetch);
      bool must = false;
      for (uint32_t c = 0; c < kChunks; ++c) must = must || (must_find[c] && pending(c));
      REQUIRE(status.ok() != must);
      if (status.ok()) {
        hidden_passes += any_pending();
        std::fill(must_find.begin(), must_find.end(), 0);  // Verified: changes now hide.
      }
    } else if (status.ok() && op == 1) {
      status = t.pool->VerifyPages({*page}, kScrub);
      REQUIRE(status.ok() == !any_pending());
    }
    if (status.ok()) continue;
    REQUIRE(any_pending());
    ++reported;
    // The page is beyond repair for its owner: start over on a fresh one.
    REQUIRE(t.pool->Free(*page).ok());
    page = t.pool->Allocate();
    REQUIRE(page.ok());
    std::fill(changed.begin(), changed.end(), 0);
    std::fill(must_find.begin(), must_find.end(), 0);
  }
  CHECK(reported > 10);
  CHECK(fetches > 100);
  CHECK(hidden_passes > 3);  // The weaker contract was exercised, and held.
}

TEST_CASE("PageAllocator checksums: off means nothing is sealed or verified",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/false);
  CHECK_FALSE(t.pool->checksums());
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  t.Write(*page, 0, 100, 3);
  REQUIRE(t.pool->SealPages({*page}).ok());
  ForeignMapping foreign(t.name, 1 << 20);
  foreign.Flip(t.pool->PageOffset(*page) + 5);
  CHECK(t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kFetch).ok());
  CHECK(t.pool->Stats().checksum_failures_total == 0);
}

// ---- Through the Controller ---------------------------------------------------------------------

constexpr uint32_t kLayers = 2, kHeads = 2, kHeadDim = 64, kTokens = 200;

struct Daemonless {
  Config config;
  std::unique_ptr<Controller> controller;
  uint64_t session = 0;
  std::vector<uint16_t> k, v;  // fp16 [layers, tokens, heads, head_dim].

  // `evict_fraction` > 0: streaming eviction keeping that fraction of each head's tokens.
  explicit Daemonless(bool checksums, VerifyOnFetch verify = VerifyOnFetch::kUnverified,
                      double evict_fraction = 0) {
    if (evict_fraction > 0) {
      config.budget.mode = BudgetMode::kEvictOnly;
      config.budget.token_fraction = evict_fraction;
      config.evict.policy = EvictPolicy::kStreaming;
    }
    config.pool.bytes = 16 << 20;
    config.pool.page_bytes = 4096;
    config.pool.shm_name = UniqueShmName("ctl");
    config.pool.staging_slots = 0;
    config.pool.checksums = checksums;
    config.pool.verify_on_fetch = verify;
    config.quant.method = QuantMethod::kKivi;
    config.quant.k_bits = config.quant.v_bits = 2;
    StatusOr<std::unique_ptr<Controller>> created = Controller::Create(config);
    REQUIRE(created.ok());
    controller = std::move(created).value();
    ipc::HelloRequest hello;
    hello.client_name = "checksum_test";
    hello.geometry = {kLayers, kHeads, 0, kHeadDim, DType::kF16};
    StatusOr<ipc::HelloReply> reply = controller->Hello(hello, Now());
    REQUIRE(reply.ok());
    session = reply->session_id;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    k.resize(size_t{kLayers} * kTokens * kHeads * kHeadDim);
    v.resize(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = FloatToHalf(normal(rng));
    for (size_t i = 0; i < v.size(); ++i) v[i] = FloatToHalf(normal(rng));
  }
  static SteadyTime Now() { return std::chrono::steady_clock::now(); }

  Status Store(uint64_t seq) {
    KVCTL_RETURN_IF_ERROR(controller->Open({session, seq}, Now()));
    return Append(seq, 0, kTokens);
  }
  Status Append(uint64_t seq, uint64_t first, uint32_t n) {
    ipc::AppendRequest request{
        .session_id = session, .sequence_id = seq, .first_position = first, .n_tokens = n};
    // The first n tokens of every layer, [layers, n, heads, head_dim].
    std::vector<uint16_t> kn, vn;
    const size_t per_token = size_t{kHeads} * kHeadDim;
    for (uint32_t l = 0; l < kLayers; ++l) {
      const size_t at = size_t{l} * kTokens * per_token;
      kn.insert(kn.end(), k.begin() + at, k.begin() + at + n * per_token);
      vn.insert(vn.end(), v.begin() + at, v.begin() + at + n * per_token);
    }
    request.k = zmq::message_t(kn.data(), kn.size() * 2);
    request.v = zmq::message_t(vn.data(), vn.size() * 2);
    return controller->Append(request, Now()).status();
  }
  StatusOr<ipc::ReplyBody> Fetch(uint64_t seq, ipc::FetchMode mode, uint32_t layer_begin = 0,
                                 uint32_t layer_end = kLayers) {
    return controller->Fetch({.session_id = session,
                              .sequence_id = seq,
                              .layer_begin = layer_begin,
                              .layer_end = layer_end,
                              .mode = mode},
                             Now());
  }
  // Pool offset of the first record of (layer 0, head 0) of `seq`, from its blocks reply.
  uint64_t FirstRecordOffset(uint64_t seq) {
    StatusOr<ipc::ReplyBody> body = Fetch(seq, ipc::FetchMode::kBlocks);
    REQUIRE(body.ok());
    const auto& blocks = std::get<ipc::FetchBlocksReply>(*body);
    REQUIRE(!blocks.indices.empty());
    const ipc::RecordLayout& layout = blocks.layouts[blocks.layout_index[0]];
    const uint32_t id = blocks.indices[0];
    return uint64_t{id / layout.records_per_page} * blocks.page_bytes +
           uint64_t{id % layout.records_per_page} * layout.record_bytes;
  }
  std::string Stats() {
    StatusOr<std::string> text = controller->Stats({0, "pool"}, Now());
    REQUIRE(text.ok());
    return *text;
  }
};

uint64_t StatsField(const std::string& text, const std::string& key) {
  const size_t at = text.find("\n" + key + ":");
  REQUIRE(at != std::string::npos);
  return std::stoull(text.substr(at + key.size() + 2));
}

TEST_CASE("Controller: FETCH and APPEND of a sequence whose page changed fail closed, others not",
          "[controller][checksum]") {
  for (VerifyOnFetch verify : {VerifyOnFetch::kAll, VerifyOnFetch::kUnverified}) {
    INFO("verify_on_fetch " << (verify == VerifyOnFetch::kAll ? "all" : "unverified"));
    Daemonless d(/*checksums=*/true, verify);
    REQUIRE(d.Store(1).ok());
    REQUIRE(d.Store(2).ok());
    REQUIRE(d.Fetch(1, ipc::FetchMode::kDense).ok());
    const uint64_t offset = d.FirstRecordOffset(1);
    CHECK(StatsField(d.Stats(), "checksum_failures_total") == 0);
    CHECK(StatsField(d.Stats(), "checksums") == 1);

    ForeignMapping foreign(d.config.pool.shm_name, d.config.pool.bytes);
    foreign.Flip(offset + 3);
    if (verify == VerifyOnFetch::kUnverified) {
      // FETCH verified this record already and nothing wrote it since: FETCH does not check it
      // again (docs/reliability.md); the scrubber's next walk finds the change.
      CHECK(d.Fetch(1, ipc::FetchMode::kBlocks).ok());
      d.controller->Scrub(uint64_t{1} << 30);
    }
    for (ipc::FetchMode mode : {ipc::FetchMode::kBlocks, ipc::FetchMode::kDense}) {
      StatusOr<ipc::ReplyBody> fetched = d.Fetch(1, mode);
      CHECK(fetched.status().code() == StatusCode::kDataLoss);
      CHECK_THAT(fetched.status().message(), Catch::Contains("changed outside the daemon"));
    }
    const Status appended = d.Append(1, kTokens, 1);
    CHECK(appended.code() == StatusCode::kDataLoss);
    // The other sequence fetches, appends and fetches again as before.
    CHECK(d.Fetch(2, ipc::FetchMode::kDense).ok());
    CHECK(d.Fetch(2, ipc::FetchMode::kBlocks).ok());
    CHECK(d.Append(2, kTokens, 1).ok());
    CHECK(d.Fetch(2, ipc::FetchMode::kDense).ok());
    const std::string stats = d.Stats();
    CHECK(StatsField(stats, "checksum_failures_total") == 1);  // One page, counted once.
    CHECK(StatsField(stats, "verified_bytes_total") > 0);
    // Closing the lost sequence frees it; a new one reuses its pages cleanly.
    REQUIRE(d.controller->Close({d.session, 1}, Daemonless::Now()).ok());
    REQUIRE(d.Store(3).ok());
    CHECK(d.Fetch(3, ipc::FetchMode::kDense).ok());
  }
}

TEST_CASE("Controller: a record changed before any FETCH verified it is found by the next FETCH",
          "[controller][checksum]") {
  // Two controllers given the same requests place the same records at the same pool offsets:
  // the first tells where sequence 1's first record lies, the second is never fetched before
  // the change.
  Daemonless probe(/*checksums=*/true);
  REQUIRE(probe.Store(1).ok());
  const uint64_t offset = probe.FirstRecordOffset(1);
  Daemonless d(/*checksums=*/true);
  REQUIRE(d.Store(1).ok());
  ForeignMapping foreign(d.config.pool.shm_name, d.config.pool.bytes);
  foreign.Flip(offset + 1);
  StatusOr<ipc::ReplyBody> fetched = d.Fetch(1, ipc::FetchMode::kBlocks, 0, 1);
  CHECK(fetched.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(fetched.status().message(), Catch::Contains("found by FETCH"));
}

TEST_CASE("Controller: a FETCH verifies what was written since the last one, not the sequence",
          "[controller][checksum]") {
  Daemonless d(/*checksums=*/true);
  REQUIRE(d.Store(1).ok());
  auto verified = [&d] { return StatsField(d.Stats(), "verified_bytes_total"); };
  uint64_t before = verified();
  REQUIRE(d.Fetch(1, ipc::FetchMode::kBlocks, 0, 1).ok());
  const uint64_t first = verified() - before;
  CHECK(first > 0);
  before = verified();
  REQUIRE(d.Fetch(1, ipc::FetchMode::kBlocks, 0, 1).ok());
  CHECK(verified() == before);  // Nothing written since.
  REQUIRE(d.Fetch(1, ipc::FetchMode::kBlocks, 1, 2).ok());
  CHECK(verified() > before);  // Layer 1 was not verified yet.
  // A decode step writes a row per head and layer: the next FETCH checks the chunks those rows
  // lie in (a chunk per row at most), a small part of what the first FETCH checked.
  for (uint64_t t = kTokens; t < kTokens + 3; ++t) {
    REQUIRE(d.Append(1, t, 1).ok());
    before = verified();
    REQUIRE(d.Fetch(1, ipc::FetchMode::kBlocks, 0, 1).ok());
    const uint64_t step = verified() - before;
    CHECK(step > 0);
    CHECK(step <= uint64_t{kHeads} * 2 * kChunk);
    CHECK(step < first);
  }
  // The whole-sequence FETCH (pages, not ranges) follows the same rule.
  REQUIRE(d.Fetch(1, ipc::FetchMode::kDense).ok());
  before = verified();
  REQUIRE(d.Fetch(1, ipc::FetchMode::kDense).ok());
  CHECK(verified() == before);
  // pool.verify_on_fetch = "all": every FETCH checks everything again.
  Daemonless all(/*checksums=*/true, VerifyOnFetch::kAll);
  REQUIRE(all.Store(1).ok());
  REQUIRE(all.Fetch(1, ipc::FetchMode::kBlocks, 0, 1).ok());
  before = StatsField(all.Stats(), "verified_bytes_total");
  REQUIRE(all.Fetch(1, ipc::FetchMode::kBlocks, 0, 1).ok());
  CHECK(StatsField(all.Stats(), "verified_bytes_total") - before == first);
}

TEST_CASE("Controller: a stored row changed before its flush is found, not quantized into a record",
          "[controller][checksum]") {
  // A flush reads the fp16 tail rows it quantizes from the pool. Changed behind the daemon's back,
  // a finite value was encoded into a record with a fresh checksum (laundered, unless a
  // compaction happened to check the page), and a NaN made the quantizer refuse the row: that
  // APPEND and every later one answered INVALID_ARGUMENT, blaming the engine's input. The flush
  // now checks the rows first (PageAllocator kRewrite), and a row the quantizer refuses makes it
  // check the layer. With streaming eviction a compression re-packs the tail (and the records
  // behind a cut) instead: the same checks come before it reads them.
  for (const double evict_fraction : {0.0, 0.5})
    for (VerifyOnFetch verify : {VerifyOnFetch::kAll, VerifyOnFetch::kUnverified}) {
      INFO("evict_fraction " << evict_fraction << ", verify_on_fetch "
                             << (verify == VerifyOnFetch::kAll ? "all" : "unverified"));
      Daemonless d(/*checksums=*/true, verify, evict_fraction);
      REQUIRE(d.Store(1).ok());
      REQUIRE(d.Store(2).ok());
      // The newest tail row of (layer 0, head 0): the last window row of pair 0.
      StatusOr<ipc::ReplyBody> body = d.Fetch(1, ipc::FetchMode::kBlocks, 0, 1);
      REQUIRE(body.ok());
      const auto& blocks = std::get<ipc::FetchBlocksReply>(*body);
      REQUIRE(blocks.window_indptr[1] > blocks.window_sinks[0]);  // A tail to flush.
      const ipc::RecordLayout& layout = blocks.layouts[blocks.layout_index[0]];
      const uint32_t row = blocks.window_ids[blocks.window_indptr[1] - 1];
      const uint64_t offset = uint64_t{row / layout.rows_per_page} * blocks.page_bytes +
                              uint64_t{row % layout.rows_per_page} * layout.row_slot_bytes;
      // K[0] of that row becomes a NaN.
      const uint16_t nan = 0x7E00;
      const int fd = shm_open(d.config.pool.shm_name.c_str(), O_RDWR, 0);
      REQUIRE(fd >= 0);
      REQUIRE(pwrite(fd, &nan, 2, static_cast<off_t>(offset)) == 2);
      close(fd);
      // Decode steps until the tail flushes: that APPEND fails closed.
      Status appended = OkStatus();
      uint64_t t = kTokens;
      for (; t < kTokens + 300 && appended.ok(); ++t) appended = d.Append(1, t, 1);
      INFO(appended.ToString());
      CHECK(appended.code() == StatusCode::kDataLoss);
      CHECK_THAT(appended.message(), Catch::Contains("changed outside the daemon"));
      if (verify == VerifyOnFetch::kAll) {
        // Found by the check before the flush or re-pack. With "unverified" that check trusts
        // the chunk the blocks FETCH above verified, and what finds the change is the
        // quantizer's refusal of the NaN (every slot of the layer is then checked) or the
        // re-pack's rewrite of the chunk (MarkDirty checks it first): DATA_LOSS all the same.
        CHECK_THAT(appended.message(),
                   Catch::Contains("before the daemon copied or re-encoded them"));
      }
      CHECK(d.Fetch(1, ipc::FetchMode::kBlocks).status().code() == StatusCode::kDataLoss);
      // The other sequence flushes through the same steps untouched.
      for (uint64_t u = kTokens; u < t; ++u) REQUIRE(d.Append(2, u, 1).ok());
      CHECK(d.Fetch(2, ipc::FetchMode::kDense).ok());
    }
}

TEST_CASE("Controller: decode steps extend checksums, only a flush re-checks whole pages",
          "[controller][checksum]") {
  Daemonless d(/*checksums=*/true);
  REQUIRE(d.controller->Open({d.session, 1}, Daemonless::Now()).ok());
  // Steps that checksummed whole pages again (verified_bytes_total grows before a rewrite).
  int rechecks = 0, flushes = 0;
  uint64_t before = StatsField(d.Stats(), "verified_bytes_total");
  uint64_t quantized = 0;
  for (uint64_t t = 0; t < 600; ++t) {
    ipc::AppendRequest request{
        .session_id = d.session, .sequence_id = 1, .first_position = t, .n_tokens = 1};
    std::vector<uint16_t> kn(size_t{kLayers} * kHeads * kHeadDim, FloatToHalf(0.5f));
    request.k = zmq::message_t(kn.data(), kn.size() * 2);
    request.v = zmq::message_t(kn.data(), kn.size() * 2);
    StatusOr<ipc::AppendReply> reply = d.controller->Append(request, Daemonless::Now());
    REQUIRE(reply.ok());
    flushes += reply->tokens_quantized != quantized;
    quantized = reply->tokens_quantized;
    const uint64_t after = StatsField(d.Stats(), "verified_bytes_total");
    rechecks += after != before;
    before = after;
  }
  REQUIRE(flushes > 2);
  CHECK(rechecks <= flushes);
  CHECK(d.Fetch(1, ipc::FetchMode::kDense).ok());
}

TEST_CASE("Controller: the scrubber finds a changed page without any FETCH",
          "[controller][checksum]") {
  Daemonless d(/*checksums=*/true);
  REQUIRE(d.Store(1).ok());
  REQUIRE(d.Store(2).ok());
  const uint64_t offset = d.FirstRecordOffset(2);
  // A clean pass verifies everything stored and finds nothing.
  const uint64_t clean = d.controller->Scrub(uint64_t{1} << 30);
  CHECK(clean > 0);
  CHECK(StatsField(d.Stats(), "scrubbed_bytes_total") == clean);
  CHECK(StatsField(d.Stats(), "checksum_failures_total") == 0);

  ForeignMapping foreign(d.config.pool.shm_name, d.config.pool.bytes);
  foreign.Flip(offset);
  // Small budgets: passes take the sequences in turn and go on where the last one stopped.
  for (int pass = 0; pass < 1000 && StatsField(d.Stats(), "checksum_failures_total") == 0; ++pass) {
    d.controller->Scrub(4096);
  }
  CHECK(StatsField(d.Stats(), "checksum_failures_total") == 1);
  CHECK(d.Fetch(2, ipc::FetchMode::kDense).status().code() == StatusCode::kDataLoss);
  CHECK(d.Fetch(1, ipc::FetchMode::kDense).ok());
  // A lost sequence is not scrubbed (or counted) again.
  d.controller->Scrub(uint64_t{1} << 30);
  CHECK(StatsField(d.Stats(), "checksum_failures_total") == 1);
}

TEST_CASE("Controller: pool.checksums = false verifies nothing (the operator's off switch)",
          "[controller][checksum]") {
  Daemonless d(/*checksums=*/false);
  REQUIRE(d.Store(1).ok());
  const uint64_t offset = d.FirstRecordOffset(1);
  ForeignMapping foreign(d.config.pool.shm_name, d.config.pool.bytes);
  foreign.Flip(offset);
  CHECK(d.Fetch(1, ipc::FetchMode::kDense).ok());
  CHECK(d.controller->Scrub(uint64_t{1} << 30) == 0);
  CHECK(StatsField(d.Stats(), "checksums") == 0);
  CHECK(Scrubber::Start(d.config.pool, d.controller.get()) == nullptr);
}

TEST_CASE("Config: scrubber keys are validated with named errors", "[controller][checksum]") {
  Config config;
  config.pool.page_bytes = 64 << 10;
  config.pool.scrub_interval_ms = 10;
  config.pool.scrub_bytes_per_second = 1 << 20;  // 10 KiB per period: less than a page.
  const Status s = ValidateConfig(config);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("pool.scrub_bytes_per_second"));
  config.pool.scrub_interval_ms = 100;
  CHECK(ValidateConfig(config).ok());
  CHECK(Scrubber::BytesPerPass(config.pool) == (1 << 20) / 10);
  config.pool.scrub_interval_ms = 0;  // Off: no constraint.
  CHECK(ValidateConfig(config).ok());
}

}  // namespace
}  // namespace kvctl
