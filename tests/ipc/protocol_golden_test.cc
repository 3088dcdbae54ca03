// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The golden wire messages of tests/golden/wire_messages.txt, which python/tests/test_protocol.py
// reads too: the C++ codec must decode every entry's frames to the entry's fields and encode the
// decoded message back to the same frames, so both codecs agree byte for byte.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ipc/protocol.h"
#include "ipc/wire_fields.h"
#include "tests/ipc/ipc_test_util.h"

namespace kvctl::ipc {
namespace {

using testing::Bytes;
using testing::FrameOf;

struct Golden {
  std::string name{};
  std::string type{};  // As TypeName() writes it.
  uint64_t request_id = 0;
  std::vector<std::string> frames{};  // Raw bytes.
  std::vector<std::pair<std::string, std::string>> fields{};
  std::string error{};  // Set for invalid_* entries: the decoder must refuse with this text.
};

std::string Trim(std::string s) {
  const size_t a = s.find_first_not_of(" \t");
  const size_t b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string FromHex(const std::string& text) {
  std::string out, digits;
  for (char c : text) {
    if (c != ' ') digits += c;
  }
  REQUIRE(digits.size() % 2 == 0);
  for (size_t i = 0; i < digits.size(); i += 2) {
    out += static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16));
  }
  return out;
}

std::string ToHex(std::string_view bytes) {
  std::string out;
  char buf[4];
  for (unsigned char b : bytes) {
    std::snprintf(buf, sizeof(buf), "%02x", b);
    out += buf;
  }
  return out;
}

// KVCTL_WIRE_GOLDEN is the file's path, set by tests/ipc/CMakeLists.txt.
const std::vector<Golden>& Goldens() {
  static const std::vector<Golden> goldens = [] {
    std::ifstream in(KVCTL_WIRE_GOLDEN);
    REQUIRE(in.good());
    std::vector<Golden> out;
    std::string line;
    while (std::getline(in, line)) {
      line = Trim(line);
      if (line.empty() || line[0] == '#') continue;
      if (line[0] == '[') {
        out.push_back({.name = line.substr(1, line.size() - 2)});
        continue;
      }
      REQUIRE(!out.empty());
      const size_t eq = line.find(" = ");
      const std::string key =
          eq == std::string::npos ? Trim(line.substr(0, line.find('='))) : line.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : line.substr(eq + 3);
      Golden& g = out.back();
      if (key == "type") {
        g.type = value;
      } else if (key == "request_id") {
        g.request_id = std::stoull(value);
      } else if (key == "error") {
        g.error = value;
      } else if (key.rfind("frame", 0) == 0) {
        REQUIRE(key == "frame" + std::to_string(g.frames.size()));
        g.frames.push_back(FromHex(value));
      } else {
        g.fields.emplace_back(key, value);
      }
    }
    return out;
  }();
  return goldens;
}

const Golden& GoldenNamed(std::string_view name) {
  for (const Golden& g : Goldens()) {
    if (g.name == name) return g;
  }
  FAIL("no golden message named " << name);
  static Golden none;
  return none;
}

Frames FramesOf(const Golden& g) {
  Frames frames;
  for (const std::string& f : g.frames) frames.push_back(FrameOf(f));
  return frames;
}

std::vector<std::string> HexOf(const Frames& frames) {
  std::vector<std::string> out;
  for (const zmq::message_t& f : frames) out.push_back(ToHex(Bytes(f)));
  return out;
}

std::vector<std::string> HexOf(const Golden& g) {
  std::vector<std::string> out;
  for (const std::string& f : g.frames) out.push_back(ToHex(f));
  return out;
}

// Renders the frame-0 fields of a message in the golden notation, walking the same messages.def
// table the codec walks (the Python suite renders with wire_codec.describe).
class FieldDescriber {
 public:
  explicit FieldDescriber(std::string prefix = "") : prefix_(std::move(prefix)) {}
  std::vector<std::pair<std::string, std::string>> lines;

  template <int kBytes, typename T>
  Status Int(std::string_view name, const T& v) {
    return Put(name, std::to_string(uint64_t{v}));
  }
  template <int kBytes, typename E>
  Status Enum(std::string_view name, const E& v) {
    return Put(name, std::to_string(static_cast<uint64_t>(v)));
  }
  Status Bool(std::string_view name, bool v) { return Put(name, v ? "1" : "0"); }
  Status Str(std::string_view name, const std::string& s, size_t) {
    std::string quoted = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    return Put(name, quoted + "\"");
  }
  template <size_t kN>
  Status Bytes(std::string_view name, const std::array<uint8_t, kN>& b) {
    return Put(name, ToHex({reinterpret_cast<const char*>(b.data()), kN}));
  }
  Status Tag(std::string_view, uint8_t) { return OkStatus(); }
  template <typename S>
  Status Struct(std::string_view name, const S& s) {
    FieldDescriber inner(name.empty() ? prefix_ : prefix_ + std::string(name) + ".");
    KVCTL_RETURN_IF_ERROR(VisitFields(inner, s));
    lines.insert(lines.end(), inner.lines.begin(), inner.lines.end());
    return OkStatus();
  }
  template <typename S>
  Status Count16(std::string_view, const std::vector<S>&, uint32_t) {
    return OkStatus();
  }
  template <typename S>
  Status Structs(std::string_view name, const std::vector<S>& items) {
    for (size_t i = 0; i < items.size(); ++i) {
      FieldDescriber inner(prefix_ + std::string(name) + "[" + std::to_string(i) + "].");
      KVCTL_RETURN_IF_ERROR(VisitFields(inner, items[i]));
      lines.insert(lines.end(), inner.lines.begin(), inner.lines.end());
    }
    return OkStatus();
  }
  template <typename T, typename M>
  Status Array(std::string_view name, const std::vector<T>& a, CountRule, const M&) {
    std::string out = "[";
    for (size_t i = 0; i < a.size(); ++i) out += (i ? ", " : "") + std::to_string(a[i]);
    return Put(name, out + "]");
  }

 private:
  Status Put(std::string_view name, std::string value) {
    lines.emplace_back(prefix_ + std::string(name), std::move(value));
    return OkStatus();
  }
  std::string prefix_;
};

template <typename Variant>
std::vector<std::pair<std::string, std::string>> Describe(const Variant& body) {
  return std::visit(
      [](const auto& m) {
        FieldDescriber d;
        REQUIRE(VisitFields(d, m).ok());
        return d.lines;
      },
      body);
}

// From the header's type field (bit 15), so that unknown reply types count too.
bool IsReply(const Golden& g) {
  REQUIRE(g.frames.size() >= 1);
  REQUIRE(g.frames[0].size() >= 8);
  return (static_cast<uint8_t>(g.frames[0][7]) & 0x80) != 0;
}

TEST_CASE("Protocol golden: every golden message decodes to its fields", "[ipc]") {
  REQUIRE(Goldens().size() >= 20);
  for (const Golden& g : Goldens()) {
    if (!g.error.empty()) continue;
    INFO(g.name);
    if (IsReply(g)) {
      StatusOr<Reply> reply = DecodeReply(FramesOf(g));
      INFO(reply.status().ToString());
      REQUIRE(reply.ok());
      CHECK(reply->request_id == g.request_id);
      CHECK(TypeName(TypeOf(reply->body)) == g.type);
      CHECK(Describe(reply->body) == g.fields);
    } else {
      StatusOr<Request> request = DecodeRequest(FramesOf(g));
      INFO(request.status().ToString());
      REQUIRE(request.ok());
      CHECK(request->request_id == g.request_id);
      CHECK(TypeName(static_cast<uint16_t>(TypeOf(request->body))) == g.type);
      CHECK(Describe(request->body) == g.fields);
    }
  }
}

TEST_CASE("Protocol golden: every decoded golden message encodes to its frames", "[ipc]") {
  for (const Golden& g : Goldens()) {
    if (!g.error.empty()) continue;
    INFO(g.name);
    StatusOr<Frames> frames = InvalidArgument("not encoded");
    if (IsReply(g)) {
      StatusOr<Reply> reply = DecodeReply(FramesOf(g));
      REQUIRE(reply.ok());
      frames = Encode(g.request_id, std::move(reply->body));
    } else {
      StatusOr<Request> request = DecodeRequest(FramesOf(g));
      REQUIRE(request.ok());
      frames = Encode(g.request_id, std::move(request->body));
    }
    INFO(frames.status().ToString());
    REQUIRE(frames.ok());
    CHECK(HexOf(*frames) == HexOf(g));
  }
}

TEST_CASE("Protocol golden: every invalid golden reply is refused with its error", "[ipc]") {
  size_t invalid = 0;
  for (const Golden& g : Goldens()) {
    if (g.error.empty()) continue;
    ++invalid;
    INFO(g.name);
    REQUIRE(IsReply(g));
    StatusOr<Reply> reply = DecodeReply(FramesOf(g));
    REQUIRE(!reply.ok());  // INVALID_ARGUMENT, or UNIMPLEMENTED for an unknown type.
    CHECK_THAT(reply.status().message(), Catch::Contains(g.error));
  }
  CHECK(invalid >= 10);
}

TEST_CASE("Protocol golden: every message type has a golden message", "[ipc]") {
  std::set<std::string> seen;
  for (const Golden& g : Goldens()) {
    if (g.error.empty()) seen.insert(g.type);
  }
  for (uint16_t t = kFirstRequestType; t <= kLastRequestType; ++t) {
    CHECK(seen.count(TypeName(t)) == 1);
    CHECK(seen.count(TypeName(t | kReplyBit)) == 1);
  }
  CHECK(seen.count("ERROR") == 1);
  std::set<std::string> names;
  for (const Golden& g : Goldens()) CHECK(names.insert(g.name).second);  // Names are unique.
}

// The examples of PROTOCOL.md, built by hand as an engine or the daemon would, encode to the
// golden bytes (the tests above start from the bytes; these start from the structs).
TEST_CASE("Protocol golden: the PROTOCOL.md examples come out of the encoders", "[ipc]") {
  const auto check = [](std::string_view name, StatusOr<Frames> frames) {
    INFO(name << ": " << frames.status().ToString());
    REQUIRE(frames.ok());
    CHECK(HexOf(*frames) == HexOf(GoldenNamed(name)));
  };
  check("hello_request", Encode(1, HelloRequest{1, "vllm", "qwen", {2, 1, 2, 8, DType::kF16}}));
  check("hello_reply",
        Encode(1, HelloReply{.session_id = 5,
                             .lease_ms = 30000,
                             .server_version = "0.1.0",
                             .pool_bytes = 1048576,
                             .page_bytes = 4096,
                             .shm_name = "/kv",
                             .staging_offset = 0,
                             .staging_bytes = 8192,
                             .quant = {3, 2, 2, 32, 4, 128},
                             .staging_shm_name = "/kv-stg-00112233445566778899aabbccddeeff"}));
  CHECK(GoldenNamed("hello_reply").frames[0].size() == 202);
  check("open_reply", Encode(2, OpenReply{}));
  check("ping_request_session", Encode(7, PingRequest{42}));
  check("append_staging_request_no_q", Encode(7, testing::SampleAppendStaging()));
  check("error_reply_short", EncodeError(7, NotFound("no")));
  check("bye_request", Encode(11, ByeRequest{5}));
  check("bye_reply", Encode(11, ByeReply{2, 8192}));

  FetchBlocksReply b{.layer_begin = 0,
                     .n_layers = 1,
                     .kv_heads = 1,
                     .head_dim = 8,
                     .page_bytes = 4096,
                     .pool_pages = 256,
                     .block_tokens = 32,
                     .side_records_per_page = 0};
  b.layouts = {{.method = 3,
                .k_bits = 2,
                .v_bits = 2,
                .k_group_tokens = 32,
                .v_group_channels = 8,
                .record_bytes = 256,
                .k_codes_offset = 0,
                .k_codes_bytes = 64,
                .k_meta_offset = 64,
                .k_meta_bytes = 64,
                .v_codes_offset = 128,
                .v_codes_bytes = 64,
                .v_meta_offset = 192,
                .v_meta_bytes = 64,
                .side_bytes_per_token = 0,
                .records_per_page = 16,
                .row_slot_bytes = 32,
                .rows_per_page = 128}};
  b.layout_index = {0};
  b.indptr = {0, 2};
  b.indices = {17, 18};
  b.last_page_len = {32};
  b.window_indptr = {0, 1};
  b.window_ids = {5};
  b.window_sinks = {0};
  b.run_indptr = {0, 1};
  b.run_starts = {64};
  b.run_lengths = {1};
  b.record_base = {0};
  b.table_tags = {0};
  check("fetch_blocks_reply", Encode(8, std::move(b)));
  const Golden& blocks = GoldenNamed("fetch_blocks_reply");
  CHECK(blocks.frames.size() == 1);            // No row travels in a blocks reply.
  CHECK(blocks.frames[0].size() == 18 + 169);  // Header + the example's 169-byte body.
}

TEST_CASE("Protocol golden: BYE refuses session 0 and names a truncated field", "[ipc]") {
  const Golden& bye = GoldenNamed("bye_request");
  // Session 0 is "no session": refused before sending, and by the decoder.
  StatusOr<Frames> none = Encode(11, ByeRequest{0});
  CHECK(none.status().code() == StatusCode::kInvalidArgument);
  CHECK(none.status().message().find("session_id: got 0") != std::string::npos);
  std::string zero = bye.frames[0];
  std::fill(zero.begin() + kHeaderBytes, zero.end(), '\0');
  Frames f;
  f.push_back(FrameOf(zero));
  CHECK(DecodeRequest(std::move(f)).status().code() == StatusCode::kInvalidArgument);
  // A body one byte short names the field.
  std::string shortened = bye.frames[0];
  shortened.pop_back();
  f.clear();
  f.push_back(FrameOf(shortened));
  StatusOr<Request> cut = DecodeRequest(std::move(f));
  CHECK(cut.status().message().find("session_id") != std::string::npos);
}

}  // namespace
}  // namespace kvctl::ipc
