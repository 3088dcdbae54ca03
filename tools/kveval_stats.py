# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval's statistics, pure Python (no torch, no numpy): confidence intervals of dPPL and KL by a
paired block bootstrap over scored positions, greedy agreement counted from the first generated
token whose context holds a quantized row, Pareto dominance of peer points, and the per-target
summary of the reserved-memory bands of issue 18.

    ci = bootstrap_ci(row_nll, ref_nll, row_kl)    # per segment lists of per-position values
    ci["dppl_lo"], ci["dppl_hi"], ci["kl_lo"], ci["kl_hi"]
    agreement(ref_tokens, got_tokens, onset_index)  # {"greedy_agree", "greedy_first_div", ...}
    dominated(peer, kvctl_points)                   # the kvctl point that dominates it, or None

Why a block bootstrap over positions and not over segments: kveval scores 2-4 segments per text,
too few to resample (4 segments have 35 distinct multisets); and consecutive positions are not
independent (a quantization error in the cache shifts the predictions of a run of tokens, and
text difficulty is local), so single positions resampled alone would give too narrow an
interval. Blocks of BLOCK consecutive scored positions inside one segment (never across a
segment boundary) keep that short-range dependence; the row and the reference are resampled with
the same blocks (paired), since dPPL is a ratio of the two on the same tokens and most of the
per-position variance is shared.
"""

from __future__ import annotations

import math
import random
from typing import Dict, List, Optional, Sequence

BLOCK = 32          # Scored positions per bootstrap block.
RESAMPLES = 2000    # Bootstrap resamples.
LEVEL = 0.95        # Two-sided percentile interval.
SEED = 18           # Fixed: the same inputs always give the same interval.


def _blocks(values_by_segment: Sequence[Sequence[float]], block: int) -> List[List[float]]:
    """Consecutive blocks of `block` values inside each segment; a shorter last block of a
    segment is kept (every scored position counts)."""
    out = []
    for seg in values_by_segment:
        for i in range(0, len(seg), block):
            out.append(list(seg[i:i + block]))
    return out


def _percentile(sorted_values: List[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 1]) of an ascending list."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def dppl_pct(row_nll: Sequence[float], ref_nll: Sequence[float]) -> float:
    """100 x (PPL_row / PPL_ref - 1) over the same positions."""
    if len(row_nll) != len(ref_nll) or not row_nll:
        raise ValueError("dppl: %d row and %d reference positions, expected the same non-zero "
                         "count" % (len(row_nll), len(ref_nll)))
    return 100.0 * math.expm1((sum(row_nll) - sum(ref_nll)) / len(row_nll))


def bootstrap_ci(row_nll: Sequence[Sequence[float]], ref_nll: Sequence[Sequence[float]],
                 row_kl: Sequence[Sequence[float]], block: int = BLOCK,
                 resamples: int = RESAMPLES, level: float = LEVEL,
                 seed: int = SEED) -> Dict[str, float]:
    """Paired block-bootstrap percentile intervals of dPPL % and mean KL. Arguments are lists of
    per-position values, one list per segment, aligned position by position between the row
    and the reference. Returns the point estimates (all positions) and the interval bounds."""
    if len(row_nll) != len(ref_nll) or len(row_nll) != len(row_kl):
        raise ValueError("bootstrap: %d/%d/%d segments, expected the same count"
                         % (len(row_nll), len(ref_nll), len(row_kl)))
    for s, (a, b, c) in enumerate(zip(row_nll, ref_nll, row_kl)):
        if not len(a) == len(b) == len(c):
            raise ValueError("bootstrap: segment %d has %d/%d/%d positions, expected equal"
                             % (s, len(a), len(b), len(c)))
    # Per block: (sum of row NLL - reference NLL, sum of KL, positions).
    diffs = [[r - f for r, f in zip(a, b)] for a, b in zip(row_nll, ref_nll)]
    blocks = [(sum(d), sum(k), len(d)) for d, k in zip(_blocks(diffs, block),
                                                         _blocks(row_kl, block))]
    if not blocks:
        raise ValueError("bootstrap: no scored positions")
    n_pos = sum(b[2] for b in blocks)
    point_dppl = 100.0 * math.expm1(sum(b[0] for b in blocks) / n_pos)
    point_kl = sum(b[1] for b in blocks) / n_pos
    rng = random.Random(seed)
    dppls, kls = [], []
    for _ in range(resamples):
        d = k = n = 0.0
        for _ in range(len(blocks)):
            bd, bk, bn = blocks[rng.randrange(len(blocks))]
            d += bd
            k += bk
            n += bn
        dppls.append(100.0 * math.expm1(d / n))
        kls.append(k / n)
    dppls.sort()
    kls.sort()
    tail = (1.0 - level) / 2
    return {"dppl_pct": point_dppl, "dppl_lo": _percentile(dppls, tail),
            "dppl_hi": _percentile(dppls, 1 - tail), "kl_mean": point_kl,
            "kl_lo": _percentile(kls, tail), "kl_hi": _percentile(kls, 1 - tail),
            "ci_blocks": len(blocks), "ci_positions": n_pos}


def segment_dppl(row_nll: Sequence[Sequence[float]],
                 ref_nll: Sequence[Sequence[float]]) -> List[float]:
    """dPPL % of each segment alone (the spread the interval summarises)."""
    return [dppl_pct(a, b) for a, b in zip(row_nll, ref_nll)]


# ---- free generation ----------------------------------------------------------------------

def onset_index(quant_onset_tokens: int, prompt_tokens: int, generated: int) -> Optional[int]:
    """Index of the first generated token predicted by attention over a quantized row.

    Generated token 0 comes from the prefill's own logits, which attend to the prompt's exact
    K/V in every row (the daemon stores the prompt after that forward), so it never counts.
    Token g >= 1 is predicted by a forward that first APPENDs the previous step, so the daemon
    then holds prompt_tokens + g - 1 tokens; its first rows are quantized when the sequence
    reaches quant_onset_tokens (STATS `quant_onset_tokens`). Hence g = max(1, onset - prompt
    + 1). Onset 0 (fp16 or lossless rows, and rows that only evict: lossy, if at all, from the
    prompt's storage on) counts from token 1. None when no generated token is predicted over a
    quantized row (-1 = never quantizes, or the onset lies past the generation)."""
    if quant_onset_tokens < 0:
        return None
    g = max(1, quant_onset_tokens - prompt_tokens + 1)
    return g if g < generated else None


def agreement(ref: Sequence[int], got: Sequence[int], start: Optional[int]) -> Dict[str, object]:
    """Greedy agreement of `got` with the reference generation `ref` from index `start` on:
    the fraction of equal tokens at indices start.. and the first differing index (-1: none
    differ). Tokens before `start` are not counted: there the row's cache held no quantized row
    yet, so agreeing there says nothing about the quantizer. start None: not measured (nothing
    quantized), agreement None."""
    n = min(len(ref), len(got))
    if start is None or start >= n:
        return {"greedy_agree": None, "greedy_first_div": None, "greedy_counted": 0,
                "greedy_from": start}
    same = [ref[i] == got[i] for i in range(start, n)]
    first = next((start + i for i, s in enumerate(same) if not s), -1)
    return {"greedy_agree": sum(same) / len(same), "greedy_first_div": first,
            "greedy_counted": len(same), "greedy_from": start}


# ---- Pareto ---------------------------------------------------------------------------------

def dominated(point: Dict[str, float], candidates: Sequence[Dict[str, float]],
              key: str = "dppl_pct") -> Optional[Dict[str, float]]:
    """The first candidate with no more memory and no more `key` than point (and not the same
    point), else None. Points are dicts with "memory_vs_fp16" and `key`."""
    for c in candidates:
        if c is point:
            continue
        if c["memory_vs_fp16"] <= point["memory_vs_fp16"] and c[key] <= point[key]:
            return c
    return None


def frontier(points: Sequence[Dict[str, float]], key: str = "dppl_pct") -> List[Dict[str, float]]:
    """The points no other point strictly improves on (lower memory and no higher `key`, or no
    higher memory and lower `key`), in ascending memory."""
    out = []
    for p in points:
        beaten = any((q["memory_vs_fp16"] < p["memory_vs_fp16"] and q[key] <= p[key])
                     or (q["memory_vs_fp16"] <= p["memory_vs_fp16"] and q[key] < p[key])
                     for q in points if q is not p)
        if not beaten:
            out.append(p)
    return sorted(out, key=lambda p: (p["memory_vs_fp16"], p[key]))


# Issue 18's targets: reserved memory vs fp16 at most `band`, dPPL % at most `target`.
TARGETS = [(0.375, 0.5), (0.25, 2.0), (0.125, 5.0), (0.0625, 15.0)]
# Rows that are references, not candidates for a band.
REFERENCE_ROWS = ("uncompressed", "fp16")


def target_summary(results: Sequence[dict]) -> List[dict]:
    """Per band of TARGETS: the kvctl row with the lowest dPPL at no more reserved memory than
    the band, whether it meets the target (point estimate, and with its whole interval), and the
    peer points in the band with whether a kvctl point (any memory <= the peer's) dominates each."""
    kv = [r for r in results if r["kind"] == "kvctl" and r["row"] not in REFERENCE_ROWS]
    peers = [r for r in results if r["kind"] != "kvctl"]
    out = []
    for band, target in TARGETS:
        inside = [r for r in kv if r["memory_vs_fp16"] <= band]
        best = min(inside, key=lambda r: r["dppl_pct"]) if inside else None
        band_peers = []
        for p in peers:
            if p["memory_vs_fp16"] <= band:
                by = dominated(p, kv)
                band_peers.append({"row": p["row"], "memory_vs_fp16": p["memory_vs_fp16"],
                                   "dppl_pct": p["dppl_pct"], "dominated_by": by["row"] if by
                                   else None})
        out.append({"band": band, "target_pct": target, "best": best["row"] if best else None,
                    "best_memory": best["memory_vs_fp16"] if best else None,
                    "best_dppl": best["dppl_pct"] if best else None,
                    "best_lo": best.get("dppl_lo") if best else None,
                    "best_hi": best.get("dppl_hi") if best else None,
                    "met": bool(best and best["dppl_pct"] <= target),
                    "met_with_ci": bool(best and best.get("dppl_hi") is not None
                                        and best["dppl_hi"] <= target),
                    "peers": band_peers,
                    "peers_dominated": all(p["dominated_by"] for p in band_peers)})
    return out
