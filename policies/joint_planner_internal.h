// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/joint_planner_internal.h
// What the joint planner's sources share (joint_planner.cc: hulls and the allocation;
// joint_planner_validate.cc: input checks; joint_planner_shortfall.cc: requantize-or-evict;
// joint_planner_profile.cc: input from a profile): the registry's widths with their bytes per
// token, and one head's distortion model. Not a public API: only policies/joint_planner*.cc
// include it.
//
// Thread safety: plain values.
//
//   KVCTL_ASSIGN_OR_RETURN(const joint_internal::Context ctx, joint_internal::MakeContext(in));
//   const joint_internal::HeadModel m = joint_internal::MakeHead(ctx, 0, JointMode::kJoint);
//   double d = m.D(m.R(kept), 0);  // at the head's cheapest width
#ifndef KVCTL_POLICIES_JOINT_PLANNER_INTERNAL_H_
#define KVCTL_POLICIES_JOINT_PLANNER_INTERNAL_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "policies/joint_planner.h"

namespace kvctl::joint_internal {

// Widths (K, V) and the registry's bytes per token per head at those widths.
struct Pair {
  int k_bits = 0;
  int v_bits = 0;
  double bpt = 0;
  double k_pow = 0, v_pow = 0;  // beta_k^-k_bits, beta_v^-v_bits.
};

// Everything PlanJoint derives once from the input.
struct Context {
  const JointPlanInput* in = nullptr;
  std::vector<Pair> pairs;  // Every allowed (k, v) within the bounds, by bpt ascending.
  int evict_pair = 0;       // Index into pairs.
  double fp16_bpt = 0;      // 4 * head_dim.
  int64_t quantum = 0;
};

// One head under one mode.
struct HeadModel {
  const JointHeadInput* in = nullptr;
  int64_t T = 0, F = 0, kmin = 0;
  // Bytes that do not depend on (k, p): F fp16 tokens, plus the E tail rows at fp16 less the
  // narrowest width's rate (they are also counted among the k - F quantized tokens).
  double base = 0;
  double RF = 0;
  double q0 = 0;
  double s = 0;     // Parametric scale; 0 = uniform or tabulated.
  double norm = 0;  // expm1(-T / s): R's denominator, once per head.
  // The head's width pairs that no other pair beats on both bytes and q (indices into
  // Context::pairs, bytes up, q strictly down): the steps the fill and the exchange take. The
  // hulls use only those of them on the lower convex hull of (bytes per token, q): `convex`.
  std::vector<int> widths;
  std::vector<double> q;    // Per widths entry.
  std::vector<int> convex;  // Indices into widths.
  double tol = 0;           // Distortion changes at most this are rounding, not gains.

  double R(int64_t k) const {
    const EvictionCurve& c = in->eviction;
    if (!c.table.retained.empty()) return c.table.At(k);
    if (s <= 0) return static_cast<double>(k) / static_cast<double>(T);
    return std::expm1(-static_cast<double>(k) / s) / norm;
  }
  double D(double Rk, int c) const {
    return static_cast<double>(T) * ((Rk - RF) * q[c] + (1 - Rk) * q0);
  }
  double Bytes(const Context& ctx, int64_t k, int c) const {
    return base + static_cast<double>(k - F) * ctx.pairs[widths[c]].bpt;
  }
};

inline double QOf(const JointHeadInput& h, const Pair& p) {
  return h.importance_k * h.alpha_k * p.k_pow + h.importance_v * h.alpha_v * p.v_pow;
}

struct XY {
  double x = 0, y = 0;
};

// in.bits within [min_bits, max_bits] (max_bits 0: no upper bound).
std::vector<int> BoundedBits(const JointPlanInput& in);

// Validates the input and tabulates every allowed width pair within the bounds.
StatusOr<Context> MakeContext(const JointPlanInput& in);

// Head i's model under `mode`: its floor, R, q0, and the widths on the lower convex hull of
// (bytes per token, q) (evict-only: the one fixed pair). REQUIRES: ctx from MakeContext.
HeadModel MakeHead(const Context& ctx, size_t i, JointMode mode);
// The same into *out, reusing its arrays (PlanJoint keeps its models per thread between calls).
void MakeHead(const Context& ctx, size_t i, JointMode mode, HeadModel* out);
// Turns a head's joint model into its evict-only model (the one fixed pair): the same as
// MakeHead(ctx, i, kEvictOnly) without recomputing the curve.
void SetEvictOnly(const Context& ctx, HeadModel* m);

}  // namespace kvctl::joint_internal

#endif  // KVCTL_POLICIES_JOINT_PLANNER_INTERNAL_H_
