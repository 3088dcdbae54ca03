# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Client.save_prefix and Client.open_prefix (PROTOCOL.md 4.9, 4.10) against a real daemon
without a cluster tier (tier.nodes = ""): a saved prefix is kept in the daemon's local prefix
cache and restored from it; OPEN_PREFIX of an unknown prompt opens the sequence empty; with the
cache off too SAVE_PREFIX is refused with FAILED_PRECONDITION. The restore through a real Redis
Cluster is tested in test_hf_prefix.py."""

import os
import subprocess
import sys

import numpy as np
import pytest

import kvctl
from helpers import REPO, kvctl_binary, random_kv


def _hello(c):
    return c.hello(layers=2, kv_heads=1, head_dim=64, dtype="float32")


def test_open_prefix_without_a_tier_opens_the_sequence_empty(lossless_daemon, connect):
    c = connect(lossless_daemon)
    _hello(c)
    assert c.open_prefix(1, np.arange(40, dtype=np.int32)) == 0
    # The sequence is open and empty: the first APPEND goes to position 0 by default.
    k, v = random_kv(2, 5, 1, 64)
    reply = c.append(1, k, v)
    assert reply.tokens_total == 5
    got = c.fetch(1, stacked=True)
    np.testing.assert_array_equal(got.positions, np.arange(5))
    np.testing.assert_array_equal(got.k, k)
    # OPEN_PREFIX's errors are OPEN's: the id is taken now.
    with pytest.raises(kvctl.ServerError) as e:
        c.open_prefix(1, [1, 2, 3])
    assert e.value.code == "ALREADY_EXISTS" and e.value.request == "OPEN_PREFIX"
    c.close(1)


def test_save_prefix_without_a_tier_or_cache_is_failed_precondition_naming_the_setting(
        daemon_factory, connect):
    c = connect(daemon_factory(quant__lossless=True, tier__local_prefix_fraction=0))
    _hello(c)
    c.open(1)
    k, v = random_kv(2, 4, 1, 64)
    c.append(1, k, v)
    with pytest.raises(kvctl.ServerError) as e:
        c.save_prefix(1, [10, 11, 12, 13])
    assert e.value.code == "FAILED_PRECONDITION" and e.value.request == "SAVE_PREFIX"
    assert "keeps no prefixes" in e.value.message and "tier.nodes" in e.value.message
    # A sequence that is not open is named before the missing tier.
    with pytest.raises(kvctl.ServerError) as e:
        c.save_prefix(99, [1])
    assert e.value.code == "NOT_FOUND" and "99" in e.value.message
    # Nothing changed in the sequence.
    assert c.fetch(1, stacked=True).positions.tolist() == [0, 1, 2, 3]


def test_one_daemon_restores_a_saved_prefix_from_its_pool(lossless_daemon, connect):
    c = connect(lossless_daemon)
    _hello(c)
    c.open(1)
    k, v = random_kv(2, 40, 1, 64)
    c.append(1, k, v)
    ids = np.arange(500, 540, dtype=np.int32)
    saved, stored = c.save_prefix(1, ids)
    assert saved == 32 and stored > 0  # The longest multiple of tier.prefix_block_tokens (16).
    longer = np.concatenate([ids, [7, 8, 9]]).astype(np.int32)
    assert c.open_prefix(2, longer) == 32
    got = c.fetch(2, stacked=True)
    np.testing.assert_array_equal(got.positions, np.arange(32))
    np.testing.assert_array_equal(got.k, k[:, :32])
    np.testing.assert_array_equal(got.v, v[:, :32])
    assert c.stats("sequences")["sequences"]["kv_shared_bytes"] > 0
    other = longer.copy()
    other[3] += 1
    assert c.open_prefix(3, other) == 0
    for seq in (1, 2, 3):
        c.close(seq)


def test_prefix_calls_check_their_arguments_before_sending(lossless_daemon, connect):
    c = connect(lossless_daemon)
    with pytest.raises(kvctl.KvctlError, match="hello"):
        c.open_prefix(1, [1])
    _hello(c)
    with pytest.raises(ValueError, match=r"tokens\[0\]: got -5"):
        c.save_prefix(1, [-5])
    with pytest.raises(ValueError, match="tokens: got 0 ids"):
        c.open_prefix(1, [])
    assert c.socket_resets == 0
    # Still usable: nothing was sent.
    assert c.open_prefix(2, [3]) == 0


def test_tier_ttft_fails_with_a_clear_message_without_a_cluster(workdir):
    """tools/tier_ttft.py needs a Redis Cluster and a daemon with the tier; without them it
    exits 1 naming what is missing, before loading any model."""
    script = os.path.join(REPO, "tools", "tier_ttft.py")
    env = dict(os.environ, KVCTL_TEST_TIER_NODES="")
    run = subprocess.run([sys.executable, script, "--kvctl", kvctl_binary()], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "no Redis Cluster: pass --nodes" in run.stderr
    run = subprocess.run([sys.executable, script, "--nodes", "127.0.0.1:1", "--quant", "zip"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "--quant: got 'zip'" in run.stderr
