// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Hostile input for the decoders: random bytes, every truncation, bit flips, wrong frame counts.
// The decoders must never crash (run these under ASan/UBSan too) and must answer with
// INVALID_ARGUMENT or UNIMPLEMENTED.
#include <catch2/catch.hpp>
#include <random>

#include "ipc/protocol.h"
#include "tests/ipc/ipc_test_util.h"

namespace kvctl::ipc {
namespace {

using testing::AllSampleMessages;
using testing::Bytes;
using testing::CopyFrames;
using testing::FrameOf;

// Decodes as the sample's direction; returns the status.
Status DecodeAny(bool is_request, Frames frames) {
  if (is_request) return DecodeRequest(std::move(frames)).status();
  return DecodeReply(std::move(frames)).status();
}

bool IsDecodeError(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kUnimplemented;
}

TEST_CASE("Protocol fuzz: every sample decodes in both directions without crashing", "[ipc]") {
  for (const auto& sample : AllSampleMessages()) {
    INFO(sample.name);
    CHECK(DecodeAny(sample.is_request, sample.make()).ok());
    // A request is never a reply and vice versa.
    const Status wrong = DecodeAny(!sample.is_request, sample.make());
    CHECK(wrong.code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("Protocol fuzz: random bytes are rejected", "[ipc]") {
  std::mt19937 rng(12345);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 96, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    Frames frames;
    frames.push_back(FrameOf(bytes));
    for (uint32_t extra = rng() % 4; extra > 0; --extra) frames.push_back(FrameOf(bytes));
    const bool as_request = i % 2 == 0;
    const Status s = DecodeAny(as_request, std::move(frames));
    INFO(s.ToString());
    REQUIRE_FALSE(s.ok());
    REQUIRE(IsDecodeError(s));
  }
}

TEST_CASE("Protocol fuzz: random bodies behind a valid header never crash", "[ipc]") {
  std::mt19937 rng(777);
  const uint16_t types[] = {1,      2,      3,      4,      5,      6,      7,      8,     0x8001,
                            0x8002, 0x8003, 0x8004, 0x8005, 0x8006, 0x8007, 0xFFFF, 0x7FFF};
  const std::string ping_header =
      Bytes(testing::MustEncode(PingRequest{1})[0]).substr(0, kHeaderBytes);
  int accepted = 0;
  for (int i = 0; i < 40000; ++i) {
    std::string frame0 = ping_header;
    const uint16_t type = types[rng() % std::size(types)];
    frame0[6] = static_cast<char>(type & 0xFF);
    frame0[7] = static_cast<char>(type >> 8);
    std::string body(rng() % 160, '\0');
    for (char& c : body) c = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 3);  // Small ints.
    Frames frames;
    frames.push_back(FrameOf(frame0 + body));
    for (uint32_t extra = rng() % 5; extra > 0; --extra) {
      frames.push_back(testing::PatternFrame(rng() % 200, static_cast<uint8_t>(rng())));
    }
    const Status s = DecodeAny((type & kReplyBit) == 0, std::move(frames));
    if (s.ok()) {
      ++accepted;  // Short fixed bodies (PING, OPEN, ...) can be valid by chance.
    } else {
      INFO(s.ToString());
      REQUIRE(IsDecodeError(s));
    }
  }
  CHECK(accepted < 40000);
}

TEST_CASE("Protocol fuzz: every truncation of every message is rejected", "[ipc]") {
  for (const auto& sample : AllSampleMessages()) {
    INFO(sample.name);
    const Frames valid = sample.make();
    const std::string frame0 = Bytes(valid[0]);
    for (size_t len = 0; len < frame0.size(); ++len) {
      Frames frames = CopyFrames(valid);
      frames[0] = FrameOf(frame0.substr(0, len));
      const Status s = DecodeAny(sample.is_request, std::move(frames));
      INFO("frame 0 cut to " << len << " bytes: " << s.ToString());
      REQUIRE_FALSE(s.ok());
      REQUIRE(IsDecodeError(s));
    }
    // Tensor frames one byte short, or emptied. STATS text is free-form, so any cut is valid text
    // unless it splits a code point; it is exercised by the frame-count checks below.
    if (sample.name == "STATS_REPLY") continue;
    for (size_t i = 1; i < valid.size(); ++i) {
      for (size_t cut : {size_t{1}, valid[i].size()}) {
        if (valid[i].size() < cut || valid[i].size() == 0) continue;
        Frames frames = CopyFrames(valid);
        frames[i] = FrameOf(Bytes(valid[i]).substr(0, valid[i].size() - cut));
        const Status s = DecodeAny(sample.is_request, std::move(frames));
        INFO("frame " << i << " cut by " << cut << ": " << s.ToString());
        REQUIRE_FALSE(s.ok());
        REQUIRE(IsDecodeError(s));
      }
    }
  }
}

TEST_CASE("Protocol fuzz: missing or extra frames are rejected", "[ipc]") {
  for (const auto& sample : AllSampleMessages()) {
    INFO(sample.name);
    Frames fewer = sample.make();
    if (fewer.size() > 1) {
      fewer.pop_back();
      CHECK(DecodeAny(sample.is_request, std::move(fewer)).code() == StatusCode::kInvalidArgument);
    }
    Frames more = sample.make();
    more.push_back(FrameOf("tail"));
    CHECK(DecodeAny(sample.is_request, std::move(more)).code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("Protocol fuzz: header bit flips are rejected or decode as another valid message",
          "[ipc]") {
  for (const auto& sample : AllSampleMessages()) {
    INFO(sample.name);
    const Frames valid = sample.make();
    const std::string frame0 = Bytes(valid[0]);
    for (size_t bit = 0; bit < 8 * frame0.size(); ++bit) {
      std::string flipped = frame0;
      flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
      Frames frames = CopyFrames(valid);
      frames[0] = FrameOf(flipped);
      const Status s = DecodeAny(sample.is_request, std::move(frames));
      INFO("bit " << bit << ": " << s.ToString());
      const size_t byte = bit / 8;
      const bool magic_version_flags = byte < 6 || (byte >= 16 && byte < kHeaderBytes);
      // Bit 0 of the flags is APPEND_CONTINUES: valid on an APPEND request (and only there).
      const bool append_continues = sample.is_request && bit == 8 * 16 &&
                                    static_cast<uint8_t>(frame0[6]) == 5 && frame0[7] == 0;
      if (append_continues) {
        REQUIRE(s.ok());
      } else if (magic_version_flags) {
        REQUIRE(s.code() == StatusCode::kInvalidArgument);
      } else if (!s.ok()) {
        // Type flips may land on a type with the same body (OPEN <-> CLOSE); id flips are valid.
        REQUIRE(IsDecodeError(s));
      }
    }
  }
}

}  // namespace
}  // namespace kvctl::ipc
