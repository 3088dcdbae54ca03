// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/sequence/kv_sequence.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "controller/sequence/kv_sequence_internal.h"
#include "kernels/convert.h"
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
                          const std::vector<KvTensorView>& v, const std::vector<KvTensorView>* q,
                          bool allow_relief, bool continues) {
  if (!integrity_.ok()) return integrity_;
  // A relief frees what the model predicts; the pages may still fall short (page granularity,
  // another sequence taking pages meanwhile), so a few rounds are allowed.
  Status appended = AppendOnce(first_position, k, v, q,
                               allow_relief && pressure_.lower_widths ? 3 : 0, continues);
  // Even a failed APPEND may have lowered widths (a relief) before failing.
  Status published = Publish();
  return appended.ok() ? published : appended;
}

bool KvSequence::AppendIsLight(int64_t n) const {
  if (!integrity_.ok() || eviction_.enabled) return false;
  // A flush held for after the reply (PrepareHeldFlushStep) lets the tail pass flush_tokens, by
  // a bounded margin.
  const int64_t margin = geometry_.flush_after_reply ? kMaxHeldFlushRows : 0;
  for (const auto& layer : layers_) {
    if (layer->plan.lossless) continue;
    const StreamingRules& rules = layer->plan.rules;
    for (const HeadStream& head : layer->heads) {
      if (TailAfterAppend(head, rules.sink_tokens, n) >= rules.flush_tokens + margin) return false;
    }
  }
  return true;
}

bool KvSequence::HeldFlushDue() const {
  if (!geometry_.flush_after_reply || !integrity_.ok() || eviction_.enabled) return false;
  for (const auto& layer : layers_) {
    if (layer->plan.lossless) continue;
    const StreamingRules& rules = layer->plan.rules;
    for (const HeadStream& head : layer->heads) {
      if (TailAfterAppend(head, rules.sink_tokens, 0) >= rules.flush_tokens) return true;
    }
  }
  return false;
}

bool KvSequence::HeldFlushPending() const {
  if (!HeldFlushDue()) return false;
  return !held_prep_ || held_prep_->publishes != publishes_ ||
         held_prep_->next_layer < geometry_.layers;
}

StatusOr<bool> KvSequence::PrepareHeldFlushStep() {
  if (!HeldFlushDue()) {
    held_prep_.reset();
    return true;
  }
  if (!held_prep_ || held_prep_->publishes != publishes_) {
    held_prep_ = std::make_unique<HeldFlushPrep>();
    held_prep_->publishes = publishes_;
    held_prep_->layers.resize(static_cast<size_t>(geometry_.layers));
  }
  if (held_prep_->next_layer == geometry_.layers) return true;
  // An append of no tokens: a layer whose tail holds flush_tokens rows or more flushes whole
  // flush_tokens groups from its stored rows; the others prepare nothing.
  const AppendContext ctx;
  const int l = held_prep_->next_layer;
  if (Status checked = CheckFlushedTails(ctx, l, l + 1); !checked.ok()) {
    held_prep_.reset();
    return MarkLost(checked);
  }
  Status prepared = AppendLayerPrepare(l, ctx, KvTensorView{}, KvTensorView{}, nullptr,
                                       &held_prep_->layers[static_cast<size_t>(l)]);
  if (!prepared.ok()) {
    held_prep_.reset();
    return prepared.code() == StatusCode::kDataLoss ? MarkLost(prepared) : prepared;
  }
  return ++held_prep_->next_layer == geometry_.layers;
}

Status KvSequence::CommitPreparedFlush() {
  if (!held_prep_) return OkStatus();
  const std::unique_ptr<HeldFlushPrep> prep = std::move(held_prep_);
  if (prep->publishes != publishes_ || prep->next_layer < geometry_.layers) return OkStatus();
  SlabPlan plan;
  for (int l = 0; l < geometry_.layers; ++l) CountSlots(l, prep->layers[l], &plan);
  StatusOr<Reservation> reserved = ReservePages(plan);
  if (reserved.status().code() == StatusCode::kResourceExhausted) return OkStatus();
  KVCTL_RETURN_IF_ERROR(reserved.status());  // DATA_LOSS, already marked.
  CommitAppend(first_position_ + tokens_, AppendContext{}, &prep->layers, plan,
               std::move(reserved).value());
  Status compacted = slabs_.Compact();
  return compacted.ok() ? compacted : MarkLost(compacted);
}

void KvSequence::CollectRanges(int layer_begin, int layer_end,
                               std::vector<PageAllocator::PageRange>* ranges) const {
  auto add = [ranges](const SlotArray& array) { array.AppendRanges(0, array.size(), ranges); };
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

Status KvSequence::Verify(int layer_begin, int layer_end, PageAllocator::VerifyBudget* budget) {
  if (!integrity_.ok() || !pool_->checksums()) return integrity_;
  // pool.verify_on_fetch = "unverified" checks what was written since the last FETCH. When that is
  // nothing (no write by this sequence, no mismatch anywhere in the pool since these layers were
  // verified: a decode step's repeated FETCHes between APPENDs), the walk over every slot's chunk
  // bits would find them all set; skip it.
  if (pool_->fetch_verify() != PageAllocator::FetchVerify::kUnverified) {
    return VerifyUncached(layer_begin, layer_end, budget);
  }
  // Read before the walk: a mismatch counted after it sends the next FETCH through the walk.
  const VerifiedStamp now{.writes = slabs_.writes(), .failures = pool_->checksum_failures()};
  layer_verified_.resize(layers_.size());
  const auto first = layer_verified_.begin() + layer_begin;
  const auto end = layer_verified_.begin() + layer_end;
  if (std::all_of(first, end, [&now](const VerifiedStamp& s) { return s == now; })) {
    return OkStatus();
  }
  Status verified = VerifyUncached(layer_begin, layer_end, budget);
  if (verified.ok() && (budget == nullptr || !budget->exceeded)) std::fill(first, end, now);
  return verified;
}

Status KvSequence::VerifyUncached(int layer_begin, int layer_end,
                                  PageAllocator::VerifyBudget* budget) {
  Status verified;
  if (layer_begin == 0 && layer_end == geometry_.layers && lender_ == nullptr) {
    std::vector<uint32_t> pages;
    slabs_.CollectPages(&pages);
    verified = pool_->VerifyPages(pages, PageAllocator::VerifyReason::kFetch, budget);
  } else {
    // Slabs share pages between layers: check only the chunks this range's slots lie in (which
    // include the slots borrowed from a prefix, in the lender's pages).
    // Per thread, kept between FETCHes so that a FETCH allocates nothing for it (a few hundred
    // KB at most: one range per slot of the layers asked for), and bounded by the thread count
    // rather than the sequence count, so host-memory accounting is not affected.
    thread_local std::vector<PageAllocator::PageRange> ranges;
    ranges.clear();
    CollectRanges(layer_begin, layer_end, &ranges);
    verified = pool_->VerifyRanges(ranges, PageAllocator::VerifyReason::kFetch, budget);
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
  if (*wrapped && lender_ != nullptr) {
    std::vector<PageAllocator::PageRange> ranges;
    CollectBorrowedRanges(&ranges);
    for (const PageAllocator::PageRange& r : ranges) bytes += r.end - r.begin;
    verified = pool_->VerifyRanges(ranges, PageAllocator::VerifyReason::kScrub);
    if (!verified.ok()) return MarkLost(verified);
  }
  return bytes;
}

Status KvSequence::Publish() {
  ++publishes_;  // Invalidates a held flush prepared for the state before this write.
  std::vector<uint32_t> pages;
  slabs_.TakeTouchedPages(&pages);  // Always taken, so the list stays short.
  if (!pool_->mirrored() && !pool_->checksums()) return OkStatus();
  if (publish_all_) {
    pages.clear();
    slabs_.CollectPages(&pages);
  }
  if (pool_->checksums()) {
    Status sealed = pool_->SealPages(pages);
    return sealed.ok() ? sealed : MarkLost(sealed);
  }
  Status published = pool_->PublishPages(std::move(pages));
  publish_all_ = !published.ok();
  if (published.ok()) return OkStatus();
  return Unavailable("pool.backend: copying the sequence's changed pages to the device failed (",
                     published.message(),
                     "); the daemon's copy holds the change, the device copy is stale until the "
                     "next successful request on this sequence");
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

DenseKv KvSequence::FetchDense(int layer_begin, int layer_end) const {
  DenseKv out;
  out.counts = DenseCounts(layer_begin, layer_end);
  size_t rows = 0;
  for (uint32_t c : out.counts) rows += c;
  out.positions.resize(rows);
  out.k.resize(rows * geometry_.head_dim);
  out.v.resize(rows * geometry_.head_dim);
  FetchDenseInto(layer_begin, layer_end,
                 {DType::kF32, out.k.data(), out.v.data(), out.positions.data()});
  return out;
}

std::vector<uint32_t> KvSequence::DenseCounts(int layer_begin, int layer_end) const {
  std::vector<uint32_t> counts;
  for (int l = layer_begin; l < layer_end; ++l) {
    for (const HeadStream& head : layers_[l]->heads) {
      const size_t records = head.records.size();
      counts.push_back(static_cast<uint32_t>(head.sink_rows + records * head.spec.block_tokens +
                                             head.tail_rows));
    }
  }
  return counts;
}

void KvSequence::FetchDenseInto(int layer_begin, int layer_end, const DenseOut& out) const {
  FetchDenseUnitsInto(layer_begin, layer_end, out, 0, SIZE_MAX);
}

namespace {

// Units of stored rows: a run of n rows is ceil(n / kDenseRowsPerUnit) units.
constexpr size_t kDenseRowsPerUnit = 256;
size_t RowUnits(size_t rows) { return (rows + kDenseRowsPerUnit - 1) / kDenseRowsPerUnit; }

// One record's K and V rows into `kd` / `vd` as `dtype`: decoded in place (fp32 at float
// alignment), straight into fp16, or through `scratch` (2 * block_tokens * head_dim floats).
void DecodeRecordRows(const QuantSpec& spec, const uint8_t* record, const float* norms, DType dtype,
                      bool decode_in_place, std::vector<float>& scratch, uint8_t* kd, uint8_t* vd) {
  if (decode_in_place) {
    DequantizeBlock(spec, record, norms, reinterpret_cast<float*>(kd),
                    reinterpret_cast<float*>(vd));
    return;
  }
  if (dtype == DType::kF16) {
    DequantizeBlockHalves(spec, record, norms, kd, vd);
    return;
  }
  const size_t block = static_cast<size_t>(spec.block_tokens) * spec.head_dim;
  DequantizeBlock(spec, record, norms, scratch.data(), scratch.data() + block);
  ConvertElements(DType::kF32, scratch.data(), dtype, kd, block);
  ConvertElements(DType::kF32, scratch.data() + block, dtype, vd, block);
}

}  // namespace

size_t KvSequence::DenseUnits(int layer_begin, int layer_end) const {
  size_t units = 0;
  for (int l = layer_begin; l < layer_end; ++l) {
    for (const HeadStream& head : layers_[l]->heads) {
      units += RowUnits(head.sink_rows) + head.records.size() + RowUnits(head.tail_rows) + 1;
    }
  }
  return units;
}

void KvSequence::FetchDenseUnitsInto(int layer_begin, int layer_end, const DenseOut& out,
                                     size_t unit_begin, size_t unit_end) const {
  const int d = geometry_.head_dim;
  const size_t width = DTypeSize(out.dtype);
  auto* kd = static_cast<uint8_t*>(out.k);
  auto* vd = static_cast<uint8_t*>(out.v);
  auto* pd = static_cast<uint8_t*>(out.positions);
  // A record decodes straight into fp16 output (DequantizeBlockHalves) and fp32 output at float
  // alignment; any other output decodes into fp32 here and is converted from there. Per thread and
  // kept: a fresh buffer per request would be page-faulted in again whenever the allocator hands
  // back trimmed memory.
  thread_local std::vector<float> scratch;
  const bool decode_in_place = out.dtype == DType::kF32 &&
                               reinterpret_cast<uintptr_t>(kd) % alignof(float) == 0 &&
                               reinterpret_cast<uintptr_t>(vd) % alignof(float) == 0;
  // Units before unit_begin are stepped over (a whole (layer, head) at once), and the walk ends
  // at unit_end, so a caller that splits a FETCH into many ranges pays little per range.
  size_t unit = 0;  // Of the next unit; FetchDenseUnitsInto's header counts them.
  const size_t row_out = static_cast<size_t>(d) * width;
  for (int l = layer_begin; l < layer_end; ++l) {
    const LayerState& layer = *layers_[l];
    for (const HeadStream& head : layer.heads) {
      if (unit >= unit_end) return;
      const size_t records = head.records.size();
      const size_t rows = head.sink_rows + records * head.spec.block_tokens + head.tail_rows;
      const size_t count = head.positions.size();  // One per row.
      const size_t pair_units = RowUnits(head.sink_rows) + records + RowUnits(head.tail_rows) + 1;
      if (unit + pair_units <= unit_begin) {
        kd += rows * row_out;
        vd += rows * row_out;
        pd += count * sizeof(int64_t);
        unit += pair_units;
        continue;
      }
      // Stored rows [first, first + n), kDenseRowsPerUnit to a unit.
      auto copy_rows = [&](size_t first, size_t n) {
        for (size_t r0 = 0; r0 < n; r0 += kDenseRowsPerUnit, ++unit) {
          const size_t rows_here = std::min(kDenseRowsPerUnit, n - r0);
          if (unit >= unit_begin && unit < unit_end) {
            for (size_t i = 0; i < rows_here; ++i) {
              const uint8_t* slot = head.rows.Slot(first + r0 + i);
              ConvertElements(layer.row_dtype, slot, out.dtype, kd + i * row_out, d);
              ConvertElements(layer.row_dtype, slot + layer.row_bytes, out.dtype, vd + i * row_out,
                              d);
            }
          }
          kd += rows_here * row_out;
          vd += rows_here * row_out;
        }
      };
      copy_rows(0, head.sink_rows);
      const int g = head.spec.block_tokens;
      const size_t block = static_cast<size_t>(g) * d;
      if (records > 0 && !decode_in_place && out.dtype != DType::kF16 &&
          scratch.size() < 2 * block) {
        scratch.resize(2 * block);
      }
      // Record r is unit `unit + r` here.
      const size_t first = unit_begin > unit ? std::min(records, unit_begin - unit) : 0;
      const size_t last = std::min(records, unit_end > unit ? unit_end - unit : 0);
      kd += first * block * width;
      vd += first * block * width;
      for (size_t r = first; r < last; ++r, kd += block * width, vd += block * width) {
        const float* norms =
            layer.norms.size() > 0 ? reinterpret_cast<const float*>(layer.norms.Slot(r)) : nullptr;
        DecodeRecordRows(head.spec, head.records.Slot(r), norms, out.dtype, decode_in_place,
                         scratch, kd, vd);
      }
      kd += (records - std::max(first, last)) * block * width;
      vd += (records - std::max(first, last)) * block * width;
      unit += records;
      copy_rows(head.sink_rows, head.tail_rows);
      // The positions (a unit of their own): one per kept token, in the order of the rows (sinks,
      // records, tail).
      if (count > 0 && unit >= unit_begin && unit < unit_end) {
        std::memcpy(pd, head.positions.data(), count * sizeof(int64_t));
      }
      pd += count * sizeof(int64_t);
      ++unit;
    }
  }
}

HeadBlocks KvSequence::Blocks(int layer, int head) const {
  const LayerState& l = *layers_[layer];
  const HeadStream& h = l.heads[head];
  HeadBlocks b;
  b.record_ids = h.records.ids();
  b.records_stamp = h.records.stamp();
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

const RedundancyState& KvSequence::RedundancyStateOf(int layer, int head) const {
  return layers_[layer]->heads[head].redundancy;
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

int64_t KvSequence::KeptTokens() const {
  int64_t kept = 0;
  for (const auto& layer : layers_) {
    for (const HeadStream& head : layer->heads) kept += head.count();
  }
  return kept;
}

int64_t KvSequence::QuantizedTokens() const {
  if (layers_.empty() || layers_[0]->heads.empty()) return 0;
  const HeadStream& h0 = layers_[0]->heads[0];
  return static_cast<int64_t>(h0.records.size()) * h0.spec.block_tokens;
}

SequenceUsage KvSequence::Usage() const {
  SequenceUsage u;
  u.tokens = tokens_;
  u.pool_bytes = slabs_.bytes_held();
  for (const auto& layer : layers_) {
    u.payload_bytes += layer->norms.size() * layer->norms.slot_bytes();
    u.shared_bytes += layer->norms.borrowed() * layer->norms.slot_bytes();
    for (const HeadStream& head : layer->heads) {
      u.payload_bytes += head.rows.size() * head.rows.slot_bytes() +
                         head.records.size() * head.records.slot_bytes();
      u.shared_bytes += head.rows.borrowed() * head.rows.slot_bytes() +
                        head.records.borrowed() * head.records.slot_bytes();
      u.evicted_tokens += head.usage.evicted_tokens;
      u.evicted_bytes += head.usage.evicted_bytes;
    }
  }
  u.quantized_tokens = QuantizedTokens();
  u.kept_tokens = KeptTokens();
  u.elements = 2 * static_cast<uint64_t>(u.kept_tokens) * geometry_.head_dim;
  u.pressure_reliefs = pressure_reliefs_;
  u.pressure_cap_cuts = pressure_cap_cuts_;
  u.lowered_for_others = lowered_for_others_;
  u.deferred_tokens = deferred_tokens_;
  u.deferred_appends = deferred_appends_;
  u.deferral_cap_hits = deferral_cap_hits_;
  return u;
}

}  // namespace kvctl
