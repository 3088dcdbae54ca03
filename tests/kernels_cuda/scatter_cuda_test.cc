// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// [cuda] The scatter kernel the device pool publishes with (kernels/cuda/scatter_cuda.h) against
// its reference ScatterRef (kernels/scatter.h): ranges of every alignment land where their table
// says and nothing else changes. [cuda-host]: argument checks, which run without a device.
#include "kernels/cuda/scatter_cuda.h"

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "tests/kernels_cuda/cuda_device.h"

namespace kvctl {
namespace {

TEST_CASE("ScatterCuda: aligned and unaligned ranges land at their destinations", "[cuda]") {
  if (!testing::CudaDeviceOrSkip()) return;
  // Whole 16-byte-aligned pages (the uint4 path), odd slots (the byte path), one byte.
  const std::vector<CopyRange> want_ranges = {
      {0, 4096, 4096}, {4096, 20000 + 3, 250}, {4346, 100, 1}, {4347, 9000, 512}};
  uint64_t packed_bytes = 0;
  for (const CopyRange& r : want_ranges) packed_bytes += r.bytes;
  std::vector<uint8_t> packed(packed_bytes);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(i * 31 + 7);
  const size_t pool_bytes = 32768;
  std::vector<uint8_t> expected(pool_bytes, 0xEE);
  ScatterRef(packed.data(), want_ranges.data(), static_cast<int>(want_ranges.size()),
             expected.data());

  uint8_t *d_packed = nullptr, *d_pool = nullptr;
  CopyRange* d_ranges = nullptr;
  REQUIRE(cudaMalloc(&d_packed, packed.size()) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_pool, pool_bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_ranges, sizeof(CopyRange) * want_ranges.size()) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_packed, packed.data(), packed.size(), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  REQUIRE(cudaMemcpy(d_ranges, want_ranges.data(), sizeof(CopyRange) * want_ranges.size(),
                     cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(d_pool, 0xEE, pool_bytes) == cudaSuccess);
  Status s =
      EnqueueScatterCuda(d_packed, d_ranges, static_cast<int>(want_ranges.size()), d_pool, nullptr);
  INFO(s.ToString());
  REQUIRE(s.ok());
  std::vector<uint8_t> got(pool_bytes);
  REQUIRE(cudaMemcpy(got.data(), d_pool, pool_bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(d_packed);
  cudaFree(d_pool);
  cudaFree(d_ranges);
  for (size_t i = 0; i < pool_bytes; ++i) {
    INFO("byte " << i);
    REQUIRE(got[i] == expected[i]);
  }
}

TEST_CASE("ScatterCuda: argument checks", "[cuda-host]") {
  uint8_t byte = 0;
  CopyRange range;
  CHECK(EnqueueScatterCuda(&byte, &range, 0, &byte, nullptr).message().find("n: got 0") !=
        std::string::npos);
  CHECK(EnqueueScatterCuda(nullptr, &range, 1, &byte, nullptr).code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvctl
