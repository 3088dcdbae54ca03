// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Shared by the prefix and tier integration tests: a 2-layer, 2-head fp16 geometry, synthetic
// streams, inline APPEND of a token range, HELLO, the rows of a dense FETCH, STATS fields and
// token ids.
#ifndef KVCTL_TESTS_INTEGRATION_PREFIX_TEST_UTIL_H_
#define KVCTL_TESTS_INTEGRATION_PREFIX_TEST_UTIL_H_

#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "common/half.h"
#include "ipc/client.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl::prefix_test {

constexpr int kLayers = 2, kHeads = 2, kDim = 64;
constexpr size_t kRow = static_cast<size_t>(kHeads) * kDim;

// [layers, tokens, heads, d] fp16 of a synthetic stream (K or V).
inline std::vector<uint16_t> MakeFp16(int64_t tokens, uint64_t seed, bool values) {
  std::vector<uint16_t> out;
  for (int l = 0; l < kLayers; ++l) {
    SyntheticKv kv = GenerateSyntheticKv(
        {.tokens = tokens, .heads = kHeads, .head_dim = kDim, .seed = seed * 100 + l});
    for (float x : values ? kv.v : kv.k) out.push_back(FloatToHalf(x));
  }
  return out;
}

// Tokens [first, first + n) of a [layers, tokens, ...] buffer.
inline std::vector<uint16_t> Slice(const std::vector<uint16_t>& all, int64_t tokens, int64_t first,
                                   int64_t n) {
  std::vector<uint16_t> out;
  for (int l = 0; l < kLayers; ++l) {
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>((l * tokens + first) * kRow);
    out.insert(out.end(), begin, begin + static_cast<std::ptrdiff_t>(n * kRow));
  }
  return out;
}

inline StatusOr<ipc::AppendReply> Append(ipc::Client& c, uint64_t sid, uint64_t seq,
                                         const std::vector<uint16_t>& k,
                                         const std::vector<uint16_t>& v, int64_t total,
                                         int64_t first, int64_t n) {
  const auto ks = Slice(k, total, first, n), vs = Slice(v, total, first, n);
  return c.AppendInline({sid, seq, static_cast<uint64_t>(first), static_cast<uint32_t>(n)},
                        {reinterpret_cast<const std::byte*>(ks.data()), ks.size() * 2},
                        {reinterpret_cast<const std::byte*>(vs.data()), vs.size() * 2});
}

inline uint64_t Hello(ipc::Client& c, const std::string& model = "tier-model") {
  auto hello = c.Hello({.client_name = "it",
                        .model_name = model,
                        .geometry = {kLayers, kHeads, 0, kDim, DType::kF16}});
  REQUIRE(hello.ok());
  return hello->session_id;
}

// Per (layer, head), the fp32 K and V rows of the first `tokens` positions of a dense FETCH.
struct Rows {
  std::vector<std::vector<float>> k, v;
};
inline Rows FirstRows(const ipc::FetchDenseReply& f, int64_t tokens) {
  Rows out;
  const auto* fk = static_cast<const float*>(f.k.data());
  const auto* fv = static_cast<const float*>(f.v.data());
  const auto* pos = static_cast<const int64_t*>(f.positions.data());
  size_t r = 0;
  for (uint32_t count : f.counts) {
    std::vector<float> k, v;
    for (uint32_t i = 0; i < count; ++i, ++r) {
      if (pos[r] >= tokens) continue;
      k.insert(k.end(), fk + r * kDim, fk + (r + 1) * kDim);
      v.insert(v.end(), fv + r * kDim, fv + (r + 1) * kDim);
    }
    out.k.push_back(std::move(k));
    out.v.push_back(std::move(v));
  }
  return out;
}

inline uint64_t StatsField(ipc::Client& c, const std::string& section, const std::string& field) {
  auto text = c.Stats(0, section);
  REQUIRE(text.ok());
  const size_t at = text->find("\n" + field + ":");
  REQUIRE(at != std::string::npos);
  return std::stoull(text->substr(at + field.size() + 2));
}

inline std::vector<int32_t> Ids(int64_t n, int32_t first = 1000) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = first + static_cast<int32_t>(i * 37 % 4999);
  return ids;
}

}  // namespace kvctl::prefix_test

#endif  // KVCTL_TESTS_INTEGRATION_PREFIX_TEST_UTIL_H_
