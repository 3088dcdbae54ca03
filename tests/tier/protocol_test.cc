// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/tier/protocol_test.cc
// The server-free parts of the tier: key slots against the Redis Cluster specification's
// examples, address and redirect parsing, the error mapping, CLUSTER SLOTS replies (fed through
// hiredis' own reader) and the blob manifest's encoding.
#include <hiredis/hiredis.h>

#include <catch2/catch.hpp>
#include <string>

#include "common/crc32c.h"
#include "tier/blob_store.h"
#include "tier/cluster_protocol.h"

namespace kvctl::tier {
namespace {

TEST_CASE("KeySlot: the specification's CRC16 and slot answers") {
  // The Redis Cluster spec: CRC16-XMODEM of "123456789" is 0x31C3.
  CHECK(Crc16Xmodem("123456789") == 0x31C3);
  CHECK(KeySlot("123456789") == 0x31C3 % 16384);
  CHECK(Crc16Xmodem("") == 0);
  CHECK(KeySlot("") == 0);
  // Known slots (redis-cli CLUSTER KEYSLOT).
  CHECK(KeySlot("foo") == 12182);
  CHECK(KeySlot("bar") == 5061);
  CHECK(KeySlot("hello") == 866);
}

TEST_CASE("KeySlot: hashtag rules") {
  // Only the bytes between the first '{' and the first '}' after it are hashed.
  CHECK(KeySlot("{user1000}.following") == KeySlot("user1000"));
  CHECK(KeySlot("{user1000}.followers") == KeySlot("user1000"));
  CHECK(KeySlot("foo{bar}{zap}") == KeySlot("bar"));
  CHECK(KeySlot("foo{{bar}}zap") == KeySlot("{bar"));
  CHECK(KeySlot("a{b}c{d}") == KeySlot("b"));
  // An empty tag, or '{' without '}', means the whole key is hashed.
  CHECK(KeySlot("foo{}{bar}") == KeySlot("foo{}{bar}"));
  CHECK(KeySlot("foo{}{bar}") != KeySlot("bar"));
  CHECK(KeySlot("{}") == static_cast<uint16_t>(Crc16Xmodem("{}") % 16384));
  CHECK(KeySlot("{") == static_cast<uint16_t>(Crc16Xmodem("{") % 16384));
  CHECK(KeySlot("abc{") == static_cast<uint16_t>(Crc16Xmodem("abc{") % 16384));
  CHECK(KeySlot("}{x") == static_cast<uint16_t>(Crc16Xmodem("}{x") % 16384));
  CHECK(KeySlot("{a}") == KeySlot("a"));
  // Binary keys are fine.
  CHECK(KeySlot(std::string("a\0b", 3)) ==
        static_cast<uint16_t>(Crc16Xmodem(std::string("a\0b", 3)) % 16384));
}

TEST_CASE("ParseNodeAddress: host:port, last colon, errors name the field") {
  auto a = ParseNodeAddress("127.0.0.1:7100", "seeds[0]");
  REQUIRE(a.ok());
  CHECK(a->host == "127.0.0.1");
  CHECK(a->port == 7100);
  CHECK(a->ToString() == "127.0.0.1:7100");
  auto v6 = ParseNodeAddress("::1:7000", "seeds[0]");
  REQUIRE(v6.ok());
  CHECK(v6->host == "::1");
  for (const char* bad : {"", "localhost", ":7000", "host:", "host:0", "host:65536", "host:7x"}) {
    auto parsed = ParseNodeAddress(bad, "seeds[2]");
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
    CHECK(parsed.status().message().find("seeds[2]") != std::string::npos);
  }
}

TEST_CASE("ParseRedirect: MOVED, ASK, empty host, and non-redirects") {
  auto moved = ParseRedirect("MOVED 3999 127.0.0.1:6381", "10.0.0.1");
  REQUIRE(moved);
  CHECK(moved->kind == Redirect::Kind::kMoved);
  CHECK(moved->slot == 3999);
  CHECK(moved->node == NodeAddress{"127.0.0.1", 6381});
  auto ask = ParseRedirect("ASK 0 10.1.2.3:7002", "x");
  REQUIRE(ask);
  CHECK(ask->kind == Redirect::Kind::kAsk);
  CHECK(ask->slot == 0);
  CHECK(ask->node == NodeAddress{"10.1.2.3", 7002});
  auto no_host = ParseRedirect("MOVED 16383 :7005", "10.0.0.1");
  REQUIRE(no_host);
  CHECK(no_host->node == NodeAddress{"10.0.0.1", 7005});
  for (const char* other : {"ERR unknown command", "MOVED", "MOVED 16384 h:1", "MOVED x h:1",
                            "ASK 12 h", "MOVED 1 h:0", "OOM command not allowed"}) {
    CHECK_FALSE(ParseRedirect(other, "h"));
  }
}

TEST_CASE("ErrorReplyStatus: OOM, cluster-down family, and the rest") {
  const Status oom = ErrorReplyStatus("OOM command not allowed when used memory > 'maxmemory'.",
                                      "SET 'k' on 127.0.0.1:7100");
  CHECK(oom.code() == StatusCode::kResourceExhausted);
  CHECK(oom.message().find("127.0.0.1:7100") != std::string::npos);
  for (const char* down : {"CLUSTERDOWN The cluster is down", "TRYAGAIN Multiple keys request",
                           "LOADING Redis is loading", "MASTERDOWN Link with MASTER is down"}) {
    CHECK(ErrorReplyStatus(down, "GET 'k' on h:1").code() == StatusCode::kUnavailable);
  }
  const Status other = ErrorReplyStatus("WRONGTYPE Operation against a key", "GET 'k' on h:1");
  CHECK(other.code() == StatusCode::kInternal);
  CHECK(other.message().find("WRONGTYPE Operation against a key") != std::string::npos);
}

// Parses RESP text with hiredis' reader, as the client does off the socket.
struct ParsedReply {
  explicit ParsedReply(const std::string& resp) {
    redisReader* reader = redisReaderCreate();
    REQUIRE(redisReaderFeed(reader, resp.data(), resp.size()) == REDIS_OK);
    void* out = nullptr;
    REQUIRE(redisReaderGetReply(reader, &out) == REDIS_OK);
    REQUIRE(out != nullptr);
    redisReaderFree(reader);
    reply = static_cast<redisReply*>(out);
  }
  ~ParsedReply() { freeReplyObject(reply); }
  redisReply* reply = nullptr;
};

TEST_CASE("ParseClusterSlots: masters of each range, replicas ignored, empty host filled") {
  const std::string resp =
      "*2\r\n"
      "*4\r\n:0\r\n:5460\r\n"
      "*3\r\n$9\r\n127.0.0.1\r\n:7100\r\n$3\r\nid1\r\n"
      "*3\r\n$9\r\n127.0.0.1\r\n:7104\r\n$3\r\nid5\r\n"
      "*3\r\n:5461\r\n:16383\r\n"
      "*3\r\n$0\r\n\r\n:7101\r\n$3\r\nid2\r\n";
  ParsedReply parsed(resp);
  auto ranges = ParseClusterSlots(*parsed.reply, "10.0.0.9");
  REQUIRE(ranges.ok());
  REQUIRE(ranges->size() == 2);
  CHECK((*ranges)[0].first == 0);
  CHECK((*ranges)[0].last == 5460);
  CHECK((*ranges)[0].master == NodeAddress{"127.0.0.1", 7100});
  CHECK((*ranges)[1].first == 5461);
  CHECK((*ranges)[1].last == 16383);
  CHECK((*ranges)[1].master == NodeAddress{"10.0.0.9", 7101});

  ParsedReply bad_shape("*1\r\n*2\r\n:0\r\n:5\r\n");
  auto refused = ParseClusterSlots(*bad_shape.reply, "h");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kInternal);
  CHECK(refused.status().message().find("element 0") != std::string::npos);

  ParsedReply bad_range("*1\r\n*3\r\n:10\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n");
  CHECK_FALSE(ParseClusterSlots(*bad_range.reply, "h").ok());
  ParsedReply not_array("+OK\r\n");
  CHECK_FALSE(ParseClusterSlots(*not_array.reply, "h").ok());
}

TEST_CASE("BlobManifest: round trip, and every corruption is refused by name") {
  BlobManifest manifest;
  manifest.total_bytes = 2500;
  manifest.chunk_bytes = 1000;
  manifest.generation = 0x0123456789abcdefULL;
  manifest.chunk_crcs = {1, 2, 3};
  const std::string encoded = EncodeManifest(manifest);
  CHECK(encoded.size() == 32 + 3 * 4 + 4);
  auto decoded = DecodeManifest("v", encoded);
  REQUIRE(decoded.ok());
  CHECK(decoded->total_bytes == 2500);
  CHECK(decoded->chunk_bytes == 1000);
  CHECK(decoded->generation == manifest.generation);
  CHECK(decoded->chunk_crcs == manifest.chunk_crcs);

  BlobManifest empty;
  empty.chunk_bytes = 1 << 20;
  auto empty_back = DecodeManifest("e", EncodeManifest(empty));
  REQUIRE(empty_back.ok());
  CHECK(empty_back->chunk_crcs.empty());

  for (size_t i = 0; i < encoded.size(); ++i) {
    std::string flipped = encoded;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x10);
    const auto status = DecodeManifest("name/x", flipped).status();
    INFO("byte " << i);
    CHECK_FALSE(status.ok());
    CHECK(status.message().find("'name/x'") != std::string::npos);
    // The version byte gives FAILED_PRECONDITION, everything else DATA_LOSS.
    CHECK(status.code() == (i == 4 ? StatusCode::kFailedPrecondition : StatusCode::kDataLoss));
  }
  CHECK(DecodeManifest("v", encoded.substr(0, encoded.size() - 1)).status().code() ==
        StatusCode::kDataLoss);
  CHECK(DecodeManifest("v", "").status().code() == StatusCode::kDataLoss);

  // A manifest whose chunk count disagrees with its sizes, even with a valid checksum.
  BlobManifest inconsistent = manifest;
  inconsistent.chunk_crcs = {1, 2};
  CHECK(DecodeManifest("v", EncodeManifest(inconsistent)).status().code() == StatusCode::kDataLoss);
}

TEST_CASE("BlobManifest: an inline value round-trips and is covered by the checksum") {
  const std::string value("in\0line", 7);
  BlobManifest manifest;
  manifest.total_bytes = value.size();
  manifest.chunk_bytes = 1 << 20;
  manifest.generation = 5;
  manifest.is_inline = true;
  manifest.inline_bytes = value;
  const std::string encoded = EncodeManifest(manifest);
  CHECK(encoded.size() == 32 + value.size() + 4);
  auto decoded = DecodeManifest("v", encoded);
  REQUIRE(decoded.ok());
  CHECK(decoded->is_inline);
  CHECK(decoded->inline_bytes == value);
  CHECK(decoded->chunk_crcs.empty());
  for (size_t i = 0; i < encoded.size(); ++i) {
    std::string flipped = encoded;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x01);
    INFO("byte " << i);
    CHECK_FALSE(DecodeManifest("v", flipped).ok());
  }
  // Unknown flags under a valid checksum: another format, not damage.
  BlobManifest plain;
  std::string flagged = EncodeManifest(plain);
  flagged[5] = 0x02;
  flagged.resize(flagged.size() - 4);
  const uint32_t crc = Crc32c(flagged.data(), flagged.size());
  for (int i = 0; i < 4; ++i) flagged.push_back(static_cast<char>((crc >> (8 * i)) & 0xFF));
  CHECK(DecodeManifest("v", flagged).status().code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("ChunkKey and ChunkCrc: keys differ per generation and index, CRC binds both") {
  CHECK(ChunkKey("seq/1", 0xab, 7) == "seq/1#00000000000000ab#7");
  const uint8_t bytes[] = {0, 1, 2, 0, 0};
  CHECK(ChunkCrc(1, 0, bytes) != ChunkCrc(1, 1, bytes));
  CHECK(ChunkCrc(1, 0, bytes) != ChunkCrc(2, 0, bytes));
  CHECK(ChunkCrc(1, 0, bytes) == ChunkCrc(1, 0, bytes));
}

}  // namespace
}  // namespace kvctl::tier
