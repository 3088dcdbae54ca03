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

#include <cstdint>
#include <span>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "ipc/messages.h"

namespace kvctl {

// The page table a client says it holds (FETCH's known table): per pair of the range, how many
// records and the table tag it was given with them; both empty = nothing held.
struct KnownTable {
  std::span<const uint32_t> records;
  std::span<const uint64_t> tags;
};

// A tag of a pair's record id list: a 64-bit hash of the (record id, side record id) of each
// record in order, so the tag of ids [0, n) extends to [0, m) without rereading them. Two lists
// with one tag are taken as equal (the chance that two different lists share one is about 2^-64
// per comparison; a wrong match would only give that client a wrong table of its own sequence).
class TableTag {
 public:
  void Add(uint32_t record_id, uint32_t side_id) {
    // Four lanes take records in turn, so four multiply chains run at once (a 32K-token pair has
    // 256 records; one chain of ~6 cycles a record was most of a blocks FETCH's handler there).
    // Each step multiplies (carrying bits up) and folds the high half down, so every id bit
    // reaches every lane bit before value() mixes the lanes.
    uint64_t& lane = lanes_[count_++ & 3];
    lane = (lane ^ ((uint64_t{side_id} << 32) | record_id)) * 0x9e3779b97f4a7c15ULL;
    lane ^= lane >> 29;
  }
  uint64_t value() const;  // Of the records added so far; adding more continues from here.
  uint64_t count() const { return count_; }  // Records added so far.

 private:
  uint64_t lanes_[4] = {0x6b76637461677331, 0x6b76637461677332, 0x6b76637461677333,
                        0x6b76637461677334};  // Any fixed start, one per lane.
  uint64_t count_ = 0;
};

// What BuildBlocksReply learned of one pair's tag, kept between FETCHes of a sequence (the
// controller's sequence entry owns them): the tag after the pair's first tag.count() records, valid
// while its record array and its layer's side record array keep their stamps
// (SlotArray::stamp: growing keeps a stamp, anything that may change an id renews it). With it a
// FETCH hashes only the records added since the last one, not the whole list.
struct PairTagCache {
  uint64_t records_stamp = 0;
  uint64_t side_stamp = 0;  // 0 for a layer without side records.
  TableTag tag;
};
using BlocksTagCache = std::vector<PairTagCache>;  // Index: layer * kv_heads + head.

// The reply of layers [layer_begin, layer_end) of a pool of pool_pages pages of page_bytes.
// With a known table, each pair whose first known.records[i] records still carry the tag
// known.tags[i] lists only the records after them (record_base[i] = known.records[i]); any other
// pair (evicted, compacted, requantized, or a tag that never was) is listed whole. Bytes then stay
// flat in the sequence's length. `cache` (may be null: every tag is then computed from the
// first record) carries the tags from one FETCH of the sequence to the next.
// REQUIRES: known.records and known.tags are empty or hold one entry per pair of the range.
ipc::FetchBlocksReply BuildBlocksReply(const KvSequence& seq, const ipc::Geometry& geometry,
                                       int layer_begin, int layer_end, uint64_t page_bytes,
                                       uint32_t pool_pages, KnownTable known = {},
                                       BlocksTagCache* cache = nullptr);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_BLOCKS_REPLY_H_
