// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// A client as an attacker on the same host (issue #17): crafted staging offsets and wrapped
// lengths, guessing other sessions' ids, exhausting host memory, sessions and STATS. Each case
// drives a real Controller over a real shm pool and checks the named error AND that the daemon
// state still serves correct data afterwards.
#include <malloc.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/half.h"
#include "controller/service/controller.h"
#include "tests/controller/service/service_test_util.h"

namespace kvctl {
namespace {

using Clock = std::chrono::steady_clock;

Config TestConfig(const std::string& tag) {
  Config c;
  c.pool.shm_name = "/kvctl-hostile-" + std::to_string(getpid()) + "-" + tag;
  c.pool.bytes = 64ull << 20;
  c.pool.page_bytes = 16 << 10;
  c.pool.staging_slots = 2;
  c.pool.staging_bytes_per_session = 1 << 20;
  c.pool.unlink_stale = true;
  c.quant.method = QuantMethod::kKivi;
  c.quant.k_bits = 4;
  c.quant.v_bits = 4;
  c.server.stats_endpoint = "";
  return c;
}

std::unique_ptr<Controller> Make(const Config& c) { return testing::MakeController(c); }

ipc::HelloRequest Hello(uint32_t layers, uint32_t heads, uint32_t head_dim) {
  ipc::HelloRequest h;
  h.client_name = "attacker";
  h.geometry = {layers, heads, 0, head_dim, DType::kF16};
  return h;
}

std::vector<uint16_t> Rows(size_t n, float scale) {
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(scale * static_cast<float>(i % 97) / 97.f);
  return out;
}

ipc::AppendRequest Inline(uint64_t session, uint64_t seq, uint64_t first, uint32_t n,
                          const std::vector<uint16_t>& k, const std::vector<uint16_t>& v) {
  ipc::AppendRequest a{
      .session_id = session, .sequence_id = seq, .first_position = first, .n_tokens = n};
  a.k = zmq::message_t(k.data(), k.size() * 2);
  a.v = zmq::message_t(v.data(), v.size() * 2);
  return a;
}

bool Has(const std::string& s, const std::string& text) {
  return s.find(text) != std::string::npos;
}
bool Has(const Status& s, const std::string& text) { return Has(s.message(), text); }

TEST_CASE("Hostile: staging offsets that wrap are refused and nothing outside the slot is read",
          "[controller][hostile]") {
  Config config = TestConfig("wrap");
  config.pool.page_bytes = 64 << 10;  // A head_dim 1024 record needs more than 16 KiB.
  std::unique_ptr<Controller> c = Make(config);
  // The crash: 1 layer, 1 head, head_dim 1024, fp16; 2^20 tokens need 2^32 staged bytes.
  StatusOr<ipc::HelloReply> h = c->Hello(Hello(1, 1, 1024), Clock::now());
  INFO(h.status().ToString());
  REQUIRE(h.ok());
  REQUIRE(h->staging_bytes > 0);
  REQUIRE(c->Open({h->session_id, 1}, Clock::now()).ok());
  const std::vector<uint64_t> offsets = {
      0ull - (1ull << 32),                      // offset + 2^32 wraps to exactly 0.
      0ull - (1ull << 32) + h->staging_offset,  // ... to the slot's own start.
      0ull - 1,
      0ull - 4096,
      h->staging_offset - 1,
      h->staging_offset + h->staging_bytes};
  for (uint64_t offset : offsets) {
    for (uint32_t n : {1u << 20, 1u, 256u}) {
      ipc::AppendRequest a{.session_id = h->session_id,
                           .sequence_id = 1,
                           .first_position = 0,
                           .n_tokens = n,
                           .source = ipc::AppendSource::kStaging,
                           .staging_offset = offset};
      StatusOr<ipc::AppendReply> r = c->Append(a, Clock::now());
      INFO("offset " << offset << " n " << n << ": " << r.status().ToString());
      REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
      CHECK(Has(r.status(), "staging_offset"));
      CHECK(Has(r.status(), "expected the range to lie inside ["));
    }
  }
  // A length larger than the slot at its valid start.
  ipc::AppendRequest too_long{.session_id = h->session_id,
                              .sequence_id = 1,
                              .first_position = 0,
                              .n_tokens = 1u << 20,
                              .source = ipc::AppendSource::kStaging,
                              .staging_offset = h->staging_offset};
  CHECK(c->Append(too_long, Clock::now()).status().code() == StatusCode::kInvalidArgument);
  // The sequence is untouched and a valid staged append still works.
  ipc::AppendRequest ok{.session_id = h->session_id,
                        .sequence_id = 1,
                        .first_position = 0,
                        .n_tokens = 4,
                        .source = ipc::AppendSource::kStaging,
                        .staging_offset = h->staging_offset};
  StatusOr<ipc::AppendReply> r = c->Append(ok, Clock::now());
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->tokens_total == 4);
}

// The inverse of std::mt19937_64's tempering, so that 312 outputs give its whole state.
uint64_t UndoShiftRightXor(uint64_t y, int shift, uint64_t mask) {
  uint64_t x = y;
  for (int i = 0; i < 64 / shift + 1; ++i) x = y ^ ((x >> shift) & mask);
  return x;
}
uint64_t UndoShiftLeftXor(uint64_t y, int shift, uint64_t mask) {
  uint64_t x = y;
  for (int i = 0; i < 64 / shift + 1; ++i) x = y ^ ((x << shift) & mask);
  return x;
}
uint64_t Untemper(uint64_t y) {
  y = UndoShiftRightXor(y, 43, ~0ull);
  y = UndoShiftLeftXor(y, 37, 0xFFF7EEE000000000ull);
  y = UndoShiftLeftXor(y, 17, 0x71D67FFFEDA60000ull);
  return UndoShiftRightXor(y, 29, 0x5555555555555555ull);
}
// Predicts the outputs after `seen` (>= 312 consecutive outputs of an mt19937_64).
std::vector<uint64_t> PredictMt(const std::vector<uint64_t>& seen, int next) {
  std::ostringstream state;
  for (size_t i = seen.size() - 312; i < seen.size(); ++i) state << Untemper(seen[i]) << ' ';
  state << 312;  // libstdc++ writes the state words, then the index.
  std::mt19937_64 clone;
  std::istringstream in(state.str());
  in >> clone;
  std::vector<uint64_t> out;
  for (int i = 0; i < next; ++i) out.push_back(clone());
  return out;
}

TEST_CASE("Hostile: 400 session ids tell nothing about the next ones", "[controller][hostile]") {
  // The attack works on the generator the daemon used to have...
  std::mt19937_64 old_rng(12345);
  std::vector<uint64_t> old_ids;
  for (int i = 0; i < 400; ++i) old_ids.push_back(old_rng());
  const std::vector<uint64_t> predicted_old = PredictMt(old_ids, 5);
  for (int i = 0; i < 5; ++i) REQUIRE(predicted_old[i] == old_rng());

  // ... and finds nothing in the ids the daemon hands out now.
  Config config = TestConfig("ids");
  config.pool.staging_slots = 0;
  std::unique_ptr<Controller> c = Make(config);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 405; ++i) {
    StatusOr<ipc::HelloReply> h = c->Hello(Hello(1, 1, 64), Clock::now());
    REQUIRE(h.ok());
    ids.push_back(h->session_id);
  }
  const std::vector<uint64_t> seen(ids.begin(), ids.begin() + 400);
  const std::vector<uint64_t> predicted = PredictMt(seen, 5);
  int hits = 0;
  for (int i = 0; i < 5; ++i) hits += predicted[i] == ids[400 + i];
  CHECK(hits == 0);
  CHECK(std::set<uint64_t>(ids.begin(), ids.end()).size() == ids.size());
  // Every bit is set in about half the ids (8 standard deviations of slack: 120..280 of 400).
  for (int bit = 0; bit < 64; ++bit) {
    int set = 0;
    for (size_t i = 0; i < 400; ++i) set += (ids[i] >> bit) & 1;
    INFO("bit " << bit);
    CHECK(set > 120);
    CHECK(set < 280);
  }
}

TEST_CASE("Hostile: sessions, sequences and host memory are bounded before allocation",
          "[controller][hostile]") {
  Config config = TestConfig("limits");
  config.limits.max_sessions = 3;
  config.limits.max_sequences_per_session = 2;
  std::unique_ptr<Controller> c = Make(config);
  std::vector<uint64_t> sessions;
  for (int i = 0; i < 3; ++i)
    sessions.push_back(c->Hello(Hello(2, 2, 64), Clock::now())->session_id);
  StatusOr<ipc::HelloReply> fourth = c->Hello(Hello(2, 2, 64), Clock::now());
  CHECK(fourth.status().code() == StatusCode::kResourceExhausted);
  CHECK(Has(fourth.status(), "limits.max_sessions"));
  REQUIRE(c->Open({sessions[0], 1}, Clock::now()).ok());
  REQUIRE(c->Open({sessions[0], 2}, Clock::now()).ok());
  Status third = c->Open({sessions[0], 3}, Clock::now());
  CHECK(third.code() == StatusCode::kResourceExhausted);
  CHECK(Has(third, "limits.max_sequences_per_session"));
  REQUIRE(c->Close({sessions[0], 2}, Clock::now()).ok());
  CHECK(c->Open({sessions[0], 3}, Clock::now()).ok());

  // A geometry whose streams cannot each get a page is refused at HELLO, before any planning:
  // 1024 x 1024 streams against 4096 pages of 16 KiB.
  StatusOr<ipc::HelloReply> huge =
      Make(TestConfig("huge"))->Hello(Hello(1024, 1024, 1024), Clock::now());
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
  CHECK(Has(huge.status(), "1048576 streams"));
}

TEST_CASE("Hostile: the host-memory budget refuses OPEN and APPEND and is given back",
          "[controller][hostile]") {
  Config config = TestConfig("host");
  const HostShape shape{.layers = 8, .kv_heads = 4, .head_dim = 64};
  const uint64_t open_bytes = Controller::SequenceHostBytesAtOpen(shape);
  // Room for the session and three empty sequences, and little else.
  config.limits.host_memory_bytes = 3 * open_bytes + 4096;
  std::unique_ptr<Controller> c = Make(config);
  StatusOr<ipc::HelloReply> h = c->Hello(Hello(8, 4, 64), Clock::now());
  REQUIRE(h.ok());
  for (uint64_t s = 1; s <= 3; ++s) REQUIRE(c->Open({h->session_id, s}, Clock::now()).ok());
  Status fourth = c->Open({h->session_id, 4}, Clock::now());
  CHECK(fourth.code() == StatusCode::kResourceExhausted);
  CHECK(Has(fourth, "limits.host_memory_bytes"));
  // Tokens cost host memory too: 16 tokens x 32 streams x 40 bytes = 20 KiB does not fit.
  const size_t n = 16 * 4 * 64 * 8;
  const std::vector<uint16_t> k = Rows(n, 1.f), v = Rows(n, -1.f);
  StatusOr<ipc::AppendReply> big = c->Append(Inline(h->session_id, 1, 0, 16, k, v), Clock::now());
  CHECK(big.status().code() == StatusCode::kResourceExhausted);
  CHECK(Has(big.status(), "APPEND: needs 20480 bytes of host memory"));
  // Closing gives the memory back, after which the same APPEND fits.
  REQUIRE(c->Close({h->session_id, 2}, Clock::now()).ok());
  REQUIRE(c->Close({h->session_id, 3}, Clock::now()).ok());
  StatusOr<ipc::AppendReply> fits = c->Append(Inline(h->session_id, 1, 0, 16, k, v), Clock::now());
  INFO(fits.status().ToString());
  REQUIRE(fits.ok());
  CHECK(fits->tokens_total == 16);
  StatusOr<std::string> stats = c->Stats({}, Clock::now());
  REQUIRE(stats.ok());
  CHECK(Has(*stats, "host_memory_limit_bytes:" + std::to_string(3 * open_bytes + 4096)));
}

TEST_CASE("Hostile: the OPEN estimate covers what an OPEN really allocates",
          "[controller][hostile]") {
  std::unique_ptr<Controller> c = Make(TestConfig("estimate"));
  StatusOr<ipc::HelloReply> h = c->Hello(Hello(32, 8, 128), Clock::now());
  REQUIRE(h.ok());
  REQUIRE(c->Open({h->session_id, 1}, Clock::now()).ok());  // Warm up allocator caches.
  const size_t before = mallinfo2().uordblks;
  REQUIRE(c->Open({h->session_id, 2}, Clock::now()).ok());
  const size_t after = mallinfo2().uordblks;
  const uint64_t estimate =
      Controller::SequenceHostBytesAtOpen({.layers = 32, .kv_heads = 8, .head_dim = 128});
  const uint64_t measured = after > before ? after - before : 0;
  WARN("OPEN 32x8x128: measured " << measured << " bytes on the heap, estimated " << estimate);
  CHECK(estimate >= measured);
  CHECK(estimate <= 4 * measured + 65536);
}

TEST_CASE("Hostile: STATS of an 80-layer x 64-head sequence stays one bounded reply",
          "[controller][hostile]") {
  Config config = TestConfig("stats");
  config.pool.bytes = 256ull << 20;
  config.pool.page_bytes = 16 << 10;
  std::unique_ptr<Controller> c = Make(config);
  StatusOr<ipc::HelloReply> h = c->Hello(Hello(80, 64, 64), Clock::now());
  INFO(h.status().ToString());
  REQUIRE(h.ok());
  REQUIRE(c->Open({h->session_id, 1}, Clock::now()).ok());
  const size_t n = 80 * 64 * 64 * 2;
  const std::vector<uint16_t> k = Rows(n, 1.f), v = Rows(n, 2.f);
  REQUIRE(c->Append(Inline(h->session_id, 1, 0, 2, k, v), Clock::now()).ok());
  StatusOr<std::string> all = c->Stats({}, Clock::now());
  INFO(all.status().ToString());
  REQUIRE(all.ok());
  CHECK(all->size() <= ipc::kMaxStatsTextBytes);
  CHECK(Has(*all, "heads:5120\nheads_omitted:4620\n"));
  CHECK(Has(*all, "\nsequences:1\n"));
  CHECK(Has(*all, "\nsequences_omitted:0\n"));
  CHECK(all->find("stats_truncated_bytes") == std::string::npos);
}

}  // namespace
}  // namespace kvctl
