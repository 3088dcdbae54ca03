// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/controller/sequence/sequence_test_util.h
// Shared by the KvSequence tests: a fresh shm-backed page pool per call, random fp16 decode steps,
// a KIVI spec and per-layer plans of one quantizer at chosen widths; a Config from TOML text.
//
// Thread safety: MakeTestPool keeps a process-wide counter; call it from the test thread.
//
//   auto pool = testing::MakeTestPool(8 << 20, 4096);
//   KvSequence seq(pool.get(), {2, 3, 64, DType::kF32}, testing::UniformPlans(2, 3, spec));
#ifndef KVCTL_TESTS_CONTROLLER_SEQUENCE_TEST_UTIL_H_
#define KVCTL_TESTS_CONTROLLER_SEQUENCE_TEST_UTIL_H_

#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "controller/config/config.h"
#include "controller/pool/pool.h"
#include "controller/sequence/kv_sequence.h"

namespace kvctl::testing {

// A pool of `bytes` in a new POSIX shm object (unlinked when the pool goes), no staging.
// `checksums`: pages sealed and verified (PageAllocator::Options::checksums).
inline std::unique_ptr<PageAllocator> MakeTestPool(uint64_t bytes, uint64_t page_bytes = 64 << 10,
                                                   bool checksums = false) {
  static int counter = 0;
  const std::string name =
      "/kvctl-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  auto arena = ShmArena::Create(name, bytes);
  REQUIRE(arena.ok());
  auto pool =
      PageAllocator::Create(std::move(*arena), {.page_bytes = page_bytes, .checksums = checksums});
  REQUIRE(pool.ok());
  return std::move(pool).value();
}

// Random fp16 K and V of `tokens` decode steps, [tokens, heads, d] per layer (layer l scaled by
// 1 + l_scale * l), and views of any run of them: what the light-append and spread-flush tests
// append.
struct HalfSteps {
  int layers, heads, d;
  int64_t tokens;
  std::vector<std::vector<uint16_t>> k, v;

  HalfSteps(int layers_in, int heads_in, int d_in, int64_t tokens_in, uint32_t seed,
            float l_scale = 0.5f)
      : layers(layers_in), heads(heads_in), d(d_in), tokens(tokens_in) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    k.resize(layers), v.resize(layers);
    for (int l = 0; l < layers; ++l) {
      for (auto* x : {&k[l], &v[l]}) {
        x->resize(static_cast<size_t>(tokens) * heads * d);
        for (uint16_t& e : *x) e = FloatToHalf(normal(rng) * (1.0f + l_scale * l));
      }
    }
  }
  std::vector<KvTensorView> Views(const std::vector<std::vector<uint16_t>>& x, int64_t first,
                                  int64_t n) const {
    REQUIRE((first >= 0 && n >= 0 && first + n <= tokens));  // Else it reads past the steps.
    std::vector<KvTensorView> out;
    for (int l = 0; l < layers; ++l) {
      out.push_back(KvTensorView::Contiguous(&x[l][static_cast<size_t>(first) * heads * d],
                                             DType::kF16, n, heads, d));
    }
    return out;
  }
};

// The KIVI spec at these widths (the registry's defaults otherwise).
inline QuantSpec KiviSpec(int head_dim, int k_bits, int v_bits) {
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kKivi, head_dim, k_bits, v_bits);
  REQUIRE(spec.ok());
  return *spec;
}

// The pages a sequence's live row pairs (`row_slot` bytes each) and records fill when the slots of
// each size are packed: exactly what its slabs hold after every APPEND (docs/algorithms.md §16).
inline uint64_t PackedPages(const KvSequence& seq, int layers, int heads, size_t row_slot,
                            uint64_t page_bytes) {
  std::map<size_t, uint64_t> live;  // Slot bytes -> live slots.
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      const HeadBlocks b = seq.Blocks(l, h);
      live[row_slot] += b.sink_rows + b.tail_rows;
      if (!seq.Lossless(l)) live[BlockLayoutOf(seq.HeadSpec(l, h)).record_bytes] += b.records;
    }
  }
  uint64_t pages = 0;
  for (const auto& [slot, count] : live) {
    const uint64_t per_page = page_bytes / slot;
    pages += (count + per_page - 1) / per_page;
  }
  return pages;
}

// The sink counts these tests were written for (KVarN 128, every other method none), pinned so
// their expected counts do not move with the registry's defaults (issue #18 chose new ones); the
// flush stays the method's.
inline StreamingRules PinnedRules(QuantMethod method) {
  return {.sink_tokens = method == QuantMethod::kKvarn ? 128 : 0,
          .flush_tokens = TraitsOf(method).streaming.flush_tokens};
}

// `layers` quantized layers of `heads` heads, every head at `spec`, with PinnedRules.
inline std::vector<LayerPlan> UniformPlans(int layers, int heads, const QuantSpec& spec) {
  std::vector<LayerPlan> plans(static_cast<size_t>(layers));
  for (LayerPlan& p : plans) {
    p.head_specs.assign(static_cast<size_t>(heads), spec);
    p.rules = PinnedRules(spec.method);
  }
  return plans;
}

// The built-in defaults with `toml` applied; the test stops (REQUIRE) when it does not apply.
inline Config WithToml(const std::string& toml) {
  Config c;
  const Status s = ApplyToml(c, toml, "t.toml");
  INFO(s.ToString());
  REQUIRE(s.ok());
  return c;
}

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_CONTROLLER_SEQUENCE_TEST_UTIL_H_
