# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Sessions with an end and clients that survive a daemon crash, against the real daemon: BYE
from bye(), disconnect() and KvctlCache.close(); a daemon killed with SIGKILL and started again
with the same settings; SessionLostError from the client and from KvctlCache, which starts over
by itself."""

import time

import numpy as np
import pytest

import kvctl
from helpers import random_kv, wait_for

LONG_LEASE_MS = 600000  # Nothing here may be freed by a lease.


def _stats(observer, section):
    return observer.stats(section)[section]


def _raw_ping(client, session_id):
    """PING with an explicit session id, bypassing the client's own session bookkeeping."""
    return client.call_raw(kvctl.protocol.encode_ping(0, session_id))


def test_bye_frees_everything_at_once_and_the_id_is_then_unknown(daemon_factory, connect):
    d = daemon_factory(server__lease_ms=LONG_LEASE_MS)
    observer = connect(d)
    c = connect(d)
    s = c.hello(2, 2, 64, dtype="float16")
    k, v = random_kv(2, 50, 2, 64, dtype=np.float16)
    for seq in (1, 2):
        c.open(seq)
        c.append(seq, k, v, use_staging=seq == 2)
    assert _stats(observer, "pool")["pages_used"] > 0
    assert _stats(observer, "pool")["staging_slots_used"] == 1
    reply = c.bye()
    assert reply.sequences_closed == 2 and reply.bytes_freed > 0
    assert c.session is None
    pool, seqs = _stats(observer, "pool"), _stats(observer, "sequences")
    assert (pool["pages_used"], pool["staging_slots_used"]) == (0, 0)
    assert (seqs["sessions"], seqs["sessions_ended_total"], seqs["sessions_expired_total"]) == \
        (0, 1, 0)
    with pytest.raises(kvctl.ServerError) as e:
        _raw_ping(observer, s.session_id)
    assert e.value.code == "NOT_FOUND" and e.value.message.startswith("session_id:")
    with pytest.raises(kvctl.KvctlError, match="no session"):
        c.bye()
    c.hello(1, 1, 8, dtype="float32")  # The same client starts a new session.
    c.open(1)


def test_disconnect_and_with_block_end_the_session(daemon_factory, connect):
    d = daemon_factory(server__lease_ms=LONG_LEASE_MS)
    observer = connect(d)
    with kvctl.Client(d.endpoint, timeout_ms=5000) as c:
        c.hello(1, 1, 64, dtype="float16")
        c.open(1)
        c.append(1, *random_kv(1, 20, 1, 64, dtype=np.float16))
        assert _stats(observer, "sequences")["sessions"] == 1
    seqs = _stats(observer, "sequences")
    assert (seqs["sessions"], seqs["sessions_ended_total"], seqs["sequences"]) == (0, 1, 0)
    assert _stats(observer, "pool")["pages_used"] == 0
    # No session, no BYE: nothing is counted.
    kvctl.Client(d.endpoint).disconnect()
    assert _stats(observer, "sequences")["sessions_ended_total"] == 1


def test_disconnect_returns_when_the_daemon_is_gone(daemon_factory):
    d = daemon_factory()
    c = kvctl.Client(d.endpoint, timeout_ms=60000)
    c.hello(1, 1, 64, dtype="float16")
    d.stop()
    c.disconnect()  # BYE waits at most 2 s, not the client's 60 s; the session is not leaked.
    with pytest.raises(kvctl.KvctlError, match="disconnected"):
        c.ping()


def _attached_client(d, seq_tokens):
    c = kvctl.Client(d.endpoint, timeout_ms=5000)
    c.hello(2, 2, 64, dtype="float16")
    k, v = random_kv(2, seq_tokens, 2, 64, dtype=np.float16)
    for seq in (1, 2):
        c.open(seq)
        c.append(seq, k, v, use_staging=seq == 2)
    return c, k, v


def test_client_after_kill9_and_restart_gets_named_errors_then_works(daemon_factory):
    d = daemon_factory()
    c, k, v = _attached_client(d, 30)
    old = c.session
    try:
        d.crash()
        c.timeout_ms = 300
        with pytest.raises(kvctl.Timeout, match="daemon down, restarting or stuck"):
            c.fetch(1)
        t0 = time.monotonic()
        d.start()  # The same settings: the dead daemon's shm object and sockets are in the way.
        print("restart after SIGKILL: serving after %.3f s" % (time.monotonic() - t0))
        c.timeout_ms = 5000
        with pytest.raises(kvctl.SessionLostError) as e:
            c.append(1, k[:, :1], v[:, :1])
        lost = e.value
        assert lost.code == "NOT_FOUND" and lost.session_id == old.session_id
        assert (lost.tokens_lost, lost.sequences_lost) == (60, 2)
        assert "60 tokens of cached data in 2 sequence(s) were lost" in str(lost)
        s = c.rehello()
        assert s.session_id != old.session_id and (s.layers, s.kv_heads) == (2, 2)
        for seq in (1, 2):
            c.open(seq)
            c.append(seq, k, v, use_staging=seq == 2)  # The staging slot of the new pool.
            fk, fv, pos = c.fetch(seq, stacked=True, dtype="float16")
            assert pos.tolist() == list(range(30)) and np.array_equal(fv, v)
    finally:
        c.disconnect()


def test_staging_append_after_another_call_found_the_session_lost_is_session_lost(
        daemon_factory):
    """A PING (KvctlCache's keepalive thread) finds the restarted daemon's session gone first,
    which unmaps the dead daemon's staging slot: the next staging APPEND goes inline and gets
    SessionLostError, not an error about a missing shm object."""
    d = daemon_factory()
    c, k, v = _attached_client(d, 30)  # Sequence 2 appended through the staging slot.
    try:
        d.crash()
        d.start()
        with pytest.raises(kvctl.SessionLostError):
            c.ping()
        with pytest.raises(kvctl.SessionLostError):
            c.append(2, k[:, :1], v[:, :1], use_staging=True)
        assert c.staging_fallbacks == 1
        c.rehello()
        c.open(2)
        c.append(2, k, v, use_staging=True)
        assert c.staging_fallbacks == 1  # The new session's slot maps.
    finally:
        c.disconnect()


def test_lease_expiry_is_a_session_lost_error_too(daemon_factory, connect):
    d = daemon_factory(server__lease_ms=300)
    observer = connect(d)
    c = connect(d)
    c.hello(1, 1, 8, dtype="float32")
    c.open(1)
    c.append(1, np.ones((1, 4, 1, 8), np.float32), np.ones((1, 4, 1, 8), np.float32))
    assert wait_for(lambda: _stats(observer, "sequences")["sessions_expired_total"] == 1, 10)
    with pytest.raises(kvctl.SessionLostError) as e:
        c.fetch(1)
    assert e.value.tokens_lost == 4
    c.rehello()
    c.open(1)
    assert c.append(1, np.ones((1, 2, 1, 8), np.float32),
                    np.ones((1, 2, 1, 8), np.float32)).tokens_total == 2


# ---- KvctlCache: the HF cache without a model (its layers driven directly) ------------------


def _tiny_config():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    return transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, hidden_size=64, vocab_size=32)


def _step(cache, n, seed):
    """One forward step as a model runs it: update() of every layer with n new tokens; returns
    what layer 1 attends to (keys) and the keys sent."""
    import torch

    g = torch.Generator().manual_seed(seed)
    sent, keys = [], None
    for layer in range(cache.n_layers):
        k = torch.randn(1, cache.kv_heads, n, cache.head_dim, generator=g)
        v = torch.randn(1, cache.kv_heads, n, cache.head_dim, generator=g)
        keys, _ = cache.update(k, v, layer)
        sent.append(k)
    return keys, sent


def test_hf_cache_after_kill9_raises_session_lost_then_starts_over(daemon_factory):
    import torch
    from kvctl.hf import KvctlCache

    config = _tiny_config()
    d = daemon_factory(quant__lossless=True, server__lease_ms=LONG_LEASE_MS)
    observer = kvctl.Client(d.endpoint)
    cache = KvctlCache(config=config, client=d.endpoint, dtype="float32", keepalive=False)
    try:
        prompt, _ = _step(cache, 10, seed=1)
        keys, _ = _step(cache, 1, seed=2)  # Sends the prompt, fetches it back.
        assert keys.shape[2] == 11 and cache.get_seq_length() == 11
        d.crash()
        d.start()
        with pytest.raises(kvctl.SessionLostError) as e:
            _step(cache, 1, seed=3)
        assert e.value.tokens_lost == 11 and e.value.sequences_lost == 1
        assert "restart the generation" in str(e.value)
        assert cache.get_seq_length() == 0 and cache.sessions_lost == 1
        # The next use works, from nothing: a new prompt, and only its rows come back.
        new_prompt, _ = _step(cache, 5, seed=4)
        keys, sent = _step(cache, 1, seed=5)
        assert keys.shape[2] == 6
        assert torch.equal(keys[:, :, :5], new_prompt[:, :, :5])
        cache.sync()
        assert cache.stats(section="sequences")["sequences"]["tokens"] == 6
    finally:
        freed = cache.close()
    assert freed > 0
    seqs = _stats(observer, "sequences")
    assert (seqs["sessions"], seqs["sessions_ended_total"]) == (0, 1)
    observer.disconnect()


def test_hf_cache_used_while_the_daemon_is_down_times_out_then_recovers(daemon_factory):
    from kvctl.hf import KvctlCache

    config = _tiny_config()
    d = daemon_factory(quant__lossless=True)
    cache = KvctlCache(config=config, client=d.endpoint, dtype="float32", keepalive=False,
                       timeout_ms=500)
    try:
        _step(cache, 4, seed=1)
        d.crash()
        # Whether the step's APPEND got through is unknown: the cache drops what it held.
        with pytest.raises(kvctl.Timeout, match="4 cached tokens dropped, restart the generation"):
            _step(cache, 1, seed=2)
        assert cache.get_seq_length() == 0
        with pytest.raises(kvctl.Timeout):  # Still down: no session to start.
            _step(cache, 2, seed=3)
        d.start()
        prompt, _ = _step(cache, 3, seed=4)  # The next use starts a new session.
        keys, _ = _step(cache, 1, seed=5)
        assert keys.shape[2] == 4 and torch_equal(keys[:, :, :3], prompt[:, :, :3])
        cache.sync()
        assert cache.stats(section="sequences")["sequences"]["tokens"] == 4
    finally:
        cache.close()


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)
