// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/dense_reply.h
// Builds the dense-mode FETCH reply of a sequence: every kept row of a layer range, decoded and
// converted to the asked dtype straight into zero-copy frames over reused buffers
// (reply_buffers.h), so no fp32 copy of the range is made and no page is faulted in per request.
// Above `split_rows` rows (0 = never) the decode is shared with `helper` (helper_thread.h) in
// parts of kDenseFetchPartUnits units of KvSequence::FetchDenseUnitsInto.
//
// Thread safety: the caller holds the sequence's lock until this returns (the helper reads the
// sequence meanwhile).
#ifndef KVCTL_CONTROLLER_SERVICE_DENSE_REPLY_H_
#define KVCTL_CONTROLLER_SERVICE_DENSE_REPLY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "controller/sequence/kv_sequence.h"
#include "controller/service/helper_thread.h"
#include "ipc/messages.h"

namespace kvctl {

// Units per part of a shared decode: records or 256 stored rows each, so a part is a few to a
// few tens of microseconds.
inline constexpr size_t kDenseFetchPartUnits = 8;

// The reply of layers [layer_begin, layer_end); `counts` is seq.DenseCounts of that range.
ipc::FetchDenseReply BuildDenseReply(const KvSequence& seq, const ipc::Geometry& geometry,
                                     int layer_begin, int layer_end, DType out_dtype,
                                     std::vector<uint32_t> counts, size_t split_rows,
                                     HelperThread& helper);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_DENSE_REPLY_H_
