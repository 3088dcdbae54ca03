# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Paired block bootstrap of every row of a kveval run against one of its rows.

  python3 tools/kveval_paired.py results/reasonalloc-prose-2k/quality.json evict_rkv_25

Both rows scored the same positions in the same run, so the change of dPPL (row against base,
in %) and its 95 % interval come from kveval_stats.bootstrap_ci with the base row's NLL in place
of the reference's. A row whose interval excludes 0 differs from the base on this sample.

  python3 tools/kveval_paired.py RUN/quality.json evict_snapkv_25@OTHER --also OTHER/quality.json

--also adds the rows of other runs on the same positions (their uncompressed NLLs must agree to
1e-3 nats, else the runs did not score the same tokens), each named ROW@DIR (DIR: the run's directory name),
so rows of different runs are paired too."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kveval_stats  # noqa: E402


# The uncompressed reference runs batched with the kvctl rows, and batched float32 matmuls round
# differently at another batch size (kveval --quick bounds log-probabilities at 5e-4): two runs on
# the same positions agree to that, runs on other tokens differ by whole nats.
SAME_POSITIONS_NLL = 1e-3


def nll_gap(a, b):
    """Largest |a - b| over the per-segment NLL lists, None when their shapes differ."""
    if not a or not b or len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        return None
    return max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x, y))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("quality_json", help="quality.json written by tools/kveval")
    ap.add_argument("base", help="the row the others are compared with")
    ap.add_argument("--also", action="append", default=[],
                    help="quality.json of another run on the same positions; its rows join as "
                         "ROW@DIR")
    args = ap.parse_args()
    with open(args.quality_json) as f:
        run = json.load(f)
    rows = {r["row"]: r for r in run["rows"]}
    for path in args.also:
        with open(path) as f:
            other = json.load(f)
        tag = os.path.basename(os.path.dirname(os.path.abspath(path)))
        theirs = {r["row"]: r for r in other["rows"]}
        gap = nll_gap(theirs.get("uncompressed", {}).get("nll"),
                      rows.get("uncompressed", {}).get("nll"))
        if gap is None or gap > SAME_POSITIONS_NLL:
            print("--also %s: uncompressed NLLs differ from %s's by %s nats (at most %g when "
                  "both scored the same positions), expected the same positions"
                  % (path, args.quality_json, "a shape" if gap is None else "%.2e" % gap,
                     SAME_POSITIONS_NLL), file=sys.stderr)
            return 1
        for name, r in theirs.items():
            if name != "uncompressed":
                rows["%s@%s" % (name, tag)] = r
    if args.base not in rows:
        print("base: got %r, expected one of %s" % (args.base, ", ".join(rows)), file=sys.stderr)
        return 1
    base = rows[args.base]
    print("| row | vs %s: dPPL %% [95 %% CI] | blocks |" % args.base)
    print("|---|---|---|")
    for name, r in rows.items():
        if name in (args.base, "uncompressed") or not r.get("nll"):
            continue
        ci = kveval_stats.bootstrap_ci(r["nll"], base["nll"], r["kl"])
        print("| %s | %+.2f [%+.2f, %+.2f] | %d |" % (name, ci["dppl_pct"], ci["dppl_lo"],
                                                     ci["dppl_hi"], ci["ci_blocks"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
