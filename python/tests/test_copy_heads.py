# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kvctl.copy_heads without a model: copy events of small token sequences (known answers), the
ranking and the evict.full_heads value it prints, which the daemon's config check accepts."""

import os
import subprocess

import numpy as np
import pytest

from kvctl import copy_heads

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_copy_events_point_at_the_token_after_each_earlier_occurrence():
    #        0  1  2  3  4  5  6  7  8
    ids = np.array([5, 6, 7, 5, 6, 9, 5, 6, 7])
    events = copy_heads.copy_events(ids, start=0)
    # t = 3: (5, 6) occurred at 0 -> source 1. t = 6: at 0 and 3 -> sources 1 and 4.
    # t = 7: (6, 7) occurred at 1 -> source 2. Nothing else repeats a pair.
    assert events == {3: [1], 6: [1, 4], 7: [2]}
    assert copy_heads.copy_events(ids, start=7) == {7: [2]}


def test_copy_events_skip_a_run_of_one_token():
    # (4, 4) at t = 1 repeats (4, 4) at 0, whose source would be t itself: not an event.
    events = copy_heads.copy_events(np.array([4, 4, 4, 4]), start=0)
    assert 1 not in events
    assert events[2] == [1]


def test_top_pairs_by_score_then_position():
    scores = np.array([[0.1, 0.5, 0.0],
                       [0.5, 0.2, 0.9]])
    pairs = copy_heads.top_pairs(scores, 3)
    assert [(l, h) for l, h, _ in pairs] == [(1, 2), (0, 1), (1, 0)]  # 0.5 tie: (0, 1) first.
    assert copy_heads.full_heads_value(pairs) == "1:2,0:1,1:0"


def test_printed_value_is_accepted_by_the_daemon():
    kvctl = os.environ.get("KVCTL_BIN")
    if not kvctl:
        pytest.skip("KVCTL_BIN not set (CTest sets it)")
    value = copy_heads.full_heads_value(copy_heads.top_pairs(np.arange(90.).reshape(30, 3), 9))
    assert value == "29:2,29:1,29:0,28:2,28:1,28:0,27:2,27:1,27:0"
    recipe = os.path.join(REPO, "configs", "rkv-turbo-1of8.toml")
    r = subprocess.run([kvctl, "--check-config", recipe, "--set", "evict.full_heads=" + value],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
