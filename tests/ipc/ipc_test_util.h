// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/ipc/ipc_test_util.h
// Shared by the ipc tests: one valid sample of every message (fresh each call, since tensor frames
// are move-only), frame copying, and a temporary directory for ipc:// socket files.
//
// Thread safety: the samples are plain functions; TempDir is owned by one test.
//
//   for (auto& make : AllSampleMessages()) { Frames f = make(); ... }
#ifndef KVCTL_TESTS_IPC_IPC_TEST_UTIL_H_
#define KVCTL_TESTS_IPC_IPC_TEST_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ipc/protocol.h"

namespace kvctl::ipc::testing {

inline std::string Bytes(const zmq::message_t& m) {
  return std::string(static_cast<const char*>(m.data()), m.size());
}

inline zmq::message_t FrameOf(const std::string& bytes) {
  return zmq::message_t(bytes.data(), bytes.size());
}

// A frame of `n` deterministic bytes.
inline zmq::message_t PatternFrame(size_t n, uint8_t seed) {
  zmq::message_t m(n);
  auto* p = static_cast<uint8_t*>(m.data());
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + 31 * i);
  return m;
}

// A frame of int64 positions first, first + 1, ...
inline zmq::message_t PositionsFrame(size_t n, int64_t first) {
  zmq::message_t m(n * 8);
  for (size_t i = 0; i < n; ++i) {
    const int64_t p = first + static_cast<int64_t>(i);
    std::memcpy(static_cast<char*>(m.data()) + 8 * i, &p, 8);
  }
  return m;
}

inline Frames CopyFrames(const Frames& in) {
  Frames out;
  for (const zmq::message_t& f : in) out.emplace_back(f.data(), f.size());
  return out;
}

inline Geometry SampleGeometry() {
  return {.layers = 2, .kv_heads = 2, .q_heads = 4, .head_dim = 8, .dtype = DType::kF16};
}

inline HelloRequest SampleHello() {
  return {.client_max_version = 1,
          .client_name = "engine-ü",
          .model_name = "llama-3-8b",
          .geometry = SampleGeometry()};
}

inline HelloReply SampleHelloReply() {
  return {.session_id = 42,
          .lease_ms = 30000,
          .server_version = "kvctl 0.1.0",
          .pool_bytes = 1 << 20,
          .page_bytes = 4096,
          .shm_name = "/kvctl-pool",
          .staging_offset = 8192,
          .staging_bytes = 65536,
          .quant = {.method = 3,
                    .k_bits = 2,
                    .v_bits = 2,
                    .block_tokens = 32,
                    .sink_tokens = 4,
                    .flush_tokens = 128}};
}

// Inline append of 3 tokens with Q, shaped for SampleGeometry().
inline AppendRequest SampleAppendInline() {
  AppendRequest r{.session_id = 42, .sequence_id = 7, .first_position = 100, .n_tokens = 3};
  r.has_q = true;
  const size_t kv = 2 * 3 * 2 * 8 * 2, q = 2 * 3 * 4 * 8 * 2;
  r.k = PatternFrame(kv, 1);
  r.v = PatternFrame(kv, 2);
  r.q = PatternFrame(q, 3);
  return r;
}

inline AppendRequest SampleAppendStaging() {
  AppendRequest r{.session_id = 42, .sequence_id = 7, .first_position = 103, .n_tokens = 1};
  r.source = AppendSource::kStaging;
  r.staging_offset = 8192;
  return r;
}

// Layers [1, 3) of a 2-head, head_dim 8 cache; pair 2 holds no tokens.
inline FetchDenseReply SampleFetchDense() {
  FetchDenseReply r{.layer_begin = 1, .n_layers = 2, .kv_heads = 2, .head_dim = 8};
  r.dtype = DType::kF32;
  r.counts = {3, 2, 0, 1};
  r.positions = PositionsFrame(6, 10);
  r.k = PatternFrame(6 * 8 * 4, 4);
  r.v = PatternFrame(6 * 8 * 4, 5);
  return r;
}

inline RecordLayout SampleLayout(uint32_t side_bytes, uint32_t records_per_page) {
  return {.method = 3,
          .k_bits = 2,
          .v_bits = 2,
          .k_group_tokens = 32,
          .v_group_channels = 32,
          .record_bytes = 256,
          .k_codes_offset = 0,
          .k_codes_bytes = 64,
          .k_meta_offset = 64,
          .k_meta_bytes = 48,
          .v_codes_offset = 112,
          .v_codes_bytes = 64,
          .v_meta_offset = 176,
          .v_meta_bytes = 48,
          .side_bytes_per_token = side_bytes,
          .records_per_page = records_per_page,
          .row_slot_bytes = 32,  // fp16 K and V rows of head_dim 8.
          .rows_per_page = 16};
}

// One layer, two heads, two layouts of 256-byte records: the first packs two per 512-byte page,
// the second (with side records, four per page) one; both keep fp16 window rows 16 per page, in
// a pool of 20 pages. Head 0 has 3 records, the last with 5 tokens, and a window of 2 sinks
// (positions 0, 1) and 3 tail rows (positions 69, 70 and, after an eviction, 72); head 1 has
// one record and no window.
inline FetchBlocksReply SampleFetchBlocks() {
  FetchBlocksReply r{.layer_begin = 0,
                     .n_layers = 1,
                     .kv_heads = 2,
                     .head_dim = 8,
                     .page_bytes = 512,
                     .pool_pages = 20,
                     .block_tokens = 32,
                     .side_records_per_page = 4};
  r.layouts = {SampleLayout(0, 2), SampleLayout(4, 1)};
  r.layout_index = {0, 1};
  r.indptr = {0, 3, 4};
  r.indices = {5, 9, 2, 11};
  r.last_page_len = {5, 32};
  r.side_indices = {kNoPage, kNoPage, kNoPage, 12};
  r.window_indptr = {0, 5, 5};
  r.window_ids = {40, 41, 3, 4, 17};
  r.window_sinks = {2, 0};
  r.run_indptr = {0, 3, 3};
  r.run_starts = {0, 69, 72};
  r.run_lengths = {2, 2, 1};
  r.record_base = {0, 0};
  r.table_tags = {0x0123456789abcdefULL, 7};
  return r;
}

// Encodes `msg` with request id 7. REQUIRES: valid.
template <typename M>
Frames MustEncode(M msg) {
  StatusOr<Frames> f = Encode(7, std::move(msg));
  KVCTL_CHECK(f.ok());
  return std::move(f).value();
}

// One factory per message form (every request, every reply, both FETCH replies, ERROR).
struct SampleMessage {
  std::string name;
  bool is_request;
  std::function<Frames()> make;
};

inline std::vector<SampleMessage> AllSampleMessages() {
  return {
      {"HELLO", true, [] { return MustEncode(SampleHello()); }},
      {"OPEN", true,
       [] {
         return MustEncode(OpenRequest{42, 7});
       }},
      {"CLOSE", true,
       [] {
         return MustEncode(CloseRequest{42, 7});
       }},
      {"PING", true, [] { return MustEncode(PingRequest{42}); }},
      {"APPEND inline", true, [] { return MustEncode(SampleAppendInline()); }},
      {"APPEND staging", true, [] { return MustEncode(SampleAppendStaging()); }},
      {"APPEND inline, APPEND_CONTINUES", true,
       [] {
         AppendRequest r = SampleAppendInline();
         r.continues = true;
         return MustEncode(std::move(r));
       }},
      {"FETCH", true,
       [] {
         return MustEncode(FetchRequest{42, 7, 0, 2, FetchMode::kBlocks, DType::kBF16});
       }},
      {"STATS", true,
       [] {
         return MustEncode(StatsRequest{0, "pool"});
       }},
      {"BYE", true, [] { return MustEncode(ByeRequest{42}); }},
      {"SAVE_PREFIX", true,
       [] {
         SavePrefixRequest m{42, 7};
         const int32_t ids[] = {1, 2, 300, 4};
         m.tokens = zmq::message_t(ids, sizeof(ids));
         return MustEncode(std::move(m));
       }},
      {"OPEN_PREFIX", true,
       [] {
         OpenPrefixRequest m{42, 8};
         const int32_t ids[] = {1, 2, 300};
         m.tokens = zmq::message_t(ids, sizeof(ids));
         return MustEncode(std::move(m));
       }},
      {"HELLO_REPLY", false, [] { return MustEncode(SampleHelloReply()); }},
      {"OPEN_REPLY", false, [] { return MustEncode(OpenReply{}); }},
      {"CLOSE_REPLY", false, [] { return MustEncode(CloseReply{4096}); }},
      {"PING_REPLY", false, [] { return MustEncode(PingReply{123456789}); }},
      {"APPEND_REPLY", false,
       [] {
         return MustEncode(AppendReply{103, 96, 1 << 16});
       }},
      {"FETCH_REPLY dense", false, [] { return MustEncode(SampleFetchDense()); }},
      {"FETCH_REPLY blocks", false, [] { return MustEncode(SampleFetchBlocks()); }},
      {"STATS_REPLY", false, [] { return MustEncode(StatsReply{"# IPC\nrequests_total:3\n"}); }},
      {"BYE_REPLY", false,
       [] {
         return MustEncode(ByeReply{3, 1 << 20});
       }},
      {"SAVE_PREFIX_REPLY", false,
       [] {
         return MustEncode(SavePrefixReply{16, 4096});
       }},
      {"OPEN_PREFIX_REPLY", false, [] { return MustEncode(OpenPrefixReply{16}); }},
      {"ERROR", false, [] { return EncodeError(7, NotFound("sequence_id: 9 not found")); }},
  };
}

// A fresh directory under $TMPDIR (or /tmp), removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/kvctl-ipc-XXXXXX";
    KVCTL_CHECK(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace kvctl::ipc::testing

#endif  // KVCTL_TESTS_IPC_IPC_TEST_UTIL_H_
