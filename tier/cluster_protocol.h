// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tier/cluster_protocol.h
// The pure, server-free parts of talking to a Redis Cluster (docs/tier.md): which hash slot a key
// lives in, "host:port" addresses, redirect errors (MOVED / ASK) and the mapping of Redis error
// replies onto Status codes, and the reply of CLUSTER SLOTS. tier/redis_cluster.h uses them; they
// are here so tests can check them without a server.
//
// Thread safety: pure functions and values.
//
//   KeySlot("123456789")                    // 12739 (CRC16-XMODEM 0x31C3 mod 16384)
//   KeySlot("{user1000}.following")         // the slot of "user1000"
//   ParseRedirect("MOVED 3999 127.0.0.1:6381", "127.0.0.1")  // kMoved, slot 3999, 127.0.0.1:6381
#ifndef KVCTL_TIER_CLUSTER_PROTOCOL_H_
#define KVCTL_TIER_CLUSTER_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

struct redisReply;  // hiredis/hiredis.h

namespace kvctl::tier {

inline constexpr int kSlotCount = 16384;

// CRC16-XMODEM (polynomial 0x1021, initial value 0) of `data`.
uint16_t Crc16Xmodem(std::string_view data);

// The hash slot of `key` per the Redis Cluster specification: CRC16-XMODEM mod 16384 of the whole
// key, or of its hashtag: the bytes between the first '{' and the first '}' after it, when there
// is at least one byte between them ("{}x" and "x{" hash whole).
uint16_t KeySlot(std::string_view key);

struct NodeAddress {
  std::string host;
  int port = 0;

  std::string ToString() const { return host + ":" + std::to_string(port); }
  bool operator==(const NodeAddress&) const = default;
};

// "host:port" (split at the last ':', so a bare IPv6 address works); port 1..65535, host non-empty.
// INVALID_ARGUMENT naming `what` (e.g. "seeds[1]") and the text otherwise.
StatusOr<NodeAddress> ParseNodeAddress(std::string_view text, std::string_view what);

struct Redirect {
  enum class Kind { kMoved, kAsk };
  Kind kind = Kind::kMoved;
  uint16_t slot = 0;
  NodeAddress node;
};

// The redirect an error reply names ("MOVED <slot> <host>:<port>" or "ASK ..."), nullopt when
// the error is no (well-formed) redirect. Redis 7 may leave the host empty (":7101") when it does
// not know its own address: that means the host of the node that replied, `replying_host`.
std::optional<Redirect> ParseRedirect(std::string_view error, std::string_view replying_host);

// The Status for a Redis error reply that is not a redirect. `context` says what was being done
// and where ("SET 'k' on 127.0.0.1:7100"). OOM (maxmemory reached with noeviction) ->
// RESOURCE_EXHAUSTED; CLUSTERDOWN, TRYAGAIN, LOADING, MASTERDOWN -> UNAVAILABLE; anything else ->
// INTERNAL with the reply text.
Status ErrorReplyStatus(std::string_view error, std::string_view context);

struct SlotRange {
  uint16_t first = 0;
  uint16_t last = 0;  // Inclusive.
  NodeAddress master;
};

// The master of every slot range in a CLUSTER SLOTS reply; replicas are ignored. An empty host
// means the replying node's `replying_host`. INTERNAL naming the element when the reply is not
// the documented shape.
StatusOr<std::vector<SlotRange>> ParseClusterSlots(const redisReply& reply,
                                                   std::string_view replying_host);

}  // namespace kvctl::tier

#endif  // KVCTL_TIER_CLUSTER_PROTOCOL_H_
