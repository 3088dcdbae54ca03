// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Sequence images (controller/sequence/sequence_image.h): the writer, the bounds-checked reader
// and the rebuild of a KvSequence from one. docs/sequence_image.md has the byte layout; the
// offsets below are its table. Every number read from an image passes a check before it sizes,
// indexes or offsets anything: the reader refuses reads past its section, counts are compared
// with what the plans and token count imply, and byte lengths come from checked products.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/checked_math.h"
#include "common/crc32c.h"
#include "controller/pool/slab.h"
#include "controller/sequence/kv_sequence_internal.h"
#include "controller/sequence/sequence_image.h"
#include "kernels/convert.h"
#include "kernels/quantize.h"

namespace kvctl {

static_assert(std::endian::native == std::endian::little, "images are written little-endian");

namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'E', 'Q', 'I', 'M', 'G'};
constexpr size_t kCrcOffset = 12;    // u32: CRC-32C of bytes [kCrcCovers, total).
constexpr size_t kCrcCovers = 16;    // The checksum covers everything after itself.
constexpr size_t kFixedHeader = 96;  // Header bytes before the model id.
constexpr size_t kLayerPlanBytes = 12;
constexpr size_t kHeadSpecBytes = 32;
constexpr size_t kHeadHeaderBytes = 96;
constexpr uint32_t kFlagPrefix = 1;
// Bounds on header counts, far above any model, so a hostile header cannot ask for huge plans
// before the plan bytes are known to be there.
constexpr uint32_t kMaxLayers = 4096, kMaxHeads = 4096, kMaxHeadDim = 65536;
constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
// Positions stay far from int64's end, so appends after an import cannot overflow them.
constexpr int64_t kMaxFirstPosition = int64_t{1} << 62;

// Little-endian appends.
class Writer {
 public:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void Bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }
  size_t size() const { return out_.size(); }
  std::vector<uint8_t>& out() { return out_; }
  template <typename T>
  void PutAt(size_t offset, T value) {
    std::memcpy(out_.data() + offset, &value, sizeof(T));
  }

 private:
  std::vector<uint8_t> out_;
};

// Reads of one region of an image; a read past the region is a DATA_LOSS naming the field.
class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, uint64_t base) : bytes_(bytes), base_(base) {}
  uint64_t offset() const { return base_ + pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }
  StatusOr<std::span<const uint8_t>> Bytes(std::string_view field, uint64_t n) {
    if (n > remaining()) {
      return DataLoss("sequence image: ", field, " at byte ", offset(), " needs ", n,
                      " bytes, the image has ", remaining(), " left (truncated or malformed)");
    }
    std::span<const uint8_t> out = bytes_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }
  template <typename T>
  StatusOr<T> Get(std::string_view field) {
    KVCTL_ASSIGN_OR_RETURN(std::span<const uint8_t> b, Bytes(field, sizeof(T)));
    T value;
    std::memcpy(&value, b.data(), sizeof(T));
    return value;
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t base_;
  size_t pos_ = 0;
};

// Checked arithmetic answers INVALID_ARGUMENT; in an image that is a malformed body.
Status AsDataLoss(const Status& s) {
  return s.ok() ? s : DataLoss("sequence image: ", s.message());
}

// One head's share of a layer section.
struct HeadBody {
  uint32_t sink_rows = 0, tail_rows = 0, records = 0;
  HeadUsage usage;  // Telemetry counters only.
  std::span<const uint8_t> rows, record_bytes;
};

struct LayerBody {
  uint32_t norm_slots = 0;
  std::vector<HeadBody> heads;
  std::span<const uint8_t> norms;
};

// The header, plans and where the layer sections start.
struct ParsedHeader {
  ImageInfo info;
  uint64_t pressure_reliefs = 0, pressure_cap_cuts = 0, lowered_for_others = 0;
  uint64_t body_offset = 0;
};

StatusOr<ParsedHeader> ParseHeader(std::span<const uint8_t> image) {
  if (image.size() < kFixedHeader) {
    return DataLoss("sequence image: ", image.size(), " bytes, shorter than its ", kFixedHeader,
                    "-byte header (truncated)");
  }
  if (std::memcmp(image.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLoss("sequence image: magic is not \"KVSEQIMG\" (not an image, or damaged)");
  }
  Reader r(image, 0);
  KVCTL_RETURN_IF_ERROR(r.Bytes("magic", sizeof(kMagic)).status());
  ParsedHeader h;
  ImageInfo& info = h.info;
  KVCTL_ASSIGN_OR_RETURN(info.version, r.Get<uint32_t>("version"));
  if (info.version != kSequenceImageVersion) {
    return FailedPrecondition("sequence image: version ", info.version,
                              ", this build reads version ", kSequenceImageVersion);
  }
  KVCTL_ASSIGN_OR_RETURN(const uint32_t crc, r.Get<uint32_t>("crc32c"));
  KVCTL_ASSIGN_OR_RETURN(info.bytes, r.Get<uint64_t>("total_bytes"));
  if (info.bytes != image.size()) {
    return DataLoss("sequence image: total_bytes says ", info.bytes, ", got ", image.size(),
                    " bytes (truncated or padded)");
  }
  const uint32_t actual = Crc32c(image.data() + kCrcCovers, image.size() - kCrcCovers);
  if (actual != crc) {
    return DataLoss("sequence image: CRC-32C of bytes ", kCrcCovers, "..", image.size(), " is ",
                    actual, ", the header says ", crc, " (damaged)");
  }
  KVCTL_ASSIGN_OR_RETURN(const uint32_t flags, r.Get<uint32_t>("flags"));
  if ((flags & ~kFlagPrefix) != 0) {
    return DataLoss("sequence image: flags ", flags, " has unknown bits (known: 1 = prefix)");
  }
  info.prefix = (flags & kFlagPrefix) != 0;
  KVCTL_ASSIGN_OR_RETURN(const uint32_t model_bytes, r.Get<uint32_t>("model_id_bytes"));
  if (model_bytes > kImageMaxModelIdBytes) {
    return DataLoss("sequence image: model_id_bytes ", model_bytes, ", expected at most ",
                    kImageMaxModelIdBytes);
  }
  SequenceGeometry& g = info.geometry;
  uint32_t fields[5];
  const char* names[5] = {"layers", "kv_heads", "head_dim", "q_heads", "dtype"};
  for (int i = 0; i < 5; ++i) {
    KVCTL_ASSIGN_OR_RETURN(fields[i], r.Get<uint32_t>(names[i]));
  }
  const uint32_t limits[5] = {kMaxLayers, kMaxHeads, kMaxHeadDim, kMaxHeads, 2};
  for (int i = 0; i < 5; ++i) {
    const uint32_t low = i < 3 ? 1 : 0;
    if (fields[i] < low || fields[i] > limits[i]) {
      return DataLoss("sequence image: ", names[i], " is ", fields[i], ", expected ", low, "..",
                      limits[i]);
    }
  }
  g.layers = static_cast<int>(fields[0]);
  g.kv_heads = static_cast<int>(fields[1]);
  g.head_dim = static_cast<int>(fields[2]);
  g.q_heads = static_cast<int>(fields[3]);
  g.dtype = static_cast<DType>(fields[4]);
  KVCTL_ASSIGN_OR_RETURN(const uint32_t reserved, r.Get<uint32_t>("reserved"));
  if (reserved != 0) return DataLoss("sequence image: reserved header word is ", reserved);
  KVCTL_ASSIGN_OR_RETURN(info.first_position, r.Get<int64_t>("first_position"));
  KVCTL_ASSIGN_OR_RETURN(info.tokens, r.Get<int64_t>("tokens"));
  if (info.first_position < 0 || info.first_position > kMaxFirstPosition || info.tokens < 0 ||
      info.tokens > kMaxTokens) {
    return DataLoss("sequence image: first_position ", info.first_position, " and tokens ",
                    info.tokens, ", expected first_position 0..2^62 and tokens 0..", kMaxTokens);
  }
  KVCTL_ASSIGN_OR_RETURN(h.pressure_reliefs, r.Get<uint64_t>("pressure_reliefs"));
  KVCTL_ASSIGN_OR_RETURN(h.pressure_cap_cuts, r.Get<uint64_t>("pressure_cap_cuts"));
  KVCTL_ASSIGN_OR_RETURN(h.lowered_for_others, r.Get<uint64_t>("lowered_for_others"));
  KVCTL_ASSIGN_OR_RETURN(std::span<const uint8_t> model, r.Bytes("model_id", model_bytes));
  info.model_id.assign(model.begin(), model.end());
  // The plans' size is checked against the image before any plan is allocated.
  KVCTL_ASSIGN_OR_RETURN(
      const uint64_t plan_bytes,
      CheckedProduct(
          "plans", {uint64_t(g.layers), kLayerPlanBytes + uint64_t{kHeadSpecBytes} * g.kv_heads}));
  if (plan_bytes > r.remaining()) {
    return DataLoss("sequence image: plans of ", g.layers, " layers x ", g.kv_heads, " heads need ",
                    plan_bytes, " bytes, ", r.remaining(), " left");
  }
  info.plans.resize(static_cast<size_t>(g.layers));
  for (int l = 0; l < g.layers; ++l) {
    LayerPlan& plan = info.plans[l];
    KVCTL_ASSIGN_OR_RETURN(const uint32_t lossless, r.Get<uint32_t>("lossless"));
    if (lossless > 1) {
      return DataLoss("sequence image: layer ", l, ": lossless is ", lossless, ", expected 0 or 1");
    }
    plan.lossless = lossless == 1;
    KVCTL_ASSIGN_OR_RETURN(plan.rules.sink_tokens, r.Get<int32_t>("sink_tokens"));
    KVCTL_ASSIGN_OR_RETURN(plan.rules.flush_tokens, r.Get<int32_t>("flush_tokens"));
    plan.head_specs.resize(static_cast<size_t>(g.kv_heads));
    for (QuantSpec& spec : plan.head_specs) {
      KVCTL_ASSIGN_OR_RETURN(const uint32_t method, r.Get<uint32_t>("method"));
      if (method > 255) {
        return DataLoss("sequence image: layer ", l, ": method ", method, ", expected 0..255");
      }
      spec.method = static_cast<QuantMethod>(method);
      int32_t v[7];
      for (int32_t& x : v) {
        KVCTL_ASSIGN_OR_RETURN(x, r.Get<int32_t>("quant spec"));
      }
      spec.head_dim = v[0], spec.k_bits = v[1], spec.v_bits = v[2], spec.block_tokens = v[3];
      spec.k_group_tokens = v[4], spec.v_group_channels = v[5], spec.sinkhorn_iters = v[6];
    }
  }
  h.body_offset = r.offset();
  return h;
}

// Why this build cannot hold `plans` for `geometry` in `pool` under `eviction`, naming the
// layer/head and what; OK when it can. Run before any KvSequence is built (its constructor only
// asserts what it requires).
Status CheckPlans(const std::vector<LayerPlan>& plans, const SequenceGeometry& geometry,
                  const PageAllocator& pool, const EvictionSettings& eviction, int64_t tokens) {
  const uint64_t page = pool.page_bytes();
  const uint64_t pool_bytes = uint64_t{pool.pages_total()} * page;
  for (size_t l = 0; l < plans.size(); ++l) {
    const LayerPlan& plan = plans[l];
    const QuantSpec& first = plan.head_specs[0];
    for (size_t h = 0; h < plan.head_specs.size(); ++h) {
      const QuantSpec& spec = plan.head_specs[h];
      const auto method = static_cast<unsigned>(spec.method);
      if (method >= static_cast<unsigned>(kNumQuantMethods)) {
        return FailedPrecondition("sequence image: layer ", l, ", head ", h, ": quantizer method ",
                                  method, " is unknown to this build (known 0..",
                                  kNumQuantMethods - 1, ")");
      }
      if (spec.head_dim != geometry.head_dim) {
        return FailedPrecondition("sequence image: layer ", l, ", head ", h,
                                  ": quant spec head_dim ", spec.head_dim, ", expected ",
                                  geometry.head_dim);
      }
      if (Status valid = ValidateQuantSpec(spec); !valid.ok()) {
        return FailedPrecondition("sequence image: layer ", l, ", head ", h, ": ",
                                  QuantMethodName(spec.method),
                                  " spec not decodable here: ", valid.message());
      }
      if (plan.lossless) continue;
      if (spec.method != first.method || spec.block_tokens != first.block_tokens) {
        return FailedPrecondition("sequence image: layer ", l, ", head ", h, ": ",
                                  QuantMethodName(spec.method), " G", spec.block_tokens,
                                  ", expected the layer's ", QuantMethodName(first.method), " G",
                                  first.block_tokens, " (a layer's heads share method and block)");
      }
      if (Status valid = ValidateStreamingRules(spec, plan.rules); !valid.ok()) {
        return FailedPrecondition("sequence image: layer ", l, ", head ", h, ": ", valid.message());
      }
      const BlockLayout layout = BlockLayoutOf(spec);
      const uint64_t norm_bytes = layout.side_bytes_per_token * spec.block_tokens;
      for (uint64_t slot : {uint64_t{layout.record_bytes}, norm_bytes}) {
        if (slot == 0) continue;
        if (Status fits = CheckSlotIdSpace("pool.page_bytes", pool_bytes, page, slot); !fits.ok()) {
          return FailedPrecondition("sequence image: layer ", l, ", head ", h, ": ",
                                    fits.message());
        }
      }
    }
    const DType row_dtype = plan.lossless ? geometry.dtype : DType::kF16;
    const uint64_t row_slot = 2ull * geometry.head_dim * DTypeSize(row_dtype);
    if (Status fits = CheckSlotIdSpace("pool.page_bytes", pool_bytes, page, row_slot); !fits.ok()) {
      return FailedPrecondition("sequence image: layer ", l, ": rows: ", fits.message());
    }
    if (!eviction.enabled || plan.lossless) continue;
    if (TraitsOf(first.method).needs_token_norms) {
      return FailedPrecondition("sequence image: layer ", l,
                                ": oscar layers cannot be imported with eviction on (evict.*)");
    }
    if (eviction.sinks > plan.rules.sink_tokens && tokens > plan.rules.sink_tokens) {
      return FailedPrecondition("sequence image: layer ", l, ": evict.sinks ", eviction.sinks,
                                " exceeds the image's sink_tokens ", plan.rules.sink_tokens,
                                " with tokens past them already quantized or in the tail");
    }
  }
  return OkStatus();
}

StatusOr<HeadUsage> ReadUsage(Reader& r) {
  HeadUsage u;
  uint64_t* counters[7] = {&u.quality_samples, &u.evicted_tokens,     &u.evicted_bytes,
                           &u.compressions,    &u.requantized_tokens, &u.width_lowerings,
                           &u.retained_samples};
  for (uint64_t* c : counters) {
    KVCTL_ASSIGN_OR_RETURN(*c, r.Get<uint64_t>("head counters"));
  }
  double* sums[3] = {&u.k_rel_error_sum, &u.v_rel_error_sum, &u.retained_mass_sum};
  for (double* s : sums) {
    KVCTL_ASSIGN_OR_RETURN(*s, r.Get<double>("head error sums"));
    if (!std::isfinite(*s) || *s < 0) {
      return DataLoss("sequence image: a head's error sum is ", *s, ", expected finite >= 0");
    }
  }
  return u;
}

void WriteUsage(const HeadUsage& u, Writer* w) {
  for (uint64_t c : {u.quality_samples, u.evicted_tokens, u.evicted_bytes, u.compressions,
                     u.requantized_tokens, u.width_lowerings, u.retained_samples}) {
    w->Put<uint64_t>(c);
  }
  for (double s : {u.k_rel_error_sum, u.v_rel_error_sum, u.retained_mass_sum}) w->Put<double>(s);
}

// Reads one layer section and checks its counts against the plan and the token count: what a
// KvSequence that appended `tokens` tokens without eviction holds.
StatusOr<LayerBody> ReadLayer(Reader& outer, int l, const LayerPlan& plan,
                              const SequenceGeometry& g, int64_t tokens) {
  KVCTL_ASSIGN_OR_RETURN(const uint64_t section, outer.Get<uint64_t>("layer section_bytes"));
  const uint64_t at = outer.offset();
  KVCTL_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes, outer.Bytes("layer section", section));
  Reader r(bytes, at);
  LayerBody body;
  KVCTL_ASSIGN_OR_RETURN(body.norm_slots, r.Get<uint32_t>("norm_slots"));
  KVCTL_ASSIGN_OR_RETURN(const uint32_t reserved, r.Get<uint32_t>("layer reserved"));
  if (reserved != 0) return DataLoss("sequence image: layer ", l, ": reserved word ", reserved);
  const DType row_dtype = plan.lossless ? g.dtype : DType::kF16;
  const uint64_t row_slot = 2ull * g.head_dim * DTypeSize(row_dtype);
  const bool norms = !plan.lossless && TraitsOf(plan.head_specs[0].method).needs_token_norms;
  const uint64_t t = static_cast<uint64_t>(tokens);
  body.heads.resize(static_cast<size_t>(g.kv_heads));
  for (int h = 0; h < g.kv_heads; ++h) {
    HeadBody& hb = body.heads[h];
    KVCTL_ASSIGN_OR_RETURN(hb.sink_rows, r.Get<uint32_t>("sink_rows"));
    KVCTL_ASSIGN_OR_RETURN(hb.tail_rows, r.Get<uint32_t>("tail_rows"));
    KVCTL_ASSIGN_OR_RETURN(hb.records, r.Get<uint32_t>("records"));
    KVCTL_ASSIGN_OR_RETURN(const uint32_t head_reserved, r.Get<uint32_t>("head reserved"));
    KVCTL_ASSIGN_OR_RETURN(hb.usage, ReadUsage(r));
    const QuantSpec& spec = plan.head_specs[h];
    const uint64_t g_tokens = static_cast<uint64_t>(spec.block_tokens);
    const uint64_t quantized = uint64_t{hb.records} * g_tokens;  // < 2^32 * 2^16: no wrap.
    const uint64_t held = uint64_t{hb.sink_rows} + quantized + hb.tail_rows;
    // What Append leaves: sinks first (up to sink_tokens), whole flush groups in records, a tail
    // shorter than a flush group plus what a spread flush holds (any exporter's
    // flush_spread_steps); lossless layers hold every token as a tail row.
    const uint64_t sinks = plan.lossless ? 0 : std::min<uint64_t>(plan.rules.sink_tokens, t);
    const uint64_t max_tail = static_cast<uint64_t>(plan.rules.flush_tokens) +
                              static_cast<uint64_t>(kMaxFlushSpreadSteps) - 1;
    const bool consistent =
        head_reserved == 0 && held == t && hb.sink_rows == sinks &&
        (plan.lossless ? hb.records == 0
                       : hb.tail_rows < max_tail &&
                             quantized % static_cast<uint64_t>(plan.rules.flush_tokens) == 0) &&
        (!norms || hb.records == body.norm_slots);
    if (!consistent) {
      return DataLoss("sequence image: layer ", l, ", head ", h, ": ", hb.sink_rows, " sink rows, ",
                      hb.records, " records of ", g_tokens, " tokens, ", hb.tail_rows,
                      " tail rows (norm slots ", body.norm_slots, ") do not make ", tokens,
                      " tokens under sink_tokens ", plan.rules.sink_tokens, ", flush_tokens ",
                      plan.rules.flush_tokens, plan.lossless ? " (lossless)" : "");
    }
  }
  if (!norms && body.norm_slots != 0) {
    return DataLoss("sequence image: layer ", l, ": norm_slots ", body.norm_slots,
                    ", expected 0 (no oscar)");
  }
  for (int h = 0; h < g.kv_heads; ++h) {
    HeadBody& hb = body.heads[h];
    const uint64_t record_bytes =
        plan.lossless ? 0 : BlockLayoutOf(plan.head_specs[h]).record_bytes;
    StatusOr<uint64_t> rows = CheckedMul("rows", uint64_t{hb.sink_rows} + hb.tail_rows, row_slot);
    KVCTL_RETURN_IF_ERROR(AsDataLoss(rows.status()));
    KVCTL_ASSIGN_OR_RETURN(hb.rows, r.Bytes("rows", *rows));
    StatusOr<uint64_t> recs = CheckedMul("records", hb.records, record_bytes);
    KVCTL_RETURN_IF_ERROR(AsDataLoss(recs.status()));
    KVCTL_ASSIGN_OR_RETURN(hb.record_bytes, r.Bytes("records", *recs));
  }
  if (norms) {
    StatusOr<uint64_t> n =
        CheckedProduct("norms", {body.norm_slots, uint64_t(plan.head_specs[0].block_tokens), 4});
    KVCTL_RETURN_IF_ERROR(AsDataLoss(n.status()));
    KVCTL_ASSIGN_OR_RETURN(body.norms, r.Bytes("norms", *n));
  }
  if (r.remaining() != 0) {
    return DataLoss("sequence image: layer ", l, ": ", r.remaining(),
                    " bytes left over at the end of its section");
  }
  return body;
}

// Every stored value finite, as Append guarantees for what it stores: rows by a bit test, records
// by decoding each (garbage bytes decode to garbage, never out of bounds). A non-finite value
// would make every later flush or re-quantization of the head fail, and FETCH return it.
Status CheckValues(int l, const LayerPlan& plan, const SequenceGeometry& g, const LayerBody& body) {
  const DType row_dtype = plan.lossless ? g.dtype : DType::kF16;
  const size_t d = static_cast<size_t>(g.head_dim);
  std::vector<float> norms(body.norms.size() / sizeof(float));
  if (!norms.empty()) std::memcpy(norms.data(), body.norms.data(), body.norms.size());
  if (FirstNonFinite(DType::kF32, norms.data(), norms.size()) != norms.size()) {
    return DataLoss("sequence image: layer ", l, ": an oscar norm is not finite");
  }
  std::vector<uint64_t> record;  // Aligned copy of one record.
  std::vector<float> k, v;
  for (size_t h = 0; h < body.heads.size(); ++h) {
    const HeadBody& hb = body.heads[h];
    const size_t n = hb.rows.size() / DTypeSize(row_dtype);
    if (FirstNonFinite(row_dtype, hb.rows.data(), n) != n) {
      return DataLoss("sequence image: layer ", l, ", head ", h, ": a row value is not finite");
    }
    if (hb.records == 0) continue;
    const QuantSpec& spec = plan.head_specs[h];
    const size_t rb = hb.record_bytes.size() / hb.records;
    const size_t block = static_cast<size_t>(spec.block_tokens) * d;
    record.resize((rb + 7) / 8);
    k.resize(block), v.resize(block);
    for (size_t r = 0; r < hb.records; ++r) {
      std::memcpy(record.data(), hb.record_bytes.data() + r * rb, rb);
      const float* nr = norms.empty() ? nullptr : &norms[r * spec.block_tokens];
      DequantizeBlock(spec, reinterpret_cast<const uint8_t*>(record.data()), nr, k.data(),
                      v.data());
      if (FirstNonFinite(DType::kF32, k.data(), block) != block ||
          FirstNonFinite(DType::kF32, v.data(), block) != block) {
        return DataLoss("sequence image: layer ", l, ", head ", h, ": record ", r,
                        " decodes to a value that is not finite");
      }
    }
  }
  return OkStatus();
}

}  // namespace

// The friend of KvSequence that reads and rebuilds its stored state.
struct SequenceImageAccess {
  using HeadStream = KvSequence::HeadStream;
  using LayerState = KvSequence::LayerState;

  // OK when `m` tokens can be exported exactly; INVALID_ARGUMENT naming the layer and why.
  static Status CheckCut(const KvSequence& seq, int64_t m) {
    if (m < 0 || m > seq.tokens_) {
      return InvalidArgument("tokens: got ", m, ", expected 0..", seq.tokens_,
                             " (the sequence's tokens)");
    }
    if (m == seq.tokens_) return OkStatus();
    for (size_t l = 0; l < seq.layers_.size(); ++l) {
      const LayerState& layer = *seq.layers_[l];
      if (layer.plan.lossless) continue;
      const int64_t s = layer.plan.rules.sink_tokens, f = layer.plan.rules.flush_tokens;
      for (const HeadStream& head : layer.heads) {
        const int64_t q =
            head.sink_rows + static_cast<int64_t>(head.records.size()) * head.spec.block_tokens;
        if (m <= s || m >= q || (m - s) % f == 0) continue;
        return InvalidArgument("tokens: ", m, " splits a flush group of layer ", l,
                               " (sink_tokens ", s, ", flush_tokens ", f, ", quantized up to ", q,
                               "); exact cuts are <= ", s, ", >= ", q, " or ", s, " + k * ", f);
      }
    }
    return OkStatus();
  }

  static Status CheckExportable(const KvSequence& seq) {
    if (!seq.integrity_.ok()) return seq.integrity_;
    if (seq.first_position_ > kMaxFirstPosition) {
      return FailedPrecondition("first_position: ", seq.first_position_,
                                ", images hold positions up to 2^62");
    }
    // A prefill sent with APPEND_CONTINUES has not evicted yet (and a quantized layer's tail may
    // exceed flush_tokens meanwhile): exportable once the APPEND that ends it has run.
    if (seq.deferred_tokens_ > 0) {
      return FailedPrecondition("sequence: holds ", seq.deferred_tokens_,
                                " tokens of a prefill sent with APPEND_CONTINUES that has not "
                                "ended; send its last APPEND (without the flag) first");
    }
    // With eviction on, a sequence is exportable while it holds no scoring state: no query rows
    // kept (every policy but streaming keeps them from its first append), no H2O accumulators,
    // no head re-allocation utility, and no token evicted yet (positions below). Then an
    // importer with the same evict.* settings rebuilds exactly that state (docs/sequence_image.md)
    // and evicts as the original would.
    if (seq.eviction_.enabled) {
      for (size_t l = 0; l < seq.layers_.size(); ++l) {
        const LayerState& layer = *seq.layers_[l];
        const LayerScoring& sc = layer.scoring;
        const char* state = layer.queries.count > 0 ? "kept query rows (the observation window)"
                            : sc.h2o_pending > 0    ? "pending H2O queries"
                            : sc.has_utility        ? "head re-allocation utility"
                                                    : nullptr;
        for (size_t h = 0; state == nullptr && h < layer.heads.size(); ++h) {
          if (!layer.heads[h].h2o.acc.empty()) state = "H2O accumulators";
        }
        if (state != nullptr) {
          return FailedPrecondition("eviction: layer ", l, " holds ", state, " (evict.policy = \"",
                                    EvictPolicyName(seq.eviction_.policy),
                                    "\"); eviction scoring state is not in ",
                                    "sequence image version ", kSequenceImageVersion);
        }
      }
    }
    for (size_t l = 0; l < seq.layers_.size(); ++l) {
      for (size_t h = 0; h < seq.layers_[l]->heads.size(); ++h) {
        const std::vector<int64_t>& pos = seq.layers_[l]->heads[h].positions;
        bool contiguous = static_cast<int64_t>(pos.size()) == seq.tokens_;
        for (size_t i = 0; contiguous && i < pos.size(); ++i) {
          contiguous = pos[i] == seq.first_position_ + static_cast<int64_t>(i);
        }
        if (!contiguous) {
          return FailedPrecondition("eviction: layer ", l, ", head ", h,
                                    " does not keep exactly positions ", seq.first_position_, "..",
                                    seq.first_position_ + seq.tokens_ - 1, " (tokens evicted)");
        }
      }
    }
    return OkStatus();
  }

  static StatusOr<std::vector<uint8_t>> Export(const KvSequence& seq, int64_t m,
                                               std::string_view model_id) {
    KVCTL_RETURN_IF_ERROR(CheckExportable(seq));
    KVCTL_RETURN_IF_ERROR(CheckCut(seq, m));
    if (model_id.size() > kImageMaxModelIdBytes) {
      return InvalidArgument("model_id: ", model_id.size(), " bytes, expected at most ",
                             kImageMaxModelIdBytes);
    }
    // The image's CRC would seal whatever the pages hold: check them first.
    KVCTL_RETURN_IF_ERROR(seq.VerifyForCopy());
    const bool prefix = m < seq.tokens_;
    const SequenceGeometry& g = seq.geometry_;
    Writer w;
    // One allocation for the whole image (the whole sequence's size bounds a prefix's).
    uint64_t estimate = kFixedHeader + model_id.size();
    for (const auto& layer : seq.layers_) {
      estimate += 16 + kLayerPlanBytes + layer->norms.size() * layer->norms.slot_bytes();
      for (const HeadStream& head : layer->heads) {
        estimate += kHeadSpecBytes + kHeadHeaderBytes + head.rows.size() * head.rows.slot_bytes() +
                    head.records.size() * head.records.slot_bytes();
      }
    }
    w.out().reserve(estimate);
    w.Bytes(kMagic, sizeof(kMagic));
    w.Put<uint32_t>(kSequenceImageVersion);
    w.Put<uint32_t>(0);  // CRC, filled in last.
    w.Put<uint64_t>(0);  // total_bytes, filled in last.
    w.Put<uint32_t>(prefix ? kFlagPrefix : 0);
    w.Put<uint32_t>(static_cast<uint32_t>(model_id.size()));
    for (int v : {g.layers, g.kv_heads, g.head_dim, g.q_heads, static_cast<int>(g.dtype), 0}) {
      w.Put<uint32_t>(static_cast<uint32_t>(v));
    }
    w.Put<int64_t>(seq.first_position_);
    w.Put<int64_t>(m);
    for (uint64_t c : {seq.pressure_reliefs_, seq.pressure_cap_cuts_, seq.lowered_for_others_}) {
      w.Put<uint64_t>(prefix ? 0 : c);
    }
    KVCTL_CHECK(w.size() == kFixedHeader);
    w.Bytes(model_id.data(), model_id.size());
    for (const auto& layer : seq.layers_) {
      w.Put<uint32_t>(layer->plan.lossless ? 1 : 0);
      w.Put<int32_t>(layer->plan.rules.sink_tokens);
      w.Put<int32_t>(layer->plan.rules.flush_tokens);
      for (const HeadStream& head : layer->heads) {
        const QuantSpec& s = head.spec;
        w.Put<uint32_t>(static_cast<uint32_t>(s.method));
        for (int v : {s.head_dim, s.k_bits, s.v_bits, s.block_tokens, s.k_group_tokens,
                      s.v_group_channels, s.sinkhorn_iters}) {
          w.Put<int32_t>(v);
        }
      }
    }
    for (const auto& layer : seq.layers_) ExportLayer(*layer, seq.tokens_, m, &w);
    w.PutAt<uint64_t>(16, w.size());
    w.PutAt<uint32_t>(kCrcOffset, Crc32c(w.out().data() + kCrcCovers, w.size() - kCrcCovers));
    return std::move(w.out());
  }

  // One layer section, cut to the first m of `tokens` tokens (CheckCut passed).
  static void ExportLayer(const LayerState& layer, int64_t tokens, int64_t m, Writer* w) {
    const size_t start = w->size();
    w->Put<uint64_t>(0);  // section_bytes, filled in below.
    struct Cut {
      uint32_t sinks, tail, records;
    };
    std::vector<Cut> cuts;
    for (const HeadStream& head : layer.heads) {
      Cut c{static_cast<uint32_t>(head.sink_rows), static_cast<uint32_t>(head.tail_rows),
            static_cast<uint32_t>(head.records.size())};
      if (m < tokens) {
        const int64_t g = head.spec.block_tokens;
        const int64_t q = head.sink_rows + static_cast<int64_t>(c.records) * g;
        c.sinks = static_cast<uint32_t>(std::min<int64_t>(head.sink_rows, m));
        if (m >= q) {
          c.tail = static_cast<uint32_t>(m - q);
        } else {
          c.tail = 0;
          c.records = static_cast<uint32_t>(std::max<int64_t>(0, m - head.sink_rows) / g);
        }
      }
      cuts.push_back(c);
    }
    const bool norms =
        layer.norms.size() > 0 ||
        (!layer.plan.lossless && TraitsOf(layer.plan.head_specs[0].method).needs_token_norms);
    const uint32_t norm_slots = norms ? cuts[0].records : 0;
    w->Put<uint32_t>(norm_slots);
    w->Put<uint32_t>(0);
    for (size_t h = 0; h < layer.heads.size(); ++h) {
      w->Put<uint32_t>(cuts[h].sinks);
      w->Put<uint32_t>(cuts[h].tail);
      w->Put<uint32_t>(cuts[h].records);
      w->Put<uint32_t>(0);
      WriteUsage(m < tokens ? HeadUsage{} : layer.heads[h].usage, w);
    }
    for (size_t h = 0; h < layer.heads.size(); ++h) {
      const HeadStream& head = layer.heads[h];
      const size_t slot = head.rows.slot_bytes();
      for (uint32_t i = 0; i < cuts[h].sinks; ++i) w->Bytes(head.rows.Slot(i), slot);
      for (uint32_t i = 0; i < cuts[h].tail; ++i) {
        w->Bytes(head.rows.Slot(head.sink_rows + i), slot);
      }
      for (uint32_t i = 0; i < cuts[h].records; ++i) {
        w->Bytes(head.records.Slot(i), head.records.slot_bytes());
      }
    }
    for (uint32_t i = 0; i < norm_slots; ++i) {
      w->Bytes(layer.norms.Slot(i), layer.norms.slot_bytes());
    }
    w->PutAt<uint64_t>(start, w->size() - start - sizeof(uint64_t));
  }

  static StatusOr<std::unique_ptr<KvSequence>> Import(
      PageAllocator* pool, std::span<const uint8_t> image, const SequenceGeometry& geometry,
      std::string_view model_id, EvictionSettings eviction, PressureSettings pressure) {
    KVCTL_ASSIGN_OR_RETURN(ParsedHeader header, ParseHeader(image));
    const ImageInfo& info = header.info;
    const SequenceGeometry& ig = info.geometry;
    auto differs = [](const char* field, int64_t got, int64_t want) {
      return FailedPrecondition("sequence image: geometry ", field, " is ", got,
                                ", this sequence's is ", want);
    };
    if (ig.layers != geometry.layers) return differs("layers", ig.layers, geometry.layers);
    if (ig.kv_heads != geometry.kv_heads)
      return differs("kv_heads", ig.kv_heads, geometry.kv_heads);
    if (ig.head_dim != geometry.head_dim)
      return differs("head_dim", ig.head_dim, geometry.head_dim);
    if (ig.q_heads != geometry.q_heads) return differs("q_heads", ig.q_heads, geometry.q_heads);
    if (ig.dtype != geometry.dtype) {
      return FailedPrecondition("sequence image: geometry dtype is ", DTypeName(ig.dtype),
                                ", this sequence's is ", DTypeName(geometry.dtype));
    }
    if (!info.model_id.empty() && !model_id.empty() && info.model_id != model_id) {
      return FailedPrecondition("sequence image: model_id is \"", info.model_id,
                                "\", this sequence's is \"", model_id, "\"");
    }
    if (!pressure.curves.empty() &&
        pressure.curves.size() != static_cast<size_t>(geometry.layers) * geometry.kv_heads) {
      return InvalidArgument("pressure.curves: got ", pressure.curves.size(), ", expected ",
                             geometry.layers * geometry.kv_heads, " (layers x kv_heads) or none");
    }
    if (eviction.enabled && !eviction.head_caps.empty() &&
        eviction.head_caps.size() != static_cast<size_t>(geometry.layers) * geometry.kv_heads) {
      return InvalidArgument("eviction.head_caps: got ", eviction.head_caps.size(), ", expected ",
                             geometry.layers * geometry.kv_heads);
    }
    KVCTL_RETURN_IF_ERROR(CheckPlans(info.plans, geometry, *pool, eviction, info.tokens));
    Reader r(image.subspan(static_cast<size_t>(header.body_offset)), header.body_offset);
    std::vector<LayerBody> bodies;
    bodies.reserve(info.plans.size());
    for (int l = 0; l < ig.layers; ++l) {
      KVCTL_ASSIGN_OR_RETURN(LayerBody body, ReadLayer(r, l, info.plans[l], ig, info.tokens));
      KVCTL_RETURN_IF_ERROR(CheckValues(l, info.plans[l], ig, body));
      bodies.push_back(std::move(body));
    }
    if (r.remaining() != 0) {
      return DataLoss("sequence image: ", r.remaining(), " bytes after the last layer section");
    }
    auto seq = std::make_unique<KvSequence>(pool, geometry, info.plans, std::move(eviction),
                                            std::move(pressure));
    // Every page in one allocation, as an append does: all or nothing.
    SlabPlan slab_plan;
    for (int l = 0; l < ig.layers; ++l) {
      LayerState& layer = *seq->layers_[l];
      for (int h = 0; h < ig.kv_heads; ++h) {
        const HeadBody& hb = bodies[l].heads[h];
        slab_plan.Count(layer.heads[h].rows, size_t{hb.sink_rows} + hb.tail_rows);
        slab_plan.Count(layer.heads[h].records, hb.records);
      }
      slab_plan.Count(layer.norms, bodies[l].norm_slots);
    }
    const size_t pages = slab_plan.Pages();
    StatusOr<std::vector<uint32_t>> reserved = std::vector<uint32_t>{};
    if (pages > 0) {
      if (pages > pool->pages_total()) {
        return ResourceExhausted("sequence image: needs ", pages, " pool pages, the pool has ",
                                 pool->pages_total());
      }
      reserved = pool->AllocateMany(static_cast<uint32_t>(pages));
    }
    if (!reserved.ok()) {
      return ResourceExhausted("sequence image: needs ", pages, " pool pages of ",
                               pool->page_bytes(), " bytes: ", reserved.status().message());
    }
    Fill(seq.get(), bodies, info.tokens, info.first_position, &*reserved);
    for (uint32_t page : *reserved) KVCTL_CHECK(pool->Free(page).ok());  // Not needed after all.
    seq->tokens_ = info.tokens;
    // No head re-allocation ever ran in an exported sequence (it would have left utility), so
    // the original's count of tokens since the last one is all of them.
    seq->since_realloc_ = info.tokens;
    seq->first_position_ = info.first_position;
    seq->pressure_reliefs_ = header.pressure_reliefs;
    seq->pressure_cap_cuts_ = header.pressure_cap_cuts;
    seq->lowered_for_others_ = header.lowered_for_others;
    KVCTL_RETURN_IF_ERROR(seq->Publish());
    return seq;
  }

  // Writes the checked bodies into the sequence's streams. Cannot fail.
  static void Fill(KvSequence* seq, const std::vector<LayerBody>& bodies, int64_t tokens,
                   int64_t first_position, std::vector<uint32_t>* reserved) {
    for (size_t l = 0; l < bodies.size(); ++l) {
      LayerState& layer = *seq->layers_[l];
      for (size_t h = 0; h < layer.heads.size(); ++h) {
        HeadStream& head = layer.heads[h];
        const HeadBody& hb = bodies[l].heads[h];
        const size_t rows = size_t{hb.sink_rows} + hb.tail_rows;
        head.rows.Resize(rows, reserved);
        const size_t slot = head.rows.slot_bytes();
        for (size_t i = 0; i < rows; ++i) {
          std::memcpy(head.rows.MutableSlot(i), hb.rows.data() + i * slot, slot);
        }
        head.records.Resize(hb.records, reserved);
        const size_t rb = head.records.slot_bytes();
        for (size_t i = 0; i < hb.records; ++i) {
          std::memcpy(head.records.MutableSlot(i), hb.record_bytes.data() + i * rb, rb);
        }
        head.sink_rows = static_cast<int>(hb.sink_rows);
        head.tail_rows = static_cast<int>(hb.tail_rows);
        head.positions.resize(static_cast<size_t>(tokens));
        for (int64_t i = 0; i < tokens; ++i) head.positions[i] = first_position + i;
        head.usage = hb.usage;
        KVCTL_CHECK(head.count() == tokens);
      }
      const uint32_t slots = bodies[l].norm_slots;
      layer.norms.Resize(slots, reserved);
      const size_t nb = layer.norms.slot_bytes();
      for (size_t i = 0; i < slots; ++i) {
        std::memcpy(layer.norms.MutableSlot(i), bodies[l].norms.data() + i * nb, nb);
      }
    }
  }
};

int64_t LargestExactCut(const KvSequence& seq, int64_t limit, int64_t granule) {
  if (limit < 1 || granule < 1 || !SequenceImageAccess::CheckExportable(seq).ok()) return 0;
  for (int64_t m = std::min(limit, seq.tokens()) / granule * granule; m > 0; m -= granule) {
    if (SequenceImageAccess::CheckCut(seq, m).ok()) return m;
  }
  return 0;
}

StatusOr<std::vector<uint8_t>> ExportImage(const KvSequence& seq, int64_t tokens,
                                           std::string_view model_id) {
  return SequenceImageAccess::Export(seq, tokens, model_id);
}

StatusOr<ImageInfo> ReadImageInfo(std::span<const uint8_t> image) {
  KVCTL_ASSIGN_OR_RETURN(ParsedHeader header, ParseHeader(image));
  return std::move(header.info);
}

StatusOr<std::unique_ptr<KvSequence>> ImportImage(
    PageAllocator* pool, std::span<const uint8_t> image, const SequenceGeometry& geometry,
    std::string_view model_id, EvictionSettings eviction, PressureSettings pressure) {
  return SequenceImageAccess::Import(pool, image, geometry, model_id, std::move(eviction),
                                     std::move(pressure));
}

}  // namespace kvctl
