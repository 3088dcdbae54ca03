// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "ipc/protocol.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "ipc/wire.h"
#include "tests/ipc/ipc_test_util.h"

namespace kvctl::ipc {
namespace {

using testing::Bytes;
using testing::CopyFrames;
using testing::FrameOf;
using testing::MustEncode;

template <typename M>
M RoundTripRequest(M msg, uint64_t id = 7) {
  StatusOr<Frames> frames = Encode(id, std::move(msg));
  REQUIRE(frames.ok());
  StatusOr<Request> decoded = DecodeRequest(std::move(frames).value());
  INFO(decoded.status().ToString());
  REQUIRE(decoded.ok());
  CHECK(decoded->request_id == id);
  REQUIRE(std::holds_alternative<M>(decoded->body));
  return std::move(std::get<M>(decoded->body));
}

template <typename M>
M RoundTripReply(M msg, uint64_t id = 7) {
  StatusOr<Frames> frames = Encode(id, std::move(msg));
  INFO(frames.status().ToString());
  REQUIRE(frames.ok());
  StatusOr<Reply> decoded = DecodeReply(std::move(frames).value());
  INFO(decoded.status().ToString());
  REQUIRE(decoded.ok());
  CHECK(decoded->request_id == id);
  REQUIRE(std::holds_alternative<M>(decoded->body));
  return std::move(std::get<M>(decoded->body));
}

TEST_CASE("Protocol: every request round-trips", "[ipc]") {
  const HelloRequest hello = RoundTripRequest(testing::SampleHello(), 1);
  CHECK(hello.client_max_version == 1);
  CHECK(hello.client_name == "engine-ü");
  CHECK(hello.model_name == "llama-3-8b");
  CHECK(hello.geometry == testing::SampleGeometry());

  const OpenRequest open = RoundTripRequest(OpenRequest{42, 0xFFFFFFFFFFFFFFFFull});
  CHECK(open.session_id == 42);
  CHECK(open.sequence_id == 0xFFFFFFFFFFFFFFFFull);
  const CloseRequest close = RoundTripRequest(CloseRequest{3, 4});
  CHECK((close.session_id == 3 && close.sequence_id == 4));
  CHECK(RoundTripRequest(PingRequest{0}).session_id == 0);
  CHECK(RoundTripRequest(ByeRequest{0xFFFFFFFFFFFFFFFFull}).session_id == 0xFFFFFFFFFFFFFFFFull);

  const AppendRequest want = testing::SampleAppendInline();
  const AppendRequest append = RoundTripRequest(testing::SampleAppendInline(), 1ull << 63);
  CHECK(append.session_id == 42);
  CHECK(append.sequence_id == 7);
  CHECK(append.first_position == 100);
  CHECK(append.n_tokens == 3);
  CHECK(append.source == AppendSource::kInline);
  CHECK(append.has_q);
  CHECK(Bytes(append.k) == Bytes(want.k));
  CHECK(Bytes(append.v) == Bytes(want.v));
  CHECK(Bytes(append.q) == Bytes(want.q));

  const AppendRequest staging = RoundTripRequest(testing::SampleAppendStaging());
  CHECK(staging.source == AppendSource::kStaging);
  CHECK(staging.staging_offset == 8192);
  CHECK((staging.k.size() == 0 && staging.v.size() == 0 && staging.q.size() == 0));

  const FetchRequest fetch =
      RoundTripRequest(FetchRequest{42, 7, 3, 1024, FetchMode::kBlocks, DType::kBF16});
  CHECK((fetch.layer_begin == 3 && fetch.layer_end == 1024));
  CHECK(fetch.mode == FetchMode::kBlocks);
  CHECK(fetch.out_dtype == DType::kBF16);

  CHECK(RoundTripRequest(StatsRequest{5, "Pool"}).section == "Pool");
  CHECK(RoundTripRequest(StatsRequest{0, ""}).section.empty());
}

TEST_CASE("Protocol: every reply round-trips", "[ipc]") {
  const HelloReply want = testing::SampleHelloReply();
  const HelloReply hello = RoundTripReply(testing::SampleHelloReply());
  CHECK(hello.session_id == want.session_id);
  CHECK(hello.lease_ms == want.lease_ms);
  CHECK(hello.server_version == want.server_version);
  CHECK(hello.pool_bytes == want.pool_bytes);
  CHECK(hello.page_bytes == want.page_bytes);
  CHECK(hello.shm_name == want.shm_name);
  CHECK(hello.staging_offset == want.staging_offset);
  CHECK(hello.staging_bytes == want.staging_bytes);
  CHECK(hello.quant == want.quant);
  CHECK(hello.pool_location == PoolLocation::kHostShm);

  HelloReply device_want = testing::SampleHelloReply();
  device_want.shm_name = "";
  device_want.pool_location = PoolLocation::kCudaDevice;
  device_want.cuda_device = 3;
  for (size_t i = 0; i < device_want.cuda_ipc_handle.size(); ++i) {
    device_want.cuda_ipc_handle[i] = static_cast<uint8_t>(i * 7);
  }
  const HelloReply device = RoundTripReply(device_want);
  CHECK(device.pool_location == PoolLocation::kCudaDevice);
  CHECK(device.cuda_device == 3);
  CHECK(device.cuda_ipc_handle == device_want.cuda_ipc_handle);
  CHECK(device.staging_bytes == device_want.staging_bytes);  // Staging without a shm name.

  HelloReply own_want = testing::SampleHelloReply();
  own_want.staging_shm_name = "/kvctl-pool-stg-0123456789abcdef0123456789abcdef";
  own_want.staging_offset = 0;
  own_want.staging_bytes = uint64_t{1} << 40;  // Bounded by its own object, not pool_bytes.
  const HelloReply own = RoundTripReply(own_want);
  CHECK(own.staging_shm_name == own_want.staging_shm_name);
  CHECK(own.staging_bytes == own_want.staging_bytes);

  RoundTripReply(OpenReply{});
  CHECK(RoundTripReply(CloseReply{77}).bytes_freed == 77);
  const ByeReply bye = RoundTripReply(ByeReply{0xFFFFFFFFu, 1ull << 40});
  CHECK((bye.sequences_closed == 0xFFFFFFFFu && bye.bytes_freed == 1ull << 40));
  CHECK(RoundTripReply(PingReply{991}).server_time_us == 991);
  const AppendReply append = RoundTripReply(AppendReply{103, 96, 12345});
  CHECK((append.tokens_total == 103 && append.tokens_quantized == 96));
  CHECK(append.pool_bytes_used == 12345);
  CHECK(RoundTripReply(StatsReply{"# Pool\npool_bytes:1\n"}).text == "# Pool\npool_bytes:1\n");

  const FetchDenseReply dense_want = testing::SampleFetchDense();
  const FetchDenseReply dense = RoundTripReply(testing::SampleFetchDense());
  CHECK(dense.layer_begin == 1);
  CHECK(dense.n_layers == 2);
  CHECK(dense.kv_heads == 2);
  CHECK(dense.head_dim == 8);
  CHECK(dense.dtype == DType::kF32);
  CHECK(dense.counts == dense_want.counts);
  CHECK(Bytes(dense.positions) == Bytes(dense_want.positions));
  CHECK(Bytes(dense.k) == Bytes(dense_want.k));
  CHECK(Bytes(dense.v) == Bytes(dense_want.v));

  const FetchBlocksReply blocks_want = testing::SampleFetchBlocks();
  const FetchBlocksReply blocks = RoundTripReply(testing::SampleFetchBlocks());
  CHECK(blocks.page_bytes == 512);
  CHECK(blocks.block_tokens == 32);
  CHECK(blocks.side_records_per_page == 4);
  CHECK(blocks.layouts == blocks_want.layouts);
  // Two layouts that differ only in records_per_page (and side bytes) keep their own value.
  REQUIRE(blocks.layouts.size() == 2);
  CHECK(blocks.layouts[0].records_per_page == 2);
  CHECK(blocks.layouts[1].records_per_page == 1);
  CHECK(blocks.layout_index == blocks_want.layout_index);
  CHECK(blocks.indptr == blocks_want.indptr);
  CHECK(blocks.indices == blocks_want.indices);
  CHECK(blocks.last_page_len == blocks_want.last_page_len);
  CHECK(blocks.side_indices == blocks_want.side_indices);
  CHECK(blocks.pool_pages == 20);
  CHECK(blocks.window_indptr == blocks_want.window_indptr);
  CHECK(blocks.window_ids == blocks_want.window_ids);
  CHECK(blocks.window_sinks == blocks_want.window_sinks);
  CHECK(blocks.run_indptr == blocks_want.run_indptr);
  CHECK(blocks.run_starts == blocks_want.run_starts);
  CHECK(blocks.run_lengths == blocks_want.run_lengths);
  CHECK(blocks.layouts[0].row_dtype == DType::kF16);
  CHECK(blocks.layouts[0].row_slot_bytes == 32);
  CHECK(blocks.layouts[0].rows_per_page == 16);

  StatusOr<Reply> error = DecodeReply(EncodeError(9, ResourceExhausted("pool: full")));
  REQUIRE(error.ok());
  CHECK(error->request_id == 9);
  const Status status = ToStatus(std::get<ErrorReply>(error->body));
  CHECK(status.code() == StatusCode::kResourceExhausted);
  CHECK(status.message() == "pool: full");
}

TEST_CASE("Protocol: encoders refuse invalid messages and name the field", "[ipc]") {
  HelloRequest hello = testing::SampleHello();
  hello.geometry.layers = 0;
  StatusOr<Frames> f = Encode(1, hello);
  CHECK(f.status().code() == StatusCode::kInvalidArgument);
  CHECK(f.status().message() == "HELLO: layers: got 0, expected 1..1024");

  hello = testing::SampleHello();
  hello.geometry.head_dim = 100;
  CHECK(Encode(1, hello).status().message() ==
        "HELLO: head_dim: got 100, expected a multiple of 8 in 8..1024");
  hello = testing::SampleHello();
  hello.geometry.q_heads = 3;
  CHECK(Encode(1, hello).status().message().find("q_heads: got 3") != std::string::npos);
  hello = testing::SampleHello();
  hello.client_name = "";
  CHECK(Encode(1, hello).status().message().find("client_name: length 0") != std::string::npos);
  hello = testing::SampleHello();
  hello.client_name = "bad\xff";
  CHECK(Encode(1, hello).status().message().find("UTF-8") != std::string::npos);

  CHECK(Encode(1, OpenRequest{0, 1}).status().message().find("session_id: got 0") !=
        std::string::npos);
  CHECK(Encode(1, FetchRequest{1, 1, 2, 2, FetchMode::kDense, DType::kF16}).status().message() ==
        "FETCH: layer_begin: got 2, expected 0..1");
  CHECK(Encode(1, AppendReply{5, 6, 0}).status().message() ==
        "APPEND_REPLY: tokens_quantized: got 6, expected 0..5");

  AppendRequest append = testing::SampleAppendInline();
  append.n_tokens = 0;
  CHECK(Encode(1, std::move(append)).status().message() ==
        "APPEND: n_tokens: got 0, expected 1..1048576");
  append = testing::SampleAppendInline();
  append.v = testing::PatternFrame(append.k.size() + 6, 0);
  CHECK(Encode(1, std::move(append)).status().message().find("v: frame has") != std::string::npos);
  append = testing::SampleAppendInline();
  append.has_q = false;
  CHECK(Encode(1, std::move(append)).status().message().find("has_q is 0") != std::string::npos);
  append = testing::SampleAppendStaging();
  append.k = testing::PatternFrame(8, 0);
  CHECK(Encode(1, std::move(append)).status().message().find("expected none") != std::string::npos);

  HelloReply reply = testing::SampleHelloReply();
  reply.staging_offset = reply.pool_bytes;
  CHECK(Encode(1, reply).status().message().find("ends past pool_bytes") != std::string::npos);
  reply = testing::SampleHelloReply();
  reply.cuda_ipc_handle[5] = 1;  // A handle for a pool in host memory.
  CHECK(Encode(1, reply).status().message().find("expected zeros for a pool in host memory") !=
        std::string::npos);
  reply = testing::SampleHelloReply();
  reply.pool_location = PoolLocation::kCudaDevice;  // With a shm name.
  CHECK(Encode(1, reply).status().message().find("shm_name: got \"/kvctl-pool\"") !=
        std::string::npos);
  reply = testing::SampleHelloReply();
  reply.staging_shm_name = "/kvctl-pool-stg-1";
  reply.staging_bytes = 0;
  reply.staging_offset = 0;
  CHECK(Encode(1, reply).status().message().find("staging_shm_name: got") != std::string::npos);
  reply = testing::SampleHelloReply();
  reply.quant.flush_tokens = 100;
  CHECK(Encode(1, reply).status().message().find("quant.flush_tokens: got 100") !=
        std::string::npos);

  FetchDenseReply dense = testing::SampleFetchDense();
  dense.counts[0] = 4;
  CHECK(Encode(1, std::move(dense)).status().message() ==
        "FETCH_REPLY: positions: frame has 48 bytes, expected 56");
  dense = testing::SampleFetchDense();
  std::memset(dense.positions.data(), 0xFF, 8);  // Position -1.
  CHECK(Encode(1, std::move(dense)).status().message().find("positions[0]: got -1") !=
        std::string::npos);

  FetchBlocksReply blocks = testing::SampleFetchBlocks();
  blocks.indptr = {0, 5, 4};
  CHECK(Encode(1, std::move(blocks)).status().message() ==
        "FETCH_REPLY: indptr[2]: got 4, expected >= indptr[1] = 5");
  blocks = testing::SampleFetchBlocks();
  blocks.last_page_len[0] = 33;
  CHECK(Encode(1, std::move(blocks)).status().message() ==
        "FETCH_REPLY: last_page_len[0]: got 33, expected 1..32");
  blocks = testing::SampleFetchBlocks();
  blocks.layouts[0].k_meta_offset = 60;
  CHECK(Encode(1, std::move(blocks)).status().message().find("overlaps") != std::string::npos);
  blocks = testing::SampleFetchBlocks();
  blocks.side_indices[3] = kNoPage;
  CHECK(Encode(1, std::move(blocks)).status().message().find("side_indices[3]") !=
        std::string::npos);
  blocks = testing::SampleFetchBlocks();
  blocks.layouts[0].record_bytes = 257;  // Its two records per page no longer fit a page.
  CHECK(Encode(1, std::move(blocks)).status().message() ==
        "FETCH_REPLY: layouts[0].records_per_page: got 2, expected 1..1 with records_per_page x "
        "record_bytes (257) <= page_bytes (512)");
  blocks = testing::SampleFetchBlocks();
  blocks.layouts[1].record_bytes = 257;  // One per page still fits: each layout has its own.
  CHECK(Encode(1, std::move(blocks)).ok());
  blocks = testing::SampleFetchBlocks();
  blocks.layouts[1].records_per_page = 0;
  CHECK(Encode(1, std::move(blocks)).status().message() ==
        "FETCH_REPLY: layouts[1].records_per_page: got 0, expected 1..2 with records_per_page x "
        "record_bytes (256) <= page_bytes (512)");
  blocks = testing::SampleFetchBlocks();
  blocks.layouts[1].record_bytes = 513;
  CHECK(Encode(1, std::move(blocks)).status().message() ==
        "FETCH_REPLY: layouts[1].record_bytes: got 513, expected 1..512");
  blocks = testing::SampleFetchBlocks();
  blocks.side_records_per_page = 5;
  CHECK(Encode(1, std::move(blocks))
            .status()
            .message()
            .find("layouts[1].side_bytes_per_token: got 4") != std::string::npos);
  blocks = testing::SampleFetchBlocks();
  blocks.layouts[1].side_bytes_per_token = 0;  // No side records at all: the count must be 0.
  CHECK(Encode(1, std::move(blocks)).status().message() ==
        "FETCH_REPLY: side_records_per_page: got 4, expected 0..0");
}

// Every field of the window (rows in the pool, positions as runs) and every id's page.
TEST_CASE("Protocol: blocks replies check ids against the pool and the window runs", "[ipc]") {
  const auto error_of = [](void (*change)(FetchBlocksReply&)) {
    FetchBlocksReply blocks = testing::SampleFetchBlocks();
    change(blocks);
    return std::string(Encode(1, std::move(blocks)).status().message());
  };
  CHECK(error_of([](FetchBlocksReply&) {}).empty());
  CHECK(error_of([](FetchBlocksReply& b) { b.pool_pages = 0; }) ==
        "FETCH_REPLY: pool_pages: got 0, expected 1..4294967295");
  // Record 11 of a one-per-page layout lies on page 11.
  CHECK(error_of([](FetchBlocksReply& b) { b.pool_pages = 11; }) ==
        "FETCH_REPLY: indices[3]: got 11 (page 11), expected an id on a page below pool_pages "
        "(11) with 1 slots per page");
  // kNoPage has its own message, also behind an earlier in-range id and in a huge pool (where it
  // is below the slot bound); the first of several bad ids is the one named.
  CHECK(error_of([](FetchBlocksReply& b) { b.indices[2] = kNoPage; }) ==
        "FETCH_REPLY: indices[2]: got 4294967295 (no page), expected a page id");
  CHECK(error_of([](FetchBlocksReply& b) {
          b.pool_pages = UINT32_MAX;
          b.indices[2] = kNoPage;
        }) == "FETCH_REPLY: indices[2]: got 4294967295 (no page), expected a page id");
  CHECK(error_of([](FetchBlocksReply& b) {
          b.window_ids[1] = 330;
          b.window_ids[2] = 320;
        }) ==
        "FETCH_REPLY: window_ids[1]: got 330 (page 20), expected an id on a page below "
        "pool_pages (20) with 16 slots per page");
  CHECK(error_of([](FetchBlocksReply& b) { b.side_indices[3] = 80; }) ==
        "FETCH_REPLY: side_indices[3]: got 80 (page 20), expected an id on a page below "
        "pool_pages (20) with 4 slots per page");
  CHECK(error_of([](FetchBlocksReply& b) { b.window_ids[2] = 320; }) ==
        "FETCH_REPLY: window_ids[2]: got 320 (page 20), expected an id on a page below "
        "pool_pages (20) with 16 slots per page");
  CHECK(error_of([](FetchBlocksReply& b) { b.layouts[0].row_dtype = DType::kF32; }) ==
        "FETCH_REPLY: layouts[0].row_slot_bytes: got 32, expected 64 (K and V rows of head_dim "
        "8) .. page_bytes (512)");
  CHECK(error_of([](FetchBlocksReply& b) { b.layouts[0].row_slot_bytes = 513; }) ==
        "FETCH_REPLY: layouts[0].row_slot_bytes: got 513, expected 32 (K and V rows of head_dim "
        "8) .. page_bytes (512)");
  CHECK(error_of([](FetchBlocksReply& b) { b.layouts[0].rows_per_page = 17; }) ==
        "FETCH_REPLY: layouts[0].rows_per_page: got 17, expected 1..16");
  CHECK(error_of([](FetchBlocksReply& b) {
          b.window_indptr = {0, 5, 4};
        }) == "FETCH_REPLY: window_ids: got 5 entries, expected 4");
  CHECK(error_of([](FetchBlocksReply& b) {
          b.window_indptr = {1, 5, 5};
        }) == "FETCH_REPLY: window_indptr[0]: got 1, expected 0");
  CHECK(error_of([](FetchBlocksReply& b) {
          b.window_indptr = {0, 6, 5};
        }) == "FETCH_REPLY: window_indptr[2]: got 5, expected >= window_indptr[1] = 6");
  CHECK(error_of([](FetchBlocksReply& b) { b.window_sinks[0] = 6; }) ==
        "FETCH_REPLY: window_sinks[0]: got 6, expected 0..5");
  CHECK(error_of([](FetchBlocksReply& b) { b.window_sinks = {2}; }) ==
        "FETCH_REPLY: window_sinks: got 1 entries, expected 2");
  CHECK(error_of([](FetchBlocksReply& b) {
          b.run_indptr = {0, 2, 3};
        }) == "FETCH_REPLY: run_lengths: pair 0's runs cover 4 rows, expected its window rows (5)");
  CHECK(error_of([](FetchBlocksReply& b) { b.run_lengths[2] = 0; }) ==
        "FETCH_REPLY: run_lengths[2]: got 0, expected 1..1");
  CHECK(error_of([](FetchBlocksReply& b) { b.run_lengths[0] = 3; }) ==
        "FETCH_REPLY: run_lengths[2]: got 1, expected 1..0");
  CHECK(error_of([](FetchBlocksReply& b) { b.run_starts[1] = 1; }) ==
        "FETCH_REPLY: run_starts[1]: got 1, expected >= 2 (past the previous run of pair 0)");
  CHECK(error_of([](FetchBlocksReply& b) { b.run_starts[2] = uint64_t{1} << 62; }) ==
        "FETCH_REPLY: run_starts[2]: got 4611686018427387904, expected its 1 positions below "
        "4611686018427387904");
  CHECK(error_of([](FetchBlocksReply& b) { b.run_starts.pop_back(); }) ==
        "FETCH_REPLY: run_starts: got 2 entries, expected 3");
}

TEST_CASE("Protocol: the blocks decoder checks each layout's records_per_page", "[ipc]") {
  const Frames good = MustEncode(testing::SampleFetchBlocks());
  // Header 18 + mode 1 + shape 16 + page_bytes, pool_pages, block_tokens,
  // side_records_per_page 16 + n_layouts 2: the layouts start at byte 53; records_per_page is
  // the u32 at byte 52 of each 64.
  const size_t layout0 = 53 + 52, layout1 = 53 + 64 + 52;
  const std::string bytes = Bytes(good[0]);
  REQUIRE(bytes.substr(layout0, 4) == std::string("\x02\0\0\0", 4));
  REQUIRE(bytes.substr(layout1, 4) == std::string("\x01\0\0\0", 4));
  const auto decode_with = [&](size_t at, uint32_t value) {
    std::string bad = bytes;
    for (int i = 0; i < 4; ++i) bad[at + i] = static_cast<char>(value >> (8 * i));
    Frames f = CopyFrames(good);
    f[0] = FrameOf(bad);
    return DecodeReply(std::move(f)).status();
  };
  CHECK(decode_with(layout1, 1).ok());
  CHECK(decode_with(layout1, 2).ok());  // Two 256-byte records fit the 512-byte page.
  Status s = decode_with(layout1, 0);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("layouts[1].records_per_page: got 0, expected 1..2 with "
                         "records_per_page x record_bytes (256) <= page_bytes (512)") !=
        std::string::npos);
  s = decode_with(layout0, 3);  // 3 x 256 > 512.
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("layouts[0].records_per_page: got 3, expected 1..2") != std::string::npos);
  s = decode_with(layout0, 0xFFFFFFFF);
  CHECK(s.message().find("layouts[0].records_per_page: got 4294967295") != std::string::npos);
}

TEST_CASE("Protocol: decoders name the header problem", "[ipc]") {
  Frames ping = MustEncode(PingRequest{1});
  std::string bytes = Bytes(ping[0]);

  std::string bad = bytes;
  bad[4] = 2;  // Version 2.
  Frames f;
  f.push_back(FrameOf(bad));
  StatusOr<Request> r = DecodeRequest(std::move(f));
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message() == "version: got 2, expected 1");
  CHECK(PeekRequestId(FrameOf(bad)) == 7);  // Still answerable with the right id.

  bad = bytes;
  bad[6] = 11;  // Type 11: not assigned.
  f.clear();
  f.push_back(FrameOf(bad));
  r = DecodeRequest(std::move(f));
  CHECK(r.status().code() == StatusCode::kUnimplemented);
  CHECK(r.status().message().find("type: got 0x000B") != std::string::npos);

  f.clear();
  f.push_back(FrameOf(bytes));
  CHECK(DecodeReply(std::move(f)).status().message() == "type: got PING, expected a reply");

  bad = bytes;
  bad[16] = 1;
  f.clear();
  f.push_back(FrameOf(bad));
  CHECK(DecodeRequest(std::move(f)).status().message() ==
        "flags: got 0x0001 on PING, expected 0 (APPEND_CONTINUES, 0x0001, is valid only on "
        "APPEND)");

  bad = bytes;
  bad[17] = static_cast<char>(0x80);  // Bit 15: reserved.
  f.clear();
  f.push_back(FrameOf(bad));
  CHECK(DecodeRequest(std::move(f)).status().message() ==
        "flags: got 0x8000, expected only bit 0 (0x0001, APPEND_CONTINUES); every other bit is "
        "reserved in version 1");

  bad = "KVCX" + bytes.substr(4);
  f.clear();
  f.push_back(FrameOf(bad));
  CHECK(DecodeRequest(std::move(f)).status().message() ==
        "magic: got 0x5843564B, expected 0x5443564B (\"KVCT\")");
  CHECK(PeekRequestId(FrameOf(bad)) == 0);

  f.clear();
  f.push_back(FrameOf(bytes + "x"));
  CHECK(DecodeRequest(std::move(f)).status().message().find("1 unexpected trailing bytes") !=
        std::string::npos);

  f = MustEncode(PingRequest{1});
  f.push_back(FrameOf("extra"));
  CHECK(DecodeRequest(std::move(f)).status().message() == "PING: frame count: got 2, expected 1");
  CHECK(DecodeRequest(Frames()).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Protocol: APPEND_CONTINUES is a header flag of APPEND requests only", "[ipc]") {
  // Set: bit 0 of the header flags, the 38-byte body unchanged; decoded into `continues`.
  AppendRequest flagged = testing::SampleAppendInline();
  flagged.continues = true;
  Frames frames = MustEncode(std::move(flagged));
  const std::string with_flag = Bytes(frames[0]);
  const std::string without_flag = Bytes(MustEncode(testing::SampleAppendInline())[0]);
  CHECK(static_cast<uint8_t>(with_flag[16]) == kFlagAppendContinues);
  CHECK(with_flag[17] == 0);
  CHECK(with_flag.substr(18) == without_flag.substr(18));
  CHECK(with_flag.size() == kHeaderBytes + 38);
  AppendRequest again = testing::SampleAppendInline();
  again.continues = true;
  CHECK(RoundTripRequest(std::move(again)).continues);
  CHECK_FALSE(RoundTripRequest(testing::SampleAppendInline()).continues);
  AppendRequest staged = testing::SampleAppendStaging();
  staged.continues = true;
  CHECK(RoundTripRequest(std::move(staged)).continues);

  // Unknown bits on APPEND, and the known one on a reply.
  std::string bad = with_flag;
  bad[16] = 3;
  Frames f;
  f.push_back(FrameOf(bad));
  f.push_back(std::move(frames[1]));
  f.push_back(std::move(frames[2]));
  f.push_back(std::move(frames[3]));
  CHECK(DecodeRequest(std::move(f)).status().message().find("flags: got 0x0003, expected only") ==
        0);
  Frames reply = MustEncode(AppendReply{2, 0, 8192});
  std::string flagged_reply = Bytes(reply[0]);
  flagged_reply[16] = 1;
  f.clear();
  f.push_back(FrameOf(flagged_reply));
  const Status refused = DecodeReply(std::move(f)).status();
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message().find("flags: got 0x0001 on APPEND_REPLY, expected 0") == 0);
}

TEST_CASE("Protocol: APPEND tensors are checked against the session geometry", "[ipc]") {
  const Geometry g = testing::SampleGeometry();
  AppendRequest append = testing::SampleAppendInline();
  CHECK(CheckAppendShape(append, g).ok());
  Geometry no_q = g;
  no_q.q_heads = 0;
  CHECK(CheckAppendShape(append, no_q).message().find("q_heads = 0") != std::string::npos);
  Geometry more_layers = g;
  more_layers.layers = 3;
  const Status s = CheckAppendShape(append, more_layers);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() ==
        "k: frame has 192 bytes, expected 288 = [3 layers, 3 tokens, 2 heads, 8] "
        "x 2 bytes (float16)");
  CHECK(CheckAppendShape(testing::SampleAppendStaging(), g).ok());

  StatusOr<StagingLayout> layout = AppendStagingLayout(g, 3, true);
  REQUIRE(layout.ok());
  CHECK(layout->total_bytes == 2 * 3 * (2 + 2 + 4) * 8 * 2);
  CHECK(AppendStagingLayout(no_q, 3, true).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Protocol: the staging layout matches the golden table Python is checked against",
          "[ipc]") {
  std::ifstream in(KVCTL_STAGING_GOLDEN);  // Set by tests/ipc/CMakeLists.txt.
  REQUIRE(in.good());
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    INFO(line);
    std::istringstream fields(line);
    Geometry g;
    std::string dtype, bar;
    uint32_t n_tokens = 0;
    int has_q = 0;
    StagingLayout want;
    fields >> g.layers >> g.kv_heads >> g.q_heads >> g.head_dim >> dtype >> n_tokens >> has_q >>
        bar >> want.layer_bytes >> want.q_layer_bytes >> want.v_offset >> want.q_offset >>
        want.total_bytes;
    REQUIRE((fields && bar == "|"));
    g.dtype = ParseDType(dtype).value();
    StatusOr<StagingLayout> got = AppendStagingLayout(g, n_tokens, has_q != 0);
    REQUIRE(got.ok());
    CHECK(*got == want);
    ++rows;
  }
  CHECK(rows >= 9);
  // Past 64 bits: refused, not wrapped.
  Geometry huge{.layers = 1u << 20,
                .kv_heads = 1u << 20,
                .q_heads = 0,
                .head_dim = 1u << 20,
                .dtype = DType::kF32};
  CHECK(AppendStagingLayout(huge, 1u << 20, false).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Protocol: ERROR encoding survives any status", "[ipc]") {
  StatusOr<Reply> r = DecodeReply(EncodeError(1, OkStatus()));
  REQUIRE(r.ok());
  CHECK(std::get<ErrorReply>(r->body).code == StatusCode::kInternal);

  const std::string huge(10000, 'x');
  r = DecodeReply(EncodeError(1, InvalidArgument(huge, "\xff\xfe")));
  REQUIRE(r.ok());
  CHECK(std::get<ErrorReply>(r->body).message.size() == kMaxErrorMessageBytes);

  r = DecodeReply(EncodeError(1, InvalidArgument("bad \xc3 byte")));
  REQUIRE(r.ok());
  CHECK(std::get<ErrorReply>(r->body).message == "bad ? byte");

  CHECK(DecodeReply(EncodeError(1, Status(static_cast<StatusCode>(77), "future"))).ok());
}

TEST_CASE("Protocol: UTF-8 validation rejects overlongs and surrogates and NUL", "[ipc]") {
  CHECK(IsValidUtf8("plain"));
  CHECK(IsValidUtf8("é€𝄞"));
  CHECK_FALSE(IsValidUtf8(std::string("a\0b", 3)));
  CHECK_FALSE(IsValidUtf8("\xc0\xaf"));          // Overlong '/'.
  CHECK_FALSE(IsValidUtf8("\xed\xa0\x80"));      // Surrogate.
  CHECK_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // > U+10FFFF.
  CHECK_FALSE(IsValidUtf8("\xe2\x82"));          // Truncated.
  CHECK(SanitizeUtf8("ab€", 4) == "ab");         // Never cuts inside a code point.
}

TEST_CASE("Protocol: type names", "[ipc]") {
  CHECK(TypeName(1) == "HELLO");
  CHECK(TypeName(0x8006) == "FETCH_REPLY");
  CHECK(TypeName(0xFFFF) == "ERROR");
  CHECK(TypeName(0) == "0x0000");
  CHECK(TypeOf(RequestBody{StatsRequest{}}) == MsgType::kStats);
  CHECK(TypeName(8) == "BYE");
  CHECK(TypeName(0x8008) == "BYE_REPLY");
  CHECK(TypeOf(RequestBody{ByeRequest{}}) == MsgType::kBye);
  CHECK(TypeOf(ReplyBody{ByeReply{}}) == 0x8008);
  CHECK(TypeOf(ReplyBody{FetchBlocksReply{}}) == 0x8006);
}

}  // namespace
}  // namespace kvctl::ipc

namespace kvctl::ipc {
namespace {

zmq::message_t TokenFrame(const std::vector<int32_t>& ids) {
  return zmq::message_t(ids.data(), ids.size() * sizeof(int32_t));
}

TEST_CASE("Protocol: SAVE_PREFIX and OPEN_PREFIX round-trip their token frames", "[ipc]") {
  const std::vector<int32_t> ids = {0, 1, 151, 2147483647};
  SavePrefixRequest save{5, 7};
  save.tokens = TokenFrame(ids);
  SavePrefixRequest got = RoundTripRequest(std::move(save));
  CHECK((got.session_id == 5 && got.sequence_id == 7));
  REQUIRE(got.tokens.size() == ids.size() * 4);
  CHECK(std::memcmp(got.tokens.data(), ids.data(), got.tokens.size()) == 0);
  OpenPrefixRequest open{5, 8};
  open.tokens = TokenFrame(ids);
  CHECK(RoundTripRequest(std::move(open)).tokens.size() == 16);
}

TEST_CASE("Protocol: token frames are checked (empty, ragged, negative, too many)", "[ipc]") {
  const auto error_of = [](zmq::message_t tokens) {
    SavePrefixRequest m{5, 7};
    m.tokens = std::move(tokens);
    StatusOr<Frames> frames = Encode(1, RequestBody(std::move(m)));
    return frames.ok() ? std::string() : frames.status().message();
  };
  CHECK_THAT(error_of(zmq::message_t()), Catch::Contains("tokens: frame has 0 bytes"));
  CHECK_THAT(error_of(zmq::message_t(6)), Catch::Contains("a positive multiple of 4 bytes"));
  CHECK_THAT(error_of(TokenFrame({3, -1})), Catch::Contains("tokens[1]: got -1"));
  CHECK_THAT(error_of(zmq::message_t((kMaxPrefixTokens + 1) * 4)),
             Catch::Contains("expected 1..1048576 int32 token ids"));
  OpenPrefixRequest open{0, 8};
  open.tokens = TokenFrame({1});
  CHECK_THAT(Encode(1, RequestBody(std::move(open))).status().message(),
             Catch::Contains("session_id: got 0"));
}

}  // namespace
}  // namespace kvctl::ipc
