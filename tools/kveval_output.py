# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval's outputs: quality.csv (every metric), quality.md (the table), quality.png (dPPL against
memory), and merging the rows of a subset run into an earlier full table.

    write_outputs(results, "results", meta)
    merge_outputs("/tmp/subset", "results", ["pressure_kivi8"], "tools/kveval --rows ...")
"""

from __future__ import annotations

import csv
import json
import os
import sys
from typing import Dict, List

from kveval_rows import EvalError

# The pressure columns come last, so the earlier columns keep their positions; peers and rows
# of older runs leave them empty.
COLUMNS = ["row", "kind", "bits_per_element", "memory_vs_fp16", "ppl", "dppl_pct", "kl_mean",
           "top1_agree", "greedy_agree", "greedy_first_div", "wall_s", "batch", "tokens_eval",
           "tokens_kept", "note", "pressure_reliefs", "k_bits_mean", "v_bits_mean",
           "pressure_cap_cuts", "payload_vs_fp16", "requantized_per_head"]


def fmt(v) -> str:
    if isinstance(v, float):
        return "%.4g" % v
    return str(v)


def write_outputs(results: List[dict], out_dir: str, meta: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "quality.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow({k: fmt(r.get(k, "")) for k in COLUMNS})
    # b/e counts the payload (codes, scales, fp16 rows); "mem vs fp16" what the pool reserves
    # (whole pages, slack included; a peer's cache tensors for peer rows).
    md = ["| row | kind | payload b/e | reserved mem vs fp16 | PPL | dPPL % | KL | top-1 | greedy "
          "| first div | wall s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    md += [md_line(r) for r in results]
    with open(os.path.join(out_dir, "quality.md"), "w") as f:
        f.write("<!-- %s -->\n" % json.dumps(meta))
        f.write("\n".join(md) + "\n")
    plot(results, out_dir, meta["tokens"])


def md_line(r: dict) -> str:
    return ("| %s | %s | %.3f | %.3f | %.3f | %+.2f | %.4f | %.3f | %.3f | %d | %.0f |"
            % (r["row"], r["kind"], r["bits_per_element"], r["memory_vs_fp16"], r["ppl"],
               r["dppl_pct"], r["kl_mean"], r["top1_agree"], r["greedy_agree"],
               r["greedy_first_div"], r["wall_s"]))


def plot(results: List[dict], out_dir: str, tokens: int) -> None:
    """quality.png: dPPL against memory of every row (results need row, kind, memory_vs_fp16,
    dppl_pct as numbers)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("kveval: matplotlib missing, no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        peer = r["kind"] != "kvctl"
        ax.scatter(r["memory_vs_fp16"], max(r["dppl_pct"], 1e-3), marker="x" if peer else "o",
                   color="tab:red" if peer else "tab:blue", s=40)
        ax.annotate(r["row"], (r["memory_vs_fp16"], max(r["dppl_pct"], 1e-3)), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("memory as a fraction of the fp16 cache of all tokens seen")
    ax.set_ylabel("dPPL % vs uncompressed (log; <=0 drawn at 1e-3)")
    ax.set_title("SmolLM2-135M pseudo-decode, %d tokens (o kvctl, x peers)" % tokens)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "quality.png"), dpi=110)
    plt.close(fig)


def _read_table(out_dir: str):
    """(CSV rows as dicts in order, md lines) of a kveval output folder."""
    paths = [os.path.join(out_dir, "quality." + ext) for ext in ("csv", "md")]
    for path in paths:
        if not os.path.isfile(path):
            raise EvalError("--merge-from: %s: no such file (a kveval --out folder?)" % path)
    with open(paths[0], newline="") as f:
        rows = list(csv.DictReader(f))
    with open(paths[1]) as f:
        lines = f.read().splitlines()
    return rows, lines


def _md_row_name(line: str) -> str:
    cells = line.split("|")
    if not line.startswith("| ") or len(cells) < 3 or cells[1].strip() in ("row", "---"):
        return ""
    return cells[1].strip()


def merge_outputs(src_dir: str, out_dir: str, names: List[str], command: str) -> None:
    """Copies rows `names` of a subset run (src_dir) into out_dir's table: a row of the same name
    is replaced in place, a new one appended. The CSV rows and the md lines are copied as written
    (no rounding again); the md keeps its comments and gains one naming the rows and `command`;
    the plot is redrawn from the merged CSV. Both runs must share the reference: the subset's
    uncompressed PPL must equal the table's, else EvalError (dPPL would not compare)."""
    src_rows, src_md = _read_table(src_dir)
    dst_rows, dst_md = _read_table(out_dir)
    src = {r["row"]: r for r in src_rows}
    missing = [n for n in names if n not in src]
    if missing:
        raise EvalError("--rows: %s not in %s/quality.csv (has %s)"
                        % (", ".join(missing), src_dir, ", ".join(src)))
    # The md's PPL cell has more digits than the CSV's 4 significant ones.
    refs = [next((line.split("|")[5].strip() for line in md
                  if _md_row_name(line) == "uncompressed"), None) for md in (src_md, dst_md)]
    if None in refs or refs[0] != refs[1]:
        raise EvalError("--merge-from: uncompressed PPL %s in %s, %s in %s: not the same "
                        "reference" % (refs[0], src_dir, refs[1], out_dir))
    new = {n: src[n] for n in names}
    merged = [new.pop(r["row"]) if r["row"] in new else r for r in dst_rows]
    merged += [src[n] for n in names if n in new]
    with open(os.path.join(out_dir, "quality.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore", restval="")
        w.writeheader()
        for r in merged:
            w.writerow(r)
    src_lines = {_md_row_name(line): line for line in src_md if _md_row_name(line)}
    lines, seen = [], set()
    last_row = max(i for i, line in enumerate(dst_md) if _md_row_name(line))
    for i, line in enumerate(dst_md):
        name = _md_row_name(line)
        lines.append(src_lines[name] if name in names else line)
        seen.add(name)
        if i == last_row:
            lines += [src_lines[n] for n in names if n not in seen]
    lines.append("<!-- merged %s from %s (reference PPL %s in both): %s -->"
                 % (",".join(names), src_dir, refs[0], command))
    with open(os.path.join(out_dir, "quality.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    meta = json.loads(dst_md[0][4:-3]) if dst_md[0].startswith("<!-- {") else {}
    numbers: List[Dict[str, object]] = []
    for r in merged:
        numbers.append({"row": r["row"], "kind": r["kind"],
                        "memory_vs_fp16": float(r["memory_vs_fp16"]),
                        "dppl_pct": float(r["dppl_pct"])})
    plot(numbers, out_dir, int(meta.get("tokens", 0)))
