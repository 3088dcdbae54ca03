// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The preparing half of KvSequence::Append: the query step, decoding a head's tokens, flushes,
// record quantization and the per-layer driver AppendLayerPrepare, all into temporary memory
// (PreparedLayer); scoring, H2O, head re-allocation and eviction planning are in
// kv_sequence_evict.cc, and kv_sequence.cc reserves the pages and commits.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/half.h"
#include "controller/sequence/kv_sequence.h"
#include "controller/sequence/kv_sequence_internal.h"
#include "kernels/convert.h"
#include "kernels/quantize.h"

namespace kvctl {

namespace {

// Decodes a fresh record and compares it with the rows it was made from.
void SampleQuality(const QuantSpec& spec, const BlockInput& in, const uint8_t* rec,
                   PreparedLayer::Sample* out) {
  const int g = spec.block_tokens, d = spec.head_dim;
  thread_local std::vector<float> k, v;
  k.resize(static_cast<size_t>(g) * d);
  v.resize(k.size());
  DequantizeBlock(spec, rec, in.token_norms, k.data(), v.data());
  double ek = 0, rk = 0, ev = 0, rv = 0;
  for (int t = 0; t < g; ++t) {
    for (int c = 0; c < d; ++c) {
      const double xk = HalfToFloat(in.k_f16[t * in.row_stride + c]);
      const double xv = HalfToFloat(in.v_f16[t * in.row_stride + c]);
      ek += (k[t * d + c] - xk) * (k[t * d + c] - xk), rk += xk * xk;
      ev += (v[t * d + c] - xv) * (v[t * d + c] - xv), rv += xv * xv;
    }
  }
  out->k_rel_error = rk > 0 ? ek / rk : 0;
  out->v_rel_error = rv > 0 ? ev / rv : 0;
}

}  // namespace

void DecodeRecordRounded(const QuantSpec& spec, const uint8_t* record, const float* norms,
                         bool round, float* k, float* v, size_t elems) {
  DequantizeBlock(spec, record, norms, k, v);
  if (round) RoundToHalfInPlace(k, elems);
  if (round && v != nullptr) RoundToHalfInPlace(v, elems);
}

void AppendRowsAsHalves(const float* src, int d, const std::vector<int64_t>& rows, size_t begin,
                        size_t end, std::vector<uint16_t>* dst) {
  const size_t at = dst->size();
  dst->resize(at + (end - begin) * d);
  uint16_t* out = dst->data() + at;
  for (size_t i = begin; i < end; ++i, out += d) {
    ConvertElements(DType::kF32, src + rows[i] * d, DType::kF16, out, d);
  }
}

Status WithLayerHead(int l, int h, const Status& s) {
  return Status(s.code(), internal::StrCat("layer ", l, ", head ", h, ": ", s.message()));
}

void StartQueries(const QueryRows& kept, PreparedQueries* out) {
  out->drop_old = false;
  out->count = 0;
  out->total = out->keep = kept.count;
  out->window_built = false;
}

void TakeQueries(const EvictionSettings& ev, const KvTensorView* q, int64_t n, int q_heads,
                 int head_dim, LayerScoring* scoring, PreparedQueries* out) {
  const size_t q_row = static_cast<size_t>(q_heads) * head_dim;
  if (q == nullptr) {
    // Rows kept from earlier appends no longer end at the newest token: drop them.
    out->drop_old = true;
    out->count = out->total = out->keep = 0;
    scoring->h2o_pending = 0;
    return;
  }
  if (!ev.enabled) return;
  // Only h2o reads every query; the others need the newest obs_window rows (a long prefill
  // would otherwise convert and hold all of its queries).
  const bool all_rows = ev.policy == EvictPolicy::kH2O;
  const int64_t want = all_rows ? n : std::min<int64_t>(n, ev.obs_window);
  // The rows kept must stay the newest, consecutive ones.
  if (want < n) out->drop_old = true, out->total = 0;
  out->rows.resize(static_cast<size_t>(want) * q_row);
  for (int64_t t = n - want; t < n; ++t) {
    float* dst = &out->rows[(t - (n - want)) * q_row];
    for (int h = 0; h < q_heads; ++h) q->LoadRow(t, h, dst + h * head_dim);
  }
  out->count = want;
  out->total += want;
  out->keep = out->total;
  if (all_rows) scoring->h2o_pending += n;
}

void KeepQueryWindow(const EvictionSettings& ev, const LayerScoring& scoring,
                     PreparedQueries* out) {
  out->keep = std::min(out->total, std::max(ev.obs_window, scoring.h2o_pending));
}

const float* NewestQueries(const QueryRows& kept, size_t q_row, int64_t rows,
                           PreparedQueries* out) {
  KVCTL_CHECK(rows >= 0 && rows <= out->total);
  if (rows <= out->count) return out->rows.data() + (out->count - rows) * q_row;
  if (!out->window_built) {
    // The kept rows (all of them: out->total - out->count), then this append's.
    const size_t old = static_cast<size_t>(out->total - out->count) * q_row;
    out->window.resize(static_cast<size_t>(out->total) * q_row);
    std::copy_n(kept.data.data() + static_cast<size_t>(kept.first) * q_row, old,
                out->window.begin());
    std::copy(out->rows.begin(),
              out->rows.begin() + static_cast<std::ptrdiff_t>(out->count * q_row),
              out->window.begin() + static_cast<std::ptrdiff_t>(old));
    out->window_built = true;
  }
  return out->window.data() + (out->total - rows) * q_row;
}

void CommitQueries(const PreparedQueries& prepared, size_t q_row, QueryRows* kept) {
  if (prepared.drop_old) kept->first = kept->count = 0;
  const size_t end = static_cast<size_t>(kept->first + kept->count) * q_row;
  const size_t add = static_cast<size_t>(prepared.count) * q_row;
  if (kept->data.size() < end + add) kept->data.resize(end + add);
  std::copy_n(prepared.rows.begin(), add, kept->data.begin() + static_cast<std::ptrdiff_t>(end));
  kept->count += prepared.count;
  KVCTL_CHECK(kept->count == prepared.total && prepared.keep <= kept->count);
  kept->first += kept->count - prepared.keep;
  kept->count = prepared.keep;
  if (2 * kept->first > kept->count) {
    // More dropped rows than half the kept ones: move the kept ones down (amortised: decode
    // steps with a window of W rows do this once every W / 2 steps), so the buffer holds at most
    // 1.5 W rows besides one append's.
    std::copy_n(kept->data.begin() + static_cast<std::ptrdiff_t>(kept->first * q_row),
                static_cast<size_t>(kept->count) * q_row, kept->data.begin());
    kept->first = 0;
  }
}

Status KvSequence::EncodeNewRecords(int l, PreparedLayer* out) const {
  const LayerState& layer = *layers_[l];
  const int heads = geometry_.kv_heads, d = geometry_.head_dim;
  // Quantize the new records. OScaR's norm spans the heads, which stay in lockstep (no eviction,
  // so every new record is a flushed one).
  const QuantSpec& spec0 = layer.heads[0].spec;
  const bool needs_norms = !layer.plan.lossless && TraitsOf(spec0.method).needs_token_norms;
  const int rows0 = static_cast<int>(out->heads[0].qk.size() / d);
  if (needs_norms && rows0 > 0) {
    // A strided fp16 view over the heads' rows: token t of head h at qk of h, row t.
    std::vector<uint16_t> inter(static_cast<size_t>(rows0) * heads * d);
    for (int h = 0; h < heads; ++h) {
      KVCTL_CHECK(out->heads[h].qk.size() == static_cast<size_t>(rows0) * d);
      for (int t = 0; t < rows0; ++t) {
        std::memcpy(&inter[(static_cast<size_t>(t) * heads + h) * d], &out->heads[h].qk[t * d],
                    sizeof(uint16_t) * d);
      }
    }
    out->norms.resize(static_cast<size_t>(rows0));
    ComputeTokenNorms(KvTensorView::Contiguous(inter.data(), DType::kF16, rows0, heads, d),
                      out->norms.data());
  }
  for (int h = 0; h < heads; ++h) {
    PreparedHead& ph = out->heads[h];
    if (ph.qk.empty()) continue;
    const QuantSpec& spec = layer.heads[h].spec;
    const int g = spec.block_tokens;
    const size_t rb = BlockLayoutOf(spec).record_bytes;
    const int blocks = static_cast<int>(ph.qk.size() / (static_cast<size_t>(g) * d));
    ph.records.resize(rb * blocks);
    // One batch per head: a device pool encodes it on its device (Arena::EncodeBlocks).
    const BlockBatch batch{.row_stride = d,
                           .block_stride = static_cast<int64_t>(g) * d,
                           .token_norms = needs_norms ? out->norms.data() : nullptr,
                           .n_blocks = blocks,
                           .k_f16 = ph.qk.data(),
                           .v_f16 = ph.qv.data()};
    Status encoded = pool_->EncodeBlocks(spec, batch, ph.records.data());
    if (!encoded.ok()) return WithLayerHead(l, h, encoded);
    if (geometry_.quality_sample_period == 0) continue;
    // Position of the next new record in the head's record list (never among those in place).
    size_t index = ph.records_in_place;
    for (int b = 0; b < blocks; ++b, ++index) {
      while (ph.record_plan[index - ph.records_in_place] != PreparedHead::kNewRecord) ++index;
      if (index % static_cast<size_t>(geometry_.quality_sample_period) != 0) continue;
      out->samples.push_back({h, 0, 0});
      SampleQuality(spec, BatchBlock(spec, batch, b), ph.records.data() + b * rb,
                    &out->samples.back());
    }
  }

  return OkStatus();
}

void KvSequence::Materialize(const LayerState& layer, int h, int64_t from, const KvTensorView& k,
                             const KvTensorView& v, float* kd, float* vd,
                             RecordRows records) const {
  const HeadStream& head = layer.heads[h];
  const int d = geometry_.head_dim;
  const int64_t old = head.count(), total = old + k.tokens;
  const int g = head.spec.block_tokens;
  const int64_t rec_begin = head.sink_rows;
  const int64_t rec_end = rec_begin + static_cast<int64_t>(head.records.size()) * g;
  // Rows wait as fp16 before they are quantized, and decoded tokens re-enter as fp16: values
  // that did not come as fp16 are rounded to it. Stored rows of a quantized layer are fp16
  // already (LayerState::row_dtype), so only decoded records and non-fp16 input are rounded.
  const bool round = !layer.plan.lossless;
  const auto row = static_cast<size_t>(d);
  const size_t record_elems = static_cast<size_t>(g) * row;
  std::vector<float> bk, bv;  // The record being copied out.
  for (int64_t j = from; j < total; ++j, kd += d, vd += d) {
    if (j < rec_begin || (j >= rec_end && j < old)) {
      const uint8_t* slot = head.rows.Slot(j < rec_begin ? j : head.sink_rows + (j - rec_end));
      LoadRow(slot, d, layer.row_dtype, kd);
      LoadRow(slot + layer.row_bytes, d, layer.row_dtype, vd);
    } else if (j < rec_end && records == RecordRows::kZeros) {
      std::fill(kd, kd + d, 0.0f);
      std::fill(vd, vd + d, 0.0f);
    } else if (j < rec_end) {
      const bool values = records == RecordRows::kKeysAndValues;
      // Each record is decoded into a small buffer and copied row by row: the decoder's
      // transposes into a cache-hot buffer, then one streaming copy, beat the same transposes
      // straight into the long output (tried: the transposes then took 5 % of the daemon's
      // samples in the 8K R-KV run, against 1.4 % this way).
      const int64_t r = (j - rec_begin) / g, t = (j - rec_begin) % g;
      if (t == 0 || bk.empty()) {
        bk.resize(record_elems);
        bv.resize(record_elems);
        const float* norms =
            layer.norms.size() > 0 ? reinterpret_cast<const float*>(layer.norms.Slot(r)) : nullptr;
        DecodeRecordRounded(head.spec, head.records.Slot(r), norms, round, bk.data(),
                            values ? bv.data() : nullptr, record_elems);
      }
      std::memcpy(kd, &bk[t * d], sizeof(float) * d);
      if (values) std::memcpy(vd, &bv[t * d], sizeof(float) * d);
    } else {
      // The SIMD LoadRow (KvTensorView::LoadRow converts element by element).
      LoadRow(k.RowBytes(j - old, h), d, k.dtype, kd);
      LoadRow(v.RowBytes(j - old, h), d, v.dtype, vd);
      if (round && k.dtype != DType::kF16) RoundToHalfInPlace(kd, row);
      if (round && v.dtype != DType::kF16) RoundToHalfInPlace(vd, row);
    }
  }
}

namespace {

// The decoded rows of one layer's heads (LayerPrep::all_k/all_v), kept by each thread between
// appends: an evicting head decodes every token it holds, several MB at long contexts, and fresh
// memory for it on every compression cost a zero fill and page faults (docs/kvbench_ipc.md "R-KV
// at 8K: a float softmax and no copies of kept rows"). The buffers only grow while they hold at
// most kMaxKeptBytes; past that the next prepare frees them first, so a thread keeps at most one
// oversized set, and only until its next prepare.
struct DecodedRows {
  static constexpr size_t kMaxKeptBytes = size_t{64} << 20;
  std::vector<std::vector<float>> k, v;
  std::vector<int64_t> loose;  // One head's loose kept tokens (AppendLayerPrepare).

  // Rows for `heads` heads of up to `elems` floats each, K then V.
  void Prepare(int heads, size_t elems) {
    if (k.size() < static_cast<size_t>(heads)) k.resize(heads), v.resize(heads);
    size_t held = loose.capacity() * sizeof(int64_t);
    for (size_t h = 0; h < k.size(); ++h) {
      held += (k[h].capacity() + v[h].capacity()) * sizeof(float);
    }
    if (held > kMaxKeptBytes) {
      k.assign(k.size(), {});
      v.assign(v.size(), {});
      loose = {};
    }
    for (int h = 0; h < heads; ++h) {
      if (k[h].size() < elems) k[h].resize(elems), v[h].resize(elems);
    }
  }
};

DecodedRows& ThreadDecodedRows() {
  thread_local DecodedRows rows;
  return rows;
}

}  // namespace

bool KvSequence::FlushesTail(const AppendContext& ctx, int l, int h) const {
  const LayerState& layer = *layers_[l];
  const StreamingRules& rules = layer.plan.rules;
  const int sinks_target = layer.plan.lossless ? 0 : rules.sink_tokens;
  return !(layer.plan.lossless || ctx.defer || ctx.HoldsFlush(l) ||
           TailAfterAppend(layer.heads[h], sinks_target, ctx.n) < int64_t{rules.flush_tokens});
}

Status KvSequence::CheckFlushedTails(const AppendContext& ctx, int layer_begin,
                                     int layer_end) const {
  if (!pool_->checksums()) return OkStatus();
  // One check for every layer's tails: a decode step's rows of all streams lie side by side, so
  // the heads of several layers share each chunk.
  std::vector<PageAllocator::PageRange> ranges;
  for (int l = layer_begin; l < layer_end; ++l) {
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      const HeadStream& head = layers_[l]->heads[h];
      if (FlushesTail(ctx, l, h)) head.rows.AppendRanges(head.sink_rows, head.rows.size(), &ranges);
    }
  }
  if (ranges.empty()) return OkStatus();
  return pool_->VerifyRanges(ranges, PageAllocator::VerifyReason::kRewrite);
}

void KvSequence::FlushStoredRows(LayerPrep& p, int h, int64_t read_from) const {
  // The rows from read_from on (the tail after the sinks, then the new tokens) as fp16, taken
  // as they are stored and converted from the request: the whole flush_tokens multiples go to
  // the quantizer as they are, the rest are written back as the new tail after the new sinks.
  const HeadStream& head = p.layer.heads[h];
  PreparedHead& ph = p.out->heads[h];
  KVCTL_CHECK(p.layer.row_dtype == DType::kF16);  // A quantized layer's rows (kv_sequence.cc).
  const StreamingRules& rules = p.layer.plan.rules;
  const int g = head.spec.block_tokens, d = geometry_.head_dim;
  const auto row = static_cast<size_t>(d);
  const int64_t old = head.count(), total = old + p.n;
  const int64_t rec_end = head.sink_rows + static_cast<int64_t>(head.records.size()) * g;
  KVCTL_CHECK(read_from >= rec_end);  // Records are never read back here.
  const auto l_rows = static_cast<int>(total - read_from);
  std::vector<uint16_t> k(static_cast<size_t>(l_rows) * row), v(k.size());
  for (int64_t j = read_from; j < total; ++j) {
    uint16_t* kd = &k[static_cast<size_t>(j - read_from) * row];
    uint16_t* vd = &v[static_cast<size_t>(j - read_from) * row];
    if (j < old) {
      const uint8_t* slot = head.rows.Slot(head.sink_rows + (j - rec_end));
      std::memcpy(kd, slot, p.layer.row_bytes);
      std::memcpy(vd, slot + p.layer.row_bytes, p.layer.row_bytes);
    } else {
      ConvertElements(p.k.dtype, p.k.RowBytes(j - old, h), DType::kF16, kd, row);
      ConvertElements(p.v.dtype, p.v.RowBytes(j - old, h), DType::kF16, vd, row);
    }
  }
  const int flushed = l_rows / rules.flush_tokens * rules.flush_tokens;
  const auto flushed_elems = static_cast<std::ptrdiff_t>(static_cast<size_t>(flushed) * row);
  ph.qk.assign(k.begin(), k.begin() + flushed_elems);
  ph.qv.assign(v.begin(), v.begin() + flushed_elems);
  for (int b = 0; b < flushed / std::max(g, 1); ++b) {
    ph.record_plan.push_back(PreparedHead::kNewRecord);
  }
  ph.tail_after = l_rows - flushed;
  ph.rows_after = head.sink_rows + ph.new_sinks + ph.tail_after;
  ph.write_start = head.sink_rows;
  const size_t slot = 2 * p.layer.row_bytes;
  ph.rows.resize((ph.new_sinks + static_cast<size_t>(ph.tail_after)) * slot);
  uint8_t* dst = ph.rows.data();
  for (int t = 0; t < ph.new_sinks; ++t, dst += slot) {
    StoreRequestRow(p.k, p.v, t, h, DType::kF16, p.layer.row_bytes, dst);
  }
  for (int t = flushed; t < l_rows; ++t, dst += slot) {
    std::memcpy(dst, &k[static_cast<size_t>(t) * row], p.layer.row_bytes);
    std::memcpy(dst + p.layer.row_bytes, &v[static_cast<size_t>(t) * row], p.layer.row_bytes);
  }
}

Status KvSequence::AppendLayerPrepare(int l, const AppendContext& ctx, const KvTensorView& k,
                                      const KvTensorView& v, const KvTensorView* q,
                                      PreparedLayer* out) const {
  const int heads = geometry_.kv_heads;
  const EvictionSettings& ev = eviction_;
  out->heads.resize(static_cast<size_t>(heads));  // Reused between appends (prepared_).
  for (PreparedHead& ph : out->heads) ph.Reset();
  out->norms.clear();
  out->samples.clear();
  LayerPrep p{.l = l, .n = ctx.n, .layer = *layers_[l], .ctx = ctx, .k = k, .v = v, .out = out};
  // Query rows: the kept ones, then this append's (fp32).
  LayerScoring& scoring = out->scoring;
  scoring = p.layer.scoring;
  StartQueries(p.layer.queries, &out->queries);
  // A held flush prepared ahead (PrepareHeldFlushStep, no tokens) leaves the query rows as they
  // are.
  if (ctx.n > 0) {
    TakeQueries(ev, q, ctx.n, geometry_.q_heads, geometry_.head_dim, &scoring, &out->queries);
  }
  if (ev.enabled) {
    int64_t most = 0;
    for (const HeadStream& head : p.layer.heads) most = std::max(most, head.count() + p.n);
    DecodedRows& decoded = ThreadDecodedRows();
    decoded.Prepare(heads, static_cast<size_t>(most) * geometry_.head_dim);
    p.all_k.resize(heads), p.all_v.resize(heads);
    for (int h = 0; h < heads; ++h)
      p.all_k[h] = decoded.k[h].data(), p.all_v[h] = decoded.v[h].data();
    p.stored_k.assign(heads, {});
    p.have_all.assign(heads, false);
    p.have_records.assign(heads, false);
    p.record_values.resize(heads);
    p.have_q = out->queries.total > 0;
    p.obs = std::min<int64_t>(ev.obs_window, out->queries.total);
    p.regions = {.sinks = ev.sinks, .recent = ev.window};
    // A deferred append plans no budgets (the re-allocator's state stays as it was).
    if (!ctx.defer) KVCTL_RETURN_IF_ERROR(PlanHeadBudgets(p));
    KVCTL_RETURN_IF_ERROR(FoldH2O(p));
    if (ctx.ReallocDue(l) && p.have_q) KVCTL_RETURN_IF_ERROR(ReallocateHeads(p));
  }
  for (int h = 0; h < heads; ++h) {
    PreparedHead& ph = out->heads[h];
    ph.deferred = ctx.defer;
    ph.budget = !ev.enabled ? 0 : ctx.defer ? p.layer.heads[h].usage.budget : p.budget[h];
    std::vector<uint8_t> keep;
    if (ev.enabled && !ctx.defer && Compresses(p, h)) {
      KVCTL_RETURN_IF_ERROR(EvictHead(p, h, &keep));
    }
    // Kept tokens decoded out of records, in order (the thread's buffer: its capacity stays).
    std::vector<int64_t>& loose = ThreadDecodedRows().loose;
    loose.clear();
    PlanHeadRecords(p, h, keep, &loose);
    PlanHeadRows(p, h, keep, &loose);
  }
  // Nothing decoded from a changed slot is written: the append fails and the caller marks the
  // sequence lost.
  if (!p.loss.ok()) return p.loss;
  if (Status encoded = EncodeNewRecords(l, out); !encoded.ok()) {
    // The request's rows were checked (ValidateAppend); a row the quantizer refuses came from
    // the pool, changed behind the daemon's back after a check that trusted its chunk
    // (kRewrite): check every slot of the layer, so that the answer is that DATA_LOSS.
    std::vector<PageAllocator::PageRange> ranges;
    CollectRanges(l, l + 1, &ranges);
    Status checked = pool_->VerifyRanges(ranges, PageAllocator::VerifyReason::kCopy);
    return checked.ok() ? encoded : checked;
  }
  if (ev.enabled) {
    KeepQueryWindow(ev, scoring, &out->queries);
  }
  return OkStatus();
}

}  // namespace kvctl
