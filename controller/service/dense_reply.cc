// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/dense_reply.h"

#include <utility>

#include "controller/service/reply_buffers.h"

namespace kvctl {

ipc::FetchDenseReply BuildDenseReply(const KvSequence& seq, const ipc::Geometry& geometry,
                                     int layer_begin, int layer_end, DType out_dtype,
                                     std::vector<uint32_t> counts, size_t split_rows,
                                     HelperThread& helper) {
  ipc::FetchDenseReply reply;
  reply.layer_begin = static_cast<uint32_t>(layer_begin);
  reply.n_layers = static_cast<uint32_t>(layer_end - layer_begin);
  reply.kv_heads = geometry.kv_heads;
  reply.head_dim = geometry.head_dim;
  reply.dtype = out_dtype;
  size_t rows = 0;
  for (uint32_t c : counts) rows += c;
  reply.counts = std::move(counts);
  const size_t row_bytes = static_cast<size_t>(geometry.head_dim) * DTypeSize(out_dtype);
  ReplyBufferPool& buffers = ReplyBufferPool::Default();
  reply.positions = buffers.Frame(rows * sizeof(int64_t));
  reply.k = buffers.Frame(rows * row_bytes);
  reply.v = buffers.Frame(rows * row_bytes);
  const DenseOut out{out_dtype, reply.k.data(), reply.v.data(), reply.positions.data()};
  const size_t units = seq.DenseUnits(layer_begin, layer_end);
  if (split_rows == 0 || rows <= split_rows || units < 2) {
    seq.FetchDenseInto(layer_begin, layer_end, out);
    return reply;
  }
  const size_t parts = (units + kDenseFetchPartUnits - 1) / kDenseFetchPartUnits;
  helper.RunShared(parts, [&](size_t part) {
    seq.FetchDenseUnitsInto(layer_begin, layer_end, out, part * kDenseFetchPartUnits,
                            (part + 1) * kDenseFetchPartUnits);
  });
  return reply;
}

}  // namespace kvctl
