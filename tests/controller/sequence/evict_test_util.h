// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/controller/sequence/evict_test_util.h
// Shared by the controller eviction and pressure tests and the daemon evict integration tests:
// the small RateQuant fit they plan budgets from, so the suites test against the same profile;
// the random K/V/Q rows the sequence eviction tests append (Stream); eviction settings (EvictOn);
// the positions a dense FETCH returned per head (PositionsOf).
//
// Thread safety: plain functions and values, built fresh per call.
//
//   RateQuantFit fit = testing::TwoHeadFit(*MakeQuantSpec(QuantMethod::kKivi, 32, 2, 2), 1);
//   std::ofstream(path) << FormatRateQuantProfile(fit);
#ifndef KVCTL_TESTS_CONTROLLER_EVICT_TEST_UTIL_H_
#define KVCTL_TESTS_CONTROLLER_EVICT_TEST_UTIL_H_

#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "controller/sequence/eviction_driver.h"
#include "controller/sequence/kv_sequence.h"
#include "kernels/quant_types.h"
#include "policies/calib_profile.h"
#include "policies/ratequant.h"
#include "policies/ratequant_fit.h"

namespace kvctl::testing {

// Eviction on with `policy`, `sinks` protected first tokens, `window` protected newest ones and
// `obs` observation query rows for every scorer; the floor is sinks + window. No budget is set.
inline EvictionSettings EvictOn(EvictPolicy policy, int64_t sinks, int64_t window, int64_t obs) {
  EvictionSettings s;
  s.enabled = true;
  s.policy = policy;
  s.sinks = sinks;
  s.window = window;
  s.obs_window = s.snapkv.obs_window = s.rkv.obs_window = obs;
  s.floor = sinks + window;
  return s;
}

// The positions FetchDense returned for (layer, head) pair `pair` of its range, in order.
inline std::vector<int64_t> PositionsOf(const DenseKv& dense, int pair) {
  size_t at = 0;
  for (int i = 0; i < pair; ++i) at += dense.counts[i];
  return {dense.positions.begin() + static_cast<std::ptrdiff_t>(at),
          dense.positions.begin() + static_cast<std::ptrdiff_t>(at + dense.counts[pair])};
}

// Random [tokens, heads, d] fp32 rows per layer, for K, V and Q.
struct Stream {
  int layers, tokens, kv_heads, q_heads, d;
  std::vector<std::vector<float>> k, v, q;
  Stream(int layers_, int tokens_, int kv_heads_, int q_heads_, int d_, uint64_t seed)
      : layers(layers_), tokens(tokens_), kv_heads(kv_heads_), q_heads(q_heads_), d(d_) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int l = 0; l < layers; ++l) {
      k.emplace_back(static_cast<size_t>(tokens) * kv_heads * d);
      v.emplace_back(k.back().size());
      q.emplace_back(static_cast<size_t>(tokens) * q_heads * d);
      for (float& x : k.back()) x = normal(rng);
      for (float& x : v.back()) x = normal(rng);
      for (float& x : q.back()) x = 2.0f * normal(rng);
    }
  }
  std::vector<KvTensorView> Views(const std::vector<std::vector<float>>& x, int heads, int first,
                                  int n) const {
    // A view past the stream's end would read whatever follows it on the heap.
    REQUIRE((first >= 0 && n >= 0 && first + n <= tokens));
    std::vector<KvTensorView> out;
    for (int l = 0; l < layers; ++l) {
      out.push_back(KvTensorView::Contiguous(x[l].data() + static_cast<size_t>(first) * heads * d,
                                             DType::kF32, n, heads, d));
    }
    return out;
  }
  // Tokens [first, first + n) as one APPEND; `continues`: APPEND_CONTINUES (more follow).
  Status Append(KvSequence& seq, int first, int n, bool with_q = true,
                bool continues = false) const {
    const auto q_views = Views(q, q_heads, first, n);
    return seq.Append(first, Views(k, kv_heads, first, n), Views(v, kv_heads, first, n),
                      with_q ? &q_views : nullptr, /*allow_relief=*/true, continues);
  }
  // Keys of head h of layer l for tokens [0, n), row-major.
  std::vector<float> Keys(int l, int h, int n) const {
    std::vector<float> out;
    for (int t = 0; t < n; ++t) {
      const float* row = &k[l][(static_cast<size_t>(t) * kv_heads + h) * d];
      out.insert(out.end(), row, row + d);
    }
    return out;
  }
  KvTensorView QueryRows(int l, int first, int n) const {
    return KvTensorView::Contiguous(q[l].data() + static_cast<size_t>(first) * q_heads * d,
                                    DType::kF32, n, q_heads, d);
  }
};

// A fit of `layers` x 2 heads at widths 2 and 4 (beta 4): head 1's error is 100x head 0's, so a
// budget between the two widths lifts head 1 only. Not validated; callers check what they need.
inline RateQuantFit TwoHeadFit(const QuantSpec& spec, int layers) {
  RateQuantFit fit;
  fit.spec = spec;
  fit.layers = layers;
  fit.kv_heads = 2;
  fit.bits = {2, 4};
  fit.beta = fit.beta_k = fit.beta_v = fit.beta_k_only = fit.beta_v_only = 4;
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < 2; ++h) {
      for (UnitKind kind : {UnitKind::kKey, UnitKind::kValue}) {
        RateQuantUnit unit;
        unit.layer = l;
        unit.head = h;
        unit.kind = kind;
        unit.alpha = h == 0 ? 1.0 : 100.0;
        fit.units.push_back(unit);
      }
    }
  }
  return fit;
}

// TwoHeadFit of a KIVI head_dim-32 spec written as a profile file under /tmp; returns its path
// (the caller removes it). REQUIRES: MakeQuantSpec accepts the spec (it does).
inline std::string WriteTwoHeadProfile(int layers) {
  const QuantSpec spec = MakeQuantSpec(QuantMethod::kKivi, 32, 2, 2).value();
  static int counter = 0;
  const std::string path =
      "/tmp/kvctl-profile-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".toml";
  std::ofstream(path) << FormatRateQuantProfile(TwoHeadFit(spec, layers));
  return path;
}

// As WriteTwoHeadProfile, with a [reasonalloc] table of this per-layer demand (layers =
// demand.size()).
inline std::string WriteTwoHeadDemandProfile(const std::vector<double>& demand) {
  const int layers = static_cast<int>(demand.size());
  CalibProfile profile;
  profile.fit = TwoHeadFit(MakeQuantSpec(QuantMethod::kKivi, 32, 2, 2).value(), layers);
  LayerDemandProfile d;
  d.layers = layers;
  d.kv_heads = 2;
  d.queries_per_sequence = 8;
  d.sequences = 1;
  d.samples.assign(demand.size(), 16);
  d.demand = demand;
  profile.demand = d;
  static int counter = 0;
  const std::string path = "/tmp/kvctl-demand-profile-" + std::to_string(getpid()) + "-" +
                           std::to_string(counter++) + ".toml";
  std::ofstream(path) << FormatCalibProfile(profile);
  return path;
}

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_CONTROLLER_EVICT_TEST_UTIL_H_
