// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tier/cluster_protocol.h"

#include <hiredis/hiredis.h>

#include <array>
#include <charconv>

namespace kvctl::tier {
namespace {

constexpr std::array<uint16_t, 256> MakeCrc16Table() {
  std::array<uint16_t, 256> table{};
  for (int byte = 0; byte < 256; ++byte) {
    uint16_t crc = static_cast<uint16_t>(byte << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
    table[byte] = crc;
  }
  return table;
}
constexpr std::array<uint16_t, 256> kCrc16Table = MakeCrc16Table();

template <typename T>
bool ParseNumber(std::string_view text, T& out) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return error == std::errc() && end == text.data() + text.size();
}

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

std::string_view ReplyText(const redisReply& reply) {
  return reply.str == nullptr ? std::string_view() : std::string_view(reply.str, reply.len);
}

}  // namespace

uint16_t Crc16Xmodem(std::string_view data) {
  uint16_t crc = 0;
  for (const char c : data) {
    crc = static_cast<uint16_t>((crc << 8) ^
                                kCrc16Table[((crc >> 8) ^ static_cast<uint8_t>(c)) & 0xFF]);
  }
  return crc;
}

uint16_t KeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return static_cast<uint16_t>(Crc16Xmodem(key) % kSlotCount);
}

StatusOr<NodeAddress> ParseNodeAddress(std::string_view text, std::string_view what) {
  const size_t colon = text.rfind(':');
  int port = 0;
  if (colon == std::string_view::npos || colon == 0 || !ParseNumber(text.substr(colon + 1), port) ||
      port < 1 || port > 65535) {
    return InvalidArgument(what, ": got \"", text, "\", expected host:port with port 1..65535");
  }
  return NodeAddress{std::string(text.substr(0, colon)), port};
}

std::optional<Redirect> ParseRedirect(std::string_view error, std::string_view replying_host) {
  Redirect redirect;
  if (StartsWith(error, "MOVED ")) {
    redirect.kind = Redirect::Kind::kMoved;
    error.remove_prefix(6);
  } else if (StartsWith(error, "ASK ")) {
    redirect.kind = Redirect::Kind::kAsk;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const size_t space = error.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  int slot = 0;
  if (!ParseNumber(error.substr(0, space), slot) || slot < 0 || slot >= kSlotCount) {
    return std::nullopt;
  }
  redirect.slot = static_cast<uint16_t>(slot);
  std::string_view endpoint = error.substr(space + 1);
  const size_t colon = endpoint.rfind(':');
  int port = 0;
  if (colon == std::string_view::npos || !ParseNumber(endpoint.substr(colon + 1), port) ||
      port < 1 || port > 65535) {
    return std::nullopt;
  }
  redirect.node.host =
      colon == 0 ? std::string(replying_host) : std::string(endpoint.substr(0, colon));
  redirect.node.port = port;
  return redirect;
}

Status ErrorReplyStatus(std::string_view error, std::string_view context) {
  if (StartsWith(error, "OOM")) {
    return ResourceExhausted(context,
                             ": the node is out of memory (maxmemory with noeviction): ", error);
  }
  if (StartsWith(error, "CLUSTERDOWN") || StartsWith(error, "TRYAGAIN") ||
      StartsWith(error, "LOADING") || StartsWith(error, "MASTERDOWN")) {
    return Unavailable(context, ": ", error);
  }
  return Internal(context, ": unexpected error reply: ", error);
}

StatusOr<std::vector<SlotRange>> ParseClusterSlots(const redisReply& reply,
                                                   std::string_view replying_host) {
  if (reply.type != REDIS_REPLY_ARRAY) {
    return Internal("CLUSTER SLOTS: reply type ", reply.type, ", expected an array");
  }
  std::vector<SlotRange> ranges;
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply* range = reply.element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER ||
        range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2) {
      return Internal("CLUSTER SLOTS: element ", i,
                      " is not [first, last, [host, port, ...], ...]");
    }
    const long long first = range->element[0]->integer;
    const long long last = range->element[1]->integer;
    const redisReply* master = range->element[2];
    if (first < 0 || last < first || last >= kSlotCount ||
        master->element[0]->type != REDIS_REPLY_STRING ||
        master->element[1]->type != REDIS_REPLY_INTEGER || master->element[1]->integer < 1 ||
        master->element[1]->integer > 65535) {
      return Internal("CLUSTER SLOTS: element ", i, " has slots ", first, "..", last,
                      " or a master address outside the expected ranges");
    }
    std::string host(ReplyText(*master->element[0]));
    // "" (Redis 7: endpoint unknown) and "?" mean the node we asked.
    if (host.empty() || host == "?") host = std::string(replying_host);
    ranges.push_back(SlotRange{static_cast<uint16_t>(first), static_cast<uint16_t>(last),
                               NodeAddress{host, static_cast<int>(master->element[1]->integer)}});
  }
  return ranges;
}

}  // namespace kvctl::tier
