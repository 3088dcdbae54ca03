// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// The real daemon process against a hostile client on the same host (issue #17): a crafted
// staging offset that wraps, and a request over the size limit split across frames. Each must get
// a named error while the daemon keeps serving and the stored rows stay exactly as they were.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/half.h"
#include "ipc/protocol.h"
#include "tests/integration/daemon_process.h"

namespace kvctl {
namespace {

using testing::DaemonProcess;

std::span<const std::byte> AsBytes(const std::vector<uint16_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * 2};
}

std::string FrameText(const zmq::message_t& m) {
  return std::string(static_cast<const char*>(m.data()), m.size());
}

TEST_CASE("Daemon: a wrapping staging offset and an oversize request leave it serving intact",
          "[integration][hostile]") {
  DaemonProcess daemon(
      "bytes = \"64MiB\"\npage_bytes = \"64KiB\"\nstaging_slots = 2\n"
      "staging_bytes_per_session = \"1MiB\"\n[quant]\nmethod = \"kivi\"\nk_bits = 4\nv_bits = 4\n",
      "max_message_bytes = \"1MiB\"\n");
  auto client = daemon.Connect();
  // The geometry of the crash report: 1 layer, 1 head, head_dim 1024, fp16.
  auto hello = client->Hello({.client_name = "attacker", .geometry = {1, 1, 0, 1024, DType::kF16}});
  REQUIRE(hello.ok());
  REQUIRE(hello->staging_bytes > 0);
  const uint64_t session = hello->session_id;
  REQUIRE(client->Open(session, 1).ok());
  std::vector<uint16_t> k(64 * 1024), v(64 * 1024);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = FloatToHalf(static_cast<float>(i % 251) / 251.f);
    v[i] = FloatToHalf(-static_cast<float>(i % 241) / 241.f);
  }
  REQUIRE(client->AppendInline({session, 1, 0, 64}, AsBytes(k), AsBytes(v)).ok());
  auto before = client->FetchDense(session, 1, 0, 1, DType::kF32);
  REQUIRE(before.ok());

  // 2^64 - 2^32 + 2^32 bytes of payload (2^20 tokens) wraps to 0: it used to pass the bounds
  // check and SIGSEGV the daemon; smaller wraps read below the pool.
  for (uint64_t offset :
       std::vector<uint64_t>{0ull - (1ull << 32), 0ull - 4096, hello->staging_offset - 8}) {
    for (uint32_t n : {1u << 20, 2u}) {
      auto r = client->AppendStaging({session, 1, 64, n}, offset, false);
      INFO(r.status().ToString());
      CHECK(r.status().code() == StatusCode::kInvalidArgument);
      CHECK(r.status().message().find("staging_offset") != std::string::npos);
    }
  }

  // 3 frames of 700 KB under a 1 MiB request limit: each frame passes, the request does not.
  {
    zmq::context_t ctx;
    zmq::socket_t raw(ctx, zmq::socket_type::dealer);
    raw.set(zmq::sockopt::rcvtimeo, 20000);
    raw.set(zmq::sockopt::linger, 0);
    raw.connect(daemon.endpoint());
    ipc::AppendRequest big{
        .session_id = session, .sequence_id = 1, .first_position = 64, .n_tokens = 1};
    big.k = zmq::message_t(700'000);
    big.v = zmq::message_t(700'000);
    StatusOr<ipc::Frames> frames = ipc::Encode(77, ipc::RequestBody(std::move(big)));
    REQUIRE(frames.ok());
    for (size_t i = 0; i < frames->size(); ++i) {
      REQUIRE(raw.send((*frames)[i],
                       i + 1 < frames->size() ? zmq::send_flags::sndmore : zmq::send_flags::none));
    }
    zmq::message_t reply;
    REQUIRE(raw.recv(reply).has_value());
    const std::string text = FrameText(reply);
    INFO(text);
    CHECK(text.find("request: 1400") != std::string::npos);
    CHECK(text.find("server.max_message_bytes") != std::string::npos);
  }

  CHECK(client->Ping(session).ok());
  auto after = client->FetchDense(session, 1, 0, 1, DType::kF32);
  REQUIRE(after.ok());
  CHECK(after->counts == before->counts);
  CHECK(FrameText(after->k) == FrameText(before->k));
  CHECK(FrameText(after->v) == FrameText(before->v));
  auto stats = client->Stats(0, "ipc");
  REQUIRE(stats.ok());
  CHECK(stats->find("rejected_total:1\n") != std::string::npos);
  CHECK(daemon.Stop() == 0);
}

}  // namespace
}  // namespace kvctl
