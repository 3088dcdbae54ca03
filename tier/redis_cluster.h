// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tier/redis_cluster.h
// A client of a real Redis Cluster (docs/tier.md), over hiredis' synchronous API: hash-slot
// routing from CLUSTER SLOTS, MOVED (refresh the slot map and retry) and ASK (ASKING, then the
// command on the importing node, map unchanged) redirects, at most `max_redirects` hops per
// command, pipelining grouped per master, and a bound on every call.
//
// Time bounds: every connect waits at most connect_timeout and every socket read or write at most
// command_timeout (redisConnectWithTimeout + redisSetTimeout). A node that fails (refused, reset,
// timed out) has its connection dropped, is skipped for retry_down_after (calls needing it answer
// UNAVAILABLE at once, naming the first failure) and the slot map is refreshed before the next
// command, so a dead master costs its own slots an UNAVAILABLE answer and little elsewhere.
//
// Errors: connection refused / timeout / reset -> UNAVAILABLE naming host:port and the command;
// -OOM -> RESOURCE_EXHAUSTED; -CLUSTERDOWN, -TRYAGAIN, -LOADING, -MASTERDOWN -> UNAVAILABLE; too
// many redirects -> UNAVAILABLE; anything else unexpected -> INTERNAL with the reply text.
//
// Thread safety: internally synchronized by one mutex held for the whole of each call (callers
// are background threads and request workers; the network is the bottleneck, not the lock).
//
//   ClusterOptions options;
//   options.seeds = {"127.0.0.1:7100", "127.0.0.1:7101"};
//   KVCTL_ASSIGN_OR_RETURN(std::unique_ptr<RedisCluster> cluster, RedisCluster::Connect(options));
//   KVCTL_RETURN_IF_ERROR(cluster->Set("k", bytes, std::chrono::milliseconds(0)));
//   KVCTL_ASSIGN_OR_RETURN(std::optional<std::vector<uint8_t>> value, cluster->Get("k"));
#ifndef KVCTL_TIER_REDIS_CLUSTER_H_
#define KVCTL_TIER_REDIS_CLUSTER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "tier/cluster_protocol.h"

struct redisContext;  // hiredis/hiredis.h

namespace kvctl::tier {

struct ClusterOptions {
  std::vector<std::string> seeds;  // "host:port", at least one.
  std::chrono::milliseconds connect_timeout{200};
  std::chrono::milliseconds command_timeout{1000};
  int max_redirects = 5;  // MOVED/ASK hops per command.
  // After a node fails (refused, reset, timed out), calls that need it answer UNAVAILABLE at once
  // for this long instead of paying another connect or command timeout under the client's one
  // mutex; then the next call tries it again. 0 = try on every call.
  std::chrono::milliseconds retry_down_after{500};
};

struct ClusterCounters {
  uint64_t commands = 0;        // Commands sent (ASKING included), redirected retries included.
  uint64_t errors = 0;          // Commands that ended in a non-OK Status.
  uint64_t moved = 0;           // MOVED replies followed.
  uint64_t ask = 0;             // ASK replies followed.
  uint64_t reconnects = 0;      // Connections opened to a node connected to before.
  uint64_t slot_refreshes = 0;  // Successful CLUSTER SLOTS refreshes (the first one included).
  uint64_t bytes_written = 0;   // Argument bytes of the commands sent.
  uint64_t bytes_read = 0;      // String bytes of the replies received.
};

// One command for Execute: the slot it routes by and its arguments. The viewed bytes must stay
// alive until Execute returns.
struct ClusterCommand {
  uint16_t slot = 0;
  std::vector<std::string_view> args;
};

// One reply of Execute, owning hiredis' reply object. Error replies never get here (Execute
// answers a Status instead).
class ClusterReply {
 public:
  ClusterReply() = default;
  explicit ClusterReply(redisReply* reply);

  bool is_nil() const;
  bool is_string() const;  // A bulk string or a status ("OK").
  bool is_integer() const;
  // REQUIRES: is_string(); the view lives as long as this reply.
  std::string_view str() const;
  // REQUIRES: is_integer().
  long long integer() const;
  // A short description for error messages ("status OK", "integer 3", "nil", ...).
  std::string Describe() const;
  // Inside RedisCluster only: error replies are turned into a Status before a caller sees them.
  bool is_error() const;
  const redisReply* raw() const { return reply_.get(); }

 private:
  struct Free {
    void operator()(redisReply* reply) const;
  };
  std::unique_ptr<redisReply, Free> reply_;
};

class RedisCluster {
 public:
  static constexpr std::chrono::milliseconds kMinRefreshInterval{100};

  // Fetches the slot map (CLUSTER SLOTS) from the first seed that answers. INVALID_ARGUMENT for
  // an empty or malformed seed list or non-positive timeouts; UNAVAILABLE naming every seed tried
  // and why when none answers.
  static StatusOr<std::unique_ptr<RedisCluster>> Connect(const ClusterOptions& options);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // SET key value [PX ttl]; ttl 0 = no expiry.
  Status Set(std::string_view key, std::span<const uint8_t> value, std::chrono::milliseconds ttl);
  // nullopt = no such key.
  StatusOr<std::optional<std::vector<uint8_t>>> Get(std::string_view key);
  // EXISTS per key, pipelined and grouped per master; result[i] is for keys[i].
  StatusOr<std::vector<bool>> Exists(std::span<const std::string> keys);
  // DEL per key, pipelined and grouped per master; absent keys are not an error.
  Status Del(std::span<const std::string> keys);

  // Runs `commands` pipelined: grouped per master by slot, every group sent before any reply is
  // read (so masters work in parallel), redirected commands retried one by one. replies[i]
  // answers commands[i]. The first error of any command is the answer (after every reply has
  // been read, so connections stay in step).
  StatusOr<std::vector<ClusterReply>> Execute(std::span<const ClusterCommand> commands);

  // The master address the slot map names for `slot`, nullopt when none (for tests and tools).
  std::optional<NodeAddress> MasterOf(uint16_t slot) const;
  // Masters in the current slot map.
  std::vector<NodeAddress> Masters() const;
  ClusterCounters counters() const;

 private:
  explicit RedisCluster(ClusterOptions options, std::vector<NodeAddress> seeds);

  // Opens (or reuses) the connection to `node`; UNAVAILABLE naming the node and `what`.
  StatusOr<redisContext*> ConnectionTo(const NodeAddress& node, std::string_view what)
      KVCTL_REQUIRES(mu_);
  // After a failure of `node` (`why`): frees its connection, skips it for retry_down_after and
  // asks for a slot-map refresh.
  void DropConnection(const NodeAddress& node, std::string_view why) KVCTL_REQUIRES(mu_);
  Status RefreshSlots() KVCTL_REQUIRES(mu_);
  // RefreshSlots when a failure asked for it and the last attempt is kMinRefreshInterval old:
  // while a node is down, calls do not each pay a CLUSTER SLOTS. (MOVED refreshes at once.)
  void MaybeRefreshSlots() KVCTL_REQUIRES(mu_);
  void SetSlotOwner(uint16_t slot, const NodeAddress& node) KVCTL_REQUIRES(mu_);
  // One command with the redirect loop: to `ask_target` (ASKING first) when set, else to the
  // slot's master; `hops_used` redirects were already followed for it (in a pipeline).
  StatusOr<ClusterReply> RunOne(const ClusterCommand& command,
                                std::optional<NodeAddress> ask_target, int hops_used)
      KVCTL_REQUIRES(mu_);
  StatusOr<std::vector<ClusterReply>> ExecuteLocked(std::span<const ClusterCommand> commands)
      KVCTL_REQUIRES(mu_);
  // Appends `command` to the context's output buffer.
  Status Append(redisContext* context, const ClusterCommand& command) KVCTL_REQUIRES(mu_);
  // Writes the context's whole output buffer; UNAVAILABLE naming the node on failure.
  Status Flush(redisContext* context, const NodeAddress& node, std::string_view what)
      KVCTL_REQUIRES(mu_);
  // Reads one reply; UNAVAILABLE naming the node on an I/O failure or timeout.
  StatusOr<ClusterReply> ReadReply(redisContext* context, const NodeAddress& node,
                                   std::string_view what) KVCTL_REQUIRES(mu_);
  void CountRead(const redisReply& reply) KVCTL_REQUIRES(mu_);
  // The UNAVAILABLE of a failed socket write or read on `node` (hiredis reports a socket timeout
  // as EAGAIN: then `timed_out`, else `failed` and hiredis' error text), its connection dropped.
  Status SocketFailed(redisContext* context, const NodeAddress& node, std::string_view what,
                      std::string_view timed_out, std::string_view failed) KVCTL_REQUIRES(mu_);

  const ClusterOptions options_;
  const std::vector<NodeAddress> seeds_;

  mutable Mutex mu_;
  std::map<std::string, redisContext*> connections_ KVCTL_GUARDED_BY(mu_);  // "host:port" ->
  std::set<std::string> ever_connected_ KVCTL_GUARDED_BY(mu_);
  struct Down {
    std::chrono::steady_clock::time_point until;
    std::string why;
  };
  std::map<std::string, Down> down_ KVCTL_GUARDED_BY(mu_);  // Failed nodes skipped until `until`.
  std::vector<NodeAddress> masters_ KVCTL_GUARDED_BY(mu_);
  std::vector<uint16_t> slot_master_
      KVCTL_GUARDED_BY(mu_);  // Index into masters_, kNoMaster if none.
  bool refresh_needed_ KVCTL_GUARDED_BY(mu_) = true;
  std::chrono::steady_clock::time_point last_refresh_attempt_ KVCTL_GUARDED_BY(mu_);
  std::string last_refresh_error_ KVCTL_GUARDED_BY(mu_);
  ClusterCounters counters_ KVCTL_GUARDED_BY(mu_);
};

// A short printable form of a key for error messages: quoted, non-printables escaped, long keys
// cut.
std::string QuoteKey(std::string_view key);

}  // namespace kvctl::tier

#endif  // KVCTL_TIER_REDIS_CLUSTER_H_
