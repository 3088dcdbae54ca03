# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""tools/hf_step_cost.py on the real model and a real daemon: the decode steps it times are the
fused ones it names, and the daemon's CPU is read from its process (issue 14's per-step cost)."""

import os
import sys

import pytest

import hf_common  # noqa: F401  (skips unless KVCTL_HF_TESTS=1 and the model stack is there)
from hf_common import TEXT
from helpers import kvctl_binary

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tools"))
import hf_step_cost  # noqa: E402


def test_step_cost_times_fused_steps_and_reads_the_daemon_cpu(smollm2):
    model, tokenizer = smollm2
    binary = kvctl_binary()
    ids = tokenizer(TEXT * 4, return_tensors="pt").input_ids[:, :72]
    out = hf_step_cost.measure(model, ids, 64, 8, "fused", {"quant.method": "kivi"}, binary,
                               settle_steps=3)
    assert out["fused_steps"] == 8
    by_step = out["daemon_cpu_ms_by_step"]
    assert len(by_step) == 8 and by_step[0] == pytest.approx(out["daemon_cpu_first_step_ms"])
    assert out["settle_steps"] == 3  # The steps after the first four, apart.
    assert out["daemon_cpu_ms_per_settled_step"] == pytest.approx(sum(by_step[4:]) / 4, rel=1e-9)
    assert out["daemon_cpu_settled_vs_engine_step"] > 0
    assert out["daemon_cpu_ms_per_step"] > 0  # Every APPEND is served by the daemon process.
    assert out["kvctl_step"]["p50_ms"] > 0 and out["dynamic_cache_step"]["p50_ms"] > 0
    assert out["daemon_cpu_vs_engine_step"] == pytest.approx(
        out["daemon_cpu_ms_per_step"] / out["kvctl_step"]["mean_ms"], rel=1e-9)
    assert len(out["daemon_cpu_step"]) == 3 and out["daemon_cpu_step"]["max_ms"] >= max(
        out["daemon_cpu_first_step_ms"], out["daemon_cpu_ms_per_later_step"])
    assert out["daemon_cpu_ms_per_step"] == pytest.approx(
        (out["daemon_cpu_first_step_ms"] + 7 * out["daemon_cpu_ms_per_later_step"]) / 8, rel=1e-9)
    # An evicting sequence whose scorer needs the queries: refused without them, served with.
    evict = {"quant.method": "fp16", "budget.mode": "evict-only", "evict.policy": "snapkv",
             "budget.token_fraction": "0.5"}
    with pytest.raises(Exception, match="q_heads: got 0"):
        hf_step_cost.measure(model, ids, 64, 2, "fused", evict, binary)
    scored = hf_step_cost.measure(model, ids, 64, 4, "fused", evict, binary, send_q=True)
    assert scored["send_q"] and scored["fused_steps"] == 4
    dense = hf_step_cost.measure(model, ids, 64, 4, "dense", {"quant.method": "kivi"}, binary)
    assert dense["fused_steps"] == 0
