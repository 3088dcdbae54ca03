// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The preparing half of KvSequence::Append: decoding a head's tokens, H2O updates, head
// re-allocation, scoring and eviction, record compaction and quantization, all into temporary
// memory (PreparedLayer); kv_sequence.cc reserves the pages and commits.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "controller/sequence/kv_sequence.h"
#include "controller/sequence/kv_sequence_internal.h"
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

void TakeQueries(const EvictionSettings& ev, const KvTensorView* q, int64_t n, int q_heads,
                 int head_dim, LayerScoring* scoring) {
  const size_t q_row = static_cast<size_t>(q_heads) * head_dim;
  if (q == nullptr) {
    // Rows kept from earlier appends no longer end at the newest token: drop them.
    scoring->q_rows.clear();
    scoring->q_count = scoring->h2o_pending = 0;
    return;
  }
  if (!ev.enabled) return;
  // Only h2o reads every query; the others need the newest obs_window rows (a long prefill
  // would otherwise convert and hold all of its queries).
  const bool all_rows = ev.policy == EvictPolicy::kH2O;
  const int64_t want = all_rows ? n : std::min<int64_t>(n, ev.obs_window);
  if (want < n) {
    scoring->q_rows.clear();  // The rows kept must stay the newest, consecutive ones.
    scoring->q_count = 0;
  }
  scoring->q_rows.resize((scoring->q_count + want) * q_row);
  for (int64_t t = n - want; t < n; ++t) {
    float* dst = &scoring->q_rows[(scoring->q_count + t - (n - want)) * q_row];
    for (int h = 0; h < q_heads; ++h) q->LoadRow(t, h, dst + h * head_dim);
  }
  scoring->q_count += want;
  if (all_rows) scoring->h2o_pending += n;
}

void KeepQueryWindow(const EvictionSettings& ev, size_t q_row, LayerScoring* scoring) {
  const int64_t keep_rows =
      std::min(scoring->q_count, std::max(ev.obs_window, scoring->h2o_pending));
  scoring->q_rows.erase(scoring->q_rows.begin(),
                        scoring->q_rows.begin() + (scoring->q_count - keep_rows) * q_row);
  scoring->q_count = keep_rows;
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
    std::vector<float> inter(static_cast<size_t>(rows0) * heads * d);
    for (int h = 0; h < heads; ++h) {
      KVCTL_CHECK(out->heads[h].qk.size() == static_cast<size_t>(rows0) * d);
      for (int t = 0; t < rows0; ++t) {
        std::memcpy(&inter[(static_cast<size_t>(t) * heads + h) * d], &out->heads[h].qk[t * d],
                    sizeof(float) * d);
      }
    }
    out->norms.resize(static_cast<size_t>(rows0));
    ComputeTokenNorms(KvTensorView::Contiguous(inter.data(), DType::kF32, rows0, heads, d),
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
    const BlockBatch batch{ph.qk.data(),
                           ph.qv.data(),
                           d,
                           static_cast<int64_t>(g) * d,
                           needs_norms ? out->norms.data() : nullptr,
                           blocks};
    Status encoded = pool_->EncodeBlocks(spec, batch, ph.records.data());
    if (!encoded.ok()) return WithLayerHead(l, h, encoded);
    if (geometry_.quality_sample_period == 0) continue;
    // Position of the next new record in the head's record list (never among those in place).
    size_t index = ph.records_in_place;
    for (int b = 0; b < blocks; ++b, ++index) {
      while (ph.record_plan[index - ph.records_in_place] >= 0) ++index;
      if (index % static_cast<size_t>(geometry_.quality_sample_period) != 0) continue;
      const BlockInput in{batch.k + b * batch.block_stride, batch.v + b * batch.block_stride, d,
                          needs_norms ? &out->norms[static_cast<size_t>(b) * g] : nullptr};
      out->samples.push_back({h, 0, 0});
      SampleQuality(spec, in, ph.records.data() + b * rb, &out->samples.back());
    }
  }

  return OkStatus();
}

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
  out->heads.resize(static_cast<size_t>(heads));  // Reused between appends (prepared_).
  for (PreparedHead& ph : out->heads) ph.Reset();
  out->norms.clear();
  out->samples.clear();

  // Query rows: the kept ones, then this append's (fp32).
  const int qh = geometry_.q_heads;
  const size_t q_row = static_cast<size_t>(qh) * d;
  LayerScoring& scoring = out->scoring;
  scoring = layer.scoring;
  TakeQueries(ev, q, n, qh, d, &scoring);
  // The last `rows` query rows as the [rows, g, D] group of KV head h.
  auto group = [&](int64_t rows, int h) -> StatusOr<KvTensorView> {
    const KvTensorView all = KvTensorView::Contiguous(
        scoring.q_rows.data() + (scoring.q_count - rows) * q_row, DType::kF32, rows, qh, d);
    return QueryGroup(all, heads, h);
  };
  const bool have_q = ev.enabled && scoring.q_count > 0;
  const int64_t obs = std::min<int64_t>(ev.obs_window, scoring.q_count);

  // Each head's tokens in fp32, decoded only when scoring needs them (never without eviction:
  // a decode step then allocates none of this).
  std::vector<std::vector<float>> all_k, all_v;
  std::vector<bool> have_all;
  if (ev.enabled) {
    all_k.resize(heads), all_v.resize(heads);
    have_all.assign(heads, false);
  }
  auto full = [&](int h) {
    if (!have_all[h]) Materialize(layer, h, 0, k, v, &all_k[h], &all_v[h]);
    have_all[h] = true;
    return KeyRows{all_k[h].data(), layer.heads[h].count() + n, d};
  };

  // Budgets of this append: the layer's share, split over heads by the (re)allocator.
  std::vector<int64_t> budget(ev.enabled ? heads : 0, 0);
  if (ev.enabled && !ev.head_caps.empty()) {
    scoring.layer_budget = ctx.layer_budgets[l];
    for (int h = 0; h < heads; ++h) budget[h] = ev.head_caps[static_cast<size_t>(l) * heads + h];
  } else if (ev.enabled) {
    scoring.layer_budget = ctx.layer_budgets[l];
    if (!scoring.realloc || scoring.realloc->params().layer_budget != scoring.layer_budget) {
      KVCTL_ASSIGN_OR_RETURN(
          HeadReallocator r,
          HeadReallocator::Create({.heads = heads,
                                   .layer_budget = scoring.layer_budget,
                                   .floor = ev.floor,
                                   .ema = ev.realloc_ema,
                                   .period = std::max<int64_t>(1, ev.realloc_period)}));
      if (scoring.has_utility) KVCTL_RETURN_IF_ERROR(r.Update(scoring.realloc->smoothed_utility()));
      scoring.realloc = std::move(r);
    }
    for (int h = 0; h < heads; ++h) budget[h] = scoring.realloc->budgets()[h];
  }
  auto over = [&](int h) { return layer.heads[h].count() + n > budget[h]; };
  bool any_over = false;
  for (int h = 0; ev.enabled && h < heads; ++h) any_over |= over(h);

  // H2O: fold the pending queries into every head's accumulated attention (at least once per
  // compression period, and always before scoring).
  const bool h2o = ev.enabled && ev.policy == EvictPolicy::kH2O;
  if (h2o && scoring.h2o_pending > 0 &&
      (any_over || ctx.realloc_due || scoring.h2o_pending >= ev.compression_period)) {
    for (int h = 0; h < heads; ++h) {
      PreparedHead& ph = out->heads[h];
      ph.h2o = layer.heads[h].h2o;
      KVCTL_ASSIGN_OR_RETURN(KvTensorView gq, group(scoring.h2o_pending, h));
      Status s = UpdateH2O(&ph.h2o, full(h), gq);
      if (!s.ok()) return WithLayerHead(l, h, s);
      ph.h2o_changed = true;
    }
    scoring.h2o_pending = 0;
  }
  auto h2o_of = [&](int h) -> const H2OState* {
    return out->heads[h].h2o_changed ? &out->heads[h].h2o : &layer.heads[h].h2o;
  };
  const ProtectedRegions regions{.sinks = ev.sinks, .recent = ev.window};

  // Online head re-allocation from the retained-mass curve of each head's own scorer: greedy =
  // the split that retains the most observed mass (its excess over the floor is the utility, so
  // the EMA smooths budgets); proportional = utility is the mass avg/4 more tokens would win back.
  if (ev.enabled && ctx.realloc_due && have_q) {
    std::vector<double> utility(heads, 0.0);
    std::vector<RetainedMassCurve> curves(heads);
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
      curves[h] = std::move(curve);
    }
    if (ev.realloc_greedy) {
      std::vector<int64_t> reach(heads);
      for (int h = 0; h < heads; ++h) {
        reach[h] = layer.heads[h].count() + n + std::max<int64_t>(1, ev.realloc_period);
      }
      KVCTL_ASSIGN_OR_RETURN(std::vector<int64_t> greedy,
                             GreedyHeadBudgets(curves, scoring.layer_budget, ev.floor,
                                               std::max<int64_t>(1, ctx.avg_budget / 16), reach));
      for (int h = 0; h < heads; ++h) utility[h] = static_cast<double>(greedy[h] - ev.floor);
    }
    KVCTL_RETURN_IF_ERROR(scoring.realloc->Update(utility));
    scoring.has_utility = true;
    for (int h = 0; h < heads; ++h) budget[h] = scoring.realloc->budgets()[h];
  }

  const int sinks_target = lossless ? 0 : rules.sink_tokens;
  for (int h = 0; h < heads; ++h) {
    const HeadStream& head = layer.heads[h];
    PreparedHead& ph = out->heads[h];
    ph.budget = ev.enabled ? budget[h] : 0;
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

    // Records: a record whose tokens all stay keeps its bytes (moved down past dropped ones); one
    // that lost every token is dropped; the kept tokens of the others are decoded (as fp16) and
    // re-packed, in order, into fresh records. A whole record kept after loose tokens is decoded
    // too, since records hold consecutive kept tokens.
    const size_t row_floats = static_cast<size_t>(d);
    std::vector<float> pk, pv;  // Loose kept tokens, in order.
    auto take = [&](std::vector<float>& to_k, std::vector<float>& to_v, const float* kr,
                    const float* vr) {
      to_k.insert(to_k.end(), kr, kr + row_floats);
      to_v.insert(to_v.end(), vr, vr + row_floats);
    };
    if (!ph.evicted) ph.records_in_place = static_cast<size_t>(records);
    for (int r = 0; ph.evicted && r < records; ++r) {
      const int64_t base = head.sink_rows + static_cast<int64_t>(r) * g;
      const int kept_here =
          static_cast<int>(std::count(keep.begin() + base, keep.begin() + base + g, uint8_t{1}));
      if (kept_here == g && pk.empty()) {
        // Kept whole: in place while nothing before it moved, else moved down.
        if (ph.record_plan.empty() && static_cast<size_t>(r) == ph.records_in_place) {
          ++ph.records_in_place;
        } else {
          ph.record_plan.push_back(r);
        }
        continue;
      }
      for (int64_t j = base; j < base + g; ++j) {
        if (!keep[j]) continue;
        take(pk, pv, &all_k[h][j * d], &all_v[h][j * d]);
        ++ph.decoded_tokens;
      }
      if (pk.size() >= static_cast<size_t>(g) * d) {
        const auto cut = static_cast<std::ptrdiff_t>(static_cast<size_t>(g) * d);
        ph.qk.insert(ph.qk.end(), pk.begin(), pk.begin() + cut);
        ph.qv.insert(ph.qv.end(), pv.begin(), pv.begin() + cut);
        pk.erase(pk.begin(), pk.begin() + cut);
        pv.erase(pv.begin(), pv.begin() + cut);
        ph.record_plan.push_back(-1);
      }
    }

    // L: the loose kept tokens, then the kept tail and new tokens; it flushes like a tail.
    ph.new_sinks = std::clamp(sinks_target - head.sink_rows, 0, n);
    const int sinks_after = head.sink_rows + ph.new_sinks;
    const int64_t from = sinks_after + static_cast<int64_t>(records) * g;
    // Without eviction and flush the old tail stays where it is: only the new tokens are read.
    const bool untouched =
        !ph.evicted && (lossless || (total - from) < static_cast<int64_t>(rules.flush_tokens));
    const int64_t read_from = untouched ? std::max(from, old) : from;
    const bool decoded = ev.enabled && have_all[h];
    if (untouched && !decoded) {
      // The decode-step path: the new sinks and tail tokens are written as they came, in the
      // stored dtype (a byte copy when it is the session's), with no fp32 detour.
      ph.tail_after = static_cast<int>(total - from);
      ph.rows_after = sinks_after + ph.tail_after;
      ph.write_start = head.sink_rows + head.tail_rows;
      const size_t slot = 2 * layer.row_bytes;
      ph.rows.resize((ph.new_sinks + static_cast<size_t>(total - read_from)) * slot);
      uint8_t* dst = ph.rows.data();
      auto store = [&](int64_t t) {
        StoreInputRow(k, t, h, layer.row_dtype, dst);
        StoreInputRow(v, t, h, layer.row_dtype, dst + layer.row_bytes);
        dst += slot;
      };
      for (int t = 0; t < ph.new_sinks; ++t) store(t);
      for (int64_t j = read_from; j < total; ++j) store(j - old);
      continue;
    }
    std::vector<float> src_k, src_v;
    const float* sk;
    const float* sv;
    if (decoded) {
      sk = all_k[h].data() + read_from * d, sv = all_v[h].data() + read_from * d;
    } else {
      Materialize(layer, h, read_from, k, v, &src_k, &src_v);
      sk = src_k.data(), sv = src_v.data();
    }
    std::vector<float>& lk = pk;
    std::vector<float>& lv = pv;
    for (int64_t j = read_from; j < total; ++j) {
      if (ph.evicted && !keep[j]) continue;
      take(lk, lv, sk + (j - read_from) * d, sv + (j - read_from) * d);
    }
    const int l_rows = static_cast<int>(lk.size() / row_floats);
    const int flushed = untouched ? 0 : l_rows / rules.flush_tokens * rules.flush_tokens;
    ph.qk.insert(ph.qk.end(), lk.begin(), lk.begin() + static_cast<std::ptrdiff_t>(flushed * d));
    ph.qv.insert(ph.qv.end(), lv.begin(), lv.begin() + static_cast<std::ptrdiff_t>(flushed * d));
    for (int b = 0; b < flushed / std::max(g, 1); ++b) ph.record_plan.push_back(-1);
    // Rows to write: the new sinks, then either the new tail tokens (nothing moved) or the whole
    // new tail.
    ph.tail_after = untouched ? static_cast<int>(total - from) : l_rows - flushed;
    ph.rows_after = sinks_after + ph.tail_after;
    ph.write_start = head.sink_rows + (untouched ? head.tail_rows : 0);
    const int first_tail = untouched ? 0 : flushed;
    auto put = [&](const float* kr, const float* vr) {
      const size_t at = ph.rows.size();
      ph.rows.resize(at + 2 * layer.row_bytes);
      StoreRow(kr, d, layer.row_dtype, ph.rows.data() + at);
      StoreRow(vr, d, layer.row_dtype, ph.rows.data() + at + layer.row_bytes);
    };
    std::vector<float> krow(row_floats), vrow(row_floats);
    for (int t = 0; t < ph.new_sinks; ++t) {
      k.LoadRow(t, h, krow.data());
      v.LoadRow(t, h, vrow.data());
      put(krow.data(), vrow.data());
    }
    for (int t = first_tail; t < l_rows; ++t) put(&lk[t * d], &lv[t * d]);
  }

  KVCTL_RETURN_IF_ERROR(EncodeNewRecords(l, out));

  if (ev.enabled) KeepQueryWindow(ev, q_row, &scoring);
  return OkStatus();
}

}  // namespace kvctl
