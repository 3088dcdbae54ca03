// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Shared by the sequence image and fork tests: synthetic per-layer data, the layer plans of every
// quantizer, and ExpectSame (two sequences hold the same tokens, rows, record bytes and norms).
#ifndef KVCTL_TESTS_CONTROLLER_SEQUENCE_IMAGE_TEST_UTIL_H_
#define KVCTL_TESTS_CONTROLLER_SEQUENCE_IMAGE_TEST_UTIL_H_

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "kernels/convert.h"
#include "tests/controller/sequence/sequence_test_util.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace image_test {

constexpr int kDim = 64;

// Per-layer [tokens, heads, D] data in the session dtype.
struct Data {
  DType dtype;
  int heads;
  std::vector<std::vector<uint8_t>> k, v;
  std::vector<KvTensorView> Views(const std::vector<std::vector<uint8_t>>& src, int64_t from,
                                  int64_t count) const {
    std::vector<KvTensorView> out;
    const size_t row = static_cast<size_t>(heads) * kDim * DTypeSize(dtype);
    for (const auto& layer : src) {
      out.push_back(KvTensorView::Contiguous(layer.data() + from * row, dtype, count, heads, kDim));
    }
    return out;
  }
};

inline Data MakeData(int layers, int64_t tokens, int heads, DType dtype, uint64_t seed) {
  Data out{dtype, heads, {}, {}};
  SyntheticKv kv =
      GenerateSyntheticKv({.tokens = tokens, .heads = heads, .head_dim = kDim, .seed = seed});
  for (int l = 0; l < layers; ++l) {
    for (auto [src, dst] : {std::pair{&kv.k, &out.k}, std::pair{&kv.v, &out.v}}) {
      std::vector<float> scaled = *src;
      for (float& x : scaled) x *= 1.0f + 0.1f * l;
      std::vector<uint8_t> bytes(scaled.size() * DTypeSize(dtype));
      ConvertElements(DType::kF32, scaled.data(), dtype, bytes.data(), scaled.size());
      dst->push_back(std::move(bytes));
    }
  }
  return out;
}

inline Status AppendRange(KvSequence* seq, const Data& data, int64_t first_position, int64_t from,
                          int64_t count) {
  return seq->Append(first_position + from, data.Views(data.k, from, count),
                     data.Views(data.v, from, count));
}

struct ImageCase {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<LayerPlan> plans;
};

inline LayerPlan Plan(QuantMethod m, int heads, std::vector<std::pair<int, int>> bits,
                      int sinks = -1) {
  LayerPlan p;
  p.lossless = false;
  p.rules = testing::PinnedRules(m);
  if (sinks >= 0) p.rules.sink_tokens = sinks;
  for (int h = 0; h < heads; ++h) {
    const auto [kb, vb] = bits[static_cast<size_t>(h) % bits.size()];
    StatusOr<QuantSpec> spec = MakeQuantSpec(m, kDim, kb, vb);
    REQUIRE(spec.ok());
    p.head_specs.push_back(*spec);
  }
  return p;
}

inline LayerPlan LosslessPlan(int heads) {
  LayerPlan p;
  p.lossless = true;
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kFp16, kDim, 16, 16);
  REQUIRE(spec.ok());
  p.head_specs.assign(static_cast<size_t>(heads), *spec);
  return p;
}

constexpr int kLayers = 2, kHeads = 3;

inline std::vector<ImageCase> ImageCases() {
  auto two = [](LayerPlan a, LayerPlan b) { return std::vector<LayerPlan>{a, b}; };
  const std::vector<std::pair<int, int>> k2 = {{2, 2}};
  return {
      {"lossless f32", DType::kF32, two(LosslessPlan(kHeads), LosslessPlan(kHeads))},
      {"lossless f16", DType::kF16, two(LosslessPlan(kHeads), LosslessPlan(kHeads))},
      {"lossless bf16", DType::kBF16, two(LosslessPlan(kHeads), LosslessPlan(kHeads))},
      {"kivi sinks", DType::kF32,
       two(Plan(QuantMethod::kKivi, kHeads, k2, 4), Plan(QuantMethod::kKivi, kHeads, k2, 4))},
      {"kvarn", DType::kF16,
       two(Plan(QuantMethod::kKvarn, kHeads, k2), Plan(QuantMethod::kKvarn, kHeads, k2))},
      {"oscar", DType::kF32,
       two(Plan(QuantMethod::kOscar, kHeads, k2), Plan(QuantMethod::kOscar, kHeads, k2))},
      {"turbo", DType::kBF16,
       two(Plan(QuantMethod::kTurbo, kHeads, {{3, 3}}),
           Plan(QuantMethod::kTurbo, kHeads, {{4, 2}}))},
      {"quarot", DType::kF32,
       two(Plan(QuantMethod::kQuaRot, kHeads, k2, 3), Plan(QuantMethod::kQuaRot, kHeads, k2, 3))},
      {"mixed widths, lossless layer", DType::kF16,
       two(Plan(QuantMethod::kKivi, kHeads, {{2, 4}, {8, 3}, {4, 2}}, 5), LosslessPlan(kHeads))},
  };
}

inline SequenceGeometry Geometry(DType dtype) {
  return {.layers = kLayers,
          .kv_heads = kHeads,
          .head_dim = kDim,
          .dtype = dtype,
          .quality_sample_period = 3};
}

inline uint32_t FreePages(const PageAllocator& pool) {
  const PoolStats s = pool.Stats();
  return s.pages_total - s.pages_used;
}

// The bytes of record r of (l, h), read through the pool as blocks-mode FETCH readers do.
inline std::vector<uint8_t> RecordBytes(const PageAllocator& pool, const KvSequence& seq, int l,
                                        int h, uint32_t r) {
  const HeadBlocks b = seq.Blocks(l, h);
  const size_t rb = BlockLayoutOf(seq.HeadSpec(l, h)).record_bytes;
  const uint32_t id = b.record_ids[r];
  const uint8_t* p = pool.PagePointer(id / b.records_per_page) + (id % b.records_per_page) * rb;
  return {p, p + rb};
}

// a and b hold the same tokens, rows, records, norms and (when `counters`) telemetry.
inline void ExpectSame(const PageAllocator& pa, const KvSequence& a, const PageAllocator& pb,
                       const KvSequence& b, bool counters) {
  REQUIRE(a.tokens() == b.tokens());
  if (a.tokens() > 0) REQUIRE(a.first_position() == b.first_position());
  const DenseKv da = a.FetchDense(0, kLayers), db = b.FetchDense(0, kLayers);
  REQUIRE(da.counts == db.counts);
  REQUIRE(da.positions == db.positions);
  REQUIRE(std::memcmp(da.k.data(), db.k.data(), da.k.size() * 4) == 0);
  REQUIRE(std::memcmp(da.v.data(), db.v.data(), da.v.size() * 4) == 0);
  for (int l = 0; l < kLayers; ++l) {
    REQUIRE(a.Lossless(l) == b.Lossless(l));
    for (int h = 0; h < kHeads; ++h) {
      INFO("layer " << l << ", head " << h);
      REQUIRE(a.HeadSpec(l, h) == b.HeadSpec(l, h));
      const HeadBlocks ba = a.Blocks(l, h), bb = b.Blocks(l, h);
      REQUIRE(ba.records == bb.records);
      REQUIRE(ba.sink_rows == bb.sink_rows);
      REQUIRE(ba.tail_rows == bb.tail_rows);
      REQUIRE(ba.first_quantized_position == bb.first_quantized_position);
      for (uint32_t r = 0; r < ba.records; ++r) {
        REQUIRE(RecordBytes(pa, a, l, h, r) == RecordBytes(pb, b, l, h, r));
      }
      const HeadUsage ua = a.HeadUsageOf(l, h), ub = b.HeadUsageOf(l, h);
      REQUIRE(ua.tokens == ub.tokens);
      REQUIRE(ua.payload_bytes == ub.payload_bytes);
      if (counters) {
        REQUIRE(ua.quality_samples == ub.quality_samples);
        REQUIRE(ua.k_rel_error_sum == ub.k_rel_error_sum);
        REQUIRE(ua.v_rel_error_sum == ub.v_rel_error_sum);
        REQUIRE(ua.width_lowerings == ub.width_lowerings);
      }
    }
    const SlotArray* na = a.Norms(l);
    const SlotArray* nb = b.Norms(l);
    REQUIRE((na == nullptr) == (nb == nullptr));
    if (na != nullptr) {
      REQUIRE(na->size() == nb->size());
      for (size_t i = 0; i < na->size(); ++i) {
        REQUIRE(std::memcmp(na->Slot(i), nb->Slot(i), na->slot_bytes()) == 0);
      }
    }
  }
}

inline bool Names(const Status& s, StatusCode code, const std::string& word) {
  INFO(s.ToString());
  return s.code() == code && s.message().find(word) != std::string::npos;
}

}  // namespace image_test
}  // namespace kvctl

#endif  // KVCTL_TESTS_CONTROLLER_SEQUENCE_IMAGE_TEST_UTIL_H_
