// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tests/tier/tier_test_util.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>

#include "common/secure_random.h"

namespace kvctl::tier::testing {

std::vector<std::string> SeedsFor(int base_port, int masters) {
  std::vector<std::string> seeds;
  for (int i = 0; i < masters; ++i) seeds.push_back("127.0.0.1:" + std::to_string(base_port + i));
  return seeds;
}

ScopedCluster::ScopedCluster(const std::string& name, int base_port, int masters, int replicas)
    : dir_(std::string(kClusterRoot).append("/").append(name)),
      base_port_(base_port),
      masters_(masters) {
  // append(), not operator+ on temporaries: g++ 12 gives a false -Warray-bounds in that inlined
  // chain when <string> comes from the precompiled header.
  const std::string command = std::string("bash ")
                                  .append(kClusterScript)
                                  .append(" start ")
                                  .append(dir_)
                                  .append(" " + std::to_string(base_port))
                                  .append(" " + std::to_string(masters))
                                  .append(" " + std::to_string(replicas))
                                  .append(" >/dev/null");
  INFO(command);
  REQUIRE(std::system(command.c_str()) == 0);
}

ScopedCluster::~ScopedCluster() {
  const std::string command =
      std::string("bash ").append(kClusterScript).append(" stop ").append(dir_);
  if (std::system(command.c_str()) != 0) WARN("could not stop the cluster in " << dir_);
}

std::vector<std::string> ScopedCluster::seeds() const { return SeedsFor(base_port_, masters_); }

int ScopedCluster::PidOf(int port) const {
  std::ifstream in(dir_ + "/node-" + std::to_string(port) + "/redis.pid");
  int pid = 0;
  in >> pid;
  REQUIRE(pid > 0);
  return pid;
}

std::unique_ptr<RedisCluster> ConnectOrDie(const std::vector<std::string>& seeds,
                                           std::chrono::milliseconds command_timeout) {
  ClusterOptions options;
  options.seeds = seeds;
  options.command_timeout = command_timeout;
  auto cluster = RedisCluster::Connect(options);
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  return std::move(cluster).value();
}

std::string Admin(int port, const std::vector<std::string>& args) {
  const timeval timeout{5, 0};
  redisContext* context = redisConnectWithTimeout("127.0.0.1", port, timeout);
  REQUIRE(context != nullptr);
  INFO("admin connection to port " << port << ": " << context->errstr);
  REQUIRE(context->err == 0);
  redisSetTimeout(context, timeout);
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const std::string& arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  auto* reply = static_cast<redisReply*>(
      redisCommandArgv(context, static_cast<int>(argv.size()), argv.data(), lengths.data()));
  INFO("admin command on port " << port << ": " << context->errstr);
  REQUIRE(reply != nullptr);
  std::string text;
  switch (reply->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      text.assign(reply->str, reply->len);
      break;
    case REDIS_REPLY_INTEGER:
      text = std::to_string(reply->integer);
      break;
    case REDIS_REPLY_NIL:
      text = "(nil)";
      break;
    case REDIS_REPLY_ERROR:
      text = "ERR: " + std::string(reply->str, reply->len);
      break;
    default:
      text = "(array)";
      break;
  }
  freeReplyObject(reply);
  redisFree(context);
  return text;
}

std::string UniquePrefix(const std::string& test) {
  static constexpr char kHex[] = "0123456789abcdef";
  uint64_t r = SecureRandomU64();
  std::string tag;
  for (int i = 0; i < 8; ++i, r >>= 4) tag += kHex[r & 0xF];
  return "t/" + test + "/" + std::to_string(getpid()) + "-" + tag + "/";
}

}  // namespace kvctl::tier::testing
