// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/width_relief.h
// Pool pressure relief by lowering precision (issue #4, "lower precision before evicting"): when
// an APPEND cannot get the pool pages it needs, which heads of the sequence should re-quantize
// their stored records to narrower code widths (e.g. K4V4 -> K2V2) so that at least `shortfall`
// pages come free, adding the least predicted distortion?
//
// Model (RateQuant's, docs/algorithms.md §11.1; this planner: §15): one element of K at b bits
// costs scale_k * beta_k^-b (scale = importance x alpha of the head's fitted curve), V likewise;
// lowering a head from (bk, bv) to (bk', bv') adds tokens x head_dim x [scale_k (beta_k^-bk' -
// beta_k^-bk) + scale_v (...)] and frees the pages its records no longer need (records are packed
// per page at their own size). Without a fitted curve every head gets scale 1, beta 4 (6 dB per
// bit), so the widest, largest heads go first.
//
// Algorithm: greedy over single width steps (K or V one allowed width down, never below
// min_bits), cheapest distortion per byte freed first, until the pages freed reach the shortfall.
// Each head's final widths are returned once: the daemon re-quantizes each chosen head once, from
// its current records. Not optimal in general (a knapsack); exact for one head with one step.
//
// Thread safety: pure function.
//
//   KVCTL_ASSIGN_OR_RETURN(WidthRelief r, PlanWidthRelief(heads, {.page_bytes = 65536,
//                                                                 .min_bits = 2,
//                                                                 .shortfall_pages = 3}));
#ifndef KVCTL_POLICIES_WIDTH_RELIEF_H_
#define KVCTL_POLICIES_WIDTH_RELIEF_H_

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/quant_types.h"

namespace kvctl {

// Per-element distortion of one head: scale * beta^-b for K and for V.
struct WidthCurve {
  double k_scale = 1, beta_k = 4;
  double v_scale = 1, beta_v = 4;
};

struct ReliefHead {
  int layer = 0;
  int head = 0;
  QuantSpec spec;       // Current widths and layout of the head's records.
  int64_t records = 0;  // Records it holds (block_tokens tokens each).
  WidthCurve curve;
};

struct ReliefOptions {
  uint64_t page_bytes = 0;  // Pool page size; records never straddle pages.
  int min_bits = 2;         // No width goes below this (nor below the method's narrowest).
  int64_t shortfall_pages = 0;
  // When even the narrowest widths free less than the shortfall: false = RESOURCE_EXHAUSTED,
  // true = plan the narrowest widths anyway (frees what it can; an empty plan if nothing).
  bool partial = false;
};

struct ReliefStep {
  int layer = 0;
  int head = 0;
  int from_k_bits = 0, from_v_bits = 0;
  int to_k_bits = 0, to_v_bits = 0;
  int64_t pages_freed = 0;
  double distortion_added = 0;
};

struct WidthRelief {
  std::vector<ReliefStep> steps;  // One per head whose widths change, in input order.
  int64_t pages_freed = 0;        // >= shortfall_pages.
  double distortion_added = 0;
};

// Pages `records` records of `spec` occupy when packed page_bytes / record_bytes to a page.
int64_t RecordPages(const QuantSpec& spec, int64_t records, uint64_t page_bytes);

// INVALID_ARGUMENT naming the field for bad input (shortfall < 1, page_bytes 0, a record larger
// than a page, negative records, a non-finite or non-positive curve); RESOURCE_EXHAUSTED "lowering
// every head to its narrowest width >= min_bits frees N pages, expected >= shortfall" when even
// that is not enough (nothing should change then), unless options.partial.
StatusOr<WidthRelief> PlanWidthRelief(const std::vector<ReliefHead>& heads,
                                      const ReliefOptions& options);

}  // namespace kvctl

#endif  // KVCTL_POLICIES_WIDTH_RELIEF_H_
