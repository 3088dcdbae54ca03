// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// APPEND as a pipeline of stages (docs/algorithms.md §16 has the slab accounting):
//   1. ValidateAppend: shapes, positions, values (each element read once, as bits), Q.
//   2. PlanAppend: the token budgets of this append (eviction schedule or joint caps).
//   3. Prepare (kv_sequence_append.cc and kv_sequence_evict.cc, per layer): scoring, eviction,
//   compaction and the new
//      records encoded into temporary memory; CountSlots sums the slots each slab needs.
//   4. ReservePages: every page the append needs in one allocation, or compaction of the slabs
//      that shrink first when the pool is short, or RESOURCE_EXHAUSTED with nothing changed.
//   5. CommitAppend: cannot fail; writes slots, positions and counters, all or nothing.
// AppendOnce runs them and retries after a pressure relief when the pool is short.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/half.h"
#include "controller/sequence/kv_sequence.h"
#include "controller/sequence/kv_sequence_internal.h"
#include "kernels/convert.h"

namespace kvctl {
namespace {

bool Dense(const KvTensorView& view) {
  return view.head_stride == view.head_dim && view.token_stride == view.heads * view.head_dim;
}

// Every element finite and, for rows stored as fp16, within fp16's range. The error names the
// first bad element.
Status CheckStorable(const KvTensorView& view, const char* name, int layer, bool half_range) {
  // Bit tests (kernels/convert.h, SIMD): one call over the whole view when its rows are back to
  // back (what the daemon's APPEND hands us), else one per row.
  auto outside = [&](const void* src, size_t n) {
    return half_range ? FirstOutsideHalf(view.dtype, src, n) : FirstNonFinite(view.dtype, src, n);
  };
  const size_t row = static_cast<size_t>(view.head_dim);
  if (Dense(view)) {
    const size_t n = row * static_cast<size_t>(view.heads * view.tokens);
    if (outside(view.RowBytes(0, 0), n) == n) return OkStatus();
  }
  std::vector<float> values;
  for (int64_t t = 0; t < view.tokens; ++t) {
    for (int64_t h = 0; h < view.heads; ++h) {
      if (outside(view.RowBytes(t, h), row) == row) continue;
      values.resize(row);
      view.LoadRow(t, h, values.data());
      for (int64_t c = 0; c < view.head_dim; ++c) {
        if (!std::isfinite(values[c])) {
          return InvalidArgument("layer ", layer, ": ", name, ": element (token ", t, ", head ", h,
                                 ", channel ", c, ") is ", values[c], ", expected a finite value");
        }
        if (std::fabs(values[c]) > kHalfMax) {
          return InvalidArgument(name, ": element (layer ", layer, ", token ", t, ", head ", h,
                                 ", channel ", c, ") is ", values[c],
                                 ", beyond the fp16 range (65504) of the residual window; use "
                                 "quant.method = \"none\" for such data");
        }
      }
    }
  }
  return OkStatus();
}

// Every view of `views` storable (CheckStorable), views [l, l + 1) with half_range(l). Views that
// lie end to end (a staged or inline APPEND's layers do) with the same range are scanned in one
// call: a decode step's layers are small, and a call per layer cost more than the scan.
template <typename HalfRange>
Status CheckStorableLayers(const std::vector<KvTensorView>& views, const char* name,
                           HalfRange half_range) {
  const int layers = static_cast<int>(views.size());
  for (int first = 0; first < layers;) {
    const bool range = half_range(first);
    const KvTensorView& head = views[first];
    size_t elements = head.ElementCount();
    int end = first + 1;
    if (Dense(head)) {
      for (; end < layers && Dense(views[end]) && views[end].dtype == head.dtype &&
             half_range(end) == range &&
             views[end].data ==
                 static_cast<const char*>(head.data) + elements * DTypeSize(head.dtype);
           ++end) {
        elements += views[end].ElementCount();
      }
    }
    // A run of one view is the layer's own check; a longer one falls back to those checks,
    // which name the element, only when the run holds a bad one.
    const bool run_fine =
        end > first + 1 && (range ? FirstOutsideHalf(head.dtype, head.data, elements)
                                  : FirstNonFinite(head.dtype, head.data, elements)) == elements;
    for (int l = first; l < end && !run_fine; ++l) {
      KVCTL_RETURN_IF_ERROR(CheckStorable(views[l], name, l, half_range(l)));
    }
    first = end;
  }
  return OkStatus();
}

// Checks one layer's view against [n, heads, head_dim]; `name` is "k", "v" or "q".
Status CheckShape(const KvTensorView& view, const char* name, int layer, int64_t n, int heads,
                  int head_dim) {
  KVCTL_RETURN_IF_ERROR(view.Validate(name));
  if (view.tokens != n || view.heads != heads || view.head_dim != head_dim) {
    return InvalidArgument(name, " layer ", layer, ": shape [", view.tokens, ", ", view.heads, ", ",
                           view.head_dim, "], expected [", n, ", ", heads, ", ", head_dim, "]");
  }
  return OkStatus();
}

}  // namespace

StatusOr<int64_t> KvSequence::ValidateAppend(int64_t first_position,
                                             const std::vector<KvTensorView>& k,
                                             const std::vector<KvTensorView>& v,
                                             const std::vector<KvTensorView>* q) const {
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
    KVCTL_RETURN_IF_ERROR(CheckShape(k[l], "k", l, n, geometry_.kv_heads, geometry_.head_dim));
    KVCTL_RETURN_IF_ERROR(CheckShape(v[l], "v", l, n, geometry_.kv_heads, geometry_.head_dim));
  }
  // Rows of a quantized layer are stored as fp16 before they are quantized: refuse what fp16
  // cannot hold too.
  const auto half_range = [this](int l) { return !layers_[l]->plan.lossless; };
  KVCTL_RETURN_IF_ERROR(CheckStorableLayers(k, "k", half_range));
  KVCTL_RETURN_IF_ERROR(CheckStorableLayers(v, "v", half_range));
  if (n > (int64_t{1} << 30)) return InvalidArgument("tokens: got ", n, ", expected <= 2^30");
  if (q == nullptr && eviction_.NeedsQ()) {
    return InvalidArgument(
        "q: missing, expected Q ([layers, n_tokens, q_heads, head_dim], has_q = "
        "1) with every APPEND: evict.policy = \"",
        EvictPolicyName(eviction_.policy), "\" scores tokens from the engine's queries");
  }
  if (q == nullptr) return n;
  if (static_cast<int>(q->size()) != layers || geometry_.q_heads == 0) {
    return InvalidArgument("q: got ", q->size(), " layers with q_heads ", geometry_.q_heads,
                           ", expected ", layers, " layers and q_heads > 0");
  }
  for (int l = 0; l < layers; ++l) {
    KVCTL_RETURN_IF_ERROR(CheckShape((*q)[l], "q", l, n, geometry_.q_heads, geometry_.head_dim));
  }
  KVCTL_RETURN_IF_ERROR(CheckStorableLayers(*q, "q", [](int) { return false; }));
  return n;
}

StatusOr<KvSequence::AppendContext> KvSequence::PlanAppend(int64_t n, bool have_q,
                                                           bool continues) const {
  AppendContext ctx;
  ctx.n = n;
  if (continues && eviction_.enabled) {
    // The cap bounds what a client that never ends its prefill can make a sequence hold beyond
    // its budget; past it the append evicts as if the flag were absent (counted in STATS).
    ctx.defer = deferred_tokens_ + n <= eviction_.max_deferred_tokens;
    ctx.cap_hit = !ctx.defer;
  }
  if (ctx.defer) {
    // Nothing is scored: no budgets, no re-allocation (since_realloc_ still counts the tokens,
    // so the append that ends the prefill re-allocates when one append of it all would).
    return ctx;
  }
  const int layers = geometry_.layers;
  if (eviction_.enabled && !eviction_.head_caps.empty()) {
    // Joint: fixed caps per head.
    ctx.layer_budgets.assign(static_cast<size_t>(layers), 0);
    for (size_t i = 0; i < eviction_.head_caps.size(); ++i) {
      ctx.layer_budgets[i / geometry_.kv_heads] += eviction_.head_caps[i];
    }
  } else if (eviction_.enabled) {
    ctx.avg_budget = AverageBudget(eviction_, tokens_ + n);
    // Full heads (evict.full_heads, uniform layers only) keep every token; the others share
    // what is left of the same total.
    const int64_t avg = FullHeadsAverage(eviction_, int64_t{layers} * geometry_.kv_heads,
                                         ctx.avg_budget, tokens_ + n);
    KVCTL_ASSIGN_OR_RETURN(ctx.layer_budgets,
                           LayerBudgets(eviction_, layers, geometry_.kv_heads, avg, tokens_ + n));
    // A layer's budget is its other heads' share (no overflow: at most LayerBudgets' heads x avg).
    for (int l = 0; l < layers; ++l) ctx.layer_budgets[l] -= avg * FullHeadsOf(l);
    PlanReallocation(n, have_q, &ctx);
  }
  if (eviction_.enabled && eviction_.stagger_layers && eviction_.compression_period > 1) {
    const int64_t interval = StaggerInterval(eviction_, tokens_ + n);
    ctx.compress_due.resize(static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l) {
      ctx.compress_due[l] = CompressionDue(interval, l, layers, tokens_, tokens_ + n) ? 1 : 0;
    }
  }
  PlanFlushSpread(n, &ctx);
  return ctx;
}

void KvSequence::PlanReallocation(int64_t n, bool have_q, AppendContext* ctx) const {
  const int64_t period = eviction_.realloc_period;
  if (period <= 0 || !have_q) return;
  const int layers = geometry_.layers;
  if (!eviction_.stagger_layers) {
    // Every layer re-splits on the first append with queries once `period` tokens have come.
    if (since_realloc_ + n >= period) ctx->realloc_due.assign(static_cast<size_t>(layers), 1);
    return;
  }
  // Re-splitting scores every head of the layer, so all layers at once is a stall of one decode
  // step (as compressions were). A layer's first re-split comes as without staggering (period
  // tokens into a new sequence, at once in a forked or imported one: since_realloc_); after it,
  // layer l re-splits where tokens + floor(l * period / layers) crosses a multiple of period. The
  // span starts before any deferred tokens, which nothing scored, so the append that ends a
  // prefill re-splits where one append of it all would.
  ctx->realloc_due.resize(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    ctx->realloc_due[l] =
        layers_[l]->scoring.has_utility
            ? CompressionDue(period, l, layers, tokens_ - deferred_tokens_, tokens_ + n)
            : since_realloc_ + n >= period;
  }
}

void KvSequence::PlanFlushSpread(int64_t n, AppendContext* ctx) const {
  // Every quantized layer's tail reaches flush_tokens on the same decode step (they all grow one
  // row per step), so without spreading that step encodes every record of the flush at once
  // (milliseconds for KVarN over 90 streams) and the others none. Holding some of them a few
  // steps costs up to steps - 1 more fp16 rows per head, transiently.
  // Never over more appends than a flush has tokens: then the flushed layers' shorter tails
  // always make up for the held ones' longer tails (ceil(layers / steps) x flush_tokens >=
  // layers), so the sequence never holds more fp16 rows than with every tail at
  // flush_tokens - 1, which is what a joint plan charges (docs/budgets.md).
  int steps = geometry_.flush_spread_steps;
  if (steps <= 1) return;  // The default: no walk over the layers.
  for (const auto& layer : layers_) {
    if (!layer->plan.lossless) steps = std::min(steps, layer->plan.rules.flush_tokens);
  }
  if (steps <= 1) return;
  struct Due {
    int64_t tail;
    int layer;
  };
  std::vector<Due> due;
  int quantized = 0, flushing = 0;
  for (int l = 0; l < geometry_.layers; ++l) {
    const LayerState& layer = *layers_[l];
    if (layer.plan.lossless) continue;
    ++quantized;
    const StreamingRules& rules = layer.plan.rules;
    int64_t tail = 0;
    for (const HeadStream& head : layer.heads) {
      tail = std::max(tail, TailAfterAppend(head, rules.sink_tokens, n));
    }
    if (tail < rules.flush_tokens) continue;
    if (tail >= int64_t{rules.flush_tokens} + steps - 1) {
      ++flushing;  // Held as long as allowed.
    } else {
      due.push_back({tail, l});
    }
  }
  const int per_append = (quantized + steps - 1) / steps;
  const auto first_held = static_cast<size_t>(std::max(per_append - flushing, 0));
  if (due.size() <= first_held) return;
  std::sort(due.begin(), due.end(), [](const Due& a, const Due& b) {
    return a.tail != b.tail ? a.tail > b.tail : a.layer < b.layer;
  });
  ctx->held_flush.assign(static_cast<size_t>(geometry_.layers), 0);
  for (size_t i = first_held; i < due.size(); ++i) ctx->held_flush[due[i].layer] = 1;
}

void KvSequence::CountSlots(int l, const PreparedLayer& p, SlabPlan* plan) const {
  // Slots the append takes per slab, net of what its shrinking arrays give back: those slots go
  // straight to the growing arrays of the same slab (shrinks commit first), so an evicting append
  // needs pages only for its net growth.
  const LayerState& layer = *layers_[l];
  for (int h = 0; h < geometry_.kv_heads; ++h) {
    const HeadStream& head = layer.heads[h];
    const PreparedHead& ph = p.heads[h];
    plan->Count(head.rows, static_cast<size_t>(ph.rows_after));
    plan->Count(head.records, ph.final_records());
  }
  if (!p.norms.empty()) {
    const size_t per_slot = layer.norms.slot_bytes() / 4;
    plan->Count(layer.norms, layer.norms.size() + p.norms.size() / per_slot);
  }
}

StatusOr<KvSequence::Reservation> KvSequence::ReservePages(const SlabPlan& plan) {
  const size_t pages = plan.Pages();
  Reservation out;
  StatusOr<std::vector<uint32_t>> got = std::vector<uint32_t>{};
  if (pages > 0) got = pool_->AllocateMany(static_cast<uint32_t>(pages));
  // A full pool: slots given back serve only their own slab unless the slabs that shrink are
  // compacted before the growth, which frees their emptied pages for any slab. Worth the copies
  // only when the pool cannot give the pages otherwise; their pages are checked first, since
  // compaction copies what they hold.
  if (!got.ok() && plan.PagesCompacting() < pages) {
    if (pool_->checksums()) {
      Status verified = pool_->VerifyPages(plan.ShrunkPages(), PageAllocator::VerifyReason::kCopy);
      if (!verified.ok()) return MarkLost(verified);
    }
    const size_t compacting = plan.PagesCompacting();
    StatusOr<std::vector<uint32_t>> tight = std::vector<uint32_t>{};
    if (compacting > 0) tight = pool_->AllocateMany(static_cast<uint32_t>(compacting));
    if (tight.ok()) {
      got = std::move(tight);
      out.compact_between = true;
    }
  }
  if (!got.ok()) {
    const PoolStats stats = pool_->Stats();
    const int64_t shortfall =
        static_cast<int64_t>(pages) - (int64_t{stats.pages_total} - stats.pages_used);
    last_shortfall_pages_ = std::max<int64_t>(1, shortfall);
    return ResourceExhausted("needs ", pages, " pool pages of ", pool_->page_bytes(),
                             " bytes: ", got.status().message());
  }
  out.pages = std::move(got).value();
  return out;
}

Status KvSequence::AppendOnce(int64_t first_position, const std::vector<KvTensorView>& k,
                              const std::vector<KvTensorView>& v,
                              const std::vector<KvTensorView>* q, int relief_rounds,
                              bool continues) {
  KVCTL_ASSIGN_OR_RETURN(const int64_t n, ValidateAppend(first_position, k, v, q));
  // A flush held for after the reply and prepared since (PrepareHeldFlushStep): its records are
  // written now, before this append's rows, as the append that held it would have.
  KVCTL_RETURN_IF_ERROR(CommitPreparedFlush());
  // A decode step that only stores rows needs none of the stages' per-head planning.
  if (AppendIsLight(n) && TryAppendRows(first_position, n, k, v, q != nullptr)) return OkStatus();
  KVCTL_ASSIGN_OR_RETURN(const AppendContext ctx, PlanAppend(n, q != nullptr, continues));
  if (Status checked = CheckFlushedTails(ctx, 0, geometry_.layers); !checked.ok()) {
    return MarkLost(checked);
  }
  KVCTL_RETURN_IF_ERROR(PrepareLayers(ctx, n, k, v, q));
  std::vector<PreparedLayer>& prepared = prepared_;
  SlabPlan slab_plan;
  for (int l = 0; l < geometry_.layers; ++l) CountSlots(l, prepared[l], &slab_plan);
  StatusOr<Reservation> reserved = ReservePages(slab_plan);
  if (reserved.status().code() == StatusCode::kResourceExhausted) {
    const Status exhausted(
        StatusCode::kResourceExhausted,
        internal::StrCat("append of ", n, " tokens ", reserved.status().message()));
    if (relief_rounds <= 0) return exhausted;
    Status relieved = RelievePressure(last_shortfall_pages_);
    if (!relieved.ok()) {
      return ResourceExhausted(exhausted.message(), "; budget.pressure: ", relieved.message());
    }
    // Widths or caps changed: prepare again (narrower new records, or more evicted).
    return AppendOnce(first_position, k, v, q, relief_rounds - 1, continues);
  }
  KVCTL_RETURN_IF_ERROR(reserved.status());
  CommitAppend(first_position, ctx, &prepared, slab_plan, std::move(reserved).value());
  // What shrank (flushed tails, evicted tokens) leaves free slots: from a page's worth per slab
  // on they are packed and the emptied pages go back to the pool.
  Status compacted = slabs_.Compact();
  return compacted.ok() ? compacted : MarkLost(compacted);
}

void KvSequence::SetPrepareRunner(const PartsRunner* runner, int64_t min_tokens) {
  prepare_runner_ = runner;
  prepare_split_tokens_ = min_tokens;
}

Status KvSequence::PrepareLayers(const AppendContext& ctx, int64_t n,
                                 const std::vector<KvTensorView>& k,
                                 const std::vector<KvTensorView>& v,
                                 const std::vector<KvTensorView>* q) {
  // The plan buffers of the previous append are reused: a decode step then allocates little.
  std::vector<PreparedLayer>& prepared = prepared_;
  const int layers = geometry_.layers;
  prepared.resize(static_cast<size_t>(layers));
  auto prepare = [&](int l) {
    return AppendLayerPrepare(l, ctx, k[l], v[l], q ? &(*q)[l] : nullptr, &prepared[l]);
  };
  // DATA_LOSS: stored slots a layer was about to re-write changed behind the daemon's back.
  auto fail = [&](Status s) { return s.code() == StatusCode::kDataLoss ? MarkLost(s) : s; };
  // The tokens Prepare works over: this append's and, for the append that ends a prefill sent
  // in flagged pieces (APPEND_CONTINUES), every piece it stored before (it evicts over all).
  const int64_t work_tokens = n + (ctx.defer ? 0 : deferred_tokens_);
  if (prepare_runner_ == nullptr || prepare_split_tokens_ <= 0 ||
      work_tokens < prepare_split_tokens_ || layers < 2) {
    for (int l = 0; l < layers; ++l) {
      if (Status s = prepare(l); !s.ok()) return fail(s);
    }
    return OkStatus();
  }
  // Layers after a failed one are prepared too (the plans are thrown away with the append).
  std::vector<Status> statuses(static_cast<size_t>(layers));
  (*prepare_runner_)(static_cast<size_t>(layers),
                     [&](size_t l) { statuses[l] = prepare(static_cast<int>(l)); });
  for (Status& s : statuses) {
    if (!s.ok()) return fail(std::move(s));
  }
  return OkStatus();
}

void KvSequence::CommitRecords(HeadStream& head, const PreparedHead& ph,
                               std::vector<uint32_t>* reserved) {
  // Records move only down (a kept record lands at or before its old slot), so in order every
  // source is read before its slot is overwritten; shrink only after moving.
  const size_t rb = head.records.slot_bytes();
  const size_t final_records = ph.final_records();
  if (final_records > head.records.size()) head.records.Resize(final_records, reserved);
  size_t fresh = 0, moved = 0;
  for (size_t i = ph.records_in_place; i < final_records; ++i) {
    const int src = ph.record_plan[i - ph.records_in_place];
    if (src == PreparedHead::kNewRecord) {
      std::memcpy(head.records.MutableSlot(i), ph.records.data() + fresh++ * rb, rb);
    } else if (src == PreparedHead::kMovedRecord) {
      std::memcpy(head.records.MutableSlot(i), ph.moved.data() + moved++ * rb, rb);
    } else if (static_cast<size_t>(src) != i) {
      std::memcpy(head.records.MutableSlot(i), head.records.Slot(src), rb);
    }
  }
  if (final_records < head.records.size()) head.records.Resize(final_records, reserved);
}

void KvSequence::CommitRows(HeadStream& head, const PreparedHead& ph,
                            std::vector<uint32_t>* reserved) {
  head.rows.Resize(ph.rows_after, reserved);
  const size_t slot = head.rows.slot_bytes();
  for (size_t i = 0; i < ph.rows.size() / slot; ++i) {
    std::memcpy(head.rows.MutableSlot(ph.write_start + i), ph.rows.data() + i * slot, slot);
  }
}

void KvSequence::CommitHeadState(int64_t first_position, int64_t n, HeadStream& head,
                                 PreparedHead& ph) {
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
    head.usage.requantized_tokens += ph.decoded_tokens;
    ++head.usage.compressions;
    if (ph.retained >= 0) {
      ++head.usage.retained_samples;
      head.usage.retained_mass_sum += ph.retained;
    }
  }
  if (ph.h2o_changed) head.h2o = std::move(ph.h2o);
  if (ph.redundancy_changed) head.redundancy = std::move(ph.redundancy);
  head.usage.budget = ph.budget;
  KVCTL_CHECK(head.count() == static_cast<int64_t>(head.positions.size()));
  KVCTL_CHECK(!eviction_.enabled || ph.deferred || head.count() <= ph.budget);
}

void KvSequence::CommitLayerState(LayerState& layer, PreparedLayer& p,
                                  std::vector<uint32_t>* reserved) {
  if (!p.norms.empty()) {
    const size_t per_slot = layer.norms.slot_bytes() / 4;
    const size_t before = layer.norms.size();
    layer.norms.Resize(before + p.norms.size() / per_slot, reserved);
    for (size_t i = 0; i < p.norms.size() / per_slot; ++i) {
      std::memcpy(layer.norms.MutableSlot(before + i), &p.norms[i * per_slot], per_slot * 4);
    }
  }
  for (const PreparedLayer::Sample& sample : p.samples) {
    HeadUsage& u = layer.heads[sample.head].usage;
    ++u.quality_samples;
    u.k_rel_error_sum += sample.k_rel_error;
    u.v_rel_error_sum += sample.v_rel_error;
  }
  layer.scoring = std::move(p.scoring);
  CommitQueries(p.queries, static_cast<size_t>(geometry_.q_heads) * geometry_.head_dim,
                &layer.queries);
}

void KvSequence::CommitAppend(int64_t first_position, const AppendContext& ctx,
                              std::vector<PreparedLayer>* prepared, const SlabPlan& slab_plan,
                              Reservation reservation) {
  std::vector<uint32_t>& reserved = reservation.pages;
  // Arrays that shrink go first, so the slots they give back are there for the arrays that grow.
  // After the first pass only the growing arrays still differ from their plan, so the same test
  // picks exactly them in the second.
  const auto records_grow = [](const HeadStream& head, const PreparedHead& ph) {
    return ph.final_records() > head.records.size();
  };
  const auto rows_grow = [](const HeadStream& head, const PreparedHead& ph) {
    return static_cast<size_t>(ph.rows_after) > head.rows.size();
  };
  for (int l = 0; l < geometry_.layers; ++l) {
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      HeadStream& head = layers_[l]->heads[h];
      const PreparedHead& ph = (*prepared)[l].heads[h];
      if (!records_grow(head, ph)) CommitRecords(head, ph, &reserved);
      if (!rows_grow(head, ph)) CommitRows(head, ph, &reserved);
    }
  }
  if (reservation.compact_between) slab_plan.CompactShrunk(&reserved);
  for (int l = 0; l < geometry_.layers; ++l) {
    LayerState& layer = *layers_[l];
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      HeadStream& head = layer.heads[h];
      PreparedHead& ph = (*prepared)[l].heads[h];
      if (records_grow(head, ph)) CommitRecords(head, ph, &reserved);
      if (rows_grow(head, ph)) CommitRows(head, ph, &reserved);
      CommitHeadState(first_position, ctx.n, head, ph);
    }
    CommitLayerState(layer, (*prepared)[l], &reserved);
  }
  for (uint32_t page : reserved) KVCTL_CHECK(pool_->Free(page).ok());  // Released, not reused.
  CommitCounters(first_position, ctx);
}

void KvSequence::CommitCounters(int64_t first_position, const AppendContext& ctx) {
  if (tokens_ == 0) first_position_ = first_position;
  tokens_ += ctx.n;
  // Tokens since layer 0 last re-split: the schedule without staggering, and the first re-split
  // of every layer with it (they all make it on one append).
  since_realloc_ = ctx.ReallocDue(0) ? 0 : since_realloc_ + ctx.n;
  if (ctx.defer) {
    deferred_tokens_ += ctx.n;
    ++deferred_appends_;
  } else {
    deferred_tokens_ = 0;  // This append evicted over everything the prefill stored.
    deferral_cap_hits_ += ctx.cap_hit ? 1 : 0;
  }
}

bool KvSequence::TryAppendRows(int64_t first_position, int64_t n,
                               const std::vector<KvTensorView>& k,
                               const std::vector<KvTensorView>& v, bool have_q) {
  // The stages would write a head's new sinks, then its new tail tokens, from slot
  // sink_rows + tail_rows on: the request's rows in order, as long as a head that tops up its
  // sinks holds no tail (sinks fill first).
  std::vector<std::pair<Slab*, size_t>> growth;  // Slots per slab (rows of one size share one).
  for (const auto& layer : layers_) {
    const int sink_target = layer->plan.lossless ? 0 : layer->plan.rules.sink_tokens;
    for (const HeadStream& head : layer->heads) {
      if (head.sink_rows < sink_target && head.tail_rows > 0) return false;
      // The step writes the end of two arrays per stream, each in its own place: after an
      // engine's step has left the caches cold, every one is a miss (and often a TLB miss).
      // Asking for all of them here lets the misses overlap instead of following one another.
      __builtin_prefetch(head.rows.ids().data() + head.rows.size(), 1);
      __builtin_prefetch(head.positions.data() + head.positions.size(), 1);
      Slab* slab = head.rows.slab();
      auto it = std::find_if(growth.begin(), growth.end(),
                             [slab](const auto& entry) { return entry.first == slab; });
      if (it == growth.end()) it = growth.insert(growth.end(), {slab, 0});
      it->second += static_cast<size_t>(n);
    }
  }
  size_t pages = 0;
  for (const auto& [slab, slots] : growth) pages += slab->PagesFor(slots);
  std::vector<uint32_t> reserved;
  if (pages > 0) {
    StatusOr<std::vector<uint32_t>> got = pool_->AllocateMany(static_cast<uint32_t>(pages));
    if (!got.ok()) return false;
    reserved = std::move(got).value();
  }
  for (int l = 0; l < geometry_.layers; ++l) {
    LayerState& layer = *layers_[l];
    const int sink_target = layer.plan.lossless ? 0 : layer.plan.rules.sink_tokens;
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      HeadStream& head = layer.heads[h];
      const size_t first_slot = head.rows.size();
      head.rows.Resize(first_slot + static_cast<size_t>(n), &reserved);
      for (int64_t t = 0; t < n; ++t) {
        StoreRequestRow(k[l], v[l], t, h, layer.row_dtype, layer.row_bytes,
                        head.rows.MutableSlot(first_slot + static_cast<size_t>(t)));
        head.positions.push_back(first_position + t);
      }
      const int new_sinks =
          static_cast<int>(std::clamp<int64_t>(int64_t{sink_target} - head.sink_rows, 0, n));
      head.sink_rows += new_sinks;
      head.tail_rows += static_cast<int>(n) - new_sinks;
      head.usage.budget = 0;
    }
    // What Prepare does with the query rows: without eviction, only drops them when none came
    // (and there are any to drop).
    if (!have_q &&
        (layer.queries.count > 0 || layer.queries.first > 0 || layer.scoring.h2o_pending > 0)) {
      PreparedQueries none;
      StartQueries(layer.queries, &none);
      TakeQueries(eviction_, nullptr, n, geometry_.q_heads, geometry_.head_dim, &layer.scoring,
                  &none);
      CommitQueries(none, static_cast<size_t>(geometry_.q_heads) * geometry_.head_dim,
                    &layer.queries);
    }
  }
  for (uint32_t page : reserved) KVCTL_CHECK(pool_->Free(page).ok());  // None: PagesFor is exact.
  AppendContext ctx;
  ctx.n = n;
  CommitCounters(first_position, ctx);
  return true;
}

}  // namespace kvctl
