// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: ipc/messages.h
// The messages of the kvctl wire protocol as C++ values: one struct per request and per reply, the
// message-type numbers and the protocol limits. ipc/PROTOCOL.md is the byte-level specification;
// ipc/protocol.h encodes and decodes these structs. Tensor payloads are zmq::message_t frames moved
// in and out of the socket without copying; read them with FrameBytes().
//
// Thread safety: plain values (move-only where they hold frames).
//
//   AppendRequest req{.session_id = s, .sequence_id = 7, .first_position = 0, .n_tokens = 16};
//   req.k = zmq::message_t(k_bytes.data(), k_bytes.size());   // [layers, 16, kv_heads, head_dim]
//   req.v = zmq::message_t(v_bytes.data(), v_bytes.size());
#ifndef KVCTL_IPC_MESSAGES_H_
#define KVCTL_IPC_MESSAGES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "common/tensor.h"
#include "ipc/messages.def"

namespace kvctl::ipc {

// Limits (PROTOCOL.md "Limits") and the header constants, from ipc/messages.def. Decoders reject
// anything outside the limits.
#define KVCTL_WIRE_DECLARE_LIMIT(cpp, PY, type, value) inline constexpr type cpp = value;
KVCTL_WIRE_LIMITS(KVCTL_WIRE_DECLARE_LIMIT)
#undef KVCTL_WIRE_DECLARE_LIMIT

// Message types (messages.def). Values are on the wire: never renumber, never reuse a retired
// number (leave a tombstone comment there). Replies are `request | kReplyBit`; kError answers any
// request.
enum class MsgType : uint16_t {
#define KVCTL_WIRE_DECLARE_TYPE(cpp, NAME, number, Request) cpp = number,
  KVCTL_WIRE_MESSAGE_TYPES(KVCTL_WIRE_DECLARE_TYPE)
#undef KVCTL_WIRE_DECLARE_TYPE
      kError = KVCTL_WIRE_ERROR_TYPE,
};
inline constexpr uint16_t kReplyBit = KVCTL_WIRE_REPLY_BIT;
#define KVCTL_WIRE_TYPE_NUMBER(cpp, NAME, number, Request) number,
inline constexpr uint16_t kRequestTypes[] = {KVCTL_WIRE_MESSAGE_TYPES(KVCTL_WIRE_TYPE_NUMBER)};
#undef KVCTL_WIRE_TYPE_NUMBER
inline constexpr uint16_t kFirstRequestType = kRequestTypes[0];
inline constexpr uint16_t kLastRequestType = kRequestTypes[std::size(kRequestTypes) - 1];
static_assert(kLastRequestType - kFirstRequestType + 1 == std::size(kRequestTypes),
              "messages.def: request types are numbered without gaps");

// "HELLO", "FETCH", "ERROR"; replies read "HELLO_REPLY"; unknown numbers read "0x0042".
std::string TypeName(uint16_t type);

#define KVCTL_WIRE_DECLARE_ENUMERATOR(cpp, PY, number) cpp = number,
enum class PoolLocation : uint8_t { KVCTL_WIRE_ENUM_PoolLocation(KVCTL_WIRE_DECLARE_ENUMERATOR) };
enum class AppendSource : uint8_t { KVCTL_WIRE_ENUM_AppendSource(KVCTL_WIRE_DECLARE_ENUMERATOR) };
enum class FetchMode : uint8_t { KVCTL_WIRE_ENUM_FetchMode(KVCTL_WIRE_DECLARE_ENUMERATOR) };
#undef KVCTL_WIRE_DECLARE_ENUMERATOR

// Quantizer methods are kvctl::QuantMethod values (kernels/quant_types.h, listed in
// messages.def). ipc may not include kernels/, so the controller static_asserts that
// kNumQuantMethods matches.
#define KVCTL_WIRE_COUNT_ONE(cpp, PY, number) +1
inline constexpr uint8_t kNumWireQuantMethods = 0 KVCTL_WIRE_ENUM_QuantMethod(KVCTL_WIRE_COUNT_ONE);
#undef KVCTL_WIRE_COUNT_ONE

// The bytes of a frame, for reading tensor payloads.
inline std::span<const std::byte> FrameBytes(const zmq::message_t& frame) {
  return {static_cast<const std::byte*>(frame.data()), frame.size()};
}

// ---- Requests ----------------------------------------------------------------------------------

// Model geometry a session declares once; APPEND tensors are sized from it.
struct Geometry {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t q_heads = 0;  // Query heads sent with APPEND for scorers; 0 = no Q.
  uint32_t head_dim = 0;
  DType dtype = DType::kF16;
  bool operator==(const Geometry&) const = default;
};

struct HelloRequest {
  uint16_t client_max_version = kProtocolVersion;  // Highest version the client speaks.
  std::string client_name{};                       // 1..256 bytes.
  std::string model_name{};                        // 0..256 bytes.
  Geometry geometry;
};

struct OpenRequest {
  uint64_t session_id = 0;
  uint64_t sequence_id = 0;  // Chosen by the client, unique within its session.
};

struct CloseRequest {
  uint64_t session_id = 0;
  uint64_t sequence_id = 0;
};

struct PingRequest {
  uint64_t session_id = 0;  // 0 = no session (monitoring); otherwise also renews its lease.
};

// Inline: k, v (and q when has_q) hold [layers, n_tokens, heads, head_dim] in the session dtype.
// Staging: the same tensors lie back to back (K, V, Q) at staging_offset of the shm pool and the
// frames are empty. Decoding can only check the tensors against the session geometry once the
// session is known: call CheckAppendShape().
struct AppendRequest {
  uint64_t session_id = 0;
  uint64_t sequence_id = 0;
  uint64_t first_position = 0;  // Position of the first appended token.
  uint32_t n_tokens = 0;        // 1..kMaxAppendTokens.
  AppendSource source = AppendSource::kInline;
  bool has_q = false;
  uint64_t staging_offset = 0;  // Byte offset in the shm pool; 0 for inline.
  zmq::message_t k{}, v{}, q{};
  // Header flag kFlagAppendContinues, not a body field: more tokens of the same prefill follow,
  // so the daemon stores these without evicting (PROTOCOL.md 4.4, "Prefill in several APPENDs").
  bool continues = false;
};

struct FetchRequest {
  uint64_t session_id = 0;
  uint64_t sequence_id = 0;
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;  // Exclusive.
  FetchMode mode = FetchMode::kDense;
  DType out_dtype = DType::kF16;  // Dense K/V rows; blocks mode ignores it (rows stay in the pool).
  // Blocks mode: the page table the client already holds, so the reply lists only what is new
  // (PROTOCOL.md 4.5, "Only what is new"). n_known is 0 (send everything) or the range's pairs;
  // per pair, the records held from an earlier reply and the table_tags entry it gave with them.
  uint32_t n_known = 0;
  std::vector<uint32_t> known_records{};
  std::vector<uint64_t> known_tags{};
};

struct StatsRequest {
  uint64_t session_id = 0;
  std::string section{};  // "" = all sections; otherwise a section name, case-insensitive.
};

// Ends a session: frees its sequences and its staging slot; its id names nothing afterwards.
struct ByeRequest {
  uint64_t session_id = 0;
};

// Stores the sequence's longest exactly cuttable prefix in the cluster tier under the block-hash
// chain of its token ids (PROTOCOL.md 4.9). tokens: one little-endian int32 per token the sequence
// holds, in position order from 0.
struct SavePrefixRequest {
  uint64_t session_id = 0;
  uint64_t sequence_id = 0;
  zmq::message_t tokens{};
};

// Opens sequence_id from the longest stored prefix of the prompt `tokens` (int32 each), or empty
// when none is stored.
struct OpenPrefixRequest {
  uint64_t session_id = 0;
  uint64_t sequence_id = 0;
  zmq::message_t tokens{};
};

// ---- Replies -----------------------------------------------------------------------------------

// The quantizer a session gets by default (per-head bit widths may differ later; FETCH blocks
// replies describe each record layout exactly).
struct QuantInfo {
  uint8_t method = 0;  // kvctl::QuantMethod value.
  uint8_t k_bits = 16;
  uint8_t v_bits = 16;
  uint32_t block_tokens = 32;
  uint32_t sink_tokens = 0;
  uint32_t flush_tokens = 128;  // Multiple of block_tokens.
  bool operator==(const QuantInfo&) const = default;
};

struct HelloReply {
  uint64_t session_id = 0;  // Never 0.
  uint32_t lease_ms = 0;    // The session dies after this long without a request; 0 = no lease.
  std::string server_version{};
  uint64_t pool_bytes = 0;
  uint32_t page_bytes = 0;
  std::string shm_name{};       // POSIX shm object of the pool; "" = no shared pool.
  uint64_t staging_offset = 0;  // The session's staging slot inside the pool.
  uint64_t staging_bytes = 0;   // 0 = no slot (send tensors inline).
  QuantInfo quant;
  // Where the pool lives: host shared memory (shm_name), or CUDA device memory that engines open
  // with cudaIpcOpenMemHandle(cuda_ipc_handle) on device cuda_device.
  PoolLocation pool_location = PoolLocation::kHostShm;
  uint32_t cuda_device = 0;
  std::array<uint8_t, kCudaIpcHandleBytes> cuda_ipc_handle{};  // All zero for host memory.
  // The shm object holding the session's staging slot ([staging_offset, + staging_bytes) of it),
  // writable by this session only; "" = the slot lies in the pool (a device pool's).
  std::string staging_shm_name{};
};

struct OpenReply {};

struct CloseReply {
  uint64_t bytes_freed = 0;
};

struct PingReply {
  uint64_t server_time_us = 0;  // Server monotonic clock.
};

struct AppendReply {
  uint64_t tokens_total = 0;      // Sequence length after the append.
  uint64_t tokens_quantized = 0;  // <= tokens_total.
  uint64_t pool_bytes_used = 0;
};

// Pairs (layer, head) are numbered i = (layer - layer_begin) * kv_heads + head.
struct FetchDenseReply {
  uint32_t layer_begin = 0;
  uint32_t n_layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kF16;
  std::vector<uint32_t> counts{};  // Tokens per pair, n_layers * kv_heads entries.
  zmq::message_t positions{};      // int64 per token, pairs concatenated in order.
  zmq::message_t k{}, v{};         // [count, head_dim] per pair, concatenated, in dtype.
};

// Byte layout of one block record: K and V of block_tokens tokens of one (layer, head), quantized.
// Mirrors kvctl::BlockLayout plus the QuantSpec fields a kernel needs to decode it, and how the
// pair's full-precision window rows (sinks and tail) lie in pool pages.
struct RecordLayout {
  uint8_t method = 0;
  uint8_t k_bits = 0;
  uint8_t v_bits = 0;
  DType row_dtype = DType::kF16;  // Window rows: fp16 when the layer quantizes, else session dtype.
  uint32_t k_group_tokens = 0;
  uint32_t v_group_channels = 0;
  uint32_t record_bytes = 0;  // records_per_page * record_bytes <= page_bytes.
  uint32_t k_codes_offset = 0, k_codes_bytes = 0;
  uint32_t k_meta_offset = 0, k_meta_bytes = 0;
  uint32_t v_codes_offset = 0, v_codes_bytes = 0;
  uint32_t v_meta_offset = 0, v_meta_bytes = 0;
  uint32_t side_bytes_per_token = 0;  // Per-token side record (OScaR norms); 0 = none.
  // Record slots per pool page of the records with this layout: each (layer, head) packs as many
  // records as fit its own record size, so this is per layout, not one value per reply.
  uint32_t records_per_page = 1;  // records_per_page * record_bytes <= page_bytes.
  // One window row slot: the K row (head_dim values of row_dtype), then the V row right after it;
  // row_slot_bytes >= 2 * that row, rows_per_page * row_slot_bytes <= page_bytes.
  uint32_t row_slot_bytes = 0;
  uint32_t rows_per_page = 1;
  bool operator==(const RecordLayout&) const = default;
};

// A page table in FlashInfer's vocabulary (paged_kv_t) with one "request" per (layer, head) pair
// and one FlashInfer page per block record: the records of pair i are
// indices[indptr[i] .. indptr[i+1]); all hold block_tokens tokens except the last, which holds
// last_page_len[i]. A record id x of pair i, with L = layouts[layout_index[i]], lives in the shm
// pool at byte
//   (x / L.records_per_page) * page_bytes + (x % L.records_per_page) * L.record_bytes
// and its side record (if any) id y at
//   (y / side_records_per_page) * page_bytes + (y % side_records_per_page) * block_tokens *
//   side_bytes_per_token.
// The full-precision window (sinks + tail) is in the pool too: pair i's window rows are the row
// slots window_ids[window_indptr[i] .. window_indptr[i+1]) in token order, the first
// window_sinks[i] of them sinks (before the records), the rest the tail (after them); slot w lives
// at (w / L.rows_per_page) * page_bytes + (w % L.rows_per_page) * L.row_slot_bytes. Their
// positions are the runs [run_starts[j], run_starts[j] + run_lengths[j]) for j in
// run_indptr[i] .. run_indptr[i+1], increasing: one run per stretch of consecutive positions
// (without eviction, one for the sinks and one for the tail).
struct FetchBlocksReply {
  uint32_t layer_begin = 0;
  uint32_t n_layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t page_bytes = 0;                // Pool page size.
  uint32_t pool_pages = 0;                // Pages in the pool: every id's page is below it.
  uint32_t block_tokens = 0;              // Tokens per record (FlashInfer page_size).
  uint32_t side_records_per_page = 0;     // Side-record slots per pool page; 0 if no side records.
  std::vector<RecordLayout> layouts{};    // 1..kMaxLayouts distinct layouts.
  std::vector<uint16_t> layout_index{};   // Per pair: index into layouts.
  std::vector<uint32_t> indptr{};         // n_pairs + 1 entries, indptr[0] = 0, non-decreasing.
  std::vector<uint32_t> indices{};        // indptr[n_pairs] record ids.
  std::vector<uint32_t> last_page_len{};  // Per pair: 0 if no records, else 1..block_tokens.
  // Per record: its side record id, or kNoPage if its layout has none. Empty if no layout has
  // side records.
  std::vector<uint32_t> side_indices{};
  std::vector<uint32_t> window_indptr{};  // n_pairs + 1 entries, like indptr.
  std::vector<uint32_t> window_ids{};     // window_indptr[n_pairs] row slot ids.
  std::vector<uint32_t> window_sinks{};   // Per pair: its leading window rows that are sinks.
  std::vector<uint32_t> run_indptr{};     // n_pairs + 1 entries, like indptr.
  std::vector<uint64_t> run_starts{};     // run_indptr[n_pairs] first positions.
  std::vector<uint32_t> run_lengths{};    // Rows of each run, >= 1.
  // Per pair: its first records not listed in indices (the request's known table matched them:
  // the client holds their ids); 0 = all listed. The pair holds record_base[i] + listed records.
  std::vector<uint32_t> record_base{};
  // Per pair: a tag of its whole record id list (the base's ids and the listed ones, side ids
  // included), opaque to clients: sent back as known_tags in a later FETCH.
  std::vector<uint64_t> table_tags{};
};

struct StatsReply {
  std::string text{};  // "# Section\nfield:value\n..." (INFO style), UTF-8.
};

struct ByeReply {
  uint32_t sequences_closed = 0;
  uint64_t bytes_freed = 0;  // Pool bytes of those sequences' pages.
};

struct SavePrefixReply {
  uint64_t saved_tokens = 0;  // Tokens stored (a multiple of tier.prefix_block_tokens); 0 = none.
  uint64_t stored_bytes = 0;  // Bytes written to the tier.
};

struct OpenPrefixReply {
  uint64_t restored_tokens = 0;  // The sequence holds positions 0..restored_tokens-1; 0 = none.
};

struct ErrorReply {
  StatusCode code = StatusCode::kInternal;  // Never kOk.
  std::string message{};
};

using RequestBody =
    std::variant<HelloRequest, OpenRequest, CloseRequest, PingRequest, AppendRequest, FetchRequest,
                 StatsRequest, ByeRequest, SavePrefixRequest, OpenPrefixRequest>;
using ReplyBody = std::variant<HelloReply, OpenReply, CloseReply, PingReply, AppendReply,
                               FetchDenseReply, FetchBlocksReply, StatsReply, ByeReply,
                               SavePrefixReply, OpenPrefixReply, ErrorReply>;

struct Request {
  uint64_t request_id = 0;
  RequestBody body;
};

struct Reply {
  uint64_t request_id = 0;
  ReplyBody body;
};

// The wire type of a body (replies: with kReplyBit; ErrorReply: kError).
MsgType TypeOf(const RequestBody& body);
uint16_t TypeOf(const ReplyBody& body);

}  // namespace kvctl::ipc

#endif  // KVCTL_IPC_MESSAGES_H_
