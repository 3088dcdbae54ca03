// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// Prefix names (the block-hash chain) and the stored prefix value's framing.
#include "controller/service/prefix_keys.h"

#include <catch2/catch.hpp>
#include <set>

namespace kvctl {
namespace {

PrefixNamespace SmolNamespace() {
  return {
      .key_prefix = "kvctl",
      .model_name = "smollm2",
      .geometry = {.layers = 30, .kv_heads = 3, .q_heads = 9, .head_dim = 64, .dtype = DType::kF16},
      .block_tokens = 4};
}

std::vector<int32_t> Tokens(int n, int seed = 0) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7919 + seed) % 49152;
  return t;
}

TEST_CASE("PrefixKeys: one key per whole block, a chain shared by equal prefixes", "[controller]") {
  const PrefixNamespace ns = SmolNamespace();
  const std::vector<int32_t> t = Tokens(11);
  const std::vector<std::string> keys = PrefixKeys(ns, t);
  REQUIRE(keys.size() == 2);  // 11 tokens: blocks [0, 4) and [4, 8); the partial third is left.
  CHECK(keys[0].rfind("kvctl:p:", 0) == 0);
  CHECK(keys[0].size() == 8 + 64);
  CHECK(keys[0] != keys[1]);
  CHECK(PrefixKeys(ns, t) == keys);  // Deterministic.
  // A longer prompt with the same start meets the same keys, then goes on.
  std::vector<int32_t> longer = t;
  longer.insert(longer.end(), {5, 6, 7, 8, 9});
  const std::vector<std::string> more = PrefixKeys(ns, longer);
  REQUIRE(more.size() == 4);
  CHECK((more[0] == keys[0] && more[1] == keys[1]));
  // One changed id changes its block's key and every key after it, not the ones before.
  std::vector<int32_t> changed = longer;
  changed[5] += 1;
  const std::vector<std::string> diverged = PrefixKeys(ns, changed);
  CHECK(diverged[0] == more[0]);
  CHECK(diverged[1] != more[1]);
  CHECK(diverged[2] != more[2]);
  CHECK(PrefixKeys(ns, Tokens(3)).empty());
}

TEST_CASE("PrefixKeys: model, geometry, dtype, block size and key prefix separate caches",
          "[controller]") {
  const std::vector<int32_t> t = Tokens(8);
  std::set<std::string> first_keys;
  auto add = [&](const PrefixNamespace& ns) {
    return first_keys.insert(PrefixKeys(ns, t)[0]).second;
  };
  PrefixNamespace ns = SmolNamespace();
  CHECK(add(ns));
  ns.model_name = "smollm2-other";
  CHECK(add(ns));
  ns = SmolNamespace();
  ns.geometry.kv_heads = 4;
  CHECK(add(ns));
  ns = SmolNamespace();
  ns.geometry.dtype = DType::kBF16;
  CHECK(add(ns));
  ns = SmolNamespace();
  ns.block_tokens = 2;
  CHECK(add(ns));
  ns = SmolNamespace();
  ns.key_prefix = "other";
  CHECK(add(ns));
  ns = SmolNamespace();
  ns.geometry.q_heads = 3;  // Not part of what is stored.
  CHECK(!add(ns));
}

TEST_CASE("Prefix values round-trip and refuse corruption", "[controller]") {
  const std::vector<int32_t> t = Tokens(16, 3);
  const std::vector<uint8_t> image = {1, 2, 3, 4, 5, 0, 255};
  const std::vector<uint8_t> value = EncodePrefixValue(t, image);
  StatusOr<PrefixValue> decoded = DecodePrefixValue(value);
  REQUIRE(decoded.ok());
  CHECK(decoded->tokens == t);
  CHECK(std::vector<uint8_t>(decoded->image.begin(), decoded->image.end()) == image);

  for (size_t i = 0; i < 20 + t.size() * 4; ++i) {  // Every byte of the header and the ids.
    std::vector<uint8_t> bad = value;
    bad[i] ^= 0x10;
    StatusOr<PrefixValue> d = DecodePrefixValue(bad);
    INFO(i);
    REQUIRE(!d.ok());
    CHECK(d.status().code() == StatusCode::kDataLoss);
  }
  CHECK_THAT(DecodePrefixValue(std::span<const uint8_t>(value.data(), 10)).status().message(),
             Catch::Contains("shorter than its 20-byte header"));
  std::vector<uint8_t> huge = value;
  huge[15] = 0x7F;  // An id count far beyond the value's bytes.
  CHECK_THAT(DecodePrefixValue(huge).status().message(), Catch::Contains("do not fit"));
}

}  // namespace
}  // namespace kvctl
