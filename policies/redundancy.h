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
// Incremental (RedundancyState): an eviction keeps most keys and an append adds a few, so each
// row's partner mostly stays where the last scoring found it. Given the state of the previous
// scoring (each row's partner, or how far down it is known to have none, and a checksum of each
// row's unit key), only new keys and rows whose partner was evicted are scanned: a row looks at the
// keys added since, newest first; without one there its carried partner stands; a row whose partner
// was evicted scans on below it, and a new row scans the old keys. The result is the same integers
// as a fresh pass (the tests compare). The state is a cache, checked before use: another threshold
// or more rows than the keys, and the pass runs fresh; a row whose unit key changed since (its
// tokens quantized again: a flush of fp16 rows into records, a re-pack that is not bit-stable)
// ends the part of the state that is used, and the rows from it on count as new; when that part
// is under half the rows, the pass runs fresh.
//
// Thread safety: reentrant (the SIMD level is the process-wide one of kernels/quantize.h).
#ifndef KVCTL_POLICIES_REDUNDANCY_H_
#define KVCTL_POLICIES_REDUNDANCY_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace kvctl {

enum class RedundancyPass { kAuto, kFull, kNewestFirst };

// What one scoring of a head leaves for the next: per row of the keys it scored, in order.
struct RedundancyState {
  // >= 0: the row's newest partner among those rows. < 0: -(below + 1), the row has no partner
  // among rows [below, rows()) other than itself; rows under `below` were not looked at (-1: none
  // at all).
  std::vector<int32_t> partner;
  std::vector<uint32_t> key_hash;  // UnitKeyChecksum of each row's unit key.
  int32_t threshold = 0;
  // What the scoring that made it spent (kept by CompactRedundancy): the rows whose partners it
  // took from the state before it, whether it ran the full pass, and its key dot products (the
  // full pass's T(T-1)/2 included).
  int64_t reused_rows = 0;
  bool full_pass = false;
  int64_t dot_products = 0;
  int64_t rows() const { return static_cast<int64_t>(partner.size()); }
};

// CRC-32C (common/crc32c.h) of one unit key of `head_dim` int16: tells whether a row changed
// between scorings (any change within 32 consecutive bits always, others but for 2^-32).
uint32_t UnitKeyChecksum(const int16_t* unit, int64_t head_dim);

// col_j above for the `tokens` rows of `head_dim` int16 at `unit` (row j at unit + j * head_dim).
// threshold is ⌊θ · 2^28⌋. REQUIRES: every row of norm at most 2^15 − 8 (kernels/dot.h,
// DotI16Ref), which round(u · 2^14) of a unit vector is; tokens <= 2^22 (policies/eviction.h's
// kMaxRedundancyTokens, what keeps the column sums' arithmetic exact).
// With `state`: read by kAuto when it is valid for a prefix of these rows (see the top); replaced
// by the state of all `tokens` rows by every pass.
std::vector<int64_t> RedundancyColumnSums(const int16_t* unit, int64_t tokens, int64_t head_dim,
                                          int32_t threshold,
                                          RedundancyPass pass = RedundancyPass::kAuto,
                                          RedundancyState* state = nullptr);

// The state after an eviction that keeps the rows `kept` (strictly increasing, each below
// state->rows()) in that order: partners renumbered; a row whose partner was evicted knows it has
// none at or above it. INVALID_ARGUMENT (state unchanged) when `kept` is not that.
Status CompactRedundancy(RedundancyState* state, std::span<const int64_t> kept);

}  // namespace kvctl

#endif  // KVCTL_POLICIES_REDUNDANCY_H_
