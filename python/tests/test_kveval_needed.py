# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""tools/kveval_needed_sim.py's kept set and tools/kveval_needed_report.py's proxy percentile on
synthetic attention: sinks and window always kept, the budget exact, the highest pooled scores
chosen, pooling spreading a peak to its neighbours. Pure numpy: no model, no daemon."""

import os
import sys

import numpy as np

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "tools")
sys.path.insert(0, TOOLS)

import kveval_needed_report as rep  # noqa: E402
import kveval_needed_sim as sim  # noqa: E402


def _obs(prefix=64, w=8, layers=2, heads=3, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.random((layers, heads, w, prefix)).astype(np.float32)
    return a / a.sum(-1, keepdims=True)


def test_keep_holds_sinks_window_and_exact_budget():
    obs = _obs()
    kept = sim.simulated_keep(obs, w=8, kernel=1, keep=30, sinks=4)
    assert kept.shape == (2, 3, 64)
    assert kept[:, :, :4].all() and kept[:, :, 56:].all()
    assert (kept.sum(-1) == 30).all()


def test_keep_without_pooling_takes_the_highest_window_scores():
    obs = _obs()
    kept = sim.simulated_keep(obs, w=8, kernel=1, keep=20, sinks=4)
    score = obs[:, :, -8:, :56].mean(2)
    for li in range(2):
        for h in range(3):
            want = set(4 + np.argsort(-score[li, h, 4:])[:8])
            got = set(np.nonzero(kept[li, h, 4:56])[0] + 4)
            assert got == want


def test_pooling_spreads_a_peak_to_its_neighbours():
    obs = np.full((1, 1, 4, 40), 1e-3, np.float32)
    obs[..., 20] = 1.0     # One peak among the candidates.
    obs[..., 10] = 0.5     # A lower one.
    # kernel 5: positions 18-22 share the peak's pooled score and outrank everything else.
    kept = sim.simulated_keep(obs, w=4, kernel=5, keep=4 + 4 + 5, sinks=4)
    assert kept[0, 0, 18:23].all() and not kept[0, 0, 10]
    # kernel 1: the two peaks themselves.
    kept = sim.simulated_keep(obs, w=4, kernel=1, keep=4 + 4 + 2, sinks=4)
    assert kept[0, 0, 20] and kept[0, 0, 10] and kept[0, 0, 4:36].sum() == 2


def test_percentile_orders_the_pooled_score():
    obs = np.zeros((1, 1, 2, 12), np.float32)
    obs[..., :10] = np.arange(10, dtype=np.float32)   # Rising score over the 10 candidates.
    pct = rep.proxy_percentile(obs, kernel=1)
    assert pct.shape == (1, 1, 10)
    assert pct[0, 0, 0] == 0.0 and pct[0, 0, -1] == 1.0
    assert (np.diff(pct[0, 0]) > 0).all()
