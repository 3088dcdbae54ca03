// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Per-session staging objects of a cpu pool (controller/pool/staging_shm.h): the pool object is
// read-only to clients, each session with staging gets its own 0600 object named in HELLO, APPEND
// reads it, the name goes when the session does, and a dead daemon's leftovers are removed.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/half.h"
#include "controller/pool/staging_shm.h"
#include "controller/service/controller.h"

namespace kvctl {
namespace {

bool ShmExists(const std::string& name, mode_t* mode = nullptr) {
  struct stat st {};
  if (stat(("/dev/shm" + name).c_str(), &st) != 0) return false;
  if (mode != nullptr) *mode = st.st_mode & 07777;
  return true;
}

Config StagingConfig() {
  static int counter = 0;
  Config config;
  config.pool.bytes = 16 << 20;
  config.pool.page_bytes = 4096;
  config.pool.shm_name =
      "/kvctl-stg-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  config.pool.staging_slots = 2;
  config.pool.staging_bytes_per_session = 64 << 10;
  config.server.lease_ms = 1000;
  config.quant.lossless = true;
  return config;
}

ipc::HelloRequest Hello() {
  ipc::HelloRequest hello;
  hello.client_name = "staging_test";
  hello.geometry = {1, 1, 0, 8, DType::kF16};
  return hello;
}

TEST_CASE("Staging objects: one private object per session, the pool read-only",
          "[controller][staging]") {
  const Config config = StagingConfig();
  StatusOr<std::unique_ptr<Controller>> created = Controller::Create(config);
  REQUIRE(created.ok());
  Controller& c = **created;
  const SteadyTime now = std::chrono::steady_clock::now();
  mode_t mode = 0;
  REQUIRE(ShmExists(config.pool.shm_name, &mode));
  CHECK(mode == 0400);

  StatusOr<ipc::HelloReply> a = c.Hello(Hello(), now);
  StatusOr<ipc::HelloReply> b = c.Hello(Hello(), now);
  StatusOr<ipc::HelloReply> third = c.Hello(Hello(), now);
  REQUIRE((a.ok() && b.ok() && third.ok()));
  // The pool object holds pages only: pool.bytes less the two 64 KiB slots.
  CHECK(a->pool_bytes == (16 << 20) - 2 * (64 << 10));
  for (const ipc::HelloReply* r : {&*a, &*b}) {
    INFO(r->staging_shm_name);
    CHECK(r->staging_shm_name.rfind(config.pool.shm_name + "-stg-", 0) == 0);
    CHECK(r->staging_shm_name.size() == config.pool.shm_name.size() + 5 + 32);
    CHECK(r->staging_offset == 0);
    CHECK(r->staging_bytes == 64 << 10);
    REQUIRE(ShmExists(r->staging_shm_name, &mode));
    CHECK(mode == 0600);
  }
  CHECK(a->staging_shm_name != b->staging_shm_name);
  // Every slot taken: the third session sends inline.
  CHECK(third->staging_bytes == 0);
  CHECK(third->staging_shm_name.empty());
  CHECK(c.pool_stats().staging_slots_used == 2);
  CHECK(c.pool_stats().alloc_failures_total == 1);

  // The engine's side: map its own object read-write, write K and V, APPEND from offset 0.
  REQUIRE(c.Open({a->session_id, 1}, now).ok());
  const int fd = shm_open(a->staging_shm_name.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  void* map = mmap(nullptr, a->staging_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  REQUIRE(map != MAP_FAILED);
  std::vector<uint16_t> rows(2 * 8);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = FloatToHalf(static_cast<float>(i));
  std::memcpy(map, rows.data(), rows.size() * 2);
  ipc::AppendRequest append{.session_id = a->session_id, .sequence_id = 1, .n_tokens = 1};
  append.source = ipc::AppendSource::kStaging;
  StatusOr<ipc::AppendReply> appended = c.Append(append, now);
  REQUIRE(appended.ok());
  CHECK(appended->tokens_total == 1);
  StatusOr<ipc::ReplyBody> fetched =
      c.Fetch({a->session_id, 1, 0, 1, ipc::FetchMode::kDense, DType::kF32}, now);
  REQUIRE(fetched.ok());
  const auto& dense = std::get<ipc::FetchDenseReply>(*fetched);
  std::vector<float> k(8);
  std::memcpy(k.data(), dense.k.data(), 32);
  CHECK(k[7] == 7.0f);
  // Past the end of the session's own object.
  append.first_position = 1;
  append.staging_offset = a->staging_bytes - 8;
  CHECK(c.Append(append, now).status().code() == StatusCode::kInvalidArgument);
  munmap(map, a->staging_bytes);

  // A session ends by BYE or by its lease: its object's name goes and the slot is free again.
  REQUIRE(c.Bye({b->session_id}, now).ok());
  CHECK_FALSE(ShmExists(b->staging_shm_name));
  CHECK(c.pool_stats().staging_slots_used == 1);
  CHECK(c.ExpireLeases(now + std::chrono::seconds(5)) == 2);
  CHECK_FALSE(ShmExists(a->staging_shm_name));
  CHECK(c.pool_stats().staging_slots_used == 0);
  StatusOr<ipc::HelloReply> again = c.Hello(Hello(), now);
  REQUIRE(again.ok());
  CHECK(again->staging_bytes == 64 << 10);
}

TEST_CASE("Staging objects: a slot rewritten during its APPENDs never puts a bad value in the pool",
          "[controller][staging]") {
  // A hostile engine (here a child process, as another process would be) flips elements of its
  // slot between fine values and NaN / Inf without pause while the daemon handles APPENDs from
  // it. Each APPEND is then either refused by name or stores what it checked: reading the slot
  // once to check and again to store let a value refused by the check reach the pool, after
  // which every flush of the sequence failed.
  Config config = StagingConfig();
  config.pool.bytes = 64 << 20;
  config.quant.lossless = false;
  config.quant.method = QuantMethod::kKivi;
  config.quant.k_bits = 4;
  config.quant.v_bits = 4;
  config.quant.block_tokens = 32;
  config.quant.flush_tokens = 32;
  StatusOr<std::unique_ptr<Controller>> created = Controller::Create(config);
  REQUIRE(created.ok());
  Controller& c = **created;
  const SteadyTime now = std::chrono::steady_clock::now();
  ipc::HelloRequest hello = Hello();
  hello.geometry = {2, 2, 0, 32, DType::kF16};
  StatusOr<ipc::HelloReply> session = c.Hello(hello, now);
  INFO(session.status().ToString());
  REQUIRE(session.ok());
  REQUIRE(c.Open({session->session_id, 1}, now).ok());
  const int fd = shm_open(session->staging_shm_name.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  auto* slot = static_cast<uint16_t*>(
      mmap(nullptr, session->staging_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  REQUIRE(slot != MAP_FAILED);
  constexpr uint32_t kTokens = 4;  // Per APPEND: 2 layers x 2 heads x 32 dims of K, then of V.
  constexpr size_t kElements = 2 * 2 * 2 * 32 * kTokens;
  for (size_t i = 0; i < kElements; ++i) slot[i] = FloatToHalf(std::sin(0.1f * i));
  slot[kElements] = 0;
  const pid_t flipper = fork();
  REQUIRE(flipper >= 0);
  if (flipper == 0) {
    // Nothing of the parent's: no output, no locks; it runs until killed, or its parent dies.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) _exit(0);
    close(STDOUT_FILENO);
    close(STDERR_FILENO);
    volatile uint16_t* p = slot;
    p[kElements] = 1;  // Started: past what the APPENDs read.
    for (uint32_t i = 0;; i = i * 1103515245u + 12345u) {
      const size_t at = (i >> 8) % kElements;
      const uint16_t fine = p[at];
      p[at] = (i & 1) != 0 ? 0x7E00 : 0xFC00;  // NaN, -Inf.
      for (int spin = 0; spin < 64; ++spin) p[(at + 1) % kElements];
      p[at] = fine;
      for (int spin = 0; spin < 2048; ++spin) p[(at + 1) % kElements];  // Some APPENDs pass.
    }
  }
  struct KillAtExit {  // Also when a REQUIRE below ends the test early.
    pid_t pid;
    ~KillAtExit() {
      if (pid <= 0) return;  // Reaped already (kill(-1, ...) would signal every process).
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } kill_flipper{flipper};
  while (reinterpret_cast<volatile uint16_t*>(slot)[kElements] == 0) {
  }
  int64_t position = 0;
  int stored = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    ipc::AppendRequest append{.session_id = session->session_id,
                              .sequence_id = 1,
                              .first_position = static_cast<uint64_t>(position),
                              .n_tokens = kTokens};
    append.source = ipc::AppendSource::kStaging;
    StatusOr<ipc::AppendReply> r = c.Append(append, now);
    if (c.HeldFlushesQueued()) c.RunHeldFlushes();
    if (r.ok()) {
      ++stored;
      position += kTokens;
    } else {
      ++refused;
      INFO(r.status().ToString());
      REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
      REQUIRE_THAT(r.status().message(), Catch::Contains("expected a finite value") ||
                                             Catch::Contains("beyond the fp16 range"));
      REQUIRE_THAT(r.status().message(), !Catch::Contains("block"));  // Not a flush's refusal.
    }
  }
  kill(flipper, SIGKILL);
  REQUIRE(waitpid(flipper, nullptr, 0) == flipper);
  kill_flipper.pid = 0;
  // Killed perhaps between its two writes: the engine writes its next step afresh.
  for (size_t i = 0; i < kElements; ++i) slot[i] = FloatToHalf(std::sin(0.1f * i));
  INFO("stored " << stored << ", refused " << refused);
  CHECK(stored > 100);
  // The engine is quiet again: its next APPEND is taken, and everything held is finite.
  ipc::AppendRequest last{.session_id = session->session_id,
                          .sequence_id = 1,
                          .first_position = static_cast<uint64_t>(position),
                          .n_tokens = kTokens};
  last.source = ipc::AppendSource::kStaging;
  REQUIRE(c.Append(last, now).ok());
  StatusOr<ipc::ReplyBody> fetched =
      c.Fetch({session->session_id, 1, 0, 2, ipc::FetchMode::kDense, DType::kF32}, now);
  REQUIRE(fetched.ok());
  const auto& dense = std::get<ipc::FetchDenseReply>(*fetched);
  std::vector<float> k(dense.k.size() / 4), v(dense.v.size() / 4);
  std::memcpy(k.data(), dense.k.data(), dense.k.size());
  std::memcpy(v.data(), dense.v.data(), dense.v.size());
  CHECK(k.size() == size_t{2} * 2 * 32 * static_cast<size_t>(position + kTokens));
  size_t bad = 0;
  for (size_t i = 0; i < k.size(); ++i) bad += !std::isfinite(k[i]) + !std::isfinite(v[i]);
  CHECK(bad == 0);
  munmap(slot, session->staging_bytes);
}

TEST_CASE("Staging snapshot: one copy buffer between a prefill's pieces, given back after",
          "[controller][staging]") {
  // Objects of 4 MiB: larger than what is kept after an APPEND (kRetainBytes), within what is
  // kept between the pieces of one prefill (kRetainPieceBytes).
  StagingObjects objects("/kvctl-snap-test-" + std::to_string(getpid()), 1, 4 << 20);
  StatusOr<std::shared_ptr<StagingObject>> object = objects.Acquire();
  REQUIRE(object.ok());
  const uint64_t bytes = (*object)->bytes();
  REQUIRE(bytes > StagingSnapshot::kRetainBytes);
  REQUIRE(bytes <= StagingSnapshot::kRetainPieceBytes);
  for (uint64_t i = 0; i < bytes; ++i) (*object)->data()[i] = static_cast<uint8_t>(i * 7);
  StagingSnapshot snapshot;
  StatusOr<const uint8_t*> first = snapshot.Copy(**object, 0, bytes);
  REQUIRE(first.ok());
  CHECK(std::memcmp(*first, (*object)->data(), bytes) == 0);
  snapshot.Trim(/*more_pieces=*/true);
  (*object)->data()[5] ^= 0xFF;  // The engine writes the next piece.
  StatusOr<const uint8_t*> second = snapshot.Copy(**object, 0, bytes);
  REQUIRE(second.ok());
  CHECK(*second == *first);  // The same buffer, holding the new bytes.
  CHECK(std::memcmp(*second, (*object)->data(), bytes) == 0);
  CHECK(snapshot.retained_bytes() == bytes);
  // The last piece: the buffer is given back; a later copy allocates again.
  snapshot.Trim(/*more_pieces=*/false);
  CHECK(snapshot.retained_bytes() == 0);
  StatusOr<const uint8_t*> third = snapshot.Copy(**object, 1, bytes - 1);
  REQUIRE(third.ok());
  CHECK(std::memcmp(*third, (*object)->data() + 1, bytes - 1) == 0);
  // A decode step's copy stays after any APPEND.
  snapshot.Trim(false);
  REQUIRE(snapshot.Copy(**object, 0, 4096).ok());
  snapshot.Trim(false);
  CHECK(snapshot.retained_bytes() == 4096);
}

TEST_CASE("Staging objects: a dead daemon's leftovers are removed at the next start",
          "[controller][staging]") {
  const Config config = StagingConfig();
  const std::string leftover = config.pool.shm_name + "-stg-0123456789abcdef0123456789abcdef";
  const std::string unrelated = config.pool.shm_name + "-stg-short";
  for (const std::string& name : {leftover, unrelated}) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    close(fd);
  }
  StatusOr<std::unique_ptr<Controller>> created = Controller::Create(config);
  REQUIRE(created.ok());
  CHECK_FALSE(ShmExists(leftover));
  CHECK(ShmExists(unrelated));  // Not a name the daemon makes: not its to remove.
  shm_unlink(unrelated.c_str());
}

TEST_CASE("Staging objects: a pool name too long for the suffix is refused by name",
          "[controller][staging]") {
  Config config = StagingConfig();
  config.pool.shm_name = "/" + std::string(230, 'k');
  StatusOr<std::unique_ptr<Controller>> created = Controller::Create(config);
  CHECK(created.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(created.status().message(), Catch::Contains("pool.shm_name"));
}

}  // namespace
}  // namespace kvctl
