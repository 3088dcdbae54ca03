// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/turbo_codebook.h
// The scalar Lloyd-Max codebooks of TurboQuant (docs/algorithms.md §20.2): for b bits, the 2^b
// reconstruction points that minimise the mean squared error of one coordinate drawn from a given
// density, found by Lloyd's iteration on that density. The density TurboQuant needs is that of
// one coordinate of a uniform point on the unit sphere S^(d-1), f(x) ∝ (1 - x^2)^((d-3)/2) on
// [-1, 1] (≈ N(0, 1/d)); the Gaussian is here for the known-answer tests and the docs.
//
// Everything is computed in double, deterministically (fixed grid, fixed iteration count rule), on
// first use; TurboCodebookFor caches the fp32 tables the codecs use for every (head_dim, bits) a
// spec can name, behind a function-local static (thread-safe initialisation).
//
// Thread safety: reentrant; TurboCodebookFor returns references to immutable tables.
//
//   const TurboCodebook& cb = TurboCodebookFor(/*head_dim=*/128, /*bits=*/3);
//   uint32_t code = block::TurboCode(y, cb, 3);   // kernels/quant_block.h
#ifndef KVCTL_KERNELS_TURBO_CODEBOOK_H_
#define KVCTL_KERNELS_TURBO_CODEBOOK_H_

#include <vector>

#include "kernels/quant_types.h"

namespace kvctl {

enum class CoordinateDensity : uint8_t {
  kGaussian = 0,  // N(0, 1): the large-d limit, scaled by 1/sqrt(d).
  kSphere = 1,    // One coordinate of a uniform point on S^(d-1).
};

struct LloydMaxResult {
  std::vector<double> centroids;  // 2^bits points, ascending.
  std::vector<double> bounds;     // 2^bits - 1 decision thresholds: midpoints of neighbours.
  double mse = 0;                 // E[(x - Q(x))^2] under the density.
  int iterations = 0;             // Lloyd steps until the centroids stopped moving.
};

// Lloyd-Max quantizer of `bits` (1..4) bits for the density. `dim` is d for kSphere (>= 3) and
// ignored for kGaussian. REQUIRES: valid arguments (the callers are our own tables and tests).
LloydMaxResult LloydMax(CoordinateDensity density, int dim, int bits);

// The fp32 table of the codecs for a TurboQuant spec's head_dim (a power of two in 8..256) and
// width (1..4). Computed on first use for all of them.
const TurboCodebook& TurboCodebookFor(int head_dim, int bits);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_TURBO_CODEBOOK_H_
