// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/policies/joint_planner_test_reference.h
// A straightforward second implementation of PlanJoint (docs/joint_planner.md, "The algorithm")
// for joint_planner_test: every option point of a head computed and sorted, the hull segments of
// all heads sorted by ratio and taken in order, a std::priority_queue fill drained to the end, and
// joint compared with both single levers. It uses the planner's formulas in the same arithmetic,
// so it agrees with the fast planner to the bit; a change in what the planner returns (not only in
// how fast) makes the test comparing the two fail.
//
// Thread safety: pure functions.
//
//   RefPlan r = RefPlanJoint(input, JointMode::kJoint);
//   if (r.feasible) CHECK(plan.heads[0].kept == r.heads[0].kept);
#ifndef KVCTL_TESTS_POLICIES_JOINT_PLANNER_TEST_REFERENCE_H_
#define KVCTL_TESTS_POLICIES_JOINT_PLANNER_TEST_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <queue>
#include <string>
#include <vector>

#include "policies/joint_planner.h"

namespace kvctl::joint_ref {

struct RefHead {
  int64_t kept = 0;
  int k_bits = 0, v_bits = 0;
};
struct RefPlan {
  bool feasible = false;  // The mode's cheapest plan fits the budget.
  std::string source;
  double bytes = 0, distortion = 0;
  bool saturated = false;
  std::vector<RefHead> heads;
};

struct RefPair {
  int k_bits = 0, v_bits = 0;
  double bpt = 0, k_pow = 0, v_pow = 0;
};
struct RefPoint {
  double x = 0, y = 0;
  int64_t k = 0;
  int c = 0;  // Index into the head's widths.
};

// Indices of the decreasing lower hull of points sorted by (x, y); ratios compared as
// (y_b - y_p) / (x_p - x_b), drops of at most tol ignored (the documented rule).
inline std::vector<int> RefHull(const std::vector<RefPoint>& pts, double tol) {
  std::vector<int> hull;
  std::vector<double> ratio;
  for (int i = 0; i < static_cast<int>(pts.size()); ++i) {
    const RefPoint& p = pts[i];
    if (!hull.empty() && (p.y >= pts[hull.back()].y - tol || p.x <= pts[hull.back()].x)) continue;
    double r = 0;
    while (!hull.empty()) {
      const RefPoint& b = pts[hull.back()];
      r = (b.y - p.y) / (p.x - b.x);
      if (hull.size() < 2 || ratio.back() > r) break;
      hull.pop_back();
      ratio.pop_back();
    }
    hull.push_back(i);
    ratio.push_back(r);
  }
  return hull;
}

struct RefModel {
  const JointHeadInput* in = nullptr;
  int64_t T = 0, F = 0, kmin = 0;
  double base = 0, RF = 0, q0 = 0, s = 0, norm = 0, tol = 0;
  std::vector<int> widths;    // Pair indices, bytes up, q down.
  std::vector<double> q;      // Per width.
  std::vector<int> convex;    // Indices into widths: the hull widths.
  std::vector<int64_t> grid;  // Kept counts.
  std::vector<RefPoint> hull;

  double R(int64_t k) const {
    if (!in->eviction.table.retained.empty()) return in->eviction.table.At(k);
    if (s <= 0) return static_cast<double>(k) / static_cast<double>(T);
    return std::expm1(-static_cast<double>(k) / s) / norm;
  }
  double D(double Rk, int c) const {
    return static_cast<double>(T) * ((Rk - RF) * q[c] + (1 - Rk) * q0);
  }
};

inline RefPlan RefSolve(const JointPlanInput& in, JointMode mode) {
  std::vector<int> bits;
  for (int b : in.bits) {
    if (b >= in.min_bits && (in.max_bits == 0 || b <= in.max_bits)) bits.push_back(b);
  }
  std::vector<RefPair> pairs;
  for (int kb : bits) {
    for (int vb : bits) {
      QuantSpec s = in.spec;
      s.k_bits = kb;
      s.v_bits = vb;
      pairs.push_back({kb, vb,
                       BitsPerElement(s, in.kv_heads).average * 2.0 * in.spec.head_dim / 8.0,
                       std::pow(in.beta_k, -kb), std::pow(in.beta_v, -vb)});
    }
  }
  std::stable_sort(pairs.begin(), pairs.end(),
                   [](const RefPair& a, const RefPair& b) { return a.bpt < b.bpt; });
  const int ek = in.evict_k_bits ? in.evict_k_bits : bits.back();
  const int ev = in.evict_v_bits ? in.evict_v_bits : bits.back();
  int evict_pair = 0;
  for (size_t p = 0; p < pairs.size(); ++p) {
    if (pairs[p].k_bits == ek && pairs[p].v_bits == ev) evict_pair = static_cast<int>(p);
  }
  const int64_t quantum = in.token_quantum > 0 ? in.token_quantum : in.spec.block_tokens;
  const double fp16 = 4.0 * in.spec.head_dim;
  const bool vary_kept = mode != JointMode::kQuantOnly;
  std::vector<RefModel> ms(in.heads.size());
  for (size_t h = 0; h < ms.size(); ++h) {
    RefModel& m = ms[h];
    m.in = &in.heads[h];
    m.T = m.in->tokens;
    m.F = m.in->fixed_tokens;
    m.kmin = std::min(m.T, std::max(m.F, in.min_tokens));
    const EvictionCurve& c = m.in->eviction;
    if (c.table.retained.empty() && c.coverage_tokens > 0) {
      m.s = c.coverage_tokens / std::log(1.0 / (1.0 - c.tau));
      m.norm = std::expm1(-static_cast<double>(m.T) / m.s);
    }
    m.RF = m.R(m.F);
    m.q0 = in.eviction_scale *
           (m.in->importance_k * m.in->alpha_k + m.in->importance_v * m.in->alpha_v);
    m.base = static_cast<double>(m.F) * fp16 +
             static_cast<double>(m.in->tail_tokens) * (fp16 - pairs[0].bpt);
    auto q_of = [&](const RefPair& p) {
      return m.in->importance_k * m.in->alpha_k * p.k_pow +
             m.in->importance_v * m.in->alpha_v * p.v_pow;
    };
    if (mode == JointMode::kEvictOnly) {
      m.widths = {evict_pair};
      m.q = {q_of(pairs[evict_pair])};
      m.convex = {0};
    } else {
      // Of equal bytes the lowest q; then the non-dominated widths; then their hull.
      std::vector<RefPoint> pts;
      std::vector<int> ids;
      for (size_t p = 0; p < pairs.size(); ++p) {
        const RefPoint pt{pairs[p].bpt, q_of(pairs[p]), 0, 0};
        if (!pts.empty() && pts.back().x == pt.x) {
          if (pt.y < pts.back().y) {
            pts.back() = pt;
            ids.back() = static_cast<int>(p);
          }
          continue;
        }
        pts.push_back(pt);
        ids.push_back(static_cast<int>(p));
      }
      double qmax = 0;
      for (const RefPoint& p : pts) qmax = std::max(qmax, p.y);
      std::vector<RefPoint> nd;
      for (size_t p = 0; p < pts.size(); ++p) {
        if (!nd.empty() && pts[p].y >= nd.back().y - 1e-12 * qmax) continue;
        nd.push_back(pts[p]);
        m.widths.push_back(ids[p]);
        m.q.push_back(pts[p].y);
      }
      m.convex = RefHull(nd, 1e-12 * qmax);
    }
    m.tol = 1e-12 * static_cast<double>(m.T) * (m.q0 + m.q[0]);
    // The kept grid: kmin + j * quantum up to T, subsampled to kept_levels points.
    const int64_t n = (m.T - m.kmin + quantum - 1) / quantum;
    if (!vary_kept || m.kmin >= m.T) {
      m.grid = {m.T};
    } else if (n + 1 <= in.kept_levels) {
      for (int64_t j = 0; j <= n; ++j) m.grid.push_back(std::min(m.T, m.kmin + j * quantum));
    } else {
      for (int i = 0; i < in.kept_levels; ++i) {
        const int64_t j = std::llround(static_cast<double>(i) * n / (in.kept_levels - 1));
        const int64_t k = std::min(m.T, m.kmin + j * quantum);
        if (m.grid.empty() || k != m.grid.back()) m.grid.push_back(k);
      }
    }
    // Every (width, kept) option, sorted by bytes then distortion (chain order on ties).
    std::vector<RefPoint> opts;
    for (int w : m.convex) {
      for (int64_t k : m.grid) {
        opts.push_back(
            {m.base + static_cast<double>(k - m.F) * pairs[m.widths[w]].bpt, m.D(m.R(k), w), k, w});
      }
    }
    std::stable_sort(opts.begin(), opts.end(), [](const RefPoint& a, const RefPoint& b) {
      return a.x < b.x || (a.x == b.x && a.y < b.y);
    });
    for (int i : RefHull(opts, m.tol)) m.hull.push_back(opts[i]);
  }
  // The Lagrangian: all segments by ratio (ties by head, index), whole while they fit, the
  // largest segment's bytes held back for the fill.
  struct Seg {
    double ratio, cost, gain;
    int head, index;
  };
  std::vector<Seg> segs;
  RefPlan plan;
  double min_bytes = 0, D = 0, margin = 0;
  for (size_t h = 0; h < ms.size(); ++h) {
    const std::vector<RefPoint>& v = ms[h].hull;
    min_bytes += v.front().x;
    D += v.front().y;
    for (size_t i = 0; i + 1 < v.size(); ++i) {
      const double cost = v[i + 1].x - v[i].x, gain = v[i].y - v[i + 1].y;
      segs.push_back({gain / cost, cost, gain, static_cast<int>(h), static_cast<int>(i)});
      margin = std::max(margin, cost);
    }
  }
  const double budget = static_cast<double>(in.budget_bytes);
  if (min_bytes > budget * (1 + 1e-12)) return plan;
  plan.feasible = true;
  double left = budget - min_bytes;
  margin = std::min(margin, left);
  left -= margin;
  std::sort(segs.begin(), segs.end(), [](const Seg& a, const Seg& b) {
    if (a.ratio != b.ratio) return a.ratio > b.ratio;
    return a.head != b.head ? a.head < b.head : a.index < b.index;
  });
  std::vector<int> pos(ms.size(), 0);
  for (const Seg& s : segs) {
    if (s.cost > left) break;
    left -= s.cost;
    ++pos[s.head];
  }
  left += margin;
  // The fill: single moves, best ratio first, while they fit.
  struct State {
    int64_t k;
    int c;
    double bytes, D, Rk;
    int vertex;
  };
  std::vector<State> st(ms.size());
  for (size_t h = 0; h < ms.size(); ++h) {
    const RefPoint& v = ms[h].hull[pos[h]];
    st[h] = {v.k, v.c, v.x, v.y, ms[h].R(v.k), pos[h]};
  }
  struct Move {
    double ratio, cost;
    int head, version, kind;  // 0: segment, 1: tokens, 2: width.
    bool operator<(const Move& o) const { return ratio < o.ratio; }
  };
  std::priority_queue<Move> heap;
  std::vector<int> version(ms.size(), 0);
  auto moves = [&](size_t h, bool push) {
    const RefModel& m = ms[h];
    const State& s = st[h];
    bool any = false;
    auto add = [&](double cost, double gain, int kind) {
      if (!(gain > m.tol && cost > 0)) return;
      any = true;
      if (push) heap.push({gain / cost, cost, static_cast<int>(h), version[h], kind});
    };
    if (s.vertex >= 0 && s.vertex + 1 < static_cast<int>(m.hull.size())) {
      add(m.hull[s.vertex + 1].x - s.bytes, s.D - m.hull[s.vertex + 1].y, 0);
    }
    if (vary_kept && s.k < m.T) {
      const int64_t k2 = std::min(m.T, s.k + quantum);
      add(m.base + static_cast<double>(k2 - m.F) * pairs[m.widths[s.c]].bpt - s.bytes,
          s.D - m.D(m.R(k2), s.c), 1);
    }
    if (s.c + 1 < static_cast<int>(m.widths.size())) {
      add(m.base + static_cast<double>(s.k - m.F) * pairs[m.widths[s.c + 1]].bpt - s.bytes,
          s.D - m.D(s.Rk, s.c + 1), 2);
    }
    return any;
  };
  for (size_t h = 0; h < ms.size(); ++h) moves(h, true);
  while (!heap.empty()) {
    const Move mv = heap.top();
    heap.pop();
    if (mv.version != version[mv.head] || mv.cost > left) continue;
    const RefModel& m = ms[mv.head];
    State& s = st[mv.head];
    if (mv.kind == 0) {
      ++s.vertex;
      s.k = m.hull[s.vertex].k;
      s.c = m.hull[s.vertex].c;
    } else {
      if (mv.kind == 1) s.k = std::min(m.T, s.k + quantum);
      if (mv.kind == 2) ++s.c;
      const int next = s.vertex + 1;
      s.vertex = s.vertex >= 0 && next < static_cast<int>(m.hull.size()) && m.hull[next].k == s.k &&
                         m.hull[next].c == s.c
                     ? next
                     : -1;
    }
    s.bytes = m.base + static_cast<double>(s.k - m.F) * pairs[m.widths[s.c]].bpt;
    s.Rk = m.R(s.k);
    s.D = m.D(s.Rk, s.c);
    left -= mv.cost;
    ++version[mv.head];
    moves(mv.head, true);
  }
  plan.source = std::string(JointModeName(mode));
  plan.saturated = true;
  for (size_t h = 0; h < ms.size(); ++h) {
    if (moves(h, false)) plan.saturated = false;
    plan.bytes += st[h].bytes;
    plan.distortion += st[h].D;
    const RefPair& p = pairs[ms[h].widths[st[h].c]];
    plan.heads.push_back({st[h].k, p.k_bits, p.v_bits});
  }
  return plan;
}

// Joint mode: the best of the joint search and the two single levers (first wins ties).
inline RefPlan RefPlanJoint(const JointPlanInput& in, JointMode mode) {
  RefPlan best = RefSolve(in, mode);
  if (mode != JointMode::kJoint || !best.feasible) return best;
  for (JointMode alt : {JointMode::kQuantOnly, JointMode::kEvictOnly}) {
    RefPlan r = RefSolve(in, alt);
    if (r.feasible && r.distortion < best.distortion) best = r;
  }
  return best;
}

}  // namespace kvctl::joint_ref

#endif  // KVCTL_TESTS_POLICIES_JOINT_PLANNER_TEST_REFERENCE_H_
