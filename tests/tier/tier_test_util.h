// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/tier/tier_test_util.h
// Helpers for the tier tests that need a real Redis Cluster. The shared cluster (3 masters on
// kTierBasePort..+2) is started and stopped by the CTest fixture "tier_cluster"
// (tests/tier/CMakeLists.txt); tests that break a cluster (kill a master, fill it, migrate a slot)
// start their own with ScopedCluster on kTierBasePort + 10 * k, so they never disturb the others.
#ifndef KVCTL_TESTS_TIER_TIER_TEST_UTIL_H_
#define KVCTL_TESTS_TIER_TIER_TEST_UTIL_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tier/redis_cluster.h"

namespace kvctl::tier::testing {

// From CMake: the script, the folder clusters live under, and the shared cluster's first port.
inline constexpr const char* kClusterScript = KVCTL_TIER_CLUSTER_SCRIPT;
inline constexpr const char* kClusterRoot = KVCTL_TIER_CLUSTER_ROOT;
inline constexpr int kTierBasePort = KVCTL_TIER_BASE_PORT;

// A 3-master cluster of this test's own, started in the constructor (REQUIRE that it starts)
// and stopped in the destructor; a killed test's leftovers are cleared by the next start or by
// the fixture's cleanup.
class ScopedCluster {
 public:
  ScopedCluster(const std::string& name, int base_port, int masters = 3);
  ~ScopedCluster();
  int base_port() const { return base_port_; }
  std::string dir() const { return dir_; }
  std::vector<std::string> seeds() const;
  // The pid of the redis-server on `port` (from its pid file).
  int PidOf(int port) const;

 private:
  std::string dir_;
  int base_port_;
  int masters_;
};

std::vector<std::string> SeedsFor(int base_port, int masters = 3);
// A connected client; REQUIREs success.
std::unique_ptr<RedisCluster> ConnectOrDie(
    const std::vector<std::string>& seeds,
    std::chrono::milliseconds command_timeout = std::chrono::milliseconds(1000));
// One admin command on one node (no cluster routing), reply as text: status/string as is,
// integers in decimal, nil as "(nil)", errors as "ERR: ...". REQUIREs the node answered.
std::string Admin(int port, const std::vector<std::string>& args);
// A prefix unique to this test run, so tests sharing the cluster never see each other's keys.
std::string UniquePrefix(const std::string& test);

}  // namespace kvctl::tier::testing

#endif  // KVCTL_TESTS_TIER_TIER_TEST_UTIL_H_
