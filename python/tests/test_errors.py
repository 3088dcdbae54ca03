# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Bad requests against the real daemon: each one gets an ERROR with a code and a message that
names the field, the daemon keeps serving, and data stored before is unchanged."""

import struct

import numpy as np
import pytest
import zmq

import kvctl
from helpers import Daemon, random_kv
from kvctl import protocol as p

LAYERS, HEADS, DIM = 2, 2, 64


@pytest.fixture
def stored(kvarn_daemon, connect):
    """A float16 session with sequence 1 holding 200 tokens; yields (client, snapshot)."""
    c = connect(kvarn_daemon)
    c.hello(LAYERS, HEADS, DIM, dtype="float16")
    c.open(1)
    k, v = random_kv(LAYERS, 200, HEADS, DIM, seed=11, dtype=np.float16)
    c.append(1, k, v)
    before = c.fetch(1, stacked=True)
    yield c, before
    c.ping()  # Still serving after the bad request...
    after = c.fetch(1, stacked=True)  # ...and the stored tokens did not change.
    for x, y in zip(before, after):
        assert np.array_equal(x, y)
    c.append(1, k[:, :1], v[:, :1])  # And the sequence still takes the next token.
    c.close(1)


def expect_error(code, field, call, *args, **kwargs):
    with pytest.raises(kvctl.ServerError) as e:
        call(*args, **kwargs)
    assert e.value.code == code, e.value
    assert field in e.value.message, e.value
    return e.value


def test_wrong_shape_is_refused_by_client_and_daemon(stored):
    c, _ = stored
    k, v = random_kv(LAYERS, 3, HEADS, DIM, dtype=np.float16)
    with pytest.raises(ValueError, match=r"k: got shape \[2, 3, 1, 64\], expected "
                                         r"\[layers=2, tokens, kv_heads=2, head_dim=64\]"):
        c.append(1, k[:, :, :1], v[:, :, :1])
    with pytest.raises(ValueError, match=r"v: got shape \[2, 2, 2, 64\].*tokens=3"):
        c.append(1, k, v[:, :2])
    with pytest.raises(ValueError, match=r"k: got shape \[3, 2, 64\]"):
        c.append(1, k[0], v[0])
    # The same mistake in a hand-built request reaches the daemon's own check.
    s = c.session
    short = k[:, :, :1].copy()
    frames = p.encode_append(0, s.session_id, 1, 200, 3, [short, short])
    err = expect_error("INVALID_ARGUMENT", "k: frame has 768 bytes, expected 1536", c.call_raw,
                       frames)
    assert "[2 layers, 3 tokens, 2 heads, 64]" in err.message


def test_nan_and_inf_are_refused(stored):
    c, _ = stored
    k, v = random_kv(LAYERS, 4, HEADS, DIM, dtype=np.float16)
    k[1, 2, 0, 5] = np.nan
    expect_error("INVALID_ARGUMENT", "nan", c.append, 1, k, v)
    k[1, 2, 0, 5] = 0
    v[0, 0, 1, 0] = np.inf
    err = expect_error("INVALID_ARGUMENT", "inf", c.append, 1, k, v)
    assert "v: element" in err.message and "finite" in err.message


def test_unknown_sequence_is_not_found(stored):
    c, _ = stored
    k, v = random_kv(LAYERS, 1, HEADS, DIM, dtype=np.float16)
    expect_error("NOT_FOUND", "sequence_id: 999", c.append, 999, k, v)
    expect_error("NOT_FOUND", "sequence_id: 999", c.fetch, 999)
    expect_error("NOT_FOUND", "sequence_id: 999", c.close, 999)
    expect_error("ALREADY_EXISTS", "sequence_id: 1", c.open, 1)


def test_another_sessions_sequence_is_not_visible(stored, kvarn_daemon, connect):
    a, _ = stored
    b = connect(kvarn_daemon)
    b.hello(LAYERS, HEADS, DIM, dtype="float16", client_name="intruder")
    assert b.session.session_id != a.session.session_id
    k, v = random_kv(LAYERS, 1, HEADS, DIM, dtype=np.float16)
    expect_error("NOT_FOUND", "sequence_id: 1", b.fetch, 1)
    expect_error("NOT_FOUND", "sequence_id: 1", b.append, 1, k, v, first_position=200)
    expect_error("NOT_FOUND", "sequence_id: 1", b.close, 1)
    b.open(1)  # B's own sequence 1 is a different sequence.
    b.append(1, k, v)
    assert b.fetch(1, stacked=True).positions.tolist() == [0]


def test_wrong_first_position_is_refused(stored):
    c, _ = stored
    k, v = random_kv(LAYERS, 2, HEADS, DIM, dtype=np.float16)
    expect_error("INVALID_ARGUMENT", "first_position: got 5, expected 200", c.append, 1, k, v,
                 first_position=5)
    expect_error("INVALID_ARGUMENT", "first_position: got 201, expected 200", c.append, 1, k, v,
                 first_position=201)
    with pytest.raises(ValueError, match="first_position: got -1"):
        c.append(1, k, v, first_position=-1)


def test_layer_range_out_of_bounds_is_refused(stored):
    c, _ = stored
    expect_error("INVALID_ARGUMENT", "layers: got [0, 3), expected a non-empty range inside "
                 "[0, 2)", c.fetch, 1, layers=(0, 3))
    expect_error("INVALID_ARGUMENT", "layers: got [2, 3)", c.fetch_blocks, 1, layers=2)


def test_hand_built_requests_with_bad_fields(stored):
    c, _ = stored
    s = c.session
    # session_id 0 (the client never sends it; the daemon must still refuse it).
    frame0 = p.header(p.MsgType.OPEN, 0) + struct.pack("<QQ", 0, 5)
    expect_error("INVALID_ARGUMENT", "session_id: got 0", c.call_raw, [frame0])
    expect_error("NOT_FOUND", "session_id: 123456", c.call_raw, p.encode_open(0, 123456, 5))
    assert s.has_staging
    k, v = random_kv(LAYERS, 1, HEADS, DIM, dtype=np.float16)
    frames = p.encode_append(0, s.session_id, 1, 200, 1, [k, v, k], has_q=True)
    expect_error("INVALID_ARGUMENT", "has_q", c.call_raw, frames)
    frames = p.encode_append(0, s.session_id, 1, 200, 1, (), p.SOURCE_STAGING, False,
                             s.staging_offset + s.staging_bytes - 8)
    expect_error("INVALID_ARGUMENT", "staging_offset", c.call_raw, frames)
    bad_mode = p.header(p.MsgType.FETCH, 0) + struct.pack("<QQIIBB", s.session_id, 1, 0, 1, 2, 0)
    expect_error("INVALID_ARGUMENT", "mode: got 2", c.call_raw, [bad_mode])
    expect_error("INVALID_ARGUMENT", "section", c.stats, "nosuchsection")


def test_append_beyond_the_pool_is_resource_exhausted(daemon_factory, connect):
    d = daemon_factory(pool__bytes="1MiB", pool__page_bytes="4KiB",
                       pool__staging_bytes_per_session=0, quant__lossless=True)
    c = connect(d)
    c.hello(1, 1, 32, dtype="float32")  # head_dim 32: a record fits a 4 KiB page.
    c.open(1)
    k, v = random_kv(1, 100, 1, 32, seed=12)
    c.append(1, k, v)
    before = c.fetch(1, stacked=True)
    big_k, big_v = random_kv(1, 8000, 1, 32, seed=13)  # 2 MB of rows into a 1 MiB pool.
    err = expect_error("RESOURCE_EXHAUSTED", "pool pages", c.append, 1, big_k, big_v)
    assert "8000 tokens" in err.message
    c.ping()
    after = c.fetch(1, stacked=True)
    for x, y in zip(before, after):
        assert np.array_equal(x, y)
    assert c.append(1, k[:, :10], v[:, :10]).tokens_total == 110  # Position 100: unchanged.
    assert c.stats("pool")["pool"]["alloc_failures_total"] >= 1


def _raw_dealer(endpoint):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    return sock


def test_garbage_and_foreign_versions_get_error_replies(kvarn_daemon, connect):
    sock = _raw_dealer(kvarn_daemon.endpoint)
    try:
        def exchange(frames):
            sock.send_multipart(frames)
            reply = p.decode_reply(sock.recv_multipart())  # A valid version-1 message.
            assert reply.type == p.MsgType.ERROR
            return reply

        r = exchange([b"garbage bytes"])
        assert r.request_id == 0 and r.body.code == 1  # INVALID_ARGUMENT
        assert "header" in r.body.message
        r = exchange([b"\xff" * 40, b"more", b"frames"])
        assert r.request_id == 0 and "magic" in r.body.message
        wrong_version = struct.pack("<IHHQH", p.MAGIC, 2, p.MsgType.PING, 77, 0) + bytes(8)
        r = exchange([wrong_version])
        assert r.request_id == 77 and r.body.code == 1
        assert r.body.message == "version: got 2, expected 1"
        r = exchange([p.header(0x42, 78)])
        assert r.request_id == 78 and p.STATUS_CODES[r.body.code] == "UNIMPLEMENTED"
        assert "type" in r.body.message
        r = exchange([p.header(0x8004, 79) + bytes(8)])
        assert p.STATUS_CODES[r.body.code] == "INVALID_ARGUMENT" and "request" in r.body.message
        r = exchange([p.encode_ping(80)[0] + b"\x00"])
        assert r.request_id == 80 and "trailing" in r.body.message
        r = exchange([p.encode_ping(81)[0]] + [b"x"] * 5)
        assert r.request_id == 81 and "frame count" in r.body.message
    finally:
        sock.close()
    assert connect(kvarn_daemon).ping() > 0  # Still serving.


def test_geometry_whose_records_exceed_a_page_is_refused_not_fatal(workdir, connect):
    # KIVI 4-bit at head_dim 128 makes 5 KiB block records: they cannot live in 4 KiB pages.
    d = Daemon(workdir, {"pool.bytes": "1MiB", "pool.page_bytes": "4KiB",
                         "pool.staging_bytes_per_session": 0, "quant.method": "kivi",
                         "quant.k_bits": 4, "quant.v_bits": 4}).start()
    try:
        c = connect(d, timeout_ms=1000)
        with pytest.raises(kvctl.ServerError) as e:
            c.hello(1, 1, 128, dtype="float16")
        assert e.value.code == "INVALID_ARGUMENT"
        assert "pool.page_bytes" in e.value.message
        # A geometry that fits is served by the same daemon.
        c.hello(1, 1, 64, dtype="float16")
        c.open(1)
        c.ping()
    finally:
        if d.running:
            d.stop()
        else:
            d.kill()
