// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// KvSequence::Fork (copy-on-write sharing of a frozen prefix): a fork equals an import of the
// prefix's whole image and goes on as it would, while its records, sink rows and norms stay in
// the prefix's pages; nothing a fork does changes those pages; the pages live until the last
// reader goes; and a page changed behind the daemon's back is found through every fork.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "controller/sequence/sequence_image.h"
#include "tests/controller/sequence/image_test_util.h"

namespace kvctl {
namespace {

using namespace image_test;  // NOLINT: the shared helpers of these tests.

// What a reader sees of a sequence: every dense row and every record's bytes.
struct Snapshot {
  DenseKv dense;
  std::vector<std::vector<uint8_t>> records;
};

Snapshot Take(const PageAllocator& pool, const KvSequence& seq) {
  Snapshot s{seq.FetchDense(0, kLayers), {}};
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kHeads; ++h) {
      for (uint32_t r = 0; r < seq.Blocks(l, h).records; ++r) {
        s.records.push_back(RecordBytes(pool, seq, l, h, r));
      }
    }
  }
  return s;
}

void ExpectUnchanged(const Snapshot& a, const Snapshot& b) {
  REQUIRE(a.dense.counts == b.dense.counts);
  REQUIRE(a.dense.positions == b.dense.positions);
  REQUIRE(a.dense.k == b.dense.k);
  REQUIRE(a.dense.v == b.dense.v);
  REQUIRE(a.records == b.records);
}

// A frozen prefix as the daemon's prefix cache holds one: the first `tokens` of `seq`, imported.
std::shared_ptr<KvSequence> Freeze(PageAllocator* pool, const KvSequence& seq, int64_t tokens,
                                   const SequenceGeometry& geometry) {
  StatusOr<std::vector<uint8_t>> image = ExportImage(seq, tokens, "m");
  INFO(image.status().ToString());
  REQUIRE(image.ok());
  StatusOr<std::unique_ptr<KvSequence>> frozen = ImportImage(pool, *image, geometry, "m");
  REQUIRE(frozen.ok());
  return std::move(frozen).value();
}

TEST_CASE("Fork: equals an import of the prefix, shares its pages, and goes on alike",
          "[controller][fork]") {
  for (const ImageCase& c : ImageCases()) {
    DYNAMIC_SECTION(c.name) {
      auto pool = testing::MakeTestPool(64 << 20, 16 << 10);
      const SequenceGeometry geometry = Geometry(c.dtype);
      KvSequence original(pool.get(), geometry, c.plans);
      const Data data = MakeData(kLayers, 900, kHeads, c.dtype, 5);
      // Ends in a partial tail, so the fork copies some rows.
      for (auto [from, n] : {std::pair{0, 170}, {170, 1}, {171, 130}}) {
        REQUIRE(AppendRange(&original, data, 0, from, n).ok());
      }
      std::shared_ptr<KvSequence> frozen = Freeze(pool.get(), original, 301, geometry);
      const Snapshot frozen_before = Take(*pool, *frozen);
      const uint32_t free_before = FreePages(*pool);
      StatusOr<std::unique_ptr<KvSequence>> a = KvSequence::Fork(frozen, 3);
      StatusOr<std::unique_ptr<KvSequence>> b = KvSequence::Fork(frozen, 3);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      REQUIRE((*a)->shares_pages());
      ExpectSame(*pool, original, *pool, **a, /*counters=*/false);
      ExpectSame(*pool, original, *pool, **b, /*counters=*/false);
      // Each fork holds pages for its tails only; what it reads of the prefix stays shared.
      const SequenceUsage fu = (*a)->Usage(), ou = frozen->Usage();
      REQUIRE(fu.payload_bytes == ou.payload_bytes);
      REQUIRE(fu.shared_bytes > 0);
      REQUIRE(fu.pool_bytes < ou.pool_bytes);
      REQUIRE(free_before - FreePages(*pool) ==
              (fu.pool_bytes + (*b)->Usage().pool_bytes) / pool->page_bytes());
      for (int l = 0; l < kLayers; ++l) {
        for (int h = 0; h < kHeads; ++h) {
          REQUIRE(
              std::ranges::equal((*a)->Blocks(l, h).record_ids, frozen->Blocks(l, h).record_ids));
        }
      }
      // Fork a goes on as the original does; b takes other tokens; the prefix never changes.
      for (auto [from, n] : {std::pair{301, 1}, {302, 130}, {432, 3}, {435, 465}}) {
        REQUIRE(AppendRange(&original, data, 0, from, n).ok());
        REQUIRE(AppendRange(a->get(), data, 0, from, n).ok());
        ExpectSame(*pool, original, *pool, **a, /*counters=*/false);
      }
      const Data other = MakeData(kLayers, 900, kHeads, c.dtype, 99);
      REQUIRE(AppendRange(b->get(), other, 0, 301, 400).ok());
      ExpectUnchanged(frozen_before, Take(*pool, *frozen));
      // Widths lowered on a fork go to fresh slots of its own.
      if (!c.plans[0].lossless && c.plans[0].head_specs[1].k_bits > 2) {
        const QuantSpec spec = (*a)->HeadSpec(0, 1);
        const int to = spec.k_bits >= 4 ? spec.k_bits / 2 : spec.k_bits - 1;
        REQUIRE((*a)->LowerWidth(0, 1, to, spec.v_bits).ok());
        REQUIRE(original.LowerWidth(0, 1, to, spec.v_bits).ok());
        ExpectSame(*pool, original, *pool, **a, /*counters=*/false);
        REQUIRE(
            !std::ranges::equal((*a)->Blocks(0, 1).record_ids, frozen->Blocks(0, 1).record_ids));
        ExpectUnchanged(frozen_before, Take(*pool, *frozen));
      }
      // The prefix's pages live while a fork reads them, and go with the last one.
      const uint32_t frozen_pages = static_cast<uint32_t>(ou.pool_bytes / pool->page_bytes());
      const uint32_t free_with_all = FreePages(*pool);
      frozen.reset();
      REQUIRE(FreePages(*pool) == free_with_all);
      a->reset();
      const uint32_t free_with_b = FreePages(*pool);
      b->reset();
      REQUIRE(FreePages(*pool) - free_with_b >= frozen_pages);
      REQUIRE(FreePages(*pool) + original.Usage().pool_bytes / pool->page_bytes() ==
              pool->pages_total());
    }
  }
}

TEST_CASE("Fork: a fork of a prefix that is all sinks or ends at a flush", "[controller][fork]") {
  auto pool = testing::MakeTestPool(32 << 20, 16 << 10);
  const SequenceGeometry geometry = Geometry(DType::kF16);
  const std::vector<LayerPlan> plans = {Plan(QuantMethod::kKvarn, kHeads, {{2, 2}}),
                                        Plan(QuantMethod::kKivi, kHeads, {{2, 2}}, 4)};
  KvSequence original(pool.get(), geometry, plans);
  const Data data = MakeData(kLayers, 800, kHeads, DType::kF16, 6);
  REQUIRE(AppendRange(&original, data, 0, 0, 400).ok());
  for (int64_t cut : {int64_t{0}, int64_t{3}, LargestExactCut(original, 400, 16)}) {
    INFO("cut " << cut);
    std::shared_ptr<KvSequence> frozen = Freeze(pool.get(), original, cut, geometry);
    StatusOr<std::unique_ptr<KvSequence>> fork = KvSequence::Fork(frozen, 0);
    REQUIRE(fork.ok());
    KvSequence fresh(pool.get(), geometry, plans);
    if (cut > 0) REQUIRE(AppendRange(&fresh, data, 0, 0, cut).ok());
    ExpectSame(*pool, fresh, *pool, **fork, /*counters=*/false);
    for (auto [from, n] : {std::pair{cut, int64_t{1}}, {cut + 1, int64_t{300}}}) {
      REQUIRE(AppendRange(&fresh, data, 0, from, n).ok());
      REQUIRE(AppendRange(fork->get(), data, 0, from, n).ok());
    }
    ExpectSame(*pool, fresh, *pool, **fork, /*counters=*/false);
  }
}

TEST_CASE("Fork: the saver shares its prefix's pages too, and goes on alike",
          "[controller][fork]") {
  for (const ImageCase& c : ImageCases()) {
    DYNAMIC_SECTION(c.name) {
      auto pool = testing::MakeTestPool(64 << 20, 16 << 10);
      const SequenceGeometry geometry = Geometry(c.dtype);
      KvSequence saver(pool.get(), geometry, c.plans), copy(pool.get(), geometry, c.plans);
      const Data data = MakeData(kLayers, 900, kHeads, c.dtype, 9);
      for (KvSequence* s : {&saver, &copy}) {
        for (auto [from, n] : {std::pair{0, 200}, {200, 1}, {201, 100}}) {
          REQUIRE(AppendRange(s, data, 0, from, n).ok());
        }
      }
      const int64_t cut = LargestExactCut(saver, 301, 16);
      REQUIRE(cut > 0);
      std::shared_ptr<KvSequence> frozen = Freeze(pool.get(), saver, cut, geometry);
      const Snapshot frozen_before = Take(*pool, *frozen);
      const uint64_t held = saver.Usage().pool_bytes;
      StatusOr<uint64_t> freed = saver.ShareWith(frozen);
      REQUIRE(freed.ok());
      REQUIRE(saver.shares_pages());
      REQUIRE(saver.Usage().pool_bytes == held - *freed);
      REQUIRE(saver.Usage().shared_bytes > 0);
      ExpectSame(*pool, copy, *pool, saver, /*counters=*/false);
      for (int l = 0; l < kLayers; ++l) {
        for (int h = 0; h < kHeads; ++h) {
          const HeadBlocks f = frozen->Blocks(l, h), s = saver.Blocks(l, h);
          REQUIRE(std::equal(f.record_ids.begin(), f.record_ids.begin() + f.records,
                             s.record_ids.begin()));
        }
      }
      for (auto [from, n] : {std::pair{301, 1}, {302, 300}, {602, 298}}) {
        REQUIRE(AppendRange(&saver, data, 0, from, n).ok());
        REQUIRE(AppendRange(&copy, data, 0, from, n).ok());
        ExpectSame(*pool, copy, *pool, saver, /*counters=*/false);
      }
      ExpectUnchanged(frozen_before, Take(*pool, *frozen));
      // A longer prefix of the same sequence replaces the first as its lender, which then goes.
      const int64_t longer = LargestExactCut(saver, 900, 1);
      REQUIRE(longer > cut);
      std::shared_ptr<KvSequence> second = Freeze(pool.get(), saver, longer, geometry);
      const uint32_t free_before = FreePages(*pool);
      REQUIRE(saver.ShareWith(second).ok());
      frozen.reset();
      REQUIRE(FreePages(*pool) > free_before);
      ExpectSame(*pool, copy, *pool, saver, /*counters=*/false);
      // The first prefix again: it does not cover what the saver now borrows.
      KvSequence again(pool.get(), geometry, c.plans);
      REQUIRE(AppendRange(&again, data, 0, 0, 301).ok());
      std::shared_ptr<KvSequence> shorter = Freeze(pool.get(), again, cut, geometry);
      REQUIRE(Names(saver.ShareWith(shorter).status(), StatusCode::kFailedPrecondition, "differs"));
    }
  }
}

TEST_CASE("Fork: a prefix of other tokens is not shared, and nothing changes",
          "[controller][fork]") {
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  const SequenceGeometry geometry = Geometry(DType::kF32);
  const std::vector<LayerPlan> plans = {Plan(QuantMethod::kKivi, kHeads, {{2, 2}}),
                                        LosslessPlan(kHeads)};
  KvSequence a(pool.get(), geometry, plans), b(pool.get(), geometry, plans);
  REQUIRE(AppendRange(&a, MakeData(kLayers, 300, kHeads, DType::kF32, 1), 0, 0, 300).ok());
  REQUIRE(AppendRange(&b, MakeData(kLayers, 300, kHeads, DType::kF32, 2), 0, 0, 300).ok());
  std::shared_ptr<KvSequence> frozen_b = Freeze(pool.get(), b, 288, geometry);
  const Snapshot before = Take(*pool, a);
  const uint64_t held = a.Usage().pool_bytes;
  REQUIRE(Names(a.ShareWith(frozen_b).status(), StatusCode::kFailedPrecondition, "layer 0"));
  REQUIRE(!a.shares_pages());
  REQUIRE(a.Usage().pool_bytes == held);
  ExpectUnchanged(before, Take(*pool, a));
  // A longer "prefix" than the sequence.
  KvSequence shorter(pool.get(), geometry, plans);
  REQUIRE(AppendRange(&shorter, MakeData(kLayers, 300, kHeads, DType::kF32, 1), 0, 0, 100).ok());
  REQUIRE(Names(shorter.ShareWith(Freeze(pool.get(), a, 288, geometry)).status(),
                StatusCode::kFailedPrecondition, "not one of this sequence"));
}

TEST_CASE("Fork: refusals take no page", "[controller][fork]") {
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  const SequenceGeometry geometry = Geometry(DType::kF32);
  const std::vector<LayerPlan> plans = {Plan(QuantMethod::kKivi, kHeads, {{2, 2}}),
                                        LosslessPlan(kHeads)};
  KvSequence original(pool.get(), geometry, plans);
  const Data data = MakeData(kLayers, 300, kHeads, DType::kF32, 2);
  REQUIRE(AppendRange(&original, data, 0, 0, 300).ok());
  StatusOr<std::vector<uint8_t>> image = ExportImage(original, 300, "");
  REQUIRE(image.ok());
  SECTION("a prefix stored with eviction on") {
    EvictionSettings ev;
    ev.enabled = true;
    ev.policy = EvictPolicy::kStreaming;
    ev.sinks = 0;
    ev.window = 16;
    ev.tokens_per_head = 100000;
    ev.floor = 20;
    StatusOr<std::unique_ptr<KvSequence>> frozen =
        ImportImage(pool.get(), *image, geometry, "", ev);
    REQUIRE(frozen.ok());
    const uint32_t free_before = FreePages(*pool);
    REQUIRE(Names(KvSequence::Fork(std::move(frozen).value(), 0).status(),
                  StatusCode::kFailedPrecondition, "eviction"));
    REQUIRE(FreePages(*pool) > free_before);  // The frozen one went with the failed fork.
  }
  SECTION("a pool without pages for the tails") {
    std::shared_ptr<KvSequence> frozen = Freeze(pool.get(), original, 300, geometry);
    StatusOr<std::vector<uint32_t>> rest = pool->AllocateMany(FreePages(*pool));
    REQUIRE(rest.ok());
    REQUIRE(Names(KvSequence::Fork(frozen, 0).status(), StatusCode::kResourceExhausted, "tails"));
    REQUIRE(FreePages(*pool) == 0);
    for (uint32_t page : *rest) REQUIRE(pool->Free(page).ok());
  }
  SECTION("pressure curves of the wrong count") {
    std::shared_ptr<KvSequence> frozen = Freeze(pool.get(), original, 300, geometry);
    PressureSettings pressure;
    pressure.curves.resize(1);
    REQUIRE(Names(KvSequence::Fork(frozen, 0, pressure).status(), StatusCode::kInvalidArgument,
                  "pressure.curves"));
  }
}

TEST_CASE("Fork: pressure relief leaves borrowed records alone", "[controller][fork]") {
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  const SequenceGeometry geometry = Geometry(DType::kF32);
  const std::vector<LayerPlan> plans = {Plan(QuantMethod::kKivi, kHeads, {{4, 4}}),
                                        Plan(QuantMethod::kKivi, kHeads, {{4, 4}})};
  PressureSettings pressure;
  pressure.lower_widths = true;
  KvSequence original(pool.get(), geometry, plans, {}, pressure);
  const Data data = MakeData(kLayers, 900, kHeads, DType::kF32, 3);
  REQUIRE(AppendRange(&original, data, 0, 0, 600).ok());
  std::shared_ptr<KvSequence> frozen = Freeze(pool.get(), original, 600, geometry);
  StatusOr<std::unique_ptr<KvSequence>> fork = KvSequence::Fork(frozen, 0, pressure);
  REQUIRE(fork.ok());
  // Every record it holds is borrowed: narrowing them would take pages, so nothing is lowered.
  REQUIRE((*fork)->LowerWidthsForOthers(4) == 0);
  REQUIRE((*fork)->HeadSpec(0, 0).k_bits == 4);
  // The original, holding its own records, frees pages that way.
  REQUIRE(original.LowerWidthsForOthers(1) >= 1);
}

// A checksummed pool holding a frozen 300-token prefix (KIVI layer, lossless layer) and a fork of
// it, for the tests that change a shared page behind the daemon's back.
struct ChecksummedFork {
  explicit ChecksummedFork(const std::string& name, PageAllocator::FetchVerify fetch_verify) {
    auto arena = ShmArena::Create(name + std::to_string(getpid()), 16 << 20);
    REQUIRE(arena.ok());
    auto created = PageAllocator::Create(
        std::move(*arena),
        {.page_bytes = 16 << 10, .checksums = true, .fetch_verify = fetch_verify});
    REQUIRE(created.ok());
    pool = std::move(*created);
    const std::vector<LayerPlan> plans = {Plan(QuantMethod::kKivi, kHeads, {{2, 2}}),
                                          LosslessPlan(kHeads)};
    original = std::make_unique<KvSequence>(pool.get(), geometry, plans);
    REQUIRE(AppendRange(original.get(), data, 0, 0, 300).ok());
    frozen = Freeze(pool.get(), *original, 300, geometry);
    StatusOr<std::unique_ptr<KvSequence>> forked = KvSequence::Fork(frozen, 0);
    REQUIRE(forked.ok());
    fork = std::move(*forked);
  }
  // Flips a byte of the prefix's first record of (layer 0, head 0).
  void ChangeSharedRecord() {
    const HeadBlocks b = frozen->Blocks(0, 0);
    REQUIRE(b.records > 0);
    pool->PagePointer(b.record_ids[0] / b.records_per_page)[0] ^= 1;
  }
  const SequenceGeometry geometry = Geometry(DType::kF32);
  const Data data = MakeData(kLayers, 500, kHeads, DType::kF32, 4);
  std::unique_ptr<PageAllocator> pool;
  std::unique_ptr<KvSequence> original;
  std::shared_ptr<KvSequence> frozen;
  std::unique_ptr<KvSequence> fork;
};

TEST_CASE("Fork: a shared page changed behind the daemon's back is found through the fork",
          "[controller][fork]") {
  ChecksummedFork f("/kvctl-test-fork-", PageAllocator::FetchVerify::kAll);
  REQUIRE(f.fork->Verify(0, kLayers).ok());
  REQUIRE(AppendRange(f.fork.get(), f.data, 0, 300, 100).ok());
  REQUIRE(f.fork->Verify(0, kLayers).ok());
  f.ChangeSharedRecord();
  REQUIRE(ExportImage(*f.fork, 400, "").status().code() == StatusCode::kDataLoss);
  REQUIRE(f.fork->Verify(0, 1).code() == StatusCode::kDataLoss);
  REQUIRE(AppendRange(f.fork.get(), f.data, 0, 400, 1).code() == StatusCode::kDataLoss);
}

TEST_CASE("Fork: with verify-once, a change the lender's scrub finds is found by the fork's FETCH",
          "[controller][fork]") {
  // The fork's Verify skips layers it verified when nothing was written since; a mismatch found
  // anywhere in the pool (here by the scrub of the prefix the fork borrows from) must end that.
  ChecksummedFork f("/kvctl-test-fork1-", PageAllocator::FetchVerify::kUnverified);
  REQUIRE(AppendRange(f.fork.get(), f.data, 0, 300, 10).ok());
  REQUIRE(f.fork->Verify(0, 1).ok());
  REQUIRE(f.fork->Verify(0, 1).ok());  // Verified, nothing written since.
  f.ChangeSharedRecord();
  // Verified before the change and not written since: FETCH does not look again (the scrubber's
  // job, docs/reliability.md).
  REQUIRE(f.fork->Verify(0, 1).ok());
  bool wrapped = false;
  REQUIRE(f.frozen->Scrub(uint64_t{1} << 30, &wrapped).status().code() == StatusCode::kDataLoss);
  REQUIRE(f.pool->checksum_failures() == 1);
  REQUIRE(f.fork->Verify(0, 1).code() == StatusCode::kDataLoss);
  // (A write by the sequence itself ends the skip too: checksum_test's "a FETCH verifies what
  // was written since the last one".)
}

}  // namespace
}  // namespace kvctl
