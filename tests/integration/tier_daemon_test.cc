// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// The cluster tier end to end: real kvctl daemons, standing for two nodes, against the real
// 3-master Redis Cluster the CTest fixture "tier_cluster" starts (tools/redis_cluster.sh).
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/half.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/prefix_test_util.h"

namespace kvctl {
namespace {

using testing::DaemonProcess;
using namespace prefix_test;  // NOLINT: the shared helpers of these tests.

std::string Seeds(int base_port) {
  return "127.0.0.1:" + std::to_string(base_port) + ",127.0.0.1:" + std::to_string(base_port + 1);
}

// [pool] keys, then a [tier] on the shared cluster with a key prefix of this test process, so
// keys of an earlier run never answer for this one.
std::string TierToml(const std::string& extra_tier = "", int base_port = KVCTL_TIER_BASE_PORT,
                     const std::string& pool = "bytes = \"64MiB\"\npage_bytes = \"16KiB\"\n") {
  return pool + "[tier]\nnodes = \"" + Seeds(base_port) + "\"\nkey_prefix = \"it" +
         std::to_string(getpid()) + "\"\nprefix_block_tokens = 16\n" + extra_tier;
}

// Polls STATS until field reaches `want` (30 s at most: the machine may be saturated).
bool WaitForStat(ipc::Client& c, const std::string& field, uint64_t want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (StatsField(c, "tier", field) >= want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST_CASE("Tier: a prefix saved through one daemon is restored by another, row for row",
          "[integration][tier]") {
  DaemonProcess node_a(TierToml(), "", "a"), node_b(TierToml(), "", "b");
  auto a = node_a.Connect();
  auto b = node_b.Connect();
  const uint64_t sa = Hello(*a), sb = Hello(*b);
  const int64_t total = 300;
  const auto k = MakeFp16(total, 3, false), v = MakeFp16(total, 3, true);
  REQUIRE(a->Open(sa, 1).ok());
  REQUIRE(Append(*a, sa, 1, k, v, total, 0, 200).ok());
  for (int64_t t = 200; t < total; ++t) REQUIRE(Append(*a, sa, 1, k, v, total, t, 1).ok());
  const std::vector<int32_t> ids = Ids(total);

  // Wrong token count: named, nothing stored.
  auto short_save = a->SavePrefix(sa, 1, std::span(ids).first(10));
  CHECK(short_save.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(short_save.status().message(), Catch::Contains("tokens: got 10 ids, expected 300"));

  auto saved = a->SavePrefix(sa, 1, ids);
  REQUIRE(saved.ok());
  // The default quantizer (KVarN, 32 sinks, 128-token flush): records end at 288, so the longest
  // exact cut at a multiple of 16 is 288 (the fp16 tail trimmed from 300).
  CHECK(saved->saved_tokens == 288);
  CHECK(saved->stored_bytes > 0);
  auto fa = a->FetchDense(sa, 1, 0, kLayers, DType::kF32);
  REQUIRE(fa.ok());

  // Another daemon, a longer prompt with the same start: the stored 288 tokens come back.
  std::vector<int32_t> prompt = ids;
  for (int i = 0; i < 40; ++i) prompt.push_back(7 + i);
  auto opened = b->OpenPrefix(sb, 9, prompt);
  REQUIRE(opened.ok());
  REQUIRE(opened->restored_tokens == 288);
  auto fb = b->FetchDense(sb, 9, 0, kLayers, DType::kF32);
  REQUIRE(fb.ok());
  const Rows want = FirstRows(*fa, 288), got = FirstRows(*fb, 288);
  for (uint32_t c : fb->counts) CHECK(c == 288);
  for (size_t p = 0; p < want.k.size(); ++p) {
    INFO("pair " << p);
    REQUIRE(got.k[p].size() == 288u * kDim);
    CHECK(std::memcmp(got.k[p].data(), want.k[p].data(), got.k[p].size() * 4) == 0);
    CHECK(std::memcmp(got.v[p].data(), want.v[p].data(), got.v[p].size() * 4) == 0);
  }
  // The restored sequence goes on at position 288.
  auto more = Append(*b, sb, 9, k, v, total, 288, 12);
  REQUIRE(more.ok());
  CHECK(more->tokens_total == 300);
  CHECK(Append(*b, sb, 9, k, v, total, 0, 1).status().code() == StatusCode::kInvalidArgument);

  // A prompt that differs in its first block, or another model, finds nothing.
  std::vector<int32_t> other = prompt;
  other[3] += 1;
  auto miss = b->OpenPrefix(sb, 10, other);
  REQUIRE(miss.ok());
  CHECK(miss->restored_tokens == 0);
  auto c = node_b.Connect();
  const uint64_t sc = Hello(*c, "another-model");
  auto other_model = c->OpenPrefix(sc, 1, prompt);
  REQUIRE(other_model.ok());
  CHECK(other_model->restored_tokens == 0);
  CHECK(StatsField(*b, "tier", "tier_prefix_hits_total") == 1);
  CHECK(StatsField(*b, "tier", "tier_prefix_misses_total") == 2);
  CHECK(StatsField(*b, "tier", "tier_prefix_restored_tokens_total") == 288);
  CHECK(node_a.Stop() == 0);
  CHECK(node_b.Stop() == 0);
}

TEST_CASE("Tier: an idle sequence is spilled, its pages freed, and restored by its next FETCH",
          "[integration][tier]") {
  DaemonProcess node(TierToml("spill_idle_ms = 100\n"));
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  const int64_t total = 301;
  const auto k = MakeFp16(total, 5, false), v = MakeFp16(total, 5, true);
  REQUIRE(c->Open(sid, 1).ok());
  REQUIRE(Append(*c, sid, 1, k, v, total, 0, 300).ok());
  auto before = c->FetchDense(sid, 1, 0, kLayers, DType::kF32);
  REQUIRE(before.ok());
  REQUIRE(WaitForStat(*c, "tier_spills_total", 1));
  CHECK(StatsField(*c, "tier", "tier_spilled_sequences") == 1);
  CHECK(StatsField(*c, "pool", "bytes_used") == 0);  // Every page went back to the pool.
  auto after = c->FetchDense(sid, 1, 0, kLayers, DType::kF32);
  REQUIRE(after.ok());
  CHECK(after->counts == before->counts);
  CHECK(after->k.size() == before->k.size());
  CHECK(std::memcmp(after->k.data(), before->k.data(), before->k.size()) == 0);
  CHECK(std::memcmp(after->v.data(), before->v.data(), before->v.size()) == 0);
  CHECK(std::memcmp(after->positions.data(), before->positions.data(), before->positions.size()) ==
        0);
  CHECK(StatsField(*c, "tier", "tier_restores_total") >= 1);
  // It goes on where it was; it may be spilled and restored again meanwhile.
  auto more = Append(*c, sid, 1, k, v, total, 300, 1);
  REQUIRE(more.ok());
  CHECK(more->tokens_total == 301);
  CHECK(c->Close(sid, 1).ok());
  REQUIRE(WaitForStat(*c, "tier_spilled_sequences", 0));
  CHECK(node.Stop() == 0);
}

TEST_CASE("Tier: a spilled sequence the tier lost answers DATA_LOSS, never wrong rows",
          "[integration][tier]") {
  // A cluster of its own (ports base + 13..15), so wiping it disturbs no other test.
  const int base = KVCTL_TIER_BASE_PORT + 13;
  const std::string dir =
      std::string(KVCTL_TIER_CLUSTER_ROOT) + "/lost-" + std::to_string(getpid());
  const std::string script = KVCTL_TIER_CLUSTER_SCRIPT;
  REQUIRE(std::system(
              ("bash " + script + " start " + dir + " " + std::to_string(base) + " 3").c_str()) ==
          0);
  struct StopCluster {
    std::string cmd;
    ~StopCluster() { (void)!std::system(cmd.c_str()); }
  } stop{"bash " + script + " stop " + dir};
  DaemonProcess node(TierToml("spill_idle_ms = 100\n", base));
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  const auto k = MakeFp16(200, 6, false), v = MakeFp16(200, 6, true);
  REQUIRE(c->Open(sid, 1).ok());
  REQUIRE(Append(*c, sid, 1, k, v, 200, 0, 200).ok());
  REQUIRE(WaitForStat(*c, "tier_spills_total", 1));
  for (int p = base; p < base + 3; ++p) {
    REQUIRE(std::system(("redis-cli -p " + std::to_string(p) + " flushall >/dev/null").c_str()) ==
            0);
  }
  for (int i = 0; i < 2; ++i) {  // The same answer every time.
    auto lost = c->FetchDense(sid, 1, 0, kLayers, DType::kF32);
    CHECK(lost.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(lost.status().message(),
               Catch::Contains("sequence_id: 1 was spilled to the tier and the tier lost it"));
  }
  CHECK(Append(*c, sid, 1, k, v, 200, 0, 1).status().code() == StatusCode::kDataLoss);
  CHECK(StatsField(*c, "tier", "tier_spilled_lost_total") == 1);
  CHECK(c->Close(sid, 1).ok());
  // The daemon serves on: a new sequence works.
  REQUIRE(c->Open(sid, 2).ok());
  CHECK(Append(*c, sid, 2, k, v, 200, 0, 200).ok());
  CHECK(node.Stop() == 0);
}

TEST_CASE("Tier: an unreachable cluster never blocks resident sequences", "[integration][tier]") {
  // Nothing listens on base + 36..37 (no test of the tier's 50 ports starts a node there). No
  // local prefix cache, so nothing is found without the tier.
  DaemonProcess node(
      TierToml("connect_timeout_ms = 100\ntimeout_ms = 200\nlocal_prefix_fraction = 0\n",
               KVCTL_TIER_BASE_PORT + 36));
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  const auto k = MakeFp16(64, 7, false), v = MakeFp16(64, 7, true);
  REQUIRE(c->Open(sid, 1).ok());
  REQUIRE(Append(*c, sid, 1, k, v, 64, 0, 64).ok());
  auto saved = c->SavePrefix(sid, 1, Ids(64));
  CHECK(saved.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(saved.status().message(), Catch::Contains("SAVE_PREFIX: tier"));
  auto opened = c->OpenPrefix(sid, 2, Ids(64));
  REQUIRE(opened.ok());  // Opened empty: the engine prefills as without a tier.
  CHECK(opened->restored_tokens == 0);
  CHECK(Append(*c, sid, 2, k, v, 64, 0, 64).ok());
  CHECK(c->FetchDense(sid, 1, 0, kLayers, DType::kF32).ok());
  CHECK(StatsField(*c, "tier", "tier_connected") == 0);
  CHECK(StatsField(*c, "tier", "tier_prefix_lookup_failures_total") == 1);
  CHECK(node.Stop() == 0);
}

TEST_CASE(
    "Tier: with neither a tier nor a local cache SAVE_PREFIX is refused by name and OPEN_PREFIX "
    "opens empty",
    "[integration][tier]") {
  DaemonProcess node(
      "bytes = \"64MiB\"\npage_bytes = \"16KiB\"\n[tier]\nlocal_prefix_fraction = 0\n");
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  REQUIRE(c->Open(sid, 1).ok());
  auto saved = c->SavePrefix(sid, 1, Ids(16));
  CHECK(saved.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(saved.status().message(), Catch::Contains("keeps no prefixes"));
  CHECK(c->SavePrefix(sid, 7, Ids(16)).status().code() == StatusCode::kNotFound);
  auto opened = c->OpenPrefix(sid, 2, Ids(16));
  REQUIRE(opened.ok());
  CHECK(opened->restored_tokens == 0);
  CHECK(c->OpenPrefix(sid, 2, Ids(16)).status().code() == StatusCode::kAlreadyExists);
  CHECK(StatsField(*c, "tier", "tier_enabled") == 0);
  CHECK(StatsField(*c, "prefix", "prefix_cache_enabled") == 0);
  CHECK(node.Stop() == 0);
}

TEST_CASE(
    "Tier: SAVE_PREFIX past tier.prefix_quota_bytes is refused by name, a re-save counts once",
    "[integration][tier]") {
  DaemonProcess node(TierToml("prefix_quota_bytes = \"128KiB\"\n"));
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  const int64_t total = 300;
  const auto k = MakeFp16(total, 12, false), v = MakeFp16(total, 12, true);
  REQUIRE(c->Open(sid, 1).ok());
  REQUIRE(Append(*c, sid, 1, k, v, total, 0, total).ok());
  auto first = c->SavePrefix(sid, 1, Ids(total));
  REQUIRE(first.ok());
  REQUIRE(first->stored_bytes < 128u * 1024);
  REQUIRE(first->stored_bytes > 64u * 1024);      // So a second, different prefix cannot fit.
  CHECK(c->SavePrefix(sid, 1, Ids(total)).ok());  // The same key again replaces itself.
  auto second = c->SavePrefix(sid, 1, Ids(total, 7));
  CHECK(second.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(second.status().message(), Catch::Contains("tier.prefix_quota_bytes"));
  CHECK(StatsField(*c, "tier", "tier_prefix_saves_over_quota_total") == 1);
  CHECK(StatsField(*c, "tier", "tier_prefix_held_bytes") == first->stored_bytes);
  CHECK(node.Stop() == 0);
}

// A cluster of its own on ports base + offset.., stopped when the test ends.
class OwnCluster {
 public:
  OwnCluster(const std::string& name, int port, int masters, int replicas)
      : port_(port),
        dir_(std::string(KVCTL_TIER_CLUSTER_ROOT) + "/" + name + "-" + std::to_string(getpid())) {
    const std::string cmd = "bash " + std::string(KVCTL_TIER_CLUSTER_SCRIPT) + " start " + dir_ +
                            " " + std::to_string(port) + " " + std::to_string(masters) + " " +
                            std::to_string(replicas);
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("cannot start " + cmd);
  }
  ~OwnCluster() {
    const std::string cmd = "bash " + std::string(KVCTL_TIER_CLUSTER_SCRIPT) + " stop " + dir_;
    (void)!std::system(cmd.c_str());
  }
  int port() const { return port_; }
  // The pid of the node on `port` (its pid file).
  pid_t PidOf(int port) const {
    std::ifstream f(dir_ + "/node-" + std::to_string(port) + "/redis.pid");
    pid_t pid = -1;
    f >> pid;
    return pid;
  }

 private:
  int port_;
  std::string dir_;
};

TEST_CASE("Tier: a full pool spills an idle sequence for another's APPEND, then restores it",
          "[integration][tier]") {
  // 1 MiB of 4 KiB pages, rows kept losslessly (1 KiB per token over the 4 streams): two
  // sequences of 600 tokens do not fit together.
  DaemonProcess node(TierToml(
      "spill_on_pressure_idle_ms = 50\n", KVCTL_TIER_BASE_PORT,
      "bytes = \"1MiB\"\npage_bytes = \"4KiB\"\nstaging_slots = 0\n[quant]\nlossless = true\n"));
  auto c = node.Connect();
  const uint64_t sid = Hello(*c);
  const int64_t total = 600;
  const auto ka = MakeFp16(total, 8, false), va = MakeFp16(total, 8, true);
  const auto kb = MakeFp16(total, 9, false), vb = MakeFp16(total, 9, true);
  REQUIRE(c->Open(sid, 1).ok());
  REQUIRE(c->Open(sid, 2).ok());
  REQUIRE(Append(*c, sid, 1, ka, va, total, 0, total).ok());
  auto before = c->FetchDense(sid, 1, 0, kLayers, DType::kF16);
  REQUIRE(before.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // Sequence 1 is now idle.
  auto appended = Append(*c, sid, 2, kb, vb, total, 0, total);
  REQUIRE(appended.ok());
  CHECK(StatsField(*c, "tier", "tier_spills_total") == 1);
  // Sequence 1 cannot come back while sequence 2 holds the pages: named, and nothing is lost.
  auto blocked = c->FetchDense(sid, 1, 0, kLayers, DType::kF16);
  CHECK(blocked.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(blocked.status().message(),
             Catch::Contains("is spilled to the tier and the pool lacks the pages to restore it"));
  REQUIRE(c->Close(sid, 2).ok());
  auto after = c->FetchDense(sid, 1, 0, kLayers, DType::kF16);
  REQUIRE(after.ok());
  CHECK(after->counts == before->counts);
  CHECK(std::memcmp(after->k.data(), before->k.data(), before->k.size()) == 0);
  CHECK(std::memcmp(after->v.data(), before->v.data(), before->v.size()) == 0);
  CHECK(node.Stop() == 0);
}

TEST_CASE("Tier: a master killed after a save fails over to its replica, the prefix comes back",
          "[integration][tier]") {
  // 3 masters + 3 replicas of its own (ports base + 23..28); a failover takes about twice
  // cluster-node-timeout (2 s).
  OwnCluster cluster("failover", KVCTL_TIER_BASE_PORT + 23, 3, 1);
  const std::string toml = TierToml("timeout_ms = 500\n", cluster.port());
  DaemonProcess node_a(toml, "", "a"), node_b(toml, "", "b");
  auto a = node_a.Connect();
  auto b = node_b.Connect();
  const uint64_t sa = Hello(*a), sb = Hello(*b);
  const int64_t total = 300;
  const auto k = MakeFp16(total, 11, false), v = MakeFp16(total, 11, true);
  REQUIRE(a->Open(sa, 1).ok());
  REQUIRE(Append(*a, sa, 1, k, v, total, 0, total).ok());
  auto saved = a->SavePrefix(sa, 1, Ids(total));
  REQUIRE(saved.ok());
  REQUIRE(saved->saved_tokens == 288);
  auto fa = a->FetchDense(sa, 1, 0, kLayers, DType::kF32);
  REQUIRE(fa.ok());

  const pid_t victim = cluster.PidOf(cluster.port());  // The first master.
  REQUIRE(victim > 0);
  REQUIRE(::kill(victim, SIGKILL) == 0);
  // Until the replica takes over, lookups fail and open empty (never wrong rows); then the
  // prefix is found again. The resident sequence on node A is served throughout.
  uint64_t restored = 0;
  uint64_t seq = 100;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (restored == 0 && std::chrono::steady_clock::now() < deadline) {
    CHECK(a->FetchDense(sa, 1, 0, kLayers, DType::kF32).ok());
    auto opened = b->OpenPrefix(sb, ++seq, Ids(total));
    REQUIRE(opened.ok());
    restored = opened->restored_tokens;
    if (restored == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  REQUIRE(restored == 288);
  auto fb = b->FetchDense(sb, seq, 0, kLayers, DType::kF32);
  REQUIRE(fb.ok());
  const Rows want = FirstRows(*fa, 288), got = FirstRows(*fb, 288);
  for (size_t p = 0; p < want.k.size(); ++p) {
    CHECK(std::memcmp(got.k[p].data(), want.k[p].data(), got.k[p].size() * 4) == 0);
    CHECK(std::memcmp(got.v[p].data(), want.v[p].data(), got.v[p].size() * 4) == 0);
  }
  CHECK(node_a.Stop() == 0);
  CHECK(node_b.Stop() == 0);
}

}  // namespace
}  // namespace kvctl
