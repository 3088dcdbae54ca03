// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// RateQuant allocation: cost tables from the registry, the two solvers and the plan.
//
// How the pieces fit (the header carries the provenance of each idea):
//
// Cost. A unit's cost at width b is BitsPerElement(spec with k_bits = v_bits = b).k (or .v): code
// bits, the (scale, zero) metadata, record padding and, for OScaR, the per-token norm side record
// spread over the layer's heads. Every unit holds the same number of elements (tokens x head_dim),
// so "average bits per element <= budget" is "sum of unit costs <= N * budget". UnitCostTable
// checks the two assumptions the solvers make about the registry: K's cost does not depend on V's
// width and vice versa, and the metadata part (cost - b) does not depend on b.
//
// Integer solver. Each unit's (cost, distortion) points are reduced to their lower convex hull;
// a max-heap of hull steps keyed by distortion drop per bit of cost is drained while steps fit.
// The first step that does not fit fixes the critical multiplier lambda*; the greedy keeps draining
// steps that still fit (a fill pass), giving value U. Weak duality gives the bound
// L(lambda) = sum_i min_l (d_il + lambda c_il) - lambda B <= OPT for any lambda >= 0. For a
// feasible y, sum_i d_i(y_i) = L + sum_i r_i(y_i) + lambda (B - c(y)) with reduced costs r >= 0, so
// y beats U only if every r_i(y_i) < U - L: levels whose reduced cost reaches the gap are dropped.
// Units left with one level are fixed; the rest go through a DP whose state is the budget spent in
// quanta (the gcd of their level cost differences; the registry's costs are dyadic, so the gcd is
// exact in doubles). [ours] All of this is textbook multiple-choice knapsack technique, not from
// the paper.
//
// Continuous solver. See SolveWaterFilling: units with scale 0 sit at min_bits; the others follow
// b_i(x) = clamp((ln(s_i ln beta_i) - x) / ln beta_i, min, max), whose sum falls monotonically in
// x = ln(lambda). 200 bisection steps (or a bracket narrower than 1e-14) settle x; we report the
// upper end of the bracket so the cost never exceeds the budget.
#include "policies/ratequant.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <queue>

namespace kvctl {
namespace {

using internal::StrCat;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Largest DP the exact solver runs (cells = free units x budget quanta); beyond it the greedy
// answer comes back with exact = false. At most tens of ms and 16 MiB of choices.
constexpr int64_t kMaxDpCells = int64_t{1} << 24;

double BudgetTolerance(double budget) { return 1e-9 * std::max(1.0, std::fabs(budget)); }

// Greatest common divisor of two positive doubles, to `tol`.
double DoubleGcd(double a, double b, double tol) {
  if (a < b) std::swap(a, b);
  while (b > tol) {
    double r = std::fmod(a, b);
    if (r > b - tol) r = 0;
    a = b;
    b = r;
  }
  return a;
}

Status ValidateProblem(const AllocationProblem& p) {
  if (p.units < 1) return InvalidArgument("units: got ", p.units, ", expected >= 1");
  if (p.levels < 1 || p.levels > 64) {
    return InvalidArgument("levels: got ", p.levels, ", expected 1..64");
  }
  const size_t cells = static_cast<size_t>(p.units) * p.levels;
  if (p.cost.size() != cells || p.distortion.size() != cells) {
    return InvalidArgument("cost/distortion: got ", p.cost.size(), "/", p.distortion.size(),
                           " entries, expected units * levels = ", cells);
  }
  if (!std::isfinite(p.budget))
    return InvalidArgument("budget: got ", p.budget, ", expected finite");
  for (int i = 0; i < p.units; ++i) {
    for (int l = 0; l < p.levels; ++l) {
      const size_t at = static_cast<size_t>(i) * p.levels + l;
      if (!std::isfinite(p.cost[at]) || !std::isfinite(p.distortion[at])) {
        return InvalidArgument("unit ", i, " level ", l, ": cost ", p.cost[at], ", distortion ",
                               p.distortion[at], ", expected finite values");
      }
      if (l > 0 && !(p.cost[at] > p.cost[at - 1])) {
        return InvalidArgument("unit ", i, " level ", l, ": cost ", p.cost[at],
                               ", expected > level ", l - 1, "'s ", p.cost[at - 1]);
      }
    }
  }
  return OkStatus();
}

// hull[off[i] .. off[i+1]) lists unit i's lower-convex-hull levels after level 0, in order.
void BuildHulls(const AllocationProblem& p, std::vector<int>& hull, std::vector<int>& off) {
  off.assign(static_cast<size_t>(p.units) + 1, 0);
  hull.clear();
  for (int i = 0; i < p.units; ++i) {
    const double* c = &p.cost[static_cast<size_t>(i) * p.levels];
    const double* d = &p.distortion[static_cast<size_t>(i) * p.levels];
    int cur = 0;
    while (true) {
      int best = -1;
      double best_ratio = 0;
      for (int l = cur + 1; l < p.levels; ++l) {
        const double ratio = (d[cur] - d[l]) / (c[l] - c[cur]);
        if (ratio > best_ratio) best_ratio = ratio, best = l;  // Ties keep the nearer level.
      }
      if (best < 0) break;
      hull.push_back(best);
      cur = best;
    }
    off[static_cast<size_t>(i) + 1] = static_cast<int>(hull.size());
  }
}

// L(lambda) = sum_i min_l (d_il + lambda c_il) - lambda B.
double LagrangianBound(const AllocationProblem& p, double lambda) {
  double sum = 0;
  for (int i = 0; i < p.units; ++i) {
    double best = kInf;
    for (int l = 0; l < p.levels; ++l) {
      const size_t at = static_cast<size_t>(i) * p.levels + l;
      best = std::min(best, p.distortion[at] + lambda * p.cost[at]);
    }
    sum += best;
  }
  return sum - lambda * p.budget;
}

// Gaps below this are rounding, not suboptimality.
double GapTolerance(const IntegerAllocation& a) {
  return 1e-9 * (std::fabs(a.distortion) + std::fabs(a.lower_bound)) + 1e-300;
}

struct Candidate {
  int level;
  int64_t quanta;
};

// Reduced-cost fixing and a DP over the units it leaves free. Replaces `a` when it proves a
// better (or equal) allocation; sets a.exact when the result is proven optimal.
void RefineExact(const AllocationProblem& p, double lambda, IntegerAllocation& a) {
  const double gap = a.distortion - a.lower_bound;
  const double eps = GapTolerance(a);
  if (gap <= eps) {
    a.exact = true;
    a.lower_bound = std::min(a.lower_bound, a.distortion);
    return;
  }
  std::vector<int> free_units;
  std::vector<std::vector<int>> cand_levels;
  double fixed_cost = 0, free_min_cost = 0;
  for (int i = 0; i < p.units; ++i) {
    const size_t row = static_cast<size_t>(i) * p.levels;
    double m = kInf;
    for (int l = 0; l < p.levels; ++l) {
      m = std::min(m, p.distortion[row + l] + lambda * p.cost[row + l]);
    }
    std::vector<int> levels;
    for (int l = 0; l < p.levels; ++l) {
      const double r = p.distortion[row + l] + lambda * p.cost[row + l] - m;
      if (r <= gap + eps || l == a.level[static_cast<size_t>(i)]) levels.push_back(l);
    }
    if (levels.size() == 1) {
      fixed_cost += p.cost[row + levels[0]];
    } else {
      free_units.push_back(i);
      free_min_cost += p.cost[row + levels[0]];
      cand_levels.push_back(std::move(levels));
    }
  }
  a.free_units = static_cast<int>(free_units.size());
  if (free_units.empty()) {  // Only the greedy's levels survived: it is optimal.
    a.exact = true;
    a.lower_bound = a.distortion;
    return;
  }
  // Cost quantum: gcd of every candidate's cost above its unit's cheapest candidate.
  double max_diff = 0;
  for (size_t f = 0; f < free_units.size(); ++f) {
    const size_t row = static_cast<size_t>(free_units[f]) * p.levels;
    max_diff =
        std::max(max_diff, p.cost[row + cand_levels[f].back()] - p.cost[row + cand_levels[f][0]]);
  }
  const double tol = 1e-9 * std::max(1.0, max_diff);
  double q = 0;
  for (size_t f = 0; f < free_units.size(); ++f) {
    const size_t row = static_cast<size_t>(free_units[f]) * p.levels;
    for (size_t c = 1; c < cand_levels[f].size(); ++c) {
      const double diff = p.cost[row + cand_levels[f][c]] - p.cost[row + cand_levels[f][0]];
      q = q == 0 ? diff : DoubleGcd(q, diff, tol);
    }
  }
  if (!(q > tol)) return;
  std::vector<std::vector<Candidate>> cands(free_units.size());
  int64_t total_quanta = 0;
  for (size_t f = 0; f < free_units.size(); ++f) {
    const size_t row = static_cast<size_t>(free_units[f]) * p.levels;
    for (int l : cand_levels[f]) {
      const double diff = (p.cost[row + l] - p.cost[row + cand_levels[f][0]]) / q;
      const double rounded = std::round(diff);
      if (std::fabs(diff - rounded) > 1e-6) return;  // Costs without a common quantum.
      cands[f].push_back({l, static_cast<int64_t>(rounded)});
    }
    total_quanta += cands[f].back().quanta;
  }
  const double room = (p.budget - fixed_cost - free_min_cost) / q;
  if (room < -1e-6) return;  // Cannot happen for a feasible greedy; keep it if it does.
  const int64_t range =
      std::min<int64_t>(total_quanta, static_cast<int64_t>(std::floor(room + 1e-6)));
  if (static_cast<int64_t>(free_units.size()) * (range + 1) > kMaxDpCells) return;

  const size_t width = static_cast<size_t>(range) + 1;
  std::vector<double> dp(width, kInf), next(width);
  std::vector<uint8_t> choice(free_units.size() * width, 0);
  dp[0] = 0;
  for (size_t f = 0; f < free_units.size(); ++f) {
    std::fill(next.begin(), next.end(), kInf);
    const size_t row = static_cast<size_t>(free_units[f]) * p.levels;
    uint8_t* ch = &choice[f * width];
    for (size_t k = 0; k < width; ++k) {
      if (dp[k] == kInf) continue;
      for (size_t c = 0; c < cands[f].size(); ++c) {
        const size_t k2 = k + static_cast<size_t>(cands[f][c].quanta);
        if (k2 >= width) break;
        const double v = dp[k] + p.distortion[row + cands[f][c].level];
        if (v < next[k2]) next[k2] = v, ch[k2] = static_cast<uint8_t>(c);
      }
    }
    dp.swap(next);
  }
  size_t best_k = 0;
  for (size_t k = 1; k < width; ++k) {
    if (dp[k] < dp[best_k]) best_k = k;
  }
  std::vector<int> level = a.level;
  for (size_t f = free_units.size(); f-- > 0;) {
    const Candidate& c = cands[f][choice[f * width + best_k]];
    level[static_cast<size_t>(free_units[f])] = c.level;
    best_k -= static_cast<size_t>(c.quanta);
  }
  double cost = 0, distortion = 0;
  for (int i = 0; i < p.units; ++i) {
    const size_t at = static_cast<size_t>(i) * p.levels + level[static_cast<size_t>(i)];
    cost += p.cost[at];
    distortion += p.distortion[at];
  }
  if (distortion <= a.distortion) {
    a.level = std::move(level);
    a.cost = cost;
    a.distortion = distortion;
  }
  a.exact = true;
  a.lower_bound = a.distortion;
}

}  // namespace

std::string_view UnitKindName(UnitKind kind) { return kind == UnitKind::kKey ? "k" : "v"; }

std::string_view DistortionTargetName(DistortionTarget target) {
  return target == DistortionTarget::kMse ? "mse" : "attention";
}

std::string_view ImportanceModeName(ImportanceMode mode) {
  return mode == ImportanceMode::kUniform ? "uniform" : "attention";
}

StatusOr<UnitCosts> UnitCostTable(const QuantSpec& spec, int kv_heads,
                                  const std::vector<int>& bits) {
  if (kv_heads < 1) return InvalidArgument("kv_heads: got ", kv_heads, ", expected >= 1");
  if (bits.empty()) return InvalidArgument("bits: got an empty list, expected >= 1 width");
  UnitCosts costs;
  QuantSpec s = spec;
  for (size_t j = 0; j < bits.size(); ++j) {
    s.k_bits = s.v_bits = bits[j];
    Status st = ValidateQuantSpec(s);
    if (!st.ok()) return Status(st.code(), StrCat("bits[", j, "]: ", st.message()));
    const BitsPerElementBreakdown b = BitsPerElement(s, kv_heads);
    costs.k.push_back(b.k);
    costs.v.push_back(b.v);
  }
  for (size_t i = 0; i < bits.size(); ++i) {
    if (std::fabs((costs.k[i] - bits[i]) - (costs.k[0] - bits[0])) > 1e-12 ||
        std::fabs((costs.v[i] - bits[i]) - (costs.v[0] - bits[0])) > 1e-12) {
      return Unimplemented("bits[", i, "]: ", QuantMethodName(spec.method),
                           " metadata depends on the width; the allocator assumes it does not");
    }
    for (size_t j = 0; j < bits.size(); ++j) {
      s.k_bits = bits[i];
      s.v_bits = bits[j];
      const BitsPerElementBreakdown b = BitsPerElement(s, kv_heads);
      if (std::fabs(b.k - costs.k[i]) > 1e-12 || std::fabs(b.v - costs.v[j]) > 1e-12) {
        return Unimplemented("k_bits ", bits[i], " / v_bits ", bits[j], ": ",
                             QuantMethodName(spec.method),
                             " record padding couples K and V costs; the allocator needs them "
                             "separable");
      }
    }
  }
  return costs;
}

StatusOr<IntegerAllocation> SolveIntegerAllocation(const AllocationProblem& p,
                                                   IntegerSolver solver) {
  KVCTL_RETURN_IF_ERROR(ValidateProblem(p));
  const double tol = BudgetTolerance(p.budget);
  IntegerAllocation a;
  a.level.assign(static_cast<size_t>(p.units), 0);
  for (int i = 0; i < p.units; ++i) {
    a.cost += p.cost[static_cast<size_t>(i) * p.levels];
    a.distortion += p.distortion[static_cast<size_t>(i) * p.levels];
  }
  if (p.budget < a.cost - tol) {
    return InvalidArgument("budget: got ", p.budget, ", expected >= ", a.cost,
                           " (every unit at its lowest level)");
  }
  std::vector<int> hull, off;
  BuildHulls(p, hull, off);
  std::vector<int> pos(off.begin(), off.end() - 1);  // Next hull entry per unit.
  struct Step {
    double ratio;
    int unit;
    bool operator<(const Step& o) const { return ratio < o.ratio; }
  };
  auto step_of = [&](int i) {
    const size_t row = static_cast<size_t>(i) * p.levels;
    const int cur = a.level[static_cast<size_t>(i)], nxt = hull[static_cast<size_t>(pos[i])];
    return Step{(p.distortion[row + cur] - p.distortion[row + nxt]) /
                    (p.cost[row + nxt] - p.cost[row + cur]),
                i};
  };
  std::vector<Step> initial;
  for (int i = 0; i < p.units; ++i) {
    if (pos[i] < off[static_cast<size_t>(i) + 1]) initial.push_back(step_of(i));
  }
  std::priority_queue<Step> heap(std::less<Step>(), std::move(initial));
  double lambda = -1;  // Ratio of the first step that did not fit.
  while (!heap.empty()) {
    const Step s = heap.top();
    heap.pop();
    const size_t row = static_cast<size_t>(s.unit) * p.levels;
    const int cur = a.level[static_cast<size_t>(s.unit)];
    const int nxt = hull[static_cast<size_t>(pos[s.unit])];
    const double step_cost = p.cost[row + nxt] - p.cost[row + cur];
    if (a.cost + step_cost > p.budget + tol) {
      if (lambda < 0) lambda = s.ratio;
      continue;  // This unit stays; others may still fit (fill pass).
    }
    a.cost += step_cost;
    a.distortion += p.distortion[row + nxt] - p.distortion[row + cur];
    a.level[static_cast<size_t>(s.unit)] = nxt;
    if (++pos[s.unit] < off[static_cast<size_t>(s.unit) + 1]) heap.push(step_of(s.unit));
  }
  // Re-sum to shed the drift of incremental updates.
  a.cost = a.distortion = 0;
  for (int i = 0; i < p.units; ++i) {
    const size_t at = static_cast<size_t>(i) * p.levels + a.level[static_cast<size_t>(i)];
    a.cost += p.cost[at];
    a.distortion += p.distortion[at];
  }
  if (lambda < 0) {  // Every unit reached the end of its hull: its least distortion.
    a.exact = true;
    a.lower_bound = a.distortion;
    return a;
  }
  a.lower_bound = std::min(LagrangianBound(p, lambda), a.distortion);
  if (solver == IntegerSolver::kExact) {
    RefineExact(p, lambda, a);
  } else {
    a.exact = a.distortion - a.lower_bound <= GapTolerance(a);  // The bound proves it.
  }
  return a;
}

StatusOr<ContinuousAllocation> SolveWaterFilling(const std::vector<ContinuousUnit>& units,
                                                 double budget, double min_bits, double max_bits) {
  if (units.empty()) return InvalidArgument("units: got none, expected >= 1");
  if (!std::isfinite(min_bits) || !std::isfinite(max_bits) || min_bits > max_bits) {
    return InvalidArgument("min_bits/max_bits: got ", min_bits, "/", max_bits,
                           ", expected finite with min_bits <= max_bits");
  }
  double overhead = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const ContinuousUnit& u = units[i];
    if (!std::isfinite(u.scale) || u.scale < 0 || !std::isfinite(u.beta) || u.beta <= 1 ||
        !std::isfinite(u.overhead)) {
      return InvalidArgument("units[", i, "]: scale ", u.scale, ", beta ", u.beta, ", overhead ",
                             u.overhead, ", expected scale >= 0, beta > 1, finite overhead");
    }
    overhead += u.overhead;
  }
  const double n = static_cast<double>(units.size());
  const double tol = BudgetTolerance(budget);
  if (!std::isfinite(budget) || budget < n * min_bits + overhead - tol) {
    return InvalidArgument("budget: got ", budget, ", expected >= ", n * min_bits + overhead,
                           " (every unit at min_bits)");
  }
  const double bits_budget = budget - overhead;
  std::vector<double> a(units.size()), ln_beta(units.size());
  double x_lo = kInf, x_hi = -kInf;
  for (size_t i = 0; i < units.size(); ++i) {
    ln_beta[i] = std::log(units[i].beta);
    if (units[i].scale == 0) continue;
    a[i] = std::log(units[i].scale * ln_beta[i]);
    x_lo = std::min(x_lo, a[i] - max_bits * ln_beta[i]);
    x_hi = std::max(x_hi, a[i] - min_bits * ln_beta[i]);
  }
  auto bits_at = [&](double x, std::vector<double>* out) {
    double sum = 0;
    for (size_t i = 0; i < units.size(); ++i) {
      const double b =
          units[i].scale == 0 ? min_bits : std::clamp((a[i] - x) / ln_beta[i], min_bits, max_bits);
      if (out) (*out)[i] = b;
      sum += b;
    }
    return sum;
  };
  ContinuousAllocation r;
  r.bits.resize(units.size());
  if (x_lo == kInf) {  // Every unit has scale 0: nothing to gain from bits.
    x_hi = x_lo = 0;
  } else if (bits_at(x_lo, nullptr) <= bits_budget) {
    x_hi = x_lo;  // Even every unit at max_bits fits.
  } else {
    for (int it = 0; it < 200 && x_hi - x_lo > 1e-14 * (1 + std::fabs(x_hi)); ++it) {
      const double mid = 0.5 * (x_lo + x_hi);
      if (bits_at(mid, nullptr) > bits_budget) {
        x_lo = mid;
      } else {
        x_hi = mid;
      }
    }
  }
  const double sum_bits = bits_at(x_hi, &r.bits);
  r.cost = sum_bits + overhead;
  r.log_lambda = x_hi;
  for (size_t i = 0; i < units.size(); ++i) {
    r.distortion += units[i].scale * std::pow(units[i].beta, -r.bits[i]);
  }
  return r;
}

Status ValidateRateQuantFit(const RateQuantFit& fit) {
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(fit.spec));
  if (fit.spec.method == QuantMethod::kFp16) {
    return InvalidArgument("method: got fp16, expected a quantizing method");
  }
  if (fit.layers < 1 || fit.layers > 4096) {
    return InvalidArgument("layers: got ", fit.layers, ", expected 1..4096");
  }
  if (fit.kv_heads < 1 || fit.kv_heads > 1024) {
    return InvalidArgument("kv_heads: got ", fit.kv_heads, ", expected 1..1024");
  }
  if (fit.bits.empty()) return InvalidArgument("bits: got an empty list, expected >= 1 width");
  QuantSpec s = fit.spec;
  for (size_t j = 0; j < fit.bits.size(); ++j) {
    if (j > 0 && fit.bits[j] <= fit.bits[j - 1]) {
      return InvalidArgument("bits[", j, "]: got ", fit.bits[j], ", expected > ", fit.bits[j - 1],
                             " (ascending, no repeats)");
    }
    s.k_bits = s.v_bits = fit.bits[j];
    Status st = ValidateQuantSpec(s);
    if (!st.ok()) return Status(st.code(), StrCat("bits[", j, "]: ", st.message()));
  }
  for (const auto& [name, beta] : {std::pair{"beta_k", fit.beta_k}, {"beta_v", fit.beta_v}}) {
    if (!std::isfinite(beta) || beta <= 1) {
      return InvalidArgument(name, ": got ", beta, ", expected a finite slope > 1 per bit");
    }
  }
  const size_t n = static_cast<size_t>(fit.layers) * fit.kv_heads * 2;
  if (fit.units.size() != n) {
    return InvalidArgument("units: got ", fit.units.size(),
                           ", expected 2 * layers * kv_heads = ", n);
  }
  for (size_t i = 0; i < n; ++i) {
    const RateQuantUnit& u = fit.units[i];
    const int layer = static_cast<int>(i / 2 / fit.kv_heads);
    const int head = static_cast<int>(i / 2 % fit.kv_heads);
    const UnitKind kind = i % 2 == 0 ? UnitKind::kKey : UnitKind::kValue;
    if (u.layer != layer || u.head != head || u.kind != kind) {
      return InvalidArgument("units[", i, "]: got (layer ", u.layer, ", head ", u.head, ", ",
                             UnitKindName(u.kind), "), expected (layer ", layer, ", head ", head,
                             ", ", UnitKindName(kind), ")");
    }
    if (!std::isfinite(u.alpha) || u.alpha < 0) {
      return InvalidArgument("units[", i, "].alpha: got ", u.alpha, ", expected finite >= 0");
    }
    if (!std::isfinite(u.importance) || u.importance < 0) {
      return InvalidArgument("units[", i, "].importance: got ", u.importance,
                             ", expected finite >= 0");
    }
    for (const auto& [name, values] :
         {std::pair{"mse", &u.mse}, std::pair{"attention", &u.attention}}) {
      if (!values->empty() && values->size() != fit.bits.size()) {
        return InvalidArgument("units[", i, "].", name, ": got ", values->size(),
                               " values, expected one per width (", fit.bits.size(), ") or none");
      }
      for (double v : *values) {
        if (!std::isfinite(v) || v < 0) {
          return InvalidArgument("units[", i, "].", name, ": got ", v, ", expected finite >= 0");
        }
      }
    }
  }
  return OkStatus();
}

StatusOr<RateQuantPlan> PlanRateQuant(const RateQuantFit& fit, const RateQuantPlanOptions& o) {
  KVCTL_RETURN_IF_ERROR(ValidateRateQuantFit(fit));
  if (!std::isfinite(o.budget_bpe) || o.budget_bpe <= 0) {
    return InvalidArgument("budget_bpe: got ", o.budget_bpe, ", expected > 0 bits per element");
  }
  if (o.min_bits < 0 || o.max_bits < 0 || (o.max_bits > 0 && o.max_bits < o.min_bits)) {
    return InvalidArgument("min_bits/max_bits: got ", o.min_bits, "/", o.max_bits,
                           ", expected 0 (no bound) or min_bits <= max_bits");
  }
  if (o.beta_override != 0 && !(std::isfinite(o.beta_override) && o.beta_override > 1)) {
    return InvalidArgument("beta_override: got ", o.beta_override,
                           ", expected 0 (the fit's slopes) or a finite slope > 1");
  }
  std::vector<int> bits;
  std::vector<size_t> fit_index;  // bits[l] == fit.bits[fit_index[l]].
  for (size_t j = 0; j < fit.bits.size(); ++j) {
    if (fit.bits[j] >= o.min_bits && (o.max_bits == 0 || fit.bits[j] <= o.max_bits)) {
      bits.push_back(fit.bits[j]);
      fit_index.push_back(j);
    }
  }
  if (bits.empty()) {
    return InvalidArgument("min_bits/max_bits: got ", o.min_bits, "/", o.max_bits,
                           ", which leave none of the fitted widths");
  }
  KVCTL_ASSIGN_OR_RETURN(UnitCosts costs, UnitCostTable(fit.spec, fit.kv_heads, bits));
  RateQuantPlan plan;
  plan.spec = fit.spec;
  plan.layers = fit.layers;
  plan.kv_heads = fit.kv_heads;
  plan.budget_bpe = o.budget_bpe;
  plan.beta_k = o.beta_override > 0 ? o.beta_override : fit.beta_k;
  plan.beta_v = o.beta_override > 0 ? o.beta_override : fit.beta_v;

  const int n = static_cast<int>(fit.units.size());
  const int m = static_cast<int>(bits.size());
  AllocationProblem p;
  p.units = n;
  p.levels = m;
  p.cost.resize(static_cast<size_t>(n) * m);
  p.distortion.resize(p.cost.size());
  p.budget = o.budget_bpe * n;
  std::vector<ContinuousUnit> cont(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const RateQuantUnit& u = fit.units[static_cast<size_t>(i)];
    const bool key = u.kind == UnitKind::kKey;
    const double beta = key ? plan.beta_k : plan.beta_v;
    const double scale = (o.uniform_importance ? 1.0 : u.importance) * u.alpha;
    const std::vector<double>& c = key ? costs.k : costs.v;
    for (int l = 0; l < m; ++l) {
      p.cost[static_cast<size_t>(i) * m + l] = c[static_cast<size_t>(l)];
      p.distortion[static_cast<size_t>(i) * m + l] =
          scale * std::pow(beta, -bits[static_cast<size_t>(l)]);
    }
    cont[static_cast<size_t>(i)] = {scale, beta, c[0] - bits[0]};
  }
  const double floor_bpe = (costs.k[0] + costs.v[0]) / 2;
  if (o.budget_bpe < floor_bpe - BudgetTolerance(floor_bpe)) {
    return InvalidArgument("budget_bpe: got ", o.budget_bpe, ", expected >= ", floor_bpe,
                           " (K and V at ", bits[0], " bits cost that with ",
                           QuantMethodName(fit.spec.method), "'s metadata)");
  }
  KVCTL_ASSIGN_OR_RETURN(IntegerAllocation a, SolveIntegerAllocation(p, o.solver));
  KVCTL_ASSIGN_OR_RETURN(ContinuousAllocation c,
                         SolveWaterFilling(cont, p.budget, bits.front(), bits.back()));
  plan.predicted_distortion = a.distortion;
  plan.lower_bound = a.lower_bound;
  plan.exact = a.exact;
  plan.continuous_cost_bpe = c.cost / n;
  plan.continuous_distortion = c.distortion;
  plan.heads.resize(static_cast<size_t>(fit.layers) * fit.kv_heads);
  double cost = 0;
  QuantSpec s = fit.spec;
  for (size_t h = 0; h < plan.heads.size(); ++h) {
    HeadPlan& hp = plan.heads[h];
    hp.layer = static_cast<int>(h / static_cast<size_t>(fit.kv_heads));
    hp.head = static_cast<int>(h % static_cast<size_t>(fit.kv_heads));
    const int lk = a.level[2 * h], lv = a.level[2 * h + 1];
    hp.k_bits = bits[static_cast<size_t>(lk)];
    hp.v_bits = bits[static_cast<size_t>(lv)];
    hp.k_distortion = p.distortion[2 * h * m + lk];
    hp.v_distortion = p.distortion[(2 * h + 1) * m + lv];
    hp.k_bits_continuous = c.bits[2 * h];
    hp.v_bits_continuous = c.bits[2 * h + 1];
    s.k_bits = hp.k_bits;
    s.v_bits = hp.v_bits;
    cost += BitsPerElement(s, fit.kv_heads).average;
  }
  plan.cost_bpe = cost / static_cast<double>(plan.heads.size());
  return plan;
}

StatusOr<RateQuantPlan> UniformPlan(const RateQuantFit& fit, int k_bits, int v_bits) {
  KVCTL_RETURN_IF_ERROR(ValidateRateQuantFit(fit));
  for (const auto& [name, b] : {std::pair{"k_bits", k_bits}, std::pair{"v_bits", v_bits}}) {
    if (std::find(fit.bits.begin(), fit.bits.end(), b) == fit.bits.end()) {
      return InvalidArgument(name, ": got ", b, ", expected one of the fitted widths");
    }
  }
  RateQuantPlan plan;
  plan.spec = fit.spec;
  plan.layers = fit.layers;
  plan.kv_heads = fit.kv_heads;
  plan.beta_k = fit.beta_k;
  plan.beta_v = fit.beta_v;
  QuantSpec s = fit.spec;
  s.k_bits = k_bits;
  s.v_bits = v_bits;
  plan.cost_bpe = plan.budget_bpe = BitsPerElement(s, fit.kv_heads).average;
  plan.heads.resize(static_cast<size_t>(fit.layers) * fit.kv_heads);
  for (size_t h = 0; h < plan.heads.size(); ++h) {
    HeadPlan& hp = plan.heads[h];
    hp.layer = static_cast<int>(h / static_cast<size_t>(fit.kv_heads));
    hp.head = static_cast<int>(h % static_cast<size_t>(fit.kv_heads));
    hp.k_bits = k_bits;
    hp.v_bits = v_bits;
    hp.k_bits_continuous = k_bits;
    hp.v_bits_continuous = v_bits;
    const RateQuantUnit& uk = fit.units[2 * h];
    const RateQuantUnit& uv = fit.units[2 * h + 1];
    hp.k_distortion = uk.importance * uk.alpha * std::pow(fit.beta_k, -k_bits);
    hp.v_distortion = uv.importance * uv.alpha * std::pow(fit.beta_v, -v_bits);
    plan.predicted_distortion += hp.k_distortion + hp.v_distortion;
  }
  return plan;
}

StatusOr<PlanScore> ScorePlan(const RateQuantFit& fit, const RateQuantPlan& plan) {
  KVCTL_RETURN_IF_ERROR(ValidateRateQuantFit(fit));
  QuantSpec a = fit.spec, b = plan.spec;
  a.k_bits = a.v_bits = b.k_bits = b.v_bits = 0;
  if (!(a == b) || plan.layers != fit.layers || plan.kv_heads != fit.kv_heads ||
      plan.heads.size() != fit.units.size() / 2) {
    return InvalidArgument("plan: ", QuantMethodName(plan.spec.method), " ", plan.layers, "x",
                           plan.kv_heads, " does not match the fit's ",
                           QuantMethodName(fit.spec.method), " ", fit.layers, "x", fit.kv_heads);
  }
  PlanScore score;
  score.has_measurements = true;
  score.has_attention = true;
  for (size_t i = 0; i < fit.units.size(); ++i) {
    const RateQuantUnit& u = fit.units[i];
    const HeadPlan& hp = plan.heads[i / 2];
    const int bits = u.kind == UnitKind::kKey ? hp.k_bits : hp.v_bits;
    const auto it = std::find(fit.bits.begin(), fit.bits.end(), bits);
    if (it == fit.bits.end()) {
      return InvalidArgument("plan.heads[", i / 2, "].", UnitKindName(u.kind), "_bits: got ", bits,
                             ", expected one of the fitted widths");
    }
    const size_t j = static_cast<size_t>(it - fit.bits.begin());
    score.model += u.importance * u.alpha * std::pow(fit.Beta(u.kind), -bits);
    const std::vector<double>& target = fit.target == DistortionTarget::kMse ? u.mse : u.attention;
    if (target.empty()) {
      score.has_measurements = false;
    } else {
      score.measured += u.importance * target[j];
    }
    if (u.attention.empty()) {
      score.has_attention = false;
    } else {
      score.attention += u.attention[j];
    }
  }
  if (!score.has_measurements) score.measured = 0;
  if (!score.has_attention) score.attention = 0;
  return score;
}

std::string FormatOverridesToml(const RateQuantPlan& plan, std::string_view table) {
  char line[512];
  std::string out;
  const QuantSpec& s = plan.spec;
  const std::string method(QuantMethodName(s.method));
  std::snprintf(line, sizeof line,
                "# RateQuant plan (kvctl policies/ratequant): %s, head_dim %d, %d layers x %d KV "
                "heads.\n# Budget %.6g b/e with metadata, achieved %.6g b/e.\n# Predicted "
                "distortion %.6g (%s; beta_k %.4g, beta_v %.4g).\n",
                method.c_str(), s.head_dim, plan.layers, plan.kv_heads, plan.budget_bpe,
                plan.cost_bpe, plan.predicted_distortion,
                plan.exact ? "proven optimal" : "greedy, not proven optimal", plan.beta_k,
                plan.beta_v);
  out += line;
  std::snprintf(line, sizeof line,
                "# Valid only with method = \"%s\", block_tokens = %d, k_group_tokens = %d,\n# "
                "v_group_channels = %d in [quant] (or the [[model]] table these belong to).\n",
                method.c_str(), s.block_tokens, s.k_group_tokens, s.v_group_channels);
  out += line;
  for (const HeadPlan& h : plan.heads) {
    std::snprintf(
        line, sizeof line, "\n[[%.*s]]\nlayer = %d\nhead = %d\nk_bits = %d\nv_bits = %d\n",
        static_cast<int>(table.size()), table.data(), h.layer, h.head, h.k_bits, h.v_bits);
    out += line;
  }
  return out;
}

}  // namespace kvctl
