// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/sequence/kv_sequence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "common/half.h"
#include "controller/sequence/kv_sequence_internal.h"
#include "kernels/quantize.h"

namespace kvctl {

KvSequence::KvSequence(PageAllocator* pool, const SequenceGeometry& geometry,
                       std::vector<LayerPlan> plans, EvictionSettings eviction,
                       PressureSettings pressure)
    : pool_(pool),
      geometry_(geometry),
      slabs_(pool),
      eviction_(std::move(eviction)),
      pressure_(std::move(pressure)) {
  KVCTL_CHECK(static_cast<int>(plans.size()) == geometry.layers);
  KVCTL_CHECK(pressure_.curves.empty() ||
              pressure_.curves.size() == static_cast<size_t>(geometry.layers) * geometry.kv_heads);
  // Streams with the same slot size share one slab's pages (controller/pool/slab.h), so the
  // sequence holds about one partly filled page per slot size, not one per stream. Lossless
  // layers never write records: their arrays stay empty.
  auto record_bytes = [](const LayerPlan& plan, const QuantSpec& spec) {
    return plan.lossless ? size_t{8} : BlockLayoutOf(spec).record_bytes;
  };
  for (LayerPlan& plan : plans) {
    KVCTL_CHECK(static_cast<int>(plan.head_specs.size()) == geometry.kv_heads);
    const QuantSpec& first = plan.head_specs[0];
    const bool norms = TraitsOf(first.method).needs_token_norms && !plan.lossless;
    KVCTL_CHECK(!(norms && eviction_.enabled));  // ValidateBudgetConfig refuses OScaR + eviction.
    // With eviction the never-evicted first tokens stay fp16 rows, so records hold only tokens
    // that can go and a record whose tokens all go is freed without touching its neighbours.
    if (eviction_.enabled && !plan.lossless) {
      plan.rules.sink_tokens = std::max<int>(plan.rules.sink_tokens, eviction_.sinks);
    }
    const size_t norm_slot = norms ? static_cast<size_t>(first.block_tokens) * 4 : 4;
    auto layer = std::make_unique<LayerState>(slabs_.Get(norm_slot));
    layer->row_dtype = plan.lossless ? geometry.dtype : DType::kF16;
    layer->row_bytes = static_cast<size_t>(geometry.head_dim) * DTypeSize(layer->row_dtype);
    for (const QuantSpec& spec : plan.head_specs) {
      layer->heads.emplace_back(spec, SlotArray(slabs_.Get(2 * layer->row_bytes)),
                                SlotArray(slabs_.Get(record_bytes(plan, spec))));
    }
    layer->plan = std::move(plan);
    layers_.push_back(std::move(layer));
  }
}

KvSequence::~KvSequence() = default;

Status KvSequence::Append(int64_t first_position, const std::vector<KvTensorView>& k,
                          const std::vector<KvTensorView>& v, const std::vector<KvTensorView>* q) {
  if (!integrity_.ok()) return integrity_;
  // A relief frees what the model predicts; the pages may still fall short (page granularity,
  // another sequence taking pages meanwhile), so a few rounds are allowed.
  Status appended = AppendOnce(first_position, k, v, q, pressure_.lower_widths ? 3 : 0);
  // Even a failed APPEND may have lowered widths (a relief) before failing.
  Status published = Publish();
  return appended.ok() ? published : appended;
}

void KvSequence::CollectRanges(int layer_begin, int layer_end,
                               std::vector<PageAllocator::PageRange>* ranges) const {
  auto add = [ranges](const SlotArray& array) {
    const auto slot_bytes = static_cast<uint32_t>(array.slot_bytes());
    const auto per_page = static_cast<uint32_t>(array.slots_per_page());
    for (uint32_t id : array.ids()) {
      const uint32_t begin = id % per_page * slot_bytes;
      ranges->push_back({id / per_page, begin, begin + slot_bytes});
    }
  };
  for (int l = layer_begin; l < layer_end; ++l) {
    const LayerState& layer = *layers_[l];
    add(layer.norms);
    for (const HeadStream& head : layer.heads) {
      add(head.rows);
      add(head.records);
    }
  }
}

Status KvSequence::MarkLost(const Status& loss) {
  if (integrity_.ok()) {
    integrity_ =
        DataLoss("sequence data lost: ", loss.message(),
                 "; FETCH and APPEND of this sequence answer DATA_LOSS until it is closed");
  }
  return integrity_;
}

Status KvSequence::Verify(int layer_begin, int layer_end) {
  if (!integrity_.ok() || !pool_->checksums()) return integrity_;
  Status verified;
  if (layer_begin == 0 && layer_end == geometry_.layers) {
    std::vector<uint32_t> pages;
    slabs_.CollectPages(&pages);
    verified = pool_->VerifyPages(pages, PageAllocator::VerifyReason::kFetch);
  } else {
    // Slabs share pages between layers: check only the chunks this range's slots lie in.
    std::vector<PageAllocator::PageRange> ranges;
    CollectRanges(layer_begin, layer_end, &ranges);
    verified = pool_->VerifyRanges(ranges, PageAllocator::VerifyReason::kFetch);
  }
  return verified.ok() ? verified : MarkLost(verified);
}

StatusOr<uint64_t> KvSequence::Scrub(uint64_t max_bytes, bool* wrapped) {
  *wrapped = true;
  if (!integrity_.ok()) return integrity_;
  if (!pool_->checksums()) return uint64_t{0};
  std::vector<uint32_t> pages;
  slabs_.CollectPages(&pages);
  // Appends between calls may move pages in the list: the walk then skips or repeats a few, and
  // the next round covers them.
  if (scrub_cursor_ >= pages.size()) scrub_cursor_ = 0;
  size_t end = scrub_cursor_;
  uint64_t bytes = 0;
  std::vector<uint32_t> slice;
  while (end < pages.size() && bytes < max_bytes) {
    bytes += pool_->SealedBytes(pages[end]);
    slice.push_back(pages[end++]);
  }
  Status verified = pool_->VerifyPages(slice, PageAllocator::VerifyReason::kScrub);
  if (!verified.ok()) return MarkLost(verified);
  *wrapped = end >= pages.size();
  scrub_cursor_ = *wrapped ? 0 : end;
  return bytes;
}

Status KvSequence::Publish() {
  if (!pool_->mirrored() && !pool_->checksums()) return OkStatus();
  std::vector<uint32_t> pages;
  slabs_.CollectPages(&pages);
  if (pool_->checksums()) {
    Status sealed = pool_->SealPages(pages);
    return sealed.ok() ? sealed : MarkLost(sealed);
  }
  Status published = pool_->PublishPages(std::move(pages));
  if (published.ok()) return OkStatus();
  return Unavailable("pool.backend: copying the sequence's changed pages to the device failed (",
                     published.message(),
                     "); the daemon's copy holds the change, the device copy is stale until the "
                     "next successful request on this sequence");
}

Status KvSequence::AppendOnce(int64_t first_position, const std::vector<KvTensorView>& k,
                              const std::vector<KvTensorView>& v,
                              const std::vector<KvTensorView>* q, int relief_rounds) {
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
  if (eviction_.enabled && !eviction_.head_caps.empty()) {
    // Joint: fixed caps per head.
    ctx.layer_budgets.assign(static_cast<size_t>(layers), 0);
    for (size_t i = 0; i < eviction_.head_caps.size(); ++i) {
      ctx.layer_budgets[i / geometry_.kv_heads] += eviction_.head_caps[i];
    }
  } else if (eviction_.enabled) {
    ctx.avg_budget = AverageBudget(eviction_, tokens_ + n);
    KVCTL_ASSIGN_OR_RETURN(ctx.layer_budgets, LayerBudgets(eviction_, layers, geometry_.kv_heads,
                                                           ctx.avg_budget, tokens_ + n));
    ctx.realloc_due = eviction_.realloc_period > 0 && q != nullptr &&
                      since_realloc_ + n >= eviction_.realloc_period;
  }

  std::vector<PreparedLayer> prepared(static_cast<size_t>(layers));
  // Slots the append takes per slab, net of what its shrinking arrays give back: those slots go
  // straight to the growing arrays of the same slab (shrinks commit first), so an evicting append
  // needs pages only for its net growth.
  SlabPlan slab_plan;
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
      slab_plan.Count(head.rows, static_cast<size_t>(ph.rows_after));
      slab_plan.Count(head.records, ph.record_plan.size());
    }
    if (!p.norms.empty()) {
      const size_t per_slot = layer.norms.slot_bytes() / 4;
      slab_plan.Count(layer.norms, layer.norms.size() + p.norms.size() / per_slot);
    }
  }
  const size_t pages = slab_plan.Pages();
  StatusOr<std::vector<uint32_t>> got = std::vector<uint32_t>{};
  if (pages > 0) got = pool_->AllocateMany(static_cast<uint32_t>(pages));
  // A full pool: slots given back serve only their own slab unless the slabs that shrink are
  // compacted before the growth, which frees their emptied pages for any slab. Worth the copies
  // only when the pool cannot give the pages otherwise; their pages are checked first, since
  // compaction copies what they hold.
  bool compact_between = false;
  if (!got.ok() && slab_plan.PagesCompacting() < pages) {
    if (pool_->checksums()) {
      Status verified =
          pool_->VerifyPages(slab_plan.ShrunkPages(), PageAllocator::VerifyReason::kCopy);
      if (!verified.ok()) return MarkLost(verified);
    }
    const size_t compacting = slab_plan.PagesCompacting();
    StatusOr<std::vector<uint32_t>> tight = std::vector<uint32_t>{};
    if (compacting > 0) tight = pool_->AllocateMany(static_cast<uint32_t>(compacting));
    if (tight.ok()) {
      got = std::move(tight);
      compact_between = true;
    }
  }
  if (!got.ok()) {
    Status exhausted =
        ResourceExhausted("append of ", n, " tokens needs ", pages, " pool pages of ",
                          pool_->page_bytes(), " bytes: ", got.status().message());
    const PoolStats stats = pool_->Stats();
    const int64_t shortfall =
        static_cast<int64_t>(pages) - (int64_t{stats.pages_total} - stats.pages_used);
    last_shortfall_pages_ = std::max<int64_t>(1, shortfall);
    if (relief_rounds <= 0) return exhausted;
    Status relieved = RelievePressure(std::max<int64_t>(1, shortfall));
    if (!relieved.ok()) {
      return ResourceExhausted(exhausted.message(), "; budget.pressure: ", relieved.message());
    }
    // Widths or caps changed: prepare again (narrower new records, or more evicted).
    return AppendOnce(first_position, k, v, q, relief_rounds - 1);
  }
  std::vector<uint32_t> reserved = std::move(got).value();

  // Commit: nothing below can fail. Arrays that shrink go first, so the slots they give back are
  // there for the arrays that grow.
  auto commit_records = [&reserved](HeadStream& head, const PreparedHead& ph) {
    // Records move only down (a kept record lands at or before its old slot), so in order every
    // source is read before its slot is overwritten; shrink only after moving.
    const size_t rb = head.records.slot_bytes();
    const size_t final_records = ph.record_plan.size();
    if (final_records > head.records.size()) head.records.Resize(final_records, &reserved);
    size_t fresh = 0;
    for (size_t i = 0; i < final_records; ++i) {
      const int src = ph.record_plan[i];
      if (src < 0) {
        std::memcpy(head.records.MutableSlot(i), ph.records.data() + fresh++ * rb, rb);
      } else if (static_cast<size_t>(src) != i) {
        std::memcpy(head.records.MutableSlot(i), head.records.Slot(src), rb);
      }
    }
    if (final_records < head.records.size()) head.records.Resize(final_records, &reserved);
  };
  auto commit_rows = [&reserved](HeadStream& head, const PreparedHead& ph) {
    head.rows.Resize(ph.rows_after, &reserved);
    const size_t slot = head.rows.slot_bytes();
    for (size_t i = 0; i < ph.rows.size() / slot; ++i) {
      std::memcpy(head.rows.MutableSlot(ph.write_start + i), ph.rows.data() + i * slot, slot);
    }
  };
  // After the first pass only the growing arrays still differ from their plan, so the same test
  // picks exactly them in the second.
  const auto records_grow = [](const HeadStream& head, const PreparedHead& ph) {
    return ph.record_plan.size() > head.records.size();
  };
  const auto rows_grow = [](const HeadStream& head, const PreparedHead& ph) {
    return static_cast<size_t>(ph.rows_after) > head.rows.size();
  };
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      HeadStream& head = layers_[l]->heads[h];
      const PreparedHead& ph = prepared[l].heads[h];
      if (!records_grow(head, ph)) commit_records(head, ph);
      if (!rows_grow(head, ph)) commit_rows(head, ph);
    }
  }
  if (compact_between) slab_plan.CompactShrunk(&reserved);
  for (int l = 0; l < layers; ++l) {
    LayerState& layer = *layers_[l];
    PreparedLayer& p = prepared[l];
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      HeadStream& head = layer.heads[h];
      PreparedHead& ph = p.heads[h];
      if (records_grow(head, ph)) commit_records(head, ph);
      if (rows_grow(head, ph)) commit_rows(head, ph);
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
      head.usage.budget = ph.budget;
      KVCTL_CHECK(head.count() == static_cast<int64_t>(head.positions.size()));
      KVCTL_CHECK(!eviction_.enabled || head.count() <= ph.budget);
    }
    if (!p.norms.empty()) {
      const size_t per_slot = layer.norms.slot_bytes() / 4;
      const size_t before = layer.norms.size();
      layer.norms.Resize(before + p.norms.size() / per_slot, &reserved);
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
  }
  for (uint32_t page : reserved) KVCTL_CHECK(pool_->Free(page).ok());  // Released, not reused.
  if (tokens_ == 0) first_position_ = first_position;
  tokens_ += n;
  since_realloc_ = ctx.realloc_due ? 0 : since_realloc_ + n;
  // What shrank (flushed tails, evicted tokens) leaves free slots: from a page's worth per slab
  // on they are packed and the emptied pages go back to the pool.
  Status compacted = slabs_.Compact();
  return compacted.ok() ? compacted : MarkLost(compacted);
}

DenseKv KvSequence::FetchDense(int layer_begin, int layer_end) const {
  return Gather(layer_begin, layer_end, /*with_records=*/true);
}

HeadWindow KvSequence::FetchWindow(int layer, int head) const {
  const LayerState& l = *layers_[layer];
  const HeadStream& h = l.heads[head];
  const auto sinks = static_cast<size_t>(h.sink_rows), tail = static_cast<size_t>(h.tail_rows);
  HeadWindow w;
  w.ids = std::span<const uint32_t>(h.rows.ids()).first(sinks + tail);
  const std::span<const int64_t> positions(h.positions);
  w.sink_positions = positions.first(sinks);
  w.tail_positions = positions.last(tail);
  w.dtype = l.row_dtype;
  w.slot_bytes = static_cast<uint32_t>(h.rows.slot_bytes());
  w.slots_per_page = static_cast<uint32_t>(h.rows.slots_per_page());
  return w;
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
  b.record_ids = h.records.ids();
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

int64_t KvSequence::LayerBudget(int layer) const { return layers_[layer]->scoring.layer_budget; }

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
  u.pool_bytes = slabs_.bytes_held();
  for (const auto& layer : layers_) {
    u.payload_bytes += layer->norms.size() * layer->norms.slot_bytes();
    for (const HeadStream& head : layer->heads) {
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
  u.pressure_reliefs = pressure_reliefs_;
  u.pressure_cap_cuts = pressure_cap_cuts_;
  u.lowered_for_others = lowered_for_others_;
  return u;
}

}  // namespace kvctl
