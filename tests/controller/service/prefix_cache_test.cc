// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The local prefix cache (controller/service/prefix_cache.h): the longest held prefix whose ids
// match is opened, ids decide over keys, the bound evicts least recently used unread entries and
// never a read one, Shed frees pages under pressure, and the scrubber drops a changed entry.
#include "controller/service/prefix_cache.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "controller/sequence/sequence_image.h"
#include "tests/controller/sequence/image_test_util.h"

namespace kvctl {
namespace {

using namespace image_test;  // NOLINT: the shared helpers of these tests.

std::vector<LayerPlan> Plans() {
  return {Plan(QuantMethod::kKivi, kHeads, {{2, 2}}), Plan(QuantMethod::kKivi, kHeads, {{4, 4}})};
}

// A frozen prefix of `tokens` tokens from seed `seed`.
std::shared_ptr<KvSequence> Frozen(PageAllocator* pool, int64_t tokens, uint64_t seed) {
  KvSequence seq(pool, Geometry(DType::kF32), Plans());
  const Data data = MakeData(kLayers, tokens, kHeads, DType::kF32, seed);
  REQUIRE(AppendRange(&seq, data, 0, 0, tokens).ok());
  StatusOr<std::vector<uint8_t>> image = ExportImage(seq, tokens, "");
  REQUIRE(image.ok());
  StatusOr<std::unique_ptr<KvSequence>> frozen =
      ImportImage(pool, *image, Geometry(DType::kF32), "");
  REQUIRE(frozen.ok());
  return std::move(frozen).value();
}

std::vector<int32_t> Ids(int n, int32_t first = 1) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = first + i;
  return ids;
}

PrefixCache::OpenFn ForkFn() {
  return [](std::shared_ptr<const KvSequence> prefix) { return KvSequence::Fork(prefix, 0); };
}

uint32_t FreeOf(const PageAllocator& pool) { return FreePages(pool); }

TEST_CASE("Prefix cache: the longest matching prefix is opened, ids decide", "[service][prefix]") {
  auto pool = testing::MakeTestPool(32 << 20, 16 << 10);
  PrefixCache cache(16 << 20);
  REQUIRE(cache.Insert("k1", Ids(128), Frozen(pool.get(), 128, 1)));
  REQUIRE(cache.Insert("k2", Ids(256), Frozen(pool.get(), 256, 1)));
  const std::vector<int32_t> prompt = Ids(300);
  {
    const std::vector<std::string> keys = {"k1", "k2", "k3"};
    PrefixCache::Opened o = cache.OpenLongest(keys, prompt, ForkFn());
    REQUIRE(o.index == 1);
    REQUIRE(o.seq.ok());
    REQUIRE((*o.seq)->tokens() == 256);
    REQUIRE((*o.seq)->shares_pages());
    REQUIRE(cache.counters().read_entries == 1);
  }
  REQUIRE(cache.counters().read_entries == 0);
  // A key whose stored ids differ from the prompt's (a collision, or a stale key) is passed over.
  std::vector<int32_t> other = prompt;
  other[200] = -7;
  PrefixCache::Opened o = cache.OpenLongest(std::vector<std::string>{"k1", "k2"}, other, ForkFn());
  REQUIRE(o.index == 0);
  REQUIRE((*o.seq)->tokens() == 128);
  // Nothing held under the keys: no sequence, no error.
  PrefixCache::Opened none = cache.OpenLongest(std::vector<std::string>{"x"}, prompt, ForkFn());
  REQUIRE(none.index == -1);
  REQUIRE(none.seq.ok());
  REQUIRE(*none.seq == nullptr);
  // Find: the same key and ids only.
  REQUIRE(cache.Find("k2", Ids(256)) != nullptr);
  REQUIRE(cache.Find("k2", Ids(255)) == nullptr);
  REQUIRE(cache.Find("k3", Ids(256)) == nullptr);
  const PrefixCacheCounters c = cache.counters();
  REQUIRE(c.lookups == 3);
  REQUIRE(c.hits == 2);
  REQUIRE(c.hit_tokens == 384);
}

TEST_CASE("Prefix cache: the bound drops unread entries, least recently used first",
          "[service][prefix]") {
  auto pool = testing::MakeTestPool(32 << 20, 16 << 10);
  const uint64_t one = Frozen(pool.get(), 256, 1)->Usage().pool_bytes;
  PrefixCache cache(2 * one);
  REQUIRE(cache.Insert("a", Ids(256), Frozen(pool.get(), 256, 1)));
  REQUIRE(cache.Insert("b", Ids(256, 1000), Frozen(pool.get(), 256, 2)));
  // a is read by an open sequence: it stays, b (unread) goes for c.
  PrefixCache::Opened reader = cache.OpenLongest(std::vector<std::string>{"a"}, Ids(256), ForkFn());
  REQUIRE(reader.seq.ok());
  REQUIRE(cache.Insert("c", Ids(256, 5000), Frozen(pool.get(), 256, 3)));
  REQUIRE(cache.OpenLongest(std::vector<std::string>{"b"}, Ids(256, 1000), ForkFn()).index == -1);
  REQUIRE(cache.counters().entries == 2);
  REQUIRE(cache.counters().dropped == 1);
  // Both held entries read: a third does not fit and is refused, nothing dropped.
  PrefixCache::Opened reader_c =
      cache.OpenLongest(std::vector<std::string>{"c"}, Ids(256, 5000), ForkFn());
  REQUIRE(reader_c.seq.ok());
  REQUIRE(!cache.Insert("d", Ids(256, 9000), Frozen(pool.get(), 256, 4)));
  REQUIRE(cache.counters().inserts_refused == 1);
  REQUIRE(cache.counters().entries == 2);
  REQUIRE(cache.counters().held_bytes == 2 * one);
}

TEST_CASE("Prefix cache: Shed frees the pages of unread entries only", "[service][prefix]") {
  auto pool = testing::MakeTestPool(32 << 20, 16 << 10);
  PrefixCache cache(32 << 20);
  REQUIRE(cache.Insert("a", Ids(256), Frozen(pool.get(), 256, 1)));
  REQUIRE(cache.Insert("b", Ids(256, 1000), Frozen(pool.get(), 256, 2)));
  PrefixCache::Opened reader =
      cache.OpenLongest(std::vector<std::string>{"b"}, Ids(256, 1000), ForkFn());
  REQUIRE(reader.seq.ok());
  const uint32_t free_before = FreeOf(*pool);
  const int64_t freed = cache.Shed(1000, pool->page_bytes());
  REQUIRE(freed > 0);
  REQUIRE(FreeOf(*pool) - free_before == static_cast<uint32_t>(freed));
  REQUIRE(cache.counters().entries == 1);  // b, read, stays.
  REQUIRE(cache.counters().shed_pages == static_cast<uint64_t>(freed));
  REQUIRE(cache.Shed(1000, pool->page_bytes()) == 0);
}

TEST_CASE("Prefix cache: the scrubber drops an entry changed behind the daemon's back",
          "[service][prefix]") {
  auto arena = ShmArena::Create("/kvctl-test-pcache-" + std::to_string(getpid()), 16 << 20);
  REQUIRE(arena.ok());
  auto pool = PageAllocator::Create(std::move(*arena), {.page_bytes = 16 << 10, .checksums = true});
  REQUIRE(pool.ok());
  PrefixCache cache(16 << 20);
  std::shared_ptr<KvSequence> a = Frozen(pool->get(), 256, 1);
  const HeadBlocks b = a->Blocks(0, 0);
  REQUIRE(cache.Insert("a", Ids(256), std::move(a)));
  REQUIRE(cache.Insert("b", Ids(256, 1000), Frozen(pool->get(), 256, 2)));
  uint64_t scrubbed = 0;
  for (int i = 0; i < 4; ++i) scrubbed += cache.Scrub(1 << 20);
  REQUIRE(scrubbed > 0);
  REQUIRE(cache.counters().lost == 0);
  (*pool)->PagePointer(b.record_ids[0] / b.records_per_page)[0] ^= 1;
  for (int i = 0; i < 4; ++i) cache.Scrub(1 << 20);
  REQUIRE(cache.counters().lost == 1);
  REQUIRE(cache.counters().entries == 1);
  REQUIRE(cache.OpenLongest(std::vector<std::string>{"a"}, Ids(256), ForkFn()).index == -1);
  REQUIRE(cache.OpenLongest(std::vector<std::string>{"b"}, Ids(256, 1000), ForkFn()).seq.ok());
}

}  // namespace
}  // namespace kvctl
