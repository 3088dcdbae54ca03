// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Writes the seed corpus of the request-path fuzzer (tests/fuzz/request_path_fuzz.cc) into a
// directory: every request of the protocol's sample set (the golden messages of
// tests/ipc/protocol_test.cc, one script each), and whole sessions in the script format of
// tests/fuzz/fuzz_input.h: HELLO for each quantizer, OPEN, inline and staged APPENDs, dense and
// blocks FETCH, STATS, PING, CLOSE, BYE, under each RELOAD variant, plus two-session and
// lease-expiry scripts. tools/fuzz.sh runs it before fuzzing, so the seeds always match the current
// encoders.
//
//   kvctl_fuzz_seeds OUT_DIR              the seed corpus
//   kvctl_fuzz_seeds --regressions DIR    the hand-written inputs of tests/fuzz/regressions/
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ipc/protocol.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/ipc/ipc_test_util.h"

namespace kvctl::fuzz {
namespace {

using ipc::testing::MustEncode;

std::vector<std::string> Strings(const ipc::Frames& frames) {
  std::vector<std::string> out;
  for (const zmq::message_t& f : frames) out.push_back(ipc::testing::Bytes(f));
  return out;
}

template <typename M>
std::vector<std::string> Msg(M msg) {
  return Strings(MustEncode(std::move(msg)));
}

// Session ids are script HELLO numbers (1 = the script's first HELLO).
ipc::HelloRequest Hello(const std::string& model, uint32_t layers, uint32_t kv_heads,
                        uint32_t q_heads, uint32_t head_dim) {
  return {.client_max_version = 1,
          .client_name = "seed",
          .model_name = model,
          .geometry = {.layers = layers,
                       .kv_heads = kv_heads,
                       .q_heads = q_heads,
                       .head_dim = head_dim,
                       .dtype = DType::kF16}};
}

// `n` fp16 values in (-2, -1] and [1, 2): finite, as the daemon requires.
std::string Halves(size_t n, uint32_t seed) {
  std::string out(n * 2, '\0');
  for (size_t i = 0; i < n; ++i) {
    const uint16_t half = static_cast<uint16_t>(0x3C00 ^ (((i + seed) * 37) & 0x83FF));
    std::memcpy(&out[2 * i], &half, 2);
  }
  return out;
}

zmq::message_t HalfFrame(size_t n, uint32_t seed) {
  const std::string bytes = Halves(n, seed);
  return zmq::message_t(bytes.data(), bytes.size());
}

ipc::AppendRequest InlineAppend(const ipc::HelloRequest& h, uint64_t session, uint64_t first,
                                uint32_t n) {
  const ipc::Geometry& g = h.geometry;
  ipc::AppendRequest r{
      .session_id = session, .sequence_id = 7, .first_position = first, .n_tokens = n};
  const size_t kv = static_cast<size_t>(g.layers) * n * g.kv_heads * g.head_dim;
  r.k = HalfFrame(kv, static_cast<uint32_t>(first));
  r.v = HalfFrame(kv, static_cast<uint32_t>(first + 1));
  if (g.q_heads > 0) {
    r.has_q = true;
    r.q = HalfFrame(static_cast<size_t>(g.layers) * n * g.q_heads * g.head_dim, 3);
  }
  return r;
}

// A blocks FETCH of layers [0, 2) holding the harness's last whole table: count 0xFFFFFFFF with
// tag 0 per pair stands for that table's own (request_path_fuzz.cc FillKnown).
ipc::FetchRequest HeldFetch(uint64_t session, uint64_t sequence, uint32_t pairs) {
  ipc::FetchRequest r{session, sequence, 0, 2, ipc::FetchMode::kBlocks, DType::kF16};
  r.n_known = pairs;
  r.known_records.assign(pairs, UINT32_MAX);
  r.known_tags.assign(pairs, 0);
  return r;
}

// Staging bytes of an APPEND of n tokens: K, V (and Q) back to back.
std::string StagedPayload(const ipc::HelloRequest& h, uint32_t n) {
  const ipc::Geometry& g = h.geometry;
  return Halves(static_cast<size_t>(g.layers) * n * (2 * g.kv_heads + g.q_heads) * g.head_dim, 5);
}

// HELLO, OPEN, inline and staged APPENDs, both FETCH modes, STATS, PING, SAVE_PREFIX, CLOSE,
// OPEN_PREFIX, BYE.
// The RELOAD variants past variant 0 (VariantTomls() in request_path_fuzz.cc): each gets a
// session script.
constexpr uint8_t kReloadVariants = 8;

std::string Session(const std::string& model, uint8_t variant, uint32_t q_heads,
                    uint32_t head_dim) {
  const ipc::HelloRequest h = Hello(model, 2, 2, q_heads, head_dim);
  ScriptWriter w;
  if (variant != 0) w.Reload(variant);
  w.Request(Msg(h));
  w.Request(Msg(ipc::OpenRequest{1, 7}));
  w.Request(Msg(InlineAppend(h, 1, 0, 5)));
  constexpr uint32_t kStaged =
      12;  // 5 + 12 + 1 tokens: past flush_tokens (16), so one block quantizes.
  w.Stage(0, 0, StagedPayload(h, kStaged));
  ipc::AppendRequest staged{
      .session_id = 1, .sequence_id = 7, .first_position = 5, .n_tokens = kStaged};
  staged.source = ipc::AppendSource::kStaging;
  staged.has_q = q_heads > 0;
  w.Request(Msg(std::move(staged)), /*relative_staging=*/true);
  w.Request(Msg(InlineAppend(h, 1, 5 + kStaged, 1)));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kDense, DType::kF32}));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kBlocks, DType::kF16}));
  w.Request(Msg(InlineAppend(h, 1, 6 + kStaged, 16)));  // A flush more (or an eviction).
  w.Request(Msg(HeldFetch(1, 7, 4)));
  w.Request(Msg(ipc::StatsRequest{1, ""}));
  w.Request(Msg(ipc::PingRequest{1}));
  const std::vector<int32_t> ids(5 + kStaged + 1, 42);
  ipc::SavePrefixRequest save{1, 7};
  save.tokens = zmq::message_t(ids.data(), ids.size() * sizeof(int32_t));
  // No tier in the harness: kept in the local prefix cache, and the saver shares its pages.
  w.Request(Msg(std::move(save)));
  w.Request(Msg(ipc::CloseRequest{1, 7}));
  w.Request(Msg(ipc::OpenRequest{1, 8}));
  ipc::OpenPrefixRequest open_prefix{1, 9};
  open_prefix.tokens = zmq::message_t(ids.data(), ids.size() * sizeof(int32_t));
  w.Request(Msg(std::move(open_prefix)));               // A fork of the cached prefix (or empty).
  ipc::AppendRequest more = InlineAppend(h, 1, 16, 2);  // At 16: where a restored fork goes on.
  more.sequence_id = 9;
  w.Request(Msg(std::move(more)));
  w.Request(Msg(ipc::FetchRequest{1, 9, 0, 2, ipc::FetchMode::kBlocks, DType::kF16}));
  w.Request(Msg(ipc::ByeRequest{1}));  // Ends the session with sequences still open.
  w.Request(Msg(ipc::PingRequest{1}));
  return w.bytes();
}

// Two sessions, one of which goes silent and loses its lease while the other renews its own.
std::string TwoSessionsAndLease() {
  const ipc::HelloRequest a = Hello("kvarn", 1, 2, 0, 32);
  const ipc::HelloRequest b = Hello("oscar", 2, 1, 2, 32);
  ScriptWriter w;
  w.Request(Msg(a)).Request(Msg(b));
  w.Request(Msg(ipc::OpenRequest{1, 7})).Request(Msg(ipc::OpenRequest{2, 7}));
  w.Request(Msg(InlineAppend(a, 1, 0, 9))).Request(Msg(InlineAppend(b, 2, 0, 17)));
  w.Clock(1500).Request(Msg(ipc::PingRequest{2})).Clock(1000);
  w.Request(Msg(ipc::FetchRequest{2, 7, 1, 2, ipc::FetchMode::kBlocks, DType::kBF16}));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 1, ipc::FetchMode::kDense, DType::kF16}));
  w.Request(Msg(ipc::StatsRequest{0, "sequences"}));
  return w.bytes();
}

// Two sequences whose records outgrow the harness's 64-page pool under a requantize variant: full
// pool relief, slab compaction between the shrinking and growing streams, width lowering (the
// "mixed" model's layer 0 starts at 8/4 bits) and records moved between slabs.
std::string PoolPressure(uint8_t variant) {
  const ipc::HelloRequest h = Hello("mixed", 2, 2, 0, 128);
  ScriptWriter w;
  w.Reload(variant);
  w.Request(Msg(h));
  for (uint64_t seq : {7, 8}) {
    w.Request(Msg(ipc::OpenRequest{1, seq}));
    for (uint64_t first = 0; first < 192; first += 32) {
      ipc::AppendRequest r = InlineAppend(h, 1, first, 32);
      r.sequence_id = seq;
      w.Request(Msg(std::move(r)));
    }
  }
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 1, ipc::FetchMode::kBlocks, DType::kF16}));
  w.Request(Msg(ipc::FetchRequest{1, 8, 1, 2, ipc::FetchMode::kDense, DType::kF32}));
  w.Request(Msg(ipc::StatsRequest{1, ""}));
  return w.bytes();
}

// FETCH on the light path with page checksums (pool.verify_on_fetch): 24 lossless tokens of
// head_dim 1024 write 96 KiB of fp16 rows, past the I/O thread's 64 KiB verify budget, so the
// first blocks FETCH is handed to a worker (Dispatch); after one more token the next finds only
// that step's chunks unverified and is answered on the light path, and a repeat finds none.
std::string VerifyOnceFetch() {
  const ipc::HelloRequest h = Hello("lossless", 1, 1, 0, 1024);
  ScriptWriter w;
  w.Request(Msg(h)).Request(Msg(ipc::OpenRequest{1, 7}));
  w.Request(Msg(InlineAppend(h, 1, 0, 24)));
  const ipc::FetchRequest fetch{1, 7, 0, 1, ipc::FetchMode::kBlocks, DType::kF16};
  w.Request(Msg(fetch)).Request(Msg(InlineAppend(h, 1, 24, 1)));
  w.Request(Msg(fetch)).Request(Msg(fetch));
  return w.bytes();
}

// A prefill in three APPENDs, the first two flagged APPEND_CONTINUES, under an evicting variant:
// FETCH and a refused SAVE_PREFIX between them, then the unflagged APPEND that evicts over all of
// it, a decode step and a blocks FETCH; a flagged PING at the end is refused.
std::string DeferredPrefill(uint8_t variant) {
  const ipc::HelloRequest h = Hello("fp16", 2, 2, 2, 8);
  ScriptWriter w;
  w.Reload(variant);
  w.Request(Msg(h)).Request(Msg(ipc::OpenRequest{1, 7}));
  ipc::AppendRequest first = InlineAppend(h, 1, 0, 20);
  first.continues = true;
  w.Request(Msg(std::move(first)));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kDense, DType::kF32}));
  const std::vector<int32_t> ids(20, 42);
  ipc::SavePrefixRequest save{1, 7};
  save.tokens = zmq::message_t(ids.data(), ids.size() * sizeof(int32_t));
  w.Request(Msg(std::move(save)));  // FAILED_PRECONDITION: the prefill has not ended.
  ipc::AppendRequest second = InlineAppend(h, 1, 20, 15);
  second.continues = true;
  w.Request(Msg(std::move(second)));
  w.Request(Msg(ipc::StatsRequest{1, "sequences"}));
  w.Request(Msg(InlineAppend(h, 1, 35, 3)));
  w.Request(Msg(InlineAppend(h, 1, 38, 1)));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kBlocks, DType::kF16}));
  std::vector<std::string> ping = Msg(ipc::PingRequest{1});
  ping[0][16] = 1;  // APPEND_CONTINUES on a PING: INVALID_ARGUMENT.
  w.Request(ping);
  return w.bytes();
}

// Spread flushes (the "quarot" model spreads over 2 appends; 2 layers, 2 sinks, flush 16): the
// 18th token makes both tails due, layer 0 flushes and layer 1 holds its 16 rows; FETCH both ways
// while it holds, then the append that flushes layer 1 and a FETCH after it.
std::string SpreadFlush() {
  const ipc::HelloRequest h = Hello("quarot", 2, 2, 0, 8);
  ScriptWriter w;
  w.Request(Msg(h)).Request(Msg(ipc::OpenRequest{1, 7}));
  w.Request(Msg(InlineAppend(h, 1, 0, 17)));
  w.Request(Msg(InlineAppend(h, 1, 17, 1)));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kBlocks, DType::kF16}));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kDense, DType::kF32}));
  w.Request(Msg(InlineAppend(h, 1, 18, 1)));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kDense, DType::kF16}));
  w.Request(Msg(HeldFetch(1, 7, 4)));  // Layer 1's records are new since the held table.
  return w.bytes();
}

// quant.flush_after_reply (the turbo model): the harness runs held flushes after odd request
// ids only, so the even ones leave the 16-token flush held over an APPEND and two FETCHes.
std::string HeldFlush() {
  const ipc::HelloRequest h = Hello("turbo", 2, 2, 0, 8);
  auto even = [](auto msg) {
    StatusOr<ipc::Frames> f = ipc::Encode(8, std::move(msg));
    KVCTL_CHECK(f.ok());
    return Strings(*f);
  };
  ScriptWriter w;
  w.Request(Msg(h)).Request(Msg(ipc::OpenRequest{1, 7}));
  w.Request(even(InlineAppend(h, 1, 0, 16)));
  w.Request(even(InlineAppend(h, 1, 16, 1)));
  w.Request(even(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kBlocks, DType::kF16}));
  w.Request(even(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kDense, DType::kF32}));
  w.Request(Msg(InlineAppend(h, 1, 17, 1)));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kDense, DType::kF16}));
  return w.bytes();
}

// Known bugs, as scripts (tests/fuzz/regressions/README.md).
// The issue #17 APPEND: staging_offset 2^64 - 2^32 with a 2^32-byte payload wrapped the slot
// bounds check and read outside the pool (SIGSEGV).
std::string StagingOffsetWrap() {
  ScriptWriter w;
  w.Request(Msg(Hello("lossless", 1, 1, 0, 1024)));
  w.Request(Msg(ipc::OpenRequest{1, 7}));
  ipc::AppendRequest r{
      .session_id = 1, .sequence_id = 7, .first_position = 0, .n_tokens = ipc::kMaxAppendTokens};
  r.source = ipc::AppendSource::kStaging;
  r.staging_offset = ~uint64_t{0} - (uint64_t{1} << 32) + 1;
  w.Request(Msg(std::move(r)));
  return w.bytes();
}

// FETCH blocks of an OScaR sequence before its first record: side_records_per_page 0 made the
// reply invalid, so the daemon answered INTERNAL.
std::string OscarBlocksBeforeFirstRecord() {
  const ipc::HelloRequest h = Hello("oscar", 2, 2, 0, 32);
  ScriptWriter w;
  w.Request(Msg(h)).Request(Msg(ipc::OpenRequest{1, 7})).Request(Msg(InlineAppend(h, 1, 0, 3)));
  w.Request(Msg(ipc::FetchRequest{1, 7, 0, 2, ipc::FetchMode::kBlocks, DType::kF16}));
  return w.bytes();
}

void Write(const std::filesystem::path& dir, const std::string& name, const std::string& bytes) {
  std::ofstream out(dir / name, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "kvctl_fuzz_seeds: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

int Main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--regressions") {
    const std::filesystem::path dir = argv[2];
    std::filesystem::create_directories(dir);
    Write(dir, "staging-offset-wrap.in", StagingOffsetWrap());
    Write(dir, "oscar-blocks-before-first-record.in", OscarBlocksBeforeFirstRecord());
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvctl_fuzz_seeds OUT_DIR | --regressions DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  int n = 0;
  for (const auto& sample : ipc::testing::AllSampleMessages()) {
    if (!sample.is_request) continue;
    ScriptWriter w;
    w.Request(Strings(sample.make()));
    Write(dir, "golden-" + std::to_string(n++), w.bytes());
  }
  // kivi (the default), oscar and mixed (kivi) need head_dim 32 (v_group_channels 32); turbo a
  // power of two.
  const std::pair<const char*, uint32_t> models[] = {{"", 32},      {"fp16", 8},   {"lossless", 8},
                                                     {"quarot", 8}, {"kvarn", 16}, {"oscar", 32},
                                                     {"mixed", 32}, {"turbo", 16}};
  size_t scripts = 0;
  auto script = [&](const std::string& name, const std::string& bytes) {
    Write(dir, name, bytes);
    ++scripts;
  };
  for (const auto& [model, head_dim] : models) {
    script(std::string("session-") + (*model ? model : "default"), Session(model, 0, 2, head_dim));
  }
  for (uint8_t variant = 1; variant <= kReloadVariants; ++variant) {
    script("variant-" + std::to_string(variant), Session("fp16", variant, 2, 8));
  }
  // The memory budget over quantized layers of several widths (the mixed model's overrides).
  script("variant-8-mixed", Session("mixed", 8, 2, 32));
  // R-KV over token-separable records: a head's first compression scores the keys its rows will
  // hold once quantized (KvSequence::KeysAsStored), with a fixed and a memory budget.
  script("variant-4-turbo", Session("turbo", 4, 2, 16));
  script("variant-8-quarot", Session("quarot", 8, 2, 8));
  script("session-noq-kvarn", Session("kvarn", 5, 0, 16));
  script("two-sessions-lease", TwoSessionsAndLease());
  script("pool-pressure-pool-scope", PoolPressure(5));
  script("pool-pressure-sequence-scope", PoolPressure(6));
  script("verify-once-fetch", VerifyOnceFetch());
  script("spread-flush", SpreadFlush());
  script("held-flush", HeldFlush());
  // The evicting variants: streaming, h2o, snapkv, rkv, snapkv with a growing budget, and a
  // memory budget.
  for (int variant : {1, 2, 3, 4, 7, 8}) {
    script("deferred-prefill-" + std::to_string(variant), DeferredPrefill(variant));
  }
  std::printf("kvctl_fuzz_seeds: wrote %d golden requests and %zu scripts to %s\n", n, scripts,
              dir.c_str());
  return 0;
}

}  // namespace
}  // namespace kvctl::fuzz

int main(int argc, char** argv) { return kvctl::fuzz::Main(argc, argv); }
