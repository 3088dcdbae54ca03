// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// Integration tests of [budget] mode = "evict-only": the real daemon process, driven by the C++
// client, evicts during APPEND and reports it.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "common/half.h"
#include "kernels/quant_types.h"
#include "policies/ratequant.h"
#include "policies/ratequant_fit.h"
#include "tests/controller/sequence/evict_test_util.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/pool_window.h"

namespace kvctl {
namespace {

using testing::DaemonProcess;

std::span<const std::byte> Bytes(const std::vector<uint16_t>& x) {
  return {reinterpret_cast<const std::byte*>(x.data()), x.size() * 2};
}

// Random fp16 [layers, n, heads, d].
std::vector<uint16_t> Random(std::mt19937_64& rng, int layers, int n, int heads, int d) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> out(static_cast<size_t>(layers) * n * heads * d);
  for (uint16_t& x : out) x = FloatToHalf(normal(rng));
  return out;
}

std::vector<int64_t> Positions(const zmq::message_t& frame) {
  std::vector<int64_t> out(frame.size() / 8);
  std::memcpy(out.data(), frame.data(), frame.size());
  return out;
}

// KIVI without quantizer sinks (set explicitly): the protected prefix is evict.sinks' 4 tokens.
constexpr const char* kEvictConfig =
    "bytes = \"64MiB\"\npage_bytes = \"16KiB\"\n"
    "[quant]\nmethod = \"kivi\"\nsink_tokens = 0\nflush_tokens = 32\n"
    "[budget]\nmode = \"evict-only\"\ntokens_per_head = 64\nrealloc_period = 32\n"
    "[evict]\npolicy = \"snapkv\"\ncompression_period = 1\n";

TEST_CASE("Daemon evict: snapkv budgets hold over APPEND, dense, blocks and STATS agree",
          "[integration][evict]") {
  DaemonProcess daemon(kEvictConfig);
  auto client = daemon.Connect();
  const int layers = 2, heads = 2, q_heads = 4, d = 32;
  auto hello =
      client->Hello({.client_name = "ev", .geometry = {layers, heads, q_heads, d, DType::kF16}});
  REQUIRE(hello.ok());
  const uint64_t sid = hello->session_id;
  REQUIRE(client->Open(sid, 1).ok());
  const testing::PoolMap pool(hello->shm_name, hello->pool_bytes);
  std::mt19937_64 rng(3);
  // SnapKV's observation window is 32, so the protected window is 32; sinks 4; floor 40.
  const int window = 32, sinks = 4, floor = 40, layer_budget = heads * 64;
  int64_t t = 0;
  bool unequal_heads = false;
  std::optional<ipc::FetchBlocksReply> held;  // The table of the previous step.
  int held_pairs = 0, relisted_pairs = 0;     // Pairs with records answered from it, or whole.
  for (int n : std::vector<int>{100, 1, 1, 1, 5, 1, 1, 40, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    const auto k = Random(rng, layers, n, heads, d), v = Random(rng, layers, n, heads, d);
    const auto q = Random(rng, layers, n, q_heads, d);
    auto r = client->AppendInline({sid, 1, static_cast<uint64_t>(t), static_cast<uint32_t>(n)},
                                  Bytes(k), Bytes(v), Bytes(q));
    REQUIRE(r.ok());
    t += n;
    CHECK(r->tokens_total == static_cast<uint64_t>(t));  // Positions continue; kept may be less.
    auto dense = client->FetchDense(sid, 1, 0, layers);
    REQUIRE(dense.ok());
    auto blocks = client->FetchBlocks(sid, 1, 0, layers);
    REQUIRE(blocks.ok());
    // With the previous step's table the daemon lists only what is new, or a pair whole where
    // eviction changed its records; merged, it is the whole table either way.
    if (held) {
      auto since = client->FetchBlocksSince(sid, 1, 0, layers, *held);
      REQUIRE(since.ok());
      for (size_t i = 0; i < since->record_base.size(); ++i) {
        if (held->indptr[i + 1] == held->indptr[i]) continue;  // Nothing held to reuse.
        (since->record_base[i] > 0 ? held_pairs : relisted_pairs) += 1;
      }
      auto merged = ipc::MergeBlocksReply(*held, *std::move(since));
      REQUIRE(merged.ok());
      CHECK(merged->indptr == blocks->indptr);
      CHECK(merged->indices == blocks->indices);
      CHECK(merged->side_indices == blocks->side_indices);
      CHECK(merged->table_tags == blocks->table_tags);
      CHECK(merged->window_ids == blocks->window_ids);
      CHECK(merged->last_page_len == blocks->last_page_len);
    }
    held = *blocks;
    // The window rows in the pool are the dense rows at their (evicted, non-contiguous)
    // positions.
    auto dense32 = client->FetchDense(sid, 1, 0, layers, DType::kF32);
    REQUIRE(dense32.ok());
    testing::CheckWindowsMatchDense(pool, *blocks, *dense32);
    const std::vector<int64_t> pos = Positions(dense->positions);
    size_t at = 0;
    for (int l = 0; l < layers; ++l) {
      uint32_t layer_sum = 0;
      for (int h = 0; h < heads; ++h) {
        const int pair = l * heads + h;
        const uint32_t count = dense->counts[pair];
        INFO("token " << t << " layer " << l << " head " << h);
        layer_sum += count;
        CHECK(count <= static_cast<uint32_t>(layer_budget - floor));
        CHECK(count >= std::min<uint32_t>(static_cast<uint32_t>(t), floor));
        unequal_heads |= count != dense->counts[l * heads];
        // Sinks and the window are there, in order, at their true positions.
        const std::vector<int64_t> p(pos.begin() + at, pos.begin() + at + count);
        CHECK(std::is_sorted(p.begin(), p.end()));
        for (int i = 0; i < std::min<int64_t>(sinks, t); ++i) CHECK(p[i] == i);
        for (int i = 0; i < std::min<int64_t>(window, t); ++i) CHECK(p[count - 1 - i] == t - 1 - i);
        at += count;
        // Blocks: records of block_tokens kept tokens plus the fp16 rows give the same count.
        const uint32_t records = blocks->indptr[pair + 1] - blocks->indptr[pair];
        CHECK(records * blocks->block_tokens + blocks->window_indptr[pair + 1] -
                  blocks->window_indptr[pair] ==
              count);
      }
      CHECK(layer_sum <= static_cast<uint32_t>(layer_budget));
    }
  }
  CHECK(unequal_heads);  // Head re-allocation moved budget between heads.
  INFO("pairs answered from the held table " << held_pairs << ", listed whole " << relisted_pairs);
  // Steps reused the held ids (in this run no held record moved: every pair holding records was
  // answered from them); the merge equals the whole table above either way.
  CHECK(held_pairs > 0);
  auto stats = client->Stats(sid);
  REQUIRE(stats.ok());
  INFO(*stats);
  CHECK(stats->find("budget_mode:evict-only") != std::string::npos);
  CHECK(stats->find("evict_policy:snapkv") != std::string::npos);
  CHECK(stats->find("seq_1_1:client=ev,tokens=" + std::to_string(t)) != std::string::npos);
  CHECK(stats->find(",evictions=0,") == std::string::npos);
  CHECK(stats->find("layer_0:") != std::string::npos);
  CHECK(stats->find("budget_tokens=128,evictions=") != std::string::npos);
  CHECK(stats->find("retained_mass=") != std::string::npos);
  // An APPEND without Q is refused and stores nothing.
  const auto k = Random(rng, layers, 1, heads, d), v = Random(rng, layers, 1, heads, d);
  auto no_q = client->AppendInline({sid, 1, static_cast<uint64_t>(t), 1}, Bytes(k), Bytes(v));
  CHECK(no_q.status().code() == StatusCode::kInvalidArgument);
  CHECK(no_q.status().message().find("q: missing") != std::string::npos);
  auto after = client->FetchDense(sid, 1, 0, layers);
  REQUIRE(after.ok());
  CHECK(Positions(after->positions).back() == t - 1);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("Daemon evict: a Q policy needs q_heads, SIGHUP switches new sequences to streaming",
          "[integration][evict]") {
  DaemonProcess daemon(kEvictConfig);
  auto client = daemon.Connect();
  const int layers = 1, heads = 2, d = 32;
  auto hello = client->Hello({.client_name = "nq", .geometry = {layers, heads, 0, d, DType::kF16}});
  REQUIRE(hello.ok());
  const uint64_t sid = hello->session_id;
  const Status open = client->Open(sid, 1).status();
  CHECK(open.code() == StatusCode::kInvalidArgument);
  CHECK(open.message().find("q_heads: got 0") != std::string::npos);
  // Switch to StreamingLLM (no Q) and no re-allocation; a new sequence opens and evicts FIFO.
  {
    std::ifstream in(daemon.config_path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("policy = \"snapkv\""), 17, "policy = \"streaming\"");
    text.replace(text.find("realloc_period = 32"), 19, "realloc_period = 0");
    std::ofstream(daemon.config_path()) << text;
  }
  daemon.Signal(SIGHUP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE(client->Open(sid, 2).ok());
  std::mt19937_64 rng(5);
  const auto k = Random(rng, layers, 200, heads, d), v = Random(rng, layers, 200, heads, d);
  REQUIRE(client->AppendInline({sid, 2, 0, 200}, Bytes(k), Bytes(v)).ok());
  auto dense = client->FetchDense(sid, 2, 0, layers);
  REQUIRE(dense.ok());
  const std::vector<int64_t> pos = Positions(dense->positions);
  REQUIRE(dense->counts == std::vector<uint32_t>{64, 64});
  // Sinks 0..3, then the 60 newest.
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < 64; ++i) CHECK(pos[h * 64 + i] == (i < 4 ? i : 200 - 64 + i));
  }
  CHECK(daemon.Stop() == 0);
}

}  // namespace
}  // namespace kvctl

namespace kvctl {
namespace {

TEST_CASE("Daemon evict: joint mode caps every head from the planned byte budget",
          "[integration][evict]") {
  // A KIVI fit for 1 layer x 2 heads x head_dim 32: head 1's error is 100x head 0's.
  const RateQuantFit fit = testing::TwoHeadFit(*MakeQuantSpec(QuantMethod::kKivi, 32, 2, 2), 1);
  const std::string profile = "/tmp/kvctl-it-joint-" + std::to_string(getpid()) + ".toml";
  std::ofstream(profile) << FormatRateQuantProfile(fit);
  DaemonProcess daemon(
      "bytes = \"64MiB\"\npage_bytes = \"16KiB\"\n[quant]\nmethod = \"kivi\"\nsink_tokens = "
      "0\nflush_tokens = 32\n[budget]\nmode = \"joint\"\nfp16_fraction = 0.15\nplan_tokens = "
      "256\nprofile = \"" +
      profile + "\"\n");
  auto client = daemon.Connect();
  auto hello = client->Hello({.client_name = "j", .geometry = {1, 2, 0, 32, DType::kF16}});
  REQUIRE(hello.ok());
  const uint64_t sid = hello->session_id;
  REQUIRE(client->Open(sid, 1).ok());
  std::mt19937_64 rng(9);
  for (int t = 0; t < 320; t += 32) {
    const auto k = Random(rng, 1, 32, 2, 32), v = Random(rng, 1, 32, 2, 32);
    REQUIRE(client->AppendInline({sid, 1, static_cast<uint64_t>(t), 32}, Bytes(k), Bytes(v)).ok());
  }
  auto dense = client->FetchDense(sid, 1, 0, 1);
  REQUIRE(dense.ok());
  auto stats = client->Stats(sid, "heads");
  REQUIRE(stats.ok());
  INFO(*stats);
  // Each head holds at most its cap (STATS budget_tokens), and the caps keep less than all.
  uint32_t kept = 0;
  for (int h = 0; h < 2; ++h) {
    const std::string key = "head_0_" + std::to_string(h) + ":";
    const size_t at = stats->find(key);
    REQUIRE(at != std::string::npos);
    const size_t b = stats->find("budget_tokens=", at);
    REQUIRE(b != std::string::npos);
    const int64_t cap = std::stoll(stats->substr(b + 14));
    CHECK(cap > 0);
    CHECK(dense->counts[h] <= cap);
    kept += dense->counts[h];
  }
  CHECK(kept < 2 * 320);
  auto policy = client->Stats(sid, "policy");
  REQUIRE(policy.ok());
  CHECK(policy->find("budget_mode:joint") != std::string::npos);
  CHECK(daemon.Stop() == 0);
  std::remove(profile.c_str());
}

}  // namespace
}  // namespace kvctl

namespace kvctl {
namespace {

TEST_CASE("Daemon evict: a prefill in APPEND_CONTINUES pieces keeps what one APPEND keeps",
          "[integration][evict]") {
  DaemonProcess daemon(kEvictConfig);  // KIVI layers, snapkv, head re-allocation every 32.
  auto client = daemon.Connect();
  const int layers = 2, heads = 2, q_heads = 4, d = 32, n = 150;
  auto hello =
      client->Hello({.client_name = "ev", .geometry = {layers, heads, q_heads, d, DType::kF16}});
  REQUIRE(hello.ok());
  const uint64_t sid = hello->session_id;
  REQUIRE(client->Open(sid, 1).ok());
  REQUIRE(client->Open(sid, 2).ok());
  std::mt19937_64 rng(9);
  const auto k = Random(rng, layers, n, heads, d), v = Random(rng, layers, n, heads, d);
  const auto q = Random(rng, layers, n, q_heads, d);
  REQUIRE(client->AppendInline({sid, 1, 0, n}, Bytes(k), Bytes(v), Bytes(q)).ok());
  // The same tokens in three pieces ([layers, piece, heads, d] each), the first two flagged.
  int first = 0;
  for (int piece : {60, 50, 40}) {
    auto cut = [&](const std::vector<uint16_t>& x, int h) {
      std::vector<uint16_t> out;
      for (int l = 0; l < layers; ++l) {
        const auto begin = x.begin() + (static_cast<ptrdiff_t>(l) * n + first) * h * d;
        out.insert(out.end(), begin, begin + static_cast<ptrdiff_t>(piece) * h * d);
      }
      return out;
    };
    const bool last = first + piece == n;
    auto r = client->AppendInline(
        {sid, 2, static_cast<uint64_t>(first), static_cast<uint32_t>(piece), /*continues=*/!last},
        Bytes(cut(k, heads)), Bytes(cut(v, heads)), Bytes(cut(q, q_heads)));
    REQUIRE(r.ok());
    first += piece;
    if (!last) {
      // Nothing evicted or quantized yet: every pair holds every token so far.
      CHECK(r->tokens_quantized == 0);
      auto mid = client->FetchDense(sid, 2, 0, layers);
      REQUIRE(mid.ok());
      for (uint32_t count : mid->counts) CHECK(count == static_cast<uint32_t>(first));
    }
  }
  auto one = client->FetchDense(sid, 1, 0, layers, DType::kF32);
  auto parts = client->FetchDense(sid, 2, 0, layers, DType::kF32);
  REQUIRE((one.ok() && parts.ok()));
  CHECK(one->counts == parts->counts);
  CHECK(Positions(one->positions) == Positions(parts->positions));
  REQUIRE(one->k.size() == parts->k.size());
  CHECK(std::memcmp(one->k.data(), parts->k.data(), one->k.size()) == 0);
  CHECK(std::memcmp(one->v.data(), parts->v.data(), one->v.size()) == 0);
  for (uint32_t count : one->counts) CHECK(count < static_cast<uint32_t>(n));  // It evicted.
  auto stats = client->Stats(sid, "sequences");
  REQUIRE(stats.ok());
  INFO(*stats);
  CHECK(stats->find("deferred_tokens=0,deferred_appends=2,deferral_cap_hits=0") !=
        std::string::npos);
  CHECK(stats->find("appends_deferred_total:2\n") != std::string::npos);
  CHECK(daemon.Stop() == 0);
}

}  // namespace
}  // namespace kvctl
