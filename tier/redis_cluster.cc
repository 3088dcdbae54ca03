// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tier/redis_cluster.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace kvctl::tier {
namespace {

constexpr uint16_t kNoMaster = 0xFFFF;

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

// What a command is, for error messages: "SET 'key'".
std::string Describe(const ClusterCommand& command) {
  if (command.args.empty()) return "(empty command)";
  std::string text(command.args[0]);
  if (command.args.size() > 1) {
    text.push_back(' ');
    text.append(QuoteKey(command.args[1]));
  }
  return text;
}

std::string OnNode(std::string_view what, const NodeAddress& node) {
  return std::string(what) + " on " + node.ToString();
}

}  // namespace

std::string QuoteKey(std::string_view key) {
  constexpr size_t kMaxShown = 80;
  std::string out = "'";
  for (size_t i = 0; i < key.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7F && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    }
  }
  if (key.size() > kMaxShown) out += "...";
  return out + "'";
}

// ---------------------------------------------------------------------------------------------
// ClusterReply

ClusterReply::ClusterReply(redisReply* reply) : reply_(reply) {}

void ClusterReply::Free::operator()(redisReply* reply) const { freeReplyObject(reply); }

bool ClusterReply::is_nil() const { return reply_ == nullptr || reply_->type == REDIS_REPLY_NIL; }
bool ClusterReply::is_string() const {
  return reply_ != nullptr &&
         (reply_->type == REDIS_REPLY_STRING || reply_->type == REDIS_REPLY_STATUS);
}
bool ClusterReply::is_integer() const {
  return reply_ != nullptr && reply_->type == REDIS_REPLY_INTEGER;
}
std::string_view ClusterReply::str() const {
  return reply_->str == nullptr ? std::string_view() : std::string_view(reply_->str, reply_->len);
}
long long ClusterReply::integer() const { return reply_->integer; }
bool ClusterReply::is_error() const {
  return reply_ != nullptr && reply_->type == REDIS_REPLY_ERROR;
}

std::string ClusterReply::Describe() const {
  if (is_nil()) return "nil";
  switch (reply_->type) {
    case REDIS_REPLY_STATUS:
      return "status " + std::string(str());
    case REDIS_REPLY_STRING:
      return "string of " + std::to_string(reply_->len) + " bytes";
    case REDIS_REPLY_INTEGER:
      return "integer " + std::to_string(reply_->integer);
    case REDIS_REPLY_ARRAY:
      return "array of " + std::to_string(reply_->elements);
    default:
      return "reply type " + std::to_string(reply_->type);
  }
}

// ---------------------------------------------------------------------------------------------
// RedisCluster: construction and connections

StatusOr<std::unique_ptr<RedisCluster>> RedisCluster::Connect(const ClusterOptions& options) {
  if (options.seeds.empty()) {
    return InvalidArgument("seeds: got an empty list, expected at least one host:port");
  }
  if (options.connect_timeout.count() <= 0 || options.command_timeout.count() <= 0) {
    return InvalidArgument("connect_timeout / command_timeout: got ",
                           options.connect_timeout.count(), " / ", options.command_timeout.count(),
                           " ms, expected both > 0");
  }
  if (options.retry_down_after.count() < 0) {
    return InvalidArgument("retry_down_after: got ", options.retry_down_after.count(),
                           " ms, expected >= 0 (0 = retry a failed node on the next call)");
  }
  if (options.max_redirects < 0) {
    return InvalidArgument("max_redirects: got ", options.max_redirects, ", expected >= 0");
  }
  std::vector<NodeAddress> seeds;
  for (size_t i = 0; i < options.seeds.size(); ++i) {
    KVCTL_ASSIGN_OR_RETURN(NodeAddress seed,
                           ParseNodeAddress(options.seeds[i], "seeds[" + std::to_string(i) + "]"));
    seeds.push_back(std::move(seed));
  }
  std::unique_ptr<RedisCluster> cluster(new RedisCluster(options, std::move(seeds)));
  {
    MutexLock lock(&cluster->mu_);
    KVCTL_RETURN_IF_ERROR(cluster->RefreshSlots());
  }
  return cluster;
}

RedisCluster::RedisCluster(ClusterOptions options, std::vector<NodeAddress> seeds)
    : options_(std::move(options)), seeds_(std::move(seeds)) {
  MutexLock lock(&mu_);
  slot_master_.assign(kSlotCount, kNoMaster);
}

RedisCluster::~RedisCluster() {
  MutexLock lock(&mu_);
  for (auto& [name, context] : connections_) redisFree(context);
}

StatusOr<redisContext*> RedisCluster::ConnectionTo(const NodeAddress& node, std::string_view what) {
  const std::string name = node.ToString();
  if (auto it = connections_.find(name); it != connections_.end()) return it->second;
  const auto now = std::chrono::steady_clock::now();
  if (auto it = down_.find(name); it != down_.end()) {
    if (now < it->second.until) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(it->second.until - now);
      // A replica may have taken over its slots by now: look again (at most every
      // kMinRefreshInterval).
      refresh_needed_ = true;
      return Unavailable(what, ": ", name, " is skipped for another ", left.count(),
                         " ms after it failed: ", it->second.why);
    }
    down_.erase(it);
  }
  redisContext* context =
      redisConnectWithTimeout(node.host.c_str(), node.port, ToTimeval(options_.connect_timeout));
  if (context == nullptr || context->err != 0) {
    const std::string why = context == nullptr ? "out of memory" : context->errstr;
    if (context != nullptr) redisFree(context);
    Status status = Unavailable(what, ": cannot connect to ", name, " (", why, ", connect timeout ",
                                options_.connect_timeout.count(), " ms)");
    DropConnection(node, status.message());
    return status;
  }
  if (redisSetTimeout(context, ToTimeval(options_.command_timeout)) != REDIS_OK) {
    const std::string why = context->errstr;
    redisFree(context);
    return Unavailable(what, ": cannot set the command timeout on ", name, " (", why, ")");
  }
  if (!ever_connected_.insert(name).second) ++counters_.reconnects;
  connections_[name] = context;
  return context;
}

void RedisCluster::DropConnection(const NodeAddress& node, std::string_view why) {
  const std::string name = node.ToString();
  if (auto it = connections_.find(name); it != connections_.end()) {
    redisFree(it->second);
    connections_.erase(it);
  }
  if (options_.retry_down_after.count() > 0) {
    down_[name] =
        Down{std::chrono::steady_clock::now() + options_.retry_down_after, std::string(why)};
  }
  refresh_needed_ = true;
}

Status RedisCluster::Flush(redisContext* context, const NodeAddress& node, std::string_view what) {
  int done = 0;
  while (!done) {
    if (redisBufferWrite(context, &done) != REDIS_OK) {
      return SocketFailed(context, node, what, ": write timed out after ", ": write failed (");
    }
  }
  return OkStatus();
}

StatusOr<ClusterReply> RedisCluster::ReadReply(redisContext* context, const NodeAddress& node,
                                               std::string_view what) {
  void* raw = nullptr;
  errno = 0;
  if (redisGetReply(context, &raw) != REDIS_OK || raw == nullptr) {
    return SocketFailed(context, node, what, ": no reply within the command timeout of ",
                        ": connection failed (");
  }
  redisReply* reply = static_cast<redisReply*>(raw);
  CountRead(*reply);
  return ClusterReply(reply);
}

Status RedisCluster::SocketFailed(redisContext* context, const NodeAddress& node,
                                  std::string_view what, std::string_view timed_out,
                                  std::string_view failed) {
  const bool is_timeout = errno == EAGAIN || errno == EWOULDBLOCK;
  Status status = is_timeout ? Unavailable(OnNode(what, node), timed_out,
                                           options_.command_timeout.count(), " ms")
                             : Unavailable(OnNode(what, node), failed, context->errstr, ")");
  DropConnection(node, status.message());
  return status;
}

void RedisCluster::CountRead(const redisReply& reply) {
  if (reply.type == REDIS_REPLY_STRING) counters_.bytes_read += reply.len;
  if (reply.type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < reply.elements; ++i) CountRead(*reply.element[i]);
  }
}

Status RedisCluster::Append(redisContext* context, const ClusterCommand& command) {
  std::vector<const char*> argv(command.args.size());
  std::vector<size_t> lengths(command.args.size());
  for (size_t i = 0; i < command.args.size(); ++i) {
    argv[i] = command.args[i].data();
    lengths[i] = command.args[i].size();
    counters_.bytes_written += lengths[i];
  }
  ++counters_.commands;
  if (redisAppendCommandArgv(context, static_cast<int>(argv.size()), argv.data(), lengths.data()) !=
      REDIS_OK) {
    return ResourceExhausted(Describe(command), ": hiredis could not buffer the command (",
                             context->errstr, ")");
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The slot map

void RedisCluster::MaybeRefreshSlots() {
  if (!refresh_needed_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_refresh_attempt_ < kMinRefreshInterval) return;
  // A failed refresh keeps the old map: it may still route most slots right.
  (void)RefreshSlots();
}

Status RedisCluster::RefreshSlots() {
  last_refresh_attempt_ = std::chrono::steady_clock::now();
  // Nodes we hold a connection to are alive as far as we know, so they go first; then the
  // masters of the map, then the seeds.
  std::vector<NodeAddress> candidates;
  auto add = [&candidates](const NodeAddress& node) {
    for (const NodeAddress& known : candidates) {
      if (known == node) return;
    }
    candidates.push_back(node);
  };
  for (const NodeAddress& node : masters_) {
    if (connections_.count(node.ToString()) != 0) add(node);
  }
  for (const NodeAddress& node : masters_) add(node);
  for (const NodeAddress& node : seeds_) add(node);

  std::string tried;
  for (const NodeAddress& node : candidates) {
    if (!tried.empty()) tried += "; ";
    StatusOr<redisContext*> context = ConnectionTo(node, "CLUSTER SLOTS");
    if (!context.ok()) {
      tried += context.status().message();
      continue;
    }
    const ClusterCommand command{0, {"CLUSTER", "SLOTS"}};
    Status status = Append(*context, command);
    if (status.ok()) status = Flush(*context, node, "CLUSTER SLOTS");
    StatusOr<ClusterReply> reply =
        status.ok() ? ReadReply(*context, node, "CLUSTER SLOTS") : StatusOr<ClusterReply>(status);
    if (!reply.ok()) {
      tried += reply.status().message();
      continue;
    }
    const redisReply* raw = reply->raw();
    if (raw->type == REDIS_REPLY_ERROR) {
      tried += OnNode("CLUSTER SLOTS", node) + ": " + std::string(raw->str, raw->len);
      continue;
    }
    StatusOr<std::vector<SlotRange>> ranges = ParseClusterSlots(*raw, node.host);
    if (!ranges.ok()) {
      tried += OnNode(ranges.status().message(), node);
      continue;
    }
    masters_.clear();
    slot_master_.assign(kSlotCount, kNoMaster);
    for (const SlotRange& range : *ranges) {
      for (int slot = range.first; slot <= range.last; ++slot) {
        SetSlotOwner(static_cast<uint16_t>(slot), range.master);
      }
    }
    ++counters_.slot_refreshes;
    refresh_needed_ = false;
    last_refresh_error_.clear();
    return OkStatus();
  }
  last_refresh_error_ = tried;
  return Unavailable("no node answered CLUSTER SLOTS: ", tried);
}

void RedisCluster::SetSlotOwner(uint16_t slot, const NodeAddress& node) {
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (masters_[i] == node) {
      slot_master_[slot] = static_cast<uint16_t>(i);
      return;
    }
  }
  masters_.push_back(node);
  slot_master_[slot] = static_cast<uint16_t>(masters_.size() - 1);
}

std::optional<NodeAddress> RedisCluster::MasterOf(uint16_t slot) const {
  MutexLock lock(&mu_);
  if (slot >= kSlotCount || slot_master_[slot] == kNoMaster) return std::nullopt;
  return masters_[slot_master_[slot]];
}

std::vector<NodeAddress> RedisCluster::Masters() const {
  MutexLock lock(&mu_);
  return masters_;
}

ClusterCounters RedisCluster::counters() const {
  MutexLock lock(&mu_);
  return counters_;
}

// ---------------------------------------------------------------------------------------------
// Commands

StatusOr<ClusterReply> RedisCluster::RunOne(const ClusterCommand& command,
                                            std::optional<NodeAddress> ask_target, int hops_used) {
  const std::string what = Describe(command);
  std::string last_redirect;
  for (int hop = hops_used; hop <= options_.max_redirects; ++hop) {
    // A failed refresh keeps the old map: it may still route this slot right.
    if (!ask_target) MaybeRefreshSlots();
    NodeAddress node;
    if (ask_target) {
      node = *ask_target;
    } else if (slot_master_[command.slot] == kNoMaster) {
      ++counters_.errors;
      return Unavailable(what, ": slot ", command.slot, " has no master in the slot map",
                         last_refresh_error_.empty() ? "" : " (last refresh: ", last_refresh_error_,
                         last_refresh_error_.empty() ? "" : ")");
    } else {
      node = masters_[slot_master_[command.slot]];
    }
    StatusOr<redisContext*> context = ConnectionTo(node, what);
    if (!context.ok()) {
      ++counters_.errors;
      return context.status();
    }
    if (ask_target) {
      KVCTL_RETURN_IF_ERROR(Append(*context, ClusterCommand{command.slot, {"ASKING"}}));
    }
    Status sent = Append(*context, command);
    if (sent.ok()) sent = Flush(*context, node, what);
    if (!sent.ok()) {
      ++counters_.errors;
      return sent;
    }
    if (ask_target) {
      StatusOr<ClusterReply> asking = ReadReply(*context, node, "ASKING before " + what);
      if (!asking.ok()) {
        ++counters_.errors;
        return asking.status();
      }
    }
    StatusOr<ClusterReply> reply = ReadReply(*context, node, what);
    if (!reply.ok()) {
      ++counters_.errors;
      return reply.status();
    }
    const redisReply* raw = reply->raw();
    if (raw->type != REDIS_REPLY_ERROR) return reply;

    const std::string_view error(raw->str, raw->len);
    const std::optional<Redirect> redirect = ParseRedirect(error, node.host);
    if (!redirect) {
      ++counters_.errors;
      return ErrorReplyStatus(error, OnNode(what, node));
    }
    last_redirect = std::string(error) + " from " + node.ToString();
    if (redirect->kind == Redirect::Kind::kMoved) {
      ++counters_.moved;
      ask_target.reset();
      // The whole map is likely stale (a migration moves many slots): refresh it, then trust
      // the MOVED for this slot even if the node we asked has not heard yet.
      (void)RefreshSlots();
      SetSlotOwner(redirect->slot, redirect->node);
    } else {
      ++counters_.ask;
      ask_target = redirect->node;
    }
  }
  ++counters_.errors;
  return Unavailable(what, ": still redirected after ", options_.max_redirects,
                     " hops (last: ", last_redirect, ")");
}

StatusOr<std::vector<ClusterReply>> RedisCluster::Execute(
    std::span<const ClusterCommand> commands) {
  MutexLock lock(&mu_);
  return ExecuteLocked(commands);
}

StatusOr<std::vector<ClusterReply>> RedisCluster::ExecuteLocked(
    std::span<const ClusterCommand> commands) {
  MaybeRefreshSlots();
  std::vector<ClusterReply> replies(commands.size());
  std::vector<size_t> one_by_one;  // MOVED or unrouted: retried through RunOne.
  std::vector<Redirect> moved;
  std::vector<std::pair<size_t, NodeAddress>> asked;  // Retried on the ASK target.
  std::map<uint16_t, std::vector<size_t>> groups;     // Master index -> command indexes.
  for (size_t i = 0; i < commands.size(); ++i) {
    const uint16_t master = slot_master_[commands[i].slot];
    if (master == kNoMaster) {
      one_by_one.push_back(i);
    } else {
      groups[master].push_back(i);
    }
  }

  Status first_error;
  uint64_t failed = 0;  // Added to counters_ once: the lambda is outside the lock analysis.
  auto note = [&first_error, &failed](Status status) {
    ++failed;
    if (first_error.ok()) first_error = std::move(status);
  };
  struct Sent {
    NodeAddress node;
    redisContext* context;
    const std::vector<size_t>* indexes;
  };
  std::vector<Sent> sent;
  // Every group goes out before any reply is read, so the masters work in parallel.
  for (const auto& [master, indexes] : groups) {
    const NodeAddress node = masters_[master];
    const std::string what =
        Describe(commands[indexes.front()]) +
        (indexes.size() > 1 ? " and " + std::to_string(indexes.size() - 1) + " more pipelined"
                            : "");
    StatusOr<redisContext*> context = ConnectionTo(node, what);
    if (!context.ok()) {
      note(context.status());
      continue;
    }
    Status status;
    for (size_t i : indexes) {
      status = Append(*context, commands[i]);
      if (!status.ok()) break;
    }
    if (status.ok()) status = Flush(*context, node, what);
    if (!status.ok()) {
      note(status);
      // Its buffer holds a partial pipeline (Flush has dropped it already when the node failed).
      if (connections_.count(node.ToString()) != 0) {
        redisFree(connections_[node.ToString()]);
        connections_.erase(node.ToString());
      }
      continue;
    }
    sent.push_back(Sent{node, *context, &indexes});
  }
  for (const Sent& group : sent) {
    for (size_t i : *group.indexes) {
      const std::string what = Describe(commands[i]);
      StatusOr<ClusterReply> reply = ReadReply(group.context, group.node, what);
      if (!reply.ok()) {
        note(reply.status());
        break;  // The connection is gone; the rest of this group is unanswered.
      }
      const redisReply* raw = reply->raw();
      if (raw->type != REDIS_REPLY_ERROR) {
        replies[i] = std::move(*reply);
        continue;
      }
      const std::string_view error(raw->str, raw->len);
      const std::optional<Redirect> redirect = ParseRedirect(error, group.node.host);
      if (!redirect) {
        note(ErrorReplyStatus(error, OnNode(what, group.node)));
        continue;
      }
      if (redirect->kind == Redirect::Kind::kMoved) {
        ++counters_.moved;
        moved.push_back(*redirect);
        one_by_one.push_back(i);
      } else {
        ++counters_.ask;
        asked.emplace_back(i, redirect->node);
      }
    }
  }
  counters_.errors += failed;
  if (!first_error.ok()) return first_error;
  if (!moved.empty()) {
    // As in RunOne: refresh the whole map, then trust each MOVED for its own slot.
    (void)RefreshSlots();
    for (const Redirect& redirect : moved) SetSlotOwner(redirect.slot, redirect.node);
  }
  for (size_t i : one_by_one) {
    KVCTL_ASSIGN_OR_RETURN(replies[i], RunOne(commands[i], std::nullopt, moved.empty() ? 0 : 1));
  }
  for (const auto& [i, node] : asked) {
    KVCTL_ASSIGN_OR_RETURN(replies[i], RunOne(commands[i], node, 1));
  }
  return replies;
}

Status RedisCluster::Set(std::string_view key, std::span<const uint8_t> value,
                         std::chrono::milliseconds ttl) {
  if (ttl.count() < 0) {
    return InvalidArgument("ttl: got ", ttl.count(), " ms for key ", QuoteKey(key),
                           ", expected >= 0 (0 = no expiry)");
  }
  const std::string ttl_text = std::to_string(ttl.count());
  ClusterCommand command{
      KeySlot(key),
      {"SET", key, std::string_view(reinterpret_cast<const char*>(value.data()), value.size())}};
  if (ttl.count() > 0) {
    command.args.push_back("PX");
    command.args.push_back(ttl_text);
  }
  KVCTL_ASSIGN_OR_RETURN(std::vector<ClusterReply> replies, Execute({&command, 1}));
  if (!replies[0].is_string() || replies[0].str() != "OK") {
    return Internal("SET ", QuoteKey(key), ": got ", replies[0].Describe(), ", expected OK");
  }
  return OkStatus();
}

StatusOr<std::optional<std::vector<uint8_t>>> RedisCluster::Get(std::string_view key) {
  const ClusterCommand command{KeySlot(key), {"GET", key}};
  KVCTL_ASSIGN_OR_RETURN(std::vector<ClusterReply> replies, Execute({&command, 1}));
  if (replies[0].is_nil()) return std::optional<std::vector<uint8_t>>();
  if (!replies[0].is_string()) {
    return Internal("GET ", QuoteKey(key), ": got ", replies[0].Describe(),
                    ", expected a string or nil");
  }
  const std::string_view bytes = replies[0].str();
  return std::optional<std::vector<uint8_t>>(std::in_place, bytes.begin(), bytes.end());
}

StatusOr<std::vector<bool>> RedisCluster::Exists(std::span<const std::string> keys) {
  std::vector<ClusterCommand> commands;
  commands.reserve(keys.size());
  for (const std::string& key : keys) commands.push_back({KeySlot(key), {"EXISTS", key}});
  KVCTL_ASSIGN_OR_RETURN(std::vector<ClusterReply> replies, Execute(commands));
  std::vector<bool> exists(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!replies[i].is_integer()) {
      return Internal("EXISTS ", QuoteKey(keys[i]), ": got ", replies[i].Describe(),
                      ", expected an integer");
    }
    exists[i] = replies[i].integer() > 0;
  }
  return exists;
}

Status RedisCluster::Del(std::span<const std::string> keys) {
  std::vector<ClusterCommand> commands;
  commands.reserve(keys.size());
  for (const std::string& key : keys) commands.push_back({KeySlot(key), {"DEL", key}});
  KVCTL_ASSIGN_OR_RETURN(std::vector<ClusterReply> replies, Execute(commands));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!replies[i].is_integer()) {
      return Internal("DEL ", QuoteKey(keys[i]), ": got ", replies[i].Describe(),
                      ", expected an integer");
    }
  }
  return OkStatus();
}

}  // namespace kvctl::tier
