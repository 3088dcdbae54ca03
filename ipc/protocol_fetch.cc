// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The two FETCH replies: dense K/V rows, and the block page table (PROTOCOL.md "FETCH").
#include <cstring>

#include "ipc/protocol_internal.h"

namespace kvctl::ipc {
namespace {

// Fields both FETCH replies start with, after the mode byte.
struct PairShape {
  uint32_t layer_begin, n_layers, kv_heads, head_dim;
};

Status CheckPairShape(const PairShape& s) {
  KVCTL_RETURN_IF_ERROR(CheckRange("n_layers", s.n_layers, 1, kMaxLayers));
  KVCTL_RETURN_IF_ERROR(CheckRange("layer_begin", s.layer_begin, 0, kMaxLayers - s.n_layers));
  KVCTL_RETURN_IF_ERROR(CheckRange("kv_heads", s.kv_heads, 1, kMaxHeads));
  return CheckHeadDim("head_dim", s.head_dim);
}

uint64_t Sum(const std::vector<uint32_t>& v) {
  uint64_t total = 0;  // <= 2^20 pairs * 2^32: cannot overflow.
  for (uint32_t x : v) total += x;
  return total;
}

// positions [rows] int64, k and v [rows, head_dim] in dtype.
Status CheckRowFrames(std::string_view prefix, uint64_t rows, uint32_t head_dim, DType dtype,
                      const zmq::message_t& positions, const zmq::message_t& k,
                      const zmq::message_t& v) {
  uint64_t pos_bytes;
  if (MulOverflow(rows, 8, &pos_bytes)) {
    return InvalidArgument(prefix, "positions: ", rows, " rows overflow");
  }
  KVCTL_ASSIGN_OR_RETURN(uint64_t kv_bytes, RowBytes(prefix, rows, head_dim, dtype));
  const std::string p(prefix);
  KVCTL_RETURN_IF_ERROR(CheckTensorFrame(p + "positions", positions, pos_bytes));
  KVCTL_RETURN_IF_ERROR(CheckTensorFrame(p + "k", k, kv_bytes));
  KVCTL_RETURN_IF_ERROR(CheckTensorFrame(p + "v", v, kv_bytes));
  return CheckPositions(p + "positions", positions);
}

Status CheckLayout(size_t index, const RecordLayout& l, const FetchBlocksReply& m) {
  const std::string at = "layouts[" + std::to_string(index) + "].";
  KVCTL_RETURN_IF_ERROR(CheckRange(at + "method", l.method, 0, kNumWireQuantMethods - 1));
  KVCTL_RETURN_IF_ERROR(CheckRange(at + "k_bits", l.k_bits, 1, 16));
  KVCTL_RETURN_IF_ERROR(CheckRange(at + "v_bits", l.v_bits, 1, 16));
  KVCTL_RETURN_IF_ERROR(CheckRange(at + "record_bytes", l.record_bytes, 1, m.page_bytes));
  // records_per_page * record_bytes <= page_bytes, checked as a quotient so it cannot overflow.
  const uint32_t max_per_page = m.page_bytes / l.record_bytes;
  if (l.records_per_page < 1 || l.records_per_page > max_per_page) {
    return InvalidArgument(at, "records_per_page: got ", l.records_per_page, ", expected 1..",
                           max_per_page, " with records_per_page x record_bytes (", l.record_bytes,
                           ") <= page_bytes (", m.page_bytes, ")");
  }
  struct Section {
    const char* name;
    uint64_t offset, bytes;
  };
  const Section sections[] = {{"k_codes", l.k_codes_offset, l.k_codes_bytes},
                              {"k_meta", l.k_meta_offset, l.k_meta_bytes},
                              {"v_codes", l.v_codes_offset, l.v_codes_bytes},
                              {"v_meta", l.v_meta_offset, l.v_meta_bytes}};
  for (const Section& s : sections) {
    if (s.offset + s.bytes > l.record_bytes) {  // u32 + u32: no u64 overflow.
      return InvalidArgument(at, s.name, ": offset ", s.offset, " + bytes ", s.bytes,
                             " ends past record_bytes ", l.record_bytes);
    }
  }
  for (const Section& a : sections) {
    for (const Section& b : sections) {
      if (&a >= &b || a.bytes == 0 || b.bytes == 0) continue;
      if (a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes) {
        return InvalidArgument(at, a.name, " [", a.offset, ", ", a.offset + a.bytes, ") overlaps ",
                               b.name, " [", b.offset, ", ", b.offset + b.bytes, ")");
      }
    }
  }
  // a * b <= p  <=>  a <= p / b for b >= 1, without the product overflowing.
  const uint64_t side_record = uint64_t{l.side_bytes_per_token} * m.block_tokens;
  if (side_record > 0 && side_record > m.page_bytes / m.side_records_per_page) {
    return InvalidArgument(at, "side_bytes_per_token: got ", l.side_bytes_per_token,
                           ", expected side_records_per_page (", m.side_records_per_page,
                           ") * block_tokens (", m.block_tokens, ") * it <= page_bytes (",
                           m.page_bytes, ")");
  }
  return OkStatus();
}

}  // namespace

// Arrays are sized from the fields before them; the pair shape is checked first, so a hostile
// n_layers or kv_heads is named as such rather than as a truncated array.
StatusOr<uint64_t> ArrayCount(CountRule rule, const FetchDenseReply& m) {
  KVCTL_RETURN_IF_ERROR(CheckPairShape({m.layer_begin, m.n_layers, m.kv_heads, m.head_dim}));
  KVCTL_CHECK(rule == CountRule::kPairs);  // messages.def gives the dense reply one array.
  return uint64_t{m.n_layers} * m.kv_heads;
}

StatusOr<uint64_t> ArrayCount(CountRule rule, const FetchBlocksReply& m) {
  KVCTL_RETURN_IF_ERROR(CheckPairShape({m.layer_begin, m.n_layers, m.kv_heads, m.head_dim}));
  const uint64_t pairs = uint64_t{m.n_layers} * m.kv_heads;
  bool any_side = false;
  for (const RecordLayout& l : m.layouts) any_side = any_side || l.side_bytes_per_token > 0;
  switch (rule) {
    case CountRule::kPairs:
      return pairs;
    case CountRule::kPairsPlusOne:
      return pairs + 1;
    case CountRule::kNnz:
    case CountRule::kSideNnz:
      // messages.def puts indptr (pairs + 1 >= 2 entries) before the arrays it sizes.
      KVCTL_CHECK(!m.indptr.empty());
      return rule == CountRule::kSideNnz && !any_side ? 0 : uint64_t{m.indptr.back()};
  }
  return pairs;
}

// ---- Dense
// ---------------------------------------------------------------------------------------

Status Validate(const FetchDenseReply& m) {
  KVCTL_RETURN_IF_ERROR(CheckPairShape({m.layer_begin, m.n_layers, m.kv_heads, m.head_dim}));
  KVCTL_RETURN_IF_ERROR(CheckDType("dtype", m.dtype));
  const uint64_t pairs = uint64_t{m.n_layers} * m.kv_heads;
  if (m.counts.size() != pairs) {
    return InvalidArgument("counts: got ", m.counts.size(), " entries, expected n_layers * ",
                           "kv_heads = ", pairs);
  }
  return CheckRowFrames("", Sum(m.counts), m.head_dim, m.dtype, m.positions, m.k, m.v);
}

void TakeTensorFrames(FetchDenseReply& m, Frames* out) {
  out->push_back(std::move(m.positions));
  out->push_back(std::move(m.k));
  out->push_back(std::move(m.v));
}

Status PutTensorFrames(Frames& in, FetchDenseReply* m) {
  m->positions = std::move(in[1]);
  m->k = std::move(in[2]);
  m->v = std::move(in[3]);
  return OkStatus();
}

// ---- Blocks
// --------------------------------------------------------------------------------------

Status Validate(const FetchBlocksReply& m) {
  KVCTL_RETURN_IF_ERROR(CheckPairShape({m.layer_begin, m.n_layers, m.kv_heads, m.head_dim}));
  KVCTL_RETURN_IF_ERROR(CheckRange("page_bytes", m.page_bytes, 1, UINT32_MAX));
  KVCTL_RETURN_IF_ERROR(CheckRange("block_tokens", m.block_tokens, 1, kMaxBlockTokens));
  KVCTL_RETURN_IF_ERROR(CheckRange("n_layouts", m.layouts.size(), 1, kMaxLayouts));
  bool any_side = false;
  for (const RecordLayout& l : m.layouts) any_side = any_side || l.side_bytes_per_token > 0;
  KVCTL_RETURN_IF_ERROR(CheckRange("side_records_per_page", m.side_records_per_page,
                                   any_side ? 1 : 0, any_side ? m.page_bytes : 0));
  for (size_t i = 0; i < m.layouts.size(); ++i) {
    KVCTL_RETURN_IF_ERROR(CheckLayout(i, m.layouts[i], m));
  }
  const uint64_t pairs = uint64_t{m.n_layers} * m.kv_heads;
  const auto check_size = [&](std::string_view field, size_t got, uint64_t want) {
    if (got == want) return OkStatus();
    return InvalidArgument(field, ": got ", got, " entries, expected ", want);
  };
  KVCTL_RETURN_IF_ERROR(check_size("layout_index", m.layout_index.size(), pairs));
  KVCTL_RETURN_IF_ERROR(check_size("indptr", m.indptr.size(), pairs + 1));
  KVCTL_RETURN_IF_ERROR(check_size("last_page_len", m.last_page_len.size(), pairs));
  KVCTL_RETURN_IF_ERROR(check_size("tail_counts", m.tail_counts.size(), pairs));
  if (m.indptr[0] != 0) return InvalidArgument("indptr[0]: got ", m.indptr[0], ", expected 0");
  const uint64_t nnz = m.indptr.back();
  KVCTL_RETURN_IF_ERROR(check_size("indices", m.indices.size(), nnz));
  KVCTL_RETURN_IF_ERROR(check_size("side_indices", m.side_indices.size(), any_side ? nnz : 0));
  // Monotone first, so that every indptr entry is <= nnz before it indexes `indices`.
  for (uint64_t i = 0; i < pairs; ++i) {
    if (m.indptr[i + 1] < m.indptr[i]) {
      return InvalidArgument("indptr[", i + 1, "]: got ", m.indptr[i + 1],
                             ", expected >= ", "indptr[", i, "] = ", m.indptr[i]);
    }
  }
  for (uint64_t i = 0; i < pairs; ++i) {
    KVCTL_RETURN_IF_ERROR(CheckRange("layout_index[" + std::to_string(i) + "]", m.layout_index[i],
                                     0, m.layouts.size() - 1));
    const bool has_pages = m.indptr[i + 1] > m.indptr[i];
    KVCTL_RETURN_IF_ERROR(CheckRange("last_page_len[" + std::to_string(i) + "]", m.last_page_len[i],
                                     has_pages ? 1 : 0, has_pages ? m.block_tokens : 0));
    const bool pair_has_side = m.layouts[m.layout_index[i]].side_bytes_per_token > 0;
    for (uint64_t j = m.indptr[i]; j < m.indptr[i + 1]; ++j) {
      if (m.indices[j] == kNoPage) {
        return InvalidArgument("indices[", j, "]: got ", kNoPage, " (no page), expected a page id");
      }
      if (any_side && (m.side_indices[j] != kNoPage) != pair_has_side) {
        return InvalidArgument("side_indices[", j, "]: got ", m.side_indices[j], ", expected ",
                               pair_has_side ? "a page id" : "4294967295 (no side record)",
                               " for the layout of pair ", i);
      }
    }
  }
  KVCTL_RETURN_IF_ERROR(CheckDType("tail_dtype", m.tail_dtype));
  return CheckRowFrames("tail_", Sum(m.tail_counts), m.head_dim, m.tail_dtype, m.tail_positions,
                        m.tail_k, m.tail_v);
}

void TakeTensorFrames(FetchBlocksReply& m, Frames* out) {
  out->push_back(std::move(m.tail_positions));
  out->push_back(std::move(m.tail_k));
  out->push_back(std::move(m.tail_v));
}

Status PutTensorFrames(Frames& in, FetchBlocksReply* m) {
  m->tail_positions = std::move(in[1]);
  m->tail_k = std::move(in[2]);
  m->tail_v = std::move(in[3]);
  return OkStatus();
}

}  // namespace kvctl::ipc
