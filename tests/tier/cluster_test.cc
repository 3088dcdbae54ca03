// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/tier/cluster_test.cc
// RedisCluster and BlobStore against the shared 3-master cluster of the "tier_cluster" fixture:
// routing over every master, binary values, blobs of 0 bytes to several MiB, chunks damaged
// behind the store's back, and seed lists with dead seeds. Tests here only add keys under their
// own prefix; tests that break a cluster are in failure_test.cc.
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/tier/tier_test_util.h"
#include "tier/blob_store.h"
#include "tier/redis_cluster.h"

namespace kvctl::tier {
namespace {

using std::chrono::milliseconds;
using testing::ConnectOrDie;
using testing::kTierBasePort;
using testing::SeedsFor;
using testing::UniquePrefix;

std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST_CASE("RedisCluster: set, get, exists and del over 600 keys reach every master") {
  auto cluster = ConnectOrDie(SeedsFor(kTierBasePort));
  REQUIRE(cluster->Masters().size() == 3);
  const std::string prefix = UniquePrefix("many");
  std::vector<std::string> keys;
  std::set<std::string> masters_hit;
  for (int i = 0; i < 600; ++i) {
    keys.push_back(prefix + std::to_string(i));
    auto master = cluster->MasterOf(KeySlot(keys.back()));
    REQUIRE(master);
    masters_hit.insert(master->ToString());
  }
  CHECK(masters_hit.size() == 3);
  for (size_t i = 0; i < keys.size(); i += 2) {
    REQUIRE(cluster->Set(keys[i], Bytes("value-" + keys[i]), milliseconds(0)).ok());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    auto value = cluster->Get(keys[i]);
    REQUIRE(value.ok());
    if (i % 2 == 0) {
      REQUIRE(value->has_value());
      const std::string expected = "value-" + keys[i];
      CHECK(std::string(value->value().begin(), value->value().end()) == expected);
    } else {
      CHECK_FALSE(value->has_value());
    }
  }
  auto exists = cluster->Exists(keys);
  REQUIRE(exists.ok());
  for (size_t i = 0; i < keys.size(); ++i) CHECK((*exists)[i] == (i % 2 == 0));

  REQUIRE(cluster->Del(keys).ok());
  exists = cluster->Exists(keys);
  REQUIRE(exists.ok());
  for (size_t i = 0; i < keys.size(); ++i) CHECK_FALSE((*exists)[i]);
  const ClusterCounters counters = cluster->counters();
  CHECK(counters.moved == 0);
  CHECK(counters.errors == 0);
  CHECK(counters.slot_refreshes == 1);
  CHECK(counters.bytes_written > 0);
  CHECK(counters.bytes_read > 0);
}

TEST_CASE("KeySlot agrees with the server's CLUSTER KEYSLOT") {
  std::vector<std::string> keys = {"",
                                   "{",
                                   "}",
                                   "{}",
                                   "{}{a}",
                                   "a{b}c",
                                   "{user1000}.following",
                                   "foo{}{bar}",
                                   "foo{{bar}}zap",
                                   std::string("\0{\xff}", 4)};
  for (int i = 0; i < 200; ++i) keys.push_back("key:" + std::to_string(i * 7919));
  for (const std::string& key : keys) {
    INFO(QuoteKey(key));
    CHECK(testing::Admin(kTierBasePort, {"CLUSTER", "KEYSLOT", key}) ==
          std::to_string(KeySlot(key)));
  }
}

TEST_CASE("RedisCluster: binary values with zero bytes, empty values and binary keys") {
  auto cluster = ConnectOrDie(SeedsFor(kTierBasePort));
  const std::string prefix = UniquePrefix("binary");
  const std::vector<uint8_t> zeros(4096, 0);
  std::vector<uint8_t> mixed = Pattern(100000, 3);
  mixed[0] = 0;
  mixed[50000] = 0;
  mixed.back() = 0;
  const std::string binary_key = prefix + std::string("k\0\r\n\xff", 5);
  for (const auto& value : {zeros, mixed, std::vector<uint8_t>{}}) {
    REQUIRE(cluster->Set(binary_key, value, milliseconds(0)).ok());
    auto back = cluster->Get(binary_key);
    REQUIRE(back.ok());
    REQUIRE(back->has_value());
    CHECK(back->value() == value);
  }
  REQUIRE(cluster->Del(std::vector<std::string>{binary_key}).ok());
}

TEST_CASE("RedisCluster: a TTL is set in milliseconds, 0 means none") {
  auto cluster = ConnectOrDie(SeedsFor(kTierBasePort));
  const std::string prefix = UniquePrefix("ttl");
  REQUIRE(cluster->Set(prefix + "a", Bytes("x"), milliseconds(600000)).ok());
  REQUIRE(cluster->Set(prefix + "b", Bytes("x"), milliseconds(0)).ok());
  const std::string a = prefix + "a", b = prefix + "b";
  const std::vector<ClusterCommand> pttl = {{KeySlot(a), {"PTTL", a}}, {KeySlot(b), {"PTTL", b}}};
  auto replies = cluster->Execute(pttl);
  REQUIRE(replies.ok());
  REQUIRE((*replies)[0].is_integer());
  CHECK((*replies)[0].integer() > 0);
  CHECK((*replies)[0].integer() <= 600000);
  CHECK((*replies)[1].integer() == -1);
  CHECK(cluster->Set(a, Bytes("x"), milliseconds(-1)).code() == StatusCode::kInvalidArgument);
  REQUIRE(cluster->Del(std::vector<std::string>{a, b}).ok());
}

TEST_CASE("RedisCluster: an unexpected error reply is INTERNAL with its text") {
  auto cluster = ConnectOrDie(SeedsFor(kTierBasePort));
  const std::string key = UniquePrefix("wrongtype") + "list";
  const std::vector<ClusterCommand> push = {{KeySlot(key), {"RPUSH", key, "x"}}};
  REQUIRE(cluster->Execute(push).ok());
  auto got = cluster->Get(key);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == StatusCode::kInternal);
  CHECK(got.status().message().find("WRONGTYPE") != std::string::npos);
  CHECK(got.status().message().find("127.0.0.1:") != std::string::npos);
  // The connection stays usable after an error reply.
  REQUIRE(cluster->Del(std::vector<std::string>{key}).ok());
  CHECK(cluster->counters().errors == 1);
}

TEST_CASE("RedisCluster: a dead first seed is skipped, all seeds dead is UNAVAILABLE naming each") {
  // kTierBasePort + 9 is inside this test group's range and never started.
  const std::string dead = "127.0.0.1:" + std::to_string(kTierBasePort + 9);
  std::vector<std::string> seeds = {dead};
  for (const std::string& live : SeedsFor(kTierBasePort)) seeds.push_back(live);
  auto cluster = ConnectOrDie(seeds);
  CHECK(cluster->Masters().size() == 3);
  const std::string key = UniquePrefix("seed") + "k";
  REQUIRE(cluster->Set(key, Bytes("v"), milliseconds(0)).ok());
  REQUIRE(cluster->Del(std::vector<std::string>{key}).ok());

  ClusterOptions options;
  options.seeds = {dead, "127.0.0.1:" + std::to_string(kTierBasePort + 8)};
  auto refused = RedisCluster::Connect(options);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kUnavailable);
  for (const std::string& seed : options.seeds) {
    CHECK(refused.status().message().find(seed) != std::string::npos);
  }

  options.seeds = {};
  CHECK(RedisCluster::Connect(options).status().code() == StatusCode::kInvalidArgument);
  options.seeds = {"nonsense"};
  CHECK(RedisCluster::Connect(options).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("BlobStore: 0 bytes, chunk boundaries and several MiB round-trip, chunks spread") {
  auto cluster = ConnectOrDie(SeedsFor(kTierBasePort));
  const size_t chunk = 64 * 1024;
  BlobStore blobs(cluster.get(), chunk);
  const std::string prefix = UniquePrefix("blob");
  const std::vector<size_t> sizes = {0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk, 5 << 20};
  for (size_t size : sizes) {
    INFO("size " << size);
    const std::string name = prefix + std::to_string(size);
    const std::vector<uint8_t> value = Pattern(size, static_cast<uint32_t>(size));
    REQUIRE(blobs.Put(name, value, milliseconds(600000)).ok());
    auto back = blobs.Get(name);
    INFO(back.status().ToString());
    REQUIRE(back.ok());
    CHECK(*back == value);
    auto keys = blobs.ChunkKeys(name);
    REQUIRE(keys.ok());
    // Up to one chunk is stored inside the manifest.
    CHECK(keys->size() == (size <= chunk ? 0 : (size + chunk - 1) / chunk));
  }
  // 5 MiB in 64 KiB chunks: 80 chunks over every master.
  auto keys = blobs.ChunkKeys(prefix + std::to_string(5 << 20));
  REQUIRE(keys.ok());
  std::set<std::string> masters;
  for (const std::string& key : *keys) masters.insert(cluster->MasterOf(KeySlot(key))->ToString());
  CHECK(masters.size() == 3);

  std::vector<std::string> names;
  for (size_t size : sizes) names.push_back(prefix + std::to_string(size));
  names.push_back(prefix + "absent");
  auto exists = blobs.Exists(names);
  REQUIRE(exists.ok());
  for (size_t i = 0; i < sizes.size(); ++i) CHECK((*exists)[i]);
  CHECK_FALSE(exists->back());
  for (size_t size : sizes) REQUIRE(blobs.Del(prefix + std::to_string(size)).ok());
  auto chunks_left = cluster->Exists(*keys);
  REQUIRE(chunks_left.ok());
  for (bool e : *chunks_left) CHECK_FALSE(e);
  auto names_left = blobs.Exists(names);
  REQUIRE(names_left.ok());
  for (bool e : *names_left) CHECK_FALSE(e);
  CHECK(blobs.Del(prefix + "absent").ok());
}

TEST_CASE("BlobStore: a missing manifest is NOT_FOUND naming the value") {
  auto cluster = ConnectOrDie(SeedsFor(kTierBasePort));
  BlobStore blobs(cluster.get());
  const std::string name = UniquePrefix("missing") + "nothing";
  auto got = blobs.Get(name);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == StatusCode::kNotFound);
  CHECK(got.status().message().find(name) != std::string::npos);
}

TEST_CASE("BlobStore: a chunk deleted, overwritten or cut behind its back is DATA_LOSS naming it") {
  auto cluster = ConnectOrDie(SeedsFor(kTierBasePort));
  BlobStore blobs(cluster.get(), 1000);
  const std::string prefix = UniquePrefix("damage");
  const std::vector<uint8_t> value = Pattern(4500, 9);

  struct Damage {
    const char* what;
    uint32_t chunk;
    const char* expect;
  };
  for (const Damage& damage :
       {Damage{"deleted", 2, "is missing"}, Damage{"overwritten", 1, "fails its checksum"},
        Damage{"cut", 4, "has 10 bytes, expected 500"},
        Damage{"swapped", 0, "fails its checksum"}}) {
    INFO(damage.what);
    const std::string name = prefix + damage.what;
    REQUIRE(blobs.Put(name, value, milliseconds(0)).ok());
    auto keys = blobs.ChunkKeys(name);
    REQUIRE(keys.ok());
    REQUIRE(keys->size() == 5);
    const std::string& key = (*keys)[damage.chunk];
    if (std::string(damage.what) == "deleted") {
      REQUIRE(cluster->Del(std::vector<std::string>{key}).ok());
    } else if (std::string(damage.what) == "overwritten") {
      std::vector<uint8_t> other = value;
      other[1500] ^= 1;  // Chunk 1, same length, one bit.
      REQUIRE(cluster->Set(key, std::span(other).subspan(1000, 1000), milliseconds(0)).ok());
    } else if (std::string(damage.what) == "cut") {
      REQUIRE(cluster->Set(key, std::span(value).subspan(4000, 10), milliseconds(0)).ok());
    } else {
      // Chunk 1's bytes (valid for chunk 1) stored as chunk 0.
      auto chunk1 = cluster->Get((*keys)[1]);
      REQUIRE(chunk1.ok());
      REQUIRE(cluster->Set(key, **chunk1, milliseconds(0)).ok());
    }
    auto got = blobs.Get(name);
    REQUIRE_FALSE(got.ok());
    CHECK(got.status().code() == StatusCode::kDataLoss);
    CHECK(got.status().message().find(name) != std::string::npos);
    CHECK(got.status().message().find("chunk " + std::to_string(damage.chunk) + " of 5") !=
          std::string::npos);
    CHECK(got.status().message().find(key) != std::string::npos);
    CHECK(got.status().message().find(damage.expect) != std::string::npos);
    REQUIRE(blobs.Del(name).ok());
  }
}

TEST_CASE("BlobStore: a damaged or foreign manifest is refused by name") {
  auto cluster = ConnectOrDie(SeedsFor(kTierBasePort));
  BlobStore blobs(cluster.get(), 1000);
  const std::string name = UniquePrefix("manifest") + "m";
  REQUIRE(blobs.Put(name, Pattern(2500, 1), milliseconds(0)).ok());
  auto stored = cluster->Get(name);
  REQUIRE(stored.ok());
  std::vector<uint8_t> manifest = **stored;
  auto keys = blobs.ChunkKeys(name);
  REQUIRE(keys.ok());

  std::vector<uint8_t> flipped = manifest;
  flipped[10] ^= 1;
  REQUIRE(cluster->Set(name, flipped, milliseconds(0)).ok());
  CHECK(blobs.Get(name).status().code() == StatusCode::kDataLoss);
  std::vector<uint8_t> future = manifest;
  future[4] = 2;
  REQUIRE(cluster->Set(name, future, milliseconds(0)).ok());
  auto refused = blobs.Get(name);
  CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
  CHECK(refused.status().message().find("version 2") != std::string::npos);
  REQUIRE(cluster->Set(name, Bytes("not a manifest"), milliseconds(0)).ok());
  CHECK(blobs.Get(name).status().code() == StatusCode::kDataLoss);
  REQUIRE(cluster->Del(std::vector<std::string>{name}).ok());
  REQUIRE(cluster->Del(*keys).ok());
}

TEST_CASE("BlobStore: an overwrite swaps the value and removes the old chunks") {
  auto cluster = ConnectOrDie(SeedsFor(kTierBasePort));
  BlobStore blobs(cluster.get(), 1000);
  const std::string name = UniquePrefix("overwrite") + "v";
  auto no_chunk_left = [&cluster](const std::vector<std::string>& keys) {
    auto exist = cluster->Exists(keys);
    REQUIRE(exist.ok());
    for (bool e : *exist) CHECK_FALSE(e);
  };
  REQUIRE(blobs.Put(name, Pattern(5000, 1), milliseconds(0)).ok());
  auto first_keys = blobs.ChunkKeys(name);
  REQUIRE(first_keys.ok());
  REQUIRE(first_keys->size() == 5);

  const std::vector<uint8_t> second = Pattern(1500, 2);
  REQUIRE(blobs.Put(name, second, milliseconds(600000)).ok());
  auto back = blobs.Get(name);
  REQUIRE(back.ok());
  CHECK(*back == second);
  no_chunk_left(*first_keys);
  // Chunks outlive the manifest by the slack.
  auto second_keys = blobs.ChunkKeys(name);
  REQUIRE(second_keys.ok());
  REQUIRE(second_keys->size() == 2);
  const std::vector<ClusterCommand> pttl = {
      {KeySlot(name), {"PTTL", name}}, {KeySlot((*second_keys)[0]), {"PTTL", (*second_keys)[0]}}};
  auto ttls = cluster->Execute(pttl);
  REQUIRE(ttls.ok());
  CHECK((*ttls)[1].integer() > (*ttls)[0].integer());
  CHECK((*ttls)[1].integer() <= 600000 + BlobStore::kChunkTtlSlack.count());

  // Chunked -> inline: the chunks go; inline -> chunked: nothing to clean.
  const std::vector<uint8_t> third = Pattern(700, 3);
  REQUIRE(blobs.Put(name, third, milliseconds(0)).ok());
  CHECK(blobs.Get(name).value() == third);
  CHECK(blobs.ChunkKeys(name).value().empty());
  no_chunk_left(*second_keys);
  const std::vector<uint8_t> fourth = Pattern(3000, 4);
  REQUIRE(blobs.Put(name, fourth, milliseconds(0)).ok());
  CHECK(blobs.Get(name).value() == fourth);
  auto fourth_keys = blobs.ChunkKeys(name);
  REQUIRE(fourth_keys.ok());
  CHECK(fourth_keys->size() == 3);
  REQUIRE(blobs.Del(name).ok());
  no_chunk_left(*fourth_keys);
  CHECK(blobs.Get(name).status().code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvctl::tier
