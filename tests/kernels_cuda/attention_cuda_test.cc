// [cuda] Fused decode attention on the GPU against the CPU scalar reference (DecodeAttentionRef),
// and the host-side validation of CudaAttentionPlan (tagged [cuda-host]: runs without a device).
#include "kernels/cuda/attention_cuda.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/quantize.h"
#include "tests/kernels/attention_cases.h"
#include "tests/kernels_cuda/cuda_device.h"

namespace kvctl {
namespace {

using testing::AttentionCase;
using testing::MakeAttentionCase;
using testing::Spec;

// Runs every head in one GPU call.
Status RunGpu(std::vector<AttentionCase>& heads, int splits) {
  std::vector<HostAttentionHead> host;
  for (AttentionCase& hc : heads) {
    host.push_back({hc.Kv(), hc.q.data(), {hc.out.data(), hc.lse.data()}});
  }
  return DecodeAttentionCudaHost(heads[0].spec, host, heads[0].group, heads[0].scale, splits);
}

// max |out - ref| / max |ref| and the worst |lse - ref| / max(1, |ref|); lse -inf must match.
struct Errors {
  double out = 0, lse = 0;
  bool lse_inf_mismatch = false;
};

Errors Compare(const AttentionCase& hc) {
  Errors e;
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < hc.out.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(hc.ref_out[i])));
    const double err = std::fabs(static_cast<double>(hc.out[i]) - hc.ref_out[i]);
    max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
  }
  e.out = max_ref > 0 ? max_err / max_ref : max_err;
  for (size_t i = 0; i < hc.lse.size(); ++i) {
    const double r = hc.ref_lse[i], g = hc.lse[i];
    if (std::isinf(r) || std::isinf(g)) {
      e.lse_inf_mismatch |= r != g;
      continue;
    }
    const double err = std::fabs(g - r) / std::max(1.0, std::fabs(r));
    e.lse = std::isnan(err) ? INFINITY : std::max(e.lse, err);
  }
  return e;
}

// GPU vs CPU reference: device expf/logf, a lane-parallel softmax sum and the split-K merge.
constexpr double kTol = 1e-4;

struct Shape {
  const char* name;
  int sinks, records, tail;
};

TEST_CASE("AttentionCuda: every method, width, head_dim and shape matches DecodeAttentionRef",
          "[cuda]") {
  if (!testing::CudaDeviceOrSkip()) return;
  const Shape shapes[] = {{"window only", 0, 0, 37},
                          {"sinks + tail", 5, 0, 11},
                          {"one record", 0, 1, 0},
                          {"sinks + one record + tail", 3, 1, 9},
                          {"sinks + many records + tail", 7, 9, 21}};
  const DType dtypes[] = {DType::kF16, DType::kF32, DType::kBF16};
  double worst = 0;
  int call = 0;
  for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kKivi, QuantMethod::kQuaRot,
                        QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo}) {
    for (int bits : {2, 3, 4, 8}) {
      if (m == QuantMethod::kFp16 && bits != 2) continue;
      if (m == QuantMethod::kTurbo && bits == 8) continue;  // Its widths are 2, 3, 4.
      const int b = m == QuantMethod::kFp16 ? 16 : bits;
      for (int d : {64, 128}) {
        for (int g : {1, 3, 4}) {
          const QuantSpec spec = Spec(m, d, b, b);
          const DType dt = dtypes[call % 3];
          std::vector<AttentionCase> heads;
          for (const Shape& s : shapes) {
            heads.push_back(MakeAttentionCase(spec, g, s.sinks, s.records, s.tail, dt, 11 + call));
          }
          for (int splits : {0, 1, 4}) {
            INFO(QuantMethodName(m) << " bits " << bits << " D " << d << " g " << g << " window "
                                    << static_cast<int>(dt) << " splits " << splits);
            const Status st = RunGpu(heads, splits);
            REQUIRE(st.ok());
            for (size_t h = 0; h < heads.size(); ++h) {
              INFO(shapes[h].name);
              const Errors e = Compare(heads[h]);
              CHECK(e.out <= kTol);
              CHECK(e.lse <= kTol);
              CHECK_FALSE(e.lse_inf_mismatch);
              worst = std::max({worst, e.out, e.lse});
            }
          }
          ++call;
        }
      }
    }
  }
  std::printf("AttentionCuda: worst relative error vs DecodeAttentionRef %.3g\n", worst);
}

TEST_CASE("AttentionCuda: mixed widths and GQA group 8 across many heads", "[cuda]") {
  if (!testing::CudaDeviceOrSkip()) return;
  for (auto [kb, vb] : {std::pair{4, 2}, std::pair{2, 4}}) {
    for (QuantMethod m : {QuantMethod::kKivi, QuantMethod::kKvarn, QuantMethod::kOscar}) {
      const QuantSpec spec = Spec(m, 128, kb, vb);
      std::vector<AttentionCase> heads;
      for (int h = 0; h < 6; ++h) {
        heads.push_back(MakeAttentionCase(spec, 8, 2 * h, 1 + 3 * h, 5 + h, DType::kF16, 100 + h));
      }
      INFO(QuantMethodName(m) << " k" << kb << "v" << vb);
      REQUIRE(RunGpu(heads, 0).ok());
      for (const AttentionCase& hc : heads) {
        const Errors e = Compare(hc);
        CHECK(e.out <= kTol);
        CHECK(e.lse <= kTol);
      }
    }
  }
}

TEST_CASE("AttentionCuda: long context over 128 split-K parts", "[cuda]") {
  if (!testing::CudaDeviceOrSkip()) return;
  for (QuantMethod m : {QuantMethod::kKvarn, QuantMethod::kKivi}) {
    const QuantSpec spec = Spec(m, 128, 2, 2);
    const int records = 16384 / spec.block_tokens;  // 16K quantized tokens.
    std::vector<AttentionCase> heads;
    heads.push_back(
        MakeAttentionCase(spec, 4, TraitsOf(m).streaming.sink_tokens, records, 64, DType::kF16, 5));
    INFO(QuantMethodName(m));
    REQUIRE(RunGpu(heads, kMaxCudaAttentionSplits).ok());
    const Errors e = Compare(heads[0]);
    CHECK(e.out <= kTol);
    CHECK(e.lse <= kTol);
  }
}

TEST_CASE("AttentionCuda: empty heads and more parts than records", "[cuda]") {
  if (!testing::CudaDeviceOrSkip()) return;
  const QuantSpec spec = Spec(QuantMethod::kKivi, 64, 2, 2);
  std::vector<AttentionCase> heads;
  heads.push_back(MakeAttentionCase(spec, 3, 0, 0, 0, DType::kF16, 1));  // No token at all.
  heads.push_back(MakeAttentionCase(spec, 3, 0, 2, 0, DType::kF16, 2));  // 2 records, 16 parts.
  REQUIRE(RunGpu(heads, 16).ok());
  for (float x : heads[0].out) CHECK(x == 0.0f);
  for (float x : heads[0].lse) CHECK(x == -INFINITY);
  const Errors e = Compare(heads[1]);
  CHECK(e.out <= kTol);
  CHECK(e.lse <= kTol);
}

// A changed code must move the GPU output exactly like the CPU's: the kernel reads the records
// it is given (no stale or shared state between heads).
TEST_CASE("AttentionCuda: one changed V code moves the output like the reference", "[cuda]") {
  if (!testing::CudaDeviceOrSkip()) return;
  const QuantSpec spec = Spec(QuantMethod::kKivi, 64, 2, 2);
  std::vector<AttentionCase> heads;
  heads.push_back(MakeAttentionCase(spec, 1, 0, 3, 0, DType::kF16, 9));
  heads.push_back(heads[0]);
  AttentionCase& changed = heads[1];
  changed.rec_ptrs.clear();
  for (const auto& r : changed.records) changed.rec_ptrs.push_back(r.data());
  changed.norm_ptrs.clear();
  for (const auto& n : changed.norms) changed.norm_ptrs.push_back(n.data());
  const BlockLayout l = BlockLayoutOf(spec);
  changed.records[1][l.v_codes_offset] ^= 0x3;  // Token 0, channel 0 of record 1.
  REQUIRE(DecodeAttentionRef(spec, changed.Kv(), {changed.q.data(), 1, changed.scale},
                             {changed.ref_out.data(), changed.ref_lse.data()})
              .ok());
  REQUIRE(RunGpu(heads, 0).ok());
  for (const AttentionCase& hc : heads) {
    const Errors e = Compare(hc);
    CHECK(e.out <= kTol);
  }
  CHECK(std::fabs(heads[0].out[0] - heads[1].out[0]) > 1e-6f);
}

TEST_CASE("AttentionCuda: plan validation names the field", "[cuda-host]") {
  const QuantSpec spec = Spec(QuantMethod::kKivi, 64, 2, 2);
  float dummy = 0;
  const uint8_t* rec = nullptr;
  CudaAttentionHead ok_head;
  ok_head.q = &dummy;
  ok_head.out = &dummy;
  ok_head.lse = &dummy;
  const auto error = [&](std::vector<CudaAttentionHead> heads, int group, float scale, int splits) {
    auto plan = CudaAttentionPlan::Create(spec, heads, group, scale, DType::kF16, splits);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kInvalidArgument);
    return plan.status().message();
  };
  CHECK_THAT(error({}, 1, 1.0f, 0), Catch::Contains("heads"));
  CHECK_THAT(error({ok_head}, 0, 1.0f, 0), Catch::Contains("group: got 0"));
  CHECK_THAT(error({ok_head}, 1, NAN, 0), Catch::Contains("scale"));
  CHECK_THAT(error({ok_head}, 1, 1.0f, kMaxCudaAttentionSplits + 1), Catch::Contains("splits"));
  CudaAttentionHead h = ok_head;
  h.num_records = 2;
  CHECK_THAT(error({ok_head, h}, 1, 1.0f, 0), Catch::Contains("heads[1].records"));
  h.records = &rec;
  h.record_norms = reinterpret_cast<const float* const*>(&rec);
  CHECK_THAT(error({h}, 1, 1.0f, 0), Catch::Contains("heads[0].record_norms"));
  h = ok_head;
  h.window_rows = 4;
  CHECK_THAT(error({h}, 1, 1.0f, 0), Catch::Contains("window_k/window_v"));
  h.window_k = h.window_v = reinterpret_cast<const uint8_t*>(&dummy);
  h.window_k_row_bytes = h.window_v_row_bytes = 64;  // fp16 needs 128.
  CHECK_THAT(error({h}, 1, 1.0f, 0), Catch::Contains("expected >= 128"));
  h = ok_head;
  h.q = nullptr;
  CHECK_THAT(error({h}, 1, 1.0f, 0), Catch::Contains("q, out and lse"));
  QuantSpec bad = spec;
  bad.head_dim = 12;
  CHECK_FALSE(
      CudaAttentionPlan::Create(bad, std::vector<CudaAttentionHead>{ok_head}, 1, 1.0f, DType::kF16)
          .ok());
}

}  // namespace
}  // namespace kvctl
