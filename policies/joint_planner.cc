// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// The joint planner: per-head convex hulls over (widths, kept tokens), a Lagrangian greedy across
// heads, a fill pass, and the requantize-or-evict advice (docs/joint_planner.md).
#include "policies/joint_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

namespace kvctl {
namespace {

using internal::StrCat;

constexpr double kInf = std::numeric_limits<double>::infinity();

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
  double RF = 0;
  double q0 = 0;
  double s = 0;                // Parametric scale; 0 = uniform or tabulated.
  std::vector<int> pair_hull;  // Indices into Context::pairs: bpt up, q down.
  std::vector<double> q;       // q per pair_hull entry.
  bool vary_kept = true;
  double tol = 0;  // Distortion changes at most this are rounding, not gains.

  double R(int64_t k) const {
    const EvictionCurve& c = in->eviction;
    if (!c.table.retained.empty()) return c.table.At(k);
    if (s <= 0) return static_cast<double>(k) / static_cast<double>(T);
    return std::expm1(-static_cast<double>(k) / s) / std::expm1(-static_cast<double>(T) / s);
  }
  double D(double Rk, int c) const {
    return static_cast<double>(T) * ((Rk - RF) * q[c] + (1 - Rk) * q0);
  }
  double Bytes(const Context& ctx, int64_t k, int c) const {
    return static_cast<double>(F) * ctx.fp16_bpt +
           static_cast<double>(k - F) * ctx.pairs[pair_hull[c]].bpt;
  }
};

double QOf(const JointHeadInput& h, const Pair& p) {
  return h.importance_k * h.alpha_k * p.k_pow + h.importance_v * h.alpha_v * p.v_pow;
}

bool AllowedWidth(QuantMethod method, int b) {
  return b >= 1 && b < 32 && (TraitsOf(method).allowed_bits & (1u << b));
}

std::vector<int> BoundedBits(const JointPlanInput& in) {
  std::vector<int> out;
  for (int b : in.bits) {
    if (b >= in.min_bits && (in.max_bits == 0 || b <= in.max_bits)) out.push_back(b);
  }
  return out;
}

Status ValidateHead(const JointPlanInput& in, size_t i) {
  const JointHeadInput& h = in.heads[i];
  const std::string f = StrCat("heads[", i, "].");
  const int want_layer = static_cast<int>(i / static_cast<size_t>(in.kv_heads));
  const int want_head = static_cast<int>(i % static_cast<size_t>(in.kv_heads));
  if (h.layer != want_layer) {
    return InvalidArgument(f, "layer: got ", h.layer, ", expected ", want_layer,
                           " ((layer, head) order)");
  }
  if (h.head != want_head) {
    return InvalidArgument(f, "head: got ", h.head, ", expected ", want_head,
                           " ((layer, head) order)");
  }
  const std::pair<const char*, double> nonneg[] = {{"alpha_k", h.alpha_k},
                                                   {"alpha_v", h.alpha_v},
                                                   {"importance_k", h.importance_k},
                                                   {"importance_v", h.importance_v}};
  for (const auto& [name, v] : nonneg) {
    if (!std::isfinite(v) || v < 0) {
      return InvalidArgument(f, name, ": got ", v, ", expected a finite value >= 0");
    }
  }
  if (h.tokens < 1 || h.tokens > (int64_t{1} << 40)) {
    return InvalidArgument(f, "tokens: got ", h.tokens, ", expected 1..2^40");
  }
  if (h.fixed_tokens < 0 || h.fixed_tokens > h.tokens) {
    return InvalidArgument(f, "fixed_tokens: got ", h.fixed_tokens, ", expected 0..", h.tokens,
                           " (tokens)");
  }
  const EvictionCurve& c = h.eviction;
  if (!c.table.retained.empty()) {
    const int64_t n = static_cast<int64_t>(c.table.retained.size());
    if (c.table.min_budget < 0 || c.table.min_budget > h.fixed_tokens ||
        c.table.min_budget + n - 1 != h.tokens) {
      return InvalidArgument(f, "eviction.table: covers ", c.table.min_budget, "..",
                             c.table.min_budget + n - 1, " tokens, expected min_budget 0..",
                             h.fixed_tokens, " (fixed_tokens) up to ", h.tokens, " (tokens)");
    }
    double prev = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double v = c.table.retained[static_cast<size_t>(j)];
      if (!std::isfinite(v) || v < prev - 1e-12 || v > 1 + 1e-9) {
        return InvalidArgument(f, "eviction.table.retained[", j, "]: got ", v,
                               ", expected nondecreasing values in [0, 1]");
      }
      prev = v;
    }
  } else {
    if (!std::isfinite(c.coverage_tokens) || c.coverage_tokens < 0) {
      return InvalidArgument(f, "eviction.coverage_tokens: got ", c.coverage_tokens,
                             ", expected a finite value >= 0");
    }
    if (!(c.tau > 0 && c.tau < 1)) {
      return InvalidArgument(f, "eviction.tau: got ", c.tau, ", expected (0, 1)");
    }
  }
  return OkStatus();
}

// Lower convex hull of points sorted by x ascending (ties: y ascending), cut after its lowest
// point: the strictly decreasing part. Returns indices into the points. A vertex stays only if
// the drop per unit of x before it is larger than after it, compared exactly as the planner later
// computes segment ratios, so those ratios fall strictly along the hull even for (nearly)
// collinear points. A drop of at most `tol` does not count as a drop.
template <typename Pt>
void DecreasingHull(const std::vector<Pt>& pts, double tol, std::vector<int>* hull) {
  hull->clear();
  auto ratio = [&](int a, int b) { return (pts[a].y - pts[b].y) / (pts[b].x - pts[a].x); };
  for (int i = 0; i < static_cast<int>(pts.size()); ++i) {
    if (!hull->empty()) {
      const Pt& last = pts[hull->back()];
      if (pts[i].y >= last.y - tol || pts[i].x <= last.x) continue;
    }
    while (hull->size() >= 2 &&
           ratio((*hull)[hull->size() - 2], hull->back()) <= ratio(hull->back(), i)) {
      hull->pop_back();
    }
    hull->push_back(i);
  }
}

struct XY {
  double x = 0, y = 0;
};

StatusOr<Context> MakeContext(const JointPlanInput& in) {
  KVCTL_RETURN_IF_ERROR(ValidateJointInput(in));
  Context ctx;
  ctx.in = &in;
  ctx.fp16_bpt = 4.0 * in.spec.head_dim;
  ctx.quantum = in.token_quantum > 0 ? in.token_quantum : in.spec.block_tokens;
  const std::vector<int> bits = BoundedBits(in);
  for (int kb : bits) {
    for (int vb : bits) {
      QuantSpec s = in.spec;
      s.k_bits = kb;
      s.v_bits = vb;
      Status ok = ValidateQuantSpec(s);
      if (!ok.ok()) return InvalidArgument("bits: ", kb, "/", vb, ": ", ok.message());
      ctx.pairs.push_back({kb, vb,
                           BitsPerElement(s, in.kv_heads).average * 2.0 * in.spec.head_dim / 8.0,
                           std::pow(in.beta_k, -kb), std::pow(in.beta_v, -vb)});
    }
  }
  std::stable_sort(ctx.pairs.begin(), ctx.pairs.end(),
                   [](const Pair& a, const Pair& b) { return a.bpt < b.bpt; });
  const int ek = in.evict_k_bits ? in.evict_k_bits : bits.back();
  const int ev = in.evict_v_bits ? in.evict_v_bits : bits.back();
  for (size_t i = 0; i < ctx.pairs.size(); ++i) {
    if (ctx.pairs[i].k_bits == ek && ctx.pairs[i].v_bits == ev)
      ctx.evict_pair = static_cast<int>(i);
  }
  return ctx;
}

HeadModel MakeHead(const Context& ctx, size_t i, JointMode mode) {
  const JointPlanInput& in = *ctx.in;
  HeadModel m;
  m.in = &in.heads[i];
  m.T = m.in->tokens;
  m.F = m.in->fixed_tokens;
  m.kmin = std::min(m.T, std::max(m.F, in.min_tokens));
  const EvictionCurve& c = m.in->eviction;
  if (c.table.retained.empty() && c.coverage_tokens > 0) {
    m.s = c.coverage_tokens / std::log(1.0 / (1.0 - c.tau));
  }
  m.RF = m.R(m.F);
  m.q0 =
      in.eviction_scale * (m.in->importance_k * m.in->alpha_k + m.in->importance_v * m.in->alpha_v);
  m.vary_kept = mode != JointMode::kQuantOnly;
  if (mode == JointMode::kQuantOnly) m.kmin = m.T;
  if (mode == JointMode::kEvictOnly) {
    m.pair_hull = {ctx.evict_pair};
    m.q = {QOf(*m.in, ctx.pairs[ctx.evict_pair])};
    m.tol = 1e-12 * static_cast<double>(m.T) * (m.q0 + m.q[0]);
    return m;
  }
  std::vector<XY> pts(ctx.pairs.size());
  for (size_t p = 0; p < ctx.pairs.size(); ++p)
    pts[p] = {ctx.pairs[p].bpt, QOf(*m.in, ctx.pairs[p])};
  // Equal bpt: the lower q first, so the hull keeps it.
  std::vector<int> order(pts.size());
  for (size_t p = 0; p < order.size(); ++p) order[p] = static_cast<int>(p);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return pts[a].x < pts[b].x || (pts[a].x == pts[b].x && pts[a].y < pts[b].y);
  });
  std::vector<XY> sorted(pts.size());
  for (size_t p = 0; p < order.size(); ++p) sorted[p] = pts[order[p]];
  std::vector<int> hull;
  double qmax = 0;
  for (const XY& p : sorted) qmax = std::max(qmax, p.y);
  DecreasingHull(sorted, 1e-12 * qmax, &hull);
  for (int h : hull) {
    m.pair_hull.push_back(order[h]);
    m.q.push_back(sorted[h].y);
  }
  m.tol = 1e-12 * static_cast<double>(m.T) * (m.q0 + m.q[0]);
  return m;
}

// The kept counts of a head's grid: kmin, kmin + j * quantum, ..., T; at most `levels` of them.
std::vector<int64_t> KeptGrid(const HeadModel& m, int64_t quantum, int levels) {
  if (!m.vary_kept || m.kmin >= m.T) return {m.T};
  const int64_t n = (m.T - m.kmin + quantum - 1) / quantum;  // Steps to reach T.
  std::vector<int64_t> out;
  if (n + 1 <= levels) {
    for (int64_t j = 0; j <= n; ++j) out.push_back(std::min(m.T, m.kmin + j * quantum));
    return out;
  }
  for (int i = 0; i < levels; ++i) {
    const int64_t j = static_cast<int64_t>(std::llround(static_cast<double>(i) * n / (levels - 1)));
    const int64_t k = std::min(m.T, m.kmin + j * quantum);
    if (out.empty() || k != out.back()) out.push_back(k);
  }
  return out;
}

struct Vertex {
  int64_t k = 0;
  int c = 0;  // Index into HeadModel::pair_hull.
  double bytes = 0, D = 0;
};

struct HullPoint {
  double x = 0, y = 0;
  int64_t k = 0;
  int c = 0;
};

// The kept-count grid of a head and R on it, shared by the modes that evict.
struct GridCache {
  std::vector<int64_t> k;
  std::vector<double> R;
};

// The head's hull over (grid kept counts) x (its widths). Each width's chain is convex and sorted
// by bytes, so the hull is built chain by chain: merge the hull so far with the next chain and
// prune, O(widths x (grid + hull)) instead of sorting the union.
void BuildHull(const Context& ctx, const HeadModel& m, const GridCache& grid,
               std::vector<HullPoint>* acc, std::vector<HullPoint>* merged, std::vector<int>* idx,
               std::vector<Vertex>* out) {
  const size_t G = grid.k.size(), C = m.pair_hull.size();
  acc->clear();
  for (size_t c = 0; c < C; ++c) {
    merged->clear();
    size_t a = 0, j = 0;
    while (a < acc->size() || j < G) {
      HullPoint p;
      if (j < G) {
        p = {m.Bytes(ctx, grid.k[j], static_cast<int>(c)), m.D(grid.R[j], static_cast<int>(c)),
             grid.k[j], static_cast<int>(c)};
      }
      if (j == G ||
          (a < acc->size() && ((*acc)[a].x < p.x || ((*acc)[a].x == p.x && (*acc)[a].y <= p.y)))) {
        merged->push_back((*acc)[a++]);
      } else {
        merged->push_back(p);
        ++j;
      }
    }
    DecreasingHull(*merged, m.tol, idx);
    acc->clear();
    for (int i : *idx) acc->push_back((*merged)[i]);
  }
  out->clear();
  for (const HullPoint& p : *acc) out->push_back({p.k, p.c, p.x, p.y});
}

struct Segment {
  double ratio = 0;  // Distortion saved per byte.
  double cost = 0;
  double gain = 0;
  int head = 0;
  int index = 0;  // From vertex index to index + 1.
};

// A fill move of one head: its next hull segment, one token quantum, or one width step.
enum class MoveKind : uint8_t { kSegment, kTokens, kWidth };
struct Move {
  double ratio = 0, cost = 0;
  int head = 0;
  int version = 0;
  MoveKind kind = MoveKind::kTokens;
  bool operator<(const Move& o) const { return ratio < o.ratio; }
};

struct HeadState {
  int64_t k = 0;
  int c = 0;
  double bytes = 0, D = 0;
  int vertex = 0;  // Index of the hull vertex the head sits on; -1 between vertices.
};

// The best state of every head for one mode, plus the totals PlanJoint reports.
struct ModeResult {
  std::vector<HeadModel> models;
  std::vector<HeadState> state;
  double bytes = 0, D = 0, lower_bound = 0, min_bytes = 0, max_bytes = 0, unit = 0;
  bool saturated = false;
};

// Pushes the head's moves with a positive gain; false when it has none (it is at its best).
bool PushMoves(const Context& ctx, const HeadModel& m, const std::vector<Vertex>& hull,
               const HeadState& s, int head, int version, std::priority_queue<Move>* heap) {
  bool any = false;
  auto push = [&](double cost, double gain, MoveKind kind) {
    if (gain > m.tol && cost > 0) {
      heap->push({gain / cost, cost, head, version, kind});
      any = true;
    }
  };
  if (s.vertex >= 0 && s.vertex + 1 < static_cast<int>(hull.size())) {
    const Vertex& v = hull[s.vertex + 1];
    push(v.bytes - s.bytes, s.D - v.D, MoveKind::kSegment);
  }
  if (m.vary_kept && s.k < m.T) {
    const int64_t k2 = std::min(m.T, s.k + ctx.quantum);
    push(m.Bytes(ctx, k2, s.c) - s.bytes, s.D - m.D(m.R(k2), s.c), MoveKind::kTokens);
  }
  if (s.c + 1 < static_cast<int>(m.pair_hull.size())) {
    push(m.Bytes(ctx, s.k, s.c + 1) - s.bytes, s.D - m.D(m.R(s.k), s.c + 1), MoveKind::kWidth);
  }
  return any;
}

// Takes the segments of highest ratio while they fit, exactly as the greedy over the sorted list
// would (ties in (head, index) order), by a weighted quickselect on the ratio: expected linear
// time instead of a sort. Within a head ratios fall strictly, so what it takes is a prefix of
// every head's hull; pos[h] counts it.
void TakeBestSegments(std::vector<Segment>* segs, double* left, double* D, std::vector<int>* pos) {
  auto first = segs->begin(), last = segs->end();
  while (first != last) {
    const double pivot = (first + (last - first) / 2)->ratio;
    auto above = std::partition(first, last, [&](const Segment& s) { return s.ratio > pivot; });
    double cost = 0;
    for (auto it = first; it != above; ++it) cost += it->cost;
    if (cost > *left) {
      last = above;  // The answer lies among the higher ratios.
      continue;
    }
    for (auto it = first; it != above; ++it) {
      *left -= it->cost;
      *D -= it->gain;
      ++(*pos)[it->head];
    }
    auto equal = std::partition(above, last, [&](const Segment& s) { return s.ratio >= pivot; });
    std::sort(above, equal, [](const Segment& a, const Segment& b) {
      return a.head != b.head ? a.head < b.head : a.index < b.index;
    });
    for (auto it = above; it != equal; ++it) {
      if (it->cost > *left) return;  // The critical segment: the greedy stops here.
      *left -= it->cost;
      *D -= it->gain;
      ++(*pos)[it->head];
    }
    first = equal;
  }
}

StatusOr<ModeResult> SolveMode(const Context& ctx, JointMode mode,
                               const std::vector<GridCache>& grids) {
  const JointPlanInput& in = *ctx.in;
  const size_t H = in.heads.size();
  ModeResult r;
  r.models.resize(H);
  std::vector<std::vector<Vertex>> hulls(H);
  std::vector<HullPoint> acc, merged;
  std::vector<int> idx;
  std::vector<Segment> segs;
  GridCache all_kept;
  for (size_t h = 0; h < H; ++h) {
    r.models[h] = MakeHead(ctx, h, mode);
    const HeadModel& m = r.models[h];
    if (mode == JointMode::kQuantOnly) {
      all_kept.k = {m.T};
      all_kept.R = {m.R(m.T)};
    }
    BuildHull(ctx, m, mode == JointMode::kQuantOnly ? all_kept : grids[h], &acc, &merged, &idx,
              &hulls[h]);
    const std::vector<Vertex>& v = hulls[h];
    r.min_bytes += v.front().bytes;
    r.max_bytes += v.back().bytes;
    for (size_t i = 0; i + 1 < v.size(); ++i) {
      const double cost = v[i + 1].bytes - v[i].bytes, gain = v[i].D - v[i + 1].D;
      segs.push_back({gain / cost, cost, gain, static_cast<int>(h), static_cast<int>(i)});
    }
    // One allocation unit: a token quantum at the widest width, or the largest width step of all
    // the quantized tokens.
    if (m.vary_kept) {
      r.unit =
          std::max(r.unit, static_cast<double>(ctx.quantum) * ctx.pairs[m.pair_hull.back()].bpt);
    }
    for (size_t c = 0; c + 1 < m.pair_hull.size(); ++c) {
      r.unit =
          std::max(r.unit, static_cast<double>(m.T - m.F) *
                               (ctx.pairs[m.pair_hull[c + 1]].bpt - ctx.pairs[m.pair_hull[c]].bpt));
    }
  }
  const double budget = static_cast<double>(in.budget_bytes);
  if (r.min_bytes > budget * (1 + 1e-12)) {
    return ResourceExhausted("budget_bytes: got ", in.budget_bytes,
                             ", expected >= ", static_cast<int64_t>(std::ceil(r.min_bytes)), " (",
                             JointModeName(mode), ": every head at its floor and lowest width)");
  }
  // Phase 1, the Lagrangian: whole hull segments by distortion saved per byte, until the first
  // that does not fit (the critical one).
  std::vector<int> pos(H, 0);
  double left = budget - r.min_bytes;
  double D = 0;
  for (size_t h = 0; h < H; ++h) D += hulls[h].front().D;
  TakeBestSegments(&segs, &left, &D, &pos);
  // The hull relaxation finishes with a fraction of the best segment left: a bound over the grid.
  double critical = 0;
  for (size_t h = 0; h < H; ++h) {
    const std::vector<Vertex>& v = hulls[h];
    const size_t i = static_cast<size_t>(pos[h]);
    if (i + 1 < v.size()) {
      critical = std::max(critical, (v[i].D - v[i + 1].D) / (v[i + 1].bytes - v[i].bytes));
    }
  }
  r.lower_bound = D - left * critical;
  r.state.resize(H);
  for (size_t h = 0; h < H; ++h) {
    const Vertex& v = hulls[h][pos[h]];
    r.state[h] = {v.k, v.c, v.bytes, v.D, pos[h]};
  }
  // Phase 2, the fill: what is left goes to whole segments, token quanta (partway along a
  // segment: at least the segment's ratio, D being convex in k) and width steps, best ratio first
  // among those that fit. A move that does not fit now never will (the budget only shrinks).
  std::priority_queue<Move> heap;
  std::vector<int> version(H, 0);
  for (size_t h = 0; h < H; ++h) {
    PushMoves(ctx, r.models[h], hulls[h], r.state[h], static_cast<int>(h), 0, &heap);
  }
  while (!heap.empty()) {
    const Move mv = heap.top();
    heap.pop();
    if (mv.version != version[mv.head] || mv.cost > left) continue;
    HeadState& s = r.state[mv.head];
    const HeadModel& m = r.models[mv.head];
    const std::vector<Vertex>& hull = hulls[mv.head];
    if (mv.kind == MoveKind::kSegment) {
      const Vertex& v = hull[++s.vertex];
      s.k = v.k;
      s.c = v.c;
    } else {
      if (mv.kind == MoveKind::kTokens) {
        s.k = std::min(m.T, s.k + ctx.quantum);
      } else {
        ++s.c;
      }
      const bool next = s.vertex >= 0 && s.vertex + 1 < static_cast<int>(hull.size()) &&
                        hull[s.vertex + 1].k == s.k && hull[s.vertex + 1].c == s.c;
      s.vertex = next ? s.vertex + 1 : -1;
    }
    s.bytes = m.Bytes(ctx, s.k, s.c);
    s.D = m.D(m.R(s.k), s.c);
    left -= mv.cost;
    ++version[mv.head];
    PushMoves(ctx, m, hull, s, mv.head, version[mv.head], &heap);
  }
  r.saturated = true;
  for (size_t h = 0; h < H && r.saturated; ++h) {
    std::priority_queue<Move> probe;
    if (PushMoves(ctx, r.models[h], hulls[h], r.state[h], 0, 0, &probe)) r.saturated = false;
  }
  for (const HeadState& s : r.state) {
    r.bytes += s.bytes;
    r.D += s.D;
  }
  return r;
}

JointHeadPlan Describe(const Context& ctx, const HeadModel& m, const HeadState& s) {
  JointHeadPlan p;
  p.layer = m.in->layer;
  p.head = m.in->head;
  p.tokens = m.T;
  p.kept = s.k;
  const Pair& pair = ctx.pairs[m.pair_hull[s.c]];
  p.k_bits = pair.k_bits;
  p.v_bits = pair.v_bits;
  p.bytes = m.Bytes(ctx, s.k, s.c);
  p.retained_mass = m.R(s.k);
  p.quant_distortion = static_cast<double>(m.T) * (p.retained_mass - m.RF) * m.q[s.c];
  p.eviction_distortion = static_cast<double>(m.T) * (1 - p.retained_mass) * m.q0;
  p.distortion = p.quant_distortion + p.eviction_distortion;
  return p;
}

JointPlan Assemble(const Context& ctx, JointMode mode, JointMode solved, const ModeResult& r) {
  JointPlan plan;
  plan.mode = mode;
  plan.source = std::string(JointModeName(solved));
  plan.budget_bytes = ctx.in->budget_bytes;
  plan.min_bytes = r.min_bytes;
  plan.max_bytes = r.max_bytes;
  plan.unit_bytes = r.unit;
  plan.saturated = r.saturated;
  plan.lower_bound = std::min(r.lower_bound, r.D);
  plan.heads.reserve(r.state.size());
  for (size_t h = 0; h < r.state.size(); ++h) {
    JointHeadPlan p = Describe(ctx, r.models[h], r.state[h]);
    plan.bytes += p.bytes;
    plan.distortion += p.distortion;
    plan.quant_distortion += p.quant_distortion;
    plan.eviction_distortion += p.eviction_distortion;
    plan.tokens += p.tokens;
    plan.kept += p.kept;
    plan.heads.push_back(p);
  }
  return plan;
}

}  // namespace

std::string_view JointModeName(JointMode mode) {
  switch (mode) {
    case JointMode::kQuantOnly:
      return "quant-only";
    case JointMode::kEvictOnly:
      return "evict-only";
    case JointMode::kJoint:
      return "joint";
  }
  return "?";
}

StatusOr<JointMode> ParseJointMode(std::string_view name) {
  for (JointMode m : {JointMode::kJoint, JointMode::kQuantOnly, JointMode::kEvictOnly}) {
    if (name == JointModeName(m)) return m;
  }
  return InvalidArgument("mode: got '", name, "', expected joint, quant-only or evict-only");
}

Status ValidateJointInput(const JointPlanInput& in) {
  {
    Status s = ValidateQuantSpec(in.spec);
    if (!s.ok()) return InvalidArgument("spec.", s.message());
  }
  if (in.layers < 1 || in.layers > 4096) {
    return InvalidArgument("layers: got ", in.layers, ", expected 1..4096");
  }
  if (in.kv_heads < 1 || in.kv_heads > 4096) {
    return InvalidArgument("kv_heads: got ", in.kv_heads, ", expected 1..4096");
  }
  if (!(std::isfinite(in.beta_k) && in.beta_k > 1)) {
    return InvalidArgument("beta_k: got ", in.beta_k, ", expected a finite value > 1");
  }
  if (!(std::isfinite(in.beta_v) && in.beta_v > 1)) {
    return InvalidArgument("beta_v: got ", in.beta_v, ", expected a finite value > 1");
  }
  if (in.bits.empty()) return InvalidArgument("bits: empty, expected at least one width");
  for (size_t j = 0; j < in.bits.size(); ++j) {
    const int b = in.bits[j];
    if (!AllowedWidth(in.spec.method, b) || (j > 0 && b <= in.bits[j - 1])) {
      return InvalidArgument("bits[", j, "]: got ", b, ", expected ascending widths allowed by ",
                             QuantMethodName(in.spec.method));
    }
  }
  if (in.min_bits < 0) return InvalidArgument("min_bits: got ", in.min_bits, ", expected >= 0");
  if (in.max_bits < 0) return InvalidArgument("max_bits: got ", in.max_bits, ", expected >= 0");
  const std::vector<int> bits = BoundedBits(in);
  if (bits.empty()) {
    return InvalidArgument("min_bits/max_bits: got ", in.min_bits, "/", in.max_bits,
                           ", expected a range holding one of bits");
  }
  const std::pair<const char*, int> evict[] = {{"evict_k_bits", in.evict_k_bits},
                                               {"evict_v_bits", in.evict_v_bits}};
  for (const auto& [name, b] : evict) {
    if (b != 0 && std::find(bits.begin(), bits.end(), b) == bits.end()) {
      return InvalidArgument(name, ": got ", b, ", expected 0 or one of the allowed widths ",
                             bits.front(), "..", bits.back());
    }
  }
  if (in.budget_bytes < 1) {
    return InvalidArgument("budget_bytes: got ", in.budget_bytes, ", expected >= 1");
  }
  if (in.token_quantum < 0 || in.token_quantum > (1 << 20)) {
    return InvalidArgument("token_quantum: got ", in.token_quantum, ", expected 0..2^20");
  }
  if (in.min_tokens < 0) {
    return InvalidArgument("min_tokens: got ", in.min_tokens, ", expected >= 0");
  }
  if (!(std::isfinite(in.eviction_scale) && in.eviction_scale > 0)) {
    return InvalidArgument("eviction_scale: got ", in.eviction_scale,
                           ", expected a finite value > 0");
  }
  if (in.kept_levels < 2 || in.kept_levels > 4096) {
    return InvalidArgument("kept_levels: got ", in.kept_levels, ", expected 2..4096");
  }
  const size_t want = static_cast<size_t>(in.layers) * static_cast<size_t>(in.kv_heads);
  if (in.heads.size() != want) {
    return InvalidArgument("heads: got ", in.heads.size(),
                           " entries, expected layers x kv_heads = ", want);
  }
  for (size_t i = 0; i < in.heads.size(); ++i) KVCTL_RETURN_IF_ERROR(ValidateHead(in, i));
  return OkStatus();
}

StatusOr<JointPlan> PlanJoint(const JointPlanInput& input, JointMode mode) {
  KVCTL_ASSIGN_OR_RETURN(const Context ctx, MakeContext(input));
  // The kept grid and R on it: the same for joint and evict-only, and most of the exp() calls.
  std::vector<GridCache> grids(mode == JointMode::kQuantOnly ? 0 : input.heads.size());
  for (size_t h = 0; h < grids.size(); ++h) {
    const HeadModel m = MakeHead(ctx, h, JointMode::kEvictOnly);
    grids[h].k = KeptGrid(m, ctx.quantum, input.kept_levels);
    grids[h].R.resize(grids[h].k.size());
    for (size_t j = 0; j < grids[h].k.size(); ++j) grids[h].R[j] = m.R(grids[h].k[j]);
  }
  if (mode != JointMode::kJoint) {
    KVCTL_ASSIGN_OR_RETURN(const ModeResult r, SolveMode(ctx, mode, grids));
    return Assemble(ctx, mode, mode, r);
  }
  KVCTL_ASSIGN_OR_RETURN(const ModeResult joint, SolveMode(ctx, JointMode::kJoint, grids));
  // The greedy is optimal only up to its last segment; the single levers search subsets of the
  // joint options, so their plans are candidates too and the joint plan is never worse.
  const ModeResult* best = &joint;
  JointMode solved = JointMode::kJoint;
  double unit = joint.unit;
  StatusOr<ModeResult> alt[2] = {SolveMode(ctx, JointMode::kQuantOnly, grids),
                                 SolveMode(ctx, JointMode::kEvictOnly, grids)};
  const JointMode alt_mode[2] = {JointMode::kQuantOnly, JointMode::kEvictOnly};
  for (int i = 0; i < 2; ++i) {
    if (!alt[i].ok()) continue;  // That lever alone cannot meet the budget.
    unit = std::max(unit, alt[i]->unit);
    if (alt[i]->D < best->D) {
      best = &*alt[i];
      solved = alt_mode[i];
    }
  }
  JointPlan plan = Assemble(ctx, mode, solved, *best);
  plan.min_bytes = joint.min_bytes;
  plan.max_bytes = joint.max_bytes;
  plan.unit_bytes = unit;
  plan.lower_bound = std::min(joint.lower_bound, plan.distortion);
  return plan;
}

StatusOr<JointHeadPlan> EvaluateJointHead(const JointPlanInput& input, size_t head, int64_t kept,
                                          int k_bits, int v_bits) {
  KVCTL_ASSIGN_OR_RETURN(Context ctx, MakeContext(input));
  if (head >= input.heads.size()) {
    return InvalidArgument("head: got ", head, ", expected 0..", input.heads.size() - 1);
  }
  int pair = -1;
  for (size_t p = 0; p < ctx.pairs.size(); ++p) {
    if (ctx.pairs[p].k_bits == k_bits && ctx.pairs[p].v_bits == v_bits) pair = static_cast<int>(p);
  }
  if (pair < 0) {
    return InvalidArgument("k_bits/v_bits: got ", k_bits, "/", v_bits,
                           ", expected allowed widths within the bounds");
  }
  ctx.evict_pair = pair;
  const HeadModel m = MakeHead(ctx, head, JointMode::kEvictOnly);
  const int64_t floor = std::min(m.T, std::max(m.F, input.min_tokens));
  if (kept < floor || kept > m.T) {
    return InvalidArgument("kept: got ", kept, ", expected ", floor, "..", m.T);
  }
  return Describe(ctx, m, {kept, 0, 0, 0});
}

namespace {

// One head walking down for the shortfall: requantize (quantum by quantum, to the next cheaper
// pair of the head's hull) or evict (quantum by quantum, down to the floor).
struct DownMove {
  double ratio = 0;  // Distortion added per byte freed; lowest first.
  int head = 0;
  bool operator<(const DownMove& o) const { return ratio > o.ratio; }
};

}  // namespace

StatusOr<ShortfallAdvice> AdviseShortfall(const JointPlanInput& input, const JointPlan& current,
                                          int64_t shortfall_bytes) {
  KVCTL_ASSIGN_OR_RETURN(Context ctx, MakeContext(input));
  if (shortfall_bytes < 1) {
    return InvalidArgument("shortfall_bytes: got ", shortfall_bytes, ", expected >= 1");
  }
  const size_t H = input.heads.size();
  if (current.heads.size() != H) {
    return InvalidArgument("current.heads: got ", current.heads.size(), " entries, expected ", H);
  }
  std::vector<HeadModel> models(H);
  std::vector<int> cur_pair(H);
  for (size_t h = 0; h < H; ++h) {
    const JointHeadPlan& p = current.heads[h];
    models[h] = MakeHead(ctx, h, JointMode::kJoint);
    const HeadModel& m = models[h];
    const int64_t floor = std::min(m.T, std::max(m.F, input.min_tokens));
    if (p.kept < floor || p.kept > m.T) {
      return InvalidArgument("current.heads[", h, "].kept: got ", p.kept, ", expected ", floor,
                             "..", m.T);
    }
    cur_pair[h] = -1;
    for (size_t c = 0; c < ctx.pairs.size(); ++c) {
      if (ctx.pairs[c].k_bits == p.k_bits && ctx.pairs[c].v_bits == p.v_bits) {
        cur_pair[h] = static_cast<int>(c);
      }
    }
    if (cur_pair[h] < 0) {
      return InvalidArgument("current.heads[", h, "].k_bits/v_bits: got ", p.k_bits, "/", p.v_bits,
                             ", expected allowed widths within the bounds");
    }
  }
  const double need = static_cast<double>(shortfall_bytes);
  ShortfallAdvice advice;

  // Requantize: from the current pair down the cheaper part of the head's width hull (the current
  // pair first, then every hull pair cheaper than it). Distortion and bytes are linear in the
  // tokens moved, so a step's ratio is constant until the head is done with it.
  {
    struct Walk {
      std::vector<int> chain;  // Pair indices, current first, bpt descending.
      std::vector<double> q;
      size_t at = 0;
      int64_t left = 0;  // Tokens still at chain[at] (quantized, not fixed).
    };
    std::vector<Walk> walks(H);
    std::priority_queue<DownMove> heap;
    auto ratio = [&](size_t h) {
      const Walk& w = walks[h];
      const HeadModel& m = models[h];
      const double per_token_d = static_cast<double>(m.T) * (m.R(current.heads[h].kept) - m.RF) /
                                 static_cast<double>(current.heads[h].kept - m.F) *
                                 (w.q[w.at + 1] - w.q[w.at]);
      const double per_token_b = ctx.pairs[w.chain[w.at]].bpt - ctx.pairs[w.chain[w.at + 1]].bpt;
      return per_token_d / per_token_b;
    };
    for (size_t h = 0; h < H; ++h) {
      const HeadModel& m = models[h];
      Walk& w = walks[h];
      const Pair& cur = ctx.pairs[cur_pair[h]];
      w.chain.push_back(cur_pair[h]);
      w.q.push_back(QOf(*m.in, cur));
      // Cheaper pairs on the lower hull of (bpt, q) that start at the current pair.
      std::vector<XY> pts;
      std::vector<int> ids;
      for (int c = cur_pair[h]; c >= 0; --c) {
        const Pair& p = ctx.pairs[c];
        if (p.bpt >= cur.bpt && c != cur_pair[h]) continue;
        // Going down in bytes: x = bytes saved, y = distortion added; keep its lower hull.
        pts.push_back({cur.bpt - p.bpt, QOf(*m.in, p) - w.q[0]});
        ids.push_back(c);
      }
      std::vector<int> order(pts.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return pts[a].x < pts[b].x || (pts[a].x == pts[b].x && pts[a].y < pts[b].y);
      });
      // Lower convex hull, increasing x (a cheaper state can add distortion; all points kept
      // whose slope rises).
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
      w.left = current.heads[h].kept - m.F;
      if (w.chain.size() >= 2 && w.left > 0) heap.push({ratio(h), static_cast<int>(h)});
    }
    ShortfallOption& opt = advice.by_requantize;
    while (!heap.empty() && opt.bytes_freed < need) {
      const int h = heap.top().head;
      heap.pop();
      Walk& w = walks[h];
      const HeadModel& m = models[h];
      const double per_b = ctx.pairs[w.chain[w.at]].bpt - ctx.pairs[w.chain[w.at + 1]].bpt;
      const int64_t quantized = current.heads[h].kept - m.F;
      // Tokens to move: all that remain at this width, or just enough (in whole quanta).
      int64_t n = w.left;
      const double want_tokens = (need - opt.bytes_freed) / per_b;
      const int64_t enough = std::min(
          w.left,
          ((static_cast<int64_t>(std::ceil(want_tokens - 1e-9)) + ctx.quantum - 1) / ctx.quantum) *
              ctx.quantum);
      n = std::max<int64_t>(1, std::min(n, enough));
      const double per_d = static_cast<double>(m.T) * (m.R(current.heads[h].kept) - m.RF) /
                           static_cast<double>(quantized) * (w.q[w.at + 1] - w.q[w.at]);
      ShortfallStep st;
      st.layer = m.in->layer;
      st.head = m.in->head;
      st.tokens = n;
      st.from_k_bits = ctx.pairs[w.chain[w.at]].k_bits;
      st.from_v_bits = ctx.pairs[w.chain[w.at]].v_bits;
      st.to_k_bits = ctx.pairs[w.chain[w.at + 1]].k_bits;
      st.to_v_bits = ctx.pairs[w.chain[w.at + 1]].v_bits;
      st.bytes_freed = static_cast<double>(n) * per_b;
      st.distortion_added = static_cast<double>(n) * per_d;
      opt.bytes_freed += st.bytes_freed;
      opt.distortion_added += st.distortion_added;
      opt.steps.push_back(st);
      w.left -= n;
      if (w.left == 0) {
        // Every quantized token of the head is at the next width now.
        ++w.at;
        w.left = quantized;
        if (w.at + 1 < w.chain.size()) heap.push({ratio(h), h});
      } else {
        heap.push({ratio(h), h});  // Partial: the rest keeps the same ratio.
      }
    }
    opt.feasible = opt.bytes_freed >= need;
  }

  // Evict: token quanta from the least valuable end of each head, down to its floor.
  {
    std::vector<int64_t> kept(H);
    std::priority_queue<DownMove> heap;
    auto step = [&](size_t h, int64_t* n, double* bytes, double* d) {
      const HeadModel& m = models[h];
      const int64_t floor = std::min(m.T, std::max(m.F, input.min_tokens));
      *n = std::min(ctx.quantum, kept[h] - floor);
      const double q = QOf(*m.in, ctx.pairs[cur_pair[h]]);
      *bytes = static_cast<double>(*n) * ctx.pairs[cur_pair[h]].bpt;
      *d = static_cast<double>(m.T) * (m.R(kept[h]) - m.R(kept[h] - *n)) * (m.q0 - q);
    };
    for (size_t h = 0; h < H; ++h) {
      kept[h] = current.heads[h].kept;
      int64_t n;
      double b, d;
      step(h, &n, &b, &d);
      if (n > 0 && b > 0) heap.push({d / b, static_cast<int>(h)});
    }
    ShortfallOption& opt = advice.by_eviction;
    std::vector<int> step_of(H, -1);
    while (!heap.empty() && opt.bytes_freed < need) {
      const int h = heap.top().head;
      heap.pop();
      int64_t n;
      double b, d;
      step(h, &n, &b, &d);
      const HeadModel& m = models[h];
      if (step_of[h] < 0) {
        ShortfallStep st;
        st.layer = m.in->layer;
        st.head = m.in->head;
        st.evict = true;
        st.from_k_bits = st.to_k_bits = ctx.pairs[cur_pair[h]].k_bits;
        st.from_v_bits = st.to_v_bits = ctx.pairs[cur_pair[h]].v_bits;
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
  }
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

double Fp16Bytes(const JointPlanInput& input) {
  double total = 0;
  for (const JointHeadInput& h : input.heads) {
    total += static_cast<double>(h.tokens) * 4.0 * input.spec.head_dim;
  }
  return total;
}

StatusOr<JointPlanInput> MakeJointInput(const CalibProfile& profile, const JointProfileOptions& o) {
  const RateQuantFit& fit = profile.fit;
  KVCTL_RETURN_IF_ERROR(ValidateRateQuantFit(fit));
  if (o.tokens < 1 || o.tokens > (int64_t{1} << 40)) {
    return InvalidArgument("tokens: got ", o.tokens, ", expected 1..2^40");
  }
  if (o.sinks < -1) return InvalidArgument("sinks: got ", o.sinks, ", expected -1 or >= 0");
  if (o.window < 0) return InvalidArgument("window: got ", o.window, ", expected >= 0");
  if (o.budget_bytes < 0) {
    return InvalidArgument("budget_bytes: got ", o.budget_bytes, ", expected >= 0");
  }
  if (o.budget_bytes == 0 && !(o.budget_fraction > 0 && o.budget_fraction <= 1)) {
    return InvalidArgument("budget_fraction: got ", o.budget_fraction,
                           ", expected (0, 1] when budget_bytes is 0");
  }
  if (!(std::isfinite(o.coverage_exponent) && o.coverage_exponent >= 0 &&
        o.coverage_exponent <= 1)) {
    return InvalidArgument("coverage_exponent: got ", o.coverage_exponent, ", expected 0..1");
  }
  if (o.beta_override != 0 && !(std::isfinite(o.beta_override) && o.beta_override > 1)) {
    return InvalidArgument("beta_override: got ", o.beta_override, ", expected 0 or > 1");
  }
  JointPlanInput in;
  in.spec = fit.spec;
  in.layers = fit.layers;
  in.kv_heads = fit.kv_heads;
  in.beta_k = o.beta_override > 1 ? o.beta_override : fit.beta_k;
  in.beta_v = o.beta_override > 1 ? o.beta_override : fit.beta_v;
  in.bits = fit.bits;
  in.min_bits = o.min_bits;
  in.max_bits = o.max_bits;
  in.evict_k_bits = o.evict_k_bits;
  in.evict_v_bits = o.evict_v_bits;
  in.token_quantum = o.token_quantum;
  in.min_tokens = o.min_tokens;
  in.eviction_scale = o.eviction_scale;
  in.kept_levels = o.kept_levels;
  const int64_t sinks = o.sinks >= 0 ? o.sinks : TraitsOf(fit.spec.method).streaming.sink_tokens;
  const int64_t fixed = std::min(o.tokens, sinks + o.window);
  const double calib_len = fit.sequences > 0 && fit.tokens > 0
                               ? static_cast<double>(fit.tokens) / fit.sequences
                               : static_cast<double>(o.tokens);
  const double scale = std::pow(static_cast<double>(o.tokens) / calib_len, o.coverage_exponent);
  for (int l = 0; l < fit.layers; ++l) {
    for (int h = 0; h < fit.kv_heads; ++h) {
      JointHeadInput hi;
      hi.layer = l;
      hi.head = h;
      const RateQuantUnit& k = fit.Unit(l, h, UnitKind::kKey);
      const RateQuantUnit& v = fit.Unit(l, h, UnitKind::kValue);
      hi.alpha_k = k.alpha;
      hi.alpha_v = v.alpha;
      hi.importance_k = o.uniform_importance ? 1.0 : k.importance;
      hi.importance_v = o.uniform_importance ? 1.0 : v.importance;
      hi.tokens = o.tokens;
      hi.fixed_tokens = fixed;
      if (profile.demand) {
        const LayerDemandProfile& d = *profile.demand;
        double size = std::max(1.0, d.demand[static_cast<size_t>(l)] * scale);
        hi.eviction.tau = std::min(d.tau, 0.999999);  // tau = 1: "all of the mass".

        // exp(entropy) of an exponential profile with scale s is about e * s.
        if (d.measure == DemandMeasure::kEntropy) {
          size = size / std::exp(1.0) * std::log(1.0 / (1.0 - d.tau));
        }
        hi.eviction.coverage_tokens = size;
      }
      in.heads.push_back(hi);
    }
  }
  in.budget_bytes = o.budget_bytes > 0
                        ? o.budget_bytes
                        : static_cast<int64_t>(std::floor(o.budget_fraction * Fp16Bytes(in)));
  if (in.budget_bytes < 1) in.budget_bytes = 1;
  return in;
}

}  // namespace kvctl
