// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/controller/sequence/compare_test_util.h
// For the sequence tests that append the same tokens two ways and require the same result
// (deferred_eviction_test.cc: one append or flagged pieces; prepare_split_test.cc: one thread or
// two): the GQA geometry and small layer plans they share, and the comparison.
//
//   const auto plans = testing::SmallPlans(2, 2, 32, /*lossless=*/false, /*sinks=*/0);
//   KvSequence a(pool.get(), testing::GqaGeometry(2, 2, 4, 32), plans, settings);
//   ...
//   testing::RequireSameContents(a, b, 2, 2);
#ifndef KVCTL_TESTS_CONTROLLER_SEQUENCE_COMPARE_TEST_UTIL_H_
#define KVCTL_TESTS_CONTROLLER_SEQUENCE_COMPARE_TEST_UTIL_H_

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "tests/controller/sequence/sequence_test_util.h"

namespace kvctl::testing {

// fp32 rows with queries of q_heads heads.
inline SequenceGeometry GqaGeometry(int layers, int kv_heads, int q_heads, int d) {
  return {.layers = layers,
          .kv_heads = kv_heads,
          .head_dim = d,
          .dtype = DType::kF32,
          .q_heads = q_heads};
}

// Lossless fp32 rows, or KIVI 2-bit records of 8 tokens flushed every 16 after `sinks` fp16
// sinks (a prefill's deferred pieces then hold the flush).
inline std::vector<LayerPlan> SmallPlans(int layers, int kv_heads, int d, bool lossless,
                                         int sinks) {
  std::vector<LayerPlan> plans(layers);
  for (LayerPlan& p : plans) {
    p.lossless = lossless;
    const QuantMethod m = lossless ? QuantMethod::kFp16 : QuantMethod::kKivi;
    StatusOr<QuantSpec> spec = MakeQuantSpec(m, d, lossless ? 16 : 2, lossless ? 16 : 2);
    REQUIRE(spec.ok());
    if (!lossless) spec->block_tokens = spec->k_group_tokens = 8;
    REQUIRE(ValidateQuantSpec(*spec).ok());
    p.head_specs.assign(kv_heads, *spec);
    p.rules = PinnedRules(m);
    if (!lossless) p.rules.flush_tokens = 16, p.rules.sink_tokens = sinks;
  }
  return plans;
}

// The same rows, positions, counters, budgets and records per head.
inline void RequireSameContents(const KvSequence& a, const KvSequence& b, int layers,
                                int kv_heads) {
  const DenseKv da = a.FetchDense(0, layers), db = b.FetchDense(0, layers);
  REQUIRE(da.counts == db.counts);
  REQUIRE(da.positions == db.positions);
  REQUIRE(da.k.size() == db.k.size());
  REQUIRE(da.v.size() == db.v.size());
  CHECK(std::memcmp(da.k.data(), db.k.data(), da.k.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(da.v.data(), db.v.data(), da.v.size() * sizeof(float)) == 0);
  const SequenceUsage ua = a.Usage(), ub = b.Usage();
  CHECK(ua.tokens == ub.tokens);
  CHECK(ua.kept_tokens == ub.kept_tokens);
  CHECK(ua.evicted_tokens == ub.evicted_tokens);
  CHECK(ua.evicted_bytes == ub.evicted_bytes);
  CHECK(ua.quantized_tokens == ub.quantized_tokens);
  CHECK(ua.payload_bytes == ub.payload_bytes);
  for (int l = 0; l < layers; ++l) {
    CHECK(a.LayerBudget(l) == b.LayerBudget(l));
    for (int h = 0; h < kv_heads; ++h) {
      CHECK(a.HeadUsageOf(l, h).budget == b.HeadUsageOf(l, h).budget);
      CHECK(a.Blocks(l, h).records == b.Blocks(l, h).records);
    }
  }
}

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_CONTROLLER_SEQUENCE_COMPARE_TEST_UTIL_H_
