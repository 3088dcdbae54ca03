// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tests/support/synthetic_kv.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace kvctl {
namespace {

// Rotates channel pairs (i, i + d/2) by position * theta_i, the half-split RoPE of Llama models.
// cos_sin holds (cos, sin) of each pair's angle at this position, shared by every head.
void ApplyRope(float* row, int d, const std::vector<float>& cos_sin) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    const float a = row[i], b = row[i + half];
    row[i] = a * c - b * s;
    row[i + half] = a * s + b * c;
  }
}

}  // namespace

KvTensorView SyntheticKv::KView() const {
  return KvTensorView::Contiguous(k.data(), DType::kF32, tokens, heads, head_dim);
}
KvTensorView SyntheticKv::VView() const {
  return KvTensorView::Contiguous(v.data(), DType::kF32, tokens, heads, head_dim);
}
KvTensorView SyntheticKv::QView() const {
  return KvTensorView::Contiguous(q.data(), DType::kF32, tokens, q_heads, head_dim);
}

SyntheticKv GenerateSyntheticKv(const SyntheticKvOptions& o) {
  SyntheticKv kv;
  kv.tokens = o.tokens;
  kv.heads = o.heads;
  kv.q_heads = o.q_heads > 0 ? o.q_heads : o.heads;
  kv.head_dim = o.head_dim;
  const int d = o.head_dim;
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::chi_squared_distribution<float> chi2(4.0f);

  // Per (head, channel) key mean and spread; outlier channels get large ones.
  std::vector<float> k_mean(static_cast<size_t>(o.heads) * d), k_std(k_mean.size());
  std::vector<float> v_std(k_mean.size());
  for (int h = 0; h < o.heads; ++h) {
    for (int c = 0; c < d; ++c) {
      const size_t i = static_cast<size_t>(h) * d + c;
      k_mean[i] = 0.5f * normal(rng);
      k_std[i] = 0.5f + 0.5f * std::fabs(normal(rng));
      v_std[i] = 0.3f + 0.3f * std::fabs(normal(rng));
    }
    for (int j = 0; j < o.outlier_channels && j < d; ++j) {
      const int c = static_cast<int>(rng() % static_cast<uint64_t>(d));
      const size_t i = static_cast<size_t>(h) * d + c;
      k_mean[i] = o.outlier_scale * (normal(rng) > 0 ? 1.0f : -1.0f);
      k_std[i] *= o.outlier_scale / 4;
    }
  }

  kv.k.resize(static_cast<size_t>(o.tokens) * o.heads * d);
  kv.v.resize(kv.k.size());
  kv.q.resize(static_cast<size_t>(o.tokens) * kv.q_heads * d);
  const int group = kv.q_heads / o.heads > 0 ? kv.q_heads / o.heads : 1;
  std::vector<double> theta(static_cast<size_t>(d / 2));
  for (int i = 0; i < d / 2; ++i) theta[i] = std::pow(10000.0, -2.0 * i / d);
  std::vector<float> cos_sin(static_cast<size_t>(d));
  for (int64_t t = 0; t < o.tokens; ++t) {
    for (int i = 0; i < d / 2; ++i) {
      const double angle = static_cast<double>(t) * theta[i];
      cos_sin[2 * i] = static_cast<float>(std::cos(angle));
      cos_sin[2 * i + 1] = static_cast<float>(std::sin(angle));
    }
    const float token_scale = t == 0 ? o.sink_norm_scale : 1.0f;
    for (int h = 0; h < o.heads; ++h) {
      float* kr = &kv.k[(static_cast<size_t>(t) * o.heads + h) * d];
      float* vr = &kv.v[(static_cast<size_t>(t) * o.heads + h) * d];
      for (int c = 0; c < d; ++c) {
        const size_t i = static_cast<size_t>(h) * d + c;
        kr[c] = token_scale * (k_mean[i] + k_std[i] * normal(rng));
        const float student = normal(rng) / std::sqrt(chi2(rng) / 4.0f);
        vr[c] = token_scale * v_std[i] * student;
      }
      ApplyRope(kr, d, cos_sin);
    }
    for (int qh = 0; qh < kv.q_heads; ++qh) {
      const int h = std::min(qh / group, o.heads - 1);
      float* qr = &kv.q[(static_cast<size_t>(t) * kv.q_heads + qh) * d];
      for (int c = 0; c < d; ++c) {
        const size_t i = static_cast<size_t>(h) * d + c;
        qr[c] = 0.5f * k_mean[i] / (1.0f + std::fabs(k_mean[i])) + 0.5f * normal(rng);
      }
      ApplyRope(qr, d, cos_sin);
    }
  }
  return kv;
}

}  // namespace kvctl
