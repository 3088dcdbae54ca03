// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// KvSequence::FetchDenseInto (the dense FETCH reply's path) against FetchDense's fp32 rows
// converted element by element with common/half.h: every quantizer and lossless storage dtype,
// every output dtype, sinks + records + tail, a layer sub-range, unaligned buffers, at every SIMD
// level this CPU runs. FetchDenseUnitsInto (a FETCH decoded on two threads) over any split writes
// the same bytes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "common/half.h"
#include "controller/sequence/kv_sequence.h"
#include "kernels/quantize.h"
#include "tests/controller/sequence/sequence_test_util.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

std::vector<LayerPlan> Plans(int layers, int heads, QuantMethod m, int d, bool lossless) {
  std::vector<LayerPlan> plans(static_cast<size_t>(layers));
  StatusOr<QuantSpec> spec = MakeQuantSpec(m, d, lossless ? 16 : 2, lossless ? 16 : 2);
  REQUIRE(spec.ok());
  for (LayerPlan& p : plans) {
    p.lossless = lossless;
    p.head_specs.assign(static_cast<size_t>(heads), *spec);
    p.rules = testing::PinnedRules(m);
  }
  return plans;
}

// FetchDense's float as `dtype`, the reference of FetchDenseInto.
std::vector<uint8_t> Expected(const std::vector<float>& rows, DType dtype) {
  std::vector<uint8_t> out(rows.size() * DTypeSize(dtype));
  for (size_t i = 0; i < rows.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&out[4 * i], &rows[i], 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? FloatToHalf(rows[i]) : FloatToBf16(rows[i]);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

void CheckInto(const KvSequence& seq, int begin, int end, int d, DType dtype, size_t offset) {
  INFO("layers [" << begin << ", " << end << "), out " << DTypeName(dtype) << ", offset "
                  << offset);
  const DenseKv dense = seq.FetchDense(begin, end);
  const std::vector<uint32_t> counts = seq.DenseCounts(begin, end);
  REQUIRE(counts == dense.counts);
  size_t rows = 0;
  for (uint32_t c : counts) rows += c;
  REQUIRE(rows == dense.positions.size());
  const size_t bytes = rows * d * DTypeSize(dtype);
  constexpr uint8_t kCanary = 0x5A;
  // Each buffer `offset` bytes into an allocation with a canary tail.
  std::vector<uint8_t> k(bytes + offset + 16, kCanary), v(k), pos(rows * 8 + offset + 16, kCanary);
  seq.FetchDenseInto(begin, end,
                     {dtype, k.data() + offset, v.data() + offset, pos.data() + offset});
  const std::vector<uint8_t> want_k = Expected(dense.k, dtype), want_v = Expected(dense.v, dtype);
  CHECK(std::memcmp(k.data() + offset, want_k.data(), bytes) == 0);
  CHECK(std::memcmp(v.data() + offset, want_v.data(), bytes) == 0);
  CHECK(std::memcmp(pos.data() + offset, dense.positions.data(), rows * 8) == 0);
  for (size_t i = offset + bytes; i < k.size(); ++i) REQUIRE((k[i] == kCanary && v[i] == kCanary));
  for (size_t i = offset + rows * 8; i < pos.size(); ++i) REQUIRE(pos[i] == kCanary);

  // FetchDenseUnitsInto: every unit alone, last first (a unit that wrote outside its own rows
  // would be overwritten by, or overwrite, another's), and every split into two ranges, each
  // write the same bytes as FetchDenseInto.
  const size_t units = seq.DenseUnits(begin, end);
  const auto same = [&](const std::vector<uint8_t>& k2, const std::vector<uint8_t>& v2,
                        const std::vector<uint8_t>& p2) { return k2 == k && v2 == v && p2 == pos; };
  std::vector<uint8_t> k2(k.size(), kCanary), v2(k2), p2(pos.size(), kCanary);
  const DenseOut out2{dtype, k2.data() + offset, v2.data() + offset, p2.data() + offset};
  for (size_t u = units; u-- > 0;) seq.FetchDenseUnitsInto(begin, end, out2, u, u + 1);
  CHECK(same(k2, v2, p2));
  // Parts of three units, in any order, the last passing the end (as the controller's are).
  std::fill(k2.begin(), k2.end(), kCanary);
  std::fill(v2.begin(), v2.end(), kCanary);
  std::fill(p2.begin(), p2.end(), kCanary);
  for (size_t part = 0; part * 3 < units; part += 2) {
    seq.FetchDenseUnitsInto(begin, end, out2, part * 3, part * 3 + 3);
  }
  for (size_t part = 1; part * 3 < units; part += 2) {
    seq.FetchDenseUnitsInto(begin, end, out2, part * 3, part * 3 + 3);
  }
  CHECK(same(k2, v2, p2));
  for (size_t split = 0; split <= units; ++split) {
    INFO("split at unit " << split << " of " << units);
    std::fill(k2.begin(), k2.end(), kCanary);
    std::fill(v2.begin(), v2.end(), kCanary);
    std::fill(p2.begin(), p2.end(), kCanary);
    seq.FetchDenseUnitsInto(begin, end, out2, split, units);
    seq.FetchDenseUnitsInto(begin, end, out2, 0, split);
    REQUIRE(same(k2, v2, p2));
  }
}

TEST_CASE("KvSequence: FetchDenseInto writes FetchDense's rows converted, for every storage",
          "[controller]") {
  const int layers = 3, heads = 2, d = 64;
  const int64_t tokens = 300;  // Sinks, two records of 128 (most methods) and a tail.
  SyntheticKv kv =
      GenerateSyntheticKv({.tokens = tokens, .heads = heads, .head_dim = d, .seed = 5});
  std::vector<KvTensorView> views_k, views_v;
  for (int l = 0; l < layers; ++l) {
    views_k.push_back(KvTensorView::Contiguous(kv.k.data(), DType::kF32, tokens, heads, d));
    views_v.push_back(KvTensorView::Contiguous(kv.v.data(), DType::kF32, tokens, heads, d));
  }
  struct Storage {
    QuantMethod method;
    bool lossless;
    DType session;
  };
  const std::vector<Storage> storages = {
      {QuantMethod::kKivi, false, DType::kF16},   {QuantMethod::kKvarn, false, DType::kF16},
      {QuantMethod::kQuaRot, false, DType::kF32}, {QuantMethod::kOscar, false, DType::kF16},
      {QuantMethod::kTurbo, false, DType::kBF16}, {QuantMethod::kFp16, true, DType::kF16},
      {QuantMethod::kFp16, true, DType::kBF16},   {QuantMethod::kFp16, true, DType::kF32}};
  const SimdLevel saved = ActiveSimdLevel();
  for (const Storage& s : storages) {
    INFO("method " << static_cast<int>(s.method) << ", lossless " << s.lossless << ", session "
                   << DTypeName(s.session));
    auto pool = testing::MakeTestPool(16 << 20);
    KvSequence seq(pool.get(), {layers, heads, d, s.session},
                   Plans(layers, heads, s.method, d, s.lossless));
    // Two appends, the second starting mid-block, from position 11.
    std::vector<KvTensorView> k1, v1, k2, v2;
    for (int l = 0; l < layers; ++l) {
      k1.push_back(views_k[l].Tokens(0, 200)), v1.push_back(views_v[l].Tokens(0, 200));
      k2.push_back(views_k[l].Tokens(200, 100)), v2.push_back(views_v[l].Tokens(200, 100));
    }
    REQUIRE(seq.Append(11, k1, v1).ok());
    REQUIRE(seq.Append(211, k2, v2).ok());
    if (!s.lossless) REQUIRE(seq.Blocks(0, 0).records > 0);
    for (int level = 0; level <= static_cast<int>(DetectSimdLevel()); ++level) {
      REQUIRE(SetSimdLevel(static_cast<SimdLevel>(level)).ok());
      for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
        CheckInto(seq, 0, layers, d, out, 0);
        CheckInto(seq, 1, 2, d, out, 1);
      }
    }
  }
  REQUIRE(SetSimdLevel(saved).ok());
}

}  // namespace
}  // namespace kvctl
