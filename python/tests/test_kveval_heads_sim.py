# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""tools/kveval_heads_sim.py's kept sets on small synthetic inputs: the whole pairs kept whole, the
others sharing the same total (its copy events are kvctl.copy_heads', test_copy_heads.py). Pure
numpy: no model, no daemon."""

import os
import sys

import numpy as np

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "tools")
sys.path.insert(0, TOOLS)

import kveval_heads_sim as hs  # noqa: E402


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
