// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The light append (KvSequence::TryAppendRows: rows written straight from the request into their
// slots, no per-head plan) against the stages: a sequence with streaming eviction whose budget is
// never reached takes the stages for every append (AppendIsLight is false with eviction) and must
// end in the same stored state, byte for byte, as one without eviction that takes the light path
// for its decode steps.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl {
namespace {

using Steps = testing::HalfSteps;

// KIVI 2-bit (32-token records of about 1 KiB), `sinks` fp16 sinks, a flush every 32 tail tokens.
std::vector<LayerPlan> KiviPlans(int layers, int heads, int d, int sinks) {
  const QuantSpec spec = testing::KiviSpec(d, 2, 2);
  std::vector<LayerPlan> plans(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    plans[l].head_specs.assign(static_cast<size_t>(heads), spec);
    plans[l].rules = {.sink_tokens = sinks, .flush_tokens = spec.block_tokens};
    plans[l].lossless = l == layers - 1;  // One lossless layer: rows only, never flushed.
  }
  return plans;
}

EvictionSettings NeverEvicting() {
  EvictionSettings ev;
  ev.enabled = true;
  ev.policy = EvictPolicy::kStreaming;
  ev.sinks = 4;
  ev.window = 8;
  ev.tokens_per_head = int64_t{1} << 20;
  ev.floor = 12;
  return ev;
}

void RequireSameState(const KvSequence& light, const KvSequence& staged, int layers, int heads) {
  REQUIRE(light.tokens() == staged.tokens());
  const DenseKv a = light.FetchDense(0, layers), b = staged.FetchDense(0, layers);
  REQUIRE(a.counts == b.counts);
  REQUIRE(a.positions == b.positions);
  REQUIRE(a.k == b.k);
  REQUIRE(a.v == b.v);
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      const HeadBlocks x = light.Blocks(l, h), y = staged.Blocks(l, h);
      REQUIRE(x.sink_rows == y.sink_rows);
      REQUIRE(x.tail_rows == y.tail_rows);
      REQUIRE(x.records == y.records);
    }
  }
  REQUIRE(light.Usage().quantized_tokens == staged.Usage().quantized_tokens);
  REQUIRE(light.Usage().kept_tokens == staged.Usage().kept_tokens);
}

TEST_CASE("KvSequence light append: the same stored state as the stages, step by step",
          "[controller]") {
  // Steps of 1 and 3 tokens across the sink fill (6 sinks) and flushes every 32 tail tokens,
  // pages of 4 KiB (16 row slots) so slots keep crossing pages.
  const int layers = 3, heads = 2, d = 64;
  const Steps data(layers, heads, d, 200, 7);
  auto pool = testing::MakeTestPool(4 << 20, 4 << 10);
  KvSequence light(pool.get(), {layers, heads, d, DType::kF16}, KiviPlans(layers, heads, d, 6));
  KvSequence staged(pool.get(), {layers, heads, d, DType::kF16}, KiviPlans(layers, heads, d, 6),
                    NeverEvicting());
  int light_steps = 0;
  for (int64_t t = 0; t < data.tokens;) {
    const int64_t n = std::min<int64_t>(data.tokens - t, t % 7 == 0 ? 3 : 1);
    light_steps += light.AppendIsLight(n) ? 1 : 0;
    REQUIRE(light.Append(t, data.Views(data.k, t, n), data.Views(data.v, t, n)).ok());
    REQUIRE(staged.Append(t, data.Views(data.k, t, n), data.Views(data.v, t, n)).ok());
    t += n;
    RequireSameState(light, staged, layers, heads);
  }
  CHECK(light_steps > 100);  // Most steps took the light path.
  CHECK(light.Usage().quantized_tokens > 0);
}

TEST_CASE("KvSequence light append: a pool too small for the step fails with nothing changed",
          "[controller]") {
  // Two pages of 4 KiB, 16 row slots each: 6 streams fill them in five steps, long before a
  // flush, so the step that runs out only stores rows.
  const int layers = 3, heads = 2, d = 64;
  const Steps data(layers, heads, d, 64, 9);
  auto pool = testing::MakeTestPool(8 << 10, 4 << 10);
  KvSequence seq(pool.get(), {layers, heads, d, DType::kF16}, KiviPlans(layers, heads, d, 2));
  int64_t t = 0;
  Status s = OkStatus();
  for (; t < data.tokens; ++t) {
    const DenseKv before = seq.FetchDense(0, layers);
    const bool light = seq.AppendIsLight(1);
    s = seq.Append(t, data.Views(data.k, t, 1), data.Views(data.v, t, 1));
    if (s.ok()) continue;
    CHECK(light);  // The pool ran out on a step that only stores rows.
    CHECK(s.code() == StatusCode::kResourceExhausted);
    const DenseKv after = seq.FetchDense(0, layers);
    CHECK(after.counts == before.counts);
    CHECK(after.k == before.k);
    CHECK(seq.tokens() == t);
    break;
  }
  REQUIRE(t < data.tokens);
  CHECK(pool->Stats().pages_used <= 2);
}

}  // namespace
}  // namespace kvctl
