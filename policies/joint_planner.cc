// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// The joint planner: per-head convex hulls over (widths, kept tokens), a Lagrangian greedy across
// heads, a fill pass, and the requantize-or-evict advice (docs/joint_planner.md).
#include "policies/joint_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "policies/joint_planner_internal.h"

namespace kvctl {
namespace {

using joint_internal::Context;
using joint_internal::HeadModel;
using joint_internal::Pair;
using joint_internal::XY;

// Lower convex hull of points sorted by x ascending (ties: y ascending), cut after its lowest
// point: the strictly decreasing part, as indices into the points. A vertex stays only if the
// drop per unit of x before it is larger than after it, computed exactly as the planner computes
// segment ratios later, so those fall strictly along the hull even for (nearly) collinear points.
// A drop of at most `tol` does not count as a drop.
template <typename Pt>
void DecreasingHull(const std::vector<Pt>& pts, double tol, std::vector<int>* hull,
                    std::vector<double>* ratio) {
  hull->clear();
  ratio->clear();  // ratio[t]: of the segment that ends at hull[t] (t >= 1).
  for (int i = 0; i < static_cast<int>(pts.size()); ++i) {
    const Pt& p = pts[i];
    if (!hull->empty()) {
      const Pt& last = pts[hull->back()];
      if (p.y >= last.y - tol || p.x <= last.x) continue;
    }
    double r = 0;
    while (!hull->empty()) {
      const Pt& b = pts[hull->back()];
      r = (b.y - p.y) / (p.x - b.x);
      if (hull->size() < 2 || ratio->back() > r) break;
      hull->pop_back();
      ratio->pop_back();
    }
    hull->push_back(i);
    ratio->push_back(r);
  }
}

}  // namespace

namespace joint_internal {

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

namespace {

// A tail row is one of the k - F quantized tokens in the byte count; at fp16 it costs fp16_bpt
// minus that. The narrowest allowed width gives the largest difference, so the charge holds
// whatever widths a plan of any mode picks (and EvaluateJointHead agrees with every mode).
void SetBaseBytes(const Context& ctx, HeadModel* m) {
  const double narrowest = ctx.pairs[0].bpt;  // pairs are sorted by bytes per token.
  m->base = static_cast<double>(m->F) * ctx.fp16_bpt +
            static_cast<double>(m->in->tail_tokens) * (ctx.fp16_bpt - narrowest);
}

}  // namespace

void MakeHead(const Context& ctx, size_t i, JointMode mode, HeadModel* out) {
  const JointPlanInput& in = *ctx.in;
  HeadModel& m = *out;
  m.in = &in.heads[i];
  m.T = m.in->tokens;
  m.F = m.in->fixed_tokens;
  m.kmin = std::min(m.T, std::max(m.F, in.min_tokens));
  const EvictionCurve& c = m.in->eviction;
  m.s = m.norm = 0;
  if (c.table.retained.empty() && c.coverage_tokens > 0) {
    m.s = c.coverage_tokens / std::log(1.0 / (1.0 - c.tau));
    m.norm = std::expm1(-static_cast<double>(m.T) / m.s);
  }
  m.RF = m.R(m.F);
  m.q0 =
      in.eviction_scale * (m.in->importance_k * m.in->alpha_k + m.in->importance_v * m.in->alpha_v);
  if (mode == JointMode::kQuantOnly) m.kmin = m.T;
  SetBaseBytes(ctx, &m);
  if (mode == JointMode::kEvictOnly) {
    SetEvictOnly(ctx, &m);
    return;
  }
  // ctx.pairs is sorted by bytes per token; of pairs that cost the same only the lowest q can be
  // on the hull, so one pass gives the hull's input in (x, y) order without sorting. The
  // temporaries are per thread: PlanJoint builds hundreds of heads per call.
  thread_local std::vector<XY> pts;
  thread_local std::vector<int> ids, hull;
  thread_local std::vector<double> ratio;
  pts.clear();
  ids.clear();
  for (size_t p = 0; p < ctx.pairs.size(); ++p) {
    const XY pt{ctx.pairs[p].bpt, QOf(*m.in, ctx.pairs[p])};
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
  for (const XY& p : pts) qmax = std::max(qmax, p.y);
  const double tol = 1e-12 * qmax;
  // The non-dominated pairs, then their convex hull.
  size_t n = 0;
  for (size_t p = 0; p < pts.size(); ++p) {
    if (n > 0 && pts[p].y >= pts[n - 1].y - tol) continue;
    pts[n] = pts[p];
    ids[n++] = ids[p];
  }
  pts.resize(n);
  ids.resize(n);
  DecreasingHull(pts, tol, &hull, &ratio);
  m.widths.assign(ids.begin(), ids.end());
  m.q.resize(n);
  for (size_t p = 0; p < n; ++p) m.q[p] = pts[p].y;
  m.convex.assign(hull.begin(), hull.end());
  m.tol = 1e-12 * static_cast<double>(m.T) * (m.q0 + m.q[0]);
}

HeadModel MakeHead(const Context& ctx, size_t i, JointMode mode) {
  HeadModel m;
  MakeHead(ctx, i, mode, &m);
  return m;
}

void SetEvictOnly(const Context& ctx, HeadModel* m) {
  m->widths.assign(1, ctx.evict_pair);
  m->convex.assign(1, 0);
  m->q.assign(1, QOf(*m->in, ctx.pairs[ctx.evict_pair]));
  m->tol = 1e-12 * static_cast<double>(m->T) * (m->q0 + m->q[0]);
}

}  // namespace joint_internal

namespace {

using joint_internal::MakeContext;
using joint_internal::MakeHead;

// The kept counts of a head's grid: kmin, kmin + j * quantum, ..., T; at most `levels` of them.
void KeptGrid(const HeadModel& m, int64_t quantum, int levels, std::vector<int64_t>* out) {
  out->clear();
  if (m.kmin >= m.T) {
    out->push_back(m.T);
    return;
  }
  const int64_t n = (m.T - m.kmin + quantum - 1) / quantum;  // Steps to reach T.
  if (n + 1 <= levels) {
    for (int64_t j = 0; j <= n; ++j) out->push_back(std::min(m.T, m.kmin + j * quantum));
    return;
  }
  for (int i = 0; i < levels; ++i) {
    const int64_t j = static_cast<int64_t>(std::llround(static_cast<double>(i) * n / (levels - 1)));
    const int64_t k = std::min(m.T, m.kmin + j * quantum);
    if (out->empty() || k != out->back()) out->push_back(k);
  }
}

struct Vertex {
  int64_t k = 0;
  int c = 0;  // Index into HeadModel::widths.
  int j = 0;  // Index into the grid.
  double bytes = 0, D = 0;
};

// Kept small (24 bytes): merging these is most of the planning time.
struct HullPoint {
  double x = 0, y = 0;
  int j = 0;  // Index into the grid.
  int c = 0;
};

// Every head's hull in one array (one allocation per mode, not one per head).
struct Hulls {
  std::vector<Vertex> v;
  std::vector<size_t> start = {0};  // Head h: v[start[h], start[h + 1]).
  std::span<const Vertex> operator[](size_t h) const {
    return {v.data() + start[h], start[h + 1] - start[h]};
  }
};

// The kept-count grid of a head and R on it, shared by the modes that evict.
struct GridCache {
  std::vector<int64_t> k;
  std::vector<double> R;
};

// Orders hull points by (bytes, distortion, width): a strict total order between chains.
bool Before(const HullPoint& a, const HullPoint& b) {
  return a.x < b.x || (a.x == b.x && (a.y < b.y || (a.y == b.y && a.c < b.c)));
}

// The head's hull over (grid kept counts) x (its hull widths). Each width's chain is convex and
// sorted by bytes (k ascending), so the chains are merged by bytes into one sorted list and the
// hull is one pass over it: no sort, no rebuilding. The merge is a tree of two-way merges of
// neighbouring runs of chains: it takes the least head by Before at every step, as a scan over
// all chain heads would, with log2(chains) comparisons per point instead of one per chain.
void BuildHull(const Context& ctx, const HeadModel& m, const GridCache& grid,
               std::vector<HullPoint>* acc, std::vector<HullPoint>* merged, std::vector<int>* idx,
               std::vector<double>* ratios, Hulls* out) {
  const int G = static_cast<int>(grid.k.size());
  const int C = static_cast<int>(m.convex.size());
  const int n = C * G;
  // y = T ((R - RF) q + (1 - R) q0); x = base + (k_j - F) bpt_c. Chain c is [c G, (c + 1) G).
  std::vector<HullPoint>*from = merged, *to = acc;
  from->resize(static_cast<size_t>(n));
  to->resize(static_cast<size_t>(n));
  const double T = static_cast<double>(m.T), base = m.base;
  for (int c = 0; c < C; ++c) {
    const int w = m.convex[c];
    const double bpt = ctx.pairs[m.widths[w]].bpt, q = m.q[w];
    HullPoint* p = from->data() + static_cast<size_t>(c) * G;
    for (int j = 0; j < G; ++j) {
      const double R = grid.R[j];
      p[j] = {base + static_cast<double>(grid.k[j] - m.F) * bpt,
              T * ((R - m.RF) * q + (1 - R) * m.q0), j, w};
    }
  }
  for (int run = G; run < n; run *= 2) {
    for (int lo = 0; lo < n; lo += 2 * run) {
      const int mid = std::min(lo + run, n), hi = std::min(lo + 2 * run, n);
      std::merge(from->begin() + lo, from->begin() + mid, from->begin() + mid, from->begin() + hi,
                 to->begin() + lo, Before);
    }
    std::swap(from, to);
  }
  DecreasingHull(*from, m.tol, idx, ratios);
  for (int i : *idx) {
    const HullPoint& p = (*from)[i];
    out->v.push_back({grid.k[p.j], p.c, p.j, p.x, p.y});
  }
  out->start.push_back(out->v.size());
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
  double bytes = 0, D = 0, Rk = 0;
  int vertex = 0;  // Index of the hull vertex the head sits on; -1 between vertices.
};

// The best state of every head for one mode, plus the totals PlanJoint reports.
struct ModeResult {
  const std::vector<HeadModel>* models = nullptr;
  std::vector<HeadState> state;
  double bytes = 0, D = 0, lower_bound = 0, min_bytes = 0, max_bytes = 0, unit = 0;
  bool saturated = false;
};

// PlanJoint's arrays, kept per thread between calls: for 80 x 8 heads they reach megabytes, and
// fresh ones cost a page fault every 4 KB besides thousands of small allocations, a large share of
// the planning time (docs/joint_planner.md, "Timings").
struct Scratch {
  std::vector<HeadModel> joint, evict;  // Quant-only plans with the joint models.
  std::vector<GridCache> grids;
  GridCache all_kept;  // Quant-only's one-point grid.
  Hulls hulls;
  std::vector<HullPoint> acc, merged;
  std::vector<int> idx;
  std::vector<double> ratios;
  std::vector<Segment> segs;
  std::vector<Move> heap, cheapest;
  std::vector<int> version;
};

// The head's moves with a positive gain, in the order the fill pushes them: its next hull
// segment, one token quantum more (when kept counts vary), its next width. Returns how many; 0
// when the head is at its best.
int NextMoves(const Context& ctx, const HeadModel& m, bool vary_kept, std::span<const Vertex> hull,
              const HeadState& s, int head, int version, Move out[3]) {
  int n = 0;
  auto add = [&](double cost, double gain, MoveKind kind) {
    if (gain > m.tol && cost > 0) out[n++] = {gain / cost, cost, head, version, kind};
  };
  if (s.vertex >= 0 && s.vertex + 1 < static_cast<int>(hull.size())) {
    const Vertex& v = hull[s.vertex + 1];
    add(v.bytes - s.bytes, s.D - v.D, MoveKind::kSegment);
  }
  if (vary_kept && s.k < m.T) {
    const int64_t k2 = std::min(m.T, s.k + ctx.quantum);
    add(m.Bytes(ctx, k2, s.c) - s.bytes, s.D - m.D(m.R(k2), s.c), MoveKind::kTokens);
  }
  if (s.c + 1 < static_cast<int>(m.widths.size())) {
    add(m.Bytes(ctx, s.k, s.c + 1) - s.bytes, s.D - m.D(s.Rk, s.c + 1), MoveKind::kWidth);
  }
  return n;
}

// Moves one head one step up: to its next hull vertex, one token quantum more, or its next width.
void Step(const Context& ctx, const HeadModel& m, std::span<const Vertex> hull, MoveKind kind,
          HeadState* s) {
  if (kind == MoveKind::kSegment) {
    ++s->vertex;
    s->k = hull[s->vertex].k;
    s->c = hull[s->vertex].c;
  } else {
    if (kind == MoveKind::kTokens) {
      s->k = std::min(m.T, s->k + ctx.quantum);
    } else {
      ++s->c;
    }
    const int next = s->vertex + 1;
    s->vertex = s->vertex >= 0 && next < static_cast<int>(hull.size()) && hull[next].k == s->k &&
                        hull[next].c == s->c
                    ? next
                    : -1;
  }
  s->bytes = m.Bytes(ctx, s->k, s->c);
  s->Rk = m.R(s->k);
  s->D = m.D(s->Rk, s->c);
}

// The fill: single steps up, best ratio first, while they fit. A move that does not fit now never
// will (the budget only shrinks). A max-heap on the ratio (std::push_heap / pop_heap, as
// std::priority_queue) on a reused array. Most moves in it never fit: a second heap, the cheapest
// move first (stale ones dropped lazily), ends the fill as soon as none of the current moves fits,
// where popping the rest would only have discarded them.
void Fill(const Context& ctx, const std::vector<HeadModel>& models, bool vary_kept,
          const Hulls& hulls, std::vector<HeadState>* state, double* left, Scratch* scratch) {
  const size_t H = state->size();
  std::vector<Move>&heap = scratch->heap, &cheapest = scratch->cheapest;
  std::vector<int>& version = scratch->version;
  heap.clear();
  cheapest.clear();
  version.assign(H, 0);
  auto costlier = [](const Move& a, const Move& b) { return a.cost > b.cost; };
  Move moves[3];
  auto push = [&](int head, bool cheapest_heap) {
    const int n = NextMoves(ctx, models[head], vary_kept, hulls[head], (*state)[head], head,
                            version[head], moves);
    for (int i = 0; i < n; ++i) {
      heap.push_back(moves[i]);
      std::push_heap(heap.begin(), heap.end());
      cheapest.push_back(moves[i]);
      if (cheapest_heap) std::push_heap(cheapest.begin(), cheapest.end(), costlier);
    }
  };
  // Only the cheapest move's cost is read, so that heap is built in one go.
  for (size_t h = 0; h < H; ++h) push(static_cast<int>(h), false);
  std::make_heap(cheapest.begin(), cheapest.end(), costlier);
  while (!heap.empty()) {
    while (!cheapest.empty() && cheapest.front().version != version[cheapest.front().head]) {
      std::pop_heap(cheapest.begin(), cheapest.end(), costlier);
      cheapest.pop_back();
    }
    if (cheapest.empty() || cheapest.front().cost > *left) break;
    std::pop_heap(heap.begin(), heap.end());
    const Move mv = heap.back();
    heap.pop_back();
    if (mv.version != version[mv.head] || mv.cost > *left) continue;
    HeadState& s = (*state)[mv.head];
    Step(ctx, models[mv.head], hulls[mv.head], mv.kind, &s);
    *left -= mv.cost;
    ++version[mv.head];
    push(mv.head, true);
  }
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

// `models`: MakeHead(ctx, h, mode) for every head (quant-only: the joint models, every token
// kept). `grids`: the kept grids of the modes that evict. Both outlive the result.
StatusOr<ModeResult> SolveMode(const Context& ctx, JointMode mode,
                               const std::vector<GridCache>& grids,
                               const std::vector<HeadModel>& models, Scratch* scratch) {
  const JointPlanInput& in = *ctx.in;
  const size_t H = in.heads.size();
  const bool vary_kept = mode != JointMode::kQuantOnly;
  ModeResult r;
  r.models = &models;
  Hulls& hulls = scratch->hulls;
  hulls.v.clear();
  hulls.start.assign(1, 0);
  std::vector<Segment>& segs = scratch->segs;
  segs.clear();
  GridCache& all_kept = scratch->all_kept;
  for (size_t h = 0; h < H; ++h) {
    const HeadModel& m = models[h];
    if (!vary_kept) {
      all_kept.k.assign(1, m.T);
      all_kept.R.assign(1, m.R(m.T));
    }
    BuildHull(ctx, m, vary_kept ? grids[h] : all_kept, &scratch->acc, &scratch->merged,
              &scratch->idx, &scratch->ratios, &hulls);
    const std::span<const Vertex> v = hulls[h];
    r.min_bytes += v.front().bytes;
    r.max_bytes += v.back().bytes;
    for (size_t i = 0; i + 1 < v.size(); ++i) {
      const double cost = v[i + 1].bytes - v[i].bytes, gain = v[i].D - v[i + 1].D;
      segs.push_back({gain / cost, cost, gain, static_cast<int>(h), static_cast<int>(i)});
    }
    // One allocation unit: a token quantum at the widest width, or the largest width step of all
    // the quantized tokens.
    if (vary_kept) {
      r.unit = std::max(r.unit, static_cast<double>(ctx.quantum) * ctx.pairs[m.widths.back()].bpt);
    }
    for (size_t c = 0; c + 1 < m.widths.size(); ++c) {
      r.unit = std::max(r.unit, static_cast<double>(m.T - m.F) *
                                    (ctx.pairs[m.widths[c + 1]].bpt - ctx.pairs[m.widths[c]].bpt));
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
  // The last `margin` bytes (the largest segment) are left to the fill's finer steps, so where
  // the whole segments stop moves smoothly with the budget (a segment taken whole would force its
  // tail, which the fill may not want).
  double margin = 0;
  for (const Segment& s : segs) margin = std::max(margin, s.cost);
  margin = std::min(margin, left);
  left -= margin;
  TakeBestSegments(&segs, &left, &D, &pos);
  left += margin;
  // The hull relaxation finishes with a fraction of the best segment left: a bound over the grid.
  double critical = 0;
  for (size_t h = 0; h < H; ++h) {
    const std::span<const Vertex> v = hulls[h];
    const size_t i = static_cast<size_t>(pos[h]);
    if (i + 1 < v.size()) {
      critical = std::max(critical, (v[i].D - v[i + 1].D) / (v[i + 1].bytes - v[i].bytes));
    }
  }
  r.lower_bound = D - left * critical;
  r.state.resize(H);
  for (size_t h = 0; h < H; ++h) {
    const Vertex& v = hulls[h][pos[h]];
    const double Rk = vary_kept ? grids[h].R[v.j] : models[h].R(v.k);  // R on the grid.
    r.state[h] = {v.k, v.c, v.bytes, v.D, Rk, pos[h]};
  }
  // Phase 2, the fill: what is left goes to whole segments, token quanta (partway along a
  // segment: at least the segment's ratio, D being convex in k) and width steps, best ratio first
  // among those that fit.
  Fill(ctx, models, vary_kept, hulls, &r.state, &left, scratch);
  r.saturated = true;
  Move moves[3];
  for (size_t h = 0; h < H && r.saturated; ++h) {
    if (NextMoves(ctx, models[h], vary_kept, hulls[h], r.state[h], 0, 0, moves) > 0) {
      r.saturated = false;
    }
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
  const Pair& pair = ctx.pairs[m.widths[s.c]];
  p.k_bits = pair.k_bits;
  p.v_bits = pair.v_bits;
  p.bytes = m.Bytes(ctx, s.k, s.c);
  p.retained_mass = s.Rk;
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
    JointHeadPlan p = Describe(ctx, (*r.models)[h], r.state[h]);
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

StatusOr<JointPlan> PlanJoint(const JointPlanInput& input, JointMode mode) {
  KVCTL_ASSIGN_OR_RETURN(const Context ctx, MakeContext(input));
  const size_t H = input.heads.size();
  thread_local Scratch scratch;
  // Models are built once: quant-only plans with the joint ones (every token kept) and evict-only's
  // are the joint ones at the fixed pair.
  std::vector<HeadModel>&joint_models = scratch.joint, &evict = scratch.evict;
  joint_models.resize(mode != JointMode::kEvictOnly ? H : 0);
  evict.resize(mode != JointMode::kQuantOnly ? H : 0);
  for (size_t h = 0; h < joint_models.size(); ++h) {
    MakeHead(ctx, h, JointMode::kJoint, &joint_models[h]);
  }
  for (size_t h = 0; h < evict.size(); ++h) {
    if (joint_models.empty()) {
      MakeHead(ctx, h, JointMode::kEvictOnly, &evict[h]);
    } else {
      evict[h] = joint_models[h];
      SetEvictOnly(ctx, &evict[h]);
    }
  }
  // The kept grid and R on it: the same for joint and evict-only, and most of the exp() calls. A
  // head with the same parametric curve, tokens and floor as the one before it (the heads of a
  // layer, from a profile) has the same grid.
  std::vector<GridCache>& grids = scratch.grids;
  grids.resize(evict.size());
  for (size_t h = 0; h < grids.size(); ++h) {
    const HeadModel& m = evict[h];
    if (h > 0 && m.in->eviction.table.retained.empty()) {
      const HeadModel& p = evict[h - 1];
      if (p.in->eviction.table.retained.empty() && p.T == m.T && p.kmin == m.kmin && p.s == m.s &&
          p.norm == m.norm) {
        grids[h].k.assign(grids[h - 1].k.begin(), grids[h - 1].k.end());
        grids[h].R.assign(grids[h - 1].R.begin(), grids[h - 1].R.end());
        continue;
      }
    }
    KeptGrid(m, ctx.quantum, input.kept_levels, &grids[h].k);
    grids[h].R.resize(grids[h].k.size());
    for (size_t j = 0; j < grids[h].k.size(); ++j) grids[h].R[j] = m.R(grids[h].k[j]);
  }
  if (mode != JointMode::kJoint) {
    KVCTL_ASSIGN_OR_RETURN(
        const ModeResult r,
        SolveMode(ctx, mode, grids, mode == JointMode::kQuantOnly ? joint_models : evict,
                  &scratch));
    return Assemble(ctx, mode, mode, r);
  }
  StatusOr<ModeResult> alt[2] = {
      SolveMode(ctx, JointMode::kQuantOnly, grids, joint_models, &scratch),
      SolveMode(ctx, JointMode::kEvictOnly, grids, evict, &scratch)};
  KVCTL_ASSIGN_OR_RETURN(const ModeResult joint,
                         SolveMode(ctx, JointMode::kJoint, grids, joint_models, &scratch));
  // The greedy is optimal only up to its last segment; the single levers search subsets of the
  // joint options, so their plans are candidates too and the joint plan is never worse.
  const ModeResult* best = &joint;
  JointMode solved = JointMode::kJoint;
  double unit = joint.unit;
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
  return Describe(ctx, m, {kept, 0, 0, 0, m.R(kept)});
}

}  // namespace kvctl
