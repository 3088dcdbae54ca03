// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: ipc/protocol_internal.h
// Internal to ipc/protocol*.cc: the per-message hooks the generic encoder and decoder call. Body
// bytes are written and read from the field tables of ipc/messages.def (ipc/wire_fields.h); for
// every message type X there is also
//   Status Validate(const X&);                  // semantic rules, shared by encoder and decoder
//   size_t TensorFrameCount(const X&);          // frames after frame 0, from the body fields
//   void TakeTensorFrames(X&, Frames*);         // encoder: move payload frames out
//   Status PutTensorFrames(Frames&, X*);        // decoder: move frames[1..] in
// The FETCH replies live in protocol_fetch.cc, everything else in protocol.cc.
//
// Thread safety: free functions over values.
//
//   KVCTL_RETURN_IF_ERROR(Validate(fetch_dense_reply));
//   WriteFields(writer, fetch_dense_reply);
#ifndef KVCTL_IPC_PROTOCOL_INTERNAL_H_
#define KVCTL_IPC_PROTOCOL_INTERNAL_H_

#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "ipc/messages.h"
#include "ipc/protocol.h"
#include "ipc/wire.h"
#include "ipc/wire_fields.h"

namespace kvctl::ipc {

// Shared field checks; messages read "<field>: got <value>, expected <rule>" (CheckRange is in
// wire_fields.h).
Status CheckHeadDim(std::string_view field, uint32_t head_dim);
Status CheckString(std::string_view field, const std::string& s, size_t min_bytes,
                   size_t max_bytes);
Status CheckDType(std::string_view field, DType dtype);
Status CheckTensorFrame(std::string_view field, const zmq::message_t& frame, uint64_t expected);
// Every int64 in `frame` lies in [0, kMaxPosition).
Status CheckPositions(std::string_view field, const zmq::message_t& frame);
// rows * head_dim * DTypeSize(dtype), or INVALID_ARGUMENT on overflow.
StatusOr<uint64_t> RowBytes(std::string_view field, uint64_t rows, uint32_t head_dim, DType dtype);

Status Validate(const FetchDenseReply& m);
void TakeTensorFrames(FetchDenseReply& m, Frames* out);
Status PutTensorFrames(Frames& in, FetchDenseReply* m);

Status Validate(const FetchBlocksReply& m);
// Frame 0's body bytes of a blocks reply, so that the encoder reserves them once instead of
// growing its buffer (and copying it) about a dozen times for a 2.5-5 KB page table.
size_t BodyBytes(const FetchBlocksReply& m);

}  // namespace kvctl::ipc

#endif  // KVCTL_IPC_PROTOCOL_INTERNAL_H_
