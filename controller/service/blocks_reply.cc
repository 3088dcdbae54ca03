// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/blocks_reply.h"

#include <span>

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

namespace {

// Pair positions as runs of consecutive positions, appended to the reply (sinks, then tail: the
// two lists are each increasing and every sink precedes every tail token).
void AppendRuns(std::span<const int64_t> positions, ipc::FetchBlocksReply* reply) {
  const size_t n = positions.size();
  for (size_t i = 0, j = 0; i < n; i = j) {
    const int64_t start = positions[i];
    for (j = i + 1; j < n && positions[j] == start + static_cast<int64_t>(j - i);) ++j;
    const auto length = static_cast<uint32_t>(j - i);
    // The first run may continue the pair's last one (a tail right after its sinks).
    const size_t last = reply->run_starts.size();
    if (i == 0 && last > reply->run_indptr.back() &&
        reply->run_starts[last - 1] + reply->run_lengths[last - 1] ==
            static_cast<uint64_t>(start)) {
      reply->run_lengths[last - 1] += length;
    } else {
      reply->run_starts.push_back(static_cast<uint64_t>(start));
      reply->run_lengths.push_back(length);
    }
  }
}

}  // namespace

uint64_t TableTag::value() const {
  // The SplitMix64 finalizer over the count and each lane in turn: full avalanche per lane.
  uint64_t h = count_;
  for (uint64_t lane : lanes_) {
    h ^= lane;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}

ipc::FetchBlocksReply BuildBlocksReply(const KvSequence& seq, const ipc::Geometry& g,
                                       int layer_begin, int layer_end, uint64_t page_bytes,
                                       uint32_t pool_pages, KnownTable known,
                                       BlocksTagCache* cache) {
  ipc::FetchBlocksReply reply;
  reply.layer_begin = static_cast<uint32_t>(layer_begin);
  reply.n_layers = static_cast<uint32_t>(layer_end - layer_begin);
  reply.kv_heads = g.kv_heads;
  reply.head_dim = g.head_dim;
  reply.page_bytes = static_cast<uint32_t>(page_bytes);
  reply.pool_pages = pool_pages;
  reply.block_tokens = static_cast<uint32_t>(seq.HeadSpec(layer_begin, 0).block_tokens);
  const size_t pairs = static_cast<size_t>(reply.n_layers) * g.kv_heads;
  reply.layout_index.reserve(pairs);
  reply.last_page_len.reserve(pairs);
  reply.window_sinks.reserve(pairs);
  reply.record_base.reserve(pairs);
  reply.table_tags.reserve(pairs);
  reply.indptr.reserve(pairs + 1);
  reply.window_indptr.reserve(pairs + 1);
  reply.run_indptr.reserve(pairs + 1);
  reply.indptr.push_back(0);
  reply.window_indptr.push_back(0);
  reply.run_indptr.push_back(0);
  bool any_side = false;
  for (int l = layer_begin; l < layer_end; ++l) any_side |= seq.Norms(l) != nullptr;
  if (cache != nullptr) cache->resize(static_cast<size_t>(g.layers) * g.kv_heads);
  for (int l = layer_begin; l < layer_end; ++l) {
    const SlotArray* norms = seq.Norms(l);
    if (norms != nullptr) {
      reply.side_records_per_page = static_cast<uint32_t>(norms->slots_per_page());
    }
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      const QuantSpec& spec = seq.HeadSpec(l, static_cast<int>(h));
      const HeadBlocks b = seq.Blocks(l, static_cast<int>(h));
      const HeadWindow w = seq.FetchWindow(l, static_cast<int>(h));
      // Each head packs as many records per page as fit its own record size: layouts are
      // deduplicated over every field, records_per_page and the row slots included.
      ipc::RecordLayout layout =
          seq.Lossless(l) ? LosslessWireLayout(spec, reply.page_bytes, b.records_per_page)
                          : WireLayout(spec, b.records_per_page);
      layout.row_dtype = w.dtype;
      layout.row_slot_bytes = w.slot_bytes;
      layout.rows_per_page = w.slots_per_page;
      size_t index = 0;
      while (index < reply.layouts.size() && !(reply.layouts[index] == layout)) ++index;
      if (index == reply.layouts.size()) reply.layouts.push_back(layout);
      reply.layout_index.push_back(static_cast<uint16_t>(index));
      const size_t pair = reply.layout_index.size() - 1;
      const auto side_of = [&](uint32_t r) {
        return norms == nullptr ? ipc::kNoPage : norms->ids()[r];
      };
      // The pair's tag state: cached from the last FETCH while no id it covers can have changed.
      PairTagCache scratch;
      PairTagCache& c =
          cache != nullptr ? (*cache)[static_cast<size_t>(l) * g.kv_heads + h] : scratch;
      const uint64_t side_stamp = norms == nullptr ? 0 : norms->stamp();
      if (c.records_stamp != b.records_stamp || c.side_stamp != side_stamp ||
          c.tag.count() > b.records) {
        c = PairTagCache{.records_stamp = b.records_stamp, .side_stamp = side_stamp, .tag = {}};
      }
      const auto advance = [&](uint32_t to) {
        for (auto r = static_cast<uint32_t>(c.tag.count()); r < to; ++r) {
          c.tag.Add(b.record_ids[r], side_of(r));
        }
      };
      // The records the client holds, if their tag still matches.
      uint32_t base = 0;
      if (!known.records.empty() && known.records[pair] <= b.records) {
        const uint32_t held = known.records[pair];
        uint64_t held_tag = 0;
        if (held >= c.tag.count()) {
          advance(held);
          held_tag = c.tag.value();
        } else {  // The cache is past it (another client's shorter table): from the first.
          TableTag t;
          for (uint32_t r = 0; r < held; ++r) t.Add(b.record_ids[r], side_of(r));
          held_tag = t.value();
        }
        if (held_tag == known.tags[pair]) base = held;
      }
      advance(b.records);
      reply.record_base.push_back(base);
      reply.table_tags.push_back(c.tag.value());
      const std::span<const uint32_t> ids = b.record_ids.subspan(base, b.records - base);
      reply.indices.insert(reply.indices.end(), ids.begin(), ids.end());
      if (any_side) {
        for (uint32_t r = base; r < b.records; ++r) reply.side_indices.push_back(side_of(r));
      }
      reply.indptr.push_back(static_cast<uint32_t>(reply.indices.size()));
      reply.last_page_len.push_back(b.records > 0 ? reply.block_tokens : 0);
      reply.window_ids.insert(reply.window_ids.end(), w.ids.begin(), w.ids.end());
      reply.window_indptr.push_back(static_cast<uint32_t>(reply.window_ids.size()));
      reply.window_sinks.push_back(static_cast<uint32_t>(w.sink_positions.size()));
      AppendRuns(w.sink_positions, &reply);
      AppendRuns(w.tail_positions, &reply);
      reply.run_indptr.push_back(static_cast<uint32_t>(reply.run_starts.size()));
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
  return reply;
}

}  // namespace kvctl
