// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// HelperThread: every part runs exactly once; an idle helper takes parts on its own thread, a
// busy one leaves a job to its caller; many callers at once. Waits are on conditions with generous
// bounds, never on wall-clock expectations. Catch2's assertions are not thread-safe, so other
// threads only record what they saw.
#include "controller/service/helper_thread.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

namespace kvctl {
namespace {

// Spins (yielding) until `flag` is set or about a minute has passed; false on the latter.
bool WaitFor(const std::atomic<bool>& flag) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST_CASE("HelperThread: an idle helper runs parts on its own thread", "[controller][threads]") {
  HelperThread helper;
  const std::thread::id caller = std::this_thread::get_id();
  // Each part waits until the other has started: both run at once, so on two threads.
  std::atomic<bool> started[2] = {false, false};
  std::thread::id ran_on[2];
  std::atomic<bool> waits_ok{true};
  helper.RunShared(2, [&](size_t part) {
    ran_on[part] = std::this_thread::get_id();
    started[part] = true;
    waits_ok = waits_ok && WaitFor(started[1 - part]);
  });
  REQUIRE(waits_ok);
  CHECK(ran_on[0] != ran_on[1]);
  CHECK((ran_on[0] == caller || ran_on[1] == caller));
  CHECK(helper.counters().helper_parts == 1);
  CHECK(helper.counters().jobs_alone == 0);
  // One part: no hand-off at all.
  std::thread::id only_on;
  helper.RunShared(1, [&](size_t) { only_on = std::this_thread::get_id(); });
  CHECK(only_on == caller);
  helper.RunShared(0, [&](size_t) { FAIL("no part to run"); });
}

TEST_CASE("HelperThread: a busy helper leaves the whole job to its caller",
          "[controller][threads]") {
  HelperThread helper;
  std::atomic<bool> a_helper_inside{false}, release_a{false}, a_waits_ok{true};
  const std::thread::id main_id = std::this_thread::get_id();
  std::thread a([&] {
    const std::thread::id a_id = std::this_thread::get_id();
    helper.RunShared(2, [&](size_t) {
      if (std::this_thread::get_id() == a_id) {
        a_waits_ok = a_waits_ok && WaitFor(a_helper_inside);  // The helper takes the other.
      } else {
        a_helper_inside = true;
        a_waits_ok = a_waits_ok && WaitFor(release_a);
      }
    });
  });
  REQUIRE(WaitFor(a_helper_inside));  // The helper is inside a's job.
  std::vector<std::thread::id> ran_on(5);
  helper.RunShared(5, [&](size_t part) { ran_on[part] = std::this_thread::get_id(); });
  for (const std::thread::id& id : ran_on) CHECK(id == main_id);
  CHECK(helper.counters().jobs_alone == 1);
  release_a = true;
  a.join();
  CHECK(a_waits_ok);
  CHECK(helper.counters().helper_parts == 1);
}

TEST_CASE("HelperThread: many callers at once, every part exactly once", "[controller][threads]") {
  HelperThread helper;
  constexpr int kThreads = 4, kCalls = 200, kParts = 7;
  std::vector<std::atomic<int>> runs(kThreads * kCalls * kParts);
  std::atomic<int> unfinished{0};  // Calls that returned before all their parts were done.
  std::vector<std::thread> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      for (int c = 0; c < kCalls; ++c) {
        const int first = (t * kCalls + c) * kParts;
        helper.RunShared(kParts, [&](size_t part) { runs[first + part].fetch_add(1); });
        for (int p = 0; p < kParts; ++p) {
          if (runs[first + p].load() != 1) unfinished.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  CHECK(unfinished.load() == 0);
  for (size_t i = 0; i < runs.size(); ++i) {
    INFO("part " << i);
    REQUIRE(runs[i].load() == 1);
  }
}

}  // namespace
}  // namespace kvctl
