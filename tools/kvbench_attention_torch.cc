// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvbench_attention_torch.cc
// kvbench attention's dense baseline: at::scaled_dot_product_attention in fp32 on the caller's
// buffers (no copies: from_blob views). GQA decode as torch engines run it: the g query heads of a
// KV head are its g query rows, q [1, H, g, D] against K/V [1, H, T, D], not causal. Built only
// with KVCTL_TORCH; torch shares our OpenMP runtime, so set_num_threads is the same knob.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "tools/kvbench_attention.h"

namespace kvctl {
namespace {

class TorchSdpa : public DenseSdpa {
 public:
  TorchSdpa(const float* k, const float* v, int heads, int64_t tokens, int head_dim, int group)
      : heads_(heads), head_dim_(head_dim), group_(group) {
    const auto opts = at::TensorOptions().dtype(at::kFloat);
    k_ = at::from_blob(const_cast<float*>(k), {1, heads, tokens, head_dim}, opts);
    v_ = at::from_blob(const_cast<float*>(v), {1, heads, tokens, head_dim}, opts);
  }

  void Run(const float* q, float* out) override {
    c10::InferenceMode guard;
    const at::Tensor qt = at::from_blob(const_cast<float*>(q), {1, heads_, group_, head_dim_},
                                        at::TensorOptions().dtype(at::kFloat));
    const at::Tensor o = at::scaled_dot_product_attention(
        qt, k_, v_, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0, /*is_causal=*/false,
        /*scale=*/1.0 / std::sqrt(static_cast<double>(head_dim_)));
    std::memcpy(out, o.contiguous().data_ptr<float>(),
                sizeof(float) * static_cast<size_t>(heads_ * group_ * head_dim_));
  }

 private:
  int64_t heads_, head_dim_, group_;
  at::Tensor k_, v_;
};

}  // namespace

StatusOr<std::unique_ptr<DenseSdpa>> MakeTorchSdpa(const float* k, const float* v, int heads,
                                                   int64_t tokens, int head_dim, int group,
                                                   int threads) {
  at::set_num_threads(threads);
  return std::unique_ptr<DenseSdpa>(new TorchSdpa(k, v, heads, tokens, head_dim, group));
}

std::string TorchVersion() { return TORCH_VERSION; }

}  // namespace kvctl
