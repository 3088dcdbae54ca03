// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The blocks FETCH reply: a head's sink and tail rows as runs of consecutive positions (one run
// when the tail follows the sinks directly, two once records lie between), and a known table
// that leaves the records the client holds out of the reply.
#include "controller/service/blocks_reply.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "common/half.h"
#include "controller/service/controller.h"
#include "ipc/client.h"
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

// A controller with KIVI (32-token records, a 32-token flush, kSinks sinks), a session of
// kLayers x kHeads and its sequence 1 open; returns the session id.
uint64_t OpenKivi(const std::string& name, std::unique_ptr<Controller>* c) {
  Config config;
  config.pool.shm_name = "/kvctl-" + name + "-" + std::to_string(getpid());
  config.pool.bytes = 16 << 20;
  config.pool.page_bytes = 16 << 10;
  config.pool.staging_slots = 0;
  config.quant.method = QuantMethod::kKivi;
  config.quant.sink_tokens = kSinks;
  config.quant.flush_tokens = 32;
  config.server.stats_endpoint = "";
  *c = testing::MakeController(config);
  ipc::HelloRequest hello{.client_name = name, .geometry = {kLayers, kHeads, 0, kDim, DType::kF16}};
  StatusOr<ipc::HelloReply> h = (*c)->Hello(hello, Clock::now());
  REQUIRE(h.ok());
  REQUIRE((*c)->Open({h->session_id, 1}, Clock::now()).ok());
  return h->session_id;
}

TEST_CASE("Blocks reply: sink and tail rows as runs of consecutive positions", "[controller]") {
  std::unique_ptr<Controller> c;
  const uint64_t session = OpenKivi("runs", &c);
  using Run = std::pair<uint64_t, uint32_t>;
  // 4 sinks then a tail of 6 right after them: one run of 10 per pair.
  REQUIRE(AppendTokens(*c, session, 100, 10).ok());
  for (const auto& pair : Runs(*c, session)) CHECK(pair == std::vector<Run>{{100, 10}});
  // 4 sinks, one 32-token record, a tail of 4: the runs are split by the record.
  REQUIRE(AppendTokens(*c, session, 110, 30).ok());
  for (const auto& pair : Runs(*c, session)) {
    CHECK(pair == std::vector<Run>{{100, kSinks}, {136, 4}});
  }
}

uint64_t TagOf(const std::vector<std::pair<uint32_t, uint32_t>>& records) {
  TableTag tag;
  for (const auto& [id, side] : records) tag.Add(id, side);
  return tag.value();
}

TEST_CASE("Blocks reply: a table tag tells record lists apart and extends", "[controller]") {
  const std::vector<std::pair<uint32_t, uint32_t>> list = {
      {5, ipc::kNoPage}, {9, ipc::kNoPage}, {2, ipc::kNoPage}, {11, 12}, {40, 41}};
  CHECK(TagOf(list) == TagOf(list));
  // Any change: an id, a side id, the order (within and across lanes), a record more or less.
  std::set<uint64_t> tags = {TagOf(list), TagOf({})};
  for (size_t i = 0; i < list.size(); ++i) {
    for (uint32_t flip : {1u, 1u << 31}) {
      auto changed = list;
      changed[i].first ^= flip;
      tags.insert(TagOf(changed));
      changed = list;
      changed[i].second ^= flip;
      tags.insert(TagOf(changed));
    }
    tags.insert(TagOf({list.begin(), list.begin() + static_cast<std::ptrdiff_t>(i)}));
  }
  auto swapped = list;
  std::swap(swapped[0], swapped[1]);
  tags.insert(TagOf(swapped));
  swapped = list;
  std::swap(swapped[0], swapped[4]);  // The same lane (record 0 and record 4).
  tags.insert(TagOf(swapped));
  // All distinct: the list, the empty one, 4 changes per record, 4 non-empty prefixes, 2 swaps.
  CHECK(tags.size() == 2 + list.size() * 4 + list.size() - 1 + 2);
  // The tag of a prefix, then more records: the same as the whole list at once.
  TableTag tag;
  for (size_t i = 0; i < 3; ++i) tag.Add(list[i].first, list[i].second);
  CHECK(tag.value() == TagOf({list.begin(), list.begin() + 3}));
  for (size_t i = 3; i < list.size(); ++i) tag.Add(list[i].first, list[i].second);
  CHECK(tag.value() == TagOf(list));
}

ipc::FetchBlocksReply FetchBlocks(Controller& c, uint64_t session,
                                  const ipc::FetchBlocksReply* held = nullptr) {
  ipc::FetchRequest request{session, 1, 0, kLayers, ipc::FetchMode::kBlocks, DType::kF16};
  if (held != nullptr) ipc::SetKnownTable(*held, &request);
  StatusOr<ipc::ReplyBody> body = c.Fetch(request, Clock::now());
  REQUIRE(body.ok());
  return std::get<ipc::FetchBlocksReply>(*std::move(body));
}

TEST_CASE("Blocks reply: with a known table only the newer records are listed", "[controller]") {
  std::unique_ptr<Controller> c;
  const uint64_t sid = OpenKivi("known", &c);
  const size_t pairs = kLayers * kHeads;
  REQUIRE(AppendTokens(*c, sid, 0, kSinks + 3 * 32 + 5).ok());  // 3 records per pair.
  const ipc::FetchBlocksReply full = FetchBlocks(*c, sid);
  CHECK(full.record_base == std::vector<uint32_t>(pairs, 0));
  CHECK(full.indices.size() == 3 * pairs);

  // Nothing new: no record listed, the window still whole, the same tags.
  const ipc::FetchBlocksReply same = FetchBlocks(*c, sid, &full);
  CHECK(same.record_base == std::vector<uint32_t>(pairs, 3));
  CHECK(same.indices.empty());
  CHECK(same.table_tags == full.table_tags);
  CHECK(same.window_ids == full.window_ids);
  CHECK(same.last_page_len == full.last_page_len);
  CHECK(ipc::Encode(1, same).ok());  // A valid reply, the held records counted.
  StatusOr<ipc::FetchBlocksReply> merged = ipc::MergeBlocksReply(full, same);
  REQUIRE(merged.ok());
  CHECK(merged->indices == full.indices);
  CHECK(merged->indptr == full.indptr);

  // A flush later: one new record per pair listed, and the merge is the fresh whole table.
  REQUIRE(AppendTokens(*c, sid, kSinks + 3 * 32 + 5, 32).ok());
  const ipc::FetchBlocksReply fresh = FetchBlocks(*c, sid);
  const ipc::FetchBlocksReply since = FetchBlocks(*c, sid, &full);
  CHECK(since.record_base == std::vector<uint32_t>(pairs, 3));
  CHECK(since.indices.size() == pairs);
  CHECK(since.table_tags == fresh.table_tags);
  merged = ipc::MergeBlocksReply(full, since);
  REQUIRE(merged.ok());
  CHECK(merged->indices == fresh.indices);
  CHECK(merged->indptr == fresh.indptr);
  CHECK(merged->table_tags == fresh.table_tags);

  // A tag that was never given, or more records than the pair holds: that pair is listed whole.
  ipc::FetchBlocksReply forged = full;
  forged.table_tags[1] ^= 1;
  forged.indptr = {0, 3, 6, 9, 99};  // Pair 3 claims 93 records.
  const ipc::FetchBlocksReply mixed = FetchBlocks(*c, sid, &forged);
  CHECK(mixed.record_base == std::vector<uint32_t>{3, 0, 3, 0});
  CHECK(mixed.indices.size() == 1 + 4 + 1 + 4);
  CHECK(mixed.table_tags == fresh.table_tags);

  // A known table of the wrong size is refused by name; dense mode takes none.
  ipc::FetchRequest bad{sid, 1, 0, kLayers, ipc::FetchMode::kBlocks, DType::kF16};
  bad.n_known = 1;
  bad.known_records = {1};
  bad.known_tags = {1};
  StatusOr<ipc::ReplyBody> refused = c->Fetch(bad, Clock::now());
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK(refused.status().message() ==
        "n_known: got 1, expected 0 or the range's pairs (2 layers x 2 heads = 4)");
  bad.mode = ipc::FetchMode::kDense;
  CHECK(ipc::Encode(1, bad).status().message() ==
        "FETCH: n_known: got 1, expected 0 in dense mode (a known table is for blocks mode)");
}

}  // namespace
}  // namespace kvctl
