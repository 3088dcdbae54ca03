# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Wire format without a daemon: the byte examples of ipc/PROTOCOL.md, reply validation, the
client's argument checks, and the client's socket discipline against a scripted ZeroMQ peer (the
real daemon never sends stale or malformed replies, so a peer that does is the only way to test
the client's handling of them)."""

import importlib.util
import os
import struct
import threading

import numpy as np
import pytest
import zmq

import kvctl
from kvctl import protocol as p
from kvctl import wire_codec as wc
from kvctl import wire_schema as ws


def hexbytes(text: str) -> bytes:
    return bytes.fromhex(" ".join(text.split()))


def hdr(msg_type: int, request_id: int) -> bytes:
    return struct.pack("<IHHQH", p.MAGIC, 1, msg_type, request_id, 0)


GOLDEN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                           "golden", "wire_messages.txt")


class Golden:
    """One entry of tests/golden/wire_messages.txt, the golden messages both codecs share."""

    def __init__(self, name: str):
        self.name, self.type, self.request_id, self.frames, self.fields = name, "", 0, [], []
        self.error = ""  # invalid_* entries: the decoder must refuse with this text.

    @property
    def body(self) -> bytes:
        return self.frames[0][p.HEADER_BYTES:]


def load_goldens() -> dict:
    goldens = {}
    g = None
    with open(GOLDEN_PATH, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                g = goldens[line[1:-1]] = Golden(line[1:-1])
                continue
            key, _, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if key == "type":
                g.type = value
            elif key == "request_id":
                g.request_id = int(value)
            elif key == "error":
                g.error = value
            elif key.startswith("frame"):
                assert key == "frame%d" % len(g.frames), (g.name, key)
                g.frames.append(hexbytes(value))
            else:
                g.fields.append((key, value))
    return goldens


GOLDEN = load_goldens()
VALID = sorted(name for name, g in GOLDEN.items() if not g.error)
INVALID = sorted(name for name, g in GOLDEN.items() if g.error)
STAGING_NAME = "/kv-stg-00112233445566778899aabbccddeeff"
BLOCKS_BODY = GOLDEN["fetch_blocks_reply"].body


def _body_name(body) -> str:
    return next(c.__name__ for c in type(body).__mro__ if c.__name__ in ws.BODIES)


def _is_reply(g: Golden) -> bool:
    return bool(struct.unpack_from("<H", g.frames[0], 6)[0] & p.REPLY_BIT)


# ---- The golden messages (shared with tests/ipc/protocol_golden_test.cc) ---------------------


@pytest.mark.parametrize("name", VALID)
def test_golden_message_decodes_to_its_fields(name):
    g = GOLDEN[name]
    if _is_reply(g):
        reply = p.decode_reply(g.frames)
        msg_type, request_id, body = reply.type, reply.request_id, reply.body
    else:
        msg_type, request_id, body = p.decode_request(g.frames)
    assert (p.type_name(msg_type), request_id) == (g.type, g.request_id)
    assert wc.describe(_body_name(body), body) == g.fields


@pytest.mark.parametrize("name", VALID)
def test_golden_message_encodes_back_to_its_frames(name):
    g = GOLDEN[name]
    if _is_reply(g):
        reply = p.decode_reply(g.frames)
        msg_type, body = reply.type, reply.body
    else:
        msg_type, _, body = p.decode_request(g.frames)
    frames = p.encode_message(msg_type, g.request_id, body)
    assert [bytes(memoryview(f).cast("B")) for f in frames] == g.frames


@pytest.mark.parametrize("name", INVALID)
def test_golden_invalid_reply_is_refused_with_its_error(name):
    g = GOLDEN[name]
    with pytest.raises(kvctl.ProtocolError) as e:
        p.decode_reply(g.frames)
    assert g.error in str(e.value)


def test_golden_messages_cover_every_message_type():
    assert len(INVALID) >= 10
    types = {GOLDEN[name].type for name in VALID}
    for t in ws.REQUEST_BODIES:
        assert p.type_name(t) in types and p.type_name(t | p.REPLY_BIT) in types
    assert "ERROR" in types


def test_wire_schema_is_generated_from_messages_def():
    """python/kvctl/wire_schema.py is what ipc/gen_python_schema.py writes from ipc/messages.def
    (skipped where the package runs without its repository)."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    script = os.path.join(root, "ipc", "gen_python_schema.py")
    if not os.path.exists(script):
        pytest.skip("no repository checkout next to the tests")
    spec = importlib.util.spec_from_file_location("gen_python_schema", script)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with open(gen.DEF_PATH, encoding="utf-8") as f:
        want = gen.generate(f.read())
    with open(os.path.join(os.path.dirname(p.__file__), "wire_schema.py"), encoding="utf-8") as f:
        assert f.read() == want, "run python3 ipc/gen_python_schema.py"


# ---- PROTOCOL.md examples through the public encoders and the typed replies -----------------


def test_protocol_header_example_is_the_documented_bytes():
    assert p.header(p.MsgType.HELLO, 1) == GOLDEN["hello_request"].frames[0][:18]


def test_protocol_hello_request_example():
    frames = p.encode_hello(1, "vllm", "qwen", 2, 1, 2, 8, "float16")
    assert frames == GOLDEN["hello_request"].frames
    assert len(frames[0]) == 53


def test_protocol_hello_reply_example():
    frames = GOLDEN["hello_reply"].frames
    assert len(frames[0]) == 202
    reply = p.decode_reply(frames)
    assert reply.request_id == 1 and reply.type == 0x8001
    assert reply.body == p.HelloReply(5, 30000, "0.1.0", 1048576, 4096, "/kv", 0, 8192,
                                      p.QuantInfo(3, 2, 2, 32, 4, 128), 0, 0, bytes(64),
                                      STAGING_NAME)
    assert reply.body.quant.method_name == "kvarn" and not reply.body.pool_on_device


def test_protocol_hello_reply_of_a_device_pool():
    handle = bytes(range(64))
    frame0 = _hello_reply(shm=b"", location=1, device=3, handle=handle)
    hello = p.decode_reply([frame0]).body
    assert hello.pool_on_device and hello.cuda_device == 3 and hello.cuda_ipc_handle == handle
    assert hello.shm_name == "" and hello.staging_bytes == 8192


def test_protocol_open_close_ping_examples():
    assert p.encode_open(2, 5, 9) == GOLDEN["open_request"].frames
    assert p.encode_close(2, 5, 9) == GOLDEN["close_request"].frames
    assert p.decode_reply(GOLDEN["open_reply"].frames).body == p.OpenReply()
    assert p.decode_reply(GOLDEN["close_reply"].frames).body == p.CloseReply(4096)
    assert p.encode_ping(3, 0) == GOLDEN["ping_request"].frames
    assert p.encode_ping(7, 42) == GOLDEN["ping_request_session"].frames
    assert p.decode_reply(GOLDEN["ping_reply"].frames).body == p.PingReply(1000000)


def test_protocol_append_examples():
    k = np.arange(16, dtype="<f2").reshape(2, 1, 1, 8)
    v = -k
    frames = p.encode_append(5, 5, 9, 0, 1, [k, v])
    assert frames[0] == GOLDEN["append_inline_request"].frames[0]
    assert len(frames[0]) == 18 + 38 and frames[1] is k and frames[2] is v
    assert [k.tobytes(), v.tobytes()] == GOLDEN["append_inline_request"].frames[1:]
    staged = p.encode_append(6, 5, 9, 1, 1, (), p.SOURCE_STAGING, True, 4096)
    assert staged == GOLDEN["append_staging_request"].frames
    reply = p.decode_reply(GOLDEN["append_reply"].frames)
    assert reply.body == p.AppendReply(2, 0, 8192)


def test_protocol_fetch_request_and_dense_reply_examples():
    assert p.encode_fetch(7, 5, 9, 0, 1, p.MODE_DENSE, "float16") == GOLDEN["fetch_request"].frames
    known = p.encode_fetch(7, 5, 9, 0, 1, p.MODE_BLOCKS, "float16", [2], [0x0123456789abcdef])
    assert known == GOLDEN["fetch_request_known"].frames
    with pytest.raises(ValueError, match="expected none in dense mode"):
        p.encode_fetch(7, 5, 9, 0, 1, p.MODE_DENSE, "float16", [2], [1])
    g = GOLDEN["fetch_dense_reply"]
    assert len(g.body) == 22
    rows_k = np.arange(16, dtype="<f2")
    rows = p.decode_reply(g.frames).body
    assert isinstance(rows, p.Rows)
    assert (rows.layer_begin, rows.n_layers, rows.kv_heads, rows.head_dim) == (0, 1, 1, 8)
    assert rows.dtype == 1 and rows.counts.tolist() == [2]
    assert rows.positions.tolist() == [0, 1]
    np.testing.assert_array_equal(rows.k, rows_k.reshape(2, 8))
    np.testing.assert_array_equal(rows.v, -rows_k.reshape(2, 8))


def test_protocol_blocks_reply_example():
    assert len(BLOCKS_BODY) == 169
    assert len(GOLDEN["fetch_blocks_reply"].frames) == 1  # No row travels in a blocks reply.
    b = p.decode_reply(GOLDEN["fetch_blocks_reply"].frames).body
    assert isinstance(b, p.BlocksReply)
    assert (b.page_bytes, b.block_tokens, b.side_records_per_page) == (4096, 32, 0)
    assert b.pool_pages == 256
    assert b.layouts == (p.RecordLayout(3, 2, 2, 1, 32, 8, 256, 0, 64, 64, 64, 128, 64, 192, 64,
                                        0, 16, 32, 128),)
    assert b.layouts[0].method_name == "kvarn"
    assert b.layout_index.tolist() == [0] and b.indptr.tolist() == [0, 2]
    assert b.indices.tolist() == [17, 18] and b.last_page_len.tolist() == [32]
    assert b.side_indices.tolist() == []
    assert b.window_indptr.tolist() == [0, 1] and b.window_ids.tolist() == [5]
    assert b.window_sinks.tolist() == [0]
    assert b.run_starts.tolist() == [64] and b.run_lengths.tolist() == [1]
    assert b.record_base.tolist() == [0] and b.table_tags.tolist() == [0]
    side = p.decode_reply(GOLDEN["fetch_blocks_reply_side_records"].frames).body
    assert side.side_indices.tolist() == [1, 2, p.NO_PAGE]
    assert side.run_starts.tolist() == [0, 71, 0, 71, 73]


def test_protocol_stats_and_error_examples():
    assert p.encode_stats(9, 0, "pool") == GOLDEN["stats_request"].frames
    text = GOLDEN["stats_reply"].frames[1]
    assert p.decode_reply(GOLDEN["stats_reply"].frames).body == p.StatsReply(text.decode())
    assert kvctl.parse_info(text.decode()) == {"pool": {"pool_bytes": 1048576}}
    g = GOLDEN["error_reply"]
    assert len(g.body) == 31
    assert p.decode_reply(g.frames).body == p.ErrorReply(2, "sequence_id: 9 not open")


def test_protocol_bye_example():
    assert p.encode_bye(11, 5) == GOLDEN["bye_request"].frames
    reply = p.decode_reply(GOLDEN["bye_reply"].frames)
    assert len(GOLDEN["bye_reply"].body) == 12
    assert reply.type == 0x8008 and reply.body == p.ByeReply(2, 8192)
    assert p.type_name(8) == "BYE" and p.type_name(0x8008) == "BYE_REPLY"
    with pytest.raises(ValueError, match="session_id: got 0"):
        p.encode_bye(1, 0)


def _frame_bytes(frames):
    return [bytes(memoryview(f).cast("B")) for f in frames]


def test_protocol_save_and_open_prefix_examples():
    frames = p.encode_save_prefix(12, 5, 7, [1, 2, 300])
    assert _frame_bytes(frames) == GOLDEN["save_prefix_request"].frames
    assert len(frames[0]) == 34 and frames[1].dtype == np.dtype("<i4")
    for tokens in (np.array([1, 2, 300], dtype=np.int32), np.array([1, 2, 300], dtype=np.uint64),
                   (1, 2, 300), [np.int64(1), 2, 300]):
        assert _frame_bytes(p.encode_open_prefix(13, 5, 8, tokens)) == \
            GOLDEN["open_prefix_request"].frames
    save = p.decode_reply(GOLDEN["save_prefix_reply"].frames)
    assert save.type == 0x8009 and save.body == p.SavePrefixReply(16, 4096)
    opened = p.decode_reply(GOLDEN["open_prefix_reply"].frames)
    assert opened.type == 0x800A and opened.body == p.OpenPrefixReply(16)
    assert p.type_name(9) == "SAVE_PREFIX" and p.type_name(0x800A) == "OPEN_PREFIX_REPLY"
    big = np.arange(p.MAX_PREFIX_TOKENS, dtype=np.int64) % 50000
    assert memoryview(p.encode_save_prefix(1, 5, 7, big)[1]).nbytes == 4 * p.MAX_PREFIX_TOKENS


@pytest.mark.parametrize("tokens, match", [
    ([], r"tokens: got 0 ids, expected 1\.\.1048576"),
    (np.zeros(1048577, dtype=np.int32), r"tokens: got 1048577 ids, expected 1\.\.1048576"),
    ([1, -2, 3], r"tokens\[1\]: got -2, expected a token id >= 0"),
    (np.array([5, 6, -1], dtype=np.int32), r"tokens\[2\]: got -1, expected a token id >= 0"),
    ([2**31], r"tokens\[0\]: got 2147483648, expected a token id <= 2147483647"),
    ([7, 2**70], r"tokens\[1\]: got 1180591620717411303424, expected a token id <= "),
    ([1.0, 2.0], r"tokens: got dtype float64, expected integer token ids"),
    ([1, None], r"tokens\[1\]: got None, expected an integer token id"),
    ([[1, 2]], r"tokens: got shape \[1, 2\], expected one dimension"),
    ("12", r"tokens: got str, expected a sequence of integer token ids"),
])
def test_protocol_prefix_requests_refuse_bad_token_ids_naming_them(tokens, match):
    for encode in (p.encode_save_prefix, p.encode_open_prefix):
        with pytest.raises(ValueError, match=match):
            encode(1, 5, 7, tokens)


def test_protocol_prefix_requests_check_the_ids_of_session_and_sequence():
    with pytest.raises(ValueError, match="session_id: got 0"):
        p.encode_save_prefix(1, 0, 7, [1])
    with pytest.raises(ValueError, match="sequence_id: got -1"):
        p.encode_open_prefix(1, 5, -1, [1])


def test_protocol_session_lost_is_told_apart_from_a_missing_sequence():
    assert p.is_session_lost(2, "session_id: 7 is not an open session; send HELLO again")
    assert not p.is_session_lost(2, "sequence_id: 9 is not open in session 7")
    assert not p.is_session_lost(1, "session_id: got 0, expected a session from HELLO")
    e = kvctl.SessionLostError(2, "session_id: 7 gone", "APPEND", 7, 120, 1, "Restart.")
    assert isinstance(e, kvctl.ServerError) and e.code == "NOT_FOUND"
    assert (e.session_id, e.tokens_lost, e.sequences_lost) == (7, 120, 1)
    assert "120 tokens of cached data in 1 sequence(s) were lost" in str(e)
    assert "Restart." in str(e) and e.message == "session_id: 7 gone"


# ---- Reply validation ----------------------------------------------------------------------


def _hello_reply(**changes) -> bytes:
    fields = dict(session_id=5, lease=30000, version=b"0.1.0", pool=1 << 20, page=4096,
                  shm=b"/kv", staging_offset=4096, staging_bytes=8192, method=3, k_bits=2,
                  v_bits=2, block=32, sinks=4, flush=128, location=0, device=0,
                  handle=bytes(64), staging_shm=b"")
    fields.update(changes)
    f = fields
    return (hdr(0x8001, 1) + struct.pack("<QI", f["session_id"], f["lease"])
            + struct.pack("<I", len(f["version"])) + f["version"]
            + struct.pack("<QI", f["pool"], f["page"]) + struct.pack("<I", len(f["shm"]))
            + f["shm"] + struct.pack("<QQBBBIII", f["staging_offset"], f["staging_bytes"],
                                     f["method"], f["k_bits"], f["v_bits"], f["block"],
                                     f["sinks"], f["flush"])
            + struct.pack("<BI", f["location"], f["device"]) + f["handle"]
            + struct.pack("<I", len(f["staging_shm"])) + f["staging_shm"])


@pytest.mark.parametrize("frames, field", [
    ([b""], "header"),
    ([b"\x00" * 18], "magic"),
    ([struct.pack("<IHHQH", p.MAGIC, 2, 0x8004, 1, 0) + bytes(8)], "version: got 2"),
    ([struct.pack("<IHHQH", p.MAGIC, 1, 0x8004, 1, 1) + bytes(8)], "flags"),
    ([hdr(4, 1) + bytes(8)], "expected a reply"),
    ([hdr(0x8042, 1)], "expected a known reply"),
    ([hdr(0x8004, 1) + bytes(7)], "truncated at server_time_us"),
    ([hdr(0x8004, 1) + bytes(9)], "trailing bytes"),
    ([hdr(0x8004, 1) + bytes(8), b"x"], "frame count"),
    ([hdr(0x8007, 1)], "frame count"),
    ([hdr(0xFFFF, 1) + struct.pack("<II", 0, 0)], "code: got 0"),
    ([hdr(0xFFFF, 1) + struct.pack("<II", 2, 2) + b"\xc0\x80"], "UTF-8"),
    ([hdr(0xFFFF, 1) + struct.pack("<II", 2, 3) + b"\xed\xa0\x80"], "UTF-8"),
    ([hdr(0xFFFF, 1) + struct.pack("<II", 2, 1) + b"\x00"], "NUL"),
    ([hdr(0x8005, 1) + struct.pack("<QQQ", 1, 2, 0)], "tokens_quantized"),
    ([_hello_reply(session_id=0)], "session_id"),
    ([_hello_reply(staging_offset=1 << 20)], "staging slot"),
    ([_hello_reply(staging_bytes=0)], "staging_offset"),
    ([_hello_reply(shm=b"")], "shm_name"),
    ([_hello_reply(method=6)], "quant.method"),
    ([_hello_reply(flush=100)], "quant.flush_tokens"),
    ([_hello_reply(version=b"")], "server_version"),
    ([_hello_reply(location=2)], "pool_location"),
    ([_hello_reply(device=1)], "cuda_ipc_handle/cuda_device"),
    ([_hello_reply(handle=b"\x01" + bytes(63))], "cuda_ipc_handle/cuda_device"),
    ([_hello_reply(location=1)], "shm_name: got \"/kv\""),
    ([_hello_reply()[:-5]], "truncated at cuda_ipc_handle"),
    ([_hello_reply()[:-1]], "truncated at staging_shm_name"),
    ([_hello_reply(staging_shm=b"/kv-stg-1", staging_bytes=0, staging_offset=0)],
     "staging_shm_name"),
    ([_hello_reply(staging_shm=b"/kv-stg-1", location=1, shm=b"")], "staging_shm_name"),
    ([hdr(0x8006, 1) + bytes([2])], "mode: got 2"),
    ([hdr(0x8008, 1) + bytes(11)], "truncated at bytes_freed"),
    ([hdr(0x8008, 1) + bytes(13)], "trailing bytes"),
    ([hdr(0x800B, 1)], "expected a known reply"),
])
def test_protocol_malformed_replies_raise_protocol_error_naming_the_field(frames, field):
    with pytest.raises(kvctl.ProtocolError, match=field):
        p.decode_reply(frames)


def _dense(counts, positions, head_dim=8, dtype=1, k_rows=None):
    body = struct.pack("<BIIIIB", 0, 0, 1, len(counts), head_dim, dtype) + struct.pack(
        "<%dI" % len(counts), *counts)
    n = len(positions)
    size = {0: 4}.get(dtype, 2)
    k = bytes(n * head_dim * size) if k_rows is None else k_rows
    return [hdr(0x8006, 1) + body, struct.pack("<%dq" % n, *positions), k, bytes(len(k))]


def test_protocol_dense_reply_checks_frame_sizes_and_positions():
    assert p.decode_reply(_dense([1, 2], [0, 0, 1])).body.counts.tolist() == [1, 2]
    with pytest.raises(kvctl.ProtocolError, match="positions: frame has 16 bytes, expected 24"):
        p.decode_reply(_dense([1, 2], [0, 1]))
    with pytest.raises(kvctl.ProtocolError, match="k: frame has 2 bytes, expected 48"):
        p.decode_reply(_dense([1, 2], [0, 0, 1], k_rows=b"\x00\x00"))
    with pytest.raises(kvctl.ProtocolError, match=r"positions\[1\]: got -1"):
        p.decode_reply(_dense([1, 2], [0, -1, 1]))
    with pytest.raises(kvctl.ProtocolError, match="head_dim: got 12"):
        p.decode_reply(_dense([1], [0], head_dim=12))
    with pytest.raises(kvctl.ProtocolError, match="dtype: got 3"):
        p.decode_reply(_dense([1], [0], dtype=3, k_rows=bytes(16)))


def test_protocol_blocks_reply_checks_the_page_table():
    def frames(body):
        return [hdr(0x8006, 8) + body]

    at = 35 + 64 + 2  # indptr = {0, 2}, after the layout and layout_index.
    assert BLOCKS_BODY[at:at + 8] == bytes.fromhex("0000000002000000")
    bad_indptr = BLOCKS_BODY[:at] + struct.pack("<II", 1, 2) + BLOCKS_BODY[at + 8:]
    with pytest.raises(kvctl.ProtocolError, match=r"indptr\[0\]: got 1"):
        p.decode_reply(frames(bad_indptr))
    last = at + 16  # last_page_len[0]
    bad_last = BLOCKS_BODY[:last] + struct.pack("<I", 33) + BLOCKS_BODY[last + 4:]
    with pytest.raises(kvctl.ProtocolError, match=r"last_page_len\[0\]: got 33"):
        p.decode_reply(frames(bad_last))
    lay = 35  # The layout: record_bytes at +12, records_per_page at +52.
    assert BLOCKS_BODY[lay + 12:lay + 16] == struct.pack("<I", 256)
    assert BLOCKS_BODY[lay + 52:lay + 56] == struct.pack("<I", 16)

    def patched(offset, value):
        return frames(BLOCKS_BODY[:offset] + struct.pack("<I", value) + BLOCKS_BODY[offset + 4:])

    # 16 records of 512 bytes cannot fit a 4096-byte page.
    with pytest.raises(kvctl.ProtocolError, match=r"layouts\[0\]\.records_per_page: got 16, "
                       r"expected 1\.\.8 with records_per_page x record_bytes \(512\) <= "
                       r"page_bytes \(4096\)"):
        p.decode_reply(patched(lay + 12, 512))
    with pytest.raises(kvctl.ProtocolError, match=r"layouts\[0\]\.record_bytes: got 4097, "
                       r"expected 1\.\.4096"):
        p.decode_reply(patched(lay + 12, 4097))
    with pytest.raises(kvctl.ProtocolError,
                       match=r"layouts\[0\]\.records_per_page: got 0, expected 1\.\.16"):
        p.decode_reply(patched(lay + 52, 0))
    with pytest.raises(kvctl.ProtocolError,
                       match=r"layouts\[0\]\.records_per_page: got 17, expected 1\.\.16"):
        p.decode_reply(patched(lay + 52, 17))
    # Fewer records per page than fit is valid (the page keeps slack).
    assert p.decode_reply(patched(lay + 52, 1)).body.layouts[0].records_per_page == 1


# ---- Helpers and argument checks -----------------------------------------------------------


def test_bf16_helpers_round_to_nearest_even_and_widen_exactly():
    x = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e38, np.inf, np.nan], dtype=np.float32)
    bits = kvctl.float32_to_bf16(x)
    assert bits.dtype == np.uint16
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1.0) wins; 1 + 3*2^-8 rounds up.
    assert bits[:4].tolist() == [0x3F80, 0xC020, 0x3F80, 0x3F82]
    back = kvctl.bf16_to_float32(bits)
    assert back[0] == 1.0 and back[1] == -2.5 and back[3] == 1.015625
    assert np.isfinite(back[4]) and np.isinf(back[5]) and np.isnan(back[6])
    every = np.arange(1 << 16, dtype=np.uint16)
    finite = np.isfinite(kvctl.bf16_to_float32(every))
    assert np.array_equal(kvctl.float32_to_bf16(kvctl.bf16_to_float32(every))[finite],
                          every[finite])


def test_parse_info_types_values():
    text = "# Server\nkvctl_version:0.1.0\npid:12\n\n# Sequences\nbits_per_element:2.5\n" \
           "compression_vs_fp16:6.4e+00\nneg:-3\n"
    assert kvctl.parse_info(text) == {
        "server": {"kvctl_version": "0.1.0", "pid": 12},
        "sequences": {"bits_per_element": 2.5, "compression_vs_fp16": 6.4, "neg": -3}}
    with pytest.raises(kvctl.ProtocolError, match="neither"):
        kvctl.parse_info("# A\nno colon here\n")


@pytest.mark.parametrize("endpoint, match", [
    ("tcp://127.0.0.1", "PORT"), ("ipc://", "file path"), ("ipc://@abstract", "abstract"),
    ("ipc:///" + "x" * 120, "Unix socket limit"), ("inproc://x", "expected ipc"),
])
def test_client_rejects_bad_endpoints(endpoint, match):
    with pytest.raises(ValueError, match=match):
        kvctl.Client(endpoint)


def test_client_rejects_bad_arguments_before_sending(workdir):
    # No daemon listens here: every check below must fire before any request is sent.
    c = kvctl.Client("ipc://%s/nobody.sock" % workdir, timeout_ms=100)
    try:
        with pytest.raises(ValueError, match="timeout_ms"):
            kvctl.Client(c.endpoint, timeout_ms=0)
        with pytest.raises(ValueError, match="layers: got 0, expected 1..1024"):
            c.hello(layers=0, kv_heads=1, head_dim=64)
        with pytest.raises(ValueError, match="head_dim: got 12, expected a multiple of 8"):
            c.hello(layers=1, kv_heads=1, head_dim=12)
        with pytest.raises(ValueError, match="q_heads: got 3, expected 0 or a multiple"):
            c.hello(layers=1, kv_heads=2, q_heads=3, head_dim=64)
        with pytest.raises(ValueError, match="client_name: length 0"):
            c.hello(layers=1, kv_heads=1, head_dim=64, client_name="")
        with pytest.raises(ValueError, match="model_name: contains a NUL"):
            c.hello(layers=1, kv_heads=1, head_dim=64, model_name="a\0b")
        with pytest.raises(ValueError, match="dtype: got 'int8'"):
            c.hello(layers=1, kv_heads=1, head_dim=64, dtype="int8")
        with pytest.raises(kvctl.KvctlError, match="hello"):
            c.open(1)
        assert c.socket_resets == 0
    finally:
        c.disconnect()


# ---- Socket discipline against a scripted peer ---------------------------------------------


class ScriptedPeer:
    """A ROUTER socket answering each request with the frames script(request_id, n) returns
    (a list of replies; each reply a list of frames; [] = stay silent)."""

    def __init__(self, endpoint, script):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.script = script
        self.seen = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self.done.is_set():
            if not poller.poll(20):
                continue
            ident, frame0, *_ = self.sock.recv_multipart()
            request_id = p.peek_request_id(frame0)
            self.seen.append(request_id)
            for reply in self.script(request_id, len(self.seen)):
                self.sock.send_multipart([ident] + reply)

    def close(self):
        self.done.set()
        self.thread.join()
        self.sock.close()
        self.ctx.term()


def _pong(request_id, t):
    return [hdr(0x8004, request_id) + struct.pack("<Q", t)]


def test_client_drops_stale_replies_and_times_out_with_a_fresh_socket(workdir):
    endpoint = "ipc://%s/peer-%d.sock" % (workdir, os.getpid())

    def script(request_id, n):
        if n == 1:
            return []  # Silent: the client times out.
        # A late reply to the abandoned request 1 (stale), then the real answer.
        return [_pong(1, 111), _pong(request_id + 1000, 333), _pong(request_id, 222)]

    peer = ScriptedPeer(endpoint, script)
    c = kvctl.Client(endpoint, timeout_ms=300)
    try:
        with pytest.raises(kvctl.Timeout, match="PING request 1: no reply"):
            c.ping()
        assert c.socket_resets == 1
        assert c.ping() == 222
        assert c.stale_replies == 2
        assert peer.seen == [1, 2]
    finally:
        c.disconnect()
        peer.close()


def test_client_raises_protocol_error_on_malformed_or_mistyped_replies(workdir):
    endpoint = "ipc://%s/peer2-%d.sock" % (workdir, os.getpid())
    replies = {
        1: [hdr(0x8004, 1) + bytes(9)],                 # A trailing byte.
        2: [hdr(0x8002, 2)],                            # OPEN_REPLY to a PING.
        3: [hdr(0xFFFF, 3) + struct.pack("<II", 5, 4) + b"busy"],
        4: _pong(4, 7),
    }
    peer = ScriptedPeer(endpoint, lambda rid, n: [replies[rid]])
    c = kvctl.Client(endpoint, timeout_ms=2000)
    try:
        with pytest.raises(kvctl.ProtocolError, match="malformed reply: PING_REPLY: 1 unexpected"):
            c.ping()
        with pytest.raises(kvctl.ProtocolError, match="reply has type OPEN_REPLY"):
            c.ping()
        with pytest.raises(kvctl.ServerError) as e:
            c.ping()
        assert e.value.code == "FAILED_PRECONDITION" and e.value.message == "busy"
        assert c.ping() == 7  # Nothing broke the socket.
        assert c.socket_resets == 0
    finally:
        c.disconnect()
        peer.close()


def test_fetch_rows_split_per_pair_and_stack_only_when_heads_agree():
    # Heads hold different counts once eviction runs; the daemon cannot produce that yet.
    k = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)
    rows = p.Rows(4, 1, 2, 8, 0, np.array([2, 1], np.uint32), np.array([5, 6, 6]), k, -k)
    fk, fv, pos = kvctl.Client._split(rows, stacked=False)
    assert [x.shape for x in fk[0]] == [(2, 8), (1, 8)]
    assert np.array_equal(fk[0][1], k[2:]) and np.array_equal(fv[0][0], -k[:2])
    assert [x.tolist() for x in pos[0]] == [[5, 6], [6]]
    with pytest.raises(ValueError, match=r"different token counts \[2, 1\]"):
        kvctl.Client._split(rows, stacked=True)
    same = p.Rows(0, 1, 2, 8, 0, np.array([1, 1], np.uint32), np.array([5, 6]), k[:2], k[:2])
    with pytest.raises(ValueError, match="different token positions"):
        kvctl.Client._split(same, stacked=True)


def _layout_bytes(record_bytes, records_per_page):
    """A KVarN 2-bit layout (sections as in the PROTOCOL.md example, scaled to record_bytes)."""
    q = record_bytes // 4
    return (bytes([3, 2, 2, 1]) + struct.pack("<3I", 32, 8, record_bytes)
            + struct.pack("<8I", 0, q, q, q, 2 * q, q, 3 * q, q)
            + struct.pack("<2I", 0, records_per_page) + struct.pack("<2I", 32, 128))


def test_fetch_blocks_addresses_each_pair_with_its_own_layouts_records_per_page(workdir):
    """Two heads whose layouts differ in records_per_page (256-byte records 16 per page, 128-byte
    records 32 per page): record_offsets use each pair's own layout. The daemon produces such
    replies only when heads pack by their own record size, so a scripted peer sends one."""
    body = (struct.pack("<B4I", 1, 0, 1, 2, 8) + struct.pack("<4I", 4096, 64, 32, 0)
            + struct.pack("<H", 2) + _layout_bytes(256, 16) + _layout_bytes(128, 32)
            + struct.pack("<2H", 0, 1) + struct.pack("<3I", 0, 2, 4)
            + struct.pack("<4I", 17, 18, 33, 70) + struct.pack("<2I", 32, 5)
            # Window: pair 1 has one tail row, slot 130 (page 1 slot 2 at 128 per page).
            + struct.pack("<3I", 0, 0, 1) + struct.pack("<I", 130) + struct.pack("<2I", 0, 0)
            + struct.pack("<3I", 0, 0, 1) + struct.pack("<Q", 101) + struct.pack("<I", 1)
            + struct.pack("<2I", 0, 0) + struct.pack("<2Q", 11, 12))  # record_base, table_tags.
    endpoint = "ipc://%s/peer3-%d.sock" % (workdir, os.getpid())

    def script(request_id, n):
        if n == 1:
            hello = _hello_reply()
            return [[hello[:8] + struct.pack("<Q", request_id) + hello[16:]]]
        return [[hdr(0x8006, request_id) + body]]

    peer = ScriptedPeer(endpoint, script)
    c = kvctl.Client(endpoint, timeout_ms=2000)
    try:
        c.hello(layers=1, kv_heads=2, head_dim=8)
        b = c.fetch_blocks(1)
        assert [lay.records_per_page for lay in b.layouts] == [16, 32]
        assert not hasattr(b, "records_per_page")  # Per layout, never one per reply.
        # Pair 0: ids 17, 18 at 16 per page = page 1 slots 1, 2 of 256 bytes. Pair 1: id 33 at
        # 32 per page = page 1 slot 1 of 128 bytes (not page 2, as 16 per page would give), id 70
        # = page 2 slot 6.
        assert b.record_offsets.tolist() == [4096 + 256, 4096 + 512, 4096 + 128,
                                                8192 + 6 * 128]
        assert b.quantized_counts.tolist() == [64, 37]
        assert b.window_offsets.tolist() == [4096 + 2 * 32]
        assert [x.tolist() for x in b.window_positions[0]] == [[], [101]]
    finally:
        c.disconnect()
        peer.close()


STAGING_GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                              "golden", "staging_layouts.txt")


def test_staging_layout_matches_the_golden_table_cpp_is_checked_against():
    rows = 0
    with open(STAGING_GOLDEN) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            left, _, right = line.partition("|")
            layers, kv_heads, q_heads, head_dim, dtype, n_tokens, has_q = left.split()
            want = p.StagingLayout(*map(int, right.split()))
            got = p.staging_layout(int(layers), int(kv_heads), int(q_heads), int(head_dim), dtype,
                                   int(n_tokens), has_q == "1")
            assert got == want, line
            rows += 1
    assert rows >= 9
    with pytest.raises(ValueError, match="q_heads = 0"):
        p.staging_layout(2, 1, 0, 8, "float16", 3, True)
