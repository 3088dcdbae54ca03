// The CUDA attention kernel's device code (attn::WarpOps, AttendPart, MergeChunk from
// kernels/cuda/attention_warp_ops.h) run on the CPU: 32 std::threads play the 32 lanes of a warp,
// Sync() is a std::barrier and ShflXor goes through a shared slot array between two barriers.
// This checks the lane partitioning, the barriers (a missing one lets a lane read a value before
// another lane wrote it: wrong numbers here) and the split-K indexing without a GPU. Built in
// every configuration; tagged [kernels].
#include <algorithm>
#include <barrier>
#include <catch2/catch.hpp>
#include <cmath>
#include <thread>
#include <utility>
#include <vector>

#include "common/half.h"
#include "kernels/attention.h"
#include "kernels/block_codec.h"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/attention_warp_ops.h"
#include "kernels/quantize.h"
#include "tests/kernels/attention_cases.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

using testing::AttentionCase;
using testing::MakeAttentionCase;

// The emulated warp: one instance shared by 32 threads.
struct ThreadWarp {
  static thread_local int lane;
  static std::barrier<>* barrier;
  static float slots[attn::kWarpLanes];

  static int Lane() { return lane; }
  static void Sync() { barrier->arrive_and_wait(); }
  static float ShflXor(float v, int mask) {
    slots[lane] = v;
    Sync();
    const float r = slots[lane ^ mask];
    Sync();
    return r;
  }
};
thread_local int ThreadWarp::lane = 0;
std::barrier<>* ThreadWarp::barrier = nullptr;
float ThreadWarp::slots[attn::kWarpLanes];

using EmuOps = attn::WarpOps<ThreadWarp>;

// Same fields as CudaAttentionHead, host pointers.
struct Head {
  const uint8_t* const* records = nullptr;
  const float* const* record_norms = nullptr;
  int64_t num_records = 0;
  const uint8_t* window_k = nullptr;
  const uint8_t* window_v = nullptr;
  int64_t window_k_row_bytes = 0, window_v_row_bytes = 0;
  int64_t window_rows = 0;
  const float* q = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
};

// One (layer, KV head): `records` records of head 0 of a synthetic stream, an fp16 window of
// `window` rows (the tokens after them), and the CPU reference result.
struct Case {
  std::vector<std::vector<uint8_t>> records;
  std::vector<std::vector<float>> norms;
  std::vector<const uint8_t*> rec_ptrs;
  std::vector<const float*> norm_ptrs;
  std::vector<uint16_t> wk, wv;  // [window, D] fp16.
  std::vector<float> q, out, lse, ref_out, ref_lse;
};

Case MakeCase(const QuantSpec& spec, int group, int records, int window, uint64_t seed) {
  Case c;
  const int d = spec.head_dim, gt = spec.block_tokens;
  const int64_t tokens = static_cast<int64_t>(records) * gt + window;
  const SyntheticKv kv = GenerateSyntheticKv({.tokens = std::max<int64_t>(tokens, 1),
                                              .heads = 1,
                                              .head_dim = d,
                                              .q_heads = group,
                                              .seed = seed});
  std::vector<float> norms(kv.tokens);
  ComputeTokenNorms(kv.KView(), norms.data());
  const size_t rb = BlockLayoutOf(spec).record_bytes;
  for (int r = 0; r < records; ++r) {
    const int64_t t0 = static_cast<int64_t>(r) * gt;
    c.records.emplace_back(rb);
    c.norms.emplace_back(norms.begin() + t0, norms.begin() + t0 + gt);
    const BlockInput in{kv.k.data() + t0 * d, kv.v.data() + t0 * d, d, c.norms.back().data()};
    REQUIRE(QuantizeBlockRef(spec, in, c.records.back().data()).ok());
  }
  for (size_t r = 0; r < c.records.size(); ++r) {
    c.rec_ptrs.push_back(c.records[r].data());
    c.norm_ptrs.push_back(c.norms[r].data());
  }
  for (int64_t t = tokens - window; t < tokens; ++t) {
    for (int ch = 0; ch < d; ++ch) {
      c.wk.push_back(FloatToHalf(kv.k[t * d + ch]));
      c.wv.push_back(FloatToHalf(kv.v[t * d + ch]));
    }
  }
  const float* ql = kv.q.data() + (kv.tokens - 1) * group * d;
  c.q.assign(ql, ql + group * d);
  c.out.assign(group * d, NAN);
  c.lse.assign(group, NAN);
  c.ref_out.assign(group * d, 0.0f);
  c.ref_lse.assign(group, 0.0f);
  AttentionKv akv;
  akv.records = c.rec_ptrs.data();
  akv.record_norms = spec.method == QuantMethod::kOscar ? c.norm_ptrs.data() : nullptr;
  akv.num_records = records;
  if (window > 0) {
    akv.window_k = KvTensorView::Contiguous(c.wk.data(), DType::kF16, window, 1, d);
    akv.window_v = KvTensorView::Contiguous(c.wv.data(), DType::kF16, window, 1, d);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  REQUIRE(DecodeAttentionRef(spec, akv, {c.q.data(), group, scale},
                             {c.ref_out.data(), c.ref_lse.data()})
              .ok());
  return c;
}

// Both kernels' bodies on the CPU: every part on 32 threads (one warp) with its Work pre-filled
// with NaN (shared memory is garbage too), then every merge item.
template <class H>
void RunParts(attn::PartsArgs<H>& a) {
  const int64_t parts = static_cast<int64_t>(a.num_heads) * a.splits;
  std::vector<float> part_out(parts * a.group * a.spec.head_dim, NAN), part_lse(parts * a.group);
  std::vector<float> scratch(a.scratch_floats);
  a.part_out = part_out.data();
  a.part_lse = part_lse.data();
  std::barrier<> barrier(attn::kWarpLanes);
  ThreadWarp::barrier = &barrier;
  for (int64_t part = 0; part < parts; ++part) {
    std::fill(scratch.begin(), scratch.end(), NAN);
    std::vector<std::thread> lanes;
    for (int l = 0; l < attn::kWarpLanes; ++l) {
      lanes.emplace_back([&, l] {
        ThreadWarp::lane = l;
        attn::AttendPart<EmuOps>(a, part, scratch.data());
      });
    }
    for (std::thread& t : lanes) t.join();
  }
  for (int64_t idx = 0; idx < attn::MergeChunks(a); ++idx) attn::MergeChunk<128>(a, idx);
}

// Runs the two kernels' bodies: every part on 32 threads (one warp), then every merge item.
void RunEmulated(const QuantSpec& spec, int group, int splits, std::vector<Case>& cases) {
  const int d = spec.head_dim;
  std::vector<Head> heads(cases.size());
  for (size_t h = 0; h < cases.size(); ++h) {
    Case& c = cases[h];
    heads[h].records = c.rec_ptrs.empty() ? nullptr : c.rec_ptrs.data();
    heads[h].record_norms =
        spec.method == QuantMethod::kOscar && !c.norm_ptrs.empty() ? c.norm_ptrs.data() : nullptr;
    heads[h].num_records = static_cast<int64_t>(c.rec_ptrs.size());
    heads[h].window_rows = static_cast<int64_t>(c.wk.size()) / d;
    heads[h].window_k = reinterpret_cast<const uint8_t*>(c.wk.data());
    heads[h].window_v = reinterpret_cast<const uint8_t*>(c.wv.data());
    heads[h].window_k_row_bytes = heads[h].window_v_row_bytes = 2 * d;
    heads[h].q = c.q.data();
    heads[h].out = c.out.data();
    heads[h].lse = c.lse.data();
  }
  attn::PartsArgs<Head> a;
  a.spec = spec;
  a.layout = BlockLayoutOf(spec);
  a.rotates = TraitsOf(spec.method).rotates;
  a.window_format = attn::kF16;
  a.group = group;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.heads = heads.data();
  a.num_heads = static_cast<int>(heads.size());
  a.splits = splits;
  a.scratch_floats = attn::ScratchFloats(spec, group);
  RunParts(a);
}

double RelErr(const std::vector<float>& x, const std::vector<float>& ref) {
  double m = 0, e = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(ref[i])));
    const double d = std::fabs(static_cast<double>(x[i]) - ref[i]);
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return m > 0 ? e / m : e;
}

TEST_CASE("WarpOpsEmulation: 32 threads as one warp match DecodeAttentionRef", "[kernels]") {
  struct Cfg {
    QuantMethod m;
    int bits, d, group, splits;
  };
  // Every method once at D=64 with odd group sizes and a tail; splits > records in one.
  const Cfg cfgs[] = {{QuantMethod::kFp16, 16, 64, 3, 2},  {QuantMethod::kKivi, 2, 64, 3, 2},
                      {QuantMethod::kKivi, 3, 64, 5, 3},   {QuantMethod::kQuaRot, 4, 64, 1, 2},
                      {QuantMethod::kKvarn, 2, 64, 3, 2},  {QuantMethod::kOscar, 2, 64, 4, 2},
                      {QuantMethod::kOscar, 8, 128, 2, 4}, {QuantMethod::kKvarn, 3, 128, 1, 1},
                      {QuantMethod::kTurbo, 2, 64, 3, 2},  {QuantMethod::kTurbo, 4, 128, 4, 3}};
  for (const Cfg& cfg : cfgs) {
    StatusOr<QuantSpec> spec = MakeQuantSpec(cfg.m, cfg.d, cfg.bits, cfg.bits);
    REQUIRE(spec.ok());
    INFO(QuantMethodName(cfg.m) << " bits " << cfg.bits << " D " << cfg.d << " g " << cfg.group
                                << " splits " << cfg.splits);
    std::vector<Case> cases;
    cases.push_back(MakeCase(*spec, cfg.group, 3, 13, 1));  // Records + window.
    cases.push_back(MakeCase(*spec, cfg.group, 0, 7, 2));   // Window only.
    cases.push_back(MakeCase(*spec, cfg.group, 1, 0, 3));   // One record.
    cases.push_back(MakeCase(*spec, cfg.group, 0, 0, 4));   // Nothing.
    RunEmulated(*spec, cfg.group, cfg.splits, cases);
    for (size_t h = 0; h < cases.size(); ++h) {
      INFO("head " << h);
      CHECK(RelErr(cases[h].out, cases[h].ref_out) <= 1e-5);
      for (int i = 0; i < cfg.group; ++i) {
        const float r = cases[h].ref_lse[i], g = cases[h].lse[i];
        if (std::isinf(r)) {
          CHECK(g == r);
        } else {
          CHECK(std::fabs(g - r) <= 1e-5 * std::max(1.0f, std::fabs(r)));
        }
      }
    }
  }
}

struct BarrierSync {
  void operator()() const { ThreadWarp::Sync(); }
};

// The CUDA warp-per-record encoder (quant_cuda.cu): block::EncodeRecord on 32 lanes must write the
// reference's bytes for every method.
TEST_CASE("WarpOpsEmulation: 32-lane EncodeRecord writes the reference's bytes", "[kernels]") {
  for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kKivi, QuantMethod::kQuaRot,
                        QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo}) {
    for (auto [kb, vb] : {std::pair{2, 2}, std::pair{3, 3}, std::pair{4, 2}, std::pair{8, 8}}) {
      for (int d : {64, 128}) {
        if (m == QuantMethod::kFp16 && kb != 2) continue;
        if (m == QuantMethod::kTurbo && kb == 8) continue;  // Its widths are 2, 3, 4.
        const int fk = m == QuantMethod::kFp16 ? 16 : kb, fv = m == QuantMethod::kFp16 ? 16 : vb;
        StatusOr<QuantSpec> spec = MakeQuantSpec(m, d, fk, fv);
        REQUIRE(spec.ok());
        const int g = spec->block_tokens;
        const SyntheticKv kv =
            GenerateSyntheticKv({.tokens = g, .heads = 2, .head_dim = d, .seed = 3});
        std::vector<float> norms(g);
        ComputeTokenNorms(kv.KView(), norms.data());
        const BlockLayout l = BlockLayoutOf(*spec);
        const BlockInput in{kv.k.data() + d, kv.v.data() + d, 2 * d,
                            m == QuantMethod::kOscar ? norms.data() : nullptr};
        std::vector<uint8_t> ref(l.record_bytes), lanes_rec(l.record_bytes, 0);
        REQUIRE(QuantizeBlockRef(*spec, in, ref.data()).ok());
        std::vector<float> scratch(block::ScratchFloats(*spec), NAN);
        std::barrier<> barrier(attn::kWarpLanes);
        ThreadWarp::barrier = &barrier;
        std::vector<int> ok(attn::kWarpLanes, 0);
        std::vector<std::thread> lanes;
        for (int lane = 0; lane < attn::kWarpLanes; ++lane) {
          lanes.emplace_back([&, lane] {
            ThreadWarp::lane = lane;
            ok[lane] = block::EncodeRecord(*spec, l, in.k, in.v, in.row_stride, in.token_norms,
                                           scratch.data(), lanes_rec.data(),
                                           {lane, attn::kWarpLanes}, BarrierSync{});
          });
        }
        for (std::thread& t : lanes) t.join();
        INFO(QuantMethodName(m) << " k" << fk << "v" << fv << " D " << d);
        CHECK(std::count(ok.begin(), ok.end(), 1) == attn::kWarpLanes);
        CHECK(lanes_rec == ref);
      }
    }
  }
}

// DecodeAttentionCudaHost's host half (StageAttention + BuildAttentionTables) with the images
// placed in host memory, then both kernels' bodies on 32 threads: what the GPU path computes,
// minus the copies.
TEST_CASE("WarpOpsEmulation: staged heads (DecodeAttentionCudaHost's layout) match the reference",
          "[kernels]") {
  struct Cfg {
    QuantMethod m;
    int bits, d, group, splits;
    DType dt;
  };
  const Cfg cfgs[] = {{QuantMethod::kOscar, 2, 64, 3, 3, DType::kBF16},
                      {QuantMethod::kKivi, 4, 64, 2, 2, DType::kF32},
                      {QuantMethod::kKvarn, 2, 64, 1, 1, DType::kF16}};
  for (const Cfg& cfg : cfgs) {
    StatusOr<QuantSpec> spec = MakeQuantSpec(cfg.m, cfg.d, cfg.bits, cfg.bits);
    REQUIRE(spec.ok());
    INFO(QuantMethodName(cfg.m) << " splits " << cfg.splits);
    std::vector<AttentionCase> cases;
    cases.push_back(MakeAttentionCase(*spec, cfg.group, 0, 4, 9, cfg.dt, 1));
    cases.push_back(MakeAttentionCase(*spec, cfg.group, 0, 0, 0, cfg.dt, 2));  // Nothing.
    cases.push_back(MakeAttentionCase(*spec, cfg.group, 0, 1, 0, cfg.dt, 3));
    cases.push_back(MakeAttentionCase(*spec, cfg.group, 0, 0, 5, cfg.dt, 4));
    std::vector<HostAttentionHead> host;
    for (AttentionCase& c : cases) {
      host.push_back({c.Kv(), c.q.data(), {c.out.data(), c.lse.data()}});
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(cfg.d));
    AttentionStaging st;
    REQUIRE(StageAttention(*spec, host, cfg.group, scale, &st).ok());
    std::vector<float> out(st.q.size(), NAN), lse(cases.size() * cfg.group, NAN);
    std::vector<const uint8_t*> rec_ptrs(st.total_records);
    std::vector<const float*> norm_ptrs(st.total_records);
    const AttentionPlacement at{st.records.data(), st.norms.data(), st.windows.data(),
                                st.q.data(),       out.data(),      lse.data(),
                                rec_ptrs.data(),   norm_ptrs.data()};
    std::vector<CudaAttentionHead> table;
    BuildAttentionTables(*spec, st, cfg.group, at, rec_ptrs.data(), norm_ptrs.data(), &table);
    attn::PartsArgs<CudaAttentionHead> a;
    a.spec = *spec;
    a.layout = BlockLayoutOf(*spec);
    a.rotates = TraitsOf(cfg.m).rotates;
    a.window_format = attn::WindowFormat(st.window_dtype);
    a.group = cfg.group;
    a.scale = scale;
    a.heads = table.data();
    a.num_heads = static_cast<int>(table.size());
    a.splits = cfg.splits;
    a.scratch_floats = attn::ScratchFloats(*spec, cfg.group);
    RunParts(a);
    for (size_t h = 0; h < cases.size(); ++h) {
      INFO("head " << h);
      const std::vector<float> got(out.begin() + st.heads[h].q,
                                   out.begin() + st.heads[h].q + cfg.group * cfg.d);
      CHECK(RelErr(got, cases[h].ref_out) <= 1e-5);
      for (int i = 0; i < cfg.group; ++i) {
        const float r = cases[h].ref_lse[i], g = lse[h * cfg.group + i];
        if (std::isinf(r)) {
          CHECK(g == r);
        } else {
          CHECK(std::fabs(g - r) <= 1e-5 * std::max(1.0f, std::fabs(r)));
        }
      }
    }
  }
  // Mixed window dtypes in one call are refused by name.
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kKivi, 64, 2, 2);
  AttentionCase a = MakeAttentionCase(*spec, 1, 0, 0, 3, DType::kF16, 5);
  AttentionCase b = MakeAttentionCase(*spec, 1, 0, 0, 3, DType::kF32, 6);
  std::vector<HostAttentionHead> mixed = {{a.Kv(), a.q.data(), {a.out.data(), a.lse.data()}},
                                          {b.Kv(), b.q.data(), {b.out.data(), b.lse.data()}}};
  AttentionStaging st;
  const Status status = StageAttention(*spec, mixed, 1, 0.125f, &st);
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("heads[1].kv.window_k.dtype"));
}

}  // namespace
}  // namespace kvctl
