// Integration tests of session lifetimes and restarts with the real kvctl daemon process: BYE,
// lease renewal by any request, kill -9 then the same start command, and the stats endpoint's
// bind rules.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "tests/integration/daemon_process.h"

namespace kvctl {
namespace {

using testing::DaemonProcess;

constexpr const char* kPool = "bytes = \"64MiB\"\npage_bytes = \"16KiB\"\n";
constexpr int kLayers = 2, kHeads = 2, kDim = 64;

std::span<const std::byte> AsBytes(const std::vector<float>& x) {
  return {reinterpret_cast<const std::byte*>(x.data()), x.size() * sizeof(float)};
}

// One integer field of a STATS section (monitoring view: session 0 renews no lease).
int64_t StatsField(ipc::Client& client, const std::string& section, const std::string& field) {
  StatusOr<std::string> text = client.Stats(0, section);
  REQUIRE(text.ok());
  const std::string key = "\n" + field + ":";
  const size_t at = text->find(key);
  INFO(*text);
  REQUIRE(at != std::string::npos);
  return std::stoll(text->substr(at + key.size()));
}

struct Engine {
  std::unique_ptr<ipc::Client> client;
  uint64_t session = 0;
  uint64_t tokens = 0;  // Appended to sequence 1.
};

// HELLO, OPEN sequence 1 (and 2 when `two`), `tokens` tokens appended to each.
Engine Attach(DaemonProcess& daemon, const std::string& name, int tokens, bool two = false,
              int timeout_ms = 5000) {
  Engine e{daemon.Connect(timeout_ms)};
  auto hello =
      e.client->Hello({.client_name = name, .geometry = {kLayers, kHeads, 0, kDim, DType::kF32}});
  INFO(hello.status().ToString());
  REQUIRE(hello.ok());
  e.session = hello->session_id;
  for (uint64_t seq : two ? std::vector<uint64_t>{1, 2} : std::vector<uint64_t>{1}) {
    REQUIRE(e.client->Open(e.session, seq).ok());
    std::vector<float> k(static_cast<size_t>(kLayers) * tokens * kHeads * kDim, 0.25f), v = k;
    auto r = e.client->AppendInline({e.session, seq, 0, static_cast<uint32_t>(tokens)}, AsBytes(k),
                                    AsBytes(v));
    INFO(r.status().ToString());
    REQUIRE(r.ok());
  }
  e.tokens = static_cast<uint64_t>(tokens);
  return e;
}

// A request naming a session the daemon does not have: NOT_FOUND whose message starts with the
// field, so clients can tell a lost session from a missing sequence (PROTOCOL.md section 3).
void CheckSessionGone(const Status& s) {
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.message().rfind("session_id:", 0) == 0);
}

TEST_CASE("Daemon: BYE frees the session's pages and slot at once, its id is then unknown",
          "[integration][session]") {
  DaemonProcess daemon(kPool, "lease_ms = 600000\n");  // No lease could free anything here.
  auto monitor = daemon.Connect();
  Engine gone = Attach(daemon, "gone", 300, /*two=*/true);
  Engine stays = Attach(daemon, "stays", 100);
  const int64_t used_all = StatsField(*monitor, "pool", "bytes_used");
  CHECK(StatsField(*monitor, "pool", "staging_slots_used") == 2);

  auto bye = gone.client->Bye(gone.session);
  INFO(bye.status().ToString());
  REQUIRE(bye.ok());
  CHECK(bye->sequences_closed == 2);
  CHECK(bye->bytes_freed > 0);
  // Freed at once, not when a lease runs out: the other session's pages are all that is left.
  CHECK(StatsField(*monitor, "pool", "bytes_used") ==
        used_all - static_cast<int64_t>(bye->bytes_freed));
  CHECK(StatsField(*monitor, "pool", "staging_slots_used") == 1);
  CHECK(StatsField(*monitor, "sequences", "sessions") == 1);
  CHECK(StatsField(*monitor, "sequences", "sequences") == 1);
  CHECK(StatsField(*monitor, "sequences", "sessions_ended_total") == 1);
  CHECK(StatsField(*monitor, "sequences", "sessions_expired_total") == 0);

  CheckSessionGone(gone.client->Ping(gone.session).status());
  CheckSessionGone(gone.client->FetchDense(gone.session, 1, 0, kLayers).status());
  CheckSessionGone(gone.client->Open(gone.session, 3).status());
  CheckSessionGone(gone.client->Bye(gone.session).status());  // A second BYE: nothing to end.
  CHECK(StatsField(*monitor, "sequences", "sessions_ended_total") == 1);

  // The other session is untouched; BYE of it frees the rest.
  auto kept = stays.client->FetchDense(stays.session, 1, 0, kLayers, DType::kF32);
  REQUIRE(kept.ok());
  CHECK(kept->counts[0] == 100);
  auto bye2 = stays.client->Bye(stays.session);
  REQUIRE(bye2.ok());
  CHECK(bye2->sequences_closed == 1);
  CHECK(StatsField(*monitor, "pool", "bytes_used") == 0);
  CHECK(StatsField(*monitor, "pool", "staging_slots_used") == 0);
  CHECK(StatsField(*monitor, "sequences", "sessions_ended_total") == 2);
  // A new session of the same client works.
  CHECK(Attach(daemon, "again", 10).session != 0);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("Daemon: BYE while the session's APPENDs and FETCHes run frees every page",
          "[integration][session]") {
  DaemonProcess daemon(kPool, "lease_ms = 600000\n");
  auto monitor = daemon.Connect();
  for (int round = 0; round < 5; ++round) {
    Engine owner = Attach(daemon, "busy", 64, /*two=*/true);
    std::atomic<int> calls{0};
    std::vector<Status> ended(3);
    std::vector<std::thread> threads;
    // Two appenders (one per sequence) and a fetcher, each with its own socket, same session.
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        auto client = daemon.Connect();
        std::vector<float> row(static_cast<size_t>(kLayers) * kHeads * kDim, 0.5f);
        for (uint64_t pos = 64;; ++pos) {
          Status s = t < 2
                         ? client
                               ->AppendInline({owner.session, static_cast<uint64_t>(t + 1), pos, 1},
                                              AsBytes(row), AsBytes(row))
                               .status()
                         : client->FetchDense(owner.session, 1, 0, kLayers).status();
          if (!s.ok()) {
            ended[t] = s;
            return;
          }
          ++calls;
        }
      });
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (calls < 30 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    auto bye = owner.client->Bye(owner.session);
    for (std::thread& t : threads) t.join();
    INFO(bye.status().ToString());
    REQUIRE(bye.ok());
    CHECK(bye->sequences_closed == 2);
    for (const Status& s : ended) {
      INFO(s.ToString());
      // Stopped by the BYE: the session is unknown, or the sequence was retired under the call.
      CHECK(s.code() == StatusCode::kNotFound);
    }
    CHECK(StatsField(*monitor, "pool", "pages_used") == 0);
    CHECK(StatsField(*monitor, "pool", "staging_slots_used") == 0);
    CHECK(StatsField(*monitor, "sequences", "sessions") == 0);
  }
  CHECK(StatsField(*monitor, "sequences", "sessions_ended_total") == 5);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("Daemon: APPEND-only and FETCH-only clients keep their lease, a silent one expires",
          "[integration][session]") {
  DaemonProcess daemon(kPool, "lease_ms = 1000\n");
  auto monitor = daemon.Connect();
  Engine appender = Attach(daemon, "appender", 8);
  Engine fetcher = Attach(daemon, "fetcher", 8);
  // Set up last: when this one expires, a whole lease has passed since the two busy clients
  // sent anything but APPEND and FETCH.
  Engine silent = Attach(daemon, "silent", 8);
  std::vector<float> row(static_cast<size_t>(kLayers) * kHeads * kDim, 1.0f);
  int appends = 0, fetches = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (StatsField(*monitor, "sequences", "sessions_expired_total") == 0) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    auto a = appender.client->AppendInline({appender.session, 1, appender.tokens, 1}, AsBytes(row),
                                           AsBytes(row));
    INFO(a.status().ToString());
    REQUIRE(a.ok());
    ++appender.tokens;
    ++appends;
    auto f = fetcher.client->FetchDense(fetcher.session, 1, 0, 1);
    INFO(f.status().ToString());
    REQUIRE(f.ok());
    ++fetches;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(StatsField(*monitor, "sequences", "sessions_expired_total") == 1);
  CHECK(StatsField(*monitor, "sequences", "sessions") == 2);
  CheckSessionGone(silent.client->Ping(silent.session).status());
  CHECK(appender.client->FetchDense(appender.session, 1, 0, 1)->counts[0] == appender.tokens);
  CHECK(fetcher.client->Ping(fetcher.session).ok());
  std::printf("lease renewal: %d APPENDs and %d FETCHes kept two sessions alive\n", appends,
              fetches);
  CHECK(daemon.Stop() == 0);
}

// kill -9 with clients attached (open sequences with data, staging slots held), then the same
// start command: it must serve with no operator step. Returns the seconds to the first PING.
double KillAndRestart(DaemonProcess& daemon, std::vector<Engine>& engines) {
  CHECK(daemon.Stop(SIGKILL) == 128 + SIGKILL);
  struct stat st;
  // What the dead daemon left: the pool object, the request socket and the stats socket.
  CHECK(stat(("/dev/shm" + daemon.shm_name()).c_str(), &st) == 0);
  CHECK(stat(daemon.socket_path().c_str(), &st) == 0);
  CHECK(stat(daemon.stats_socket_path().c_str(), &st) == 0);
  // While it is down, a client gets a clear error, not a hang.
  engines[0].client->set_timeout_ms(300);
  CHECK(engines[0].client->Ping(engines[0].session).status().code() ==
        StatusCode::kDeadlineExceeded);
  engines[0].client->set_timeout_ms(5000);
  return daemon.Start();
}

TEST_CASE("Daemon: after kill -9 the same start command serves, clients reconnect",
          "[integration][session]") {
  DaemonProcess daemon(kPool);
  auto monitor = daemon.Connect();
  std::vector<Engine> engines;
  for (int i = 0; i < 3; ++i)
    engines.push_back(Attach(daemon, std::string("e").append(std::to_string(i)), 200));
  for (int round = 0; round < 3; ++round) {
    const double seconds = KillAndRestart(daemon, engines);
    std::printf("restart after kill -9, round %d: first PING after %.3f s\n", round, seconds);
    for (Engine& e : engines) {
      // The old session is gone (named error), a new one works on the same client.
      CheckSessionGone(e.client->FetchDense(e.session, 1, 0, kLayers).status());
      e = Attach(daemon, "re", 50);
      auto f = e.client->FetchDense(e.session, 1, 0, kLayers, DType::kF32);
      REQUIRE(f.ok());
      CHECK(f->counts[0] == 50);
    }
    CHECK(StatsField(*monitor, "sequences", "sessions") == 3);
    CHECK(StatsField(*monitor, "pool", "staging_slots_used") == 3);
    // The stats publisher of the new daemon is live on the same path.
    CHECK(DaemonProcess::Listening(daemon.stats_socket_path()));
  }
  CHECK(daemon.Stop() == 0);
  struct stat st;
  CHECK(stat(daemon.stats_socket_path().c_str(), &st) != 0);
  CHECK(stat(("/dev/shm" + daemon.shm_name()).c_str(), &st) != 0);
}

// The figures of docs/reliability.md "Restart after a crash": rounds of kill -9 (leftovers to
// clear) alternate with rounds of a clean SIGTERM stop (nothing left), so both see the same load.
//   build/tests/integration_test "[.restart-bench]"
TEST_CASE("Daemon: restart-after-kill-9 time (benchmark)", "[.restart-bench]") {
  DaemonProcess daemon("bytes = \"256MiB\"\n");
  std::vector<Engine> engines;
  for (int i = 0; i < 4; ++i) {
    engines.push_back(Attach(daemon, std::string("e").append(std::to_string(i)), 512));
  }
  std::vector<double> killed_ms, clean_ms;
  for (int round = 0; round < 40; ++round) {
    if (round % 2 == 0) {
      killed_ms.push_back(KillAndRestart(daemon, engines) * 1000);
    } else {
      REQUIRE(daemon.Stop(SIGTERM) == 0);
      clean_ms.push_back(daemon.Start() * 1000);
    }
    for (Engine& e : engines) e = Attach(daemon, "e", 512);
  }
  for (auto* ms : {&killed_ms, &clean_ms}) {
    std::sort(ms->begin(), ms->end());
    std::printf(
        "start to first PING, %s, %zu rounds (4 clients, 256 MiB pool): min %.1f ms, "
        "median %.1f ms, max %.1f ms\n",
        ms == &killed_ms ? "after kill -9" : "after a clean stop", ms->size(), ms->front(),
        (*ms)[ms->size() / 2], ms->back());
  }
  CHECK(daemon.Stop() == 0);
}

// Receives one stats message on `path` (waits up to 30 s); true when one came.
bool StatsArrive(const std::string& path) {
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::subscribe, "stats");
  sub.set(zmq::sockopt::rcvtimeo, 30000);
  sub.connect("ipc://" + path);
  zmq::message_t topic;
  return sub.recv(topic).has_value() && topic.to_string() == "stats";
}

TEST_CASE("Daemon: the stats endpoint takes only loopback TCP, parsed exactly",
          "[integration][session]") {
  for (const char* bad : {"tcp://127.0.0.1:1;0.0.0.0:5655", "tcp://0.0.0.0:5655", "tcp://*:5655",
                          "tcp://10.0.0.1:5655", "tcp://127.0.0.1.evil:5655"}) {
    INFO(bad);
    DaemonProcess refused(kPool, std::string("stats_endpoint = \"") + bad + "\"\n", "bad",
                          /*start=*/false);
    CHECK(refused.RunToExit() == 1);
    struct stat st;
    CHECK(stat(refused.socket_path().c_str(), &st) != 0);  // It cleaned up after itself.
    CHECK(stat(("/dev/shm" + refused.shm_name()).c_str(), &st) != 0);
  }
  DaemonProcess loopback(kPool, "stats_endpoint = \"tcp://127.0.0.1:*\"\n", "tcp");
  CHECK(loopback.Stop() == 0);
}

TEST_CASE("Daemon: a live stats socket is never taken over or removed by another daemon",
          "[integration][session]") {
  DaemonProcess first(kPool);
  const std::string path = first.stats_socket_path();
  struct stat before {};
  REQUIRE(stat(path.c_str(), &before) == 0);
  const std::string same = "stats_endpoint = \"ipc://" + path + "\"\n";
  {
    DaemonProcess second(kPool, same, "second", /*start=*/false);
    CHECK(second.RunToExit() == 1);
  }
  struct stat after {};
  REQUIRE(stat(path.c_str(), &after) == 0);
  CHECK(after.st_ino == before.st_ino);
  CHECK(StatsArrive(path));

  // The file is replaced behind the first daemon's back (an operator removed it, a third daemon
  // bound the path): when the first one stops it removes only its own file, not the new one.
  REQUIRE(unlink(path.c_str()) == 0);
  DaemonProcess third(kPool, same, "third");
  struct stat third_st {};
  REQUIRE(stat(path.c_str(), &third_st) == 0);
  CHECK(first.Stop() == 0);
  struct stat left {};
  REQUIRE(stat(path.c_str(), &left) == 0);
  CHECK(left.st_ino == third_st.st_ino);
  CHECK(StatsArrive(path));
  CHECK(third.Stop() == 0);
  CHECK(stat(path.c_str(), &left) != 0);
}

}  // namespace
}  // namespace kvctl
