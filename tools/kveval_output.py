# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval's outputs, all rendered from one saved result (quality.json: the run's settings and
every row with its per-position NLL / KL / top-1 per segment and its generation):

- quality.csv: every metric of every row;
- quality.md: the table (dPPL and KL with 95 % intervals, reserved and payload memory, greedy
  agreement counted from the quantization onset), the per-target summary and the figure link;
- pareto.svg: dPPL and KL against reserved memory (kveval_svg).

    write_outputs(results, "results/prose-2k", meta)      # after a run
    render_from_json("results/prose-2k/quality.json", out_dir)  # again, without running
    merge_outputs("/tmp/subset", "results/prose-2k", ["kivi3"], "tools/kveval ...")
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Dict, List

from kveval_rows import EvalError
from kveval_stats import REFERENCE_ROWS, dominated, target_summary
from kveval_svg import family, pareto_svg

COLUMNS = ["row", "kind", "family", "bits_per_element", "reserved_bits_per_element",
           "memory_vs_fp16", "payload_vs_fp16", "ppl", "dppl_pct", "dppl_lo", "dppl_hi",
           "kl_mean", "kl_lo", "kl_hi", "top1_agree", "segment_dppl", "quant_onset_tokens",
           "greedy_from", "greedy_counted", "greedy_agree", "greedy_first_div", "wall_s",
           "batch", "tokens_eval", "tokens_seen", "tokens_quantized", "tokens_kept",
           "pressure_reliefs", "k_bits_mean", "v_bits_mean", "pressure_cap_cuts", "note",
           "requantized_per_head"]
ARRAYS = ("nll", "kl", "top1", "gen")  # Per-row raw data kept in quality.json only.


def fmt(v) -> str:
    if isinstance(v, float):
        return "%.4g" % v
    if isinstance(v, list):
        return ";".join(fmt(x) for x in v)
    return "" if v is None else str(v)


def _round(x):
    if isinstance(x, float):
        return float("%.6g" % x)
    if isinstance(x, list):
        return [_round(y) for y in x]
    return x


def write_outputs(results: List[dict], out_dir: str, meta: dict) -> str:
    """Saves quality.json and renders everything from it; returns the target summary text."""
    os.makedirs(out_dir, exist_ok=True)
    rows = [{k: (_round(v) if k in ARRAYS else v) for k, v in r.items()} for r in results]
    data = {"meta": meta, "rows": rows}
    with open(os.path.join(out_dir, "quality.json"), "w") as f:
        json.dump(data, f)
    return render(data, out_dir)


def load(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise EvalError("--plot-from: %s: %s" % (path, e)) from None
    if not isinstance(data, dict) or "rows" not in data or "meta" not in data:
        raise EvalError("--plot-from: %s: not a kveval quality.json (no meta/rows)" % path)
    return data


def render_from_json(path: str, out_dir: str) -> str:
    return render(load(path), out_dir)


def render(data: dict, out_dir: str) -> str:
    """quality.csv, quality.md and pareto.svg of a saved result; returns the summary text."""
    os.makedirs(out_dir, exist_ok=True)
    meta, results = data["meta"], data["rows"]
    for r in results:
        r["family"] = family(r)
    with open(os.path.join(out_dir, "quality.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow({k: fmt(r.get(k)) for k in COLUMNS})
    title = describe(meta)
    with open(os.path.join(out_dir, "pareto.svg"), "w") as f:
        f.write(pareto_svg(results, "SmolLM2-135M, " + title))
    summary = summary_md(results)
    short = {k: v for k, v in meta.items() if k != "segment_starts"}
    md = ["<!-- %s -->" % json.dumps(short), "", "**%s**" % title, "",
          "| row | kind | payload b/e | reserved b/e | reserved mem vs fp16 | payload mem vs fp16 "
          "| PPL | dPPL % [95 % CI] | KL [95 % CI] | top-1 | onset | greedy (from) | first div "
          "| wall s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    md += [md_line(r) for r in results]
    md += ["", summary, "", "![Pareto: %s](pareto.svg)" % title]
    with open(os.path.join(out_dir, "quality.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    return summary


def describe(meta: dict) -> str:
    return ("%s, %d-token contexts, %d segments x %d scored positions, greedy %d tokens after a "
            "%d-token prompt" % (meta.get("label") or meta.get("text"), meta["tokens"],
                                 meta["segments"], meta["scored"], meta["gen_tokens"],
                                 meta["prompt_tokens"]))


def _num(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else spec % v


def md_line(r: dict) -> str:
    greedy = ("-" if r.get("greedy_agree") is None
              else "%.3f (%d)" % (r["greedy_agree"], r["greedy_from"]))
    onset = {0: "0", -1: "never"}.get(r.get("quant_onset_tokens"), str(r.get("quant_onset_tokens")))
    return ("| %s | %s | %s | %s | %.3f | %.3f | %.3f | %+.2f [%+.2f, %+.2f] | %.4f [%.4f, %.4f] "
            "| %.3f | %s | %s | %s | %.0f |"
            % (r["row"], r["kind"], _num(r.get("bits_per_element"), "%.3f"),
               _num(r.get("reserved_bits_per_element"), "%.3f"), r["memory_vs_fp16"],
               r["payload_vs_fp16"], r["ppl"], r["dppl_pct"], r["dppl_lo"], r["dppl_hi"],
               r["kl_mean"], r["kl_lo"], r["kl_hi"], r["top1_agree"], onset, greedy,
               _num(r.get("greedy_first_div"), "%d"), r["wall_s"]))


def summary_md(results: List[dict]) -> str:
    """Issue 18's bands: the best kvctl row under each reserved-memory band against its target,
    and every peer point with the kvctl point that dominates it (or none)."""
    lines = ["| reserved mem <= | target dPPL | best kvctl row | its reserved mem | dPPL % "
             "[95 % CI] | target met (point / whole CI) | peers in band | all dominated |",
             "|---|---|---|---|---|---|---|---|"]
    for s in target_summary(results):
        peers = ", ".join("%s%s" % (p["row"], "" if p["dominated_by"] else " (not dominated)")
                          for p in s["peers"]) or "none"
        if s["best"] is None:
            lines.append("| %g | %g %% | none | - | - | no / no | %s | %s |"
                         % (s["band"], s["target_pct"], peers,
                            "yes" if s["peers_dominated"] else "no"))
            continue
        lines.append("| %g | %g %% | %s | %.3f | %+.2f [%+.2f, %+.2f] | %s / %s | %s | %s |"
                     % (s["band"], s["target_pct"], s["best"], s["best_memory"], s["best_dppl"],
                        s["best_lo"], s["best_hi"], "yes" if s["met"] else "no",
                        "yes" if s["met_with_ci"] else "no", peers,
                        "yes" if s["peers_dominated"] else "no"))
    kv = [r for r in results if r["kind"] == "kvctl" and r["row"] not in REFERENCE_ROWS]
    verdicts = []
    for p in (r for r in results if r["kind"] != "kvctl"):
        by = dominated(p, kv)
        verdicts.append("%s (%.3f, %+.2f %%): %s" % (
            p["row"], p["memory_vs_fp16"], p["dppl_pct"],
            "dominated by %s (%.3f, %+.2f %%)" % (by["row"], by["memory_vs_fp16"], by["dppl_pct"])
            if by else "NOT dominated"))
    if verdicts:
        lines += ["", "Peers (reserved mem, dPPL), point estimates: " + "; ".join(verdicts) + "."]
    return "\n".join(lines)


def merge_outputs(src_dir: str, out_dir: str, names: List[str], command: str) -> None:
    """Copies rows `names` of another run (src_dir/quality.json) into out_dir's result: a row of
    the same name is replaced, a new one appended, and everything is rendered again. Both runs
    must have scored the same positions of the same text with the same reference: the settings
    that choose them must match and the uncompressed rows' NLL must be equal (else the dPPL
    and KL would not compare), else EvalError. The rows' intervals are recomputed against the
    destination's reference (the same values)."""
    from kveval_stats import bootstrap_ci, segment_dppl
    src = load(os.path.join(src_dir, "quality.json"))
    dst = load(os.path.join(out_dir, "quality.json"))
    for key in ("text", "tokens", "segments", "segment_starts", "scored", "prompt_tokens",
                "gen_tokens"):
        if src["meta"].get(key) != dst["meta"].get(key):
            raise EvalError("--merge-from: %s differs (%r in %s, %r in %s)"
                            % (key, src["meta"].get(key), src_dir, dst["meta"].get(key),
                               out_dir))
    by_name = {r["row"]: r for r in src["rows"]}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise EvalError("--rows: %s not in %s/quality.json (has %s)"
                        % (", ".join(missing), src_dir, ", ".join(by_name)))
    refs = [next((r for r in d["rows"] if r["row"] == "uncompressed"), None) for d in (src, dst)]
    if None in refs or not _same(refs[0]["nll"], refs[1]["nll"]):
        raise EvalError("--merge-from: the uncompressed rows of %s and %s scored different NLL: "
                        "not the same reference" % (src_dir, out_dir))
    merged: Dict[str, dict] = {r["row"]: r for r in dst["rows"]}
    for n in names:
        r = dict(by_name[n])
        r.update(bootstrap_ci(r["nll"], refs[1]["nll"], r["kl"]))
        r["segment_dppl"] = segment_dppl(r["nll"], refs[1]["nll"])
        r["note"] = ("%s; merged from %s" % (r.get("note", ""), src_dir)).strip("; ")
        merged[n] = r
    dst["rows"] = list(merged.values())
    dst["meta"].setdefault("merged", []).append(command)
    with open(os.path.join(out_dir, "quality.json"), "w") as f:
        json.dump(dst, f)
    render(dst, out_dir)


def _same(a: List[List[float]], b: List[List[float]]) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) and all(abs(p - q) <= 1e-5 * max(1, abs(p))
                                                               for p, q in zip(x, y))
                                    for x, y in zip(a, b))
