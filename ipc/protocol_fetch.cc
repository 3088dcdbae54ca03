// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The two FETCH replies: dense K/V rows, and the block page table (PROTOCOL.md "FETCH").
#include <algorithm>
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
  // The field names are built only for an error: this runs on every blocks FETCH reply.
  const auto at = [&] { return internal::StrCat("layouts[", index, "]."); };
  const auto named = [&](Status s) { return s.ok() ? s : Status(s.code(), at() + s.message()); };
  KVCTL_RETURN_IF_ERROR(named(CheckRange("method", l.method, 0, kNumWireQuantMethods - 1)));
  KVCTL_RETURN_IF_ERROR(named(CheckRange("k_bits", l.k_bits, 1, 16)));
  KVCTL_RETURN_IF_ERROR(named(CheckRange("v_bits", l.v_bits, 1, 16)));
  KVCTL_RETURN_IF_ERROR(named(CheckRange("record_bytes", l.record_bytes, 1, m.page_bytes)));
  // records_per_page * record_bytes <= page_bytes, checked as a quotient so it cannot overflow.
  const uint32_t max_per_page = m.page_bytes / l.record_bytes;
  if (l.records_per_page < 1 || l.records_per_page > max_per_page) {
    return InvalidArgument(at(), "records_per_page: got ", l.records_per_page, ", expected 1..",
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
      return InvalidArgument(at(), s.name, ": offset ", s.offset, " + bytes ", s.bytes,
                             " ends past record_bytes ", l.record_bytes);
    }
  }
  for (const Section& a : sections) {
    for (const Section& b : sections) {
      if (&a >= &b || a.bytes == 0 || b.bytes == 0) continue;
      if (a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes) {
        return InvalidArgument(at(), a.name, " [", a.offset, ", ", a.offset + a.bytes,
                               ") overlaps ", b.name, " [", b.offset, ", ", b.offset + b.bytes,
                               ")");
      }
    }
  }
  // Window rows: K row then V row per slot, head_dim <= 1024 values of <= 4 bytes each.
  KVCTL_RETURN_IF_ERROR(named(CheckDType("row_dtype", l.row_dtype)));
  const uint64_t min_slot = 2 * uint64_t{m.head_dim} * DTypeSize(l.row_dtype);
  if (l.row_slot_bytes < min_slot || l.row_slot_bytes > m.page_bytes) {
    return InvalidArgument(at(), "row_slot_bytes: got ", l.row_slot_bytes, ", expected ", min_slot,
                           " (K and V rows of head_dim ", m.head_dim, ") .. page_bytes (",
                           m.page_bytes, ")");
  }
  KVCTL_RETURN_IF_ERROR(
      named(CheckRange("rows_per_page", l.rows_per_page, 1, m.page_bytes / l.row_slot_bytes)));
  // a * b <= p  <=>  a <= p / b for b >= 1, without the product overflowing.
  const uint64_t side_record = uint64_t{l.side_bytes_per_token} * m.block_tokens;
  if (side_record > 0 && side_record > m.page_bytes / m.side_records_per_page) {
    return InvalidArgument(at(), "side_bytes_per_token: got ", l.side_bytes_per_token,
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

// The known table of a FETCH request: checked against the range before it sizes two arrays, so
// a hostile n_known is refused by name, not read as a huge array (the server checks it against
// the session's heads).
StatusOr<uint64_t> ArrayCount(CountRule rule, const FetchRequest& m) {
  KVCTL_CHECK(rule == CountRule::kKnown);  // messages.def gives the request one count rule.
  KVCTL_RETURN_IF_ERROR(CheckRange("layer_end", m.layer_end, 1, kMaxLayers));
  KVCTL_RETURN_IF_ERROR(CheckRange("layer_begin", m.layer_begin, 0, m.layer_end - 1));
  if (m.n_known > 0 && m.mode != FetchMode::kBlocks) {
    return InvalidArgument("n_known: got ", m.n_known,
                           ", expected 0 in dense mode (a known table is for blocks mode)");
  }
  const uint64_t most = uint64_t{m.layer_end - m.layer_begin} * kMaxHeads;
  if (m.n_known > most) {
    return InvalidArgument("n_known: got ", m.n_known, ", expected at most ", most,
                           " (the range's layers x ", kMaxHeads, " heads)");
  }
  return m.n_known;
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
    case CountRule::kWindowNnz:
      KVCTL_CHECK(!m.window_indptr.empty());  // Read before window_ids, like indptr.
      return uint64_t{m.window_indptr.back()};
    case CountRule::kRunNnz:
      KVCTL_CHECK(!m.run_indptr.empty());
      return uint64_t{m.run_indptr.back()};
    case CountRule::kKnown:
      break;  // A request's rule.
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

// indptr-style arrays: pairs + 1 entries, the first 0, non-decreasing (so every entry is <= the
// last, which sized the array it indexes).
Status CheckIndptr(std::string_view name, const std::vector<uint32_t>& indptr) {
  if (indptr[0] != 0) return InvalidArgument(name, "[0]: got ", indptr[0], ", expected 0");
  for (size_t i = 1; i < indptr.size(); ++i) {
    if (indptr[i] < indptr[i - 1]) {
      return InvalidArgument(name, "[", i, "]: got ", indptr[i], ", expected >= ", name, "[", i - 1,
                             "] = ", indptr[i - 1]);
    }
  }
  return OkStatus();
}

// A slot id of a pool with `pool_pages` pages of `per_page` slots.
// ids[begin, end) are slot ids of a pool with `pool_pages` pages of `per_page` slots (REQUIRES:
// per_page >= 1, checked with the layout). id / per_page < pool_pages is tested as id < per_page
// x pool_pages (u32 x u32 fits u64): one compare per slot of a long sequence, no division, and
// the message is built only for the first bad id.
Status CheckSlotIds(std::string_view name, const std::vector<uint32_t>& ids, uint64_t begin,
                    uint64_t end, uint32_t per_page, uint32_t pool_pages) {
  const uint64_t limit = uint64_t{per_page} * pool_pages;
  if (limit > UINT32_MAX) return OkStatus();  // Every u32 id is below it.
  // An OR of compares over all ids first, which the compiler vectorizes with one compare and one
  // OR per four ids (a max reduction needs a blend more without SSE4.1; a page table at 32K
  // tokens holds thousands of ids, and both sides check it); the loop that names the first bad
  // id runs only for an error.
  const auto limit32 = static_cast<uint32_t>(limit);
  uint32_t any_bad = 0;
  for (uint64_t j = begin; j < end; ++j) any_bad |= static_cast<uint32_t>(ids[j] >= limit32);
  if (any_bad == 0) return OkStatus();
  for (uint64_t j = begin; j < end; ++j) {
    if (ids[j] < limit) continue;
    return InvalidArgument(name, "[", j, "]: got ", ids[j], " (page ", ids[j] / per_page,
                           "), expected an id on a page below pool_pages (", pool_pages, ") with ",
                           per_page, " slots per page");
  }
  return OkStatus();
}

// CheckRange of element `index` of array `name`; the name is formatted only for an error.
Status CheckElement(std::string_view name, uint64_t index, uint64_t value, uint64_t lo,
                    uint64_t hi) {
  if (value >= lo && value <= hi) return OkStatus();
  return CheckRange(internal::StrCat(name, "[", index, "]"), value, lo, hi);
}

// Pair i's window: its row ids lie in the pool, at most all of them are sinks, and its position
// runs are non-empty, increasing, cover exactly its rows and stay below kMaxPosition.
Status CheckWindow(const FetchBlocksReply& m, uint64_t i) {
  const RecordLayout& l = m.layouts[m.layout_index[i]];
  const uint32_t rows = m.window_indptr[i + 1] - m.window_indptr[i];
  KVCTL_RETURN_IF_ERROR(CheckSlotIds("window_ids", m.window_ids, m.window_indptr[i],
                                     m.window_indptr[i + 1], l.rows_per_page, m.pool_pages));
  KVCTL_RETURN_IF_ERROR(CheckElement("window_sinks", i, m.window_sinks[i], 0, rows));
  uint64_t covered = 0, next = 0;  // Rows of the runs so far; the least next start.
  for (uint32_t j = m.run_indptr[i]; j < m.run_indptr[i + 1]; ++j) {
    const uint64_t start = m.run_starts[j], length = m.run_lengths[j];
    KVCTL_RETURN_IF_ERROR(CheckElement("run_lengths", j, length, 1,
                                       uint64_t{rows} - std::min<uint64_t>(covered, rows)));
    if (start < next) {
      return InvalidArgument("run_starts[", j, "]: got ", start, ", expected >= ", next,
                             " (past the previous run of pair ", i, ")");
    }
    if (start > uint64_t{kMaxPosition} - length) {
      return InvalidArgument("run_starts[", j, "]: got ", start, ", expected its ", length,
                             " positions below ", kMaxPosition);
    }
    covered += length;
    next = start + length;
  }
  if (covered != rows) {
    return InvalidArgument("run_lengths: pair ", i, "'s runs cover ", covered,
                           " rows, expected its window rows (", rows, ")");
  }
  return OkStatus();
}

size_t BodyBytes(const FetchBlocksReply& m) {
  constexpr size_t kFixed = 1 + 4 * 8 + 2;  // mode, eight u32 fields, n_layouts.
  constexpr size_t kLayoutBytes = 64;       // PROTOCOL.md "Layout (64 bytes)".
  return kFixed + kLayoutBytes * m.layouts.size() + 2 * m.layout_index.size() +
         4 * (m.indptr.size() + m.indices.size() + m.last_page_len.size() + m.side_indices.size() +
              m.window_indptr.size() + m.window_ids.size() + m.window_sinks.size() +
              m.run_indptr.size() + m.run_lengths.size()) +
         4 * m.record_base.size() + 8 * (m.run_starts.size() + m.table_tags.size());
}

Status Validate(const FetchBlocksReply& m) {
  KVCTL_RETURN_IF_ERROR(CheckPairShape({m.layer_begin, m.n_layers, m.kv_heads, m.head_dim}));
  KVCTL_RETURN_IF_ERROR(CheckRange("page_bytes", m.page_bytes, 1, UINT32_MAX));
  KVCTL_RETURN_IF_ERROR(CheckRange("pool_pages", m.pool_pages, 1, UINT32_MAX));
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
  KVCTL_RETURN_IF_ERROR(check_size("window_indptr", m.window_indptr.size(), pairs + 1));
  KVCTL_RETURN_IF_ERROR(check_size("window_sinks", m.window_sinks.size(), pairs));
  KVCTL_RETURN_IF_ERROR(check_size("run_indptr", m.run_indptr.size(), pairs + 1));
  KVCTL_RETURN_IF_ERROR(check_size("record_base", m.record_base.size(), pairs));
  KVCTL_RETURN_IF_ERROR(check_size("table_tags", m.table_tags.size(), pairs));
  const uint64_t nnz = m.indptr.back();
  KVCTL_RETURN_IF_ERROR(check_size("indices", m.indices.size(), nnz));
  KVCTL_RETURN_IF_ERROR(check_size("side_indices", m.side_indices.size(), any_side ? nnz : 0));
  KVCTL_RETURN_IF_ERROR(check_size("window_ids", m.window_ids.size(), m.window_indptr.back()));
  KVCTL_RETURN_IF_ERROR(check_size("run_starts", m.run_starts.size(), m.run_indptr.back()));
  KVCTL_RETURN_IF_ERROR(check_size("run_lengths", m.run_lengths.size(), m.run_indptr.back()));
  // Monotone first, so that every indptr entry is <= the array it indexes.
  KVCTL_RETURN_IF_ERROR(CheckIndptr("indptr", m.indptr));
  KVCTL_RETURN_IF_ERROR(CheckIndptr("window_indptr", m.window_indptr));
  KVCTL_RETURN_IF_ERROR(CheckIndptr("run_indptr", m.run_indptr));
  for (uint64_t i = 0; i < pairs; ++i) {
    KVCTL_RETURN_IF_ERROR(
        CheckElement("layout_index", i, m.layout_index[i], 0, m.layouts.size() - 1));
    const RecordLayout& layout = m.layouts[m.layout_index[i]];
    // The pair's records: the record_base ones the client holds, then the listed ones.
    const bool has_pages = m.indptr[i + 1] > m.indptr[i] || m.record_base[i] > 0;
    KVCTL_RETURN_IF_ERROR(CheckElement("last_page_len", i, m.last_page_len[i], has_pages ? 1 : 0,
                                       has_pages ? m.block_tokens : 0));
    const bool pair_has_side = layout.side_bytes_per_token > 0;
    // kNoPage (the largest u32) has its own message. It fails the slot bound unless the pool has
    // 2^32 slots or more; only then, or for an error, are the ids searched for it.
    const Status slots = CheckSlotIds("indices", m.indices, m.indptr[i], m.indptr[i + 1],
                                      layout.records_per_page, m.pool_pages);
    if (!slots.ok() || uint64_t{layout.records_per_page} * m.pool_pages > kNoPage) {
      for (uint64_t j = m.indptr[i]; j < m.indptr[i + 1]; ++j) {
        if (m.indices[j] == kNoPage) {
          return InvalidArgument("indices[", j, "]: got ", kNoPage,
                                 " (no page), expected a page id");
        }
      }
      KVCTL_RETURN_IF_ERROR(slots);
    }
    for (uint64_t j = m.indptr[i]; any_side && j < m.indptr[i + 1]; ++j) {
      if ((m.side_indices[j] != kNoPage) != pair_has_side) {
        return InvalidArgument("side_indices[", j, "]: got ", m.side_indices[j], ", expected ",
                               pair_has_side ? "a page id" : "4294967295 (no side record)",
                               " for the layout of pair ", i);
      }
    }
    if (any_side && pair_has_side) {
      KVCTL_RETURN_IF_ERROR(CheckSlotIds("side_indices", m.side_indices, m.indptr[i],
                                         m.indptr[i + 1], m.side_records_per_page, m.pool_pages));
    }
    KVCTL_RETURN_IF_ERROR(CheckWindow(m, i));
  }
  return OkStatus();
}

}  // namespace kvctl::ipc
