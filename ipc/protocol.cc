// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "ipc/protocol.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "common/checked_math.h"
#include "ipc/protocol_internal.h"
#include "ipc/wire_fields.h"

namespace kvctl::ipc {

// Tensor frames and int64 positions are raw little-endian memory; a big-endian port would need
// byte swaps on every payload.
static_assert(std::endian::native == std::endian::little, "kvctl's wire format is little-endian");

// The last kvctl::StatusCode (common/status.h); error replies carry 1..kLastStatusCode.
constexpr uint32_t kLastStatusCode = WireEnum<StatusCode>::kMax;

std::string TypeName(uint16_t type) {
#define KVCTL_WIRE_TYPE_NAME(cpp, NAME, number, Request) #NAME,
  static constexpr const char* kNames[] = {KVCTL_WIRE_MESSAGE_TYPES(KVCTL_WIRE_TYPE_NAME)};
#undef KVCTL_WIRE_TYPE_NAME
  if (type == static_cast<uint16_t>(MsgType::kError)) return "ERROR";
  const uint16_t base = type & ~kReplyBit;
  if (base >= kFirstRequestType && base <= kLastRequestType) {
    return std::string(kNames[base - kFirstRequestType]) + ((type & kReplyBit) ? "_REPLY" : "");
  }
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%04X", type);
  return hex;
}

// ---- Shared field checks
// -------------------------------------------------------------------------

Status CheckRange(std::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return InvalidArgument(field, ": got ", value, ", expected ", lo, "..", hi);
  }
  return OkStatus();
}

Status CheckHeadDim(std::string_view field, uint32_t head_dim) {
  if (head_dim < kMinHeadDim || head_dim > kMaxHeadDim || head_dim % 8 != 0) {
    return InvalidArgument(field, ": got ", head_dim, ", expected a multiple of 8 in ", kMinHeadDim,
                           "..", kMaxHeadDim);
  }
  return OkStatus();
}

Status CheckString(std::string_view field, const std::string& s, size_t min_bytes,
                   size_t max_bytes) {
  if (s.size() < min_bytes || s.size() > max_bytes) {
    return InvalidArgument(field, ": length ", s.size(), " bytes, expected ", min_bytes, "..",
                           max_bytes);
  }
  if (!IsValidUtf8(s)) return InvalidArgument(field, ": not valid UTF-8 (or contains NUL)");
  return OkStatus();
}

Status CheckDType(std::string_view field, DType dtype) {
  return CheckRange(field, static_cast<uint8_t>(dtype), WireEnum<DType>::kMin,
                    WireEnum<DType>::kMax);
}

Status CheckTensorFrame(std::string_view field, const zmq::message_t& frame, uint64_t expected) {
  if (frame.size() != expected) {
    return InvalidArgument(field, ": frame has ", frame.size(), " bytes, expected ", expected);
  }
  if (expected > kMaxTensorFrameBytes) {
    return InvalidArgument(field, ": ", expected, " bytes exceed the frame limit of ",
                           kMaxTensorFrameBytes);
  }
  return OkStatus();
}

Status CheckPositions(std::string_view field, const zmq::message_t& frame) {
  const auto* p = static_cast<const uint8_t*>(frame.data());
  for (size_t i = 0; i + 8 <= frame.size(); i += 8) {
    int64_t pos;
    std::memcpy(&pos, p + i, 8);  // Frames need not be 8-byte aligned.
    if (pos < 0 || pos >= kMaxPosition) {
      return InvalidArgument(field, "[", i / 8, "]: got ", pos, ", expected 0..", kMaxPosition - 1);
    }
  }
  return OkStatus();
}

StatusOr<uint64_t> RowBytes(std::string_view field, uint64_t rows, uint32_t head_dim, DType dtype) {
  uint64_t bytes;
  if (MulOverflow(rows, head_dim, &bytes) || MulOverflow(bytes, DTypeSize(dtype), &bytes)) {
    return InvalidArgument(field, ": ", rows, " rows of ", head_dim, " elements overflow");
  }
  return bytes;
}

Status ValidateGeometry(const Geometry& g) {
  KVCTL_RETURN_IF_ERROR(CheckRange("layers", g.layers, 1, kMaxLayers));
  KVCTL_RETURN_IF_ERROR(CheckRange("kv_heads", g.kv_heads, 1, kMaxHeads));
  KVCTL_RETURN_IF_ERROR(CheckRange("q_heads", g.q_heads, 0, kMaxHeads));
  if (g.q_heads % g.kv_heads != 0) {
    return InvalidArgument("q_heads: got ", g.q_heads, ", expected 0 or a multiple of kv_heads (",
                           g.kv_heads, ")");
  }
  KVCTL_RETURN_IF_ERROR(CheckHeadDim("head_dim", g.head_dim));
  return CheckDType("dtype", g.dtype);
}

// ---- Header
// --------------------------------------------------------------------------------------

StatusOr<Header> DecodeHeader(const zmq::message_t& frame0) {
  if (frame0.size() > kMaxHeaderFrameBytes) {
    return InvalidArgument("frame 0: ", frame0.size(), " bytes, expected at most ",
                           kMaxHeaderFrameBytes);
  }
  if (frame0.size() < kHeaderBytes) {
    return InvalidArgument("header: frame 0 has ", frame0.size(), " bytes, expected at least ",
                           kHeaderBytes);
  }
  WireReader r(frame0.data(), frame0.size(), 0);
  uint32_t magic;
  Header h;
  KVCTL_RETURN_IF_ERROR(r.U32("magic", &magic));
  if (magic != kMagic) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "magic: got 0x%08X, expected 0x%08X (\"KVCT\")", magic, kMagic);
    return InvalidArgument(buf);
  }
  KVCTL_RETURN_IF_ERROR(r.U16("version", &h.version));
  KVCTL_RETURN_IF_ERROR(r.U16("type", &h.type));
  KVCTL_RETURN_IF_ERROR(r.U64("request_id", &h.request_id));
  KVCTL_RETURN_IF_ERROR(r.U16("flags", &h.flags));
  if (h.version != kProtocolVersion) {
    return InvalidArgument("version: got ", h.version, ", expected ", kProtocolVersion);
  }
  if ((h.flags & ~kKnownHeaderFlags) != 0) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "flags: got 0x%04X, expected only bit 0 (0x0001, APPEND_CONTINUES); every "
                  "other bit is reserved in version 1",
                  unsigned{h.flags});
    return InvalidArgument(buf);
  }
  return h;
}

uint64_t PeekRequestId(const zmq::message_t& frame0) {
  WireReader r(frame0.data(), frame0.size(), 0);
  uint32_t magic;
  uint16_t version, type;
  uint64_t id;
  if (!r.U32("", &magic).ok() || magic != kMagic || !r.U16("", &version).ok() ||
      !r.U16("", &type).ok() || !r.U64("", &id).ok()) {
    return 0;
  }
  return id;
}

namespace {

void WriteHeader(WireWriter& w, uint16_t type, uint64_t request_id, uint16_t flags) {
  w.U32(kMagic);
  w.U16(kProtocolVersion);
  w.U16(type);
  w.U64(request_id);
  w.U16(flags);
}

// The header flags a message carries: only APPEND has one (PROTOCOL.md 2.1).
template <typename M>
uint16_t HeaderFlags(const M&) {
  return 0;
}
uint16_t HeaderFlags(const AppendRequest& m) { return m.continues ? kFlagAppendContinues : 0; }

// A known flag bit on a message it does not belong to (DecodeHeader refused unknown bits).
Status CheckFlagsFor(uint16_t type, uint16_t flags) {
  const uint16_t allowed = type == static_cast<uint16_t>(MsgType::kAppend) ? kKnownHeaderFlags : 0;
  if ((flags & ~allowed) == 0) return OkStatus();
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "flags: got 0x%04X on %s, expected 0 (APPEND_CONTINUES, 0x0001, is valid only on "
                "APPEND)",
                unsigned{flags}, TypeName(type).c_str());
  return InvalidArgument(buf);
}

Status CheckSession(uint64_t session_id) {
  if (session_id == 0) return InvalidArgument("session_id: got 0, expected a session from HELLO");
  return OkStatus();
}

// Defaults for messages without tensor frames.
template <typename M>
size_t TensorFrameCount(const M&) {
  return 0;
}
template <typename M>
void TakeTensorFrames(M&, Frames*) {}
template <typename M>
Status PutTensorFrames(Frames&, M*) {
  return OkStatus();
}

// ---- HELLO ----

Status Validate(const HelloRequest& m) {
  KVCTL_RETURN_IF_ERROR(CheckRange("client_max_version", m.client_max_version, 1, UINT16_MAX));
  KVCTL_RETURN_IF_ERROR(CheckString("client_name", m.client_name, 1, kMaxNameBytes));
  KVCTL_RETURN_IF_ERROR(CheckString("model_name", m.model_name, 0, kMaxNameBytes));
  return ValidateGeometry(m.geometry);
}

Status Validate(const HelloReply& m) {
  KVCTL_RETURN_IF_ERROR(CheckSession(m.session_id));
  KVCTL_RETURN_IF_ERROR(CheckString("server_version", m.server_version, 1, kMaxNameBytes));
  KVCTL_RETURN_IF_ERROR(CheckRange("page_bytes", m.page_bytes, 1, UINT32_MAX));
  KVCTL_RETURN_IF_ERROR(CheckString("shm_name", m.shm_name, 0, kMaxShmNameBytes));
  if (m.staging_bytes == 0 && m.staging_offset != 0) {
    return InvalidArgument("staging_offset: got ", m.staging_offset,
                           ", expected 0 when staging_bytes is 0");
  }
  const bool on_device = m.pool_location == PoolLocation::kCudaDevice;
  KVCTL_RETURN_IF_ERROR(CheckString("staging_shm_name", m.staging_shm_name, 0, kMaxShmNameBytes));
  const bool own_object = !m.staging_shm_name.empty();
  if (own_object && (on_device || m.staging_bytes == 0)) {
    return InvalidArgument("staging_shm_name: got \"", m.staging_shm_name,
                           "\", expected none for a device pool or a session without staging");
  }
  // A slot in its own object is bounded by that object (which the client checks when it maps it).
  uint64_t end;
  if (m.staging_bytes > 0 && (AddOverflow(m.staging_offset, m.staging_bytes, &end) ||
                              (!own_object && end > m.pool_bytes))) {
    return InvalidArgument("staging slot: offset ", m.staging_offset, " + bytes ", m.staging_bytes,
                           " ends past pool_bytes ", m.pool_bytes);
  }
  const bool handle_zero = std::all_of(m.cuda_ipc_handle.begin(), m.cuda_ipc_handle.end(),
                                       [](uint8_t byte) { return byte == 0; });
  if (on_device && !m.shm_name.empty()) {
    return InvalidArgument("shm_name: got \"", m.shm_name,
                           "\", expected none for a pool in device memory (pool_location 1)");
  }
  if (!on_device && (!handle_zero || m.cuda_device != 0)) {
    return InvalidArgument(
        "cuda_ipc_handle/cuda_device: got a handle that is not all zero or "
        "device ",
        m.cuda_device, ", expected zeros for a pool in host memory");
  }
  if (m.staging_bytes > 0 && !on_device && m.shm_name.empty()) {
    return InvalidArgument("shm_name: empty, expected the pool's shm name when staging_bytes is ",
                           m.staging_bytes);
  }
  const QuantInfo& q = m.quant;
  KVCTL_RETURN_IF_ERROR(CheckRange("quant.method", q.method, 0, kNumWireQuantMethods - 1));
  KVCTL_RETURN_IF_ERROR(CheckRange("quant.k_bits", q.k_bits, 1, 16));
  KVCTL_RETURN_IF_ERROR(CheckRange("quant.v_bits", q.v_bits, 1, 16));
  KVCTL_RETURN_IF_ERROR(CheckRange("quant.block_tokens", q.block_tokens, 1, kMaxBlockTokens));
  if (q.flush_tokens == 0 || q.flush_tokens % q.block_tokens != 0) {
    return InvalidArgument("quant.flush_tokens: got ", q.flush_tokens,
                           ", expected a positive multiple of block_tokens (", q.block_tokens, ")");
  }
  return OkStatus();
}

// ---- OPEN / CLOSE / PING ----

Status Validate(const OpenRequest& m) { return CheckSession(m.session_id); }

Status Validate(const CloseRequest& m) { return CheckSession(m.session_id); }

Status Validate(const PingRequest&) { return OkStatus(); }

Status Validate(const OpenReply&) { return OkStatus(); }

Status Validate(const CloseReply&) { return OkStatus(); }

Status Validate(const PingReply&) { return OkStatus(); }

// ---- APPEND ----

size_t TensorFrameCount(const AppendRequest& m) {
  if (m.source == AppendSource::kStaging) return 0;
  return m.has_q ? 3 : 2;
}
void TakeTensorFrames(AppendRequest& m, Frames* out) {
  if (m.source == AppendSource::kStaging) return;
  out->push_back(std::move(m.k));
  out->push_back(std::move(m.v));
  if (m.has_q) out->push_back(std::move(m.q));
}
Status PutTensorFrames(Frames& in, AppendRequest* m) {
  if (m->source == AppendSource::kStaging) return OkStatus();
  m->k = std::move(in[1]);
  m->v = std::move(in[2]);
  if (m->has_q) m->q = std::move(in[3]);
  return OkStatus();
}
Status Validate(const AppendRequest& m) {
  KVCTL_RETURN_IF_ERROR(CheckSession(m.session_id));
  KVCTL_RETURN_IF_ERROR(CheckRange("n_tokens", m.n_tokens, 1, kMaxAppendTokens));
  KVCTL_RETURN_IF_ERROR(
      CheckRange("first_position", m.first_position, 0, kMaxPosition - m.n_tokens));
  KVCTL_RETURN_IF_ERROR(CheckRange("source", static_cast<uint8_t>(m.source),
                                   WireEnum<AppendSource>::kMin, WireEnum<AppendSource>::kMax));
  if (m.source == AppendSource::kStaging) {
    if (m.k.size() + m.v.size() + m.q.size() != 0) {
      return InvalidArgument("staging append: carries ", m.k.size() + m.v.size() + m.q.size(),
                             " inline tensor bytes, expected none");
    }
    return OkStatus();
  }
  if (m.staging_offset != 0) {
    return InvalidArgument("staging_offset: got ", m.staging_offset, ", expected 0 for source 0 ",
                           "(inline)");
  }
  const auto check = [&](std::string_view name, const zmq::message_t& t) {
    if (t.size() == 0 || t.size() % m.n_tokens != 0 || t.size() > kMaxTensorFrameBytes) {
      return InvalidArgument(name, ": frame has ", t.size(), " bytes, expected a positive ",
                             "multiple of n_tokens (", m.n_tokens, ") up to ",
                             kMaxTensorFrameBytes);
    }
    return OkStatus();
  };
  KVCTL_RETURN_IF_ERROR(check("k", m.k));
  KVCTL_RETURN_IF_ERROR(check("v", m.v));
  if (m.v.size() != m.k.size()) {
    return InvalidArgument("v: frame has ", m.v.size(), " bytes, expected ", m.k.size(),
                           " (same as k)");
  }
  if (m.has_q) return check("q", m.q);
  if (m.q.size() != 0) {
    return InvalidArgument("q: frame has ", m.q.size(), " bytes, expected none (has_q is 0)");
  }
  return OkStatus();
}

Status Validate(const AppendReply& m) {
  return CheckRange("tokens_quantized", m.tokens_quantized, 0, m.tokens_total);
}

// ---- FETCH (replies in protocol_fetch.cc) ----

Status Validate(const FetchRequest& m) {
  KVCTL_RETURN_IF_ERROR(CheckSession(m.session_id));
  KVCTL_RETURN_IF_ERROR(CheckRange("layer_end", m.layer_end, 1, kMaxLayers));
  KVCTL_RETURN_IF_ERROR(CheckRange("layer_begin", m.layer_begin, 0, m.layer_end - 1));
  KVCTL_RETURN_IF_ERROR(CheckRange("mode", static_cast<uint8_t>(m.mode), WireEnum<FetchMode>::kMin,
                                   WireEnum<FetchMode>::kMax));
  KVCTL_RETURN_IF_ERROR(CheckDType("out_dtype", m.out_dtype));
  // ArrayCount bounded n_known on decode; an encoder's arrays must match it too.
  KVCTL_RETURN_IF_ERROR(ArrayCount(CountRule::kKnown, m).status());
  if (m.known_records.size() != m.n_known || m.known_tags.size() != m.n_known) {
    return InvalidArgument("known_records, known_tags: got ", m.known_records.size(), " and ",
                           m.known_tags.size(), " entries, expected n_known (", m.n_known,
                           ") each");
  }
  return OkStatus();
}
size_t TensorFrameCount(const FetchDenseReply&) { return 3; }

// ---- STATS ----

Status Validate(const StatsRequest& m) {
  return CheckString("section", m.section, 0, kMaxSectionBytes);
}

size_t TensorFrameCount(const StatsReply&) { return 1; }
void TakeTensorFrames(StatsReply& m, Frames* out) {
  out->emplace_back(m.text.data(), m.text.size());
}
Status PutTensorFrames(Frames& in, StatsReply* m) {
  m->text.assign(static_cast<const char*>(in[1].data()), in[1].size());
  return OkStatus();
}
Status Validate(const StatsReply& m) { return CheckString("text", m.text, 0, kMaxStatsTextBytes); }

// ---- BYE ----

Status Validate(const ByeRequest& m) { return CheckSession(m.session_id); }

Status Validate(const ByeReply&) { return OkStatus(); }

// ---- SAVE_PREFIX / OPEN_PREFIX ----

// A token frame: 1..kMaxPrefixTokens int32 ids, each >= 0.
Status CheckTokens(const zmq::message_t& t) {
  if (t.size() == 0 || t.size() % sizeof(int32_t) != 0 ||
      t.size() / sizeof(int32_t) > kMaxPrefixTokens) {
    return InvalidArgument("tokens: frame has ", t.size(), " bytes, expected 1..", kMaxPrefixTokens,
                           " int32 token ids (a positive multiple of 4 bytes)");
  }
  const auto* bytes = static_cast<const uint8_t*>(t.data());
  for (size_t i = 0; i < t.size() / sizeof(int32_t); ++i) {
    int32_t id;
    std::memcpy(&id, bytes + i * sizeof(int32_t), sizeof(id));
    if (id < 0) return InvalidArgument("tokens[", i, "]: got ", id, ", expected a token id >= 0");
  }
  return OkStatus();
}

size_t TensorFrameCount(const SavePrefixRequest&) { return 1; }
void TakeTensorFrames(SavePrefixRequest& m, Frames* out) { out->push_back(std::move(m.tokens)); }
Status PutTensorFrames(Frames& in, SavePrefixRequest* m) {
  m->tokens = std::move(in[1]);
  return OkStatus();
}
Status Validate(const SavePrefixRequest& m) {
  KVCTL_RETURN_IF_ERROR(CheckSession(m.session_id));
  return CheckTokens(m.tokens);
}
Status Validate(const SavePrefixReply&) { return OkStatus(); }

size_t TensorFrameCount(const OpenPrefixRequest&) { return 1; }
void TakeTensorFrames(OpenPrefixRequest& m, Frames* out) { out->push_back(std::move(m.tokens)); }
Status PutTensorFrames(Frames& in, OpenPrefixRequest* m) {
  m->tokens = std::move(in[1]);
  return OkStatus();
}
Status Validate(const OpenPrefixRequest& m) {
  KVCTL_RETURN_IF_ERROR(CheckSession(m.session_id));
  return CheckTokens(m.tokens);
}
Status Validate(const OpenPrefixReply&) { return OkStatus(); }

// ---- ERROR ----

Status Validate(const ErrorReply& m) {
  KVCTL_RETURN_IF_ERROR(CheckRange("code", static_cast<uint32_t>(m.code), 1, kLastStatusCode));
  return CheckString("message", m.message, 0, kMaxErrorMessageBytes);
}

// ---- Generic encode / decode
// ---------------------------------------------------------------------

// The message type's name is built only for an error: encode and decode run on every request.
Status Prefixed(uint16_t type, const Status& s) {
  if (s.ok()) return s;
  return Status(s.code(), TypeName(type) + ": " + s.message());
}

template <typename M>
StatusOr<Frames> EncodeAs(uint16_t type, uint64_t request_id, M& msg) {
  KVCTL_RETURN_IF_ERROR(Prefixed(type, Validate(msg)));
  WireWriter w;
  if constexpr (std::is_same_v<M, FetchBlocksReply>) w.Reserve(kHeaderBytes + BodyBytes(msg));
  WriteHeader(w, type, request_id, HeaderFlags(msg));
  WriteFields(w, msg);
  if (w.size() > kMaxHeaderFrameBytes) {
    return InvalidArgument(TypeName(type), ": frame 0 would be ", w.size(), " bytes, limit ",
                           kMaxHeaderFrameBytes);
  }
  Frames frames;
  frames.push_back(w.ToFrame());
  TakeTensorFrames(msg, &frames);
  return frames;
}

// `frames[0]` has passed DecodeHeader.
template <typename M>
StatusOr<M> DecodeAs(uint16_t type, Frames& frames) {
  M msg;
  WireReader r(frames[0].data(), frames[0].size(), kHeaderBytes);
  KVCTL_RETURN_IF_ERROR(Prefixed(type, ReadFields(r, &msg)));
  KVCTL_RETURN_IF_ERROR(Prefixed(type, r.Finish()));
  const size_t want = 1 + TensorFrameCount(msg);
  if (frames.size() != want) {
    return InvalidArgument(TypeName(type), ": frame count: got ", frames.size(), ", expected ",
                           want);
  }
  for (size_t i = 1; i < frames.size(); ++i) {
    if (frames[i].size() > kMaxTensorFrameBytes) {
      return InvalidArgument(TypeName(type), ": frame ", i, ": ", frames[i].size(),
                             " bytes, expected at most ", kMaxTensorFrameBytes);
    }
  }
  KVCTL_RETURN_IF_ERROR(PutTensorFrames(frames, &msg));
  KVCTL_RETURN_IF_ERROR(Prefixed(type, Validate(msg)));
  return msg;
}

template <typename M, typename Out>
StatusOr<Out> DecodeInto(uint16_t type, uint64_t request_id, Frames& frames) {
  KVCTL_ASSIGN_OR_RETURN(M msg, DecodeAs<M>(type, frames));
  return Out{request_id, std::move(msg)};
}

// APPEND: the body, then the header's APPEND_CONTINUES bit into `continues`.
StatusOr<Request> DecodeAppend(const Header& h, Frames& frames) {
  KVCTL_ASSIGN_OR_RETURN(AppendRequest msg, DecodeAs<AppendRequest>(h.type, frames));
  msg.continues = (h.flags & kFlagAppendContinues) != 0;
  return Request{h.request_id, std::move(msg)};
}

constexpr uint16_t ReplyType(MsgType t) { return static_cast<uint16_t>(t) | kReplyBit; }

}  // namespace

StatusOr<Request> DecodeRequest(Frames frames) {
  if (frames.empty()) return InvalidArgument("message: no frames, expected a header frame");
  KVCTL_ASSIGN_OR_RETURN(Header h, DecodeHeader(frames[0]));
  if (h.type == static_cast<uint16_t>(MsgType::kAppend)) return DecodeAppend(h, frames);
  switch (static_cast<MsgType>(h.type)) {
#define KVCTL_WIRE_DECODE_REQUEST(cpp, NAME, number, Body) \
  case MsgType::cpp:                                       \
    KVCTL_RETURN_IF_ERROR(CheckFlagsFor(h.type, h.flags)); \
    return DecodeInto<Body, Request>(h.type, h.request_id, frames);
    KVCTL_WIRE_MESSAGE_TYPES(KVCTL_WIRE_DECODE_REQUEST)
#undef KVCTL_WIRE_DECODE_REQUEST
    default:
      break;
  }
  if (h.type & kReplyBit) {
    return InvalidArgument("type: got ", TypeName(h.type), ", expected a request (",
                           kFirstRequestType, "..", kLastRequestType, ")");
  }
  return Unimplemented("type: got ", TypeName(h.type), ", expected a known request (",
                       kFirstRequestType, "..", kLastRequestType, ")");
}

StatusOr<Reply> DecodeReply(Frames frames) {
  if (frames.empty()) return InvalidArgument("message: no frames, expected a header frame");
  KVCTL_ASSIGN_OR_RETURN(Header h, DecodeHeader(frames[0]));
  // Replies carry no flag: APPEND_CONTINUES belongs to the APPEND request only.
  KVCTL_RETURN_IF_ERROR(CheckFlagsFor(h.type, h.flags));
  const uint64_t id = h.request_id;
  switch (h.type) {
    case ReplyType(MsgType::kHello):
      return DecodeInto<HelloReply, Reply>(h.type, id, frames);
    case ReplyType(MsgType::kOpen):
      return DecodeInto<OpenReply, Reply>(h.type, id, frames);
    case ReplyType(MsgType::kClose):
      return DecodeInto<CloseReply, Reply>(h.type, id, frames);
    case ReplyType(MsgType::kPing):
      return DecodeInto<PingReply, Reply>(h.type, id, frames);
    case ReplyType(MsgType::kAppend):
      return DecodeInto<AppendReply, Reply>(h.type, id, frames);
    case ReplyType(MsgType::kStats):
      return DecodeInto<StatsReply, Reply>(h.type, id, frames);
    case ReplyType(MsgType::kBye):
      return DecodeInto<ByeReply, Reply>(h.type, id, frames);
    case ReplyType(MsgType::kSavePrefix):
      return DecodeInto<SavePrefixReply, Reply>(h.type, id, frames);
    case ReplyType(MsgType::kOpenPrefix):
      return DecodeInto<OpenPrefixReply, Reply>(h.type, id, frames);
    case static_cast<uint16_t>(MsgType::kError):
      return DecodeInto<ErrorReply, Reply>(h.type, id, frames);
    case ReplyType(MsgType::kFetch): {
      WireReader r(frames[0].data(), frames[0].size(), kHeaderBytes);
      uint8_t mode;
      KVCTL_RETURN_IF_ERROR(Prefixed(h.type, r.U8("mode", &mode)));
      if (mode == static_cast<uint8_t>(FetchMode::kDense)) {
        return DecodeInto<FetchDenseReply, Reply>(h.type, id, frames);
      }
      if (mode == static_cast<uint8_t>(FetchMode::kBlocks)) {
        return DecodeInto<FetchBlocksReply, Reply>(h.type, id, frames);
      }
      return InvalidArgument("FETCH_REPLY: mode: got ", int{mode}, ", expected 0..1");
    }
    default:
      break;
  }
  if (!(h.type & kReplyBit)) {
    return InvalidArgument("type: got ", TypeName(h.type), ", expected a reply");
  }
  return Unimplemented("type: got ", TypeName(h.type), ", expected a known reply");
}

#define KVCTL_WIRE_ENCODE_REQUEST(cpp, NAME, number, Body)                 \
  StatusOr<Frames> Encode(uint64_t request_id, Body msg) {                 \
    return EncodeAs(static_cast<uint16_t>(MsgType::cpp), request_id, msg); \
  }
KVCTL_WIRE_MESSAGE_TYPES(KVCTL_WIRE_ENCODE_REQUEST)
#undef KVCTL_WIRE_ENCODE_REQUEST
#define KVCTL_WIRE_ENCODE_REPLY(Body, request)                     \
  StatusOr<Frames> Encode(uint64_t request_id, Body msg) {         \
    return EncodeAs(ReplyType(MsgType::request), request_id, msg); \
  }
KVCTL_WIRE_REPLIES(KVCTL_WIRE_ENCODE_REPLY)
#undef KVCTL_WIRE_ENCODE_REPLY

StatusOr<Frames> Encode(uint64_t request_id, RequestBody msg) {
  return std::visit([&](auto& m) { return Encode(request_id, std::move(m)); }, msg);
}

StatusOr<Frames> Encode(uint64_t request_id, ReplyBody msg) {
  return std::visit(
      [&](auto& m) -> StatusOr<Frames> {
        if constexpr (std::is_same_v<std::decay_t<decltype(m)>, ErrorReply>) {
          return EncodeError(request_id, ToStatus(m));
        } else {
          return Encode(request_id, std::move(m));
        }
      },
      msg);
}

Frames EncodeError(uint64_t request_id, const Status& status) {
  ErrorReply reply;
  if (status.ok()) {
    reply.code = StatusCode::kInternal;
    reply.message = "error reply built from OK status";
  } else {
    reply.code = status.code();
    reply.message = SanitizeUtf8(status.message(), kMaxErrorMessageBytes);
  }
  if (static_cast<uint32_t>(reply.code) > kLastStatusCode) reply.code = StatusCode::kInternal;
  StatusOr<Frames> frames = EncodeAs(static_cast<uint16_t>(MsgType::kError), request_id, reply);
  KVCTL_CHECK(frames.ok());  // Sanitized above: encoding cannot fail.
  return std::move(frames).value();
}

// RequestBody lists the requests in type order, HELLO first.
static_assert(std::variant_size_v<RequestBody> == kLastRequestType - kFirstRequestType + 1);

MsgType TypeOf(const RequestBody& body) {
  return static_cast<MsgType>(body.index() + kFirstRequestType);
}

uint16_t TypeOf(const ReplyBody& body) {
#define KVCTL_WIRE_REPLY_TYPE(Reply, request) ReplyType(MsgType::request),
  static constexpr uint16_t kTypes[] = {
      KVCTL_WIRE_REPLIES(KVCTL_WIRE_REPLY_TYPE) static_cast<uint16_t>(MsgType::kError)};
#undef KVCTL_WIRE_REPLY_TYPE
  static_assert(std::size(kTypes) == std::variant_size_v<ReplyBody>);
  return kTypes[body.index()];
}

Status CheckAppendShape(const AppendRequest& m, const Geometry& g) {
  if (m.has_q && g.q_heads == 0) {
    return InvalidArgument("has_q: got 1, expected 0: the session declared q_heads = 0");
  }
  if (m.source == AppendSource::kStaging) return OkStatus();
  uint64_t kv_bytes, q_bytes = 0;
  KVCTL_ASSIGN_OR_RETURN(
      kv_bytes, RowBytes("k", uint64_t{g.layers} * m.n_tokens * g.kv_heads, g.head_dim, g.dtype));
  if (m.has_q) {
    KVCTL_ASSIGN_OR_RETURN(
        q_bytes, RowBytes("q", uint64_t{g.layers} * m.n_tokens * g.q_heads, g.head_dim, g.dtype));
  }
  const auto check = [&](const char* name, const zmq::message_t& t, uint64_t want, uint32_t heads) {
    if (t.size() == want) return OkStatus();
    return InvalidArgument(name, ": frame has ", t.size(), " bytes, expected ", want, " = [",
                           g.layers, " layers, ", m.n_tokens, " tokens, ", heads, " heads, ",
                           g.head_dim, "] x ", DTypeSize(g.dtype), " bytes (", DTypeName(g.dtype),
                           ")");
  };
  KVCTL_RETURN_IF_ERROR(check("k", m.k, kv_bytes, g.kv_heads));
  KVCTL_RETURN_IF_ERROR(check("v", m.v, kv_bytes, g.kv_heads));
  if (m.has_q) return check("q", m.q, q_bytes, g.q_heads);
  return OkStatus();
}

StatusOr<StagingLayout> AppendStagingLayout(const Geometry& g, uint32_t n_tokens, bool has_q) {
  if (has_q && g.q_heads == 0) {
    return InvalidArgument("has_q: got 1, expected 0: the session declared q_heads = 0");
  }
  const uint64_t element = DTypeSize(g.dtype);
  StagingLayout out;
  KVCTL_ASSIGN_OR_RETURN(out.layer_bytes,
                         CheckedProduct("k", {n_tokens, g.kv_heads, g.head_dim, element}));
  if (has_q) {
    KVCTL_ASSIGN_OR_RETURN(out.q_layer_bytes,
                           CheckedProduct("q", {n_tokens, g.q_heads, g.head_dim, element}));
  }
  KVCTL_ASSIGN_OR_RETURN(out.v_offset, CheckedMul("append payload", out.layer_bytes, g.layers));
  KVCTL_ASSIGN_OR_RETURN(out.q_offset, CheckedMul("append payload", out.v_offset, 2));
  KVCTL_ASSIGN_OR_RETURN(const uint64_t q_bytes,
                         CheckedMul("append payload", out.q_layer_bytes, g.layers));
  KVCTL_ASSIGN_OR_RETURN(out.total_bytes, CheckedAdd("append payload", out.q_offset, q_bytes));
  return out;
}

}  // namespace kvctl::ipc
