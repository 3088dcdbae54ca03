// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// libFuzzer harness of the daemon's whole request path: bytes -> frames -> ipc::DecodeRequest ->
// kvctl::Dispatch (the daemon's own dispatch) -> a real Controller over a real shm pool -> the
// reply encoders. One input is a script (tests/fuzz/fuzz_input.h): requests, staging writes,
// clock steps and config reloads, so one input can open a session, stage bytes, append, fetch and
// let leases expire. Session ids 1..8 in a request stand for the script's own HELLOs.
//
// Besides crashes and sanitizer reports it fails (aborts) on:
//   - a decode error other than INVALID_ARGUMENT / UNIMPLEMENTED;
//   - a request that decodes but does not encode back to the same bytes (non-canonical accepted);
//   - an INTERNAL error from the controller (by convention our bug, not the client's);
//   - a reply the encoders refuse (the daemon would send INTERNAL) or the decoder cannot read back;
//   - a FETCH blocks reply naming record bytes outside the pool's pages;
//   - a blocks reply to a known table that, merged with the table it was asked with, is not the
//     whole table a FETCH without one gets (known_records[i] = 0xFFFFFFFF with tag 0 in an input
//     stands for the count and tag of the harness's last whole table, as a client that keeps it);
//   - pages or staging slots still in use once every session's lease has expired.
// Each input ends with every session expired, so inputs do not leak state into each other; the
// controller (and its shm pool) is recreated every kInputsPerController inputs all the same.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "controller/config/config.h"
#include "controller/service/controller.h"
#include "controller/service/dispatch.h"
#include "ipc/client.h"
#include "ipc/protocol.h"
#include "tests/fuzz/fuzz_input.h"

namespace kvctl::fuzz {
namespace {

constexpr int kLeaseMs = 2000;
constexpr uint64_t kInputsPerController = 20000;
constexpr uint64_t kPoolBytes = 256 << 10;

// A small pool (64 pages of 4 KiB: kPoolBytes, below the 1 MiB a config accepts, set after
// validation; two 64 KiB staging slots) so that pool pressure, slab compaction on a full pool,
// width lowering, staging exhaustion and inline fallbacks are all reachable with short inputs. The
// [[model]] tables let a HELLO's model_name pick each quantizer with blocks of 8 tokens, so a few
// tokens quantize; kvarn and quarot spread their flushes over 3 and 2 appends
// (quant.flush_spread_steps), kvarn and turbo hold them for after the reply
// (quant.flush_after_reply), so held tails and their images are reached too. kivi and oscar keep
// v_group_channels 32: head_dim must be a multiple of 32 for
// them (the registry defaults are checked at the session's head_dim before the configured values
// apply). APPENDs preparing 8 tokens or more prepare their layers on two threads
// (server.prepare_split_tokens), as large dense FETCHes decode on two.
constexpr const char* kBaseToml = R"(
[server]
lease_ms = 2000
quality_sample_period = 3
dense_fetch_split_rows = 24
prepare_split_tokens = 8
[pool]
bytes = "1MiB"
page_bytes = "4KiB"
staging_bytes_per_session = "64KiB"
staging_slots = 2
unlink_stale = true
[quant]
method = "kivi"
k_bits = 2
v_bits = 2
block_tokens = 8
k_group_tokens = 8
sink_tokens = 2
flush_tokens = 16
[[model]]
name = "fp16"
method = "fp16"
k_bits = 16
v_bits = 16
[[model]]
name = "lossless"
lossless = true
[[model]]
name = "quarot"
method = "quarot"
k_bits = 4
v_bits = 2
flush_spread_steps = 2
[[model]]
name = "kvarn"
method = "kvarn"
k_bits = 4
v_bits = 2
sink_tokens = 4
flush_spread_steps = 3
flush_after_reply = true
[[model]]
name = "turbo"
method = "turbo"
k_bits = 3
v_bits = 2
flush_after_reply = true
[[model]]
name = "mixed"
method = "kivi"
[[model.override]]
layer = 0
head = -1
k_bits = 8
v_bits = 4
[[model.override]]
layer = 1
head = 1
k_bits = 4
v_bits = 8
)";

// Variants that do not evict add it: eviction refuses a config that has oscar anywhere.
constexpr const char* kOscarModel = R"(
[[model]]
name = "oscar"
method = "oscar"
k_bits = 2
v_bits = 4
)";

// RELOAD variants: [budget] / [evict] settings appended to kBaseToml. Variant 0 is the start state.
// The streaming budget (28) holds two of the base model's 8-token records past its 2 sinks, so
// its compressions reach evict.whole_records' record-boundary cut. The R-KV variant keeps (layer 1,
// head 1) whole (evict.full_heads): the others' budgets shrink as it grows, down to the floor, and
// a session without that pair is refused at OPEN.
std::vector<std::string> VariantTomls() {
  return {
      kOscarModel,
      R"(
[budget]
mode = "evict-only"
tokens_per_head = 28
[evict]
policy = "streaming"
sinks = 2
window = 4
compression_period = 4
stagger_layers = true
)",
      R"(
[budget]
mode = "evict-only"
tokens_per_head = 16
realloc_period = 8
[evict]
policy = "h2o"
sinks = 2
window = 4
obs_window = 4
compression_period = 2
)",
      R"(
[budget]
mode = "evict-only"
token_fraction = 0.5
layer_profile = "pyramid"
[evict]
policy = "snapkv"
sinks = 1
window = 4
obs_window = 4
kernel = 3
compression_period = 1
)",
      R"(
[budget]
mode = "evict-only"
tokens_per_head = 14
[evict]
policy = "rkv"
sinks = 2
window = 4
obs_window = 2
kernel = 3
compression_period = 3
stagger_layers = true
full_heads = "1:1"
)",
      R"(
[budget]
pressure = "requantize"
pressure_min_bits = 2
pressure_scope = "pool"
)" + std::string(kOscarModel),
      R"(
[budget]
pressure = "requantize"
pressure_scope = "sequence"
)" + std::string(kOscarModel),
      // A budget growing at 0.9 of the tokens: the staggered turns come every 4 / (2 x 0.1) = 20
      // tokens (StaggerInterval), not every period.
      R"(
[budget]
mode = "evict-only"
token_fraction = 0.9
[evict]
policy = "snapkv"
sinks = 1
window = 4
obs_window = 4
compression_period = 4
stagger_layers = true
)",
      // A memory budget (AimEvictionAtMemory): the token budget follows from the layers' record
      // bytes, fp16 tails and sinks, and grows at a share that differs per model. (Layer 0, head
      // 1) is kept whole, so OPEN's outlook takes the other heads' onset from the aimed fraction,
      // or warns that the full head fills it.
      R"(
[budget]
mode = "evict-only"
fp16_fraction = 0.3
[evict]
policy = "rkv"
sinks = 1
window = 4
obs_window = 4
compression_period = 4
stagger_layers = true
full_heads = "0:1"
)",
  };
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "request_path_fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string FrameText(const ipc::Frames& frames) {
  std::string out;
  for (const zmq::message_t& f : frames) {
    out += std::to_string(f.size()) + ":";
    out.append(static_cast<const char*>(f.data()), f.size());
  }
  return out;
}

class Harness {
 public:
  Harness() : verbose_(std::getenv("KVCTL_FUZZ_VERBOSE") != nullptr) {
    const std::vector<std::string> tomls = VariantTomls();
    for (size_t i = 0; i < tomls.size(); ++i) {
      Config config;
      Status s = ApplyToml(config, std::string(kBaseToml) + tomls[i], "request_path_fuzz");
      if (s.ok()) s = ValidateConfig(config);
      if (!s.ok()) Fail("config variant " + std::to_string(i) + ": " + s.ToString());
      config.pool.bytes = kPoolBytes;
      variants_.push_back(std::move(config));
    }
  }

  ~Harness() {
    UnmapStaging();
    DropController();
  }

  void Run(std::span<const uint8_t> input) {
    if (!controller_ || inputs_ % kInputsPerController == 0) NewController();
    ++inputs_;
    Check(controller_->Reload(variants_[0]), "reload of variant 0");
    hellos_.clear();
    last_blocks_.reset();
    UnmapStaging();
    ScriptReader script(input);
    while (!script.done()) {
      const uint8_t kind = script.U8();
      switch (static_cast<StepKind>(kind & 3)) {
        case StepKind::kRequest:
          Request(script, (kind & kRelativeStagingFlag) != 0);
          break;
        case StepKind::kStage:
          Stage(script);
          break;
        case StepKind::kClock:
          now_ += std::chrono::milliseconds(script.U16());
          controller_->ExpireLeases(now_);
          break;
        case StepKind::kReload:
          Check(controller_->Reload(variants_[script.U8() % variants_.size()]), "reload");
          break;
      }
    }
    // Every session ends; nothing may stay allocated but the prefixes the local prefix cache
    // holds (frozen, read by no sequence now).
    now_ += std::chrono::milliseconds(kLeaseMs + 1);
    controller_->ExpireLeases(now_);
    const PoolStats pool = controller_->pool_stats();
    const uint64_t frozen = controller_->prefix_frozen_bytes();
    if (uint64_t{pool.pages_used} * pool.page_bytes != frozen || pool.staging_slots_used != 0) {
      Fail("after every lease expired: " + std::to_string(pool.pages_used) + " pages (" +
           std::to_string(frozen) + " bytes of cached prefixes) and " +
           std::to_string(pool.staging_slots_used) + " staging slots still in use");
    }
  }

 private:
  void Check(const Status& s, const char* what) {
    if (!s.ok()) Fail(std::string(what) + ": " + s.ToString());
  }

  void NewController() {
    DropController();
    Config config = variants_[0];
    // Controllers cycle through the integrity settings: checksums with FETCH verifying only the
    // chunks written since their last check (the default; a blocks FETCH with little left to
    // verify takes the light, I/O-thread path), checksums with every FETCH verifying everything,
    // and no checksums (every blocks FETCH light).
    config.pool.checksums = controllers_ % 3 != 2;
    config.pool.verify_on_fetch =
        controllers_ % 3 == 1 ? VerifyOnFetch::kAll : VerifyOnFetch::kUnverified;
    config.pool.shm_name =
        "/kvctl-fuzz-" + std::to_string(getpid()) + "-" + std::to_string(controllers_++);
    StatusOr<std::unique_ptr<Controller>> controller = Controller::Create(config);
    Check(controller.status(), "Controller::Create");
    controller_ = std::move(controller).value();
    controller_->EnableHeldFlushQueue();  // As the daemon does; run after replies (below).
    // Variant configs must name the same pool for Reload to accept them.
    for (Config& v : variants_) {
      v.pool.shm_name = config.pool.shm_name;
      v.pool.checksums = config.pool.checksums;
      v.pool.verify_on_fetch = config.pool.verify_on_fetch;
    }
    // The client's view of the pool (staging slots of a pool without per-session objects).
    const int fd = shm_open(config.pool.shm_name.c_str(), O_RDWR, 0);
    if (fd < 0) Fail("shm_open " + config.pool.shm_name);
    pool_bytes_ = config.pool.bytes;
    void* map = mmap(nullptr, pool_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) Fail("mmap of the pool");
    pool_map_ = static_cast<uint8_t*>(map);
    pages_end_ = static_cast<uint64_t>(controller_->pool_stats().pages_total) *
                 controller_->pool_stats().page_bytes;
  }

  void DropController() {
    if (pool_map_ != nullptr) munmap(pool_map_, pool_bytes_);
    pool_map_ = nullptr;
    controller_.reset();
  }

  // The client's writable view of a session's staging slot: its own shm object (mapped up to the
  // slot's end), or the pool when the reply names none. {null, 0} when there is no slot.
  std::pair<uint8_t*, size_t> MapStaging(const ipc::HelloReply& h) {
    if (h.staging_bytes == 0) return {nullptr, 0};
    if (h.staging_shm_name.empty()) return {pool_map_, 0};
    const int fd = shm_open(h.staging_shm_name.c_str(), O_RDWR, 0);
    if (fd < 0) Fail("shm_open of the staging object " + h.staging_shm_name);
    const size_t bytes = h.staging_offset + h.staging_bytes;
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) Fail("mmap of the staging object " + h.staging_shm_name);
    return {static_cast<uint8_t*>(map), bytes};
  }

  void UnmapStaging() {
    for (const auto& [base, bytes] : staging_maps_) {
      if (bytes > 0) munmap(base, bytes);
    }
    staging_maps_.clear();
  }

  // The script's HELLO that created `session_id`, or null.
  const ipc::HelloReply* HelloOf(uint64_t session_id) const {
    for (const ipc::HelloReply& h : hellos_) {
      if (h.session_id == session_id) return &h;
    }
    return nullptr;
  }

  void Stage(ScriptReader& script) {
    const uint8_t session = script.U8();
    const uint16_t offset = script.U16();
    std::span<const uint8_t> bytes = script.Bytes(script.U16());
    if (hellos_.empty()) return;
    const ipc::HelloReply& h = hellos_[session % hellos_.size()];
    if (h.staging_bytes == 0 || offset >= h.staging_bytes) return;
    const size_t n = std::min<uint64_t>(bytes.size(), h.staging_bytes - offset);
    uint8_t* base = staging_maps_[session % hellos_.size()].first;
    if (base != nullptr) std::memcpy(base + h.staging_offset + offset, bytes.data(), n);
  }

  void Request(ScriptReader& script, bool relative_staging) {
    const int n_frames = 1 + script.U8() % 4;
    ipc::Frames frames;
    for (int i = 0; i < n_frames; ++i) {
      std::span<const uint8_t> bytes = script.Bytes(script.U16());
      zmq::message_t frame(bytes.size());
      if (!bytes.empty()) std::memcpy(frame.data(), bytes.data(), bytes.size());
      frames.push_back(std::move(frame));
    }
    now_ += std::chrono::milliseconds(1);
    const std::string sent = FrameText(frames);
    const uint64_t peek_id = ipc::PeekRequestId(frames[0]);
    StatusOr<ipc::Request> decoded = ipc::DecodeRequest(std::move(frames));
    if (!decoded.ok()) {
      const StatusCode code = decoded.status().code();
      if (code != StatusCode::kInvalidArgument && code != StatusCode::kUnimplemented) {
        Fail("DecodeRequest: unexpected code: " + decoded.status().ToString());
      }
      CheckReplyRoundTrip(ipc::EncodeError(peek_id, decoded.status()));
      return;
    }
    // Only canonical bytes decode: the request encodes back to exactly what was sent.
    const uint64_t request_id = decoded->request_id;
    StatusOr<ipc::Frames> reencoded = ipc::Encode(request_id, std::move(decoded->body));
    if (!reencoded.ok())
      Fail("a decoded request does not encode: " + reencoded.status().ToString());
    if (FrameText(*reencoded) != sent) Fail("a decoded request encodes to other bytes");
    StatusOr<ipc::Request> request = ipc::DecodeRequest(std::move(reencoded).value());
    Check(request.status(), "decoding a re-encoded request");

    std::visit(
        [&](auto& body) {
          if constexpr (requires { body.session_id; }) {
            if (body.session_id >= 1 && body.session_id <= kMaxScriptSessions &&
                body.session_id <= hellos_.size()) {
              body.session_id = hellos_[body.session_id - 1].session_id;
            }
          }
        },
        request->body);
    if (auto* append = std::get_if<ipc::AppendRequest>(&request->body);
        append && relative_staging && append->source == ipc::AppendSource::kStaging) {
      if (const ipc::HelloReply* h = HelloOf(append->session_id)) {
        append->staging_offset += h->staging_offset;
      }
    }

    const bool asked_held = FillKnown(request->body);

    const uint16_t type = static_cast<uint16_t>(ipc::TypeOf(request->body));
    // As the daemon does: a small APPEND or a FETCH is first offered to the light path (its I/O
    // thread's), and goes to Dispatch only when handed back. Small limits, so the fuzzer's short
    // sequences take both ways, and dense FETCHes past 24 rows decode on two threads.
    bool deferred = false;
    StatusOr<ipc::ReplyBody> reply = DispatchLight(
        *controller_, request->body, now_,
        {.append_tokens = 4, .blocks_fetch = true, .dense_fetch_rows = 48}, &deferred);
    if (deferred) reply = Dispatch(*controller_, request->body, now_);
    controller_->RecordRequest(type, std::chrono::microseconds(1), !reply.ok());
    // The daemon runs held flushes on a worker after the reply; here after every odd request id,
    // so tails also stay held over several appends (and the image, FETCH and CLOSE paths see
    // them).
    if ((request_id & 1) != 0 && controller_->HeldFlushesQueued()) controller_->RunHeldFlushes();
    if (verbose_) {
      std::fprintf(stderr, "%s -> %s\n", ipc::TypeName(type).c_str(),
                   reply.ok() ? "OK" : reply.status().ToString().c_str());
    }
    if (!reply.ok()) {
      if (reply.status().code() == StatusCode::kInternal) {
        Fail("INTERNAL from the controller: " + reply.status().ToString());
      }
      CheckReplyRoundTrip(ipc::EncodeError(request_id, reply.status()));
      return;
    }
    if (const auto* hello = std::get_if<ipc::HelloReply>(&*reply)) {
      hellos_.push_back(*hello);
      staging_maps_.push_back(MapStaging(*hello));
    }
    StatusOr<ipc::Frames> out = ipc::Encode(request_id, std::move(reply).value());
    if (!out.ok()) Fail("the controller built an invalid reply: " + out.status().ToString());
    const ipc::Reply back = CheckReplyRoundTrip(std::move(out).value());
    if (const auto* blocks = std::get_if<ipc::FetchBlocksReply>(&back.body)) {
      CheckRecords(*blocks);
      const auto& fetch = std::get<ipc::FetchRequest>(request->body);
      last_blocks_ = fetch.n_known == 0 ? *blocks : CheckMerge(fetch, *blocks, asked_held);
    }
  }

  // Fills the entries of a FETCH's known table that stand for the last whole table (count
  // 0xFFFFFFFF, tag 0) from it, pair by pair, when it covers as many pairs. Returns whether it
  // did, i.e. whether the request holds a table this harness was given.
  bool FillKnown(ipc::RequestBody& body) {
    auto* fetch = std::get_if<ipc::FetchRequest>(&body);
    if (fetch == nullptr || fetch->n_known == 0 || !last_blocks_ ||
        last_blocks_->last_page_len.size() != fetch->n_known) {
      return false;
    }
    bool filled = false;
    for (uint32_t i = 0; i < fetch->n_known; ++i) {
      if (fetch->known_records[i] != UINT32_MAX || fetch->known_tags[i] != 0) continue;
      fetch->known_records[i] = last_blocks_->indptr[i + 1] - last_blocks_->indptr[i];
      fetch->known_tags[i] = last_blocks_->table_tags[i];
      filled = true;
    }
    return filled;
  }

  // The reply to a FETCH with a known table, merged with the table it names: equal to the whole
  // table of the same FETCH without one (asked right after; a FETCH changes no record). Only
  // where the harness filled the table in does it know what the client holds.
  ipc::FetchBlocksReply CheckMerge(const ipc::FetchRequest& fetch,
                                   const ipc::FetchBlocksReply& reply, bool asked_held) {
    ipc::FetchRequest plain = fetch;
    plain.n_known = 0;
    plain.known_records.clear();
    plain.known_tags.clear();
    StatusOr<ipc::ReplyBody> whole_body = Dispatch(*controller_, plain, now_);
    if (!whole_body.ok())
      Fail("a FETCH without its known table failed: " + whole_body.status().ToString());
    auto whole = std::get<ipc::FetchBlocksReply>(std::move(whole_body).value());
    if (whole.table_tags != reply.table_tags) Fail("a known table changed the table tags");
    if (!asked_held) return whole;
    for (uint32_t i = 0; i < fetch.n_known; ++i) {
      if (reply.record_base[i] != 0 && reply.record_base[i] != fetch.known_records[i]) {
        Fail("record_base is neither 0 nor the known count");
      }
      // An entry the input gave itself (a count and tag the fuzzer found) is not the held
      // table's: the client holds nothing the harness knows to merge with.
      const bool from_held =
          fetch.known_records[i] == last_blocks_->indptr[i + 1] - last_blocks_->indptr[i] &&
          fetch.known_tags[i] == last_blocks_->table_tags[i];
      if (reply.record_base[i] != 0 && !from_held) return whole;
    }
    StatusOr<ipc::FetchBlocksReply> merged = ipc::MergeBlocksReply(*last_blocks_, reply);
    Check(merged.status(), "merging a blocks reply with the held table");
    if (merged->indices != whole.indices || merged->indptr != whole.indptr ||
        merged->side_indices != whole.side_indices) {
      Fail("a blocks reply merged with the held table is not the whole table");
    }
    return whole;
  }

  // What a client would read: the reply decodes (so its structure is valid).
  ipc::Reply CheckReplyRoundTrip(ipc::Frames frames) {
    StatusOr<ipc::Reply> back = ipc::DecodeReply(std::move(frames));
    if (!back.ok()) Fail("an encoded reply does not decode: " + back.status().ToString());
    return std::move(back).value();
  }

  // Every record, side record and window row slot a blocks reply names lies inside the pool's
  // pages. The decoder has checked the reply's structure (indices, indptr, layout_index).
  void CheckRecords(const ipc::FetchBlocksReply& r) {
    const uint64_t pairs = static_cast<uint64_t>(r.n_layers) * r.kv_heads;
    for (uint64_t i = 0; i < pairs; ++i) {
      const ipc::RecordLayout& l = r.layouts[r.layout_index[i]];
      for (uint32_t j = r.indptr[i]; j < r.indptr[i + 1]; ++j) {
        const uint64_t x = r.indices[j];
        const uint64_t at =
            (x / l.records_per_page) * r.page_bytes + (x % l.records_per_page) * l.record_bytes;
        if (at + l.record_bytes > pages_end_)
          Fail("a blocks reply names a record outside the pool");
        if (r.side_indices.empty() || r.side_indices[j] == ipc::kNoPage) continue;
        const uint64_t y = r.side_indices[j];
        const uint64_t side_bytes = static_cast<uint64_t>(r.block_tokens) * l.side_bytes_per_token;
        const uint64_t side_at = (y / r.side_records_per_page) * r.page_bytes +
                                 (y % r.side_records_per_page) * side_bytes;
        if (side_at + side_bytes > pages_end_) {
          Fail("a blocks reply names a side record outside the pool");
        }
      }
      for (uint32_t j = r.window_indptr[i]; j < r.window_indptr[i + 1]; ++j) {
        const uint64_t w = r.window_ids[j];
        const uint64_t at =
            (w / l.rows_per_page) * r.page_bytes + (w % l.rows_per_page) * l.row_slot_bytes;
        if (at + l.row_slot_bytes > pages_end_) {
          Fail("a blocks reply names a window row outside the pool");
        }
      }
    }
  }

  const bool verbose_;  // KVCTL_FUZZ_VERBOSE set: print each request's outcome (reading seeds).
  std::vector<Config> variants_;
  std::unique_ptr<Controller> controller_;
  uint8_t* pool_map_ = nullptr;
  uint64_t pool_bytes_ = 0;
  uint64_t pages_end_ = 0;
  uint64_t inputs_ = 0;
  uint64_t controllers_ = 0;
  // A virtual clock, far from the epoch so that lease arithmetic never goes below it.
  SteadyTime now_ = SteadyTime() + std::chrono::hours(24);
  std::vector<ipc::HelloReply> hellos_;               // This input's successful HELLOs, in order.
  std::optional<ipc::FetchBlocksReply> last_blocks_;  // This input's last whole blocks table.
  // Per HELLO: where the client writes its staging slot, and the bytes mapped (0 = the pool's).
  std::vector<std::pair<uint8_t*, size_t>> staging_maps_;
};

}  // namespace
}  // namespace kvctl::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Destroyed at exit, which removes the shm pool.
  static kvctl::fuzz::Harness harness;
  harness.Run(std::span<const uint8_t>(data, size));
  return 0;
}
