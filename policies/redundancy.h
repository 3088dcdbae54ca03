// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/redundancy.h
// The column sums of R-KV's similarity matrix (docs/algorithms.md §12.4), the O(T^2) part of the
// R-KV scorer (policies/eviction.cc turns them into the redundancy r_j).
//
// Input: T unit keys rounded to int16, ũ_j = round(u_j · 2^14), so S_ij = ũ_i · ũ_j is an exact
// int32 (a unit of 2^-28). Output: for every column j, the exact int64 sum
//
//   col_j = Σ_{i ≠ j} S_ij − Σ_{i : p(i) = j} S_ij
//
// where p(i) is row i's newest near-duplicate, the largest j ≠ i with S_ij > threshold (none:
// nothing is subtracted for row i). That is R-KV's zero diagonal and its rule that each row's most
// recent near-duplicate is spared.
//
// Two ways give the same integers (tests compare them with a brute-force reference):
//   full pass     the upper triangle of S, T(T-1)/2 dot products whatever the keys.
//   newest first  Σ_{i≠j} S_ij = ũ_j · Σ_i ũ_i − ũ_j · ũ_j (S is linear in the keys), O(T·D); then
//                 each row's p(i) by a scan of the keys from the newest backwards that stops at the
//                 first one above the threshold. On SmolLM2's keys nearly every row has a
//                 near-duplicate a few dozen keys back or less (tools/rkv_partner_depth.py;
//                 docs/eviction.md, "Timings"): 3-4 % of the full pass's dot products on average
//                 over the heads, 31-33 % for the worst head. On keys without near-duplicates every
//                 row scans every key: T² dot products, twice the full pass.
// kAuto runs the newest-first scan and switches to the full pass when, after its first step (the
// newest 8 keys, every row), more than 90 % of the rows are left without a partner, or when the
// scan has spent half of the full pass's dot products with rows still pending. Its worst case is
// 1.5 times the full pass (a scan that gives up at the budget); keys without structure cost the
// full pass plus the first step (8 T dot products).
//
// Thread safety: reentrant (the SIMD level is the process-wide one of kernels/quantize.h).
#ifndef KVCTL_POLICIES_REDUNDANCY_H_
#define KVCTL_POLICIES_REDUNDANCY_H_

#include <cstdint>
#include <vector>

namespace kvctl {

enum class RedundancyPass { kAuto, kFull, kNewestFirst };

// col_j above for the `tokens` rows of `head_dim` int16 at `unit` (row j at unit + j * head_dim).
// threshold is ⌊θ · 2^28⌋. REQUIRES: every row of norm at most 2^15 − 8 (kernels/dot.h,
// DotI16Ref), which round(u · 2^14) of a unit vector is; tokens < 2^31.
std::vector<int64_t> RedundancyColumnSums(const int16_t* unit, int64_t tokens, int64_t head_dim,
                                          int32_t threshold,
                                          RedundancyPass pass = RedundancyPass::kAuto);

}  // namespace kvctl

#endif  // KVCTL_POLICIES_REDUNDANCY_H_
