// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/blocks_reply.h"

#include "controller/service/reply_buffers.h"
#include "kernels/convert.h"

namespace kvctl {
namespace {

ipc::RecordLayout WireLayout(const QuantSpec& spec, uint32_t records_per_page) {
  const BlockLayout l = BlockLayoutOf(spec);
  ipc::RecordLayout r;
  r.method = static_cast<uint8_t>(spec.method);
  r.k_bits = static_cast<uint8_t>(spec.k_bits);
  r.v_bits = static_cast<uint8_t>(spec.v_bits);
  r.k_group_tokens = static_cast<uint32_t>(spec.k_group_tokens);
  r.v_group_channels = static_cast<uint32_t>(spec.v_group_channels);
  r.record_bytes = static_cast<uint32_t>(l.record_bytes);
  r.k_codes_offset = static_cast<uint32_t>(l.k_codes_offset);
  r.k_codes_bytes = static_cast<uint32_t>(l.k_codes_bytes);
  r.k_meta_offset = static_cast<uint32_t>(l.k_meta_offset);
  r.k_meta_bytes = static_cast<uint32_t>(l.k_meta_bytes);
  r.v_codes_offset = static_cast<uint32_t>(l.v_codes_offset);
  r.v_codes_bytes = static_cast<uint32_t>(l.v_codes_bytes);
  r.v_meta_offset = static_cast<uint32_t>(l.v_meta_offset);
  r.v_meta_bytes = static_cast<uint32_t>(l.v_meta_bytes);
  r.side_bytes_per_token = static_cast<uint32_t>(l.side_bytes_per_token);
  r.records_per_page = records_per_page;
  return r;
}

// A lossless layer holds no records (every row is in the window), so its layout only has to be
// a valid placeholder: method fp16, no sections, records_per_page slots of page_bytes /
// records_per_page bytes (so records_per_page x record_bytes <= page_bytes holds).
ipc::RecordLayout LosslessWireLayout(const QuantSpec& spec, uint32_t page_bytes,
                                     uint32_t records_per_page) {
  ipc::RecordLayout r;
  r.method = static_cast<uint8_t>(QuantMethod::kFp16);
  r.k_bits = 16;
  r.v_bits = 16;
  r.k_group_tokens = static_cast<uint32_t>(spec.k_group_tokens);
  r.v_group_channels = static_cast<uint32_t>(spec.v_group_channels);
  r.record_bytes = page_bytes / records_per_page;
  r.records_per_page = records_per_page;
  return r;
}

}  // namespace

zmq::message_t RowsToFrame(const std::vector<float>& rows, DType dtype) {
  zmq::message_t frame = ReplyBufferPool::Default().Frame(rows.size() * DTypeSize(dtype));
  ConvertElements(DType::kF32, rows.data(), dtype, frame.data(), rows.size());
  return frame;
}

ipc::FetchBlocksReply BuildBlocksReply(const KvSequence& seq, const ipc::Geometry& g,
                                       int layer_begin, int layer_end, DType tail_dtype,
                                       uint64_t page_bytes) {
  ipc::FetchBlocksReply reply;
  reply.layer_begin = static_cast<uint32_t>(layer_begin);
  reply.n_layers = static_cast<uint32_t>(layer_end - layer_begin);
  reply.kv_heads = g.kv_heads;
  reply.head_dim = g.head_dim;
  reply.page_bytes = static_cast<uint32_t>(page_bytes);
  reply.block_tokens = static_cast<uint32_t>(seq.HeadSpec(layer_begin, 0).block_tokens);
  reply.tail_dtype = tail_dtype;
  reply.indptr.push_back(0);
  bool any_side = false;
  for (int l = layer_begin; l < layer_end; ++l) any_side |= seq.Norms(l) != nullptr;
  for (int l = layer_begin; l < layer_end; ++l) {
    const SlotArray* norms = seq.Norms(l);
    if (norms != nullptr) {
      reply.side_records_per_page = static_cast<uint32_t>(norms->slots_per_page());
    }
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      const QuantSpec& spec = seq.HeadSpec(l, static_cast<int>(h));
      const HeadBlocks b = seq.Blocks(l, static_cast<int>(h));
      // Each head packs as many records per page as fit its own record size: layouts are
      // deduplicated over every field, records_per_page included.
      const ipc::RecordLayout layout =
          seq.Lossless(l) ? LosslessWireLayout(spec, reply.page_bytes, b.records_per_page)
                          : WireLayout(spec, b.records_per_page);
      size_t index = 0;
      while (index < reply.layouts.size() && !(reply.layouts[index] == layout)) ++index;
      if (index == reply.layouts.size()) reply.layouts.push_back(layout);
      reply.layout_index.push_back(static_cast<uint16_t>(index));
      for (uint32_t r = 0; r < b.records; ++r) {
        reply.indices.push_back(b.record_ids[r]);
        if (any_side)
          reply.side_indices.push_back(norms == nullptr ? ipc::kNoPage : norms->ids()[r]);
      }
      reply.indptr.push_back(static_cast<uint32_t>(reply.indices.size()));
      reply.last_page_len.push_back(b.records > 0 ? reply.block_tokens : 0);
    }
  }
  // An OScaR sequence holds no norm pages before its first record, yet its layouts declare side
  // records: name the slots per page its norm pages will have (the reply is invalid with 0).
  for (const ipc::RecordLayout& l : reply.layouts) {
    if (reply.side_records_per_page == 0 && l.side_bytes_per_token > 0) {
      reply.side_records_per_page = static_cast<uint32_t>(
          page_bytes / (uint64_t{reply.block_tokens} * l.side_bytes_per_token));
    }
  }
  DenseKv window = seq.FetchWindow(layer_begin, layer_end);
  reply.tail_counts = std::move(window.counts);
  reply.tail_positions = zmq::message_t(window.positions.data(), window.positions.size() * 8);
  reply.tail_k = RowsToFrame(window.k, tail_dtype);
  reply.tail_v = RowsToFrame(window.v, tail_dtype);
  return reply;
}

}  // namespace kvctl
