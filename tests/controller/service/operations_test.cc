// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// What operators read from a real Controller: a Prometheus HELP sentence for every family its
// STATS report renders to, the STATS "config" section, and the changes a reload reports.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/half.h"
#include "controller/service/controller.h"
#include "controller/stats/metrics.h"
#include "tests/controller/service/service_test_util.h"

namespace kvctl {
namespace {

using Clock = std::chrono::steady_clock;

Config SmallConfig(const std::string& tag) {
  Config c;
  c.pool.shm_name = "/kvctl-ops-" + std::to_string(getpid()) + "-" + tag;
  c.pool.bytes = 16ull << 20;
  c.pool.page_bytes = 16 << 10;
  c.pool.staging_slots = 0;
  c.quant.method = QuantMethod::kKivi;
  c.server.stats_endpoint = "";
  return c;
}

std::unique_ptr<Controller> Make(const Config& c) { return testing::MakeController(c); }

size_t Words(const std::string& s) {
  std::istringstream in(s);
  size_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

TEST_CASE("Operations: every family of a real STATS report has a HELP sentence",
          "[controller][operations]") {
  std::unique_ptr<Controller> c = Make(SmallConfig("help"));
  c->SetServerInfo("ipc:///tmp/kvctl-ops-test.sock", [] { return ipc::ServerCounters{}; });
  c->SetHttpAddress("127.0.0.1:9464");
  // One sequence with quantized records, so every per-sequence, per-layer and per-head key shows.
  ipc::HelloRequest hello{.client_name = "ops", .geometry = {2, 2, 0, 64, DType::kF16}};
  StatusOr<ipc::HelloReply> h = c->Hello(hello, Clock::now());
  REQUIRE(h.ok());
  REQUIRE(c->Open({h->session_id, 1}, Clock::now()).ok());
  const uint32_t n = 256;
  std::vector<uint16_t> rows(size_t{2} * n * 2 * 64);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = FloatToHalf(float(i % 89) / 89.f - 0.5f);
  ipc::AppendRequest a{.session_id = h->session_id, .sequence_id = 1, .n_tokens = n};
  a.k = zmq::message_t(rows.data(), rows.size() * 2);
  a.v = zmq::message_t(rows.data(), rows.size() * 2);
  REQUIRE(c->Append(a, Clock::now()).ok());
  for (uint16_t type = 1; type <= 8; ++type)
    c->RecordRequest(type, std::chrono::microseconds(9), false);

  StatusOr<std::string> text = c->Stats({}, Clock::now());
  REQUIRE(text.ok());
  const std::string metrics = RenderPrometheus(*text);
  std::istringstream lines(metrics);
  size_t families = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) != 0) continue;
    ++families;
    const size_t space = line.find(' ', 7);
    const std::string name = line.substr(7, space - 7), help = line.substr(space + 1);
    INFO(line);
    CHECK(MetricHelp(name) == help);  // Not the renderer's placeholder.
    CHECK(help != name);
    CHECK(Words(help) >= 4);
    CHECK(help.back() == '.');
  }
  // Server, pool, sequences, layers, heads, policy, ipc (8 per-type x 5) and quality families.
  CHECK(families >= 100);
  CHECK(
      metrics.find("# HELP kvctl_pages_used Pool pages allocated to sequences now, in pages.\n") !=
      std::string::npos);
  CHECK(metrics.find("# HELP kvctl_append_latency_p99_us APPEND 99th percentile handling time") !=
        std::string::npos);
}

TEST_CASE("Operations: STATS section \"config\" is the effective config, only on request",
          "[controller][operations]") {
  Config config = SmallConfig("cfg");
  config.quant.k_bits = 4;
  config.sources["quant.k_bits"] = ConfigSource::kEnv;
  std::unique_ptr<Controller> c = Make(config);
  StatusOr<std::string> text = c->Stats({.section = "Config"}, Clock::now());
  REQUIRE(text.ok());
  CHECK(text->rfind("# Config\n# kvctl effective configuration.", 0) == 0);
  CHECK(text->find("\nk_bits = 4") != std::string::npos);
  // It loads back as the same config: the header line is a TOML comment.
  Config back;
  REQUIRE(ApplyToml(back, *text, "stats-config").ok());
  CHECK(back == config);
  // Not part of the full report (the PUB stream, /metrics and kvtop are unchanged).
  StatusOr<std::string> all = c->Stats({}, Clock::now());
  REQUIRE(all.ok());
  CHECK(all->find("# Config") == std::string::npos);
  CHECK(all->find("k_bits = ") == std::string::npos);
  StatusOr<std::string> bad = c->Stats({.section = "configs"}, Clock::now());
  CHECK(bad.status().message() ==
        "section: got \"configs\", expected empty or one of server, pool, sequences, layers, "
        "heads, policy, ipc, quality, tier, config");
}

TEST_CASE("Operations: Reload reports each change, and applies none when one needs a restart",
          "[controller][operations]") {
  const Config old = SmallConfig("reload");
  std::unique_ptr<Controller> c = Make(old);
  Config neu = old;
  neu.quant.k_bits = 4;
  std::vector<ConfigChange> changes;
  REQUIRE(c->Reload(neu, &changes).ok());
  REQUIRE(changes.size() == 1);
  CHECK(changes[0] ==
        ConfigChange{"quant.k_bits", "2", "4", false, "applies to sequences opened from now"});
  REQUIRE(c->Reload(neu, &changes).ok());
  CHECK(changes.empty());

  Config bigger = neu;
  bigger.pool.bytes = 32ull << 20;
  bigger.quant.k_bits = 8;
  const Status s = c->Reload(bigger, &changes);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  REQUIRE(changes.size() == 2);
  CHECK(changes[0] == ConfigChange{"pool.bytes", "\"16MiB\"", "\"32MiB\"", true, ""});
  CHECK(changes[1].key == "quant.k_bits");
  CHECK(c->config().quant.k_bits == 4);  // Nothing applied.
}

}  // namespace
}  // namespace kvctl
