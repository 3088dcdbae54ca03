// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/blocks_reply.h
// Builds the blocks-mode FETCH reply of a sequence: a FlashInfer-style page table over the
// quantized records in the shm pool (engines attend on them in place), plus the full-precision
// window (sinks and tail) inline. Record id r of a pair whose layout is L lives at byte
// (r / L.records_per_page) * page_bytes + (r % L.records_per_page) * L.record_bytes of the pool;
// L.records_per_page is that head's own (HeadBlocks::records_per_page).
//
// Thread safety: the caller holds the sequence's lock.
#ifndef KVCTL_CONTROLLER_SERVICE_BLOCKS_REPLY_H_
#define KVCTL_CONTROLLER_SERVICE_BLOCKS_REPLY_H_

#include "controller/sequence/kv_sequence.h"
#include "ipc/messages.h"

namespace kvctl {

// fp32 rows converted to `dtype` in a new frame (dense FETCH and the blocks-mode window).
zmq::message_t RowsToFrame(const std::vector<float>& rows, DType dtype);

ipc::FetchBlocksReply BuildBlocksReply(const KvSequence& seq, const ipc::Geometry& geometry,
                                       int layer_begin, int layer_end, DType tail_dtype,
                                       uint64_t page_bytes);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_BLOCKS_REPLY_H_
