// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "kernels/turbo_codebook.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace kvctl {
namespace {

// Cumulative integrals of f, x f and x^2 f over a uniform grid (trapezoid rule), with linear
// interpolation in between: cell moments are then differences of two lookups, so one Lloyd step
// costs O(2^bits) whatever the grid. 2^18 intervals keep the quadrature error far below the
// known-answer tolerances (h = 7.6e-6 on [-1, 1]).
class Moments {
 public:
  Moments(CoordinateDensity density, int dim) {
    if (density == CoordinateDensity::kSphere) {
      lo_ = -1.0, hi_ = 1.0;
    } else {
      lo_ = -12.0, hi_ = 12.0;
    }
    h_ = (hi_ - lo_) / kIntervals;
    const double a = (dim - 3) / 2.0;
    auto pdf = [&](double x) {
      if (density == CoordinateDensity::kGaussian) return std::exp(-0.5 * x * x);
      const double u = 1.0 - x * x;
      return u <= 0.0 ? 0.0 : std::pow(u, a);
    };
    for (auto& c : cum_) c.assign(kIntervals + 1, 0.0);
    double prev[3] = {pdf(lo_), lo_ * pdf(lo_), lo_ * lo_ * pdf(lo_)};
    for (int i = 1; i <= kIntervals; ++i) {
      const double x = lo_ + i * h_;
      const double f = pdf(x);
      const double now[3] = {f, x * f, x * x * f};
      for (int m = 0; m < 3; ++m) {
        cum_[m][i] = cum_[m][i - 1] + 0.5 * h_ * (prev[m] + now[m]);
        prev[m] = now[m];
      }
    }
    total_ = cum_[0][kIntervals];
  }

  // ∫_{lo}^{x} x^m f / ∫ f, x clamped to the support.
  double Cum(int m, double x) const {
    const double pos = (std::clamp(x, lo_, hi_) - lo_) / h_;
    const int i = std::min(static_cast<int>(pos), kIntervals - 1);
    const double frac = pos - i;
    return (cum_[m][i] + frac * (cum_[m][i + 1] - cum_[m][i])) / total_;
  }

  // The x with Cum(0, x) = p, by bisection (used once, for the starting centroids).
  double Quantile(double p) const {
    double a = lo_, b = hi_;
    for (int it = 0; it < 200; ++it) {
      const double mid = 0.5 * (a + b);
      (Cum(0, mid) < p ? a : b) = mid;
    }
    return 0.5 * (a + b);
  }

  double lo() const { return lo_; }
  double hi() const { return hi_; }

 private:
  static constexpr int kIntervals = 1 << 18;
  double lo_ = 0, hi_ = 0, h_ = 0, total_ = 1;
  std::array<std::vector<double>, 3> cum_;
};

LloydMaxResult LloydMaxOn(const Moments& mom, int bits) {
  KVCTL_CHECK(bits >= 1 && bits <= 4);
  const int n = 1 << bits;
  LloydMaxResult r;
  r.centroids.resize(n);
  r.bounds.resize(n - 1);
  for (int k = 0; k < n; ++k) r.centroids[k] = mom.Quantile((k + 0.5) / n);
  // Lloyd: thresholds at midpoints, then each centroid to the conditional mean of its cell. The
  // MSE never increases; stop when no centroid moves by more than 1e-13 (the scale is >= 1/16).
  constexpr int kMaxIterations = 200000;
  for (r.iterations = 1; r.iterations <= kMaxIterations; ++r.iterations) {
    for (int k = 0; k + 1 < n; ++k) r.bounds[k] = 0.5 * (r.centroids[k] + r.centroids[k + 1]);
    double moved = 0;
    for (int k = 0; k < n; ++k) {
      const double a = k == 0 ? mom.lo() : r.bounds[k - 1];
      const double b = k == n - 1 ? mom.hi() : r.bounds[k];
      const double mass = mom.Cum(0, b) - mom.Cum(0, a);
      if (!(mass > 0)) continue;  // An empty cell keeps its point (does not happen here).
      const double c = (mom.Cum(1, b) - mom.Cum(1, a)) / mass;
      moved = std::max(moved, std::abs(c - r.centroids[k]));
      r.centroids[k] = c;
    }
    if (moved < 1e-13) break;
  }
  // Both densities are even: make the table exactly antisymmetric so that x and -x get mirrored
  // codes whatever the rounding of the iteration.
  for (int k = 0; k < n / 2; ++k) {
    const double c = 0.5 * (r.centroids[n - 1 - k] - r.centroids[k]);
    r.centroids[k] = -c;
    r.centroids[n - 1 - k] = c;
  }
  for (int k = 0; k + 1 < n; ++k) r.bounds[k] = 0.5 * (r.centroids[k] + r.centroids[k + 1]);
  // MSE = sum over cells of ∫ (x - c)^2 f = M2 - 2 c M1 + c^2 M0.
  r.mse = 0;
  for (int k = 0; k < n; ++k) {
    const double a = k == 0 ? mom.lo() : r.bounds[k - 1];
    const double b = k == n - 1 ? mom.hi() : r.bounds[k];
    const double c = r.centroids[k];
    r.mse += (mom.Cum(2, b) - mom.Cum(2, a)) - 2 * c * (mom.Cum(1, b) - mom.Cum(1, a)) +
             c * c * (mom.Cum(0, b) - mom.Cum(0, a));
  }
  return r;
}

}  // namespace

LloydMaxResult LloydMax(CoordinateDensity density, int dim, int bits) {
  KVCTL_CHECK(density == CoordinateDensity::kGaussian || dim >= 3);
  return LloydMaxOn(Moments(density, dim), bits);
}

namespace {

constexpr int kMinLog2Dim = 3;  // head_dim 8 .. 256: what ValidateQuantSpec allows for turbo.
constexpr int kMaxLog2Dim = 8;
constexpr int kMaxBits = 4;

struct AllCodebooks {
  TurboCodebook table[kMaxLog2Dim - kMinLog2Dim + 1][kMaxBits + 1] = {};

  AllCodebooks() {
    for (int l = kMinLog2Dim; l <= kMaxLog2Dim; ++l) {
      const Moments mom(CoordinateDensity::kSphere, 1 << l);
      for (int bits = 1; bits <= kMaxBits; ++bits) {
        const LloydMaxResult r = LloydMaxOn(mom, bits);
        TurboCodebook& cb = table[l - kMinLog2Dim][bits];
        for (size_t k = 0; k < r.centroids.size(); ++k) {
          cb.centroid[k] = static_cast<float>(r.centroids[k]);
        }
        // Bounds from the fp32 centroids, so that a stored centroid always codes to itself.
        for (size_t k = 0; k < r.bounds.size(); ++k) {
          cb.bound[k] = 0.5f * (cb.centroid[k] + cb.centroid[k + 1]);
          // The SIMD codecs find a code by bisection over the bounds, which needs them ascending.
          KVCTL_CHECK(k == 0 || cb.bound[k] > cb.bound[k - 1]);
        }
      }
    }
  }
};

}  // namespace

const TurboCodebook& TurboCodebookFor(int head_dim, int bits) {
  static const AllCodebooks all;
  int l = 0;
  while ((1 << l) < head_dim) ++l;
  KVCTL_CHECK((1 << l) == head_dim && l >= kMinLog2Dim && l <= kMaxLog2Dim);
  KVCTL_CHECK(bits >= 1 && bits <= kMaxBits);
  return all.table[l - kMinLog2Dim][bits];
}

}  // namespace kvctl
