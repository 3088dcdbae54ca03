// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Page checksums: what PageAllocator seals and verifies, and what the Controller answers when a
// page of the shm pool was changed through another mapping (as any process that can open the
// object could): FETCH (dense and blocks) and APPEND of that sequence fail closed with
// DATA_LOSS, the scrubber finds it without a FETCH, other sequences are unaffected, STATS counts.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "controller/pool/pool.h"
#include "controller/service/controller.h"
#include "controller/service/scrubber.h"

namespace kvctl {
namespace {

std::string UniqueShmName(const char* what) {
  static int counter = 0;
  return "/kvctl-crc-" + std::string(what) + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++);
}

// A second, writable mapping of a shm object: what a hostile or careless process holds.
class ForeignMapping {
 public:
  ForeignMapping(const std::string& name, uint64_t bytes) : bytes_(bytes) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(base != MAP_FAILED);
    base_ = static_cast<uint8_t*>(base);
  }
  ~ForeignMapping() { munmap(base_, bytes_); }
  void Flip(uint64_t offset) { base_[offset] ^= 0x5A; }

 private:
  uint8_t* base_ = nullptr;
  uint64_t bytes_;
};

struct TestPool {
  std::string name = UniqueShmName("pool");
  std::unique_ptr<PageAllocator> pool;
  explicit TestPool(bool checksums, uint64_t bytes = 1 << 20, uint64_t page_bytes = 4096) {
    auto arena = ShmArena::Create(name, bytes);
    REQUIRE(arena.ok());
    auto created = PageAllocator::Create(std::move(*arena),
                                         {.page_bytes = page_bytes, .checksums = checksums});
    REQUIRE(created.ok());
    pool = std::move(created).value();
  }
  // Writes `bytes` bytes of `value` at [begin, begin + bytes) of the page, as the daemon does.
  void Write(uint32_t page, uint32_t begin, uint32_t bytes, uint8_t value) {
    pool->MarkDirty(page, begin, begin + bytes);
    std::memset(pool->PagePointer(page) + begin, value, bytes);
  }
};

TEST_CASE("PageAllocator checksums: sealed pages verify, a byte changed elsewhere is DATA_LOSS",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true);
  REQUIRE(t.pool->checksums());
  StatusOr<std::vector<uint32_t>> pages = t.pool->AllocateMany(2);
  REQUIRE(pages.ok());
  const uint32_t a = (*pages)[0], b = (*pages)[1];
  // Slot by slot, sealed after each "request": the checksum is extended, never recomputed.
  for (uint32_t slot = 0; slot < 8; ++slot) {
    t.Write(a, slot * 100, 100, static_cast<uint8_t>(slot + 1));
    REQUIRE(t.pool->SealPages({a}).ok());
  }
  t.Write(b, 0, 4096, 7);
  REQUIRE(t.pool->SealPages({a, b}).ok());
  CHECK(t.pool->SealedBytes(a) == 800);
  CHECK(t.pool->VerifyPages({a, b}, PageAllocator::VerifyReason::kFetch).ok());
  CHECK(t.pool->Stats().verified_bytes_total == 800 + 4096);

  ForeignMapping foreign(t.name, 1 << 20);
  foreign.Flip(t.pool->PageOffset(a) + 900);  // Past the sealed prefix: bytes no one reads.
  CHECK(t.pool->VerifyPages({a}, PageAllocator::VerifyReason::kScrub).ok());
  foreign.Flip(t.pool->PageOffset(a) + 123);
  const Status lost = t.pool->VerifyPages({b, a}, PageAllocator::VerifyReason::kScrub);
  CHECK(lost.code() == StatusCode::kDataLoss);
  CHECK_THAT(lost.message(), Catch::Contains("page " + std::to_string(a) + " (pool offset " +
                                             std::to_string(t.pool->PageOffset(a))));
  CHECK_THAT(lost.message(), Catch::Contains("found by the scrubber"));
  const PoolStats stats = t.pool->Stats();
  CHECK(stats.checksum_failures_total == 1);
  CHECK(stats.scrubbed_bytes_total == 2 * 800 + 4096);
}

TEST_CASE("PageAllocator checksums: a rewrite checks the page first, so damage is not laundered",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  t.Write(*page, 0, 2000, 1);
  REQUIRE(t.pool->SealPages({*page}).ok());
  ForeignMapping foreign(t.name, 1 << 20);
  foreign.Flip(t.pool->PageOffset(*page) + 10);
  // The daemon rewrites bytes [1000, 1100) of the page (a tail rewritten at a flush, say): the
  // new checksum would cover the foreign change, so the seal reports it instead.
  t.Write(*page, 1000, 100, 2);
  const Status sealed = t.pool->SealPages({*page});
  CHECK(sealed.code() == StatusCode::kDataLoss);
  CHECK_THAT(sealed.message(), Catch::Contains("found when a request rewrote them"));
  CHECK(t.pool->Stats().checksum_failures_total == 1);
  // A freed page forgets its checksum: its next owner starts clean.
  REQUIRE(t.pool->Free(*page).ok());
  StatusOr<uint32_t> again = t.pool->Allocate();
  REQUIRE(again.ok());
  CHECK(t.pool->SealedBytes(*again) == 0);
  CHECK(t.pool->VerifyPages({*again}, PageAllocator::VerifyReason::kFetch).ok());
}

constexpr uint32_t kChunk = PageAllocator::kChecksumChunkBytes;

TEST_CASE("PageAllocator checksums: 64 KiB pages are checked chunk by chunk",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  const uint32_t p = *page;
  t.Write(p, 0, 10 * kChunk, 1);
  REQUIRE(t.pool->SealPages({p}).ok());
  CHECK(t.pool->SealedBytes(p) == 10 * kChunk);
  ForeignMapping foreign(t.name, 1 << 20);
  foreign.Flip(t.pool->PageOffset(p) + 7 * kChunk + 5);

  // A range check reads only the chunks its ranges touch (each once): chunk 7 is not among them.
  uint64_t before = t.pool->Stats().verified_bytes_total;
  CHECK(t.pool
            ->VerifyRanges({{p, 100, 200}, {p, 150, kChunk + 1}, {p, 3 * kChunk, 3 * kChunk + 9}},
                           PageAllocator::VerifyReason::kFetch)
            .ok());
  CHECK(t.pool->Stats().verified_bytes_total - before == 3 * kChunk);
  const Status lost = t.pool->VerifyRanges(
      {{p, 7 * kChunk + 100, 7 * kChunk + 200}, {p, 8 * kChunk, 8 * kChunk + 1}},
      PageAllocator::VerifyReason::kFetch);
  CHECK(lost.code() == StatusCode::kDataLoss);
  CHECK_THAT(lost.message(), Catch::Contains("bytes " + std::to_string(7 * kChunk) + ".." +
                                             std::to_string(8 * kChunk)));
  CHECK(t.pool->Stats().checksum_failures_total == 1);  // One page, however many chunks.

  // A rewrite of chunk 2 checks chunk 2 only, and its seal re-checksums chunk 2 only.
  before = t.pool->Stats().verified_bytes_total;
  const uint64_t sealed_before = t.pool->Stats().sealed_bytes_total;
  t.Write(p, 2 * kChunk + 10, 20, 3);
  CHECK(t.pool->Stats().verified_bytes_total - before == kChunk);
  REQUIRE(t.pool->SealPages({p}).ok());
  CHECK(t.pool->Stats().sealed_bytes_total - sealed_before == kChunk);
  // The foreign change in chunk 7 was neither checked nor laundered: a whole-page check finds it.
  CHECK(t.pool->VerifyPages({p}, PageAllocator::VerifyReason::kScrub).code() ==
        StatusCode::kDataLoss);
}

TEST_CASE("PageAllocator checksums: no chunk write launders a foreign change",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10);
  ForeignMapping foreign(t.name, 1 << 20);
  SECTION("an append into the chunk holding the sealed end extends its checksum") {
    StatusOr<uint32_t> page = t.pool->Allocate();
    REQUIRE(page.ok());
    t.Write(*page, 0, kChunk + 100, 1);
    REQUIRE(t.pool->SealPages({*page}).ok());
    foreign.Flip(t.pool->PageOffset(*page) + kChunk + 50);  // Sealed bytes of chunk 1.
    t.Write(*page, kChunk + 300, 100, 2);                   // Past the sealed end, in chunk 1.
    REQUIRE(t.pool->SealPages({*page}).ok());               // Not checked: only extended...
    CHECK(t.pool->SealedBytes(*page) == kChunk + 400);
    CHECK(t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kFetch).code() ==
          StatusCode::kDataLoss);  // ...so the change still shows.
  }
  SECTION("two writes far apart check every chunk between them") {
    StatusOr<uint32_t> page = t.pool->Allocate();
    REQUIRE(page.ok());
    t.Write(*page, 0, 12 * kChunk, 1);
    REQUIRE(t.pool->SealPages({*page}).ok());
    foreign.Flip(t.pool->PageOffset(*page) + 6 * kChunk);
    t.Write(*page, 10, 10, 2);
    t.Write(*page, 11 * kChunk, 10, 2);  // The seal re-checksums chunks 0..11.
    CHECK(t.pool->SealPages({*page}).code() == StatusCode::kDataLoss);
  }
  SECTION("a compaction's copy skips the chunks this request rewrote, checks the others") {
    StatusOr<uint32_t> page = t.pool->Allocate();
    REQUIRE(page.ok());
    t.Write(*page, 0, 4 * kChunk, 1);
    REQUIRE(t.pool->SealPages({*page}).ok());
    t.Write(*page, 0, 10, 2);  // Checks chunk 0.
    const uint64_t before = t.pool->Stats().verified_bytes_total;
    CHECK(t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kCopy).ok());
    CHECK(t.pool->Stats().verified_bytes_total - before == 3 * kChunk);
    foreign.Flip(t.pool->PageOffset(*page) + 3 * kChunk + 1);
    CHECK(t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kCopy).code() ==
          StatusCode::kDataLoss);
  }
}

TEST_CASE("PageAllocator checksums: random writes and foreign changes, none ever laundered",
          "[controller][checksum]") {
  // A model of the guarantee: a foreign change to bytes below the sealed end is reported either
  // by the seal of a request that rewrites its chunk or by a later check of the page; bytes past
  // the sealed end are not covered (nothing of the daemon's lives there yet).
  TestPool t(/*checksums=*/true, 1 << 20, 64 << 10);
  ForeignMapping foreign(t.name, 1 << 20);
  std::mt19937 rng(20261202);
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  std::vector<uint8_t> changed(64 << 10, 0);  // XOR of foreign changes below the sealed end.
  auto pending = [&] {
    return std::any_of(changed.begin(), changed.end(), [](uint8_t x) { return x != 0; });
  };
  int reported = 0;
  for (int request = 0; request < 400; ++request) {
    const uint32_t sealed = static_cast<uint32_t>(t.pool->SealedBytes(*page));
    if (sealed > 0 && rng() % 3 == 0) {
      const uint32_t at = rng() % sealed;
      foreign.Flip(t.pool->PageOffset(*page) + at);
      changed[at] ^= 0x5A;
    }
    const int writes = static_cast<int>(rng() % 3);
    for (int w = 0; w < writes; ++w) {
      const uint32_t begin = rng() % ((64 << 10) - 300);
      t.Write(*page, begin, 1 + rng() % 300, static_cast<uint8_t>(request));
    }
    const Status sealed_status = t.pool->SealPages({*page});
    const Status checked = rng() % 4 == 0
                               ? t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kScrub)
                               : OkStatus();
    // Whatever the seal and the scrub said, a full check then agrees with the model: a change
    // is reported exactly while one is pending (a write over a changed byte checks it first).
    const Status full = t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kFetch);
    if (sealed_status.ok() && checked.ok() && full.ok()) {
      REQUIRE_FALSE(pending());
      continue;
    }
    REQUIRE(pending());
    ++reported;
    // The page is beyond repair for its owner: start over on a fresh one.
    REQUIRE(t.pool->Free(*page).ok());
    page = t.pool->Allocate();
    REQUIRE(page.ok());
    std::fill(changed.begin(), changed.end(), 0);
  }
  CHECK(reported > 10);
}

TEST_CASE("PageAllocator checksums: off means nothing is sealed or verified",
          "[controller][checksum]") {
  TestPool t(/*checksums=*/false);
  CHECK_FALSE(t.pool->checksums());
  StatusOr<uint32_t> page = t.pool->Allocate();
  REQUIRE(page.ok());
  t.Write(*page, 0, 100, 3);
  REQUIRE(t.pool->SealPages({*page}).ok());
  ForeignMapping foreign(t.name, 1 << 20);
  foreign.Flip(t.pool->PageOffset(*page) + 5);
  CHECK(t.pool->VerifyPages({*page}, PageAllocator::VerifyReason::kFetch).ok());
  CHECK(t.pool->Stats().checksum_failures_total == 0);
}

// ---- Through the Controller ---------------------------------------------------------------------

constexpr uint32_t kLayers = 2, kHeads = 2, kHeadDim = 64, kTokens = 200;

struct Daemonless {
  Config config;
  std::unique_ptr<Controller> controller;
  uint64_t session = 0;
  std::vector<uint16_t> k, v;  // fp16 [layers, tokens, heads, head_dim].

  explicit Daemonless(bool checksums) {
    config.pool.bytes = 16 << 20;
    config.pool.page_bytes = 4096;
    config.pool.shm_name = UniqueShmName("ctl");
    config.pool.staging_slots = 0;
    config.pool.checksums = checksums;
    config.quant.method = QuantMethod::kKivi;
    config.quant.k_bits = config.quant.v_bits = 2;
    StatusOr<std::unique_ptr<Controller>> created = Controller::Create(config);
    REQUIRE(created.ok());
    controller = std::move(created).value();
    ipc::HelloRequest hello;
    hello.client_name = "checksum_test";
    hello.geometry = {kLayers, kHeads, 0, kHeadDim, DType::kF16};
    StatusOr<ipc::HelloReply> reply = controller->Hello(hello, Now());
    REQUIRE(reply.ok());
    session = reply->session_id;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    k.resize(size_t{kLayers} * kTokens * kHeads * kHeadDim);
    v.resize(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = FloatToHalf(normal(rng));
    for (size_t i = 0; i < v.size(); ++i) v[i] = FloatToHalf(normal(rng));
  }
  static SteadyTime Now() { return std::chrono::steady_clock::now(); }

  Status Store(uint64_t seq) {
    KVCTL_RETURN_IF_ERROR(controller->Open({session, seq}, Now()));
    return Append(seq, 0, kTokens);
  }
  Status Append(uint64_t seq, uint64_t first, uint32_t n) {
    ipc::AppendRequest request{
        .session_id = session, .sequence_id = seq, .first_position = first, .n_tokens = n};
    // The first n tokens of every layer, [layers, n, heads, head_dim].
    std::vector<uint16_t> kn, vn;
    const size_t per_token = size_t{kHeads} * kHeadDim;
    for (uint32_t l = 0; l < kLayers; ++l) {
      const size_t at = size_t{l} * kTokens * per_token;
      kn.insert(kn.end(), k.begin() + at, k.begin() + at + n * per_token);
      vn.insert(vn.end(), v.begin() + at, v.begin() + at + n * per_token);
    }
    request.k = zmq::message_t(kn.data(), kn.size() * 2);
    request.v = zmq::message_t(vn.data(), vn.size() * 2);
    return controller->Append(request, Now()).status();
  }
  StatusOr<ipc::ReplyBody> Fetch(uint64_t seq, ipc::FetchMode mode) {
    return controller->Fetch({.session_id = session,
                              .sequence_id = seq,
                              .layer_begin = 0,
                              .layer_end = kLayers,
                              .mode = mode},
                             Now());
  }
  // Pool offset of the first record of (layer 0, head 0) of `seq`, from its blocks reply.
  uint64_t FirstRecordOffset(uint64_t seq) {
    StatusOr<ipc::ReplyBody> body = Fetch(seq, ipc::FetchMode::kBlocks);
    REQUIRE(body.ok());
    const auto& blocks = std::get<ipc::FetchBlocksReply>(*body);
    REQUIRE(!blocks.indices.empty());
    const ipc::RecordLayout& layout = blocks.layouts[blocks.layout_index[0]];
    const uint32_t id = blocks.indices[0];
    return uint64_t{id / layout.records_per_page} * blocks.page_bytes +
           uint64_t{id % layout.records_per_page} * layout.record_bytes;
  }
  std::string Stats() {
    StatusOr<std::string> text = controller->Stats({0, "pool"}, Now());
    REQUIRE(text.ok());
    return *text;
  }
};

uint64_t StatsField(const std::string& text, const std::string& key) {
  const size_t at = text.find("\n" + key + ":");
  REQUIRE(at != std::string::npos);
  return std::stoull(text.substr(at + key.size() + 2));
}

TEST_CASE("Controller: FETCH and APPEND of a sequence whose page changed fail closed, others not",
          "[controller][checksum]") {
  Daemonless d(/*checksums=*/true);
  REQUIRE(d.Store(1).ok());
  REQUIRE(d.Store(2).ok());
  REQUIRE(d.Fetch(1, ipc::FetchMode::kDense).ok());
  const uint64_t offset = d.FirstRecordOffset(1);
  CHECK(StatsField(d.Stats(), "checksum_failures_total") == 0);
  CHECK(StatsField(d.Stats(), "checksums") == 1);

  ForeignMapping foreign(d.config.pool.shm_name, d.config.pool.bytes);
  foreign.Flip(offset + 3);
  for (ipc::FetchMode mode : {ipc::FetchMode::kBlocks, ipc::FetchMode::kDense}) {
    StatusOr<ipc::ReplyBody> fetched = d.Fetch(1, mode);
    CHECK(fetched.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(fetched.status().message(), Catch::Contains("changed outside the daemon"));
  }
  const Status appended = d.Append(1, kTokens, 1);
  CHECK(appended.code() == StatusCode::kDataLoss);
  // The other sequence fetches, appends and fetches again as before.
  CHECK(d.Fetch(2, ipc::FetchMode::kDense).ok());
  CHECK(d.Fetch(2, ipc::FetchMode::kBlocks).ok());
  CHECK(d.Append(2, kTokens, 1).ok());
  CHECK(d.Fetch(2, ipc::FetchMode::kDense).ok());
  const std::string stats = d.Stats();
  CHECK(StatsField(stats, "checksum_failures_total") == 1);  // One page, counted once.
  CHECK(StatsField(stats, "verified_bytes_total") > 0);
  // Closing the lost sequence frees it; a new one reuses its pages cleanly.
  REQUIRE(d.controller->Close({d.session, 1}, Daemonless::Now()).ok());
  REQUIRE(d.Store(3).ok());
  CHECK(d.Fetch(3, ipc::FetchMode::kDense).ok());
}

TEST_CASE("Controller: decode steps extend checksums, only a flush re-checks whole pages",
          "[controller][checksum]") {
  Daemonless d(/*checksums=*/true);
  REQUIRE(d.controller->Open({d.session, 1}, Daemonless::Now()).ok());
  // Steps that checksummed whole pages again (verified_bytes_total grows before a rewrite).
  int rechecks = 0, flushes = 0;
  uint64_t before = StatsField(d.Stats(), "verified_bytes_total");
  uint64_t quantized = 0;
  for (uint64_t t = 0; t < 600; ++t) {
    ipc::AppendRequest request{
        .session_id = d.session, .sequence_id = 1, .first_position = t, .n_tokens = 1};
    std::vector<uint16_t> kn(size_t{kLayers} * kHeads * kHeadDim, FloatToHalf(0.5f));
    request.k = zmq::message_t(kn.data(), kn.size() * 2);
    request.v = zmq::message_t(kn.data(), kn.size() * 2);
    StatusOr<ipc::AppendReply> reply = d.controller->Append(request, Daemonless::Now());
    REQUIRE(reply.ok());
    flushes += reply->tokens_quantized != quantized;
    quantized = reply->tokens_quantized;
    const uint64_t after = StatsField(d.Stats(), "verified_bytes_total");
    rechecks += after != before;
    before = after;
  }
  REQUIRE(flushes > 2);
  CHECK(rechecks <= flushes);
  CHECK(d.Fetch(1, ipc::FetchMode::kDense).ok());
}

TEST_CASE("Controller: the scrubber finds a changed page without any FETCH",
          "[controller][checksum]") {
  Daemonless d(/*checksums=*/true);
  REQUIRE(d.Store(1).ok());
  REQUIRE(d.Store(2).ok());
  const uint64_t offset = d.FirstRecordOffset(2);
  // A clean pass verifies everything stored and finds nothing.
  const uint64_t clean = d.controller->Scrub(uint64_t{1} << 30);
  CHECK(clean > 0);
  CHECK(StatsField(d.Stats(), "scrubbed_bytes_total") == clean);
  CHECK(StatsField(d.Stats(), "checksum_failures_total") == 0);

  ForeignMapping foreign(d.config.pool.shm_name, d.config.pool.bytes);
  foreign.Flip(offset);
  // Small budgets: passes take the sequences in turn and go on where the last one stopped.
  for (int pass = 0; pass < 1000 && StatsField(d.Stats(), "checksum_failures_total") == 0; ++pass) {
    d.controller->Scrub(4096);
  }
  CHECK(StatsField(d.Stats(), "checksum_failures_total") == 1);
  CHECK(d.Fetch(2, ipc::FetchMode::kDense).status().code() == StatusCode::kDataLoss);
  CHECK(d.Fetch(1, ipc::FetchMode::kDense).ok());
  // A lost sequence is not scrubbed (or counted) again.
  d.controller->Scrub(uint64_t{1} << 30);
  CHECK(StatsField(d.Stats(), "checksum_failures_total") == 1);
}

TEST_CASE("Controller: pool.checksums = false verifies nothing (the operator's off switch)",
          "[controller][checksum]") {
  Daemonless d(/*checksums=*/false);
  REQUIRE(d.Store(1).ok());
  const uint64_t offset = d.FirstRecordOffset(1);
  ForeignMapping foreign(d.config.pool.shm_name, d.config.pool.bytes);
  foreign.Flip(offset);
  CHECK(d.Fetch(1, ipc::FetchMode::kDense).ok());
  CHECK(d.controller->Scrub(uint64_t{1} << 30) == 0);
  CHECK(StatsField(d.Stats(), "checksums") == 0);
  CHECK(Scrubber::Start(d.config.pool, d.controller.get()) == nullptr);
}

TEST_CASE("Config: scrubber keys are validated with named errors", "[controller][checksum]") {
  Config config;
  config.pool.page_bytes = 64 << 10;
  config.pool.scrub_interval_ms = 10;
  config.pool.scrub_bytes_per_second = 1 << 20;  // 10 KiB per period: less than a page.
  const Status s = ValidateConfig(config);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("pool.scrub_bytes_per_second"));
  config.pool.scrub_interval_ms = 100;
  CHECK(ValidateConfig(config).ok());
  CHECK(Scrubber::BytesPerPass(config.pool) == (1 << 20) / 10);
  config.pool.scrub_interval_ms = 0;  // Off: no constraint.
  CHECK(ValidateConfig(config).ok());
}

}  // namespace
}  // namespace kvctl
