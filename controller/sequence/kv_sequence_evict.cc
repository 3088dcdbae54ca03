// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The eviction half of an append's Prepare (KvSequence::AppendLayerPrepare drives both halves,
// kv_sequence_append.cc): decoding what scoring reads, per-head budgets, H2O's accumulated
// attention, head re-allocation, scoring and the eviction itself, and the plan of which records
// and rows each head keeps. Everything goes into the layer's PreparedLayer; nothing stored changes.
#include <algorithm>
#include <cstring>

#include "controller/sequence/kv_sequence.h"
#include "controller/sequence/kv_sequence_internal.h"
#include "kernels/convert.h"
#include "kernels/quantize.h"

namespace kvctl {

void KvSequence::CheckLayerSlots(LayerPrep& p) const {
  if (!pool_->checksums() || p.checked) return;
  p.checked = true;
  // Every head's at once: a step's rows of a layer's heads lie side by side, so one check per
  // head would read each chunk once per head.
  std::vector<PageAllocator::PageRange> ranges;
  CollectRanges(p.l, p.l + 1, &ranges);
  if (ranges.empty()) return;
  Status checked = pool_->VerifyRanges(ranges, PageAllocator::VerifyReason::kRewrite);
  if (!checked.ok()) p.loss = checked;
}

KeyRows KvSequence::FullKeys(LayerPrep& p, int h) const {
  // Records' K only: scoring reads keys, and most records are kept whole (moved by their bytes),
  // so their V would be decoded for nothing (about a tenth of R-KV's step at 8K).
  if (!p.have_records[h]) {
    CheckLayerSlots(p);
    Materialize(p.layer, h, 0, p.k, p.v, p.all_k[h], p.all_v[h], RecordRows::kKeys);
    p.record_values[h].assign(p.layer.heads[h].records.size(), 0);
    KeysAsStored(p, h);
  }
  p.have_all[h] = p.have_records[h] = true;
  const float* keys = p.stored_k[h].empty() ? p.all_k[h] : p.stored_k[h].data();
  return KeyRows{keys, p.layer.heads[h].count() + p.n, geometry_.head_dim};
}

void KvSequence::KeysAsStored(LayerPrep& p, int h) const {
  // R-KV's redundancy state is reused by the next scoring for the rows whose unit keys are
  // unchanged (policies/redundancy.h). Rows scored as fp16 and then quantized all change, so the
  // first decode-time scoring after a prefill scanned every row afresh: at 8K on SmolLM2 ten times
  // the similarities of one that reuses the state (docs/kvbench_ipc.md "The prefill's keys as
  // they will be stored"). A token-separable method quantizes each token on its own (the same
  // bytes in whatever record it lands: CopyRecordToken), so a row's quantized key is known before
  // the eviction decides which record that is: the scorer reads it, decoded as FullKeys decodes
  // records. Sinks stay fp16 and are scored as they are. Rows the flush leaves in the fp16 tail
  // are scored by this key too: they hold it from the next flush on (until then they differ, and
  // the next scoring rescans them). Any failure leaves the rows scored as they are.
  const HeadStream& head = p.layer.heads[h];
  const QuantSpec& spec = head.spec;
  if (eviction_.policy != EvictPolicy::kRKV || head.records.size() > 0 || p.layer.plan.lossless ||
      spec.method == QuantMethod::kFp16 || !TokenSeparable(spec.method)) {
    return;
  }
  const int64_t g = spec.block_tokens, d = geometry_.head_dim, total = head.count() + p.n;
  const int64_t first = std::min<int64_t>(p.layer.plan.rules.sink_tokens, total);
  const int64_t rows = total - first, blocks = (rows + g - 1) / g;
  if (rows <= 0) return;
  // Whole blocks: the last one padded with copies of the last row (each token's bytes are its own).
  std::vector<uint16_t> halves(static_cast<size_t>(blocks * g * d));
  ConvertElements(DType::kF32, p.all_k[h] + first * d, DType::kF16, halves.data(), rows * d);
  for (int64_t j = rows; j < blocks * g; ++j) {
    std::copy_n(&halves[(rows - 1) * d], d, &halves[j * d]);
  }
  const size_t record_bytes = BlockLayoutOf(spec).record_bytes;
  std::vector<uint8_t> records(record_bytes * static_cast<size_t>(blocks));
  const BlockBatch batch{.row_stride = d,
                         .block_stride = g * d,
                         .n_blocks = static_cast<int>(blocks),
                         .k_f16 = halves.data(),
                         .v_f16 = halves.data()};  // V's codes are not read.
  if (!QuantizeBlocks(spec, batch, records.data()).ok()) return;
  std::vector<float>& out = p.stored_k[h];
  out.assign(p.all_k[h], p.all_k[h] + total * d);
  std::vector<float> block(static_cast<size_t>(g * d));
  for (int64_t b = 0; b < blocks; ++b) {
    DecodeRecordRounded(spec, records.data() + b * record_bytes, nullptr, true, block.data(),
                        nullptr, block.size());
    std::copy_n(block.data(), std::min(g, rows - b * g) * d, out.data() + (first + b * g) * d);
  }
}

void KvSequence::RecordValues(LayerPrep& p, int h, const std::vector<int64_t>& tokens, size_t begin,
                              size_t end) const {
  // No record was read (or no eviction: nothing decoded): nothing of them is needed.
  if (static_cast<size_t>(h) >= p.have_records.size() || !p.have_records[h]) return;
  const HeadStream& head = p.layer.heads[h];
  const int g = head.spec.block_tokens, d = geometry_.head_dim;
  const int64_t rec_begin = head.sink_rows;
  const int64_t rec_end = rec_begin + static_cast<int64_t>(head.records.size()) * g;
  std::vector<uint8_t>& done = p.record_values[h];
  std::vector<float> bk, bv;
  for (size_t i = begin; i < end; ++i) {
    const int64_t j = tokens[i];
    if (j < rec_begin || j >= rec_end) continue;
    const auto r = static_cast<size_t>((j - rec_begin) / g);
    if (done[r] != 0) continue;
    done[r] = 1;
    bk.resize(static_cast<size_t>(g) * d);
    bv.resize(bk.size());
    const float* norms =
        p.layer.norms.size() > 0 ? reinterpret_cast<const float*>(p.layer.norms.Slot(r)) : nullptr;
    DecodeRecordRounded(head.spec, head.records.Slot(r), norms, !p.layer.plan.lossless, bk.data(),
                        bv.data(), bk.size());
    std::memcpy(p.all_v[h] + (rec_begin + static_cast<int64_t>(r) * g) * d, bv.data(),
                sizeof(float) * bv.size());
  }
}

void KvSequence::RowsPastRecords(LayerPrep& p, int h) const {
  if (!p.have_all[h]) {
    CheckLayerSlots(p);
    Materialize(p.layer, h, 0, p.k, p.v, p.all_k[h], p.all_v[h], RecordRows::kZeros);
  }
  p.have_all[h] = true;
}

int64_t KvSequence::WholeRecordTarget(const LayerPrep& p, int h, int64_t total, int64_t target,
                                      int64_t protect) const {
  // Streaming evicts the oldest candidates, the first tokens after the sinks: when those are the
  // first records' tokens and the cut falls inside a record, every record behind it would be
  // decoded and quantized again (records hold consecutive tokens). Evicting to the next record
  // boundary drops whole records instead: up to block_tokens - 1 more tokens go, never fewer.
  const HeadStream& head = p.layer.heads[h];
  const int64_t g = head.spec.block_tokens;
  const int64_t record_tokens = static_cast<int64_t>(head.records.size()) * g;
  const int64_t evict = total - target;
  if (!eviction_.whole_records || p.layer.plan.lossless || eviction_.sinks != head.sink_rows ||
      evict <= 0 || evict >= record_tokens) {
    return target;
  }
  const int64_t whole = (evict + g - 1) / g * g;
  return total - whole >= protect ? total - whole : target;
}

StatusOr<KvTensorView> KvSequence::RecentQueries(const LayerPrep& p, int64_t rows, int h) const {
  // The last `rows` query rows as the [rows, g, D] group of KV head h.
  const size_t q_row = static_cast<size_t>(geometry_.q_heads) * geometry_.head_dim;
  const KvTensorView all =
      KvTensorView::Contiguous(NewestQueries(p.layer.queries, q_row, rows, &p.out->queries),
                               DType::kF32, rows, geometry_.q_heads, geometry_.head_dim);
  return QueryGroup(all, geometry_.kv_heads, h);
}

bool KvSequence::IsFullHead(int l, int h) const {
  return !eviction_.full_head.empty() &&
         eviction_.full_head[static_cast<size_t>(l) * geometry_.kv_heads + h] != 0;
}

int KvSequence::FullHeadsOf(int l) const {
  if (eviction_.full_head.empty()) return 0;
  const auto first = eviction_.full_head.begin() + static_cast<ptrdiff_t>(l) * geometry_.kv_heads;
  return static_cast<int>(std::count(first, first + geometry_.kv_heads, uint8_t{1}));
}

Status KvSequence::PlanHeadBudgets(LayerPrep& p) const {
  // The layer's share of this append's budget, split over heads by the (re)allocator; joint
  // sequences have fixed caps per head.
  const EvictionSettings& ev = eviction_;
  const int heads = geometry_.kv_heads;
  LayerScoring& scoring = p.out->scoring;
  p.budget.assign(static_cast<size_t>(heads), 0);
  scoring.layer_budget = p.ctx.layer_budgets[p.l];
  if (!ev.head_caps.empty()) {
    for (int h = 0; h < heads; ++h) {
      p.budget[h] = ev.head_caps[static_cast<size_t>(p.l) * heads + h];
    }
    return OkStatus();
  }
  if (!ev.full_head.empty()) {
    // A full head's budget is every token seen, so it never compresses; the layer's budget (of
    // its other heads) is split evenly among them, the remainder to the first.
    const int64_t seen = tokens_ + p.ctx.n;
    const int64_t others = heads - FullHeadsOf(p.l);
    int64_t k = 0;
    for (int h = 0; h < heads; ++h) {
      if (IsFullHead(p.l, h)) {
        p.budget[h] = seen;
      } else {  // others >= 1 here.
        p.budget[h] = scoring.layer_budget / others + (k++ < scoring.layer_budget % others);
      }
    }
    return OkStatus();
  }
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
  for (int h = 0; h < heads; ++h) p.budget[h] = scoring.realloc->budgets()[h];
  return OkStatus();
}

Status KvSequence::FoldH2O(LayerPrep& p) const {
  // H2O: fold the pending queries into every head's accumulated attention (at least once per
  // compression period, and always before scoring).
  const EvictionSettings& ev = eviction_;
  // A deferred append (APPEND_CONTINUES) folds its queries now, so a long prefill holds no more
  // query rows than one chunk's: UpdateH2O adds each query's softmax to the accumulators in query
  // order, so folding in chunks sums exactly what one fold of every query would.
  LayerScoring& scoring = p.out->scoring;
  bool any_over = p.ctx.defer;
  for (int h = 0; h < geometry_.kv_heads && !p.ctx.defer; ++h) any_over |= Compresses(p, h);
  if (ev.policy != EvictPolicy::kH2O || scoring.h2o_pending == 0 ||
      !(any_over || p.ctx.ReallocDue(p.l) || scoring.h2o_pending >= ev.compression_period)) {
    return OkStatus();
  }
  for (int h = 0; h < geometry_.kv_heads; ++h) {
    PreparedHead& ph = p.out->heads[h];
    ph.h2o = p.layer.heads[h].h2o;
    KVCTL_ASSIGN_OR_RETURN(KvTensorView gq, RecentQueries(p, scoring.h2o_pending, h));
    Status s = UpdateH2O(&ph.h2o, FullKeys(p, h), gq);
    if (!s.ok()) return WithLayerHead(p.l, h, s);
    ph.h2o_changed = true;
  }
  scoring.h2o_pending = 0;
  return OkStatus();
}

const H2OState* KvSequence::H2OOf(const LayerPrep& p, int h) const {
  const PreparedHead& ph = p.out->heads[h];
  return ph.h2o_changed ? &ph.h2o : &p.layer.heads[h].h2o;
}

RedundancyState* KvSequence::RedundancyOf(LayerPrep& p, int h) const {
  if (eviction_.policy != EvictPolicy::kRKV) return nullptr;
  PreparedHead& ph = p.out->heads[h];
  if (!ph.redundancy_changed) {
    ph.redundancy = p.layer.heads[h].redundancy;  // A copy: the head's stays until the commit.
    ph.redundancy_changed = true;
  }
  return &ph.redundancy;
}

Status KvSequence::ReallocateHeads(LayerPrep& p) const {
  // Online head re-allocation from the retained-mass curve of each head's own scorer: greedy =
  // the split that retains the most observed mass (its excess over the floor is the utility, so
  // the EMA smooths budgets); proportional = utility is the mass avg/4 more tokens would win back.
  const EvictionSettings& ev = eviction_;
  const int heads = geometry_.kv_heads;
  LayerScoring& scoring = p.out->scoring;
  std::vector<double> utility(heads, 0.0);
  std::vector<RetainedMassCurve> curves(heads);
  for (int h = 0; h < heads; ++h) {
    const KeyRows keys = FullKeys(p, h);
    KVCTL_ASSIGN_OR_RETURN(KvTensorView gq, RecentQueries(p, p.obs, h));
    StatusOr<std::vector<double>> mass = TokenAttentionMass(keys, gq);
    StatusOr<std::vector<float>> scores =
        ScoreHead(ev, keys, &gq, H2OOf(p, h), p.regions, RedundancyOf(p, h));
    if (!mass.ok()) return WithLayerHead(p.l, h, mass.status());
    if (!scores.ok()) return WithLayerHead(p.l, h, scores.status());
    const std::vector<uint8_t> mask = ProtectedMask(keys.tokens, p.regions);
    KVCTL_ASSIGN_OR_RETURN(RetainedMassCurve curve, ComputeRetainedMassCurve(*mass, *scores, mask));
    utility[h] = HeadUtility(curve, p.budget[h], std::max<int64_t>(1, p.ctx.avg_budget / 4));
    curves[h] = std::move(curve);
  }
  if (ev.realloc_greedy) {
    std::vector<int64_t> reach(heads);
    for (int h = 0; h < heads; ++h) {
      reach[h] = p.layer.heads[h].count() + p.n + std::max<int64_t>(1, ev.realloc_period);
    }
    KVCTL_ASSIGN_OR_RETURN(std::vector<int64_t> greedy,
                           GreedyHeadBudgets(curves, scoring.layer_budget, ev.floor,
                                             std::max<int64_t>(1, p.ctx.avg_budget / 16), reach));
    for (int h = 0; h < heads; ++h) utility[h] = static_cast<double>(greedy[h] - ev.floor);
  }
  KVCTL_RETURN_IF_ERROR(scoring.realloc->Update(utility));
  scoring.has_utility = true;
  for (int h = 0; h < heads; ++h) p.budget[h] = scoring.realloc->budgets()[h];
  return OkStatus();
}

bool KvSequence::Compresses(const LayerPrep& p, int h) const {
  // A full head's budget is every token seen: it never overflows, and its layer's scheduled turn
  // (evict.stagger_layers) would otherwise cut it to that budget less the compression headroom.
  if (IsFullHead(p.l, h)) return false;
  const int64_t total = p.layer.heads[h].count() + p.n;
  if (total > p.budget[h]) return true;
  if (!p.ctx.CompressDue(p.l)) return false;
  // What EvictHead compresses to (its protected tokens at least): nothing to do at or below it.
  const EvictionSettings& ev = eviction_;
  return total > std::max(p.budget[h] - (ev.compression_period - 1), ev.sinks + ev.window);
}

Status KvSequence::EvictHead(LayerPrep& p, int h, std::vector<uint8_t>* keep) const {
  // Scores head h's old and new tokens and keeps its budget (less the compression headroom),
  // protected sinks and recent window first; records what the eviction drops.
  const EvictionSettings& ev = eviction_;
  const HeadStream& head = p.layer.heads[h];
  PreparedHead& ph = p.out->heads[h];
  const int64_t total = head.count() + p.n;
  // Streaming scores by position: without queries to measure the kept mass with, no key is
  // decoded for scoring.
  const bool positional = ev.policy == EvictPolicy::kStreaming && !p.have_q;
  const KeyRows keys = positional ? KeyRows{nullptr, total, geometry_.head_dim} : FullKeys(p, h);
  const std::vector<uint8_t> mask = ProtectedMask(total, p.regions);
  const int64_t protect = std::count(mask.begin(), mask.end(), uint8_t{1});
  int64_t target = std::max(protect, p.budget[h] - (ev.compression_period - 1));
  if (ev.policy == EvictPolicy::kStreaming)
    target = WholeRecordTarget(p, h, total, target, protect);
  std::optional<KvTensorView> gq;
  if (p.have_q) {
    KVCTL_ASSIGN_OR_RETURN(gq, RecentQueries(p, p.obs, h));
  }
  RedundancyState* redundancy = RedundancyOf(p, h);
  StatusOr<std::vector<float>> scores =
      ScoreHead(ev, keys, gq ? &*gq : nullptr, H2OOf(p, h), p.regions, redundancy);
  if (!scores.ok()) return WithLayerHead(p.l, h, scores.status());
  StatusOr<std::vector<int64_t>> kept = SelectKeep(*scores, target, mask);
  if (!kept.ok()) return WithLayerHead(p.l, h, kept.status());
  ph.kept = std::move(*kept);
  ph.evicted = true;
  // The retained mass is telemetry, and measuring it costs about what SnapKV's scoring does (a
  // softmax per observation query and group head over every key): like the records' errors it is
  // sampled, on a head's first compression (usually the prefill's) and every Nth after it.
  const int period = geometry_.quality_sample_period;
  if (gq && period > 0 && head.usage.compressions % static_cast<uint64_t>(period) == 0) {
    StatusOr<std::vector<double>> mass = TokenAttentionMass(keys, *gq);
    if (!mass.ok()) return WithLayerHead(p.l, h, mass.status());
    ph.retained = *RetainedMass(*mass, ph.kept);
  }
  if (ev.policy == EvictPolicy::kH2O) {
    if (!ph.h2o_changed) ph.h2o = head.h2o;
    ph.h2o.acc.resize(static_cast<size_t>(total), 0.0);
    KVCTL_RETURN_IF_ERROR(CompactH2O(&ph.h2o, ph.kept));
    ph.h2o_changed = true;
  }
  if (redundancy != nullptr) {
    // The state covers the first rows() tokens (all of them unless nothing was scored); kept
    // tokens past them are new to the next scoring either way.
    const auto below = std::lower_bound(ph.kept.begin(), ph.kept.end(), redundancy->rows());
    KVCTL_RETURN_IF_ERROR(CompactRedundancy(redundancy, {ph.kept.begin(), below}));
  }
  // The scored keys are done with: what the compaction reads is all_k.
  p.stored_k[h] = std::vector<float>();
  keep->assign(static_cast<size_t>(total), 0);
  for (int64_t j : ph.kept) (*keep)[j] = 1;
  const int g = head.spec.block_tokens;
  const int64_t rec_end = head.sink_rows + static_cast<int64_t>(head.records.size()) * g;
  // The rows the compaction reads (PlanHeadRecords, PlanHeadRows): a record is decoded only
  // when it is partly evicted or follows one.
  bool whole_records = true;
  for (int64_t base = head.sink_rows; base < rec_end && whole_records; base += g) {
    const auto kept_here = std::count(keep->begin() + base, keep->begin() + base + g, uint8_t{1});
    whole_records = kept_here == 0 || kept_here == g;
  }
  if (whole_records) {
    RowsPastRecords(p, h);
  } else {
    FullKeys(p, h);
  }
  const uint64_t record_share = BlockLayoutOf(head.spec).record_bytes / g;
  for (int64_t j = 0; j < total; ++j) {
    if ((*keep)[j]) continue;
    ++ph.evicted_tokens;
    const bool in_record = j >= head.sink_rows && j < rec_end && !p.layer.plan.lossless;
    ph.evicted_bytes += in_record ? record_share : 2 * p.layer.row_bytes;
  }
  return OkStatus();
}

void KvSequence::PlanHeadRecords(LayerPrep& p, int h, const std::vector<uint8_t>& keep,
                                 std::vector<int64_t>* loose) const {
  // A record whose tokens all stay keeps its bytes (in place, or moved down past dropped ones);
  // one that lost every token is dropped; the kept tokens of the others are re-packed, in order,
  // into fresh records (moved byte for byte for a token-separable method, else decoded as fp16
  // and quantized again), the rest left in *loose (token indices into p.all_k / p.all_v). A whole
  // record kept after loose tokens is re-packed too, since records hold consecutive kept tokens.
  const HeadStream& head = p.layer.heads[h];
  PreparedHead& ph = p.out->heads[h];
  const int g = head.spec.block_tokens, d = geometry_.head_dim;
  const int records = static_cast<int>(head.records.size());
  if (!ph.evicted) {
    ph.records_in_place = static_cast<size_t>(records);
    return;
  }
  // Tokens of *loose before `packed` went into records already; they are dropped at the end.
  size_t packed = 0;
  // A token-separable method's kept tokens move into the new records byte for byte: no decode
  // for the re-pack, no second rounding (kernels/quant_types.h TokenSeparable).
  const bool move_tokens = TokenSeparable(head.spec.method) && !p.layer.plan.lossless;
  const BlockLayout layout = move_tokens ? BlockLayoutOf(head.spec) : BlockLayout{};
  for (int r = 0; r < records; ++r) {
    const int64_t base = head.sink_rows + static_cast<int64_t>(r) * g;
    const int kept_here =
        static_cast<int>(std::count(keep.begin() + base, keep.begin() + base + g, uint8_t{1}));
    if (kept_here == g && loose->size() == packed) {
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
      loose->push_back(j);
      ++ph.decoded_tokens;
    }
    if (loose->size() - packed >= static_cast<size_t>(g)) {
      if (move_tokens) {
        const size_t at = ph.moved.size();
        ph.moved.resize(at + layout.record_bytes, 0);
        for (int t = 0; t < g; ++t) {
          const int64_t j = (*loose)[packed + static_cast<size_t>(t)] - head.sink_rows;
          CopyRecordToken(head.spec, layout, head.records.Slot(static_cast<size_t>(j / g)),
                          static_cast<int>(j % g), ph.moved.data() + at, t);
        }
        ph.decoded_tokens -= static_cast<uint64_t>(g);
        ph.record_plan.push_back(PreparedHead::kMovedRecord);
      } else {
        RecordValues(p, h, *loose, packed, packed + g);
        AppendRowsAsHalves(p.all_k[h], d, *loose, packed, packed + g, &ph.qk);
        AppendRowsAsHalves(p.all_v[h], d, *loose, packed, packed + g, &ph.qv);
        ph.record_plan.push_back(PreparedHead::kNewRecord);
      }
      packed += static_cast<size_t>(g);
    }
  }
  loose->erase(loose->begin(), loose->begin() + static_cast<std::ptrdiff_t>(packed));
}

void KvSequence::PlanHeadRows(LayerPrep& p, int h, const std::vector<uint8_t>& keep,
                              std::vector<int64_t>* loose) const {
  // L (*loose, token indices into p.all_k / p.all_v): the loose kept tokens, then the kept tail
  // and new tokens; it flushes like a tail. The rows to write: the new sinks, then either the new
  // tail tokens (nothing moved) or the whole new tail.
  const HeadStream& head = p.layer.heads[h];
  PreparedHead& ph = p.out->heads[h];
  const StreamingRules& rules = p.layer.plan.rules;
  const bool lossless = p.layer.plan.lossless;
  const int g = head.spec.block_tokens, d = geometry_.head_dim;
  const int64_t old = head.count(), total = old + p.n;
  const int sinks_target = lossless ? 0 : rules.sink_tokens;
  ph.new_sinks = std::clamp<int>(sinks_target - head.sink_rows, 0, static_cast<int>(p.n));
  const int sinks_after = head.sink_rows + ph.new_sinks;
  const int64_t from = sinks_after + static_cast<int64_t>(head.records.size()) * g;
  // Without eviction and flush the old tail stays where it is: only the new tokens are read. A
  // deferred append holds the flush too: the append that ends the prefill then scores and
  // quantizes the same fp16 rows one append of it all would (the tail may pass flush_tokens
  // meanwhile, bounded by evict.max_deferred_tokens).
  // A held flush (flush_spread_steps) stores rows the same way.
  const bool untouched = !ph.evicted && !FlushesTail(p.ctx, p.l, h);
  const int64_t read_from = untouched ? std::max(from, old) : from;
  const bool decoded = eviction_.enabled && p.have_all[h];
  const size_t slot = 2 * p.layer.row_bytes;
  if (untouched && !decoded) {
    // The decode-step path: the new sinks and tail tokens are written as they came, in the
    // stored dtype (a byte copy when it is the session's), with no fp32 detour.
    ph.tail_after = static_cast<int>(total - from);
    ph.rows_after = sinks_after + ph.tail_after;
    ph.write_start = head.sink_rows + head.tail_rows;
    ph.rows.resize((ph.new_sinks + static_cast<size_t>(total - read_from)) * slot);
    uint8_t* dst = ph.rows.data();
    auto store = [&](int64_t t) {
      StoreRequestRow(p.k, p.v, t, h, p.layer.row_dtype, p.layer.row_bytes, dst);
      dst += slot;
    };
    for (int t = 0; t < ph.new_sinks; ++t) store(t);
    for (int64_t j = read_from; j < total; ++j) store(j - old);
    return;
  }
  if (!decoded) {
    // Not evicted (eviction decodes), not lossless (never flushes): a flush of stored fp16 rows.
    KVCTL_CHECK(!ph.evicted && !lossless);
    FlushStoredRows(p, h, read_from);
    return;
  }
  for (int64_t j = read_from; j < total; ++j) {
    if (!ph.evicted || keep[j]) loose->push_back(j);
  }
  const int l_rows = static_cast<int>(loose->size());
  // A lossless layer never flushes, evicting or not: its rows stay exactly as appended.
  const int flushed = untouched || lossless ? 0 : l_rows / rules.flush_tokens * rules.flush_tokens;
  RecordValues(p, h, *loose, 0, loose->size());
  AppendRowsAsHalves(p.all_k[h], d, *loose, 0, static_cast<size_t>(flushed), &ph.qk);
  AppendRowsAsHalves(p.all_v[h], d, *loose, 0, static_cast<size_t>(flushed), &ph.qv);
  for (int b = 0; b < flushed / std::max(g, 1); ++b) {
    ph.record_plan.push_back(PreparedHead::kNewRecord);
  }
  ph.tail_after = untouched ? static_cast<int>(total - from) : l_rows - flushed;
  ph.rows_after = sinks_after + ph.tail_after;
  ph.write_start = head.sink_rows + (untouched ? head.tail_rows : 0);
  const int first_tail = untouched ? 0 : flushed;
  ph.rows.resize((ph.new_sinks + static_cast<size_t>(l_rows - first_tail)) * slot);
  uint8_t* dst = ph.rows.data();
  for (int t = 0; t < ph.new_sinks; ++t, dst += slot) {
    StoreRequestRow(p.k, p.v, t, h, p.layer.row_dtype, p.layer.row_bytes, dst);
  }
  for (int t = first_tail; t < l_rows; ++t, dst += slot) {
    const int64_t j = (*loose)[static_cast<size_t>(t)];
    StoreRow(p.all_k[h] + j * d, d, p.layer.row_dtype, dst);
    StoreRow(p.all_v[h] + j * d, d, p.layer.row_dtype, dst + p.layer.row_bytes);
  }
}

}  // namespace kvctl
