// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: ipc/protocol.h
// Encoding and validating decoding of the kvctl wire protocol (ipc/PROTOCOL.md). A message is a
// list of ZeroMQ frames: frame 0 is the 18-byte header plus a fixed-layout body, later frames are
// raw tensor bytes. Decoders check everything (magic, version, type, exact lengths, string bounds
// and UTF-8, enum ranges, limits, frame counts and sizes against the declared shapes, with
// overflow-safe arithmetic) and never crash on hostile bytes: errors are INVALID_ARGUMENT, or
// UNIMPLEMENTED for an unknown message type, naming the field, the value and what was expected.
// Encoders run the same validation, so nothing invalid reaches the wire.
//
// Thread safety: free functions over values; safe from any thread.
//
//   KVCTL_ASSIGN_OR_RETURN(Frames frames, Encode(/*request_id=*/7, PingRequest{.session_id = 3}));
//   KVCTL_ASSIGN_OR_RETURN(Request req, DecodeRequest(std::move(frames)));
//   auto& ping = std::get<PingRequest>(req.body);
#ifndef KVCTL_IPC_PROTOCOL_H_
#define KVCTL_IPC_PROTOCOL_H_

#include <cstdint>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "ipc/messages.h"

namespace kvctl::ipc {

// One message: frame 0 (header + body), then tensor frames. The ROUTER routing id is not part.
using Frames = std::vector<zmq::message_t>;

struct Header {
  uint16_t version = kProtocolVersion;
  uint16_t type = 0;
  uint64_t request_id = 0;
  uint16_t flags = 0;
};

// Parses and checks the header of frame 0: length >= kHeaderBytes and <= kMaxHeaderFrameBytes,
// magic, version == kProtocolVersion, no flag bit outside kKnownHeaderFlags. Does not look at the
// type: DecodeRequest / DecodeReply refuse a known bit on a message it does not belong to.
StatusOr<Header> DecodeHeader(const zmq::message_t& frame0);

// The request id of a frame that starts with the magic, whatever else is wrong with it, so that
// an ERROR reply can still be matched by the client; 0 if the frame is too short or not ours.
uint64_t PeekRequestId(const zmq::message_t& frame0);

// Decodes a whole request. Consumes `frames` (tensor frames move into the result).
// Errors: INVALID_ARGUMENT for any malformed field or frame; UNIMPLEMENTED for a type number that
// is not a known request.
StatusOr<Request> DecodeRequest(Frames frames);

// Decodes a whole reply (including ERROR replies, which decode to ErrorReply).
StatusOr<Reply> DecodeReply(Frames frames);

// Encoders: validate `msg` with the same rules as the decoder, then build the frames. Tensor
// frames are moved, not copied. Error: INVALID_ARGUMENT naming the offending field.
StatusOr<Frames> Encode(uint64_t request_id, HelloRequest msg);
StatusOr<Frames> Encode(uint64_t request_id, OpenRequest msg);
StatusOr<Frames> Encode(uint64_t request_id, CloseRequest msg);
StatusOr<Frames> Encode(uint64_t request_id, PingRequest msg);
StatusOr<Frames> Encode(uint64_t request_id, AppendRequest msg);
StatusOr<Frames> Encode(uint64_t request_id, FetchRequest msg);
StatusOr<Frames> Encode(uint64_t request_id, StatsRequest msg);
StatusOr<Frames> Encode(uint64_t request_id, ByeRequest msg);
StatusOr<Frames> Encode(uint64_t request_id, HelloReply msg);
StatusOr<Frames> Encode(uint64_t request_id, OpenReply msg);
StatusOr<Frames> Encode(uint64_t request_id, CloseReply msg);
StatusOr<Frames> Encode(uint64_t request_id, PingReply msg);
StatusOr<Frames> Encode(uint64_t request_id, AppendReply msg);
StatusOr<Frames> Encode(uint64_t request_id, FetchDenseReply msg);
StatusOr<Frames> Encode(uint64_t request_id, FetchBlocksReply msg);
StatusOr<Frames> Encode(uint64_t request_id, StatsReply msg);
StatusOr<Frames> Encode(uint64_t request_id, ByeReply msg);
StatusOr<Frames> Encode(uint64_t request_id, RequestBody msg);
StatusOr<Frames> Encode(uint64_t request_id, ReplyBody msg);

// The ERROR reply for a non-OK status; never fails. An OK status becomes INTERNAL ("error reply
// built from OK status"); messages longer than kMaxErrorMessageBytes are cut on a UTF-8 boundary
// and invalid UTF-8 bytes become '?'.
Frames EncodeError(uint64_t request_id, const Status& status);

// The Status an ErrorReply stands for.
inline Status ToStatus(const ErrorReply& reply) { return Status(reply.code, reply.message); }

// Checks geometry limits (layers, heads, head_dim, dtype) as HELLO's decoder does.
Status ValidateGeometry(const Geometry& geometry);

// Where an APPEND's tensors lie in a staging slot, from the request's staging_offset: K of every
// layer ([layers, n_tokens, kv_heads, head_dim] in the session dtype), then V (same shape), then
// Q ([layers, n_tokens, q_heads, head_dim]) when has_q, back to back. Inline frames hold the same
// tensors one per frame. This is the one definition: the server reads by it, and
// python/kvctl/protocol.py's staging_layout is checked against the same golden table
// (tests/golden/staging_layouts.txt) as this function is.
struct StagingLayout {
  uint64_t layer_bytes = 0;    // K (or V) of one layer.
  uint64_t q_layer_bytes = 0;  // Q of one layer; 0 without Q.
  uint64_t v_offset = 0;       // K starts at 0.
  uint64_t q_offset = 0;       // == total_bytes without Q.
  uint64_t total_bytes = 0;
  bool operator==(const StagingLayout&) const = default;
};
// Error: INVALID_ARGUMENT if has_q and the geometry has q_heads == 0, or on overflow.
StatusOr<StagingLayout> AppendStagingLayout(const Geometry& geometry, uint32_t n_tokens,
                                            bool has_q);

// The decoder cannot know the session geometry; the server calls this once it has found the
// session. Checks has_q against q_heads and, for inline appends, that every tensor frame holds
// exactly [layers, n_tokens, heads, head_dim] elements of the session dtype. Staging bounds are
// the server's to check (it knows the slot): use AppendStagingLayout().
Status CheckAppendShape(const AppendRequest& request, const Geometry& geometry);

}  // namespace kvctl::ipc

#endif  // KVCTL_IPC_PROTOCOL_H_
