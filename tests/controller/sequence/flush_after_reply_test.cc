// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Held flushes (SequenceGeometry::flush_after_reply): the decode step whose tails reach
// flush_tokens only stores rows (AppendIsLight); PrepareHeldFlushStep encodes that flush's
// records ahead without changing what a reader sees, and the next append writes them. Checked
// against a sequence that flushes on the step itself: the same records, byte for byte, whenever
// both hold the same number; an append between the steps discards the preparation; tails bounded
// by flush_tokens + kMaxHeldFlushRows - 1 when nothing is prepared.
#include <catch2/catch.hpp>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "controller/sequence/sequence_image.h"
#include "tests/controller/sequence/flush_test_util.h"

namespace kvctl {
namespace {

using namespace flush_test;  // NOLINT: the shared fixture of the flush tests.

int MaxQuantizedTail(const KvSequence& seq) {
  int most = 0;
  for (int l = 0; l < kQuantized; ++l) {
    for (int h = 0; h < kHeads; ++h) most = std::max<int>(most, seq.Blocks(l, h).tail_rows);
  }
  return most;
}

// Runs PrepareHeldFlushStep to the end; returns the calls.
int PrepareAll(KvSequence& seq) {
  int calls = 0;
  while (seq.HeldFlushPending()) {
    StatusOr<bool> done = seq.PrepareHeldFlushStep();
    REQUIRE(done.ok());
    ++calls;
    REQUIRE(calls <= kLayers);
  }
  return calls;
}

TEST_CASE("KvSequence held flush: every decode step is light, the next one writes the records",
          "[controller]") {
  const int64_t tokens = 200;
  const Tokens data(tokens, 21);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence held(pool.get(), Geometry(1, true), Plans());
  KvSequence ref(pool.get(), Geometry(1), Plans());
  int held_steps = 0, ref_heavy = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    REQUIRE(held.AppendIsLight(1));  // Even on the step whose tails reach flush_tokens.
    ref_heavy += ref.AppendIsLight(1) ? 0 : 1;
    AppendStep(held, data, t);
    AppendStep(ref, data, t);
    if (held.HeldFlushPending()) {
      ++held_steps;
      REQUIRE(RecordCounts(held) != RecordCounts(ref));  // The reference flushed on the step.
      REQUIRE(MaxQuantizedTail(held) == kFlush);
      // Preparing changes nothing a reader sees.
      const DenseKv before = held.FetchDense(0, kLayers);
      const std::vector<uint32_t> records = RecordCounts(held);
      CHECK(PrepareAll(held) == kLayers);
      const DenseKv after = held.FetchDense(0, kLayers);
      REQUIRE(after.k == before.k);
      REQUIRE(after.v == before.v);
      REQUIRE(RecordCounts(held) == records);
      continue;
    }
    REQUIRE(RecordCounts(held) == RecordCounts(ref));
    RequireSameDense(held, ref);
  }
  CHECK(held_steps == (tokens - kSinks) / kFlush);
  CHECK(ref_heavy == held_steps);
  CHECK(held.tokens() == ref.tokens());
}

TEST_CASE("KvSequence held flush: an append between the steps discards the preparation",
          "[controller]") {
  const int64_t tokens = kSinks + kFlush + 6;
  const Tokens data(tokens, 22);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence held(pool.get(), Geometry(1, true), Plans());
  KvSequence ref(pool.get(), Geometry(1), Plans());
  int64_t t = 0;
  for (; t < kSinks + kFlush; ++t) {
    AppendStep(held, data, t);
    AppendStep(ref, data, t);
  }
  // Half the layers prepared, then an append: nothing written, the tails held one row longer.
  for (int l = 0; l < kLayers / 2; ++l) REQUIRE_FALSE(*held.PrepareHeldFlushStep());
  AppendStep(held, data, t);
  AppendStep(ref, data, t++);
  REQUIRE(held.HeldFlushPending());
  REQUIRE(MaxQuantizedTail(held) == kFlush + 1);
  REQUIRE(RecordCounts(held)[0] == 0);
  // Prepared in full for the new state: the next append writes the same records as the
  // reference's flush, and keeps both rows appended since.
  CHECK(PrepareAll(held) == kLayers);
  for (; t < tokens; ++t) {
    AppendStep(held, data, t);
    AppendStep(ref, data, t);
    REQUIRE(RecordCounts(held) == RecordCounts(ref));
    RequireSameDense(held, ref);
  }
}

TEST_CASE(
    "KvSequence held flush: unprepared, the tail passes flush_tokens by a bounded "
    "margin, then the append flushes itself",
    "[controller]") {
  const int64_t tokens = 150;
  const Tokens data(tokens, 23);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence held(pool.get(), Geometry(1, true), Plans());
  KvSequence ref(pool.get(), Geometry(1), Plans());
  int most_tail = 0, not_light = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    not_light += held.AppendIsLight(1) ? 0 : 1;
    AppendStep(held, data, t);
    AppendStep(ref, data, t);
    most_tail = std::max(most_tail, MaxQuantizedTail(held));
    if (RecordCounts(held) == RecordCounts(ref)) RequireSameDense(held, ref);
  }
  CHECK(most_tail == kFlush + kMaxHeldFlushRows - 1);
  CHECK(not_light == 4);  // The steps whose tails reach flush_tokens + kMaxHeldFlushRows.
}

TEST_CASE("KvSequence held flush: with flush_spread_steps too, the same records", "[controller]") {
  const int spread = GENERATE(2, 8);
  const int64_t tokens = 120;
  const Tokens data(tokens, 24);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence held(pool.get(), Geometry(spread, true), Plans());
  KvSequence ref(pool.get(), Geometry(1), Plans());
  for (int64_t t = 0; t < tokens; ++t) {
    AppendStep(held, data, t);
    AppendStep(ref, data, t);
    if (PrepareAll(held) > 0) continue;  // Written by the next append.
    REQUIRE(RecordCounts(held) == RecordCounts(ref));
    RequireSameDense(held, ref);
  }
}

TEST_CASE("KvSequence held flush: an image taken while a flush is held imports and flushes",
          "[controller]") {
  const int64_t tokens = 80;
  const Tokens data(tokens, 25);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence held(pool.get(), Geometry(1, true), Plans());
  KvSequence ref(pool.get(), Geometry(1), Plans());
  int64_t t = 0;
  for (; t < kSinks + kFlush + 5; ++t) {  // Tails at flush_tokens + 5, nothing prepared.
    AppendStep(held, data, t);
    AppendStep(ref, data, t);
  }
  REQUIRE(MaxQuantizedTail(held) == kFlush + 5);
  CHECK(PrepareAll(held) == kLayers);  // The preparation is not part of the image.
  StatusOr<std::vector<uint8_t>> image = ExportImage(held, held.tokens(), "m");
  REQUIRE(image.ok());
  StatusOr<std::unique_ptr<KvSequence>> back =
      ImportImage(pool.get(), *image, Geometry(1, true), "m");
  REQUIRE(back.ok());
  RequireSameDense(**back, held);
  REQUIRE((*back)->HeldFlushPending());
  CHECK(PrepareAll(**back) == kLayers);
  for (; t < tokens; ++t) {
    AppendStep(**back, data, t);
    AppendStep(ref, data, t);
    if (PrepareAll(**back) > 0) continue;
    REQUIRE(RecordCounts(**back) == RecordCounts(ref));
    RequireSameDense(**back, ref);
  }
}

TEST_CASE("KvSequence held flush: in a full pool the append writes it from the rows it frees",
          "[controller]") {
  // Records are smaller than the fp16 rows they replace, so compacting the rows slab first
  // (ReservePages) gives the new records their pages even when the pool has none free.
  const int64_t tokens = kSinks + kFlush + 1;
  const Tokens data(tokens, 26);
  auto pool = testing::MakeTestPool(4 << 20, 16 << 10);
  KvSequence held(pool.get(), Geometry(1, true), Plans());
  KvSequence ref(pool.get(), Geometry(1), Plans());
  for (int64_t t = 0; t < tokens - 1; ++t) {
    AppendStep(held, data, t);
    AppendStep(ref, data, t);
  }
  CHECK(PrepareAll(held) == kLayers);
  AppendStep(ref, data, tokens - 1);
  std::vector<uint32_t> taken;
  for (;;) {
    StatusOr<std::vector<uint32_t>> page = pool->AllocateMany(1);
    if (!page.ok()) break;
    taken.push_back((*page)[0]);
  }
  const uint32_t used_before = pool->Stats().pages_used;
  AppendStep(held, data, tokens - 1);
  CHECK(pool->Stats().pages_used < used_before);  // The emptied row pages went back.
  REQUIRE(RecordCounts(held) == RecordCounts(ref));
  RequireSameDense(held, ref);
  for (uint32_t page : taken) REQUIRE(pool->Free(page).ok());
}

TEST_CASE("KvSequence held flush: sequences with eviction never hold", "[controller]") {
  EvictionSettings ev;
  ev.enabled = true;
  ev.policy = EvictPolicy::kStreaming;
  ev.sinks = kSinks;
  ev.window = 8;
  ev.tokens_per_head = int64_t{1} << 20;
  ev.floor = 12;
  const Tokens data(60, 27);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence evicting(pool.get(), Geometry(1, true), Plans(), ev);
  for (int64_t t = 0; t < 60; ++t) {
    CHECK_FALSE(evicting.AppendIsLight(1));
    AppendStep(evicting, data, t);
    CHECK_FALSE(evicting.HeldFlushPending());
    CHECK(MaxQuantizedTail(evicting) < kFlush);
  }
}

}  // namespace
}  // namespace kvctl
