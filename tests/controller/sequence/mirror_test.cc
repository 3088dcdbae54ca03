// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Mirrored pools (Arena::mirrored, the shape of pool.backend = "cuda"): the daemon works on the
// host copy and must publish every page it changed before engines read the other copy. Here the
// other copy is a second host buffer (HostMirrorArena), so the bookkeeping is tested on every
// machine; the [cuda] test at the end runs the real device arena when a GPU is present.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "controller/pool/cuda_arena.h"
#include "controller/pool/pool.h"
#include "controller/sequence/kv_sequence.h"
#include "tests/controller/sequence/sequence_test_util.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

using testing::UniformPlans;

constexpr int kD = 64;
constexpr uint64_t kPage = 4096;

// Host memory for the daemon's copy and a second buffer standing in for device memory.
class HostMirrorArena final : public Arena {
 public:
  explicit HostMirrorArena(uint64_t bytes) : host_(bytes, 0), mirror_(bytes, 0) {}
  uint8_t* base() const override { return const_cast<uint8_t*>(host_.data()); }
  uint64_t bytes() const override { return host_.size(); }
  bool mirrored() const override { return true; }
  Status Publish(const std::vector<ByteRange>& ranges) override {
    if (fail_publish) return Unavailable("test: device copy failed");
    for (size_t i = 0; i < ranges.size(); ++i) {
      const ByteRange& r = ranges[i];
      REQUIRE(r.bytes > 0);
      REQUIRE(r.offset + r.bytes <= host_.size());
      if (i > 0) REQUIRE(ranges[i - 1].offset + ranges[i - 1].bytes < r.offset);  // Sorted, apart.
      std::memcpy(mirror_.data() + r.offset, host_.data() + r.offset, r.bytes);
      published_bytes += r.bytes;
    }
    publishes.push_back(ranges);
    return OkStatus();
  }
  Status Pull(uint64_t offset, uint64_t bytes) override {
    std::memcpy(host_.data() + offset, mirror_.data() + offset, bytes);
    return OkStatus();
  }
  Status EncodeBlocks(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records) override {
    encoded_blocks += batch.n_blocks;
    return Arena::EncodeBlocks(spec, batch, records);
  }

  uint8_t* mirror() { return mirror_.data(); }
  std::vector<std::vector<ByteRange>> publishes;  // One entry per Publish call.
  uint64_t published_bytes = 0;
  bool fail_publish = false;
  int64_t encoded_blocks = 0;

 private:
  std::vector<uint8_t> host_;
  std::vector<uint8_t> mirror_;
};

struct MirroredPool {
  HostMirrorArena* arena;  // Owned by pool.
  std::unique_ptr<PageAllocator> pool;
};

MirroredPool MakeMirroredPool(uint64_t bytes, uint32_t staging_slots = 0) {
  auto arena = std::make_unique<HostMirrorArena>(bytes);
  HostMirrorArena* raw = arena.get();
  auto pool =
      PageAllocator::Create(std::move(arena), {kPage, staging_slots, staging_slots ? kPage : 0});
  REQUIRE(pool.ok());
  return {raw, std::move(pool).value()};
}

// Every allocated page (all of them belong to the sequence under test) is equal in both copies.
void RequireAllocatedPagesPublished(const PageAllocator& pool, HostMirrorArena* arena) {
  uint32_t allocated = 0;
  for (uint32_t page = 0; page < pool.pages_total(); ++page) {
    if (!pool.IsAllocated(page)) continue;
    ++allocated;
    INFO("page " << page);
    CHECK(std::memcmp(arena->base() + pool.PageOffset(page),
                      arena->mirror() + pool.PageOffset(page), kPage) == 0);
  }
  REQUIRE(allocated > 0);
}

QuantSpec Kivi(int bits) { return testing::KiviSpec(kD, bits, bits); }

TEST_CASE("PageAllocator: a mirrored pool publishes only marked bytes, adjacent ones merged",
          "[controller]") {
  MirroredPool m = MakeMirroredPool(64 * kPage);
  PageAllocator& pool = *m.pool;
  REQUIRE(pool.mirrored());
  // Whole pages 3, 4 and 5 (one run), two slots of page 9 (one interval covering both), and
  // page 12 written but not marked: never copied.
  for (uint32_t page : {3u, 4u, 5u}) {
    pool.PagePointer(page)[7] = static_cast<uint8_t>(page);
    pool.MarkDirty(page, 0, kPage);
  }
  pool.PagePointer(9)[100] = 1;
  pool.PagePointer(9)[300] = 2;
  pool.MarkDirty(9, 300, 310);
  pool.MarkDirty(9, 100, 110);
  pool.PagePointer(12)[0] = 99;
  REQUIRE(pool.PublishPages({9, 5, 3, 4, 12, 20}).ok());
  REQUIRE(m.arena->publishes.size() == 1);  // One batch per publish.
  const std::vector<ByteRange>& r = m.arena->publishes[0];
  REQUIRE(r.size() == 2);
  CHECK(r[0].offset == 3 * kPage);
  CHECK(r[0].bytes == 3 * kPage);
  CHECK(r[1].offset == 9 * kPage + 100);
  CHECK(r[1].bytes == 210);
  for (uint32_t page : {3u, 4u, 5u}) CHECK(m.arena->mirror()[page * kPage + 7] == page);
  CHECK(m.arena->mirror()[9 * kPage + 100] == 1);
  CHECK(m.arena->mirror()[9 * kPage + 300] == 2);
  CHECK(m.arena->mirror()[12 * kPage] == 0);
  CHECK(pool.Stats().publish_ranges_total == 2);
  CHECK(pool.Stats().publish_bytes_total == 3 * kPage + 210);

  // Marks are cleared: publishing again copies nothing.
  REQUIRE(pool.PublishPages({3, 4, 5, 9}).ok());
  CHECK(m.arena->publishes.size() == 1);
}

TEST_CASE("PageAllocator: a failed publish keeps the pages marked for the next one",
          "[controller]") {
  MirroredPool m = MakeMirroredPool(16 * kPage);
  m.pool->PagePointer(2)[0] = 5;
  m.pool->MarkDirty(2, 0, 1);
  m.arena->fail_publish = true;
  Status failed = m.pool->PublishPages({2});
  CHECK(failed.code() == StatusCode::kUnavailable);
  CHECK(m.arena->mirror()[2 * kPage] == 0);
  m.arena->fail_publish = false;
  REQUIRE(m.pool->PublishPages({2}).ok());
  CHECK(m.arena->mirror()[2 * kPage] == 5);
}

TEST_CASE("PageAllocator: a host pool is not mirrored and publishing is a no-op", "[controller]") {
  auto pool = testing::MakeTestPool(1 << 20, kPage);
  CHECK(!pool->mirrored());
  pool->MarkDirty(0, 0, 8);
  CHECK(pool->PublishPages({0}).ok());
  CHECK(pool->Stats().publish_ranges_total == 0);
}

TEST_CASE("KvSequence: on a mirrored pool every page it holds is published after each request",
          "[controller]") {
  MirroredPool m = MakeMirroredPool(8 << 20);
  const int layers = 2, heads = 2;
  // Eviction on (streaming) so appends compact records, pressure on so a width can be lowered.
  EvictionSettings eviction;
  eviction.enabled = true;
  eviction.policy = EvictPolicy::kStreaming;
  eviction.window = 16;
  eviction.tokens_per_head = 300;
  PressureSettings pressure;
  pressure.lower_widths = true;
  KvSequence seq(m.pool.get(), {layers, heads, kD, DType::kF32},
                 UniformPlans(layers, heads, Kivi(4)), eviction, pressure);
  const SyntheticKv kv =
      GenerateSyntheticKv({.tokens = 900, .heads = heads, .head_dim = kD, .seed = 3});
  auto views = [&](const KvTensorView& all, int64_t first, int64_t count) {
    return std::vector<KvTensorView>(layers, all.Tokens(first, count));
  };
  int64_t at = 0;
  for (int64_t count : {200, 1, 150, 37, 300, 212}) {
    INFO("append of " << count << " at " << at);
    REQUIRE(seq.Append(at, views(kv.KView(), at, count), views(kv.VView(), at, count)).ok());
    at += count;
    RequireAllocatedPagesPublished(*m.pool, m.arena);
  }
  CHECK(seq.Blocks(0, 0).records > 0);
  CHECK(seq.HeadUsageOf(0, 0).evicted_tokens > 0);  // Compaction ran and was published.
  CHECK(m.arena->encoded_blocks > 0);               // Records were encoded by the arena.

  const size_t copies = m.arena->publishes.size();
  REQUIRE(seq.LowerWidth(1, 1, 2, 2).ok());
  CHECK(m.arena->publishes.size() > copies);
  RequireAllocatedPagesPublished(*m.pool, m.arena);
}

TEST_CASE("KvSequence: a decode append publishes only the row slots it wrote", "[controller]") {
  MirroredPool m = MakeMirroredPool(4 << 20);
  const int layers = 3, heads = 2;
  KvSequence seq(m.pool.get(), {layers, heads, kD, DType::kF32},
                 UniformPlans(layers, heads, Kivi(2)));
  const SyntheticKv kv =
      GenerateSyntheticKv({.tokens = 12, .heads = heads, .head_dim = kD, .seed = 4});
  auto views = [&](const KvTensorView& all, int64_t first, int64_t count) {
    return std::vector<KvTensorView>(layers, all.Tokens(first, count));
  };
  REQUIRE(seq.Append(0, views(kv.KView(), 0, 10), views(kv.VView(), 0, 10)).ok());
  REQUIRE(seq.Usage().quantized_tokens == 0);  // Still in the fp16 tail: no flush below either.
  const uint64_t before = m.arena->published_bytes;
  REQUIRE(seq.Append(10, views(kv.KView(), 10, 1), views(kv.VView(), 10, 1)).ok());
  // One K + V fp16 row slot per (layer, head): 2 x 64 x 2 bytes each, not whole pages.
  CHECK(m.arena->published_bytes - before == uint64_t{layers} * heads * 2 * kD * 2);
  RequireAllocatedPagesPublished(*m.pool, m.arena);
}

TEST_CASE("KvSequence: records a mirrored pool encodes equal a host pool's", "[controller]") {
  MirroredPool m = MakeMirroredPool(4 << 20);
  auto host = testing::MakeTestPool(4 << 20, kPage);
  const SyntheticKv kv =
      GenerateSyntheticKv({.tokens = 400, .heads = 1, .head_dim = kD, .seed = 9});
  const std::vector<KvTensorView> k(1, kv.KView()), v(1, kv.VView());
  KvSequence mirrored(m.pool.get(), {1, 1, kD, DType::kF32}, UniformPlans(1, 1, Kivi(2)));
  KvSequence plain(host.get(), {1, 1, kD, DType::kF32}, UniformPlans(1, 1, Kivi(2)));
  REQUIRE(mirrored.Append(0, k, v).ok());
  REQUIRE(plain.Append(0, k, v).ok());
  const HeadBlocks a = mirrored.Blocks(0, 0), b = plain.Blocks(0, 0);
  REQUIRE(a.records == b.records);
  REQUIRE(a.records > 0);
  const size_t rb = BlockLayoutOf(Kivi(2)).record_bytes;
  for (uint32_t r = 0; r < a.records; ++r) {
    const uint32_t ia = a.record_ids[r], ib = b.record_ids[r];
    const uint8_t* ra = m.arena->mirror() + m.pool->PageOffset(ia / a.records_per_page) +
                        (ia % a.records_per_page) * rb;
    const uint8_t* rb_ptr =
        host->PagePointer(ib / b.records_per_page) + (ib % b.records_per_page) * rb;
    INFO("record " << r);
    CHECK(std::memcmp(ra, rb_ptr, rb) == 0);  // Read from the published copy.
  }
}

TEST_CASE("PageAllocator: a mirrored staging slot is pulled from the device copy", "[controller]") {
  MirroredPool m = MakeMirroredPool(32 * kPage, 2);
  StatusOr<StagingSlot> slot = m.pool->AllocateStaging(100);
  REQUIRE(slot.ok());
  m.arena->mirror()[slot->offset + 10] = 42;  // An engine wrote the slot on the device.
  CHECK(m.pool->StagingPointer(slot->id)[10] == 0);
  REQUIRE(m.pool->PullStaging(slot->offset, 100).ok());
  CHECK(m.pool->StagingPointer(slot->id)[10] == 42);
}

TEST_CASE("CUDA pool: refused by name without a device, else a real mirrored device arena",
          "[controller]") {
  StatusOr<std::unique_ptr<Arena>> arena = CreateCudaArena(1 << 20, 0);
  if (!arena.ok()) {
    INFO(arena.status().ToString());
    CHECK(arena.status().code() == StatusCode::kFailedPrecondition);
    CHECK(arena.status().message().find("pool.backend: got \"cuda\"") != std::string::npos);
    CHECK((arena.status().message().find("built without CUDA") != std::string::npos ||
           arena.status().message().find("no CUDA device is visible") != std::string::npos));
    return;
  }
  // A device is present: host copy -> device -> host copy round trip, and its IPC handle.
  Arena& a = **arena;
  CHECK(a.mirrored());
  CHECK(a.cuda_device() == 0);
  CHECK(a.cuda_ipc_handle().size() == 64);
  for (int i = 0; i < 65536; ++i) a.base()[8192 + i] = static_cast<uint8_t>(i * 13);
  // One range (a plain copy), then ten odd-sized ones (packed, one copy, the scatter kernel).
  REQUIRE(a.Publish({{8192, 4096}}).ok());
  std::vector<ByteRange> many;
  for (uint64_t i = 0; i < 10; ++i) many.push_back({8192 + 4096 + i * 5000 + i, 999 + i});
  REQUIRE(a.Publish(many).ok());
  // The device copy started zeroed: only the published ranges hold the host bytes.
  std::vector<uint8_t> want(65536, 0);
  many.push_back({8192, 4096});
  for (const ByteRange& r : many) {
    std::memcpy(want.data() + (r.offset - 8192), a.base() + r.offset, r.bytes);
  }
  std::memset(a.base() + 8192, 0xAB, 65536);
  REQUIRE(a.Pull(8192, 65536).ok());
  for (int i = 0; i < 65536; ++i) {
    INFO("byte " << 8192 + i);
    REQUIRE(a.base()[8192 + i] == want[i]);
  }
  CHECK(CreateCudaArena(1 << 20, 1000).status().message().find("pool.cuda_device: got 1000") !=
        std::string::npos);
}

}  // namespace
}  // namespace kvctl
