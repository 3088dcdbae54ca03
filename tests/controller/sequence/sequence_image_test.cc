// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Sequence images (controller/sequence/sequence_image.h): whole-sequence round trips behave as the
// original (rows, record bytes, counters, later appends), every exact prefix cut imports as a
// fresh prefill of those tokens, and every kind of bad image gets its named error with the pool
// untouched. With KVCTL_IMAGE_SEED_DIR set, the round-trip images are also written there (the
// seed corpus of tests/fuzz/image_fuzz.cc).
#include "controller/sequence/sequence_image.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/half.h"
#include "kernels/convert.h"
#include "tests/controller/sequence/sequence_test_util.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

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

Data MakeData(int layers, int64_t tokens, int heads, DType dtype, uint64_t seed) {
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

Status AppendRange(KvSequence* seq, const Data& data, int64_t first_position, int64_t from,
                   int64_t count) {
  return seq->Append(first_position + from, data.Views(data.k, from, count),
                     data.Views(data.v, from, count));
}

struct Config {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<LayerPlan> plans;
};

LayerPlan Plan(QuantMethod m, int heads, std::vector<std::pair<int, int>> bits, int sinks = -1) {
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

LayerPlan LosslessPlan(int heads) {
  LayerPlan p;
  p.lossless = true;
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kFp16, kDim, 16, 16);
  REQUIRE(spec.ok());
  p.head_specs.assign(static_cast<size_t>(heads), *spec);
  return p;
}

constexpr int kLayers = 2, kHeads = 3;

std::vector<Config> Configs() {
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

SequenceGeometry Geometry(DType dtype) {
  return {.layers = kLayers,
          .kv_heads = kHeads,
          .head_dim = kDim,
          .dtype = dtype,
          .quality_sample_period = 3};
}

uint32_t FreePages(const PageAllocator& pool) {
  const PoolStats s = pool.Stats();
  return s.pages_total - s.pages_used;
}

// The bytes of record r of (l, h), read through the pool as blocks-mode FETCH readers do.
std::vector<uint8_t> RecordBytes(const PageAllocator& pool, const KvSequence& seq, int l, int h,
                                 uint32_t r) {
  const HeadBlocks b = seq.Blocks(l, h);
  const size_t rb = BlockLayoutOf(seq.HeadSpec(l, h)).record_bytes;
  const uint32_t id = b.record_ids[r];
  const uint8_t* p = pool.PagePointer(id / b.records_per_page) + (id % b.records_per_page) * rb;
  return {p, p + rb};
}

// a and b hold the same tokens, rows, records, norms and (when `counters`) telemetry.
void ExpectSame(const PageAllocator& pa, const KvSequence& a, const PageAllocator& pb,
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

void MaybeWriteSeed(const std::string& name, const std::vector<uint8_t>& image) {
  const char* dir = std::getenv("KVCTL_IMAGE_SEED_DIR");
  if (dir == nullptr) return;
  std::string file = std::string(dir) + "/" + name;
  for (char& c : file) c = c == ' ' || c == ',' ? '_' : c;
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(image.data()),
             static_cast<std::streamsize>(image.size()));
}

// Writes the CRC an edited image needs to pass its checksum (docs/sequence_image.md).
void Reseal(std::vector<uint8_t>* image) {
  const uint32_t crc = Crc32c(image->data() + 16, image->size() - 16);
  std::memcpy(image->data() + 12, &crc, 4);
}

bool Names(const Status& s, StatusCode code, const std::string& word) {
  INFO(s.ToString());
  return s.code() == code && s.message().find(word) != std::string::npos;
}

TEST_CASE("Sequence image: a restored sequence behaves as the original, later appends included",
          "[controller][image]") {
  for (const Config& c : Configs()) {
    DYNAMIC_SECTION(c.name) {
      auto pool = testing::MakeTestPool(32 << 20, 16 << 10);
      // Another daemon's pool, with another page size.
      auto other = testing::MakeTestPool(32 << 20, 64 << 10);
      const SequenceGeometry geometry = Geometry(c.dtype);
      KvSequence seq(pool.get(), geometry, c.plans);
      const Data data = MakeData(kLayers, 900, kHeads, c.dtype, 7);
      // Batched unevenly, ending in a partial tail.
      for (auto [from, n] : {std::pair{0, 150}, {150, 1}, {151, 1}, {152, 149}}) {
        REQUIRE(AppendRange(&seq, data, 11, from, n).ok());
      }
      StatusOr<std::vector<uint8_t>> image = ExportImage(seq, seq.tokens(), "model-a");
      REQUIRE(image.ok());
      MaybeWriteSeed(c.name, *image);
      StatusOr<ImageInfo> info = ReadImageInfo(*image);
      REQUIRE(info.ok());
      REQUIRE(info->version == kSequenceImageVersion);
      REQUIRE(info->model_id == "model-a");
      REQUIRE(info->tokens == 301);
      REQUIRE(info->first_position == 11);
      REQUIRE(info->bytes == image->size());
      REQUIRE(!info->prefix);
      REQUIRE(info->geometry.layers == kLayers);
      REQUIRE(info->geometry.dtype == c.dtype);
      REQUIRE(info->plans.size() == c.plans.size());
      for (size_t l = 0; l < c.plans.size(); ++l) {
        REQUIRE(info->plans[l].lossless == c.plans[l].lossless);
        REQUIRE(info->plans[l].head_specs == c.plans[l].head_specs);
        if (!c.plans[l].lossless) REQUIRE(info->plans[l].rules == c.plans[l].rules);
      }

      const uint32_t free_before = FreePages(*other);
      {
        StatusOr<std::unique_ptr<KvSequence>> back =
            ImportImage(other.get(), *image, geometry, "model-a");
        REQUIRE(back.ok());
        ExpectSame(*pool, seq, *other, **back, /*counters=*/true);
        REQUIRE((*back)->Usage().tokens == seq.Usage().tokens);
        REQUIRE((*back)->Usage().payload_bytes == seq.Usage().payload_bytes);
        // The same appends on both: the same rows, records and counters.
        for (auto [from, n] : {std::pair{301, 1}, {302, 130}, {432, 3}, {435, 465}}) {
          REQUIRE(AppendRange(&seq, data, 11, from, n).ok());
          REQUIRE(AppendRange(back->get(), data, 11, from, n).ok());
          ExpectSame(*pool, seq, *other, **back, /*counters=*/true);
        }
      }
      REQUIRE(FreePages(*other) == free_before);
    }
  }
}

TEST_CASE("Sequence image: every exact prefix cut imports as a fresh prefill of its tokens",
          "[controller][image]") {
  const int64_t total = 700, granule = 16;
  for (const Config& c : Configs()) {
    DYNAMIC_SECTION(c.name) {
      auto pool = testing::MakeTestPool(64 << 20, 16 << 10);
      const SequenceGeometry geometry = Geometry(c.dtype);
      KvSequence seq(pool.get(), geometry, c.plans);
      const Data data = MakeData(kLayers, total + 300, kHeads, c.dtype, 3);
      for (auto [from, n] : {std::pair{0, 200}, {200, 7}, {207, 493}}) {
        REQUIRE(AppendRange(&seq, data, 0, from, n).ok());
      }
      for (int64_t limit :
           {total, total - 1, int64_t{600}, int64_t{513}, int64_t{400}, int64_t{300}, int64_t{257},
            int64_t{130}, int64_t{127}, int64_t{33}, int64_t{5}}) {
        const int64_t m = LargestExactCut(seq, limit, granule);
        INFO("limit " << limit << ", cut " << m);
        REQUIRE(m <= limit);
        REQUIRE(m % granule == 0);
        // Maximal: no larger multiple of the granule up to the limit exports.
        for (int64_t larger = m + granule; larger <= limit; larger += granule) {
          REQUIRE(
              Names(ExportImage(seq, larger, "").status(), StatusCode::kInvalidArgument, "tokens"));
        }
        StatusOr<std::vector<uint8_t>> image = ExportImage(seq, m, "m");
        REQUIRE(image.ok());
        REQUIRE(ReadImageInfo(*image)->prefix == (m < total));
        StatusOr<std::unique_ptr<KvSequence>> back = ImportImage(pool.get(), *image, geometry, "m");
        REQUIRE(back.ok());
        KvSequence fresh(pool.get(), geometry, c.plans);
        if (m > 0) REQUIRE(AppendRange(&fresh, data, 0, 0, m).ok());
        ExpectSame(*pool, fresh, *pool, **back, /*counters=*/false);
        // And both continue alike (another session's next tokens).
        for (auto [from, n] : {std::pair{m, int64_t{1}}, {m + 1, int64_t{299}}}) {
          REQUIRE(AppendRange(&fresh, data, 0, from, n).ok());
          REQUIRE(AppendRange(back->get(), data, 0, from, n).ok());
        }
        ExpectSame(*pool, fresh, *pool, **back, /*counters=*/false);
      }
    }
  }
}

TEST_CASE("Sequence image: cut rules for sinks, flush groups and tails", "[controller][image]") {
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  // KIVI G32, flush 128, 4 sinks: 4 + 2 * 128 quantized, then a 50-token tail.
  std::vector<LayerPlan> plans = {Plan(QuantMethod::kKivi, kHeads, {{2, 2}}, 4),
                                  LosslessPlan(kHeads)};
  KvSequence seq(pool.get(), Geometry(DType::kF32), plans);
  const Data data = MakeData(kLayers, 310, kHeads, DType::kF32, 5);
  REQUIRE(AppendRange(&seq, data, 0, 0, 310).ok());
  REQUIRE(seq.Blocks(0, 0).records == 8);
  REQUIRE(seq.Blocks(0, 0).tail_rows == 50);
  for (int64_t m : {0, 1, 4, 132, 260, 261, 300, 310}) {
    INFO("cut " << m);
    REQUIRE(ExportImage(seq, m, "").ok());
  }
  for (int64_t m : {5, 36, 131, 133, 259}) {
    INFO("cut " << m);
    REQUIRE(Names(ExportImage(seq, m, "").status(), StatusCode::kInvalidArgument, "layer 0"));
  }
  REQUIRE(Names(ExportImage(seq, 311, "").status(), StatusCode::kInvalidArgument, "tokens"));
  REQUIRE(Names(ExportImage(seq, -1, "").status(), StatusCode::kInvalidArgument, "tokens"));
  REQUIRE(LargestExactCut(seq, 310, 1) == 310);
  REQUIRE(LargestExactCut(seq, 259, 1) == 132);
  REQUIRE(LargestExactCut(seq, 259, 16) == 0);  // 4 + k * 128 is never a multiple of 16 here.
  REQUIRE(LargestExactCut(seq, 3, 1) == 3);
  REQUIRE(LargestExactCut(seq, 0, 1) == 0);
  REQUIRE(LargestExactCut(seq, 100, 0) == 0);
}

TEST_CASE("Sequence image: eviction is refused by name, an importer may evict from then on",
          "[controller][image]") {
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  const std::vector<LayerPlan> plans = {Plan(QuantMethod::kKivi, kHeads, {{2, 2}}, 4),
                                        Plan(QuantMethod::kKivi, kHeads, {{2, 2}}, 4)};
  EvictionSettings ev;
  ev.enabled = true;
  ev.policy = EvictPolicy::kStreaming;
  ev.sinks = 4;
  ev.window = 16;
  ev.tokens_per_head = 200;
  ev.floor = 20;
  KvSequence evicting(pool.get(), Geometry(DType::kF32), plans, ev);
  const Data data = MakeData(kLayers, 600, kHeads, DType::kF32, 9);
  REQUIRE(AppendRange(&evicting, data, 0, 0, 300).ok());
  REQUIRE(
      Names(ExportImage(evicting, 300, "").status(), StatusCode::kFailedPrecondition, "eviction"));
  REQUIRE(LargestExactCut(evicting, 300, 1) == 0);

  KvSequence plain(pool.get(), Geometry(DType::kF32), plans);
  REQUIRE(AppendRange(&plain, data, 0, 0, 300).ok());
  StatusOr<std::vector<uint8_t>> image = ExportImage(plain, 300, "");
  REQUIRE(image.ok());
  StatusOr<std::unique_ptr<KvSequence>> back =
      ImportImage(pool.get(), *image, Geometry(DType::kF32), "", ev);
  REQUIRE(back.ok());
  REQUIRE(AppendRange(back->get(), data, 0, 300, 10).ok());
  for (int h = 0; h < kHeads; ++h) REQUIRE((*back)->HeadUsageOf(0, h).tokens <= 200);
  // More sinks than the image has, with tokens already past them: refused by name.
  ev.sinks = 8;
  ev.floor = 24;
  REQUIRE(Names(ImportImage(pool.get(), *image, Geometry(DType::kF32), "", ev).status(),
                StatusCode::kFailedPrecondition, "evict.sinks"));
}

TEST_CASE(
    "Sequence image: an evicting sequence with no scoring state yet restores and then "
    "evicts exactly as the original",
    "[controller][image]") {
  auto pool = testing::MakeTestPool(32 << 20, 16 << 10);
  const std::vector<LayerPlan> plans = {Plan(QuantMethod::kKivi, kHeads, {{2, 2}}, 2),
                                        Plan(QuantMethod::kQuaRot, kHeads, {{4, 4}})};
  EvictionSettings ev;
  ev.enabled = true;
  ev.policy = EvictPolicy::kStreaming;
  ev.sinks = 4;  // Above layer 0's 2 fp16 sinks: the image carries the effective 4.
  ev.window = 16;
  ev.tokens_per_head = 200;
  ev.floor = 20;
  ev.compression_period = 8;
  const Data data = MakeData(kLayers, 700, kHeads, DType::kF32, 13);
  KvSequence seq(pool.get(), Geometry(DType::kF32), plans, ev);
  REQUIRE(AppendRange(&seq, data, 5, 0, 150).ok());
  REQUIRE(AppendRange(&seq, data, 5, 150, 40).ok());  // 190 <= 200: nothing evicted yet.
  StatusOr<std::vector<uint8_t>> image = ExportImage(seq, seq.tokens(), "");
  REQUIRE(image.ok());
  REQUIRE(ReadImageInfo(*image)->plans[0].rules.sink_tokens == 4);
  StatusOr<std::unique_ptr<KvSequence>> back =
      ImportImage(pool.get(), *image, Geometry(DType::kF32), "", ev);
  REQUIRE(back.ok());
  ExpectSame(*pool, seq, *pool, **back, true);
  for (auto [from, n] : {std::pair{190, 1}, {191, 30}, {221, 1}, {222, 300}, {522, 7}}) {
    REQUIRE(AppendRange(&seq, data, 5, from, n).ok());
    REQUIRE(AppendRange(back->get(), data, 5, from, n).ok());
    ExpectSame(*pool, seq, *pool, **back, true);
    for (int l = 0; l < kLayers; ++l) {
      REQUIRE(seq.LayerBudget(l) == (*back)->LayerBudget(l));
      for (int h = 0; h < kHeads; ++h) {
        const HeadUsage a = seq.HeadUsageOf(l, h), b = (*back)->HeadUsageOf(l, h);
        REQUIRE(a.evicted_tokens == b.evicted_tokens);
        REQUIRE(a.requantized_tokens == b.requantized_tokens);
        REQUIRE(a.budget == b.budget);
      }
    }
  }
  REQUIRE(seq.HeadUsageOf(0, 0).evicted_tokens > 0);
  // Now it has evicted: refused, naming eviction and the head.
  REQUIRE(Names(ExportImage(seq, seq.tokens(), "").status(), StatusCode::kFailedPrecondition,
                "eviction: layer 0, head 0"));

  // A policy that reads queries keeps query rows from its first append: refused by name.
  SequenceGeometry gq = Geometry(DType::kF32);
  gq.q_heads = kHeads;
  ev.policy = EvictPolicy::kSnapKV;
  KvSequence snap(pool.get(), gq, plans, ev);
  const std::vector<KvTensorView> q = data.Views(data.k, 0, 50);
  REQUIRE(snap.Append(0, data.Views(data.k, 0, 50), data.Views(data.v, 0, 50), &q).ok());
  REQUIRE(Names(ExportImage(snap, 50, "").status(), StatusCode::kFailedPrecondition, "query rows"));
}

TEST_CASE("Sequence image: bad images get their named error and take no page",
          "[controller][image]") {
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  const SequenceGeometry geometry = Geometry(DType::kF16);
  const std::vector<LayerPlan> plans = {Plan(QuantMethod::kOscar, kHeads, {{2, 2}}),
                                        Plan(QuantMethod::kKivi, kHeads, {{4, 2}}, 4)};
  KvSequence seq(pool.get(), geometry, plans);
  const Data data = MakeData(kLayers, 600, kHeads, DType::kF16, 2);
  REQUIRE(AppendRange(&seq, data, 0, 0, 600).ok());
  StatusOr<std::vector<uint8_t>> good = ExportImage(seq, 600, "model-a");
  REQUIRE(good.ok());
  const uint32_t free_before = FreePages(*pool);
  auto import = [&](const std::vector<uint8_t>& image, const SequenceGeometry& g,
                    std::string_view model) {
    Status s = ImportImage(pool.get(), image, g, model).status();
    REQUIRE(FreePages(*pool) == free_before);
    return s;
  };
  SECTION("geometry") {
    SequenceGeometry g = geometry;
    g.head_dim = 128;
    REQUIRE(Names(import(*good, g, "model-a"), StatusCode::kFailedPrecondition, "head_dim"));
    g = geometry;
    g.layers = 3;
    REQUIRE(Names(import(*good, g, "model-a"), StatusCode::kFailedPrecondition, "layers"));
    g = geometry;
    g.dtype = DType::kBF16;
    REQUIRE(Names(import(*good, g, "model-a"), StatusCode::kFailedPrecondition, "dtype"));
    g = geometry;
    g.quality_sample_period = 0;  // The importer's setting, not geometry.
    REQUIRE(import(*good, g, "model-a").ok());
  }
  SECTION("model id") {
    REQUIRE(Names(import(*good, geometry, "model-b"), StatusCode::kFailedPrecondition, "model_id"));
    REQUIRE(import(*good, geometry, "").ok());
  }
  SECTION("unknown method") {
    std::vector<uint8_t> bad = *good;
    // Layer 0's plan follows the 96-byte header and the 7-byte model id; head 1's method word.
    const size_t method = 96 + 7 + 12 + 32;
    REQUIRE(bad[method] == static_cast<uint8_t>(QuantMethod::kOscar));
    bad[method] = 9;
    Reseal(&bad);
    REQUIRE(Names(import(bad, geometry, "model-a"), StatusCode::kFailedPrecondition,
                  "layer 0, head 1: quantizer method 9"));
    bad[method] = static_cast<uint8_t>(QuantMethod::kKivi);  // Known, but not the layer's.
    Reseal(&bad);
    REQUIRE(Names(import(bad, geometry, "model-a"), StatusCode::kFailedPrecondition, "head 1"));
  }
  SECTION("flipped byte") {
    for (size_t at :
         {size_t{0}, size_t{9}, size_t{13}, size_t{40}, good->size() / 2, good->size() - 1}) {
      std::vector<uint8_t> bad = *good;
      bad[at] ^= 0x10;
      const StatusCode want = at == 9 ? StatusCode::kFailedPrecondition : StatusCode::kDataLoss;
      INFO("byte " << at);
      REQUIRE(import(bad, geometry, "model-a").code() == want);
      REQUIRE(ReadImageInfo(bad).status().code() == want);
    }
  }
  SECTION("truncated") {
    for (size_t size : {size_t{0}, size_t{10}, size_t{95}, size_t{200}, good->size() - 1}) {
      std::vector<uint8_t> bad(good->begin(), good->begin() + static_cast<std::ptrdiff_t>(size));
      REQUIRE(Names(import(bad, geometry, "model-a"), StatusCode::kDataLoss, "sequence image"));
    }
    // Truncated with a consistent header: the body check finds it.
    std::vector<uint8_t> bad(good->begin(), good->end() - 8);
    const uint64_t size = bad.size();
    std::memcpy(bad.data() + 16, &size, 8);
    Reseal(&bad);
    REQUIRE(Names(import(bad, geometry, "model-a"), StatusCode::kDataLoss, "needs"));
  }
  SECTION("counts inconsistent with the tokens") {
    std::vector<uint8_t> bad = *good;
    int64_t tokens = 599;
    std::memcpy(bad.data() + 64, &tokens, 8);
    Reseal(&bad);
    REQUIRE(Names(import(bad, geometry, "model-a"), StatusCode::kDataLoss, "do not make 599"));
  }
  SECTION("non-finite values") {
    // The last 4 bytes: the V row of layer 1's last head's last tail token (a lossless f32 layer
    // here, so the image ends in its rows).
    KvSequence lossless(pool.get(), Geometry(DType::kF32),
                        {Plan(QuantMethod::kKivi, kHeads, {{2, 2}}), LosslessPlan(kHeads)});
    const Data f32 = MakeData(kLayers, 40, kHeads, DType::kF32, 2);
    REQUIRE(AppendRange(&lossless, f32, 0, 0, 40).ok());
    StatusOr<std::vector<uint8_t>> image = ExportImage(lossless, 40, "");
    REQUIRE(image.ok());
    const uint32_t before = FreePages(*pool);
    const uint32_t nan = 0x7FC00000;
    std::memcpy(image->data() + image->size() - 4, &nan, 4);
    Reseal(&*image);
    REQUIRE(Names(ImportImage(pool.get(), *image, Geometry(DType::kF32), "").status(),
                  StatusCode::kDataLoss, "layer 1, head 2: a row value is not finite"));
    REQUIRE(FreePages(*pool) == before);
  }
  SECTION("a pool without the pages") {
    auto small = testing::MakeTestPool(64 << 10, 16 << 10);
    const uint32_t small_free = FreePages(*small);
    REQUIRE(ImportImage(small.get(), *good, geometry, "model-a").status().code() ==
            StatusCode::kResourceExhausted);
    REQUIRE(FreePages(*small) == small_free);
  }
}

TEST_CASE("Sequence image: restored into a checksummed pool, pages verify", "[controller][image]") {
  auto arena = ShmArena::Create("/kvctl-test-image-" + std::to_string(getpid()), 16 << 20);
  REQUIRE(arena.ok());
  auto pool = PageAllocator::Create(std::move(*arena), {.page_bytes = 16 << 10, .checksums = true});
  REQUIRE(pool.ok());
  const std::vector<LayerPlan> plans = {Plan(QuantMethod::kKivi, kHeads, {{2, 2}}),
                                        LosslessPlan(kHeads)};
  KvSequence seq(pool->get(), Geometry(DType::kF32), plans);
  const Data data = MakeData(kLayers, 300, kHeads, DType::kF32, 4);
  REQUIRE(AppendRange(&seq, data, 0, 0, 300).ok());
  StatusOr<std::vector<uint8_t>> image = ExportImage(seq, 300, "");
  REQUIRE(image.ok());
  StatusOr<std::unique_ptr<KvSequence>> back =
      ImportImage(pool->get(), *image, Geometry(DType::kF32), "");
  REQUIRE(back.ok());
  REQUIRE((*back)->Verify(0, kLayers).ok());
  ExpectSame(**pool, seq, **pool, **back, true);
  // A page changed behind the daemon's back is not sealed into an image.
  const HeadBlocks b = seq.Blocks(0, 0);
  REQUIRE(b.records > 0);
  (*pool)->PagePointer(b.record_ids[0] / b.records_per_page)[0] ^= 1;
  REQUIRE(ExportImage(seq, 300, "").status().code() == StatusCode::kDataLoss);
}

TEST_CASE("Sequence image: widths lowered under pressure travel with the records",
          "[controller][image]") {
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  const std::vector<LayerPlan> plans = {Plan(QuantMethod::kKivi, kHeads, {{4, 4}}),
                                        Plan(QuantMethod::kQuaRot, kHeads, {{8, 4}})};
  KvSequence seq(pool.get(), Geometry(DType::kF32), plans);
  const Data data = MakeData(kLayers, 600, kHeads, DType::kF32, 8);
  REQUIRE(AppendRange(&seq, data, 0, 0, 300).ok());
  REQUIRE(seq.LowerWidth(0, 1, 2, 2).ok());
  REQUIRE(seq.LowerWidth(1, 2, 4, 2).ok());
  StatusOr<std::vector<uint8_t>> image = ExportImage(seq, 300, "");
  REQUIRE(image.ok());
  REQUIRE(ReadImageInfo(*image)->plans[0].head_specs[1].k_bits == 2);
  StatusOr<std::unique_ptr<KvSequence>> back =
      ImportImage(pool.get(), *image, Geometry(DType::kF32), "");
  REQUIRE(back.ok());
  ExpectSame(*pool, seq, *pool, **back, true);
  REQUIRE((*back)->HeadUsageOf(0, 1).width_lowerings == 1);
  REQUIRE(AppendRange(&seq, data, 0, 300, 300).ok());
  REQUIRE(AppendRange(back->get(), data, 0, 300, 300).ok());
  ExpectSame(*pool, seq, *pool, **back, true);
}

// Small real images for the fuzzer's seed corpus (tests/fuzz/image_seeds/):
//   KVCTL_IMAGE_SEED_DIR=tests/fuzz/image_seeds build/tests/sequence_test "[.seeds]"
TEST_CASE("Sequence image: writes the fuzz seed images", "[.seeds]") {
  REQUIRE(std::getenv("KVCTL_IMAGE_SEED_DIR") != nullptr);
  auto pool = testing::MakeTestPool(16 << 20, 16 << 10);
  auto small = [](QuantMethod m, std::pair<int, int> bits, int sinks, int flush) {
    LayerPlan p = Plan(m, kHeads, {bits}, sinks);
    p.rules.flush_tokens = flush;
    return p;
  };
  struct Seed {
    std::string name;
    DType dtype;
    std::vector<LayerPlan> plans;
    int64_t tokens, cut;
  };
  const std::vector<Seed> seeds = {
      {"lossless_f16", DType::kF16, {LosslessPlan(kHeads), LosslessPlan(kHeads)}, 9, 9},
      {"kivi_sinks_prefix",
       DType::kF16,
       {small(QuantMethod::kKivi, {2, 4}, 2, 32), LosslessPlan(kHeads)},
       45,
       34},
      {"oscar",
       DType::kF32,
       {small(QuantMethod::kOscar, {2, 2}, 0, 32), small(QuantMethod::kOscar, {4, 4}, 0, 32)},
       37,
       37},
      {"turbo_quarot",
       DType::kBF16,
       {small(QuantMethod::kTurbo, {3, 3}, 1, 32), small(QuantMethod::kQuaRot, {8, 2}, 1, 32)},
       40,
       40},
      {"empty",
       DType::kF32,
       {LosslessPlan(kHeads), small(QuantMethod::kKivi, {2, 2}, 0, 32)},
       40,
       0},
  };
  for (const Seed& s : seeds) {
    KvSequence seq(pool.get(), Geometry(s.dtype), s.plans);
    const Data data = MakeData(kLayers, s.tokens, kHeads, s.dtype, 1);
    REQUIRE(AppendRange(&seq, data, 3, 0, s.tokens).ok());
    StatusOr<std::vector<uint8_t>> image = ExportImage(seq, s.cut, "seed");
    REQUIRE(image.ok());
    MaybeWriteSeed(s.name, *image);
  }
}

// Export and import time of a 2K-token SmolLM2-135M-shaped sequence (30 layers, 3 KV heads, D 64)
// per method. Prints only; run by hand:
//   build/tests/sequence_test "Sequence image bench*"
TEST_CASE("Sequence image bench: export and import of a 2K-token sequence", "[.bench]") {
  const int layers = 30, tokens = 2048;
  const SequenceGeometry g{
      .layers = layers, .kv_heads = kHeads, .head_dim = kDim, .dtype = DType::kF16};
  const Data data = MakeData(layers, tokens, kHeads, DType::kF16, 11);
  for (auto [name, m, bits] : {std::tuple{"lossless f16", QuantMethod::kFp16, 16},
                               {"kivi k2v2", QuantMethod::kKivi, 2},
                               {"kvarn k2v2", QuantMethod::kKvarn, 2},
                               {"turbo k3v3", QuantMethod::kTurbo, 3}}) {
    auto pool = testing::MakeTestPool(256 << 20, 64 << 10);
    std::vector<LayerPlan> plans(
        layers, m == QuantMethod::kFp16 ? LosslessPlan(kHeads) : Plan(m, kHeads, {{bits, bits}}));
    KvSequence seq(pool.get(), g, plans);
    REQUIRE(AppendRange(&seq, data, 0, 0, tokens).ok());
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    StatusOr<std::vector<uint8_t>> image = ExportImage(seq, tokens, "smollm2-135m");
    const auto t1 = Clock::now();
    REQUIRE(image.ok());
    StatusOr<std::unique_ptr<KvSequence>> back = ImportImage(pool.get(), *image, g, "");
    const auto t2 = Clock::now();
    REQUIRE(back.ok());
    auto ms = [](auto a, auto b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    std::printf(
        "%-13s image %8.2f MiB (%6.1f B/token/layer/head): export %7.2f ms, import %7.2f ms\n",
        name, image->size() / 1048576.0,
        static_cast<double>(image->size()) / tokens / layers / kHeads, ms(t0, t1), ms(t1, t2));
  }
}

}  // namespace
}  // namespace kvctl
