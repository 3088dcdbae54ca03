// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/kv_sequence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "common/half.h"
#include "kernels/quantize.h"
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
  HeadUsage usage;                 // Quality and eviction counters (tokens etc. computed on read).

  HeadStream(QuantSpec s, SlotArray r, SlotArray rec)
      : spec(s), rows(std::move(r)), records(std::move(rec)) {}
  int64_t count() const {
    return sink_rows + static_cast<int64_t>(records.size()) * spec.block_tokens + tail_rows;
  }
};

struct KvSequence::LayerState {
  LayerPlan plan;
  DType row_dtype = DType::kF16;
  size_t row_bytes = 0;  // One K or V row.
  std::vector<HeadStream> heads;
  SlotArray norms;  // OScaR: block_tokens fp32 norms per slot, one slot per record index.
  // Newest query rows, fp32 [q_count, q_heads, head_dim]: the observation window, plus for h2o the
  // rows not yet folded into the accumulated attention.
  std::vector<float> q_rows;
  int64_t q_count = 0;
  int64_t h2o_pending = 0;
  std::optional<HeadReallocator> realloc;
  bool has_utility = false;
  int64_t layer_budget = 0;

  LayerState(PageAllocator* pool, size_t norm_slot) : norms(pool, norm_slot) {}
};

// Per append, shared by the layers: the budget schedule of this append.
struct KvSequence::AppendContext {
  int64_t n = 0;
  int64_t first_position = 0;
  int64_t avg_budget = 0;
  std::vector<int64_t> layer_budgets;
  bool realloc_due = false;
};

// Everything an append will write into one head, computed before any stored state changes.
struct PreparedHead {
  int new_sinks = 0;
  int r0 = 0;  // Records kept as they are; new ones follow.
  int write_start = 0;
  int rows_after = 0;
  int tail_after = 0;
  std::vector<uint8_t> rows;     // Converted rows written from slot write_start.
  std::vector<uint8_t> records;  // New records back to back.
  std::vector<float> lk, lv;     // Kept tokens after the frozen prefix, fp32 [l_rows, D].
  int l_rows = 0;
  int flushed = 0;  // Leading rows of lk/lv quantized into records.
  bool evicted = false;
  std::vector<int64_t> kept;  // Indices into the old tokens + new ones, when evicted.
  bool h2o_changed = false;
  H2OState h2o;
  int64_t budget = 0;
  uint64_t evicted_tokens = 0, evicted_bytes = 0;
  double retained = -1;  // Attention mass kept, when queries were there to measure it.
};

struct PreparedLayer {
  std::vector<PreparedHead> heads;
  std::vector<float> norms;  // OScaR norms of the flushed tokens.
  struct Sample {
    int head;
    double k_rel_error, v_rel_error;
  };
  std::vector<Sample> samples;  // Quality telemetry of sampled new records.
  std::vector<float> q_rows;
  int64_t q_count = 0;
  int64_t h2o_pending = 0;
  std::optional<HeadReallocator> realloc;
  bool has_utility = false;
  int64_t layer_budget = 0;
};

namespace {

void StoreRow(const float* src, int d, DType dtype, uint8_t* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(d) * 4);
      return;
    case DType::kF16:
      for (int i = 0; i < d; ++i) {
        const uint16_t h = FloatToHalf(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case DType::kBF16:
      for (int i = 0; i < d; ++i) {
        const uint16_t b = FloatToBf16(src[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      return;
  }
}

void LoadRow(const uint8_t* src, int d, DType dtype, float* dst) {
  KvTensorView::Contiguous(src, dtype, 1, 1, d).LoadRow(0, 0, dst);
}

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
      const double xk = in.k[t * in.row_stride + c], xv = in.v[t * in.row_stride + c];
      ek += (k[t * d + c] - xk) * (k[t * d + c] - xk), rk += xk * xk;
      ev += (v[t * d + c] - xv) * (v[t * d + c] - xv), rv += xv * xv;
    }
  }
  out->k_rel_error = rk > 0 ? ek / rk : 0;
  out->v_rel_error = rv > 0 ? ev / rv : 0;
}

Status WithLayerHead(int l, int h, const Status& s) {
  return Status(s.code(), internal::StrCat("layer ", l, ", head ", h, ": ", s.message()));
}

}  // namespace

KvSequence::KvSequence(PageAllocator* pool, const SequenceGeometry& geometry,
                       std::vector<LayerPlan> plans, EvictionSettings eviction)
    : pool_(pool), geometry_(geometry), eviction_(std::move(eviction)) {
  KVCTL_CHECK(static_cast<int>(plans.size()) == geometry.layers);
  // Every record array packs the same number of records per page, whatever its bit widths.
  size_t max_record = 1;
  // Lossless layers never write records: their record arrays stay empty with a token slot size.
  auto record_bytes = [](const LayerPlan& plan, const QuantSpec& spec) {
    return plan.lossless ? size_t{8} : BlockLayoutOf(spec).record_bytes;
  };
  for (const LayerPlan& plan : plans) {
    for (const QuantSpec& spec : plan.head_specs) {
      max_record = std::max(max_record, record_bytes(plan, spec));
    }
  }
  const size_t records_per_page = pool->page_bytes() / max_record;
  for (LayerPlan& plan : plans) {
    KVCTL_CHECK(static_cast<int>(plan.head_specs.size()) == geometry.kv_heads);
    const QuantSpec& first = plan.head_specs[0];
    const bool norms = TraitsOf(first.method).needs_token_norms && !plan.lossless;
    KVCTL_CHECK(!(norms && eviction_.enabled));  // ValidateBudgetConfig refuses OScaR + eviction.
    const size_t norm_slot = norms ? static_cast<size_t>(first.block_tokens) * 4 : 4;
    auto layer = std::make_unique<LayerState>(pool, norm_slot);
    layer->row_dtype = plan.lossless ? geometry.dtype : DType::kF16;
    layer->row_bytes = static_cast<size_t>(geometry.head_dim) * DTypeSize(layer->row_dtype);
    for (const QuantSpec& spec : plan.head_specs) {
      layer->heads.emplace_back(spec, SlotArray(pool, 2 * layer->row_bytes),
                                SlotArray(pool, record_bytes(plan, spec), records_per_page));
    }
    layer->plan = std::move(plan);
    layers_.push_back(std::move(layer));
  }
}

KvSequence::~KvSequence() = default;

void KvSequence::Materialize(const LayerState& layer, int h, int64_t from, const KvTensorView& k,
                             const KvTensorView& v, std::vector<float>* out_k,
                             std::vector<float>* out_v) const {
  const HeadStream& head = layer.heads[h];
  const int d = geometry_.head_dim;
  const int64_t old = head.count(), total = old + k.tokens;
  out_k->resize(static_cast<size_t>(total - from) * d);
  out_v->resize(out_k->size());
  float* kd = out_k->data();
  float* vd = out_v->data();
  const int g = head.spec.block_tokens;
  const int64_t rec_begin = head.sink_rows;
  const int64_t rec_end = rec_begin + static_cast<int64_t>(head.records.size()) * g;
  std::vector<float> bk, bv;
  int64_t j = from;
  for (; j < total; ++j, kd += d, vd += d) {
    if (j < rec_begin || (j >= rec_end && j < old)) {
      const uint8_t* slot = head.rows.Slot(j < rec_begin ? j : head.sink_rows + (j - rec_end));
      LoadRow(slot, d, layer.row_dtype, kd);
      LoadRow(slot + layer.row_bytes, d, layer.row_dtype, vd);
    } else if (j < rec_end) {
      const int64_t r = (j - rec_begin) / g, t = (j - rec_begin) % g;
      if (t == 0 || bk.empty()) {
        bk.resize(static_cast<size_t>(g) * d);
        bv.resize(bk.size());
        const float* norms =
            layer.norms.size() > 0 ? reinterpret_cast<const float*>(layer.norms.Slot(r)) : nullptr;
        DequantizeBlock(head.spec, head.records.Slot(r), norms, bk.data(), bv.data());
      }
      std::memcpy(kd, &bk[t * d], sizeof(float) * d);
      std::memcpy(vd, &bv[t * d], sizeof(float) * d);
    } else {
      k.LoadRow(j - old, h, kd);
      v.LoadRow(j - old, h, vd);
    }
    if (!layer.plan.lossless) {
      // Rows wait as fp16 before they are quantized (and decoded tokens re-enter as fp16).
      for (int i = 0; i < d; ++i) kd[i] = RoundToHalf(kd[i]), vd[i] = RoundToHalf(vd[i]);
    }
  }
}

Status KvSequence::AppendLayerPrepare(int l, const AppendContext& ctx, const KvTensorView& k,
                                      const KvTensorView& v, const KvTensorView* q,
                                      PreparedLayer* out) const {
  const LayerState& layer = *layers_[l];
  const int n = static_cast<int>(ctx.n);
  const int heads = geometry_.kv_heads, d = geometry_.head_dim;
  const bool lossless = layer.plan.lossless;
  const StreamingRules& rules = layer.plan.rules;
  const EvictionSettings& ev = eviction_;
  out->heads.assign(heads, {});

  // Query rows: the kept ones, then this append's (fp32).
  const int qh = geometry_.q_heads;
  const size_t q_row = static_cast<size_t>(qh) * d;
  out->q_rows = layer.q_rows;
  out->q_count = layer.q_count;
  out->h2o_pending = layer.h2o_pending;
  if (q == nullptr) {
    // Rows kept from earlier appends no longer end at the newest token: drop them.
    out->q_rows.clear();
    out->q_count = out->h2o_pending = 0;
  } else if (ev.enabled) {
    out->q_rows.resize((out->q_count + n) * q_row);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < qh; ++h)
        q->LoadRow(t, h, &out->q_rows[(out->q_count + t) * q_row + h * d]);
    }
    out->q_count += n;
    if (ev.policy == EvictPolicy::kH2O) out->h2o_pending += n;
  }
  // The last `rows` query rows as the [rows, g, D] group of KV head h.
  auto group = [&](int64_t rows, int h) -> StatusOr<KvTensorView> {
    const KvTensorView all = KvTensorView::Contiguous(
        out->q_rows.data() + (out->q_count - rows) * q_row, DType::kF32, rows, qh, d);
    return QueryGroup(all, heads, h);
  };
  const bool have_q = ev.enabled && out->q_count > 0;
  const int64_t obs = std::min<int64_t>(ev.obs_window, out->q_count);

  // Each head's tokens in fp32, decoded only when scoring needs them.
  std::vector<std::vector<float>> all_k(heads), all_v(heads);
  std::vector<bool> have_all(heads, false);
  auto full = [&](int h) {
    if (!have_all[h]) Materialize(layer, h, 0, k, v, &all_k[h], &all_v[h]);
    have_all[h] = true;
    return KeyRows{all_k[h].data(), layer.heads[h].count() + n, d};
  };

  // Budgets of this append: the layer's share, split over heads by the (re)allocator.
  std::vector<int64_t> budget(heads, 0);
  if (ev.enabled) {
    out->layer_budget = ctx.layer_budgets[l];
    out->realloc = layer.realloc;
    out->has_utility = layer.has_utility;
    if (!out->realloc || out->realloc->params().layer_budget != out->layer_budget) {
      KVCTL_ASSIGN_OR_RETURN(
          HeadReallocator r,
          HeadReallocator::Create({.heads = heads,
                                   .layer_budget = out->layer_budget,
                                   .floor = ev.floor,
                                   .ema = ev.realloc_ema,
                                   .period = std::max<int64_t>(1, ev.realloc_period)}));
      if (out->has_utility) KVCTL_RETURN_IF_ERROR(r.Update(out->realloc->smoothed_utility()));
      out->realloc = std::move(r);
    }
    for (int h = 0; h < heads; ++h) budget[h] = out->realloc->budgets()[h];
  }
  auto over = [&](int h) { return layer.heads[h].count() + n > budget[h]; };
  bool any_over = false;
  for (int h = 0; ev.enabled && h < heads; ++h) any_over |= over(h);

  // H2O: fold the pending queries into every head's accumulated attention (at least once per
  // compression period, and always before scoring).
  const bool h2o = ev.enabled && ev.policy == EvictPolicy::kH2O;
  if (h2o && out->h2o_pending > 0 &&
      (any_over || ctx.realloc_due || out->h2o_pending >= ev.compression_period)) {
    for (int h = 0; h < heads; ++h) {
      PreparedHead& ph = out->heads[h];
      ph.h2o = layer.heads[h].h2o;
      KVCTL_ASSIGN_OR_RETURN(KvTensorView gq, group(out->h2o_pending, h));
      Status s = UpdateH2O(&ph.h2o, full(h), gq);
      if (!s.ok()) return WithLayerHead(l, h, s);
      ph.h2o_changed = true;
    }
    out->h2o_pending = 0;
  }
  auto h2o_of = [&](int h) -> const H2OState* {
    return out->heads[h].h2o_changed ? &out->heads[h].h2o : &layer.heads[h].h2o;
  };
  const ProtectedRegions regions{.sinks = ev.sinks, .recent = ev.window};

  // Online head re-allocation: utility = attention mass a head would win back with avg/4 more
  // tokens, from the retained-mass curve of its own scorer.
  if (ev.enabled && ctx.realloc_due && have_q) {
    std::vector<double> utility(heads, 0.0);
    for (int h = 0; h < heads; ++h) {
      const KeyRows keys = full(h);
      KVCTL_ASSIGN_OR_RETURN(KvTensorView gq, group(obs, h));
      StatusOr<std::vector<double>> mass = TokenAttentionMass(keys, gq);
      StatusOr<std::vector<float>> scores = ScoreHead(ev, keys, &gq, h2o_of(h), regions);
      if (!mass.ok()) return WithLayerHead(l, h, mass.status());
      if (!scores.ok()) return WithLayerHead(l, h, scores.status());
      const std::vector<uint8_t> mask = ProtectedMask(keys.tokens, regions);
      KVCTL_ASSIGN_OR_RETURN(RetainedMassCurve curve,
                             ComputeRetainedMassCurve(*mass, *scores, mask));
      utility[h] = HeadUtility(curve, budget[h], std::max<int64_t>(1, ctx.avg_budget / 4));
    }
    KVCTL_RETURN_IF_ERROR(out->realloc->Update(utility));
    out->has_utility = true;
    for (int h = 0; h < heads; ++h) budget[h] = out->realloc->budgets()[h];
  }

  const int sinks_target = lossless ? 0 : rules.sink_tokens;
  for (int h = 0; h < heads; ++h) {
    const HeadStream& head = layer.heads[h];
    PreparedHead& ph = out->heads[h];
    ph.budget = budget[h];
    const int g = head.spec.block_tokens;
    const int64_t old = head.count(), total = old + n;
    const int records = static_cast<int>(head.records.size());
    std::vector<uint8_t> keep;
    if (ev.enabled && over(h)) {
      const KeyRows keys = full(h);
      const std::vector<uint8_t> mask = ProtectedMask(total, regions);
      const int64_t protect = std::count(mask.begin(), mask.end(), uint8_t{1});
      const int64_t target = std::max(protect, budget[h] - (ev.compression_period - 1));
      std::optional<KvTensorView> gq;
      if (have_q) {
        KVCTL_ASSIGN_OR_RETURN(gq, group(obs, h));
      }
      StatusOr<std::vector<float>> scores =
          ScoreHead(ev, keys, gq ? &*gq : nullptr, h2o_of(h), regions);
      if (!scores.ok()) return WithLayerHead(l, h, scores.status());
      StatusOr<std::vector<int64_t>> kept = SelectKeep(*scores, target, mask);
      if (!kept.ok()) return WithLayerHead(l, h, kept.status());
      ph.kept = std::move(*kept);
      ph.evicted = true;
      if (gq) {
        StatusOr<std::vector<double>> mass = TokenAttentionMass(keys, *gq);
        if (!mass.ok()) return WithLayerHead(l, h, mass.status());
        ph.retained = *RetainedMass(*mass, ph.kept);
      }
      if (h2o) {
        if (!ph.h2o_changed) ph.h2o = head.h2o;
        ph.h2o.acc.resize(static_cast<size_t>(total), 0.0);
        KVCTL_RETURN_IF_ERROR(CompactH2O(&ph.h2o, ph.kept));
        ph.h2o_changed = true;
      }
      keep.assign(static_cast<size_t>(total), 0);
      for (int64_t j : ph.kept) keep[j] = 1;
      const int64_t rec_end = head.sink_rows + static_cast<int64_t>(records) * g;
      const uint64_t record_share = BlockLayoutOf(head.spec).record_bytes / g;
      for (int64_t j = 0; j < total; ++j) {
        if (keep[j]) continue;
        ++ph.evicted_tokens;
        const bool in_record = j >= head.sink_rows && j < rec_end && !lossless;
        ph.evicted_bytes += in_record ? record_share : 2 * layer.row_bytes;
      }
    }

    // Physical layout: sinks, records [0, r0) untouched, then every kept later token goes
    // through the flush rule again.
    ph.new_sinks = std::clamp(sinks_target - head.sink_rows, 0, n);
    const int sinks_after = head.sink_rows + ph.new_sinks;
    ph.r0 = records;
    if (ph.evicted) {
      for (int r = 0; r < records && ph.r0 == records; ++r) {
        for (int t = 0; t < g; ++t) {
          if (!keep[head.sink_rows + static_cast<int64_t>(r) * g + t]) {
            ph.r0 = r;
            break;
          }
        }
      }
    }
    const int64_t from = sinks_after + static_cast<int64_t>(ph.r0) * g;
    std::vector<float> src_k, src_v;
    const float* sk;
    const float* sv;
    if (have_all[h]) {
      sk = all_k[h].data() + from * d, sv = all_v[h].data() + from * d;
    } else {
      Materialize(layer, h, from, k, v, &src_k, &src_v);
      sk = src_k.data(), sv = src_v.data();
    }
    for (int64_t j = from; j < total; ++j) {
      if (ph.evicted && !keep[j]) continue;
      ph.lk.insert(ph.lk.end(), sk + (j - from) * d, sk + (j - from + 1) * d);
      ph.lv.insert(ph.lv.end(), sv + (j - from) * d, sv + (j - from + 1) * d);
      ++ph.l_rows;
    }
    ph.flushed = lossless ? 0 : ph.l_rows / rules.flush_tokens * rules.flush_tokens;
    ph.tail_after = ph.l_rows - ph.flushed;
    ph.rows_after = sinks_after + ph.tail_after;
    // Rows to write: the new sinks, then either the new tail tokens (nothing moved) or the whole
    // new tail.
    const bool untouched = !ph.evicted && ph.flushed == 0;
    ph.write_start = head.sink_rows + (untouched ? head.tail_rows : 0);
    const int first_tail = untouched ? head.tail_rows : ph.flushed;
    std::vector<float> row(static_cast<size_t>(d));
    auto put = [&](const float* kr, const float* vr) {
      const size_t at = ph.rows.size();
      ph.rows.resize(at + 2 * layer.row_bytes);
      StoreRow(kr, d, layer.row_dtype, ph.rows.data() + at);
      StoreRow(vr, d, layer.row_dtype, ph.rows.data() + at + layer.row_bytes);
    };
    for (int t = 0; t < ph.new_sinks; ++t) {
      std::vector<float> vrow(static_cast<size_t>(d));
      k.LoadRow(t, h, row.data());
      v.LoadRow(t, h, vrow.data());
      put(row.data(), vrow.data());
    }
    for (int t = first_tail; t < ph.l_rows; ++t) put(&ph.lk[t * d], &ph.lv[t * d]);
  }

  // Quantize the flushed rows. OScaR's norm spans the heads, which stay in lockstep (no eviction).
  const QuantSpec& spec0 = layer.heads[0].spec;
  const bool needs_norms = !lossless && TraitsOf(spec0.method).needs_token_norms;
  if (needs_norms && out->heads[0].flushed > 0) {
    const int flushed = out->heads[0].flushed;
    std::vector<float> inter(static_cast<size_t>(flushed) * heads * d);
    for (int h = 0; h < heads; ++h) {
      KVCTL_CHECK(out->heads[h].flushed == flushed);
      for (int t = 0; t < flushed; ++t) {
        std::memcpy(&inter[(static_cast<size_t>(t) * heads + h) * d], &out->heads[h].lk[t * d],
                    sizeof(float) * d);
      }
    }
    out->norms.resize(static_cast<size_t>(flushed));
    ComputeTokenNorms(KvTensorView::Contiguous(inter.data(), DType::kF32, flushed, heads, d),
                      out->norms.data());
  }
  for (int h = 0; h < heads; ++h) {
    PreparedHead& ph = out->heads[h];
    if (ph.flushed == 0) continue;
    const QuantSpec& spec = layer.heads[h].spec;
    const int g = spec.block_tokens;
    const size_t rb = BlockLayoutOf(spec).record_bytes;
    ph.records.resize(rb * (ph.flushed / g));
    for (int b = 0; b < ph.flushed / g; ++b) {
      const BlockInput in{&ph.lk[static_cast<size_t>(b) * g * d],
                          &ph.lv[static_cast<size_t>(b) * g * d], d,
                          needs_norms ? &out->norms[static_cast<size_t>(b) * g] : nullptr};
      uint8_t* rec = ph.records.data() + b * rb;
      Status s = QuantizeBlock(spec, in, rec);
      if (!s.ok()) return WithLayerHead(l, h, s);
      const size_t index = static_cast<size_t>(ph.r0) + static_cast<size_t>(b);
      if (geometry_.quality_sample_period > 0 &&
          index % static_cast<size_t>(geometry_.quality_sample_period) == 0) {
        out->samples.push_back({h, 0, 0});
        SampleQuality(spec, in, rec, &out->samples.back());
      }
    }
  }

  // Keep the observation window (and h2o's unfolded rows) of queries.
  if (ev.enabled) {
    const int64_t keep_rows = std::min(out->q_count, std::max(ev.obs_window, out->h2o_pending));
    out->q_rows.erase(out->q_rows.begin(),
                      out->q_rows.begin() + (out->q_count - keep_rows) * q_row);
    out->q_count = keep_rows;
  }
  return OkStatus();
}

Status KvSequence::Append(int64_t first_position, const std::vector<KvTensorView>& k,
                          const std::vector<KvTensorView>& v, const std::vector<KvTensorView>* q) {
  const int layers = geometry_.layers;
  if (static_cast<int>(k.size()) != layers || static_cast<int>(v.size()) != layers) {
    return InvalidArgument("append: got ", k.size(), " K and ", v.size(), " V layers, expected ",
                           layers);
  }
  if (tokens_ > 0 && first_position != first_position_ + tokens_) {
    return InvalidArgument("first_position: got ", first_position, ", expected ",
                           first_position_ + tokens_, " (the sequence's next position)");
  }
  if (first_position < 0) {
    return InvalidArgument("first_position: got ", first_position, ", expected >= 0");
  }
  const int64_t n = k[0].tokens;
  for (int l = 0; l < layers; ++l) {
    for (const KvTensorView* view : {&k[l], &v[l]}) {
      const char* name = view == &k[l] ? "k" : "v";
      KVCTL_RETURN_IF_ERROR(view->Validate(name));
      if (view->tokens != n || view->heads != geometry_.kv_heads ||
          view->head_dim != geometry_.head_dim) {
        return InvalidArgument(name, " layer ", l, ": shape [", view->tokens, ", ", view->heads,
                               ", ", view->head_dim, "], expected [", n, ", ", geometry_.kv_heads,
                               ", ", geometry_.head_dim, "]");
      }
      Status finite = view->CheckFinite(name);
      if (!finite.ok()) {
        return InvalidArgument("layer ", l, ": ", finite.message());
      }
    }
  }
  if (n > (int64_t{1} << 30)) return InvalidArgument("tokens: got ", n, ", expected <= 2^30");
  if (q == nullptr && eviction_.NeedsQ()) {
    return InvalidArgument(
        "q: missing, expected Q ([layers, n_tokens, q_heads, head_dim], has_q = "
        "1) with every APPEND: evict.policy = \"",
        EvictPolicyName(eviction_.policy), "\" scores tokens from the engine's queries");
  }
  if (q != nullptr) {
    if (static_cast<int>(q->size()) != layers || geometry_.q_heads == 0) {
      return InvalidArgument("q: got ", q->size(), " layers with q_heads ", geometry_.q_heads,
                             ", expected ", layers, " layers and q_heads > 0");
    }
    for (int l = 0; l < layers; ++l) {
      const KvTensorView& view = (*q)[l];
      KVCTL_RETURN_IF_ERROR(view.Validate("q"));
      if (view.tokens != n || view.heads != geometry_.q_heads ||
          view.head_dim != geometry_.head_dim) {
        return InvalidArgument("q layer ", l, ": shape [", view.tokens, ", ", view.heads, ", ",
                               view.head_dim, "], expected [", n, ", ", geometry_.q_heads, ", ",
                               geometry_.head_dim, "]");
      }
      Status finite = view.CheckFinite("q");
      if (!finite.ok()) return InvalidArgument("layer ", l, ": ", finite.message());
    }
  }

  AppendContext ctx;
  ctx.n = n;
  ctx.first_position = first_position;
  if (eviction_.enabled) {
    ctx.avg_budget = AverageBudget(eviction_, tokens_ + n);
    KVCTL_ASSIGN_OR_RETURN(ctx.layer_budgets, LayerBudgets(eviction_, layers, geometry_.kv_heads,
                                                           ctx.avg_budget, tokens_ + n));
    ctx.realloc_due = eviction_.realloc_period > 0 && q != nullptr &&
                      since_realloc_ + n >= eviction_.realloc_period;
  }

  std::vector<PreparedLayer> prepared(static_cast<size_t>(layers));
  size_t pages = 0;
  for (int l = 0; l < layers; ++l) {
    if (!layers_[l]->plan.lossless) {
      // Rows are stored as fp16 before they are quantized: refuse what fp16 cannot hold.
      for (const KvTensorView* view : {&k[l], &v[l]}) {
        std::vector<float> row(static_cast<size_t>(geometry_.head_dim));
        for (int64_t t = 0; t < n; ++t) {
          for (int h = 0; h < geometry_.kv_heads; ++h) {
            view->LoadRow(t, h, row.data());
            for (int c = 0; c < geometry_.head_dim; ++c) {
              if (std::fabs(row[c]) > kHalfMax) {
                return InvalidArgument(view == &k[l] ? "k" : "v", ": element (layer ", l,
                                       ", token ", t, ", head ", h, ", channel ", c, ") is ",
                                       row[c],
                                       ", beyond the fp16 range (65504) of the residual "
                                       "window; use quant.method = \"none\" for such data");
              }
            }
          }
        }
      }
    }
    KVCTL_RETURN_IF_ERROR(
        AppendLayerPrepare(l, ctx, k[l], v[l], q ? &(*q)[l] : nullptr, &prepared[l]));
    const LayerState& layer = *layers_[l];
    const PreparedLayer& p = prepared[l];
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      const HeadStream& head = layer.heads[h];
      const PreparedHead& ph = p.heads[h];
      pages += head.rows.PagesNeeded(ph.rows_after);
      pages += head.records.PagesNeeded(ph.r0 + ph.records.size() / head.records.slot_bytes());
    }
    if (!p.norms.empty()) {
      const size_t per_slot = layer.norms.slot_bytes() / 4;
      pages += layer.norms.PagesNeeded(layer.norms.size() + p.norms.size() / per_slot);
    }
  }

  std::vector<uint32_t> reserved;
  if (pages > 0) {
    StatusOr<std::vector<uint32_t>> got = pool_->AllocateMany(static_cast<uint32_t>(pages));
    if (!got.ok()) {
      return ResourceExhausted("append of ", n, " tokens needs ", pages, " pool pages of ",
                               pool_->page_bytes(), " bytes: ", got.status().message());
    }
    reserved = std::move(got).value();
  }

  // Commit: nothing below can fail.
  for (int l = 0; l < layers; ++l) {
    LayerState& layer = *layers_[l];
    PreparedLayer& p = prepared[l];
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      HeadStream& head = layer.heads[h];
      PreparedHead& ph = p.heads[h];
      const size_t rb = head.records.slot_bytes();
      const size_t new_records = ph.records.size() / rb;
      head.records.Resize(ph.r0 + new_records, &reserved);
      for (size_t i = 0; i < new_records; ++i) {
        std::memcpy(head.records.Slot(ph.r0 + i), ph.records.data() + i * rb, rb);
      }
      head.rows.Resize(ph.rows_after, &reserved);
      const size_t slot = head.rows.slot_bytes();
      for (size_t i = 0; i < ph.rows.size() / slot; ++i) {
        std::memcpy(head.rows.Slot(ph.write_start + i), ph.rows.data() + i * slot, slot);
      }
      head.sink_rows += ph.new_sinks;
      head.tail_rows = ph.tail_after;
      for (int64_t t = 0; t < n; ++t) head.positions.push_back(first_position + t);
      if (ph.evicted) {
        std::vector<int64_t> kept_positions;
        kept_positions.reserve(ph.kept.size());
        for (int64_t j : ph.kept) kept_positions.push_back(head.positions[j]);
        head.positions = std::move(kept_positions);
        head.usage.evicted_tokens += ph.evicted_tokens;
        head.usage.evicted_bytes += ph.evicted_bytes;
        ++head.usage.compressions;
        if (ph.retained >= 0) {
          ++head.usage.retained_samples;
          head.usage.retained_mass_sum += ph.retained;
        }
      }
      if (ph.h2o_changed) head.h2o = std::move(ph.h2o);
      head.usage.budget = ph.budget;
      KVCTL_CHECK(head.count() == static_cast<int64_t>(head.positions.size()));
      KVCTL_CHECK(!eviction_.enabled || head.count() <= ph.budget);
    }
    if (!p.norms.empty()) {
      const size_t per_slot = layer.norms.slot_bytes() / 4;
      const size_t before = layer.norms.size();
      layer.norms.Resize(before + p.norms.size() / per_slot, &reserved);
      for (size_t i = 0; i < p.norms.size() / per_slot; ++i) {
        std::memcpy(layer.norms.Slot(before + i), &p.norms[i * per_slot], per_slot * 4);
      }
    }
    for (const PreparedLayer::Sample& sample : p.samples) {
      HeadUsage& u = layer.heads[sample.head].usage;
      ++u.quality_samples;
      u.k_rel_error_sum += sample.k_rel_error;
      u.v_rel_error_sum += sample.v_rel_error;
    }
    layer.q_rows = std::move(p.q_rows);
    layer.q_count = p.q_count;
    layer.h2o_pending = p.h2o_pending;
    layer.realloc = std::move(p.realloc);
    layer.has_utility = p.has_utility;
    layer.layer_budget = p.layer_budget;
  }
  KVCTL_CHECK(reserved.empty());
  if (tokens_ == 0) first_position_ = first_position;
  tokens_ += n;
  since_realloc_ = ctx.realloc_due ? 0 : since_realloc_ + n;
  return OkStatus();
}

DenseKv KvSequence::FetchDense(int layer_begin, int layer_end) const {
  return Gather(layer_begin, layer_end, /*with_records=*/true);
}

DenseKv KvSequence::FetchWindow(int layer_begin, int layer_end) const {
  return Gather(layer_begin, layer_end, /*with_records=*/false);
}

DenseKv KvSequence::Gather(int layer_begin, int layer_end, bool with_records) const {
  DenseKv out;
  const int d = geometry_.head_dim;
  for (int l = layer_begin; l < layer_end; ++l) {
    const LayerState& layer = *layers_[l];
    for (const HeadStream& head : layer.heads) {
      const int g = head.spec.block_tokens;
      const size_t records = with_records ? head.records.size() : 0;
      const size_t count = head.sink_rows + records * g + head.tail_rows;
      out.counts.push_back(static_cast<uint32_t>(count));
      const size_t at = out.k.size();
      out.k.resize(at + count * d);
      out.v.resize(at + count * d);
      float* kd = out.k.data() + at;
      float* vd = out.v.data() + at;
      auto copy_rows = [&](int first, int rows) {
        for (int i = 0; i < rows; ++i, kd += d, vd += d) {
          const uint8_t* slot = head.rows.Slot(first + i);
          LoadRow(slot, d, layer.row_dtype, kd);
          LoadRow(slot + layer.row_bytes, d, layer.row_dtype, vd);
        }
      };
      copy_rows(0, head.sink_rows);
      for (size_t r = 0; r < records; ++r, kd += g * d, vd += g * d) {
        const float* norms =
            layer.norms.size() > 0 ? reinterpret_cast<const float*>(layer.norms.Slot(r)) : nullptr;
        DequantizeBlock(head.spec, head.records.Slot(r), norms, kd, vd);
      }
      copy_rows(head.sink_rows, head.tail_rows);
      // Without records the tail rows skip the quantized span of the position list.
      const size_t quantized = head.records.size() * g;
      for (size_t i = 0; i < count; ++i) {
        const bool in_tail = !with_records && i >= static_cast<size_t>(head.sink_rows);
        out.positions.push_back(head.positions[i + (in_tail ? quantized : 0)]);
      }
    }
  }
  return out;
}

HeadBlocks KvSequence::Blocks(int layer, int head) const {
  const LayerState& l = *layers_[layer];
  const HeadStream& h = l.heads[head];
  HeadBlocks b;
  b.record_pages = h.records.pages();
  b.records = static_cast<uint32_t>(h.records.size());
  b.records_per_page = static_cast<uint32_t>(h.records.slots_per_page());
  b.sink_rows = static_cast<uint32_t>(h.sink_rows);
  b.tail_rows = static_cast<uint32_t>(h.tail_rows);
  b.first_quantized_position =
      h.records.size() > 0 ? h.positions[h.sink_rows] : first_position_ + h.sink_rows;
  return b;
}

const QuantSpec& KvSequence::HeadSpec(int layer, int head) const {
  return layers_[layer]->heads[head].spec;
}

bool KvSequence::Lossless(int layer) const { return layers_[layer]->plan.lossless; }

int64_t KvSequence::LayerBudget(int layer) const { return layers_[layer]->layer_budget; }

const SlotArray* KvSequence::Norms(int layer) const {
  const LayerState& l = *layers_[layer];
  return l.norms.size() > 0 ? &l.norms : nullptr;
}

HeadUsage KvSequence::HeadUsageOf(int layer, int head) const {
  const LayerState& l = *layers_[layer];
  const HeadStream& h = l.heads[head];
  HeadUsage u = h.usage;
  u.tokens = h.count();
  u.elements = 2 * static_cast<uint64_t>(u.tokens) * geometry_.head_dim;
  u.payload_bytes = h.rows.size() * h.rows.slot_bytes() +
                    h.records.size() * h.records.slot_bytes() +
                    l.norms.size() * l.norms.slot_bytes() / l.heads.size();
  u.k_bits = l.plan.lossless ? static_cast<int>(8 * DTypeSize(l.row_dtype)) : h.spec.k_bits;
  u.v_bits = l.plan.lossless ? static_cast<int>(8 * DTypeSize(l.row_dtype)) : h.spec.v_bits;
  return u;
}

HeadUsage KvSequence::QualityTotals() const {
  HeadUsage total;
  for (const auto& layer : layers_) {
    for (const HeadStream& h : layer->heads) {
      total.quality_samples += h.usage.quality_samples;
      total.k_rel_error_sum += h.usage.k_rel_error_sum;
      total.v_rel_error_sum += h.usage.v_rel_error_sum;
    }
  }
  return total;
}

SequenceUsage KvSequence::Usage() const {
  SequenceUsage u;
  u.tokens = tokens_;
  for (const auto& layer : layers_) {
    u.pool_bytes += layer->norms.bytes_held();
    u.payload_bytes += layer->norms.size() * layer->norms.slot_bytes();
    for (const HeadStream& head : layer->heads) {
      u.pool_bytes += head.rows.bytes_held() + head.records.bytes_held();
      u.payload_bytes += head.rows.size() * head.rows.slot_bytes() +
                         head.records.size() * head.records.slot_bytes();
      u.kept_tokens += head.count();
      u.evicted_tokens += head.usage.evicted_tokens;
      u.evicted_bytes += head.usage.evicted_bytes;
    }
  }
  if (!layers_.empty() && !layers_[0]->heads.empty()) {
    const HeadStream& h0 = layers_[0]->heads[0];
    u.quantized_tokens = static_cast<int64_t>(h0.records.size()) * h0.spec.block_tokens;
  }
  u.elements = 2 * static_cast<uint64_t>(u.kept_tokens) * geometry_.head_dim;
  return u;
}

}  // namespace kvctl
