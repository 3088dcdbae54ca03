// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// The local prefix cache end to end (docs/tier.md "Shared prefix pages"): a real daemon without a
// cluster tier keeps a saved prefix frozen in its pool, and the sequences opened from it read its
// records in place (blocks FETCH names the same record ids) while each goes on with its own
// tokens; closing the saver or the readers loses nothing; a full pool drops unread prefixes
// before anything else; an opener that evicts gets its own copy.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "tests/integration/daemon_process.h"
#include "tests/integration/prefix_test_util.h"

namespace kvctl {
namespace {

using testing::DaemonProcess;
using namespace prefix_test;  // NOLINT: the shared helpers of these tests.

constexpr char kPool[] = "bytes = \"64MiB\"\npage_bytes = \"16KiB\"\n";

std::string LocalToml(const std::string& extra = "") {
  // append(): see tests/tier/tier_test_util.cc on g++ 12's false -Warray-bounds.
  return std::string(kPool).append("[tier]\nprefix_block_tokens = 16\n").append(extra);
}

// Record ids of (layer 0..n, head) pairs of a blocks FETCH, per pair.
std::vector<std::vector<uint32_t>> RecordIds(const ipc::FetchBlocksReply& b) {
  std::vector<std::vector<uint32_t>> out;
  for (size_t p = 0; p + 1 < b.indptr.size(); ++p) {
    out.emplace_back(b.indices.begin() + b.indptr[p], b.indices.begin() + b.indptr[p + 1]);
  }
  return out;
}

void ExpectRowsEqual(const Rows& want, const Rows& got, int64_t tokens) {
  REQUIRE(want.k.size() == got.k.size());
  for (size_t p = 0; p < want.k.size(); ++p) {
    INFO("pair " << p);
    REQUIRE(got.k[p].size() == static_cast<size_t>(tokens) * kDim);
    CHECK(std::memcmp(got.k[p].data(), want.k[p].data(), got.k[p].size() * 4) == 0);
    CHECK(std::memcmp(got.v[p].data(), want.v[p].data(), got.v[p].size() * 4) == 0);
  }
}

TEST_CASE("Prefix cache: sequences opened from a saved prefix share its pages in one daemon",
          "[integration][prefix]") {
  DaemonProcess node(LocalToml());
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  const int64_t total = 600;
  const auto k = MakeFp16(total, 3, false), v = MakeFp16(total, 3, true);
  REQUIRE(c->Open(sid, 1).ok());
  REQUIRE(Append(*c, sid, 1, k, v, total, 0, 300).ok());
  const std::vector<int32_t> ids = Ids(300);
  auto saved = c->SavePrefix(sid, 1, ids);
  REQUIRE(saved.ok());
  CHECK(saved->saved_tokens == 288);  // KVarN: 32 sinks + 2 flushes of 128, the tail trimmed.
  auto original = c->FetchDense(sid, 1, 0, kLayers, DType::kF32);
  REQUIRE(original.ok());
  const Rows want = FirstRows(*original, 288);
  const uint64_t frozen = StatsField(*c, "sequences", "kv_prefix_frozen_bytes");
  CHECK(frozen > 0);
  // The saver now reads its prefix from the frozen copy too (its own copy went back).
  CHECK(StatsField(*c, "sequences", "kv_shared_bytes") > 0);
  CHECK(StatsField(*c, "prefix", "prefix_cache_held_bytes") == frozen);
  // The saver goes; the prefix stays.
  REQUIRE(c->Close(sid, 1).ok());

  std::vector<int32_t> prompt = ids;
  for (int i = 0; i < 40; ++i) prompt.push_back(9 + i);
  const uint64_t used_before = StatsField(*c, "pool", "bytes_used");
  for (uint64_t seq : {2, 3, 4}) {
    auto opened = c->OpenPrefix(sid, seq, prompt);
    REQUIRE(opened.ok());
    CHECK(opened->restored_tokens == 288);
  }
  // Three readers of the prefix hold pages for their fp16 tails only, not three copies of it.
  const uint64_t grown = StatsField(*c, "pool", "bytes_used") - used_before;
  CHECK(grown < frozen);
  CHECK(StatsField(*c, "sequences", "kv_shared_bytes") > 0);
  CHECK(StatsField(*c, "prefix", "prefix_cache_hits_total") == 3);
  CHECK(StatsField(*c, "prefix", "prefix_cache_read_entries") == 1);
  auto b2 = c->FetchBlocks(sid, 2, 0, kLayers);
  auto b3 = c->FetchBlocks(sid, 3, 0, kLayers);
  REQUIRE(b2.ok());
  REQUIRE(b3.ok());
  CHECK(RecordIds(*b2) == RecordIds(*b3));  // The same records, read in place.
  for (uint64_t seq : {2, 3}) {
    auto f = c->FetchDense(sid, seq, 0, kLayers, DType::kF32);
    REQUIRE(f.ok());
    ExpectRowsEqual(want, FirstRows(*f, 288), 288);
  }
  // Each goes on with its own tokens: 2 with the original's, 3 with others; 2 then holds what a
  // sequence given all 600 tokens holds, 3 never changes what 2 reads.
  const auto k3 = MakeFp16(total, 8, false), v3 = MakeFp16(total, 8, true);
  REQUIRE(Append(*c, sid, 2, k, v, total, 288, 200).ok());
  REQUIRE(Append(*c, sid, 3, k3, v3, total, 288, 312).ok());
  for (int64_t t = 488; t < total; ++t) REQUIRE(Append(*c, sid, 2, k, v, total, t, 1).ok());
  REQUIRE(c->Open(sid, 5).ok());
  REQUIRE(Append(*c, sid, 5, k, v, total, 0, 288).ok());
  REQUIRE(Append(*c, sid, 5, k, v, total, 288, 200).ok());
  for (int64_t t = 488; t < total; ++t) REQUIRE(Append(*c, sid, 5, k, v, total, t, 1).ok());
  auto f2 = c->FetchDense(sid, 2, 0, kLayers, DType::kF32);
  auto f5 = c->FetchDense(sid, 5, 0, kLayers, DType::kF32);
  REQUIRE(f2.ok());
  REQUIRE(f5.ok());
  ExpectRowsEqual(FirstRows(*f5, total), FirstRows(*f2, total), total);
  // Readers close in any order; the last one gives the prefix's pages back once the cache no
  // longer holds it (here: it still does).
  REQUIRE(c->Close(sid, 2).ok());
  REQUIRE(c->Close(sid, 3).ok());
  auto f4 = c->FetchDense(sid, 4, 0, kLayers, DType::kF32);
  REQUIRE(f4.ok());
  ExpectRowsEqual(want, FirstRows(*f4, 288), 288);
  CHECK(node.Stop() == 0);
}

TEST_CASE("Prefix cache: saving a prompt it holds again copies nothing, the saver shares it",
          "[integration][prefix]") {
  DaemonProcess node(LocalToml());
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  const int64_t total = 300;
  const auto k = MakeFp16(total, 6, false), v = MakeFp16(total, 6, true);
  for (uint64_t seq : {1, 2}) {
    REQUIRE(c->Open(sid, seq).ok());
    REQUIRE(Append(*c, sid, seq, k, v, total, 0, total).ok());
  }
  REQUIRE(c->SavePrefix(sid, 1, Ids(total)).ok());
  const uint64_t frozen = StatsField(*c, "sequences", "kv_prefix_frozen_bytes");
  const uint64_t shared_one = StatsField(*c, "sequences", "kv_shared_bytes");
  auto again = c->SavePrefix(sid, 2, Ids(total));
  REQUIRE(again.ok());
  CHECK(again->saved_tokens == 288);
  CHECK(StatsField(*c, "prefix", "prefix_cache_inserts_total") == 1);
  CHECK(StatsField(*c, "sequences", "kv_prefix_frozen_bytes") == frozen);
  CHECK(StatsField(*c, "sequences", "kv_shared_bytes") == 2 * shared_one);
  auto f1 = c->FetchDense(sid, 1, 0, kLayers, DType::kF32);
  auto f2 = c->FetchDense(sid, 2, 0, kLayers, DType::kF32);
  REQUIRE(f1.ok());
  REQUIRE(f2.ok());
  ExpectRowsEqual(FirstRows(*f1, total), FirstRows(*f2, total), total);
  CHECK(node.Stop() == 0);
}

TEST_CASE("Prefix cache: a full pool drops unread prefixes before touching any sequence",
          "[integration][prefix]") {
  // 2 MiB of 16 KiB pages (128), lossless rows of 1 KiB per token: a 512-token prefix takes 32
  // pages, and a 1600-token sequence 100 more: both do not fit, and lossless widths cannot be
  // lowered, so only dropping the prefix makes room.
  DaemonProcess node(
      "bytes = \"2MiB\"\npage_bytes = \"16KiB\"\nstaging_slots = 0\n[quant]\nmethod = \"fp16\"\n"
      "[tier]\nprefix_block_tokens = 16\nlocal_prefix_fraction = 1.0\n");
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  const int64_t total = 1600;
  const auto k = MakeFp16(total, 4, false), v = MakeFp16(total, 4, true);
  REQUIRE(c->Open(sid, 1).ok());
  REQUIRE(Append(*c, sid, 1, k, v, total, 0, 512).ok());
  auto saved = c->SavePrefix(sid, 1, Ids(512));
  REQUIRE(saved.ok());
  CHECK(saved->saved_tokens == 512);
  REQUIRE(c->Close(sid, 1).ok());
  CHECK(StatsField(*c, "prefix", "prefix_cache_entries") == 1);
  REQUIRE(c->Open(sid, 2).ok());
  for (int64_t t = 0; t < total; t += 320) REQUIRE(Append(*c, sid, 2, k, v, total, t, 320).ok());
  CHECK(StatsField(*c, "prefix", "prefix_cache_entries") == 0);
  CHECK(StatsField(*c, "prefix", "prefix_cache_shed_pages_total") >= 32);
  CHECK(StatsField(*c, "sequences", "kv_prefix_frozen_bytes") == 0);
  CHECK(node.Stop() == 0);
}

TEST_CASE("Prefix cache: an opener that evicts gets its own copy of the prefix",
          "[integration][prefix]") {
  DaemonProcess node(LocalToml() +
                     "[evict]\npolicy = \"streaming\"\nsinks = 4\nwindow = 16\n"
                     "[budget]\nmode = \"evict-only\"\ntokens_per_head = 4096\n");
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  const int64_t total = 300;
  const auto k = MakeFp16(total, 5, false), v = MakeFp16(total, 5, true);
  REQUIRE(c->Open(sid, 1).ok());
  REQUIRE(Append(*c, sid, 1, k, v, total, 0, total).ok());
  auto saved = c->SavePrefix(sid, 1, Ids(total));
  REQUIRE(saved.ok());
  REQUIRE(saved->saved_tokens > 0);
  auto opened = c->OpenPrefix(sid, 2, Ids(total));
  REQUIRE(opened.ok());
  CHECK(opened->restored_tokens == saved->saved_tokens);
  CHECK(StatsField(*c, "sequences", "kv_shared_bytes") == 0);
  auto f1 = c->FetchDense(sid, 1, 0, kLayers, DType::kF32);
  auto f2 = c->FetchDense(sid, 2, 0, kLayers, DType::kF32);
  REQUIRE(f1.ok());
  REQUIRE(f2.ok());
  const auto n = static_cast<int64_t>(saved->saved_tokens);
  ExpectRowsEqual(FirstRows(*f1, n), FirstRows(*f2, n), n);
  CHECK(node.Stop() == 0);
}

}  // namespace
}  // namespace kvctl
