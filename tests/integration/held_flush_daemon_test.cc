// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// quant.flush_after_reply through the real daemon: decode steps answered on the I/O thread, the
// held flush encoded by a worker after the reply while the client FETCHes page tables, and the
// next APPEND writing it. Against a daemon that flushes on the step: the same bytes once both
// hold the same records. integration_test also runs under TSan (tools/sanitize.sh), which is
// what checks the worker against the I/O thread here.
#include <catch2/catch.hpp>
#include <chrono>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/half.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/prefix_test_util.h"

namespace kvctl {
namespace {

using testing::DaemonProcess;

constexpr int kLayers = 3, kHeads = 2, kDim = 32;
// KIVI 2-bit, 8-token blocks, 2 sinks, a flush every 16 tokens.
constexpr const char* kQuant =
    "bytes = \"64MiB\"\npage_bytes = \"16KiB\"\n"
    "[quant]\nmethod = \"kivi\"\nk_bits = 2\nv_bits = 2\nblock_tokens = 8\nk_group_tokens = 8\n"
    "sink_tokens = 2\nflush_tokens = 16\n";

struct Open {
  std::unique_ptr<ipc::Client> client;
  uint64_t session = 0;
};

Open OpenOne(DaemonProcess& daemon) {
  Open o{daemon.Connect(10000), 0};
  auto hello =
      o.client->Hello({.client_name = "held", .geometry = {kLayers, kHeads, 0, kDim, DType::kF16}});
  REQUIRE(hello.ok());
  o.session = hello->session_id;
  REQUIRE(o.client->Open(o.session, 1).ok());
  return o;
}

ipc::AppendReply Step(Open& o, uint64_t t) {
  std::vector<uint16_t> k(size_t{kLayers} * kHeads * kDim), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = FloatToHalf(static_cast<float>((i * 7 + t * 13) % 101) / 50.f - 1.f);
    v[i] = FloatToHalf(static_cast<float>((i * 11 + t * 5) % 97) / 48.f - 1.f);
  }
  auto r = o.client->AppendInline({o.session, 1, t, 1}, std::as_bytes(std::span<const uint16_t>(k)),
                                  std::as_bytes(std::span<const uint16_t>(v)));
  REQUIRE(r.ok());
  return *r;
}

std::string Dense(Open& o) {
  auto f = o.client->FetchDense(o.session, 1, 0, kLayers, DType::kF16);
  REQUIRE(f.ok());
  return std::string(static_cast<const char*>(f->k.data()), f->k.size()) +
         std::string(static_cast<const char*>(f->v.data()), f->v.size());
}

TEST_CASE("Daemon: flushes encoded after the reply keep every byte (quant.flush_after_reply)",
          "[integration]") {
  DaemonProcess held(std::string(kQuant) + "flush_after_reply = true\n",
                     "inline_append_tokens = 1\n", "held");
  DaemonProcess ref(kQuant, "", "ref");
  Open h = OpenOne(held), r = OpenOne(ref);
  uint64_t t = 0;
  // Up to the first held flush (2 sinks + 16 rows): answered with the rows stored.
  for (; t < 18; ++t) {
    const ipc::AppendReply a = Step(h, t), b = Step(r, t);
    CHECK(a.tokens_total == b.tokens_total);
  }
  // A worker encodes step 17's flush after its reply: waited for as a condition, not a time.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (prefix_test::StatsField(*h.client, "sequences", "held_flush_layers_total") < kLayers) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::yield();
  }
  // Prepared, nothing written since: this step writes it before its own row.
  CHECK(Step(h, t).tokens_quantized == 16);
  CHECK(Step(r, t++).tokens_quantized == 16);  // The reference flushed on step 17 itself.
  CHECK(Dense(h) == Dense(r));
  // Decode steps with a page-table FETCH after each (what a fused-attention engine does while
  // the worker encodes), through 12 more flushes.
  for (; t < 220; ++t) {
    Step(h, t);
    Step(r, t);
    auto blocks = h.client->FetchBlocks(h.session, 1, 0, kLayers);
    REQUIRE(blocks.ok());
  }
  // Both hold the same records once the held one wrote its last flush: a few more steps at most
  // (a tail passes flush_tokens by at most 15 rows before the APPEND flushes itself).
  for (int extra = 0;; ++extra, ++t) {
    REQUIRE(extra <= 16);
    const ipc::AppendReply a = Step(h, t), b = Step(r, t);
    if (a.tokens_quantized == b.tokens_quantized) break;
  }
  CHECK(Dense(h) == Dense(r));
  CHECK(held.Stop() == 0);
  CHECK(ref.Stop() == 0);
}

}  // namespace
}  // namespace kvctl
