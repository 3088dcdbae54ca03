// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Controller::Append and Fetch with `deferred` (what the daemon's I/O thread calls for small
// APPENDs, blocks FETCHes and small dense FETCHes): a light request is done exactly as a worker
// would do it, anything else is handed back with nothing changed.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/half.h"
#include "controller/service/controller.h"
#include "controller/service/dispatch.h"
#include "ipc/protocol.h"
#include "tests/controller/service/service_test_util.h"

namespace kvctl {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 64;

Config LightConfig(const std::string& tag, uint64_t pool_bytes) {
  Config c;
  c.pool.shm_name = "/kvctl-light-" + std::to_string(getpid()) + "-" + tag;
  c.pool.bytes = pool_bytes;
  c.pool.page_bytes = 16 << 10;
  c.pool.staging_slots = 0;
  c.quant.method = QuantMethod::kKivi;  // No sinks, a flush every 128 tokens.
  c.server.stats_endpoint = "";
  return c;
}

std::unique_ptr<Controller> Make(const Config& c) { return testing::MakeController(c); }

// One decode step of fp16 rows that differ per position.
ipc::AppendRequest Step(uint64_t session, uint64_t sequence, uint64_t position, uint32_t n) {
  std::vector<uint16_t> rows(size_t{kLayers} * n * kHeads * kDim);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = FloatToHalf(static_cast<float>((i * 7 + position * 13) % 101) / 101.f - 0.5f);
  }
  ipc::AppendRequest a{.session_id = session, .sequence_id = sequence, .n_tokens = n};
  a.first_position = position;
  a.k = zmq::message_t(rows.data(), rows.size() * 2);
  a.v = zmq::message_t(rows.data(), rows.size() * 2);
  return a;
}

std::string DenseBytes(Controller& c, uint64_t session, uint64_t sequence) {
  StatusOr<ipc::ReplyBody> fetched =
      c.Fetch({session, sequence, 0, kLayers, ipc::FetchMode::kDense, DType::kF16}, Clock::now());
  REQUIRE(fetched.ok());
  const auto& dense = std::get<ipc::FetchDenseReply>(*fetched);
  return std::string(static_cast<const char*>(dense.k.data()), dense.k.size()) +
         std::string(static_cast<const char*>(dense.v.data()), dense.v.size());
}

uint64_t OpenOne(Controller& c, uint64_t sequence) {
  ipc::HelloRequest hello{.client_name = "light",
                          .geometry = {kLayers, kHeads, 0, kDim, DType::kF16}};
  StatusOr<ipc::HelloReply> h = c.Hello(hello, Clock::now());
  REQUIRE(h.ok());
  REQUIRE(c.Open({h->session_id, sequence}, Clock::now()).ok());
  return h->session_id;
}

TEST_CASE("Light appends: done when they only store rows, handed back when they flush",
          "[controller][light]") {
  std::unique_ptr<Controller> inline_c = Make(LightConfig("inline", 16 << 20));
  std::unique_ptr<Controller> worker_c = Make(LightConfig("worker", 16 << 20));
  const uint64_t s_inline = OpenOne(*inline_c, 1);
  const uint64_t s_worker = OpenOne(*worker_c, 1);
  int done = 0, handed_back = 0;
  for (uint64_t pos = 0; pos < 300;) {
    const uint32_t n = pos % 3 == 0 ? 1 : 4;
    bool deferred = false;
    StatusOr<ipc::AppendReply> light =
        inline_c->Append(Step(s_inline, 1, pos, n), Clock::now(), &deferred);
    if (deferred) {
      ++handed_back;
      // Nothing changed: the same request then succeeds on the worker path.
      StatusOr<ipc::AppendReply> heavy = inline_c->Append(Step(s_inline, 1, pos, n), Clock::now());
      REQUIRE(heavy.ok());
      CHECK(heavy->tokens_quantized > 0);  // It flushed: that is why it was handed back.
    } else {
      REQUIRE(light.ok());
      ++done;
      CHECK(light->tokens_total == pos + n);
    }
    REQUIRE(worker_c->Append(Step(s_worker, 1, pos, n), Clock::now()).ok());
    pos += n;
  }
  CHECK(handed_back == 2);  // The flushes at 128 and 256 tokens.
  CHECK(done > 90);         // About 100 appends of 1 or 4 tokens.
  // Both paths stored the same bytes.
  CHECK(DenseBytes(*inline_c, s_inline, 1) == DenseBytes(*worker_c, s_worker, 1));
  // An error is an answer, not a hand-back.
  bool deferred = false;
  StatusOr<ipc::AppendReply> wrong =
      inline_c->Append(Step(s_inline, 1, 5, 1), Clock::now(), &deferred);
  CHECK_FALSE(deferred);
  CHECK(wrong.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Light appends: quant.flush_spread_steps spreads the flush over two handed-back steps",
          "[controller][light]") {
  // Two quantized layers, spread over 2 steps: the step whose tails reach 128 (after KIVI's 16
  // sinks) flushes layer 0 only, so its dense rows differ from the unspread controller's in layer
  // 1, still fp16; the next step flushes layer 1. Both steps are handed back (they flush), and
  // then the two agree again.
  Config spread_config = LightConfig("spread", 16 << 20);
  spread_config.quant.flush_spread_steps = 2;
  std::unique_ptr<Controller> spread = Make(spread_config);
  std::unique_ptr<Controller> once = Make(LightConfig("once", 16 << 20));
  const uint64_t s_spread = OpenOne(*spread, 1);
  const uint64_t s_once = OpenOne(*once, 1);
  std::vector<uint64_t> handed_back;
  std::vector<uint64_t> differ;
  for (uint64_t pos = 0; pos < 200; ++pos) {
    bool deferred = false;
    StatusOr<ipc::AppendReply> light =
        spread->Append(Step(s_spread, 1, pos, 1), Clock::now(), &deferred);
    if (deferred) {
      handed_back.push_back(pos);
      REQUIRE(spread->Append(Step(s_spread, 1, pos, 1), Clock::now()).ok());
    } else {
      REQUIRE(light.ok());
    }
    REQUIRE(once->Append(Step(s_once, 1, pos, 1), Clock::now()).ok());
    if (DenseBytes(*spread, s_spread, 1) != DenseBytes(*once, s_once, 1)) differ.push_back(pos);
  }
  CHECK(handed_back == std::vector<uint64_t>{143, 144});  // 16 sinks + 128 tail rows.
  CHECK(differ == std::vector<uint64_t>{143});
}

uint64_t StatsValue(Controller& c, const std::string& section, const std::string& key) {
  StatusOr<std::string> text = c.Stats({0, section}, Clock::now());
  REQUIRE(text.ok());
  const size_t at = text->find("\n" + key + ":");
  REQUIRE(at != std::string::npos);
  return std::stoull(text->substr(at + key.size() + 2));
}

TEST_CASE("Light appends: quant.flush_after_reply answers the flush step and queues the flush",
          "[controller][light]") {
  // Every decode step is done on the I/O thread path. The flush each 128th step would have done
  // is queued; RunHeldFlushes (the daemon: on a worker after the reply) encodes it without
  // changing what FETCH returns, and the next step writes it. Only the held step's bytes differ
  // from the controller that flushes on the step.
  Config held_config = LightConfig("held", 16 << 20);
  held_config.quant.flush_after_reply = true;
  std::unique_ptr<Controller> held = Make(held_config);
  held->EnableHeldFlushQueue();
  std::unique_ptr<Controller> once = Make(LightConfig("held-ref", 16 << 20));
  const uint64_t s_held = OpenOne(*held, 1);
  const uint64_t s_once = OpenOne(*once, 1);
  std::vector<uint64_t> queued, differ;
  for (uint64_t pos = 0; pos < 300; ++pos) {
    bool deferred = false;
    StatusOr<ipc::AppendReply> light =
        held->Append(Step(s_held, 1, pos, 1), Clock::now(), &deferred);
    REQUIRE_FALSE(deferred);
    REQUIRE(light.ok());
    REQUIRE(once->Append(Step(s_once, 1, pos, 1), Clock::now()).ok());
    const std::string bytes = DenseBytes(*held, s_held, 1);
    if (held->HeldFlushesQueued()) {
      queued.push_back(pos);
      CHECK(held->RunHeldFlushes() == kLayers);  // One pass per layer.
      CHECK_FALSE(held->HeldFlushesQueued());
      CHECK(DenseBytes(*held, s_held, 1) == bytes);  // Nothing a reader sees changed.
    }
    if (bytes != DenseBytes(*once, s_once, 1)) differ.push_back(pos);
  }
  CHECK(queued == std::vector<uint64_t>{143, 271});  // 16 sinks + 128 and + 256 tail rows.
  CHECK(differ == queued);
  CHECK(StatsValue(*held, "sequences", "held_flush_layers_total") == 2 * kLayers);
  CHECK(StatsValue(*held, "sequences", "tokens_quantized") ==
        StatsValue(*once, "sequences", "tokens_quantized"));
}

TEST_CASE("Light appends: held flushes without the queue, and of a closed sequence",
          "[controller][light]") {
  Config held_config = LightConfig("held-noq", 16 << 20);
  held_config.quant.flush_after_reply = true;
  std::unique_ptr<Controller> c = Make(held_config);
  const uint64_t session = OpenOne(*c, 1);
  // No queue (no daemon): the step 16 rows past the flush is handed back and flushes itself.
  std::vector<uint64_t> handed_back;
  for (uint64_t pos = 0; pos < 170; ++pos) {
    bool deferred = false;
    StatusOr<ipc::AppendReply> light = c->Append(Step(session, 1, pos, 1), Clock::now(), &deferred);
    if (deferred) {
      handed_back.push_back(pos);
      StatusOr<ipc::AppendReply> heavy = c->Append(Step(session, 1, pos, 1), Clock::now());
      REQUIRE(heavy.ok());
      CHECK(heavy->tokens_quantized == 128);
    } else {
      REQUIRE(light.ok());
    }
    CHECK_FALSE(c->HeldFlushesQueued());
  }
  CHECK(handed_back == std::vector<uint64_t>{159});  // 16 sinks + 128 + 16 rows.
  // Queued, then closed before the flush ran: nothing to do, nothing breaks.
  c->EnableHeldFlushQueue();
  REQUIRE(c->Open({session, 2}, Clock::now()).ok());
  for (uint64_t pos = 0; pos < 144; ++pos) {
    REQUIRE(c->Append(Step(session, 2, pos, 1), Clock::now()).ok());
  }
  REQUIRE(c->HeldFlushesQueued());
  REQUIRE(c->Close({session, 2}, Clock::now()).ok());
  CHECK(c->RunHeldFlushes() == 0);
  CHECK_FALSE(c->HeldFlushesQueued());
}

TEST_CASE("Light appends: a full pool hands the append back unchanged", "[controller][light]") {
  std::unique_ptr<Controller> c = Make(LightConfig("full", 1 << 20));
  const uint64_t filler = OpenOne(*c, 1);
  const uint64_t session = OpenOne(*c, 2);
  // Fill the pool with the first sequence's tokens.
  uint64_t pos = 0;
  for (;; pos += 64) {
    StatusOr<ipc::AppendReply> a = c->Append(Step(filler, 1, pos, 64), Clock::now());
    if (!a.ok()) {
      REQUIRE(a.status().code() == StatusCode::kResourceExhausted);
      break;
    }
  }
  // Take what is left one token at a time, then the next light append needs a page.
  uint64_t taken = 0;
  for (;; ++taken) {
    bool deferred = false;
    StatusOr<ipc::AppendReply> a = c->Append(Step(session, 2, taken, 1), Clock::now(), &deferred);
    if (deferred) break;
    REQUIRE(a.ok());
    REQUIRE(taken < 127);  // A flush would hand back first; the pool must run out before.
  }
  const std::string before = taken > 0 ? DenseBytes(*c, session, 2) : "";
  const PoolStats pool = c->pool_stats();
  StatusOr<ipc::AppendReply> worker = c->Append(Step(session, 2, taken, 1), Clock::now());
  CHECK(worker.status().code() == StatusCode::kResourceExhausted);
  CHECK(c->pool_stats().pages_used == pool.pages_used);
  if (taken > 0) CHECK(DenseBytes(*c, session, 2) == before);
}

uint64_t VerifiedBytes(Controller& c) {
  StatusOr<std::string> text = c.Stats({0, "pool"}, Clock::now());
  REQUIRE(text.ok());
  const std::string key = "\nverified_bytes_total:";
  const size_t at = text->find(key);
  REQUIRE(at != std::string::npos);
  return std::stoull(text->substr(at + key.size()));
}

// Blocks FETCH on the I/O thread: the same page table as a worker's, and only when what is left
// to verify is at most Controller::kInlineFetchVerifyBytes.
void CheckSameTable(Controller& c, const ipc::FetchRequest& blocks,
                    StatusOr<ipc::ReplyBody> light) {
  REQUIRE(light.ok());
  StatusOr<ipc::ReplyBody> worker = c.Fetch(blocks, Clock::now());
  REQUIRE(worker.ok());
  StatusOr<ipc::Frames> a = ipc::Encode(1, std::move(light).value());
  StatusOr<ipc::Frames> b = ipc::Encode(1, std::move(worker).value());
  REQUIRE((a.ok() && b.ok()));
  REQUIRE(a->size() == b->size());
  for (size_t i = 0; i < a->size(); ++i) CHECK((*a)[i] == (*b)[i]);
}

TEST_CASE("Light fetches: a blocks FETCH with little left to verify, nothing else",
          "[controller][light]") {
  // 2048 tokens: about 160 KiB of rows and records per sequence, more than the inline budget.
  constexpr uint32_t kLong = 2048;
  for (int mode = 0; mode < 3; ++mode) {
    const bool checksums = mode != 0;
    const bool all = mode == 2;
    INFO("checksums " << checksums << ", verify_on_fetch " << (all ? "all" : "unverified"));
    Config config = LightConfig("fetch-" + std::to_string(mode), 32 << 20);
    config.pool.checksums = checksums;
    config.pool.verify_on_fetch = all ? VerifyOnFetch::kAll : VerifyOnFetch::kUnverified;
    std::unique_ptr<Controller> c = Make(config);
    const uint64_t session = OpenOne(*c, 1);
    REQUIRE(c->Append(Step(session, 1, 0, kLong), Clock::now()).ok());  // Flushes: records.
    const ipc::FetchRequest blocks{session, 1, 0, kLayers, ipc::FetchMode::kBlocks, DType::kF16};
    bool deferred = false;
    uint64_t before = VerifiedBytes(*c);
    StatusOr<ipc::ReplyBody> light = c->Fetch(blocks, Clock::now(), &deferred);
    // Unverified chunks beyond the budget: a worker's job, and nothing was verified meanwhile.
    CHECK(deferred == checksums);
    CHECK(VerifiedBytes(*c) == before);
    if (!checksums) {
      CheckSameTable(*c, blocks, std::move(light));
    } else {
      REQUIRE(c->Fetch(blocks, Clock::now()).ok());  // The worker verifies it all.
      CHECK(VerifiedBytes(*c) - before > Controller::kInlineFetchVerifyBytes);
      // Verified and unchanged since: a page-table walk again, unless every FETCH verifies all.
      deferred = false;
      light = c->Fetch(blocks, Clock::now(), &deferred);
      CHECK(deferred == all);
      if (!all) CheckSameTable(*c, blocks, std::move(light));
      // A decode step leaves a few chunks to verify: still on the I/O thread.
      REQUIRE(c->Append(Step(session, 1, kLong, 1), Clock::now()).ok());
      before = VerifiedBytes(*c);
      deferred = false;
      light = c->Fetch(blocks, Clock::now(), &deferred);
      CHECK(deferred == all);
      if (!all) {
        REQUIRE(light.ok());
        CHECK(VerifiedBytes(*c) > before);
        CHECK(VerifiedBytes(*c) - before <= Controller::kInlineFetchVerifyBytes);
      }
    }
    deferred = false;
    const ipc::FetchRequest dense{session, 1, 0, kLayers, ipc::FetchMode::kDense, DType::kF16};
    (void)c->Fetch(dense, Clock::now(), &deferred);
    CHECK(deferred);  // Decoding grows with the sequence: none inline without max_dense_rows.
  }
}

// A controller with sequence 1 of one session holding `tokens` tokens from one APPEND.
struct OneSequence {
  std::unique_ptr<Controller> c;
  uint64_t session = 0;
};
OneSequence WithTokens(const Config& config, uint32_t tokens) {
  OneSequence one{Make(config)};
  one.session = OpenOne(*one.c, 1);
  REQUIRE(one.c->Append(Step(one.session, 1, 0, tokens), Clock::now()).ok());
  return one;
}

// The frames of a dense reply as bytes: counts, positions, K and V.
std::string DenseReplyBytes(StatusOr<ipc::ReplyBody> reply) {
  REQUIRE(reply.ok());
  const auto& dense = std::get<ipc::FetchDenseReply>(*reply);
  std::string bytes(reinterpret_cast<const char*>(dense.counts.data()), dense.counts.size() * 4);
  for (const zmq::message_t* m : {&dense.positions, &dense.k, &dense.v}) {
    bytes.append(static_cast<const char*>(m->data()), m->size());
  }
  return bytes;
}

TEST_CASE("Light fetches: a dense FETCH of at most max_dense_rows rows, the worker's bytes",
          "[controller][light]") {
  // 300 tokens: two KIVI records per (layer, head) and a fp16 tail of 44 rows.
  constexpr uint32_t kTokens = 300;
  constexpr int64_t kAllRows = int64_t{kTokens} * kHeads * kLayers;
  for (const bool checksums : {false, true}) {
    INFO("checksums " << checksums);
    Config config = LightConfig(std::string("dense-") + (checksums ? "1" : "0"), 32 << 20);
    config.pool.checksums = checksums;
    auto [c, session] = WithTokens(config, kTokens);
    const ipc::FetchRequest all{session, 1, 0, kLayers, ipc::FetchMode::kDense, DType::kF16};
    const ipc::FetchRequest one{session, 1, 1, 2, ipc::FetchMode::kDense, DType::kF16};
    // The row count is of every layer asked for: one row short hands it back with nothing done,
    // not even the checksums of the chunks written by the APPEND (none verified yet).
    bool deferred = false;
    const uint64_t before = checksums ? VerifiedBytes(*c) : 0;
    (void)c->Fetch(all, Clock::now(), &deferred, kAllRows - 1);
    CHECK(deferred);
    deferred = false;
    (void)c->Fetch(all, Clock::now(), &deferred, 0);
    CHECK(deferred);
    if (checksums) CHECK(VerifiedBytes(*c) == before);
    const std::string worker_all = DenseReplyBytes(c->Fetch(all, Clock::now()));
    const std::string worker_one = DenseReplyBytes(c->Fetch(one, Clock::now()));
    if (checksums) CHECK(VerifiedBytes(*c) > before);  // The worker did verify.
    // Within the limit: answered, with exactly the worker's frames.
    deferred = false;
    CHECK(DenseReplyBytes(c->Fetch(all, Clock::now(), &deferred, kAllRows)) == worker_all);
    CHECK_FALSE(deferred);
    CHECK(DenseReplyBytes(c->Fetch(one, Clock::now(), &deferred, kAllRows / 2)) == worker_one);
    CHECK_FALSE(deferred);
    // The same through the daemon's dispatch with its limits.
    StatusOr<ipc::ReplyBody> via = DispatchLight(*c, ipc::RequestBody(all), Clock::now(),
                                                 {.dense_fetch_rows = kAllRows}, &deferred);
    CHECK_FALSE(deferred);
    CHECK(DenseReplyBytes(std::move(via)) == worker_all);
    (void)DispatchLight(*c, ipc::RequestBody(all), Clock::now(), {.dense_fetch_rows = 16},
                        &deferred);
    CHECK(deferred);
    // A decode step later: the new row comes back from the I/O thread too. Its few chunks are
    // within the inline verify budget, so a FETCH one row over the limit would have verified
    // them had it not been handed back first.
    REQUIRE(c->Append(Step(session, 1, kTokens, 1), Clock::now()).ok());
    const uint64_t unverified = checksums ? VerifiedBytes(*c) : 0;
    deferred = false;
    (void)c->Fetch(all, Clock::now(), &deferred, kAllRows + 3);
    CHECK(deferred);
    if (checksums) CHECK(VerifiedBytes(*c) == unverified);
    deferred = false;
    const std::string after = DenseReplyBytes(c->Fetch(all, Clock::now(), &deferred, kAllRows + 4));
    CHECK_FALSE(deferred);
    if (checksums) CHECK(VerifiedBytes(*c) > unverified);  // Verified on the I/O thread.
    CHECK(after != worker_all);
    CHECK(DenseReplyBytes(c->Fetch(all, Clock::now())) == after);
  }
}

TEST_CASE("Dense FETCH on two threads: the same frames at every split threshold",
          "[controller][threads]") {
  constexpr uint32_t kTokens = 700;  // Five KIVI records per (layer, head) and a tail.
  constexpr int64_t kAllRows = int64_t{kTokens} * kHeads * kLayers;
  std::string whole;
  for (const int split_rows : {0, 1, 700, int{kAllRows} - 1, int{kAllRows}}) {
    INFO("dense_fetch_split_rows " << split_rows);
    Config config = LightConfig("split-" + std::to_string(split_rows), 32 << 20);
    config.server.dense_fetch_split_rows = split_rows;
    auto [c, session] = WithTokens(config, kTokens);
    const ipc::FetchRequest all{session, 1, 0, kLayers, ipc::FetchMode::kDense, DType::kF16};
    const ipc::FetchRequest one{session, 1, 1, 2, ipc::FetchMode::kDense, DType::kF32};
    const std::string got =
        DenseReplyBytes(c->Fetch(all, Clock::now())) + DenseReplyBytes(c->Fetch(one, Clock::now()));
    if (whole.empty()) whole = got;  // split_rows 0: one thread.
    CHECK(got == whole);
    // STATS counts the helper's parts: none without a split. (With one, how many parts the helper
    // takes depends on when it wakes.)
    StatusOr<std::string> stats = c->Stats({0, "ipc"}, Clock::now());
    REQUIRE(stats.ok());
    CHECK(stats->find("\nfetch_helper_busy_total:0\n") != std::string::npos);
    if (split_rows == 0) CHECK(stats->find("\nfetch_helper_parts_total:0\n") != std::string::npos);
  }
}

}  // namespace
}  // namespace kvctl
