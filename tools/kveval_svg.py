# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval's Pareto figure as a dependency-free SVG: dPPL % and KL against reserved memory vs fp16
(both axes logarithmic), one line per family through its rows in ascending memory, 95 %
intervals as vertical bars, peers drawn hollow with dashed lines, issue 18's targets as a dashed
staircase in the dPPL panel.

    svg = pareto_svg(results, "prose, 2048-token contexts")    # results: kveval row dicts
    open("pareto.svg", "w").write(svg)

Row dicts need row, kind, memory_vs_fp16, dppl_pct, kl_mean; dppl_lo/hi and kl_lo/hi draw bars.
family() names a row's family from its name (rows added later fall back to their name's stem).
"""

from __future__ import annotations

import math
import re
from typing import Dict, List, Sequence, Tuple
from xml.sax.saxutils import escape

from kveval_stats import TARGETS

# Name prefix -> family label, first match wins (peers: kind quanto / kvpress).
FAMILIES = [
    ("kivi", "KIVI"), ("kvarn", "KVarN"), ("oscar", "OScaR"), ("quarot", "QuaRot"),
    ("rq_", "RateQuant"), ("turbo", "TurboQuant"), ("evict_streaming", "StreamingLLM (evict)"),
    ("evict_h2o", "H2O (evict)"), ("evict_snapkv", "SnapKV (evict)"),
    ("evict_rkv", "R-KV (evict)"), ("reasonalloc", "ReasonAlloc"), ("joint", "joint planner"),
    ("pressure", "pool pressure"), ("quanto", "peer: transformers quanto"),
    ("peer_turbo", "peer: TurboQuant (PyPI turboquant)"),
    ("kvpress_snapkv", "peer: kvpress SnapKV"),
    ("kvpress_streamingllm", "peer: kvpress StreamingLLM"),
    ("kvpress_expected_attention", "peer: kvpress ExpectedAttention"),
]
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39",
           "#7b4173", "#3182bd", "#e6550d", "#31a354"]
NOT_PLOTTED = ("uncompressed",)  # 2.0 of fp16 (float32 rows): the reference, off the frontier.
DPPL_FLOOR, KL_FLOOR = 0.01, 1e-5  # Smaller values (and dPPL <= 0) are drawn at the floor.
W, H = 1180, 460
PANEL_W, PANEL_H, LEFT, TOP = 380, 340, 70, 40


def family(row: dict) -> str:
    name = row["row"]
    for prefix, label in FAMILIES:
        if name.startswith(prefix):
            return label
    stem = re.sub(r"[_\d.]+$", "", name) or name
    return ("peer: " + stem) if row.get("kind", "kvctl") != "kvctl" else stem


def _ticks(lo: float, hi: float) -> List[float]:
    out = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0 ** e
            if lo <= v <= hi:
                out.append(v)
    return out


def _fmt(v: float) -> str:
    return ("%g" % v) if v >= 1e-3 else ("%.0e" % v)


class _Panel:
    def __init__(self, x0: float, xr: Tuple[float, float], yr: Tuple[float, float]):
        self.x0, self.xr, self.yr = x0, xr, yr

    def x(self, v: float) -> float:
        a, b = map(math.log10, self.xr)
        return self.x0 + (math.log10(v) - a) / (b - a) * PANEL_W

    def y(self, v: float) -> float:
        a, b = map(math.log10, self.yr)
        return TOP + PANEL_H - (math.log10(v) - a) / (b - a) * PANEL_H


def pareto_svg(results: Sequence[dict], title: str) -> str:
    rows = [r for r in results if r["row"] not in NOT_PLOTTED]
    fams: Dict[str, List[dict]] = {}
    for r in rows:
        fams.setdefault(family(r), []).append(r)
    colors = {f: PALETTE[i % len(PALETTE)] for i, f in enumerate(fams)}
    mems = [r["memory_vs_fp16"] for r in rows] or [1.0]
    xr = (min(0.03, min(mems) * 0.9), max(1.1, max(mems) * 1.1))
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="11">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="20" font-size="14">%s</text>' % (LEFT, escape(title))]
    for i, (key, lo, hi, floor, label) in enumerate((
            ("dppl_pct", "dppl_lo", "dppl_hi", DPPL_FLOOR, "dPPL % vs uncompressed"),
            ("kl_mean", "kl_lo", "kl_hi", KL_FLOOR, "KL(uncompressed || row), nats"))):
        vals = [max(r.get(hi, r[key]), r[key], floor) for r in rows] or [1.0]
        panel = _Panel(LEFT + i * (PANEL_W + 80), xr, (floor, max(vals) * 1.5))
        out += _axes(panel, label)
        if key == "dppl_pct":
            out += _targets(panel)
        for fam, members in fams.items():
            out += _family(panel, members, key, lo, hi, floor, colors[fam],
                           members[0].get("kind", "kvctl") != "kvctl")
    out += _legend(fams, colors)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _axes(p: _Panel, label: str) -> List[str]:
    x1, y1 = p.x0 + PANEL_W, TOP + PANEL_H
    out = ['<rect x="%.1f" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
           % (p.x0, TOP, PANEL_W, PANEL_H)]
    for v in (1 / 32, 1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 1.0):
        if p.xr[0] <= v <= p.xr[1]:
            x = p.x(v)
            out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#ddd"/>'
                       % (x, TOP, x, y1))
            out.append('<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>'
                       % (x, y1 + 14, {0.375: "3/8"}.get(v, "1/%d" % round(1 / v) if v < 1
                                                        else "1")))
    for v in _ticks(*p.yr):
        y = p.y(v)
        out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>'
                   % (p.x0, y, x1, y))
        out.append('<text x="%.1f" y="%.1f" text-anchor="end">%s</text>' % (p.x0 - 4, y + 4,
                                                                             _fmt(v)))
    out.append('<text x="%.1f" y="%.1f" text-anchor="middle">reserved memory vs fp16 (log)'
               '</text>' % (p.x0 + PANEL_W / 2, y1 + 30))
    out.append('<text x="%.1f" y="%d" text-anchor="middle">%s (log; lower is better)</text>'
               % (p.x0 + PANEL_W / 2, TOP - 6, escape(label)))
    return out


def _targets(p: _Panel) -> List[str]:
    out, left = [], p.xr[0]
    for band, target in sorted(TARGETS):
        if p.yr[0] <= target <= p.yr[1]:
            out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" '
                       'stroke-dasharray="2,3"/>' % (p.x(left), p.y(target), p.x(band),
                                                     p.y(target)))
            out.append('<text x="%.1f" y="%.1f" font-size="9" fill="#555">target</text>'
                       % (p.x(left) + 2, p.y(target) - 2))
        left = band
    return out


def _family(p: _Panel, members: List[dict], key: str, lo: str, hi: str, floor: float,
            color: str, peer: bool) -> List[str]:
    pts = sorted(members, key=lambda r: r["memory_vs_fp16"])
    xy = [(p.x(r["memory_vs_fp16"]), p.y(max(r[key], floor))) for r in pts]
    out = []
    if len(xy) > 1:
        out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.3"%s/>'
                   % (" ".join("%.1f,%.1f" % c for c in xy), color,
                      ' stroke-dasharray="5,3"' if peer else ""))
    for r, (x, y) in zip(pts, xy):
        if r.get(lo) is not None and r.get(hi) is not None:
            out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>'
                       % (x, p.y(max(r[lo], floor)), x, p.y(max(r[hi], floor)), color))
        tip = "%s: mem %.3f, %s %.4g" % (r["row"], r["memory_vs_fp16"], key, r[key])
        if peer:
            out.append('<path d="M%.1f,%.1f l5,9 l-10,0 z" fill="white" stroke="%s" '
                       'stroke-width="1.5"><title>%s</title></path>'
                       % (x, y - 6, color, escape(tip)))
        else:
            out.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s</title></circle>'
                       % (x, y, color, escape(tip)))
    return out


def _legend(fams: Dict[str, List[dict]], colors: Dict[str, str]) -> List[str]:
    x0 = LEFT + 2 * (PANEL_W + 80) - 50
    out = []
    for i, fam in enumerate(fams):
        y = TOP + 8 + i * 16
        peer = fams[fam][0].get("kind", "kvctl") != "kvctl"
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>'
                   % (x0, y, x0 + 18, y, colors[fam], ' stroke-dasharray="4,2"' if peer else ""))
        out.append('<text x="%d" y="%d">%s</text>' % (x0 + 24, y + 4, escape(fam)))
    return out
