// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The sequence the flush tests (flush_spread_test.cc, flush_after_reply_test.cc) compare against a
// reference: 9 layers of 2 KIVI 2-bit heads (the last layer lossless), 2 sinks, a flush every 32
// tokens; fp16 decode steps; and the comparisons they share.
#ifndef KVCTL_TESTS_CONTROLLER_SEQUENCE_FLUSH_TEST_UTIL_H_
#define KVCTL_TESTS_CONTROLLER_SEQUENCE_FLUSH_TEST_UTIL_H_

#include <catch2/catch.hpp>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl::flush_test {

inline constexpr int kLayers = 9, kHeads = 2, kD = 64;
inline constexpr int kQuantized = kLayers - 1;  // The last layer is lossless.
inline constexpr int kFlush = 32, kSinks = 2;

// fp16 decode steps of kLayers layers (layer l scaled by 1 + l / 4).
struct Tokens : testing::HalfSteps {
  Tokens(int64_t tokens, uint32_t seed) : HalfSteps(kLayers, kHeads, kD, tokens, seed, 0.25f) {}
};

inline std::vector<LayerPlan> Plans() {
  const QuantSpec spec = testing::KiviSpec(kD, 2, 2);
  std::vector<LayerPlan> plans(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    plans[l].head_specs.assign(kHeads, spec);
    plans[l].rules = {.sink_tokens = kSinks, .flush_tokens = kFlush};
    plans[l].lossless = l == kLayers - 1;
  }
  return plans;
}

inline SequenceGeometry Geometry(int spread, bool after_reply = false) {
  SequenceGeometry g{kLayers, kHeads, kD, DType::kF16};
  g.flush_spread_steps = spread;
  g.flush_after_reply = after_reply;
  return g;
}

// Records held per (layer, head).
inline std::vector<uint32_t> RecordCounts(const KvSequence& seq) {
  std::vector<uint32_t> out;
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kHeads; ++h) out.push_back(seq.Blocks(l, h).records);
  }
  return out;
}

inline void RequireSameDense(const KvSequence& a, const KvSequence& b) {
  const DenseKv x = a.FetchDense(0, kLayers), y = b.FetchDense(0, kLayers);
  REQUIRE(x.counts == y.counts);
  REQUIRE(x.positions == y.positions);
  REQUIRE(x.k == y.k);
  REQUIRE(x.v == y.v);
}

inline void AppendStep(KvSequence& seq, const Tokens& data, int64_t t) {
  REQUIRE(seq.Append(t, data.Views(data.k, t, 1), data.Views(data.v, t, 1)).ok());
}

}  // namespace kvctl::flush_test

#endif  // KVCTL_TESTS_CONTROLLER_SEQUENCE_FLUSH_TEST_UTIL_H_
