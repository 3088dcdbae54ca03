// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Spread flushes (SequenceGeometry::flush_spread_steps): a sequence that spreads the flushes of
// its layers over S appends against one that flushes every due layer at once (S = 1). The spread
// one flushes at most ceil(quantized layers / S) layers per decode step, holds at most S - 1 more
// tail rows, and writes the same records: whenever both hold the same records everywhere their
// dense FETCH is equal byte for byte.
#include <catch2/catch.hpp>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "controller/sequence/sequence_image.h"
#include "tests/controller/sequence/flush_test_util.h"

namespace kvctl {
namespace {

using namespace flush_test;  // NOLINT: the shared fixture of the flush tests.

// Checks the spread sequence against the reference after the same appends; returns how many
// layers flushed in the last append (records grew), given the counts before it.
int CheckStep(const KvSequence& spread, const KvSequence& ref, int steps,
              const std::vector<uint32_t>& before) {
  const std::vector<uint32_t> now = RecordCounts(spread), ref_now = RecordCounts(ref);
  int flushed_layers = 0;
  int64_t tail_rows = 0;  // Of the quantized layers.
  for (int l = 0; l < kLayers; ++l) {
    bool grew = false;
    for (int h = 0; h < kHeads; ++h) {
      const size_t i = static_cast<size_t>(l) * kHeads + h;
      const HeadBlocks s = spread.Blocks(l, h), r = ref.Blocks(l, h);
      // The same tokens, some of them still in the tail; never more than S - 1 rows held back.
      REQUIRE(s.sink_rows == r.sink_rows);
      REQUIRE(now[i] <= ref_now[i]);
      REQUIRE(int64_t{s.tail_rows} + int64_t{now[i]} * kFlush ==
              int64_t{r.tail_rows} + int64_t{ref_now[i]} * kFlush);
      REQUIRE(int64_t{s.tail_rows} <= (l == kLayers - 1 ? spread.tokens() : kFlush + steps - 2));
      grew |= now[i] > before[i];
      if (l < kQuantized) tail_rows += s.tail_rows;
    }
    flushed_layers += grew ? 1 : 0;
  }
  // Held tails are longer, but the layers that flushed first hold fewer rows: never more in all
  // than every tail one row short of its flush (what a joint plan charges, docs/budgets.md).
  REQUIRE(tail_rows <= int64_t{kQuantized} * kHeads * (kFlush - 1));
  if (now == ref_now) RequireSameDense(spread, ref);  // The same records, byte for byte.
  return flushed_layers;
}

TEST_CASE("KvSequence flush spread: the same records, at most ceil(layers / steps) per step",
          "[controller]") {
  const int steps = GENERATE(2, 4, 8);
  const int64_t tokens = 260;
  const Tokens data(tokens, 11);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence spread(pool.get(), Geometry(steps), Plans());
  KvSequence ref(pool.get(), Geometry(1), Plans());
  const int per_append = (kQuantized + steps - 1) / steps;
  int most_spread = 0, most_ref = 0, synced_after_flush = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<uint32_t> before = RecordCounts(spread), ref_before = RecordCounts(ref);
    REQUIRE(spread.Append(t, data.Views(data.k, t, 1), data.Views(data.v, t, 1)).ok());
    REQUIRE(ref.Append(t, data.Views(data.k, t, 1), data.Views(data.v, t, 1)).ok());
    const int flushed = CheckStep(spread, ref, steps, before);
    CHECK(flushed <= per_append);
    most_spread = std::max(most_spread, flushed);
    int ref_flushed = 0;
    const std::vector<uint32_t> ref_now = RecordCounts(ref);
    for (int l = 0; l < kLayers; ++l) ref_flushed += ref_now[l * kHeads] > ref_before[l * kHeads];
    most_ref = std::max(most_ref, ref_flushed);
    if (RecordCounts(spread) == ref_now && ref_now[0] > 0) ++synced_after_flush;
  }
  CHECK(most_ref == kQuantized);     // Without spreading one step flushes every layer...
  CHECK(most_spread == per_append);  // ... with it, at most its share.
  CHECK(synced_after_flush > 100);   // The dense comparison ran on most steps after flushes.
}

TEST_CASE("KvSequence flush spread: a prefill flushes every layer at once", "[controller]") {
  // Tails far past flush_tokens + steps - 1 cannot wait; multi-token appends then decode steps.
  const Tokens data(200, 12);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence spread(pool.get(), Geometry(4), Plans());
  KvSequence ref(pool.get(), Geometry(1), Plans());
  for (KvSequence* s : {&spread, &ref}) {
    REQUIRE(s->Append(0, data.Views(data.k, 0, 150), data.Views(data.v, 0, 150)).ok());
  }
  REQUIRE(RecordCounts(spread) == RecordCounts(ref));
  RequireSameDense(spread, ref);
  for (int64_t t = 150; t < 200; t += 5) {
    const std::vector<uint32_t> before = RecordCounts(spread);
    for (KvSequence* s : {&spread, &ref}) {
      REQUIRE(s->Append(t, data.Views(data.k, t, 5), data.Views(data.v, t, 5)).ok());
    }
    CheckStep(spread, ref, 4, before);
  }
}

TEST_CASE("KvSequence flush spread: an image taken while flushes are held imports and continues",
          "[controller]") {
  const int64_t tokens = 120;
  const Tokens data(tokens, 13);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence spread(pool.get(), Geometry(8), Plans());
  KvSequence ref(pool.get(), Geometry(1), Plans());
  // 2 sinks + 32 + 3: the fourth step after the first flush fell due, flushes still held.
  int64_t t = 0;
  for (; t < kSinks + kFlush + 3; ++t) {
    for (KvSequence* s : {&spread, &ref}) {
      REQUIRE(s->Append(t, data.Views(data.k, t, 1), data.Views(data.v, t, 1)).ok());
    }
  }
  REQUIRE(spread.Blocks(kQuantized - 1, 0).tail_rows > kFlush);  // Held past flush_tokens.
  StatusOr<std::vector<uint8_t>> image = ExportImage(spread, spread.tokens(), "m");
  REQUIRE(image.ok());
  StatusOr<std::unique_ptr<KvSequence>> back = ImportImage(pool.get(), *image, Geometry(8), "m");
  REQUIRE(back.ok());
  RequireSameDense(**back, spread);
  for (; t < tokens; ++t) {
    const std::vector<uint32_t> before = RecordCounts(**back);
    for (KvSequence* s : {back->get(), &ref}) {
      REQUIRE(s->Append(t, data.Views(data.k, t, 1), data.Views(data.v, t, 1)).ok());
    }
    CheckStep(**back, ref, 8, before);
  }
  REQUIRE(RecordCounts(**back) == RecordCounts(ref));
}

TEST_CASE("KvSequence flush spread: with eviction on, heads that evict nothing hold the same way",
          "[controller]") {
  // Streaming eviction whose budget is never reached: every append runs the stages with the
  // eviction settings, and must store what the sequence without eviction stores.
  EvictionSettings ev;
  ev.enabled = true;
  ev.policy = EvictPolicy::kStreaming;
  ev.sinks = kSinks;  // More eviction sinks would raise the quantized layers' sink rows.
  ev.window = 8;
  ev.tokens_per_head = int64_t{1} << 20;
  ev.floor = 12;
  const int64_t tokens = 140;
  const Tokens data(tokens, 14);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  KvSequence evicting(pool.get(), Geometry(4), Plans(), ev);
  KvSequence plain(pool.get(), Geometry(4), Plans());
  for (int64_t t = 0; t < tokens; ++t) {
    for (KvSequence* s : {&evicting, &plain}) {
      REQUIRE(s->Append(t, data.Views(data.k, t, 1), data.Views(data.v, t, 1)).ok());
    }
    REQUIRE(RecordCounts(evicting) == RecordCounts(plain));
    RequireSameDense(evicting, plain);
  }
}

}  // namespace
}  // namespace kvctl
