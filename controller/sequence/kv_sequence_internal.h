// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/sequence/kv_sequence_internal.h (internal to controller/kv_sequence*.cc)
// The stored state of a KvSequence and the plan of one append, shared by the storage and commit
// code (kv_sequence.cc) and the scoring, eviction and compaction that prepare an append
// (kv_sequence_append.cc, kv_sequence_evict.cc).
#ifndef KVCTL_CONTROLLER_SEQUENCE_KV_SEQUENCE_INTERNAL_H_
#define KVCTL_CONTROLLER_SEQUENCE_KV_SEQUENCE_INTERNAL_H_

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "common/half.h"
#include "controller/sequence/kv_sequence.h"
#include "kernels/convert.h"
#include "policies/reasonalloc.h"

namespace kvctl {

struct KvSequence::HeadStream {
  QuantSpec spec;
  SlotArray rows;     // Sinks, then tail: K row then V row per slot.
  SlotArray records;  // Quantized block records.
  int sink_rows = 0;
  int tail_rows = 0;
  std::vector<int64_t> positions;  // Of every kept token: sinks, record tokens, tail.
  H2OState h2o;                    // h2o policy: accumulated attention, one entry per kept token.
  // rkv policy: each kept token's newest near-duplicate as its last scoring left it (a cache
  // the next scoring checks before use; not in sequence images).
  RedundancyState redundancy;
  HeadUsage usage;  // Quality and eviction counters (tokens etc. computed on read).

  HeadStream(QuantSpec s, SlotArray r, SlotArray rec)
      : spec(s), rows(std::move(r)), records(std::move(rec)) {}
  int64_t count() const {
    return sink_rows + static_cast<int64_t>(records.size()) * spec.block_tokens + tail_rows;
  }
};

// What eviction scoring keeps per layer between appends besides the query rows. An append
// prepares a copy and commits it only when everything else succeeded (all or nothing).
struct LayerScoring {
  int64_t h2o_pending = 0;  // Query rows not yet folded into h2o's accumulated attention.
  std::optional<HeadReallocator> realloc;
  bool has_utility = false;
  int64_t layer_budget = 0;
};

// A layer's newest query rows, fp32 [count, q_heads, head_dim] from row `first` of `data`: the
// observation window, plus for h2o the rows not yet folded into the accumulated attention. The
// rows before `first` were dropped; CommitQueries moves the kept ones down only when the dropped
// ones are more than half of them, so a decode step copies its own row, not the window.
struct QueryRows {
  std::vector<float> data;
  int64_t first = 0;
  int64_t count = 0;
};

// An append's query step, prepared without copying the layer's rows (all or nothing, like
// LayerScoring): whether the layer's rows go first (no Q came, or more rows than the window),
// this append's kept rows, and how many of the newest rows the commit keeps.
struct PreparedQueries {
  bool drop_old = false;
  std::vector<float> rows;  // This append's kept rows, [count, q_heads, head_dim].
  int64_t count = 0;
  int64_t total = 0;  // The layer's rows after this append: the kept old ones, then `rows`.
  int64_t keep = 0;   // The newest rows the commit keeps (KeepQueryWindow).
  // The `total` rows back to back, built when scoring reads further back than `rows`.
  std::vector<float> window;
  bool window_built = false;
};

struct KvSequence::LayerState {
  LayerPlan plan;
  DType row_dtype = DType::kF16;
  size_t row_bytes = 0;  // One K or V row.
  std::vector<HeadStream> heads;
  SlotArray norms;  // OScaR: block_tokens fp32 norms per slot, one slot per record index.
  LayerScoring scoring;
  QueryRows queries;

  explicit LayerState(Slab* norm_slab) : norms(norm_slab) {}
};

// Per append, shared by the layers: the budget schedule of this append.
struct KvSequence::AppendContext {
  int64_t n = 0;
  int64_t avg_budget = 0;
  std::vector<int64_t> layer_budgets;
  // Per layer (empty = none): budget.realloc_period's head re-allocation falls on this append.
  std::vector<uint8_t> realloc_due;
  bool ReallocDue(int l) const { return !realloc_due.empty() && realloc_due[l] != 0; }
  // APPEND_CONTINUES within evict.max_deferred_tokens: store without scoring or evicting (and
  // without flushing, so the APPEND that ends the prefill sees what one APPEND of it all would).
  bool defer = false;
  bool cap_hit = false;  // The flag was set but the cap was reached: evicts as without it.
  // Per layer (empty = none): a layer whose tail reached flush_tokens but whose flush waits for a
  // later append (SequenceGeometry::flush_spread_steps); its heads that evict nothing only store
  // rows.
  std::vector<uint8_t> held_flush;
  bool HoldsFlush(int l) const { return !held_flush.empty() && held_flush[l] != 0; }
  // Per layer (empty = none): evict.stagger_layers' scheduled compression falls on this append.
  std::vector<uint8_t> compress_due;
  bool CompressDue(int l) const { return !compress_due.empty() && compress_due[l] != 0; }
};

// Everything an append will write into one head, computed before any stored state changes.
struct PreparedHead {
  int new_sinks = 0;
  // The head's records after the append, in order: its first records_in_place records stay
  // where they are (no per-record work on a decode step however long the sequence), then per
  // entry of record_plan an old record index (kept byte for byte, moved down), kNewRecord for the
  // next record of `records` or kMovedRecord for the next record of `moved`.
  static constexpr int kNewRecord = -1;
  static constexpr int kMovedRecord = -2;
  size_t records_in_place = 0;
  std::vector<int> record_plan;
  size_t final_records() const { return records_in_place + record_plan.size(); }
  std::vector<uint8_t> records;  // New records (re-packed kept tokens, then flushed) back to back.
  // Records assembled from kept tokens of old records of a token-separable method, token by token
  // (CopyRecordToken), back to back: nothing in them is quantized again.
  std::vector<uint8_t> moved;
  // The rows those records were quantized from, fp16 (2 bytes each): what a quantized layer's
  // rows are stored as, so a flush copies them and the quantizers read half the bytes of fp32.
  std::vector<uint16_t> qk, qv;
  int write_start = 0;
  int rows_after = 0;
  int tail_after = 0;
  std::vector<uint8_t> rows;  // Converted rows written from slot write_start.
  bool evicted = false;
  std::vector<int64_t> kept;  // Indices into the old tokens + new ones, when evicted.
  bool h2o_changed = false;
  H2OState h2o;
  bool redundancy_changed = false;  // rkv: `redundancy` replaces the head's at commit.
  RedundancyState redundancy;
  int64_t budget = 0;
  bool deferred = false;  // A deferred append: the head may hold more than its budget.
  uint64_t evicted_tokens = 0, evicted_bytes = 0;
  uint64_t decoded_tokens = 0;  // Kept tokens taken out of records to be quantized again.
  double retained = -1;         // Attention mass kept, when queries were there to measure it.

  // Back to an empty plan. The row and plan buffers keep their capacity up to a decode step's
  // size, so a decode step allocates nothing for them; a prefill's big buffers are freed.
  void Reset() {
    constexpr size_t kKeepBytes = 16 << 10;
    std::vector<uint8_t> kept_rows = std::move(rows);
    std::vector<int> kept_plan = std::move(record_plan);
    *this = PreparedHead{};
    if (kept_rows.capacity() <= kKeepBytes) rows = std::move(kept_rows), rows.clear();
    if (kept_plan.capacity() * sizeof(int) <= kKeepBytes) {
      record_plan = std::move(kept_plan), record_plan.clear();
    }
  }
};

struct PreparedLayer {
  std::vector<PreparedHead> heads;
  std::vector<float> norms;  // OScaR norms of the flushed tokens.
  struct Sample {
    int head;
    double k_rel_error, v_rel_error;
  };
  std::vector<Sample> samples;  // Quality telemetry of sampled new records.
  LayerScoring scoring;         // The layer's scoring state after the append.
  PreparedQueries queries;      // Its query rows after the append.
};

// A held flush prepared ahead of the append that commits it (PrepareHeldFlushStep).
struct KvSequence::HeldFlushPrep {
  uint64_t publishes = 0;  // KvSequence::publishes_ when preparation began: valid while equal.
  int next_layer = 0;      // Layers [0, next_layer) are prepared.
  std::vector<PreparedLayer> layers;
};

// The working state of one layer's Prepare, shared by its steps.
struct KvSequence::LayerPrep {
  int l = 0;
  int64_t n = 0;
  const LayerState& layer;
  const AppendContext& ctx;
  const KvTensorView& k;
  const KvTensorView& v;
  PreparedLayer* out;
  // Each head's tokens in fp32 (old and new), decoded only when scoring needs them (never
  // without eviction: a decode step then touches none of this): rows of the thread's DecodedRows
  // (kv_sequence_append.cc), valid where have_all / have_records say.
  std::vector<float*> all_k{}, all_v{};
  // Per head, the keys R-KV scores a head with before its first record (KeysAsStored), as large
  // as its all_k rows and freed once the head is evicted; empty where the scorers read all_k.
  std::vector<std::vector<float>> stored_k{};
  std::vector<bool> have_all{};      // The rows past the records are decoded (all_k/all_v).
  std::vector<bool> have_records{};  // The records' K rows too.
  // Per head, per record: its V rows are in all_v (RecordValues); empty until FullKeys.
  std::vector<std::vector<uint8_t>> record_values{};
  std::vector<int64_t> budget{};  // Per head, with eviction.
  bool have_q = false;            // Query rows to score with.
  int64_t obs = 0;                // Observation rows among them.
  ProtectedRegions regions{};
  bool checked = false;  // CheckLayerSlots ran.
  Status loss{};         // The DATA_LOSS CheckLayerSlots found.
};

// One record's rows as the scorers and a re-pack read them: decoded (V only when v is not null),
// then rounded to fp16 values unless the layer is lossless (round false). Materialize and
// RecordValues both decode through this, so a V decoded later equals one decoded with its K.
void DecodeRecordRounded(const QuantSpec& spec, const uint8_t* record, const float* norms,
                         bool round, float* k, float* v, size_t elems);
// Appends the fp32 rows `rows[i] * d` of src, i in [begin, end), as fp16. Exact for the rows a
// flush quantizes: a quantized layer's values are fp16 already (stored rows, or decoded and
// rounded by Materialize).
void AppendRowsAsHalves(const float* src, int d, const std::vector<int64_t>& rows, size_t begin,
                        size_t end, std::vector<uint16_t>* dst);
// `s` with "layer l, head h: " before its message.
Status WithLayerHead(int l, int h, const Status& s);

// Prepare's query step. StartQueries: nothing taken yet (the layer's `kept` rows stay).
// TakeQueries: this append's query rows (fp32) after the kept ones, as the eviction policy needs
// them: every row for h2o, the newest obs_window rows otherwise; without Q the kept rows are
// dropped (they no longer end at the newest token); without eviction nothing changes.
void StartQueries(const QueryRows& kept, PreparedQueries* out);
void TakeQueries(const EvictionSettings& ev, const KvTensorView* q, int64_t n, int q_heads,
                 int head_dim, LayerScoring* scoring, PreparedQueries* out);
// After scoring: the commit keeps the observation window (and h2o's unfolded rows) of queries.
void KeepQueryWindow(const EvictionSettings& ev, const LayerScoring& scoring, PreparedQueries* out);
// The newest `rows` (<= out->total) of the layer's query rows after the append, back to back,
// rows of q_row floats.
const float* NewestQueries(const QueryRows& kept, size_t q_row, int64_t rows, PreparedQueries* out);
// Writes the prepared query step into the layer's rows.
void CommitQueries(const PreparedQueries& prepared, size_t q_row, QueryRows* kept);

// Rows between fp32 and the stored dtype, through kernels/convert.h (SIMD, bit-identical to
// common/half.h; any alignment).
inline void StoreRow(const float* src, int d, DType dtype, uint8_t* dst) {
  ConvertElements(DType::kF32, src, dtype, dst, static_cast<size_t>(d));
}
inline void LoadRow(const void* src, int d, DType dtype, float* dst) {
  ConvertElements(dtype, src, DType::kF32, dst, static_cast<size_t>(d));
}
// Token t of head h of a request into a row slot: its K row, then its V row at row_bytes, in the
// stored dtype (a byte copy when the request's dtype is that one).
inline void StoreRequestRow(const KvTensorView& k, const KvTensorView& v, int64_t t, int64_t h,
                            DType dtype, size_t row_bytes, uint8_t* slot) {
  const auto d = static_cast<size_t>(k.head_dim);
  if (k.dtype == dtype && v.dtype == dtype) {  // The usual case: a copy, inlined.
    std::memcpy(slot, k.RowBytes(t, h), row_bytes);
    std::memcpy(slot + row_bytes, v.RowBytes(t, h), row_bytes);
    return;
  }
  ConvertElements(k.dtype, k.RowBytes(t, h), dtype, slot, d);
  ConvertElements(v.dtype, v.RowBytes(t, h), dtype, slot + row_bytes, d);
}

// Tokens a head's tail holds after an append of n tokens with no eviction (what follows its
// sinks, topped up to sink_target, and its records); the tail flushes into records when this
// reaches flush_tokens. AppendIsLight predicts with it what PlanHeadRows then does.
inline int64_t KvSequence::TailAfterAppend(const HeadStream& head, int sink_target, int64_t n) {
  const int64_t sinks_after =
      head.sink_rows + std::clamp<int64_t>(sink_target - head.sink_rows, 0, n);
  return head.count() + n - sinks_after -
         static_cast<int64_t>(head.records.size()) * head.spec.block_tokens;
}

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SEQUENCE_KV_SEQUENCE_INTERNAL_H_
