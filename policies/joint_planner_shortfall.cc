// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// Requantize before evict: the cheaper way, in predicted distortion, to free a byte shortfall
// (docs/joint_planner.md).
#include <algorithm>
#include <cmath>
#include <queue>

#include "policies/joint_planner.h"
#include "policies/joint_planner_internal.h"

namespace kvctl {
using joint_internal::Context;
using joint_internal::HeadModel;
using joint_internal::MakeContext;
using joint_internal::MakeHead;
using joint_internal::Pair;
using joint_internal::QOf;
using joint_internal::XY;

namespace {

// One head walking down for the shortfall: requantize (quantum by quantum, to the next cheaper
// pair of the head's hull) or evict (quantum by quantum, down to the floor).
struct DownMove {
  double ratio = 0;  // Distortion added per byte freed; lowest first.
  int head = 0;
  bool operator<(const DownMove& o) const { return ratio > o.ratio; }
};

// The plan the shortfall starts from: each head's model and the index of its current width pair.
struct CurrentPlan {
  std::vector<HeadModel> models;
  std::vector<int> pair;
};

StatusOr<CurrentPlan> ReadCurrentPlan(const Context& ctx, const JointPlanInput& input,
                                      const JointPlan& current) {
  const size_t H = input.heads.size();
  if (current.heads.size() != H) {
    return InvalidArgument("current.heads: got ", current.heads.size(), " entries, expected ", H);
  }
  CurrentPlan plan;
  plan.models.resize(H);
  plan.pair.resize(H);
  for (size_t h = 0; h < H; ++h) {
    const JointHeadPlan& p = current.heads[h];
    plan.models[h] = MakeHead(ctx, h, JointMode::kJoint);
    const HeadModel& m = plan.models[h];
    const int64_t floor = std::min(m.T, std::max(m.F, input.min_tokens));
    if (p.kept < floor || p.kept > m.T) {
      return InvalidArgument("current.heads[", h, "].kept: got ", p.kept, ", expected ", floor,
                             "..", m.T);
    }
    plan.pair[h] = -1;
    for (size_t c = 0; c < ctx.pairs.size(); ++c) {
      if (ctx.pairs[c].k_bits == p.k_bits && ctx.pairs[c].v_bits == p.v_bits) {
        plan.pair[h] = static_cast<int>(c);
      }
    }
    if (plan.pair[h] < 0) {
      return InvalidArgument("current.heads[", h, "].k_bits/v_bits: got ", p.k_bits, "/", p.v_bits,
                             ", expected allowed widths within the bounds");
    }
  }
  return plan;
}

// One head's way down in width: the current pair, then the cheaper pairs of its lower (bytes
// saved, distortion added) hull.
struct WidthWalk {
  std::vector<int> chain;  // Pair indices, current first, bpt descending.
  std::vector<double> q;
  size_t at = 0;
  int64_t left = 0;  // Tokens still at chain[at] (quantized, not fixed).
};

WidthWalk CheaperWidths(const Context& ctx, const HeadModel& m, int current_pair) {
  WidthWalk w;
  const Pair& cur = ctx.pairs[current_pair];
  w.chain.push_back(current_pair);
  w.q.push_back(QOf(*m.in, cur));
  std::vector<XY> pts;
  std::vector<int> ids;
  for (int c = current_pair; c >= 0; --c) {
    const Pair& p = ctx.pairs[c];
    if (p.bpt >= cur.bpt && c != current_pair) continue;
    // Going down in bytes: x = bytes saved, y = distortion added; keep its lower hull.
    pts.push_back({cur.bpt - p.bpt, QOf(*m.in, p) - w.q[0]});
    ids.push_back(c);
  }
  std::vector<int> order(pts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return pts[a].x < pts[b].x || (pts[a].x == pts[b].x && pts[a].y < pts[b].y);
  });
  // Lower convex hull, increasing x (a cheaper state can add distortion; all points kept whose
  // slope rises).
  std::vector<int> hull;
  for (int i : order) {
    if (!hull.empty() && pts[i].x == pts[hull.back()].x) continue;
    while (hull.size() >= 2) {
      const XY& a = pts[hull[hull.size() - 2]];
      const XY& b = pts[hull.back()];
      const double cross = (b.x - a.x) * (pts[i].y - a.y) - (b.y - a.y) * (pts[i].x - a.x);
      if (cross > 0) break;
      hull.pop_back();
    }
    hull.push_back(i);
  }
  for (size_t j = 1; j < hull.size(); ++j) {
    w.chain.push_back(ids[hull[j]]);
    w.q.push_back(QOf(*m.in, ctx.pairs[ids[hull[j]]]));
  }
  return w;
}

// Requantize: from the current pair down the cheaper part of each head's width hull. Distortion
// and bytes are linear in the tokens moved, so a step's ratio is constant until the head is done
// with it.
ShortfallOption PlanRequantize(const Context& ctx, const JointPlan& current,
                               const CurrentPlan& plan, double need) {
  const size_t H = plan.models.size();
  std::vector<WidthWalk> walks(H);
  std::priority_queue<DownMove> heap;
  // Distortion added per token moved to the next width: the head's quantized share of its
  // retained distortion times the step in q.
  auto per_token_distortion = [&](size_t h) {
    const WidthWalk& w = walks[h];
    const HeadModel& m = plan.models[h];
    return static_cast<double>(m.T) * (m.R(current.heads[h].kept) - m.RF) /
           static_cast<double>(current.heads[h].kept - m.F) * (w.q[w.at + 1] - w.q[w.at]);
  };
  auto per_token_bytes = [&](size_t h) {
    const WidthWalk& w = walks[h];
    return ctx.pairs[w.chain[w.at]].bpt - ctx.pairs[w.chain[w.at + 1]].bpt;
  };
  auto ratio = [&](size_t h) { return per_token_distortion(h) / per_token_bytes(h); };
  for (size_t h = 0; h < H; ++h) {
    walks[h] = CheaperWidths(ctx, plan.models[h], plan.pair[h]);
    walks[h].left = current.heads[h].kept - plan.models[h].F;
    if (walks[h].chain.size() >= 2 && walks[h].left > 0) {
      heap.push({ratio(h), static_cast<int>(h)});
    }
  }
  ShortfallOption opt;
  while (!heap.empty() && opt.bytes_freed < need) {
    const int h = heap.top().head;
    heap.pop();
    WidthWalk& w = walks[h];
    const HeadModel& m = plan.models[h];
    const double per_b = per_token_bytes(h);
    // Tokens to move: all that remain at this width, or just enough (in whole quanta).
    const double want_tokens = (need - opt.bytes_freed) / per_b;
    const int64_t enough = std::min(
        w.left,
        ((static_cast<int64_t>(std::ceil(want_tokens - 1e-9)) + ctx.quantum - 1) / ctx.quantum) *
            ctx.quantum);
    const int64_t n = std::max<int64_t>(1, std::min(w.left, enough));
    ShortfallStep st;
    st.layer = m.in->layer;
    st.head = m.in->head;
    st.tokens = n;
    st.from_k_bits = ctx.pairs[w.chain[w.at]].k_bits;
    st.from_v_bits = ctx.pairs[w.chain[w.at]].v_bits;
    st.to_k_bits = ctx.pairs[w.chain[w.at + 1]].k_bits;
    st.to_v_bits = ctx.pairs[w.chain[w.at + 1]].v_bits;
    st.bytes_freed = static_cast<double>(n) * per_b;
    st.distortion_added = static_cast<double>(n) * per_token_distortion(h);
    opt.bytes_freed += st.bytes_freed;
    opt.distortion_added += st.distortion_added;
    opt.steps.push_back(st);
    w.left -= n;
    if (w.left == 0) {
      // Every quantized token of the head is at the next width now.
      ++w.at;
      w.left = current.heads[h].kept - m.F;
      if (w.at + 1 < w.chain.size()) heap.push({ratio(h), h});
    } else {
      heap.push({ratio(h), h});  // Partial: the rest keeps the same ratio.
    }
  }
  opt.feasible = opt.bytes_freed >= need;
  return opt;
}

// Evict: token quanta from the least valuable end of each head, down to its floor, at the head's
// current width. One step per head, grown quantum by quantum.
ShortfallOption PlanEviction(const Context& ctx, const JointPlanInput& input,
                             const JointPlan& current, const CurrentPlan& plan, double need) {
  const size_t H = plan.models.size();
  std::vector<int64_t> kept(H);
  std::priority_queue<DownMove> heap;
  auto step = [&](size_t h, int64_t* n, double* bytes, double* d) {
    const HeadModel& m = plan.models[h];
    const int64_t floor = std::min(m.T, std::max(m.F, input.min_tokens));
    *n = std::min(ctx.quantum, kept[h] - floor);
    const double q = QOf(*m.in, ctx.pairs[plan.pair[h]]);
    *bytes = static_cast<double>(*n) * ctx.pairs[plan.pair[h]].bpt;
    *d = static_cast<double>(m.T) * (m.R(kept[h]) - m.R(kept[h] - *n)) * (m.q0 - q);
  };
  for (size_t h = 0; h < H; ++h) {
    kept[h] = current.heads[h].kept;
    int64_t n;
    double b, d;
    step(h, &n, &b, &d);
    if (n > 0 && b > 0) heap.push({d / b, static_cast<int>(h)});
  }
  ShortfallOption opt;
  std::vector<int> step_of(H, -1);
  while (!heap.empty() && opt.bytes_freed < need) {
    const int h = heap.top().head;
    heap.pop();
    int64_t n;
    double b, d;
    step(h, &n, &b, &d);
    const HeadModel& m = plan.models[h];
    if (step_of[h] < 0) {
      ShortfallStep st;
      st.layer = m.in->layer;
      st.head = m.in->head;
      st.evict = true;
      st.from_k_bits = st.to_k_bits = ctx.pairs[plan.pair[h]].k_bits;
      st.from_v_bits = st.to_v_bits = ctx.pairs[plan.pair[h]].v_bits;
      step_of[h] = static_cast<int>(opt.steps.size());
      opt.steps.push_back(st);
    }
    ShortfallStep& st = opt.steps[step_of[h]];
    st.tokens += n;
    st.bytes_freed += b;
    st.distortion_added += d;
    opt.bytes_freed += b;
    opt.distortion_added += d;
    kept[h] -= n;
    step(h, &n, &b, &d);
    if (n > 0 && b > 0) heap.push({d / b, h});
  }
  opt.feasible = opt.bytes_freed >= need;
  return opt;
}

}  // namespace

StatusOr<ShortfallAdvice> AdviseShortfall(const JointPlanInput& input, const JointPlan& current,
                                          int64_t shortfall_bytes) {
  KVCTL_ASSIGN_OR_RETURN(Context ctx, MakeContext(input));
  if (shortfall_bytes < 1) {
    return InvalidArgument("shortfall_bytes: got ", shortfall_bytes, ", expected >= 1");
  }
  KVCTL_ASSIGN_OR_RETURN(CurrentPlan plan, ReadCurrentPlan(ctx, input, current));
  const double need = static_cast<double>(shortfall_bytes);
  ShortfallAdvice advice;
  advice.by_requantize = PlanRequantize(ctx, current, plan, need);
  advice.by_eviction = PlanEviction(ctx, input, current, plan, need);
  if (!advice.by_requantize.feasible && !advice.by_eviction.feasible) {
    return ResourceExhausted(
        "shortfall_bytes: got ", shortfall_bytes, ", expected at most what requantizing (",
        static_cast<int64_t>(advice.by_requantize.bytes_freed), ") or evicting (",
        static_cast<int64_t>(advice.by_eviction.bytes_freed), ") can free");
  }
  advice.requantize = advice.by_requantize.feasible &&
                      (!advice.by_eviction.feasible || advice.by_requantize.distortion_added <=
                                                           advice.by_eviction.distortion_added);
  return advice;
}

}  // namespace kvctl
