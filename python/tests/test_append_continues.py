# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""APPEND_CONTINUES against a real daemon (ipc/PROTOCOL.md 4.4): a prefill split into flagged
APPENDs and a final unflagged one keeps exactly what one APPEND of it all keeps (FETCH rows,
positions, STATS counts), for every scorer, on lossless and on quantized (held-flush) layers;
the cap evicts; the flag is refused where it does not belong."""

import numpy as np
import pytest

import kvctl
from kvctl import protocol as p

LAYERS, KV_HEADS, Q_HEADS, DIM = 2, 2, 4, 32
TOKENS = 300
SPLITS = {
    "three_flagged": [100, 90, 70, 40],
    "short_last": [130, 100, 60, 10],  # The last APPEND is shorter than the observation window.
}
QUANT = {
    "lossless": dict(quant__lossless=True),
    # Quantized layers: a deferred APPEND also holds the flush, so the final one sees fp16 rows.
    "kivi2": dict(quant__method="kivi", quant__k_bits=2, quant__v_bits=2, quant__block_tokens=32,
                  quant__flush_tokens=32, quant__sink_tokens=0),
}


def _evicting(factory, policy: str, quant: str, **extra):
    settings = dict(QUANT[quant])
    settings.update(budget__mode="evict-only", budget__token_fraction=0.25, evict__policy=policy,
                    evict__sinks=4, evict__window=32, evict__compression_period=8,
                    pool__bytes="64MiB")
    settings.update(extra)
    return factory(**settings)


def _data(seed: int, tokens: int):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((LAYERS, tokens, KV_HEADS, DIM)).astype(np.float16)
    v = rng.standard_normal((LAYERS, tokens, KV_HEADS, DIM)).astype(np.float16)
    q = (2 * rng.standard_normal((LAYERS, tokens, Q_HEADS, DIM))).astype(np.float16)
    return k, v, q


def _seq_line(client, seq: int) -> dict:
    lines = client.stats("sequences")["sequences"]
    found = [fields for name, fields in lines.items()
             if name.startswith("seq_") and name.endswith("_%d" % seq)]
    assert len(found) == 1, lines
    return found[0]


def _same_fetch(a, b) -> None:
    for layer in range(LAYERS):
        for h in range(KV_HEADS):
            np.testing.assert_array_equal(a.positions[layer][h], b.positions[layer][h])
            # Bit-identical rows, not merely close ones.
            assert a.k[layer][h].tobytes() == b.k[layer][h].tobytes(), (layer, h)
            assert a.v[layer][h].tobytes() == b.v[layer][h].tobytes(), (layer, h)


@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("quant", sorted(QUANT))
@pytest.mark.parametrize("policy", ["streaming", "h2o", "snapkv", "rkv"])
def test_split_prefill_equals_one_append(daemon_factory, connect, policy, quant, split):
    daemon = _evicting(daemon_factory, policy, quant)
    c = connect(daemon)
    send_q = policy != "streaming"
    c.hello(LAYERS, KV_HEADS, DIM, "float16", q_heads=Q_HEADS if send_q else 0)
    k, v, q = _data(7, TOKENS + 6)
    qs = q if send_q else None
    one, parts = 1, 2
    c.open(one)
    c.open(parts)
    c.append(one, k[:, :TOKENS], v[:, :TOKENS], q=None if qs is None else qs[:, :TOKENS])
    sizes = SPLITS[split]
    assert sum(sizes) == TOKENS
    a = 0
    for i, n in enumerate(sizes):
        last = i == len(sizes) - 1
        c.append(parts, k[:, a:a + n], v[:, a:a + n], q=None if qs is None else qs[:, a:a + n],
                 continues=not last)
        a += n
        if not last:
            # In between, FETCH answers the un-evicted tokens and STATS counts them deferred.
            mid = c.fetch(parts)
            for layer in range(LAYERS):
                for h in range(KV_HEADS):
                    np.testing.assert_array_equal(mid.positions[layer][h], np.arange(a))
            line = _seq_line(c, parts)
            assert line["deferred_tokens"] == a and line["evictions"] == 0, line
    want, got = _seq_line(c, one), _seq_line(c, parts)
    assert got["deferred_tokens"] == 0 and got["deferred_appends"] == len(sizes) - 1, got
    assert want["evictions"] > 0, want  # The comparison is about eviction.
    for field in ("tokens", "kept_tokens", "evictions", "evicted_bytes", "payload_bytes"):
        assert got[field] == want[field], (field, got, want)
    _same_fetch(c.fetch(one), c.fetch(parts))
    # The scorer state after the prefill is the same too: decode steps keep them identical.
    for t in range(TOKENS, TOKENS + 6):
        for seq in (one, parts):
            c.append(seq, k[:, t:t + 1], v[:, t:t + 1],
                     q=None if qs is None else qs[:, t:t + 1])
    _same_fetch(c.fetch(one), c.fetch(parts))
    want, got = _seq_line(c, one), _seq_line(c, parts)
    for field in ("tokens", "kept_tokens", "evictions", "evicted_bytes"):
        assert got[field] == want[field], (field, got, want)


def test_cap_evicts_as_if_unflagged(daemon_factory, connect):
    daemon = _evicting(daemon_factory, "snapkv", "lossless", evict__max_deferred_tokens=100)
    c = connect(daemon)
    c.hello(LAYERS, KV_HEADS, DIM, "float16", q_heads=Q_HEADS)
    k, v, q = _data(3, 240)
    c.open(5)
    c.append(5, k[:, :60], v[:, :60], q=q[:, :60], continues=True)  # 60 <= 100: deferred.
    line = _seq_line(c, 5)
    assert line["deferred_tokens"] == 60 and line["deferral_cap_hits"] == 0, line
    c.append(5, k[:, 60:120], v[:, 60:120], q=q[:, 60:120], continues=True)  # 120 > 100.
    line = _seq_line(c, 5)
    assert line["deferred_tokens"] == 0 and line["deferral_cap_hits"] == 1, line
    assert line["evictions"] > 0, line
    budget = max(4 + 32, int(np.ceil(0.25 * 120)))  # The floor: sinks + window.
    counts = [len(pos) for layer in c.fetch(5).positions for pos in layer]
    assert max(counts) <= budget, (counts, budget)
    # The count starts over after an evicting APPEND: the next flagged one defers again.
    c.append(5, k[:, 120:180], v[:, 120:180], q=q[:, 120:180], continues=True)
    line = _seq_line(c, 5)
    assert line["deferred_tokens"] == 60 and line["deferred_appends"] == 2, line
    sums = c.stats("sequences")["sequences"]
    assert sums["deferral_cap_hits_total"] == 1 and sums["tokens_deferred"] == 60, sums


def test_cap_zero_never_defers(daemon_factory, connect):
    daemon = _evicting(daemon_factory, "streaming", "lossless", evict__max_deferred_tokens=0)
    c = connect(daemon)
    c.hello(LAYERS, KV_HEADS, DIM, "float16")
    k, v, _ = _data(4, 200)
    c.open(1)
    c.append(1, k, v, continues=True)
    line = _seq_line(c, 1)
    assert line["deferred_tokens"] == 0 and line["deferral_cap_hits"] == 1, line
    assert line["evictions"] > 0, line


def test_flag_is_a_no_op_without_eviction(daemon_factory, connect):
    daemon = daemon_factory(quant__lossless=True)
    c = connect(daemon)
    c.hello(LAYERS, KV_HEADS, DIM, "float16")
    k, v, _ = _data(5, 50)
    c.open(1)
    c.append(1, k[:, :30], v[:, :30], continues=True)
    line = _seq_line(c, 1)
    assert line["deferred_tokens"] == 0 and line["deferred_appends"] == 0, line
    c.append(1, k[:, 30:], v[:, 30:])
    np.testing.assert_array_equal(c.fetch(1, stacked=True).k, k.astype(np.float32))


def _with_flags(frames: list, flags: int) -> list:
    f0 = bytes(frames[0])
    msg_type = p.HEADER.unpack_from(f0)[2]
    return [p.header(msg_type, 0, flags=flags) + f0[p.HEADER_BYTES:]] + list(frames[1:])


def test_flag_refused_outside_append_and_unknown_bits(daemon_factory, connect):
    daemon = _evicting(daemon_factory, "streaming", "lossless")
    c = connect(daemon)
    s = c.hello(LAYERS, KV_HEADS, DIM, "float16")
    c.open(1)
    with pytest.raises(kvctl.ServerError) as e:
        c.call_raw(_with_flags(p.encode_ping(0, s.session_id), p.FLAG_APPEND_CONTINUES))
    assert e.value.code == "INVALID_ARGUMENT"
    assert "flags: got 0x0001 on PING" in e.value.message, e.value.message
    with pytest.raises(kvctl.ServerError) as e:
        c.call_raw(_with_flags(p.encode_fetch(0, s.session_id, 1, 0, LAYERS, p.MODE_DENSE,
                                              "float32"), p.FLAG_APPEND_CONTINUES))
    assert "valid only on APPEND" in e.value.message, e.value.message
    k, v, _ = _data(6, 4)
    frames = p.encode_append(0, s.session_id, 1, 0, 4, [k, v])
    for bad in (0x0002, 0x8001):
        with pytest.raises(kvctl.ServerError) as e:
            c.call_raw(_with_flags(frames, bad))
        assert e.value.code == "INVALID_ARGUMENT"
        assert "flags: got 0x%04X, expected only bit 0" % bad in e.value.message, e.value.message
    # Nothing was appended by the refused requests; a flagged APPEND is accepted.
    c.call_raw(p.encode_append(0, s.session_id, 1, 0, 4, [k, v], continues=True))
    assert _seq_line(c, 1)["deferred_tokens"] == 4


def test_encoder_and_decoder_round_trip_the_flag():
    k = np.zeros((1, 2, 1, 8), np.float16)
    frames = p.encode_append(9, 1, 2, 0, 2, [k, k], continues=True)
    assert p.header_flags(frames[0]) == p.FLAG_APPEND_CONTINUES
    assert p.header_flags(p.encode_append(9, 1, 2, 0, 2, [k, k])[0]) == 0
    msg_type, _, body = p.decode_request(frames)
    assert msg_type == p.MsgType.APPEND and body.n_tokens == 2
    with pytest.raises(p.ProtocolError, match="valid only on APPEND"):
        p.decode_request(_with_flags(p.encode_ping(1, 0), 1))
    with pytest.raises(p.ProtocolError, match="flags: got 0x0004"):
        p.decode_request(_with_flags(frames, 4))
