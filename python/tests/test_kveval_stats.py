# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval's statistics (tools/kveval_stats.py) and outputs (tools/kveval_output.py,
tools/kveval_svg.py) on synthetic numbers: the bootstrap interval, greedy agreement counted from
the quantization onset, Pareto dominance and the per-target summary, and rendering a saved
result again (kveval --plot-from). Pure Python: no model, no daemon."""

import json
import math
import os
import random
import sys
import xml.dom.minidom

import pytest

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "tools")
sys.path.insert(0, TOOLS)

import kveval_output  # noqa: E402
import kveval_stats as ks  # noqa: E402
import kveval_svg  # noqa: E402


def _segments(rng, n_seg, n_pos, mean, sd):
    return [[rng.gauss(mean, sd) for _ in range(n_pos)] for _ in range(n_seg)]


# ---- bootstrap ------------------------------------------------------------------------------

def test_bootstrap_point_is_the_pooled_dppl_and_interval_contains_it():
    rng = random.Random(1)
    ref = _segments(rng, 4, 128, 3.0, 1.0)
    row = [[x + 0.05 + rng.gauss(0, 0.1) for x in seg] for seg in ref]
    kl = [[abs(rng.gauss(0.05, 0.02)) for _ in seg] for seg in ref]
    ci = ks.bootstrap_ci(row, ref, kl)
    flat_row = [x for s in row for x in s]
    flat_ref = [x for s in ref for x in s]
    want = 100 * (math.exp(sum(flat_row) / 512) / math.exp(sum(flat_ref) / 512) - 1)
    assert ci["dppl_pct"] == pytest.approx(want, rel=1e-9)
    assert ci["dppl_lo"] < ci["dppl_pct"] < ci["dppl_hi"]
    assert ci["kl_lo"] < ci["kl_mean"] < ci["kl_hi"]
    assert ci["ci_blocks"] == 4 * 128 // ks.BLOCK and ci["ci_positions"] == 512
    # The true shift is +5.13 %: the interval covers it and is not absurdly wide.
    assert ci["dppl_lo"] < 100 * math.expm1(0.05) < ci["dppl_hi"]
    assert ci["dppl_hi"] - ci["dppl_lo"] < 3.0


def test_bootstrap_is_paired_so_shared_difficulty_cancels():
    # Positions differ wildly in difficulty (sd 3 nats) but the row is the reference + 0.02
    # everywhere: a paired interval is a single value, an unpaired one would span tens of %.
    rng = random.Random(2)
    ref = _segments(rng, 3, 96, 3.0, 3.0)
    row = [[x + 0.02 for x in seg] for seg in ref]
    kl = [[0.0] * 96 for _ in range(3)]
    ci = ks.bootstrap_ci(row, ref, kl)
    assert ci["dppl_lo"] == pytest.approx(100 * math.expm1(0.02), abs=1e-9)
    assert ci["dppl_hi"] == pytest.approx(100 * math.expm1(0.02), abs=1e-9)


def test_bootstrap_blocks_widen_the_interval_for_correlated_errors():
    # Errors in runs of 32 equal values (a cache error shifting a run of tokens) carry less
    # information than 512 independent ones: blocks of 32 must give a wider interval than
    # blocks of 1 (which treat every position as independent).
    rng = random.Random(3)
    ref = [[3.0] * 256 for _ in range(2)]
    row = [[3.0 + d for d in sum(([rng.gauss(0.05, 0.3)] * 32 for _ in range(8)), [])]
           for _ in range(2)]
    kl = [[0.01] * 256 for _ in range(2)]
    wide = ks.bootstrap_ci(row, ref, kl, block=32)
    narrow = ks.bootstrap_ci(row, ref, kl, block=1)
    assert wide["dppl_pct"] == pytest.approx(narrow["dppl_pct"])
    assert (wide["dppl_hi"] - wide["dppl_lo"]) > 3 * (narrow["dppl_hi"] - narrow["dppl_lo"])


def test_bootstrap_is_deterministic_and_checks_shapes():
    rng = random.Random(4)
    ref = _segments(rng, 2, 40, 2.0, 1.0)
    row = _segments(rng, 2, 40, 2.1, 1.0)
    kl = _segments(rng, 2, 40, 0.1, 0.01)
    assert ks.bootstrap_ci(row, ref, kl) == ks.bootstrap_ci(row, ref, kl)
    with pytest.raises(ValueError, match="segment 1 has 40/39/40"):
        ks.bootstrap_ci(row, [ref[0], ref[1][:-1]], kl)
    with pytest.raises(ValueError, match="segments"):
        ks.bootstrap_ci(row, ref[:1], kl)


def test_segment_dppl():
    ref = [[1.0, 1.0], [2.0, 2.0]]
    row = [[1.1, 1.1], [2.0, 2.0]]
    got = ks.segment_dppl(row, ref)
    assert got[0] == pytest.approx(100 * math.expm1(0.1))
    assert got[1] == 0.0


# ---- onset-counted agreement ----------------------------------------------------------------

def test_onset_index():
    # KIVI (flush 128, no sinks) after a 512-token prompt: quantized in the prompt's APPEND,
    # which the forward of generated token 1 makes; token 0 came from the prefill (exact).
    assert ks.onset_index(128, 512, 128) == 1
    # fp16 / lossless / evicting rows (onset 0): from token 1 too.
    assert ks.onset_index(0, 512, 128) == 1
    # An onset past the prompt: token g sees prompt + g - 1 tokens held.
    assert ks.onset_index(600, 512, 128) == 89
    # Nothing quantized within the generation, or never.
    assert ks.onset_index(640, 512, 128) is None
    assert ks.onset_index(-1, 512, 128) is None


def test_agreement_counts_from_the_onset_only():
    ref = [5, 6, 7, 8, 9, 10, 11, 12]
    # Differs at index 1, before the onset (impossible for a real quantizer, here to prove the
    # count starts at the onset), and at index 6.
    got = [5, 0, 7, 8, 9, 10, 0, 12]
    a = ks.agreement(ref, got, 4)
    assert a["greedy_agree"] == pytest.approx(3 / 4)
    assert a["greedy_first_div"] == 6
    assert a["greedy_counted"] == 4 and a["greedy_from"] == 4
    whole = ks.agreement(ref, got, 0)
    assert whole["greedy_first_div"] == 1 and whole["greedy_agree"] == pytest.approx(6 / 8)
    same = ks.agreement(ref, list(ref), 1)
    assert same["greedy_agree"] == 1.0 and same["greedy_first_div"] == -1
    none = ks.agreement(ref, got, None)
    assert none["greedy_agree"] is None and none["greedy_counted"] == 0


# ---- Pareto ---------------------------------------------------------------------------------

def _pt(name, mem, dppl, kind="kvctl", lo=None, hi=None):
    return {"row": name, "kind": kind, "memory_vs_fp16": mem, "dppl_pct": dppl,
            "dppl_lo": dppl - 1 if lo is None else lo, "dppl_hi": dppl + 1 if hi is None else hi,
            "kl_mean": max(dppl, 0) / 100, "kl_lo": 0.0, "kl_hi": max(dppl, 0) / 50}


def test_dominated_needs_no_more_memory_and_no_more_dppl():
    peer = _pt("kvpress_snapkv_25", 0.25, 6.0, "kvpress")
    assert ks.dominated(peer, [_pt("a", 0.26, 1.0), _pt("b", 0.2, 7.0)]) is None
    assert ks.dominated(peer, [_pt("a", 0.26, 1.0), _pt("c", 0.25, 6.0)])["row"] == "c"
    assert ks.dominated(peer, [_pt("d", 0.1, 2.0)])["row"] == "d"
    assert ks.dominated(peer, [peer]) is None  # Not by itself.


def test_frontier():
    pts = [_pt("a", 0.1, 10.0), _pt("b", 0.2, 5.0), _pt("c", 0.3, 6.0), _pt("d", 0.3, 1.0)]
    assert [p["row"] for p in ks.frontier(pts)] == ["a", "b", "d"]


def test_target_summary_bands_and_peer_dominance():
    results = [_pt("uncompressed", 2.0, 0.0), _pt("fp16", 1.0, 0.0),
               _pt("kivi4", 0.37, 0.3, lo=0.1, hi=0.6), _pt("kivi2", 0.24, 8.0),
               _pt("evict_rkv_25", 0.25, 4.0), _pt("joint", 0.12, 9.0),
               _pt("quanto4", 0.33, 1.5, "quanto"), _pt("kvpress_snapkv_25", 0.26, 3.0,
                                                        "kvpress")]
    s = {b["band"]: b for b in ks.target_summary(results)}
    assert s[0.375]["best"] == "kivi4" and s[0.375]["met"] and not s[0.375]["met_with_ci"]
    assert s[0.25]["best"] == "evict_rkv_25" and not s[0.25]["met"]
    assert s[0.125]["best"] == "joint" and not s[0.125]["met"]
    assert s[0.0625]["best"] is None and not s[0.0625]["met"]
    # quanto4 (0.33, +1.5) is dominated by nothing cheaper-and-better (kivi4 costs more),
    # kvpress SnapKV (0.26, +3.0) neither (R-KV is cheaper but worse).
    band = {p["row"]: p["dominated_by"] for p in s[0.375]["peers"]}
    assert band == {"quanto4": None, "kvpress_snapkv_25": None}
    assert not s[0.375]["peers_dominated"]
    assert s[0.25]["peers"] == [] and s[0.25]["peers_dominated"]
    results.append(_pt("rq", 0.2, 1.0))
    s = {b["band"]: b for b in ks.target_summary(results)}
    assert s[0.375]["peers_dominated"] and s[0.25]["best"] == "rq" and s[0.25]["met"]


# ---- outputs --------------------------------------------------------------------------------

def _result_rows():
    rng = random.Random(5)
    ref = _segments(rng, 2, 64, 3.0, 1.0)
    rows = []
    for name, kind, mem, shift in (("uncompressed", "kvctl", 2.0, 0.0), ("kivi2", "kvctl", 0.3,
                                                                          0.1),
                                   ("kivi4", "kvctl", 0.4, 0.01), ("evict_rkv_25", "kvctl", 0.25,
                                                                   0.05),
                                   ("kvpress_snapkv_25", "kvpress", 0.27, 0.04),
                                   ("turbo3", "kvctl", 0.22, 0.03)):
        nll = [[x + shift for x in seg] for seg in ref]
        kl = [[shift] * len(seg) for seg in ref]
        r = {"row": name, "kind": kind, "memory_vs_fp16": mem, "payload_vs_fp16": mem * 0.9,
             "bits_per_element": 16 * mem, "reserved_bits_per_element": None, "ppl": 1.0,
             "top1_agree": 1.0, "quant_onset_tokens": 0, "greedy_agree": 1.0, "greedy_from": 1,
             "greedy_first_div": -1, "wall_s": 1.0, "nll": nll, "kl": kl, "top1": [[1]], "gen": []}
        r.update(ks.bootstrap_ci(nll, ref, kl))
        rows.append(r)
    meta = {"text": "t", "label": "synthetic", "tokens": 256, "segments": 2, "scored": 64,
            "prompt_tokens": 128, "gen_tokens": 16, "segment_starts": [0, 300]}
    return rows, meta


def test_outputs_render_again_from_the_saved_json(tmp_path):
    rows, meta = _result_rows()
    summary = kveval_output.write_outputs(rows, str(tmp_path / "run"), meta)
    assert "kvpress_snapkv_25 (0.270, +4.08 %): dominated by turbo3" in summary
    svg = (tmp_path / "run" / "pareto.svg").read_text()
    xml.dom.minidom.parseString(svg)  # Well-formed.
    for label in ("KIVI", "R-KV (evict)", "TurboQuant", "peer: kvpress SnapKV"):
        assert label in svg
    assert "uncompressed:" not in svg  # The 2.0 reference is not plotted.
    md = (tmp_path / "run" / "quality.md").read_text()
    assert "| kivi2 | kvctl |" in md and "![Pareto" in md
    # --plot-from: the same files again into another folder, without the run.
    again = kveval_output.render_from_json(str(tmp_path / "run" / "quality.json"),
                                           str(tmp_path / "again"))
    assert again == summary
    assert (tmp_path / "again" / "pareto.svg").read_text() == svg
    saved = json.loads((tmp_path / "run" / "quality.json").read_text())
    assert [r["row"] for r in saved["rows"]] == [r["row"] for r in rows]


def test_merge_requires_the_same_reference(tmp_path):
    rows, meta = _result_rows()
    kveval_output.write_outputs(rows[:3], str(tmp_path / "dst"), meta)
    kveval_output.write_outputs([rows[0], rows[4]], str(tmp_path / "src"), meta)
    kveval_output.merge_outputs(str(tmp_path / "src"), str(tmp_path / "dst"),
                                ["kvpress_snapkv_25"], "cmd")
    merged = json.loads((tmp_path / "dst" / "quality.json").read_text())
    assert [r["row"] for r in merged["rows"]] == ["uncompressed", "kivi2", "kivi4",
                                                  "kvpress_snapkv_25"]
    other = [dict(rows[0], nll=[[x + 0.5 for x in s] for s in rows[0]["nll"]]), rows[4]]
    kveval_output.write_outputs(other, str(tmp_path / "bad"), meta)
    with pytest.raises(kveval_output.EvalError, match="not the same reference"):
        kveval_output.merge_outputs(str(tmp_path / "bad"), str(tmp_path / "dst"),
                                    ["kvpress_snapkv_25"], "cmd")


def test_family_names():
    assert kveval_svg.family({"row": "rq_kvarn_2.5", "kind": "kvctl"}) == "RateQuant"
    assert kveval_svg.family({"row": "turbo4_qjl", "kind": "kvctl"}) == "TurboQuant"
    assert kveval_svg.family({"row": "newthing_4", "kind": "kvctl"}) == "newthing"
    assert kveval_svg.family({"row": "hqq_4", "kind": "hqq"}) == "peer: hqq"
