# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Pool pressure through the real daemon (budget.pressure, docs/budgets.md): a 1 MiB pool of
16 KiB pages and KIVI 8-bit records, filled chunk by chunk with synthetic K/V. With "fail" an
APPEND ends in RESOURCE_EXHAUSTED naming the pages and the sequence is unchanged; with
"requantize" the same APPENDs go further because stored heads are re-quantized narrower, every
token stays readable, and the lowered heads' records in the pool decode to the dense FETCH."""

import numpy as np
import pytest

import kvctl
from helpers import random_kv, relative_mse

LAYERS, HEADS, DIM = 4, 2, 64
CHUNK = 64     # Tokens per APPEND; KIVI flushes 128 tail rows into 4 records of 32 tokens.
TOTAL = 4096   # More than the 60 pages hold even at 2 bits (1984 tokens).
PAGE = 16 << 10


def pressure_daemon(daemon_factory, pressure: str, **settings):
    # 1 MiB is the smallest pool.bytes; one 64 KiB staging slot leaves 60 pages. 8-bit records
    # (4608 B) pack 3 to a page, 4-bit (2560 B) 6, 2-bit (1536 B) 10. KIVI without sinks (set
    # explicitly, not the registry's default): the page counts and record positions below assume
    # every token after the tail is a record.
    return daemon_factory(pool__bytes="1MiB", pool__page_bytes="16KiB", pool__staging_slots=1,
                          pool__staging_bytes_per_session="64KiB", quant__method="kivi",
                          quant__k_bits=8, quant__v_bits=8, quant__sink_tokens=0,
                          budget__pressure=pressure, **settings)


def fill(client, k, v):
    """APPENDs k, v CHUNK tokens at a time until one fails or all are in. Returns (tokens
    stored, the failed APPEND's error or None, dense FETCH right before the failed APPEND)."""
    stored, before = 0, None
    while stored < TOTAL:
        before = client.fetch(1, stacked=True)
        try:
            client.append(1, k[:, stored:stored + CHUNK], v[:, stored:stored + CHUNK])
        except kvctl.ServerError as e:
            return stored, e, before
        stored += CHUNK
    return stored, None, None


def entities(stats: dict, section: str, prefix: str) -> dict:
    """The entity lines of one STATS section (parsed: {key: int | float | str} each)."""
    return {name: value for name, value in stats[section].items() if name.startswith(prefix)}


def session(connect, daemon):
    c = connect(daemon)
    c.hello(LAYERS, HEADS, DIM, dtype="float16")
    c.open(1)
    return c


@pytest.fixture(scope="module")
def data():
    return random_kv(LAYERS, TOTAL, HEADS, DIM, seed=21, dtype=np.float16)


def test_pressure_fail_refuses_the_append_and_keeps_the_sequence(daemon_factory, connect, data):
    k, v = data
    c = session(connect, pressure_daemon(daemon_factory, "fail"))
    stored, err, before = fill(c, k, v)
    assert err is not None, "a 1 MiB pool took %d tokens of KIVI 8-bit" % stored
    assert err.code == "RESOURCE_EXHAUSTED", err
    assert "needs" in err.message and "pool pages of %d bytes" % PAGE in err.message, err
    assert "budget.pressure" not in err.message, err  # No relief was tried.
    # 60 pages, 7.5 per head: up to 2 of fp16 tail rows (64 rows of K+V per page), the rest 3
    # records of 32 tokens each, so about 18 records and the tail (576 tokens here).
    assert 512 <= stored <= 768, stored
    after = c.fetch(1, stacked=True)
    for x, y in zip(before, after):
        assert np.array_equal(x, y), "the refused APPEND changed the sequence"
    assert after.positions.tolist() == list(range(stored))
    stats = c.stats()
    seq = entities(stats, "sequences", "seq_")
    assert [s["pressure_reliefs"] for s in seq.values()] == [0], seq
    heads = entities(stats, "heads", "head_")
    assert {(h["k_bits"], h["v_bits"], h["width_lowerings"]) for h in heads.values()} == {
        (8, 8, 0)}, heads
    assert stats["policy"]["budget_pressure"] == "fail"
    c.close(1)


def test_pressure_requantize_lowers_widths_and_keeps_every_token(daemon_factory, connect, data):
    k, v = data
    refused = session(connect, pressure_daemon(daemon_factory, "fail"))
    limit, _, _ = fill(refused, k, v)
    refused.close(1)
    c = session(connect, pressure_daemon(daemon_factory, "requantize"))
    stored, err, _ = fill(c, k, v)
    # At 2 bits the same pages hold over three times the records (1984 tokens against 576 here).
    assert stored >= 3 * limit, (stored, limit, err)
    # It ends when even every head at the narrowest width could not free the next shortfall (then
    # nothing is lowered, so some heads may stay above 2 bits).
    assert err is not None and err.code == "RESOURCE_EXHAUSTED", err
    assert ("budget.pressure: lowering every head to its narrowest width >= 2 bits"
            in err.message), err
    stats = c.stats()
    seq = entities(stats, "sequences", "seq_")
    reliefs = next(iter(seq.values()))["pressure_reliefs"]
    assert reliefs >= 1, seq
    heads = entities(stats, "heads", "head_")
    for name, h in heads.items():
        assert h["width_lowerings"] >= 1, (name, h)
        assert h["k_bits"] in (2, 3, 4) and h["v_bits"] in (2, 3, 4), (name, h)
        assert h["requantized"] > 0, (name, h)
    assert stats["policy"]["budget_pressure"] == "requantize"
    fk, fv, pos = c.fetch(1, stacked=True)
    assert pos.tolist() == list(range(stored)), "a token went missing"
    assert fk.shape == (LAYERS, stored, HEADS, DIM)
    # Not garbage: no worse than KIVI 2-bit straight from the data (a daemon with room for it)
    # plus a little for the compounding of 8 -> lower re-quantization, no better than 8-bit.
    want_k, want_v = k[:, :stored].astype(np.float32), v[:, :stored].astype(np.float32)
    errors = {}
    for bits in (2, 8):
        direct = connect(daemon_factory(quant__method="kivi", quant__k_bits=bits,
                                        quant__v_bits=bits, quant__sink_tokens=0))
        direct.hello(LAYERS, HEADS, DIM, dtype="float16")
        direct.open(1)
        direct.append(1, k[:, :stored], v[:, :stored])
        dk, dv, _ = direct.fetch(1, stacked=True)
        errors[bits] = (relative_mse(dk, want_k), relative_mse(dv, want_v))
    got = (relative_mse(fk, want_k), relative_mse(fv, want_v))
    for i in (0, 1):
        assert errors[8][i] < got[i] <= 1.25 * errors[2][i], (got, errors)
    c.close(1)


def test_pressure_requantize_survives_a_flush_right_after_lowering(daemon_factory, connect):
    """SmolLM2-135M's geometry (30 layers x 3 KV heads), KIVI 8-bit, 495 pages of 32 KiB (55 %
    of the 900 that 2047 tokens need at 8 bits; all-4-bit needs 540): a 1024-token prefill,
    then one token per APPEND. With widths down to 2 bits available this fits. It used to fail at
    token 1279 (a flush of 128 tail rows into 4 records per head right after a relief whose
    lowered heads had no page slack left): reliefs now repeat up to 3 times per APPEND and the
    pages an APPEND releases count toward what it needs."""
    d = daemon_factory(pool__bytes=str(495 * 32768 + (1 << 20)), pool__page_bytes="32KiB",
                       pool__staging_slots=1, pool__staging_bytes_per_session="1MiB",
                       quant__method="kivi", quant__k_bits=8, quant__v_bits=8,
                       quant__sink_tokens=0, budget__pressure="requantize")
    c = connect(d, timeout_ms=30000)
    c.hello(30, 3, 64, dtype="float16")
    c.open(1)
    k, v = random_kv(30, 2047, 3, 64, seed=5, dtype=np.float16)
    c.append(1, k[:, :1024], v[:, :1024])
    err = None
    for t in range(1024, 2047):
        try:
            c.append(1, k[:, t:t + 1], v[:, t:t + 1])
        except kvctl.ServerError as e:
            err = e
            break
    widths = sorted((h["k_bits"], h["v_bits"])
                    for h in entities(c.stats("heads"), "heads", "head_").values())
    assert err is None, "token %d: %s; widths %s" % (t, err, widths)
    c.close(1)


def test_pressure_lowered_heads_records_decode_to_the_dense_fetch(daemon_factory, connect, data):
    """The blocks FETCH after reliefs: every pair's records, read from the pool at the offsets
    its own layout gives (narrower heads pack more records per page), dequantize with the torch
    extension to exactly the dense FETCH of the quantized tokens."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from kvctl import torch_ops as ops
    if not ops.available():
        pytest.skip("kvctl torch extension not built (target kvctl_torch, or KVCTL_TORCH_LIB)")
    from kvctl.pool_view import PoolView

    k, v = data
    c = session(connect, pressure_daemon(daemon_factory, "requantize"))
    stored = 0
    while stored < TOTAL:  # Fill until relief has run, then stop before the pool is full.
        c.append(1, k[:, stored:stored + CHUNK], v[:, stored:stored + CHUNK])
        stored += CHUNK
        seq = entities(c.stats("sequences"), "sequences", "seq_")
        if next(iter(seq.values()))["pressure_reliefs"] >= 1:
            break
    blocks = c.fetch_blocks(1)
    widths = {(lay.k_bits, lay.v_bits) for lay in blocks.layouts}
    assert (8, 8) not in widths or len(widths) > 1, widths  # Some head was lowered.
    for lay in blocks.layouts:  # Each width packs its own records per page (3 at 8 bits).
        assert lay.records_per_page == PAGE // lay.record_bytes, lay
    fk, fv, pos = c.fetch(1, dtype="float32", stacked=True)
    lowered = 0
    with PoolView.from_client(c) as view:
        for pair in range(LAYERS * HEADS):
            layer, h = divmod(pair, HEADS)
            lay = blocks.layouts[int(blocks.layout_index[pair])]
            lowered += (lay.k_bits, lay.v_bits) != (8, 8)
            recs = view.pair_records(blocks, pair)
            n = len(recs) * blocks.block_tokens
            assert n == blocks.quantized_counts[pair] > 0
            kd, vd = ops.dequantize(torch.stack(recs).unsqueeze(0), "kivi", DIM, lay.k_bits,
                                    lay.v_bits, block_tokens=blocks.block_tokens)
            what = "pair %d at K%d V%d" % (pair, lay.k_bits, lay.v_bits)
            # KIVI has no sinks: the records are the first n tokens.
            assert torch.equal(kd[:, 0], torch.from_numpy(fk[layer, :n, h])), what
            assert torch.equal(vd[:, 0], torch.from_numpy(fv[layer, :n, h])), what
    assert lowered >= 1
    c.close(1)


def test_pressure_pool_scope_lowers_other_sequences(daemon_factory, connect, data):
    """budget.pressure_scope = "pool": when an APPEND still lacks pages after lowering its own
    sequence, the daemon lowers other open sequences' stored widths. A holds 448 tokens at 8
    bits (most of the pool); B then appends chunk by chunk. With scope "sequence" B stops once
    its own heads are at 2 bits; with "pool" it goes further because A's heads are lowered, and
    A keeps every token."""
    k, v = data
    reached, lowered = {}, {}
    for scope in ("sequence", "pool"):
        d = pressure_daemon(daemon_factory, "requantize", budget__pressure_scope=scope)
        a = session(connect, d)
        a.append(1, k[:, :448], v[:, :448])
        b = session(connect, d)
        stored, err, _ = fill(b, k, v)
        assert err is not None and err.code == "RESOURCE_EXHAUSTED", (scope, stored, err)
        seqs = entities(a.stats(), "sequences", "seq_")
        lowered[scope] = sorted(s["lowered_for_others"] for s in seqs.values())
        reached[scope] = stored
        fk, _, pos = a.fetch(1, stacked=True)
        assert pos.tolist() == list(range(448)), "A lost a token"
        a.close(1)
        b.close(1)
    assert lowered["sequence"] == [0, 0], lowered
    assert lowered["pool"][-1] >= 1, lowered  # A (B never lowers for A: A is idle).
    assert reached["pool"] > reached["sequence"], reached


def test_pressure_pool_scope_concurrent_appends_and_stats_do_not_deadlock(daemon_factory,
                                                                          connect, data):
    """Two sequences fill a pool with scope "pool" from two threads (each relief may lower the
    other) while a third thread reads STATS (which takes the daemon's lock, then each
    sequence's): every request must be answered within the client timeout."""
    import threading

    k, v = data
    d = pressure_daemon(daemon_factory, "requantize", budget__pressure_scope="pool",
                        server__workers=4)
    clients = [session(connect, d) for _ in range(2)]
    watcher = connect(d)
    done = threading.Event()
    outcome = {}

    def appender(i):
        try:
            stored, err, _ = fill(clients[i], k, v)
            outcome[i] = (stored, None if err is None else err.code)
        except Exception as e:  # A timeout would be the deadlock.
            outcome[i] = (None, repr(e))

    def reader():
        try:
            while not done.is_set():
                watcher.stats("sequences")
        except Exception as e:
            outcome["stats"] = repr(e)

    threads = [threading.Thread(target=appender, args=(i,)) for i in range(2)]
    stats_thread = threading.Thread(target=reader)
    stats_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    stats_thread.join(60)
    assert not any(t.is_alive() for t in threads + [stats_thread]), outcome
    assert "stats" not in outcome, outcome
    for i in range(2):
        stored, code = outcome[i]
        assert stored is not None and stored > 0, outcome
        assert code in (None, "RESOURCE_EXHAUSTED"), outcome
