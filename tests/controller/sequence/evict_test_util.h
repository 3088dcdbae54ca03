// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/controller/sequence/evict_test_util.h
// Shared by the controller eviction and pressure tests and the daemon evict integration tests:
// the small RateQuant fit they plan budgets from, so the suites test against the same profile.
//
// Thread safety: a plain function that builds a fresh value per call.
//
//   RateQuantFit fit = testing::TwoHeadFit(*MakeQuantSpec(QuantMethod::kKivi, 32, 2, 2), 1);
//   std::ofstream(path) << FormatRateQuantProfile(fit);
#ifndef KVCTL_TESTS_CONTROLLER_EVICT_TEST_UTIL_H_
#define KVCTL_TESTS_CONTROLLER_EVICT_TEST_UTIL_H_

#include <unistd.h>

#include <fstream>
#include <string>

#include "kernels/quant_types.h"
#include "policies/ratequant.h"
#include "policies/ratequant_fit.h"

namespace kvctl::testing {

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

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_CONTROLLER_EVICT_TEST_UTIL_H_
