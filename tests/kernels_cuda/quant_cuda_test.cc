// [cuda] GPU block codecs against the CPU reference. Without a device each [cuda] case is skipped
// (tests/kernels_cuda/cuda_device.h); Catch's main is tests/catch_main.cc, as in every test binary.
#include "kernels/cuda/quant_cuda.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/quantize.h"
#include "tests/kernels_cuda/cuda_device.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

// Every method x bit width (K and V equal, plus k4v2 / k2v4) x head_dim 64 and 128.
TEST_CASE("QuantCuda: records and dequantized rows match the CPU reference", "[cuda]") {
  if (!testing::CudaDeviceOrSkip()) return;
  for (QuantMethod m : {QuantMethod::kFp16, QuantMethod::kKivi, QuantMethod::kQuaRot,
                        QuantMethod::kKvarn, QuantMethod::kOscar, QuantMethod::kTurbo}) {
    for (auto [wk, wv] : {std::pair{2, 2}, std::pair{3, 3}, std::pair{4, 4}, std::pair{8, 8},
                          std::pair{4, 2}, std::pair{2, 4}}) {
      for (int d : {64, 128}) {
        if (m == QuantMethod::kFp16 && (wk != 2 || wv != 2)) continue;
        if (m == QuantMethod::kTurbo && (wk == 8 || wv == 8)) continue;  // Widths 2, 3, 4.
        const int kb = m == QuantMethod::kFp16 ? 16 : wk;
        const int vb = m == QuantMethod::kFp16 ? 16 : wv;
        StatusOr<QuantSpec> spec = MakeQuantSpec(m, d, kb, vb);
        REQUIRE(spec.ok());
        const int g = spec->block_tokens, heads = 2, n_blocks = 3;
        SyntheticKv kv =
            GenerateSyntheticKv({.tokens = g * n_blocks, .heads = heads, .head_dim = d, .seed = 7});
        std::vector<float> norms(kv.tokens);
        ComputeTokenNorms(kv.KView(), norms.data());
        // Head 1 of each block: row stride heads*D, block stride g*heads*D.
        BlockBatch batch{kv.k.data() + d,
                         kv.v.data() + d,
                         heads * d,
                         static_cast<int64_t>(g) * heads * d,
                         TraitsOf(m).needs_token_norms ? norms.data() : nullptr,
                         n_blocks};
        const size_t rb = BlockLayoutOf(*spec).record_bytes;
        std::vector<uint8_t> gpu(rb * n_blocks), cpu(rb * n_blocks);
        REQUIRE(QuantizeBlocksCudaHost(*spec, batch, gpu.data()).ok());
        const size_t elems = static_cast<size_t>(g) * d;
        std::vector<float> kc(elems * n_blocks), vc(kc.size()), kg(kc.size()), vg(kc.size());
        for (int i = 0; i < n_blocks; ++i) {
          BlockInput in{batch.k + i * batch.block_stride, batch.v + i * batch.block_stride,
                        batch.row_stride, batch.token_norms ? batch.token_norms + i * g : nullptr};
          REQUIRE(QuantizeBlockRef(*spec, in, cpu.data() + i * rb).ok());
          DequantizeBlockRef(*spec, cpu.data() + i * rb, in.token_norms, kc.data() + i * elems,
                             vc.data() + i * elems);
        }
        INFO(QuantMethodName(m) << " k" << kb << "v" << vb << " D " << d);
        // KVarN too: its exp/log are block::KvarnExp / KvarnLog, plain IEEE ops on every path.
        CHECK(gpu == cpu);
        // Decode the CPU's records on the GPU: same floats up to device rounding of nothing but
        // plain IEEE ops, so exact.
        REQUIRE(DequantizeBlocksCudaHost(*spec, cpu.data(), batch.token_norms, n_blocks, kg.data(),
                                         vg.data())
                    .ok());
        CHECK(std::memcmp(kg.data(), kc.data(), kc.size() * 4) == 0);
        CHECK(std::memcmp(vg.data(), vc.data(), vc.size() * 4) == 0);
      }
    }
  }
}

}  // namespace
}  // namespace kvctl
