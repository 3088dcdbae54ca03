// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/blocks_reply.h
// Builds the blocks-mode FETCH reply of a sequence: a FlashInfer-style page table over the
// quantized records in the shm pool (engines attend on them in place) and over the row slots of
// the full-precision window (sinks and tail) in the same pool, with the window's positions as
// runs; no row travels in the reply, so its size does not grow with the rows. Record id r of a pair
// whose layout is L lives at byte (r / L.records_per_page) * page_bytes + (r % L.records_per_page)
// * L.record_bytes of the pool; L.records_per_page is that head's own
// (HeadBlocks::records_per_page).
//
// Thread safety: the caller holds the sequence's lock.
#ifndef KVCTL_CONTROLLER_SERVICE_BLOCKS_REPLY_H_
#define KVCTL_CONTROLLER_SERVICE_BLOCKS_REPLY_H_

#include "controller/sequence/kv_sequence.h"
#include "ipc/messages.h"

namespace kvctl {

// The reply of layers [layer_begin, layer_end) of a pool of pool_pages pages of page_bytes.
ipc::FetchBlocksReply BuildBlocksReply(const KvSequence& seq, const ipc::Geometry& geometry,
                                       int layer_begin, int layer_end, uint64_t page_bytes,
                                       uint32_t pool_pages);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_BLOCKS_REPLY_H_
