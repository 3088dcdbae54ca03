// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The position runs of a blocks FETCH reply: a head's sink and tail rows as runs of consecutive
// positions, one run when the tail follows the sinks directly, two once records lie between.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include "common/half.h"
#include "controller/service/controller.h"
#include "ipc/protocol.h"
#include "tests/controller/service/service_test_util.h"

namespace kvctl {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 64, kSinks = 4;

Status AppendTokens(Controller& c, uint64_t session, uint64_t first, uint32_t n) {
  std::vector<uint16_t> rows(size_t{kLayers} * n * kHeads * kDim, FloatToHalf(0.25f));
  ipc::AppendRequest a{
      .session_id = session, .sequence_id = 1, .first_position = first, .n_tokens = n};
  a.k = zmq::message_t(rows.data(), rows.size() * 2);
  a.v = zmq::message_t(rows.data(), rows.size() * 2);
  return c.Append(a, Clock::now()).status();
}

// Every pair's runs, as (start, length) lists.
std::vector<std::vector<std::pair<uint64_t, uint32_t>>> Runs(Controller& c, uint64_t session) {
  StatusOr<ipc::ReplyBody> body =
      c.Fetch({session, 1, 0, kLayers, ipc::FetchMode::kBlocks, DType::kF16}, Clock::now());
  REQUIRE(body.ok());
  const auto& blocks = std::get<ipc::FetchBlocksReply>(*body);
  std::vector<std::vector<std::pair<uint64_t, uint32_t>>> runs;
  for (size_t p = 0; p + 1 < blocks.run_indptr.size(); ++p) {
    runs.emplace_back();
    for (uint32_t j = blocks.run_indptr[p]; j < blocks.run_indptr[p + 1]; ++j) {
      runs.back().emplace_back(blocks.run_starts[j], blocks.run_lengths[j]);
    }
  }
  return runs;
}

TEST_CASE("Blocks reply: sink and tail rows as runs of consecutive positions", "[controller]") {
  Config config;
  config.pool.shm_name = "/kvctl-runs-" + std::to_string(getpid());
  config.pool.bytes = 16 << 20;
  config.pool.page_bytes = 16 << 10;
  config.pool.staging_slots = 0;
  config.quant.method = QuantMethod::kKivi;  // 32-token records.
  config.quant.sink_tokens = kSinks;
  config.quant.flush_tokens = 32;
  config.server.stats_endpoint = "";
  std::unique_ptr<Controller> c = testing::MakeController(config);
  ipc::HelloRequest hello{.client_name = "runs",
                          .geometry = {kLayers, kHeads, 0, kDim, DType::kF16}};
  StatusOr<ipc::HelloReply> h = c->Hello(hello, Clock::now());
  REQUIRE(h.ok());
  REQUIRE(c->Open({h->session_id, 1}, Clock::now()).ok());
  using Run = std::pair<uint64_t, uint32_t>;
  // 4 sinks then a tail of 6 right after them: one run of 10 per pair.
  REQUIRE(AppendTokens(*c, h->session_id, 100, 10).ok());
  for (const auto& pair : Runs(*c, h->session_id)) CHECK(pair == std::vector<Run>{{100, 10}});
  // 4 sinks, one 32-token record, a tail of 4: the runs are split by the record.
  REQUIRE(AppendTokens(*c, h->session_id, 110, 30).ok());
  for (const auto& pair : Runs(*c, h->session_id)) {
    CHECK(pair == std::vector<Run>{{100, kSinks}, {136, 4}});
  }
}

}  // namespace
}  // namespace kvctl
