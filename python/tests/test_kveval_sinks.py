# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""tools/kveval_sinks.py: the sink/flush grid summary counts fp16 rows by the streaming rules,
recovers the quantized bits from a row's end-of-segment STATS, pools texts and compares two rows
on the same positions. No daemon, no model."""

import json
import os
import sys

import pytest

from helpers import PYTHON_DIR

sys.path.insert(0, os.path.join(os.path.dirname(PYTHON_DIR), "tools"))
import kveval_sinks  # noqa: E402


def test_parse_name_reads_grid_rows_only():
    assert kveval_sinks.parse_name("kvarn2_s32_f256") == {"method": "kvarn", "bits": 2,
                                                          "sinks": 32, "flush": 256}
    assert kveval_sinks.parse_name("turbo3_s0_f64")["bits"] == 3
    assert kveval_sinks.parse_name("kivi2") is None
    assert kveval_sinks.parse_name("joint_1of8_flush32") is None


def test_fp16_rows_follow_the_streaming_rules():
    # Sinks first, then a tail that empties every `flush` tokens.
    assert kveval_sinks.fp16_rows(10, 32, 128) == 10
    assert kveval_sinks.fp16_rows(32, 32, 128) == 32
    assert kveval_sinks.fp16_rows(159, 32, 128) == 159
    assert kveval_sinks.fp16_rows(160, 32, 128) == 32
    assert kveval_sinks.fp16_rows(2047, 0, 128) == 127
    assert kveval_sinks.fp16_rows(2047, 64, 128) == 127  # The end-of-segment coincidence.


def _row(name, sinks, flush, tokens, b_q):
    fp16 = kveval_sinks.fp16_rows(tokens, sinks, flush)
    bpe = (16.0 * fp16 + b_q * (tokens - fp16)) / tokens
    return {"row": name, "tokens_seen": tokens, "tokens_quantized": tokens - fp16,
            "bits_per_element": bpe}


def test_mean_memory_averages_over_the_scored_positions():
    # The same end state (127 fp16 rows at 2047 tokens) but 64 more fp16 rows on average.
    a = kveval_sinks.mean_memory(_row("kvarn2_s0_f128", 0, 128, 2047, 3.0), 2048, 256)
    b = kveval_sinks.mean_memory(_row("kvarn2_s64_f128", 64, 128, 2047, 3.0), 2048, 256)
    expect_a = sum((16 * (t % 128) + 3.0 * (t - t % 128)) / (16 * t)
                   for t in range(1792, 2048)) / 256
    assert a == pytest.approx(expect_a, rel=1e-12)
    # With 64 sinks the tail is 128 rows longer in the half of each cycle where t mod 128 < 64
    # (64 more on average), each row costing 16 - 3 bits instead of 3.
    extra = sum((128 if t % 128 < 64 else 0) * 13.0 / (16 * t) for t in range(1792, 2048)) / 256
    assert b - a == pytest.approx(extra, rel=1e-9)
    with pytest.raises(ValueError, match="nothing quantized"):
        kveval_sinks.mean_memory({"row": "kivi2_s0_f32", "tokens_seen": 20,
                                  "tokens_quantized": 0, "bits_per_element": 16.0}, 2048, 256)


def _result(name, nll, kl=0.0):
    return {"row": name, "nll": nll, "kl": [[kl] * len(s) for s in nll]}


def test_compare_pools_texts_and_pairs_rows(tmp_path):
    ref = [[1.0] * 64, [2.0] * 64]
    worse = [[1.1] * 64, [2.1] * 64]
    runs = []
    for text in ("prose", "code"):
        d = tmp_path / text
        d.mkdir()
        rows = [_result("uncompressed", ref), _result("kivi2_s0_f128", worse, 0.1),
                _result("kivi2_s32_f128", ref, 0.0)]
        (d / "quality.json").write_text(json.dumps(
            {"meta": {"label": text, "text": text, "tokens": 2048, "scored": 64}, "rows": rows}))
        runs.append(str(d))
    by_text = kveval_sinks.pooled(kveval_sinks.load_rows(runs), "label")
    assert sorted(by_text) == ["code", "prose"]
    vs_ref = kveval_sinks.compare(by_text, "kivi2_s0_f128", "uncompressed")
    assert vs_ref["ci_positions"] == 256
    assert vs_ref["dppl_pct"] == pytest.approx(100 * (2.718281828459045 ** 0.1 - 1), rel=1e-9)
    # Paired against the other row instead of the reference: the s32 row is 0.1 nats better.
    vs_row = kveval_sinks.compare(by_text, "kivi2_s32_f128", "kivi2_s0_f128")
    assert vs_row["dppl_pct"] == pytest.approx(100 * (2.718281828459045 ** -0.1 - 1), rel=1e-9)
    assert kveval_sinks.compare(by_text, "kivi2_s32_f128", "nope") is None


def test_pooled_refuses_a_row_that_scored_differently_twice(tmp_path):
    runs = []
    for i, nll in enumerate(([[1.0]], [[1.5]])):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "quality.json").write_text(json.dumps(
            {"meta": {"label": "prose", "text": "prose", "tokens": 2048, "scored": 1},
             "rows": [_result("kivi2_s0_f128", nll)]}))
        runs.append(str(d))
    with pytest.raises(ValueError, match="different NLL"):
        kveval_sinks.pooled(kveval_sinks.load_rows(runs), "label")
