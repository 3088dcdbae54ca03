// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/kv_sequence.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/half.h"
#include "kernels/quantize.h"

namespace kvctl {

struct KvSequence::HeadStream {
  QuantSpec spec;
  SlotArray rows;     // Sinks, then tail: K row then V row per slot.
  SlotArray records;  // Quantized block records.
  uint64_t quality_samples = 0;
  double k_rel_error_sum = 0, v_rel_error_sum = 0;
};

struct KvSequence::LayerState {
  LayerPlan plan;
  DType row_dtype = DType::kF16;
  size_t row_bytes = 0;  // One K or V row.
  std::vector<HeadStream> heads;
  SlotArray norms;  // OScaR: block_tokens fp32 norms per slot, one slot per record index.
  int sink_rows = 0;
  int tail_rows = 0;

  LayerState(PageAllocator* pool, size_t norm_slot) : norms(pool, norm_slot) {}
};

// Everything an append will write into one layer, computed before any stored state changes.
struct PreparedLayer {
  int new_sinks = 0;
  int flushes = 0;
  int write_start = 0;  // Row slot where `rows` go.
  int rows_after = 0;
  int tail_after = 0;
  std::vector<std::vector<uint8_t>> rows;     // Per head, converted rows to write.
  std::vector<std::vector<uint8_t>> records;  // Per head, new records back to back.
  std::vector<float> norms;                   // OScaR norms of the flushed tokens.
  struct Sample {
    int head;
    double k_rel_error, v_rel_error;
  };
  std::vector<Sample> samples;  // Quality telemetry of sampled new records.
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

}  // namespace

KvSequence::KvSequence(PageAllocator* pool, const SequenceGeometry& geometry,
                       std::vector<LayerPlan> plans)
    : pool_(pool), geometry_(geometry) {
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
    const size_t norm_slot = TraitsOf(first.method).needs_token_norms && !plan.lossless
                                 ? static_cast<size_t>(first.block_tokens) * 4
                                 : 4;
    auto layer = std::make_unique<LayerState>(pool, norm_slot);
    layer->row_dtype = plan.lossless ? geometry.dtype : DType::kF16;
    layer->row_bytes = static_cast<size_t>(geometry.head_dim) * DTypeSize(layer->row_dtype);
    for (const QuantSpec& spec : plan.head_specs) {
      layer->heads.push_back(
          HeadStream{spec, SlotArray(pool, 2 * layer->row_bytes),
                     SlotArray(pool, record_bytes(plan, spec), records_per_page)});
    }
    layer->plan = std::move(plan);
    layers_.push_back(std::move(layer));
  }
}

KvSequence::~KvSequence() = default;

Status KvSequence::AppendLayerPrepare(int l, const KvTensorView& k, const KvTensorView& v,
                                      PreparedLayer* out) const {
  const LayerState& layer = *layers_[l];
  const int n = static_cast<int>(k.tokens);
  const int heads = geometry_.kv_heads, d = geometry_.head_dim;
  const bool lossless = layer.plan.lossless;
  const StreamingRules& rules = layer.plan.rules;
  const int sinks = lossless ? 0 : rules.sink_tokens;
  out->new_sinks = std::clamp(sinks - layer.sink_rows, 0, n);
  const int to_tail = n - out->new_sinks;
  const int total_tail = layer.tail_rows + to_tail;
  out->flushes = lossless ? 0 : total_tail / rules.flush_tokens;
  out->tail_after = lossless ? total_tail : total_tail % rules.flush_tokens;
  out->write_start = layer.sink_rows + (out->flushes > 0 ? 0 : layer.tail_rows);
  out->rows_after = layer.sink_rows + out->new_sinks + out->tail_after;

  // Rows to write: the new sinks, then either every new tail token or, after a flush, the last
  // tail_after of them (a flush always consumes the whole old tail, which is < flush_tokens).
  const int first_tail_token = out->new_sinks + (out->flushes > 0 ? to_tail - out->tail_after : 0);
  std::vector<float> row(static_cast<size_t>(d));
  out->rows.assign(heads, {});
  out->records.assign(heads, {});
  for (int h = 0; h < heads; ++h) {
    std::vector<uint8_t>& dst = out->rows[h];
    auto put = [&](int t) {
      const size_t at = dst.size();
      dst.resize(at + 2 * layer.row_bytes);
      k.LoadRow(t, h, row.data());
      StoreRow(row.data(), d, layer.row_dtype, dst.data() + at);
      v.LoadRow(t, h, row.data());
      StoreRow(row.data(), d, layer.row_dtype, dst.data() + at + layer.row_bytes);
    };
    for (int t = 0; t < out->new_sinks; ++t) put(t);
    for (int t = first_tail_token; t < n; ++t) put(t);
  }
  if (out->flushes == 0) return OkStatus();

  // Flushed tokens: the old tail (stored fp16 rows) then new tail tokens rounded to fp16, as one
  // [flushed, heads, d] buffer per K and V.
  const int flushed = out->flushes * rules.flush_tokens;
  const size_t stride = static_cast<size_t>(heads) * d;
  std::vector<float> fk(static_cast<size_t>(flushed) * stride), fv(fk.size());
  for (int h = 0; h < heads; ++h) {
    const HeadStream& head = layer.heads[h];
    for (int t = 0; t < flushed; ++t) {
      float* kd = &fk[t * stride + h * d];
      float* vd = &fv[t * stride + h * d];
      if (t < layer.tail_rows) {
        const uint8_t* slot = head.rows.Slot(layer.sink_rows + t);
        LoadRow(slot, d, layer.row_dtype, kd);
        LoadRow(slot + layer.row_bytes, d, layer.row_dtype, vd);
      } else {
        const int src = out->new_sinks + (t - layer.tail_rows);
        k.LoadRow(src, h, kd);
        v.LoadRow(src, h, vd);
        for (int i = 0; i < d; ++i) kd[i] = RoundToHalf(kd[i]), vd[i] = RoundToHalf(vd[i]);
      }
    }
  }
  const QuantSpec& spec0 = layer.heads[0].spec;
  const bool needs_norms = TraitsOf(spec0.method).needs_token_norms;
  if (needs_norms) {
    out->norms.resize(static_cast<size_t>(flushed));
    ComputeTokenNorms(KvTensorView::Contiguous(fk.data(), DType::kF32, flushed, heads, d),
                      out->norms.data());
  }
  const int g = spec0.block_tokens;
  for (int h = 0; h < heads; ++h) {
    const QuantSpec& spec = layer.heads[h].spec;
    const size_t rb = BlockLayoutOf(spec).record_bytes;
    out->records[h].resize(rb * (flushed / g));
    for (int b = 0; b < flushed / g; ++b) {
      const BlockInput in{&fk[b * g * stride + h * d], &fv[b * g * stride + h * d],
                          static_cast<int64_t>(stride),
                          needs_norms ? &out->norms[static_cast<size_t>(b) * g] : nullptr};
      uint8_t* rec = out->records[h].data() + b * rb;
      Status s = QuantizeBlock(spec, in, rec);
      if (!s.ok()) {
        return Status(s.code(), internal::StrCat("layer ", l, ", head ", h, ": ", s.message()));
      }
      const size_t index = layer.heads[h].records.size() + static_cast<size_t>(b);
      if (geometry_.quality_sample_period > 0 &&
          index % static_cast<size_t>(geometry_.quality_sample_period) == 0) {
        out->samples.push_back({h, 0, 0});
        SampleQuality(spec, in, rec, &out->samples.back());
      }
    }
  }
  return OkStatus();
}

Status KvSequence::Append(int64_t first_position, const std::vector<KvTensorView>& k,
                          const std::vector<KvTensorView>& v) {
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
    KVCTL_RETURN_IF_ERROR(AppendLayerPrepare(l, k[l], v[l], &prepared[l]));
    const LayerState& layer = *layers_[l];
    const PreparedLayer& p = prepared[l];
    for (int h = 0; h < geometry_.kv_heads; ++h) {
      const HeadStream& head = layer.heads[h];
      pages += head.rows.PagesNeeded(p.rows_after);
      pages += head.records.PagesNeeded(head.records.size() +
                                        p.records[h].size() /
                                            std::max<size_t>(1, head.records.slot_bytes()));
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
      head.rows.Resize(p.rows_after, &reserved);
      const size_t slot = head.rows.slot_bytes();
      for (size_t i = 0; i < p.rows[h].size() / slot; ++i) {
        std::memcpy(head.rows.Slot(p.write_start + i), p.rows[h].data() + i * slot, slot);
      }
      if (!p.records[h].empty()) {
        const size_t rb = head.records.slot_bytes();
        const size_t before = head.records.size();
        head.records.Resize(before + p.records[h].size() / rb, &reserved);
        for (size_t i = 0; i < p.records[h].size() / rb; ++i) {
          std::memcpy(head.records.Slot(before + i), p.records[h].data() + i * rb, rb);
        }
      }
    }
    if (!p.norms.empty()) {
      const size_t per_slot = layer.norms.slot_bytes() / 4;
      const size_t before = layer.norms.size();
      layer.norms.Resize(before + p.norms.size() / per_slot, &reserved);
      for (size_t i = 0; i < p.norms.size() / per_slot; ++i) {
        std::memcpy(layer.norms.Slot(before + i), &p.norms[i * per_slot], per_slot * 4);
      }
    }
    layer.sink_rows += p.new_sinks;
    layer.tail_rows = p.tail_after;
    for (const PreparedLayer::Sample& sample : p.samples) {
      HeadStream& head = layer.heads[sample.head];
      ++head.quality_samples;
      head.k_rel_error_sum += sample.k_rel_error;
      head.v_rel_error_sum += sample.v_rel_error;
    }
  }
  KVCTL_CHECK(reserved.empty());
  if (tokens_ == 0) first_position_ = first_position;
  tokens_ += n;
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
  std::vector<float> kb, vb;
  for (int l = layer_begin; l < layer_end; ++l) {
    const LayerState& layer = *layers_[l];
    for (const HeadStream& head : layer.heads) {
      const int g = head.spec.block_tokens;
      const size_t records = with_records ? head.records.size() : 0;
      const size_t count = layer.sink_rows + records * g + layer.tail_rows;
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
      copy_rows(0, layer.sink_rows);
      for (size_t r = 0; r < records; ++r, kd += g * d, vd += g * d) {
        const float* norms =
            layer.norms.size() > 0 ? reinterpret_cast<const float*>(layer.norms.Slot(r)) : nullptr;
        DequantizeBlock(head.spec, head.records.Slot(r), norms, kd, vd);
      }
      copy_rows(layer.sink_rows, layer.tail_rows);
      // Token i of the stream sits at position first_position + i; without records the tail
      // rows skip the quantized span.
      const int64_t quantized = static_cast<int64_t>(head.records.size()) * g;
      for (size_t i = 0; i < count; ++i) {
        const int64_t index = static_cast<int64_t>(i);
        const bool in_tail = !with_records && index >= layer.sink_rows;
        out.positions.push_back(first_position_ + index + (in_tail ? quantized : 0));
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
  b.sink_rows = static_cast<uint32_t>(l.sink_rows);
  b.tail_rows = static_cast<uint32_t>(l.tail_rows);
  b.first_quantized_position = first_position_ + l.sink_rows;
  return b;
}

const QuantSpec& KvSequence::HeadSpec(int layer, int head) const {
  return layers_[layer]->heads[head].spec;
}

bool KvSequence::Lossless(int layer) const { return layers_[layer]->plan.lossless; }

const SlotArray* KvSequence::Norms(int layer) const {
  const LayerState& l = *layers_[layer];
  return l.norms.size() > 0 ? &l.norms : nullptr;
}

HeadUsage KvSequence::HeadUsageOf(int layer, int head) const {
  const LayerState& l = *layers_[layer];
  const HeadStream& h = l.heads[head];
  HeadUsage u;
  u.tokens =
      l.sink_rows + static_cast<int64_t>(h.records.size()) * h.spec.block_tokens + l.tail_rows;
  u.elements = 2 * static_cast<uint64_t>(u.tokens) * geometry_.head_dim;
  u.payload_bytes = h.rows.size() * h.rows.slot_bytes() +
                    h.records.size() * h.records.slot_bytes() +
                    l.norms.size() * l.norms.slot_bytes() / l.heads.size();
  u.k_bits = l.plan.lossless ? static_cast<int>(8 * DTypeSize(l.row_dtype)) : h.spec.k_bits;
  u.v_bits = l.plan.lossless ? static_cast<int>(8 * DTypeSize(l.row_dtype)) : h.spec.v_bits;
  u.quality_samples = h.quality_samples;
  u.k_rel_error_sum = h.k_rel_error_sum;
  u.v_rel_error_sum = h.v_rel_error_sum;
  return u;
}

HeadUsage KvSequence::QualityTotals() const {
  HeadUsage total;
  for (const auto& layer : layers_) {
    for (const HeadStream& h : layer->heads) {
      total.quality_samples += h.quality_samples;
      total.k_rel_error_sum += h.k_rel_error_sum;
      total.v_rel_error_sum += h.v_rel_error_sum;
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
    }
  }
  if (!layers_.empty() && !layers_[0]->heads.empty()) {
    const HeadStream& h0 = layers_[0]->heads[0];
    u.quantized_tokens = static_cast<int64_t>(h0.records.size()) * h0.spec.block_tokens;
  }
  u.elements = 2 * static_cast<uint64_t>(tokens_) * geometry_.layers * geometry_.kv_heads *
               geometry_.head_dim;
  return u;
}

}  // namespace kvctl
