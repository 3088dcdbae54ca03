// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "policies/width_relief.h"

#include <cmath>
#include <limits>

namespace kvctl {
namespace {

// The next allowed width below `bits` that is >= min_bits, or 0.
int NextLower(const QuantSpec& spec, int bits, int min_bits) {
  const uint32_t allowed = TraitsOf(spec.method).allowed_bits;
  for (int b = bits - 1; b >= std::max(1, min_bits); --b) {
    if ((allowed >> b) & 1u) return b;
  }
  return 0;
}

// The spec at other widths, or nullopt-like false when the method refuses the pair.
bool WithWidths(const QuantSpec& spec, int k_bits, int v_bits, QuantSpec* out) {
  *out = spec;
  out->k_bits = k_bits;
  out->v_bits = v_bits;
  return ValidateQuantSpec(*out).ok();
}

double ElementDistortion(const WidthCurve& c, int k_bits, int v_bits) {
  return c.k_scale * std::pow(c.beta_k, -k_bits) + c.v_scale * std::pow(c.beta_v, -v_bits);
}

struct HeadState {
  QuantSpec spec;
  int64_t pages = 0;
};

}  // namespace

int64_t RecordPages(const QuantSpec& spec, int64_t records, uint64_t page_bytes) {
  const uint64_t per_page = page_bytes / BlockLayoutOf(spec).record_bytes;
  return (records + static_cast<int64_t>(per_page) - 1) / static_cast<int64_t>(per_page);
}

StatusOr<WidthRelief> PlanWidthRelief(const std::vector<ReliefHead>& heads,
                                      const ReliefOptions& options) {
  if (options.shortfall_pages < 1) {
    return InvalidArgument("shortfall_pages: got ", options.shortfall_pages, ", expected >= 1");
  }
  if (options.page_bytes == 0) return InvalidArgument("page_bytes: got 0, expected >= 1");
  for (size_t i = 0; i < heads.size(); ++i) {
    const ReliefHead& h = heads[i];
    KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(h.spec));
    if (BlockLayoutOf(h.spec).record_bytes > options.page_bytes) {
      return InvalidArgument("heads[", i, "].spec: record of ", BlockLayoutOf(h.spec).record_bytes,
                             " bytes, expected <= page_bytes ", options.page_bytes);
    }
    if (h.records < 0) {
      return InvalidArgument("heads[", i, "].records: got ", h.records, ", expected >= 0");
    }
    for (double x : {h.curve.k_scale, h.curve.v_scale}) {
      if (!std::isfinite(x) || x < 0) {
        return InvalidArgument("heads[", i, "].curve scale: got ", x, ", expected finite >= 0");
      }
    }
    for (double x : {h.curve.beta_k, h.curve.beta_v}) {
      if (!std::isfinite(x) || x <= 1) {
        return InvalidArgument("heads[", i, "].curve beta: got ", x, ", expected finite > 1");
      }
    }
  }

  // Feasibility: every head at its narrowest widths.
  std::vector<HeadState> state(heads.size());
  int64_t most = 0;
  for (size_t i = 0; i < heads.size(); ++i) {
    const ReliefHead& h = heads[i];
    state[i] = {h.spec, RecordPages(h.spec, h.records, options.page_bytes)};
    int kb = h.spec.k_bits, vb = h.spec.v_bits;
    QuantSpec next;
    for (bool moved = true; moved;) {
      moved = false;
      const int lk = NextLower(h.spec, kb, options.min_bits);
      if (lk > 0 && WithWidths(h.spec, lk, vb, &next)) kb = lk, moved = true;
      const int lv = NextLower(h.spec, vb, options.min_bits);
      if (lv > 0 && WithWidths(h.spec, kb, lv, &next)) vb = lv, moved = true;
    }
    WithWidths(h.spec, kb, vb, &next);
    most += state[i].pages - RecordPages(next, h.records, options.page_bytes);
  }
  int64_t target = options.shortfall_pages;
  if (most < target && options.partial) target = most;
  if (most < target) {
    return ResourceExhausted("lowering every head to its narrowest width >= ", options.min_bits,
                             " bits frees ", most, " pages, expected >= ", options.shortfall_pages,
                             " (the shortfall)");
  }

  // Greedy single steps, cheapest distortion per byte freed first. O(steps x heads): a few
  // thousand heads at most, and it runs only when the pool is full.
  int64_t freed = 0;
  double added = 0;
  while (freed < target) {
    double best_ratio = std::numeric_limits<double>::infinity();
    size_t best = heads.size();
    QuantSpec best_spec;
    for (size_t i = 0; i < heads.size(); ++i) {
      const ReliefHead& h = heads[i];
      if (h.records == 0) continue;
      const QuantSpec& cur = state[i].spec;
      const int lk = NextLower(cur, cur.k_bits, options.min_bits);
      const int lv = NextLower(cur, cur.v_bits, options.min_bits);
      const std::pair<int, int> moves[] = {{lk, cur.v_bits}, {cur.k_bits, lv}, {lk, lv}};
      for (const auto& [kb, vb] : moves) {
        QuantSpec next;
        if (kb == 0 || vb == 0 || !WithWidths(cur, kb, vb, &next)) continue;
        const double bytes = static_cast<double>(h.records) *
                             (static_cast<double>(BlockLayoutOf(cur).record_bytes) -
                              static_cast<double>(BlockLayoutOf(next).record_bytes));
        if (bytes <= 0) continue;
        const double d = static_cast<double>(h.records) * cur.block_tokens * cur.head_dim *
                         (ElementDistortion(h.curve, kb, vb) -
                          ElementDistortion(h.curve, cur.k_bits, cur.v_bits));
        if (d / bytes < best_ratio) best_ratio = d / bytes, best = i, best_spec = next;
      }
    }
    // Feasible at the narrowest widths, so a step that frees bytes exists until we get there.
    KVCTL_CHECK(best < heads.size());
    const ReliefHead& h = heads[best];
    added += static_cast<double>(h.records) * best_spec.block_tokens * best_spec.head_dim *
             (ElementDistortion(h.curve, best_spec.k_bits, best_spec.v_bits) -
              ElementDistortion(h.curve, state[best].spec.k_bits, state[best].spec.v_bits));
    const int64_t pages = RecordPages(best_spec, h.records, options.page_bytes);
    freed += state[best].pages - pages;
    state[best] = {best_spec, pages};
  }

  WidthRelief relief;
  relief.pages_freed = freed;
  relief.distortion_added = added;
  for (size_t i = 0; i < heads.size(); ++i) {
    const ReliefHead& h = heads[i];
    const QuantSpec& to = state[i].spec;
    if (to.k_bits == h.spec.k_bits && to.v_bits == h.spec.v_bits) continue;
    ReliefStep step;
    step.layer = h.layer;
    step.head = h.head;
    step.from_k_bits = h.spec.k_bits;
    step.from_v_bits = h.spec.v_bits;
    step.to_k_bits = to.k_bits;
    step.to_v_bits = to.v_bits;
    step.pages_freed = RecordPages(h.spec, h.records, options.page_bytes) - state[i].pages;
    step.distortion_added = static_cast<double>(h.records) * to.block_tokens * to.head_dim *
                            (ElementDistortion(h.curve, to.k_bits, to.v_bits) -
                             ElementDistortion(h.curve, h.spec.k_bits, h.spec.v_bits));
    relief.steps.push_back(step);
  }
  return relief;
}

}  // namespace kvctl
