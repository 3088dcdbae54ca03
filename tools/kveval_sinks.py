# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Summary of kveval's sink/flush grid (rows <method><bits>_s<S>_f<F>, issue #18) over one or more
texts: per method and width, each (sinks, flush) with its memory and its dPPL pooled over every
text's scored positions, and the paired change against a baseline row (the method's former
default), so two settings are compared on the same positions and not only each against fp16.

    python3 tools/kveval_sinks.py DIR_OR_JSON [...]      # prints Markdown tables

Why a memory figure of its own: kveval's "reserved mem vs fp16" is taken once, after C - 1
tokens, where the unflushed tail holds (C - 1 - S) mod F rows: an accident of the context length
(at 2,047 tokens a 0- and a 64-sink row both hold 127 fp16 rows, a 32-sink row 127 too with
F = 128 only by chance). The column **mean mem** averages the payload over the scored positions
instead: at t tokens seen, S + (t - S) mod F rows are fp16 (16 bits) and the rest quantized at the
row's own quantized bits per element, which is recovered from the daemon's STATS at the end
(bits_per_element x tokens = 16 x fp16 rows + b_q x quantized rows). **fp16 rows** is the range a
head holds at any time after the sinks: S .. S + F - 1 (what a capacity plan must reserve).

Pooling: every text's segments are scored against that text's own uncompressed reference, and
dPPL is over all positions of all texts (each segment weighs by its positions); the interval is
kveval_stats' paired block bootstrap over the pooled blocks. The paired change "vs base" is the
same bootstrap with the baseline row in the reference's place: 100 x (PPL_row / PPL_base - 1).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kveval_stats  # noqa: E402

NAME = re.compile(r"^(?P<method>[a-z]+)(?P<bits>\d)_s(?P<sinks>\d+)_f(?P<flush>\d+)$")


def parse_name(name: str) -> Optional[dict]:
    """{"method", "bits", "sinks", "flush"} of a grid row name, or None for any other row."""
    m = NAME.match(name)
    if m is None:
        return None
    return {"method": m["method"], "bits": int(m["bits"]), "sinks": int(m["sinks"]),
            "flush": int(m["flush"])}


def fp16_rows(tokens: int, sinks: int, flush: int) -> int:
    """fp16 rows a head holds after `tokens` tokens: the sinks and the unflushed tail."""
    if tokens <= sinks:
        return tokens
    return sinks + (tokens - sinks) % flush


def mean_memory(row: dict, context: int, scored: int) -> float:
    """Mean payload / fp16 bytes over the scored positions of a C-token context: position i of
    the last `scored` predicts with context - scored + i tokens seen (kveval's pseudo-decode)."""
    g = parse_name(row["row"])
    end = row["tokens_seen"]
    q_end = row["tokens_quantized"]
    if q_end <= 0:
        raise ValueError("%s: nothing quantized, no quantized bits to recover" % row["row"])
    # 16 x fp16 + b_q x quantized = b/e x tokens (STATS, per stored element, at the end).
    b_q = (row["bits_per_element"] * end - 16.0 * (end - q_end)) / q_end
    total = 0.0
    for t in range(context - scored, context):
        f = fp16_rows(t, g["sinks"], g["flush"])
        total += (16.0 * f + b_q * (t - f)) / (16.0 * t)
    return total / scored


def load_rows(paths: Sequence[str]) -> List[dict]:
    """[{"meta", "rows": {name: row}}] per quality.json (a folder means its quality.json)."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            p = os.path.join(p, "quality.json")
        with open(p, encoding="utf-8") as f:
            data = json.load(f)
        out.append({"meta": data["meta"], "rows": {r["row"]: r for r in data["rows"]},
                    "path": p})
    return out


def pooled(runs: List[dict], label: str) -> Dict[str, Dict[str, dict]]:
    """{text label: {row name: row}} with every run of the same text merged; a row measured twice
    must have scored the same NLL (the runs are deterministic), else ValueError."""
    by_text: Dict[str, Dict[str, dict]] = {}
    for run in runs:
        text = run["meta"].get(label) or run["meta"]["text"]
        rows = by_text.setdefault(text, {})
        for name, r in run["rows"].items():
            if name in rows and rows[name]["nll"] != r["nll"]:
                raise ValueError("%s: row %s scored different NLL than an earlier run of %s"
                                 % (run["path"], name, text))
            rows.setdefault(name, r)
    return by_text


def compare(by_text: Dict[str, Dict[str, dict]], name: str, base: str) -> Optional[dict]:
    """Pooled paired bootstrap of row `name` against row `base` (or the reference when base is
    "uncompressed") over the texts that measured both; None when none did."""
    row_nll, base_nll, row_kl = [], [], []
    for rows in by_text.values():
        if name not in rows or base not in rows:
            continue
        row_nll += rows[name]["nll"]
        base_nll += rows[base]["nll"]
        row_kl += rows[name]["kl"]
    if not row_nll:
        return None
    return kveval_stats.bootstrap_ci(row_nll, base_nll, row_kl)


def summarize(by_text: Dict[str, Dict[str, dict]], context: int, scored: int,
              baselines: Dict[str, str]) -> str:
    """Markdown: one table per (method, bits), rows in ascending mean memory."""
    names = sorted({n for rows in by_text.values() for n in rows if parse_name(n)})
    groups: Dict[tuple, List[str]] = {}
    for n in names:
        g = parse_name(n)
        groups.setdefault((g["method"], g["bits"]), []).append(n)
    texts = sorted(by_text)
    lines = []
    for (method, bits), members in sorted(groups.items()):
        base = baselines.get("%s%d" % (method, bits), "")
        lines.append("")
        lines.append("**%s %d-bit** (texts: %s; vs base: %s)" % (method, bits, ", ".join(texts),
                                                               base or "none"))
        lines.append("")
        lines.append("| sinks | flush | fp16 rows | mean mem | end reserved | dPPL % [95 % CI] | "
                     + " | ".join("%s dPPL %%" % t for t in texts)
                     + " | KL | vs base, dPPL % [95 % CI] |")
        lines.append("|---" * (8 + len(texts)) + "|")
        table = []
        for n in members:
            g = parse_name(n)
            rows = [by_text[t][n] for t in texts if n in by_text[t]]
            mem = sum(mean_memory(r, context, scored) for r in rows) / len(rows)
            end = sum(r["memory_vs_fp16"] for r in rows) / len(rows)
            ci = compare(by_text, n, "uncompressed")
            per_text = []
            for t in texts:
                r = by_text[t].get(n)
                per_text.append("-" if r is None else "%+.2f" % r["dppl_pct"])
            vs = compare(by_text, n, base) if base and n != base else None
            vs_text = ("%+.2f [%+.2f, %+.2f]" % (vs["dppl_pct"], vs["dppl_lo"], vs["dppl_hi"])
                       if vs else ("(base)" if n == base else "-"))
            table.append((mem, "| %d | %d | %d..%d | %.3f | %.3f | %+.2f [%+.2f, %+.2f] | %s | "
                          "%.4f | %s |" % (g["sinks"], g["flush"], g["sinks"],
                                           g["sinks"] + g["flush"] - 1, mem, end, ci["dppl_pct"],
                                           ci["dppl_lo"], ci["dppl_hi"], " | ".join(per_text),
                                           ci["kl_mean"], vs_text)))
        lines += [t for _, t in sorted(table, key=lambda x: (x[0], x[1]))]
    return "\n".join(lines) + "\n"


# The registry defaults before issue #18's change (kernels/quant_types.cc at commit 3ab356c).
FORMER_DEFAULTS = {"kivi2": "kivi2_s0_f128", "kivi3": "kivi3_s0_f128", "kvarn2": "kvarn2_s128_f128",
                   "quarot2": "quarot2_s0_f128", "oscar2": "oscar2_s0_f256",
                   "turbo2": "turbo2_s0_f128", "turbo3": "turbo3_s0_f128"}


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 1
    runs = load_rows(argv)
    contexts = {(r["meta"]["tokens"], r["meta"]["scored"]) for r in runs}
    if len(contexts) != 1:
        print("kveval_sinks: runs differ in --tokens/--scored: %s, expected one setting"
              % sorted(contexts), file=sys.stderr)
        return 1
    context, scored = contexts.pop()
    print(summarize(pooled(runs, "label"), context, scored, FORMER_DEFAULTS), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
