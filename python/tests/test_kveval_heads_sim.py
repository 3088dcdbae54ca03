# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""tools/kveval_heads_sim.py's copy events and kept sets on small synthetic inputs: the sources of
a repeated token pair, the whole pairs kept whole, the others sharing the same total. Pure numpy:
no model, no daemon."""

import os
import sys

import numpy as np

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "tools")
sys.path.insert(0, TOOLS)

import kveval_heads_sim as hs  # noqa: E402


def test_copy_events_point_at_the_token_after_each_earlier_occurrence():
    #        0  1  2  3  4  5  6  7  8
    ids = np.array([5, 6, 7, 5, 6, 9, 5, 6, 7])
    events = hs.copy_events(ids, start=0)
    # t = 3: (5, 6) occurred at 0 -> source 1. t = 6: at 0 and 3 -> sources 1 and 4.
    # t = 7: (6, 7) occurred at 1 -> source 2. Nothing else repeats a pair.
    assert events == {3: [1], 6: [1, 4], 7: [2]}
    assert hs.copy_events(ids, start=7) == {7: [2]}


def test_copy_events_skip_a_run_of_one_token():
    # (4, 4) at t = 1 repeats (4, 4) at 0, whose source would be t itself: not an event.
    events = hs.copy_events(np.array([4, 4, 4, 4]), start=0)
    assert 1 not in events
    assert events[2] == [1]


def test_kept_sets_keep_whole_pairs_and_the_same_total():
    rng = np.random.default_rng(0)
    layers, heads, w, prefix = 2, 3, 32, 200
    obs = rng.random((layers, heads, w, prefix)).astype(np.float32)
    obs /= obs.sum(-1, keepdims=True)
    order = np.array([4, 0, 1, 2, 3, 5])  # Pair 4 = (layer 1, head 1) first.
    uniform, rest0 = hs.kept_sets(obs, 0.5, 0, order)
    assert rest0 == 100 and (uniform.sum(-1) == 100).all()
    kept, rest = hs.kept_sets(obs, 0.5, 1, order)
    assert kept[1, 1].all()
    assert rest == (6 * 100 - 200) // 5
    others = [kept[li, h].sum() for li in range(layers) for h in range(heads) if (li, h) != (1, 1)]
    assert all(n == rest for n in others)
    assert kept.sum() <= uniform.sum()
