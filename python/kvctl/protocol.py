# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kvctl wire protocol, version 1, in Python (the byte-level spec is ipc/PROTOCOL.md).

Encoders build the frames of each request after running the checks a sender must run
(PROTOCOL.md section 5) and raise ValueError naming the field; ``decode_reply`` parses and
validates a reply and raises ProtocolError naming the field. The bytes of frame 0 come from the
field tables of ipc/messages.def (kvctl.wire_schema, generated; kvctl.wire_codec walks them);
this module adds each message's semantic checks and its tensor frames, which become numpy
arrays. Replies are the typed dataclasses of wire_schema (see kvctl.protocol_types).

Thread safety: pure functions and immutable values.

    frames = encode_ping(request_id=1, session_id=0)
    sock.send_multipart(frames)
    reply = decode_reply(sock.recv_multipart())      # Reply(request_id=1, type=0x8004, body=...)
"""

from __future__ import annotations

import struct
from typing import List, NamedTuple, Sequence, Tuple

import numpy as np

from . import wire_codec as wc
from . import wire_schema as ws
from .protocol_types import (  # noqa: F401 (re-exported)
    CLASSES, CUDA_IPC_HANDLE_BYTES, POOL_CUDA_DEVICE, POOL_HOST_SHM, QUANT_METHODS,
    STATUS_CODE_VALUES, STATUS_CODES, AppendReply, BlocksReply, ByeReply, CloseReply, ErrorReply,
    FetchDenseReply, HelloReply, KvctlError, OpenPrefixReply, OpenReply, PingReply, ProtocolError,
    QuantInfo, RecordLayout, Reply, Rows, SavePrefixReply, ServerError, SessionLostError,
    StatsReply, Timeout)
from .wire_schema import (  # noqa: F401 (re-exported)
    HEADER_BYTES, LAYOUT_BYTES, MAGIC, MAX_APPEND_TOKENS, MAX_BLOCK_TOKENS,
    MAX_ERROR_MESSAGE_BYTES, MAX_FRAMES, MAX_HEAD_DIM, MAX_HEADER_FRAME_BYTES, MAX_HEADS,
    MAX_LAYERS, MAX_LAYOUTS, MAX_NAME_BYTES, MAX_POSITION, MAX_PREFIX_TOKENS, MAX_SECTION_BYTES,
    MAX_SHM_NAME_BYTES,
    MAX_STATS_TEXT_BYTES, MAX_TENSOR_FRAME_BYTES, MIN_HEAD_DIM, NO_PAGE, REPLY_BIT, VERSION,
    FLAG_APPEND_CONTINUES, KNOWN_HEADER_FLAGS, MsgType)

# ---- Constants (PROTOCOL.md sections 2, 3 and 6; the numbers are ipc/messages.def's) -----------

HEADER = struct.Struct("<IHHQH")  # magic, version, type, request_id, flags: 18 bytes.
assert HEADER.size == HEADER_BYTES
FIRST_REQUEST_TYPE, LAST_REQUEST_TYPE = min(ws.REQUEST_BODIES), max(ws.REQUEST_BODIES)


def type_name(msg_type: int) -> str:
    """"HELLO", "FETCH_REPLY", "ERROR"; unknown numbers read "0x0042" (as ipc::TypeName)."""
    if msg_type == MsgType.ERROR:
        return "ERROR"
    base = msg_type & ~REPLY_BIT
    if FIRST_REQUEST_TYPE <= base <= LAST_REQUEST_TYPE:
        return MsgType(base).name + ("_REPLY" if msg_type & REPLY_BIT else "")
    return "0x%04X" % msg_type


# kvctl::DType: wire code -> (name, numpy dtype of the raw rows). bfloat16 rows are uint16 bit
# patterns (numpy has no bfloat16).
DTYPES = {ws.DType.FLOAT32: ("float32", np.dtype("<f4")),
          ws.DType.FLOAT16: ("float16", np.dtype("<f2")),
          ws.DType.BFLOAT16: ("bfloat16", np.dtype("<u2"))}
DTYPE_CODES = {name: code for code, (name, _) in DTYPES.items()}
_DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


def dtype_code(dtype) -> int:
    """Wire code of a dtype given as a name ("float16", "bf16"), a numpy dtype or a torch dtype.

    Raises ValueError for anything else.
    """
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype in DTYPES:
        return dtype
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    key = _DTYPE_ALIASES.get(name.lower())
    if key is None:
        try:
            key = _DTYPE_ALIASES.get(np.dtype(dtype).name)
        except TypeError:
            key = None
    if key is None:
        raise ValueError("dtype: got %r, expected float32, float16 or bfloat16" % (dtype,))
    return DTYPE_CODES[key]


def dtype_name(code: int) -> str:
    return DTYPES[code][0]


class StagingLayout(NamedTuple):
    """Where an APPEND's tensors lie in the staging slot, from staging_offset (ipc/protocol.h
    StagingLayout, PROTOCOL.md): K of every layer, then V, then Q when has_q, back to back."""
    layer_bytes: int    # K (or V) of one layer.
    q_layer_bytes: int  # Q of one layer; 0 without Q.
    v_offset: int       # K starts at 0.
    q_offset: int       # == total_bytes without Q.
    total_bytes: int


def staging_layout(layers: int, kv_heads: int, q_heads: int, head_dim: int, dtype,
                   n_tokens: int, has_q: bool) -> StagingLayout:
    """The daemon's staging layout (ipc::AppendStagingLayout; both are checked against
    tests/golden/staging_layouts.txt). dtype: a name or wire code. ValueError for has_q without
    query heads."""
    if has_q and q_heads == 0:
        raise ValueError("has_q: got 1, expected 0: the session declared q_heads = 0")
    element = DTYPES[dtype_code(dtype)][1].itemsize
    layer_bytes = n_tokens * kv_heads * head_dim * element
    q_layer_bytes = n_tokens * q_heads * head_dim * element if has_q else 0
    v_offset = layer_bytes * layers
    return StagingLayout(layer_bytes, q_layer_bytes, v_offset, 2 * v_offset,
                         2 * v_offset + q_layer_bytes * layers)


# ---- Writing ----------------------------------------------------------------------------------


def _check_range(name: str, value: int, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError("%s: got %r, expected an integer in %d..%d" % (name, value, lo, hi))
    if not lo <= value <= hi:
        raise ValueError("%s: got %d, expected %d..%d" % (name, value, lo, hi))


def _check_head_dim(name: str, head_dim: int) -> None:
    _check_range(name, head_dim, MIN_HEAD_DIM, MAX_HEAD_DIM)
    if head_dim % 8:
        raise ValueError("%s: got %d, expected a multiple of 8 in %d..%d"
                         % (name, head_dim, MIN_HEAD_DIM, MAX_HEAD_DIM))


def _utf8(name: str, text: str, lo: int, hi: int) -> bytes:
    if not isinstance(text, str):
        raise ValueError("%s: got %r, expected a str" % (name, text))
    try:
        raw = text.encode("utf-8")  # Strict: lone surrogates fail.
    except UnicodeEncodeError as e:
        raise ValueError("%s: not encodable as UTF-8 (%s)" % (name, e.reason)) from None
    if b"\x00" in raw:
        raise ValueError("%s: contains a NUL character" % name)
    if not lo <= len(raw) <= hi:
        raise ValueError("%s: length %d bytes, expected %d..%d" % (name, len(raw), lo, hi))
    return raw


def header(msg_type: int, request_id: int, version: int = VERSION, flags: int = 0) -> bytes:
    """The 18-byte header. version and flags are parameters only so tests can break them."""
    return HEADER.pack(MAGIC, version, msg_type, request_id, flags)


def _check_session(session_id: int) -> None:
    _check_range("session_id", session_id, 1, 2**64 - 1)


def validate_geometry(layers: int, kv_heads: int, q_heads: int, head_dim: int) -> None:
    """The checks of ipc::ValidateGeometry; raises ValueError naming the field."""
    _check_range("layers", layers, 1, MAX_LAYERS)
    _check_range("kv_heads", kv_heads, 1, MAX_HEADS)
    _check_range("q_heads", q_heads, 0, MAX_HEADS)
    if q_heads % kv_heads:
        raise ValueError("q_heads: got %d, expected 0 or a multiple of kv_heads (%d)"
                         % (q_heads, kv_heads))
    _check_head_dim("head_dim", head_dim)


def encode_message(msg_type: int, request_id: int, body) -> list:
    """The frames of a message whose body is the messages.def dataclass `body`: frame 0 from the
    field table, then its frame fields that are set (str as UTF-8, buffers as they are). No
    checks: the encode_* functions run them first."""
    name = wc.body_name(type(body))
    frames = [header(msg_type, request_id) + wc.write_fields(name, body)]
    for f in wc.frame_fields(name):
        value = getattr(body, f.name)
        if value is not None:
            frames.append(value.encode("utf-8") if isinstance(value, str) else value)
    return frames


def encode_hello(request_id: int, client_name: str, model_name: str, layers: int, kv_heads: int,
                 q_heads: int, head_dim: int, dtype, client_max_version: int = VERSION
                 ) -> List[bytes]:
    _check_range("client_max_version", client_max_version, 1, 0xFFFF)
    _utf8("client_name", client_name, 1, MAX_NAME_BYTES)
    _utf8("model_name", model_name, 0, MAX_NAME_BYTES)
    validate_geometry(layers, kv_heads, q_heads, head_dim)
    return encode_message(MsgType.HELLO, request_id, ws.HelloRequest(
        client_max_version, client_name, model_name, layers, kv_heads, q_heads, head_dim,
        dtype_code(dtype)))


def encode_open(request_id: int, session_id: int, sequence_id: int) -> List[bytes]:
    _check_session(session_id)
    _check_range("sequence_id", sequence_id, 0, 2**64 - 1)
    return encode_message(MsgType.OPEN, request_id, ws.OpenRequest(session_id, sequence_id))


def encode_close(request_id: int, session_id: int, sequence_id: int) -> List[bytes]:
    _check_session(session_id)
    _check_range("sequence_id", sequence_id, 0, 2**64 - 1)
    return encode_message(MsgType.CLOSE, request_id, ws.CloseRequest(session_id, sequence_id))


def encode_ping(request_id: int, session_id: int = 0) -> List[bytes]:
    _check_range("session_id", session_id, 0, 2**64 - 1)
    return encode_message(MsgType.PING, request_id, ws.PingRequest(session_id))


SOURCE_INLINE, SOURCE_STAGING = ws.AppendSource.INLINE, ws.AppendSource.STAGING


def encode_append(request_id: int, session_id: int, sequence_id: int, first_position: int,
                  n_tokens: int, tensors: Sequence = (), source: int = SOURCE_INLINE,
                  has_q: bool = False, staging_offset: int = 0, continues: bool = False) -> list:
    """APPEND: tensors are K, V (and Q if has_q) as buffers for inline, nothing for staging.

    continues sets the header flag APPEND_CONTINUES: more tokens of the same prefill follow, so
    the daemon stores these without evicting until an APPEND without it (PROTOCOL.md 4.4).

    Checks what the message itself declares (as ipc's Validate(AppendRequest)); the sizes
    against the session geometry are checked by the caller and the server.
    """
    _check_session(session_id)
    _check_range("sequence_id", sequence_id, 0, 2**64 - 1)
    _check_range("n_tokens", n_tokens, 1, MAX_APPEND_TOKENS)
    _check_range("first_position", first_position, 0, MAX_POSITION - n_tokens)
    _check_range("source", source, *wc.enum_range("AppendSource"))
    _check_range("staging_offset", staging_offset, 0, 2**64 - 1)
    tensors = list(tensors)
    if source == SOURCE_STAGING:
        if tensors:
            raise ValueError("staging append: carries %d tensor frames, expected none"
                             % len(tensors))
    else:
        if staging_offset != 0:
            raise ValueError("staging_offset: got %d, expected 0 for source 0 (inline)"
                             % staging_offset)
        want = 3 if has_q else 2
        if len(tensors) != want:
            raise ValueError("tensors: got %d frames, expected %d (k, v%s)"
                             % (len(tensors), want, ", q" if has_q else ""))
        sizes = [memoryview(t).nbytes for t in tensors]
        for name, size in zip("kvq", sizes):
            if size == 0 or size % n_tokens or size > MAX_TENSOR_FRAME_BYTES:
                raise ValueError("%s: frame has %d bytes, expected a positive multiple of "
                                 "n_tokens (%d) up to %d" % (name, size, n_tokens,
                                                             MAX_TENSOR_FRAME_BYTES))
        if sizes[1] != sizes[0]:
            raise ValueError("v: frame has %d bytes, expected %d (same as k)"
                             % (sizes[1], sizes[0]))
    k, v, q = (tensors + [None, None, None])[:3]
    frames = encode_message(MsgType.APPEND, request_id, ws.AppendRequest(
        session_id, sequence_id, first_position, n_tokens, int(source), bool(has_q),
        staging_offset, k, v, q))
    if continues:
        frames[0] = header(MsgType.APPEND, request_id, flags=FLAG_APPEND_CONTINUES) + \
            frames[0][HEADER_BYTES:]
    return frames


MODE_DENSE, MODE_BLOCKS = ws.FetchMode.DENSE, ws.FetchMode.BLOCKS


def encode_fetch(request_id: int, session_id: int, sequence_id: int, layer_begin: int,
                 layer_end: int, mode: int = MODE_DENSE, out_dtype="float32",
                 known_records=None, known_tags=None) -> List[bytes]:
    """known_records / known_tags (blocks mode): per pair of the range, the records held from an
    earlier reply and the table_tags entry it gave with them (PROTOCOL.md 4.5, "Only what is
    new"); None = the whole table."""
    _check_session(session_id)
    _check_range("sequence_id", sequence_id, 0, 2**64 - 1)
    _check_range("layer_end", layer_end, 1, MAX_LAYERS)
    _check_range("layer_begin", layer_begin, 0, layer_end - 1)
    _check_range("mode", mode, *wc.enum_range("FetchMode"))
    records = np.asarray([] if known_records is None else known_records, dtype=np.uint32)
    tags = np.asarray([] if known_tags is None else known_tags, dtype=np.uint64)
    if records.ndim != 1 or tags.shape != records.shape:
        raise ValueError("known_records, known_tags: got shapes %s and %s, expected two equal "
                         "1-D arrays" % (records.shape, tags.shape))
    if records.size and mode != MODE_BLOCKS:
        raise ValueError("known_records: got %d entries, expected none in dense mode"
                         % records.size)
    return encode_message(MsgType.FETCH, request_id, ws.FetchRequest(
        session_id, sequence_id, layer_begin, layer_end, int(mode), dtype_code(out_dtype),
        int(records.size), records, tags))


def encode_stats(request_id: int, session_id: int = 0, section: str = "") -> List[bytes]:
    _check_range("session_id", session_id, 0, 2**64 - 1)
    _utf8("section", section, 0, MAX_SECTION_BYTES)
    return encode_message(MsgType.STATS, request_id, ws.StatsRequest(session_id, section))


def encode_bye(request_id: int, session_id: int) -> List[bytes]:
    _check_session(session_id)
    return encode_message(MsgType.BYE, request_id, ws.ByeRequest(session_id))


_INT32_MAX = 2**31 - 1


def token_frame(tokens) -> np.ndarray:
    """Token ids (a sequence of ints, or a 1-D integer numpy array or tensor) as the frame of
    SAVE_PREFIX and OPEN_PREFIX: little-endian int32, checked as ipc's CheckTokens (1 ..
    MAX_PREFIX_TOKENS ids, each >= 0) and fitting an int32. ValueError naming the field, and
    the index of the first bad id."""
    if hasattr(tokens, "detach"):  # torch.Tensor, without importing torch.
        tokens = tokens.detach().cpu().numpy()
    if isinstance(tokens, (str, bytes, bytearray)):
        raise ValueError("tokens: got %s, expected a sequence of integer token ids"
                         % type(tokens).__name__)
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as e:  # Ragged nesting and the like.
        raise ValueError("tokens: got %s, expected a sequence of integer token ids (%s)"
                         % (type(tokens).__name__, e)) from None
    if arr.ndim != 1:
        raise ValueError("tokens: got shape %s, expected one dimension of token ids"
                         % (list(arr.shape),))
    if not 1 <= arr.size <= MAX_PREFIX_TOKENS:
        raise ValueError("tokens: got %d ids, expected 1..%d" % (arr.size, MAX_PREFIX_TOKENS))
    if arr.dtype.kind == "O":  # Python ints past int64, or things that are not ints.
        values = arr.tolist()
        for i, t in enumerate(values):
            if isinstance(t, bool) or not isinstance(t, int):
                raise ValueError("tokens[%d]: got %r, expected an integer token id" % (i, t))
        bad = [i for i, t in enumerate(values) if not 0 <= t <= _INT32_MAX][:1]
    elif arr.dtype.kind in "iu":
        bad = np.flatnonzero((arr < 0) | (arr > _INT32_MAX))[:1].tolist()
    else:
        raise ValueError("tokens: got dtype %s, expected integer token ids" % arr.dtype)
    if bad:
        i = bad[0]
        value = int(arr[i])
        if value < 0:
            raise ValueError("tokens[%d]: got %d, expected a token id >= 0" % (i, value))
        raise ValueError("tokens[%d]: got %d, expected a token id <= %d (int32)"
                         % (i, value, _INT32_MAX))
    return np.ascontiguousarray(arr.astype(np.int64) if arr.dtype.kind == "O" else arr,
                                dtype="<i4")


def encode_save_prefix(request_id: int, session_id: int, sequence_id: int, tokens) -> list:
    """SAVE_PREFIX (PROTOCOL.md 4.9): tokens are the ids of every token the sequence holds, in
    position order (see token_frame for what is accepted and checked)."""
    _check_session(session_id)
    _check_range("sequence_id", sequence_id, 0, 2**64 - 1)
    return encode_message(MsgType.SAVE_PREFIX, request_id, ws.SavePrefixRequest(
        session_id, sequence_id, token_frame(tokens)))


def encode_open_prefix(request_id: int, session_id: int, sequence_id: int, tokens) -> list:
    """OPEN_PREFIX (PROTOCOL.md 4.10): opens `sequence_id` (not open yet) from the longest stored
    prefix of the prompt `tokens` (a client that needs logits for the last prompt token leaves
    it out)."""
    _check_session(session_id)
    _check_range("sequence_id", sequence_id, 0, 2**64 - 1)
    return encode_message(MsgType.OPEN_PREFIX, request_id, ws.OpenPrefixRequest(
        session_id, sequence_id, token_frame(tokens)))


def is_session_lost(code_value: int, message: str) -> bool:
    """Whether an ERROR says the request's session is unknown (PROTOCOL.md section 3: NOT_FOUND
    with a message starting "session_id:"), as opposed to e.g. a sequence that is not open."""
    return STATUS_CODES.get(code_value) == "NOT_FOUND" and message.startswith("session_id:")


# ---- Reading ----------------------------------------------------------------------------------


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise ProtocolError(message)


_in_range = wc.in_range


def peek_request_id(frame0) -> int:
    """The request id of a frame 0, or 0 if it does not start with the magic and 16 bytes."""
    raw = bytes(frame0[:16])
    if len(raw) < 16:
        return 0
    magic, _version, _type, request_id = struct.unpack("<IHHQ", raw)
    return request_id if magic == MAGIC else 0


def header_flags(frame0: bytes) -> int:
    """The flags field of a header (PROTOCOL.md 2.1); 0 for a frame too short to hold one."""
    return HEADER.unpack_from(frame0)[4] if len(frame0) >= HEADER_BYTES else 0


def _check_flags(msg_type: int, flags: int) -> None:
    """Unknown bits anywhere, and APPEND_CONTINUES on anything but an APPEND request."""
    _expect(flags & ~KNOWN_HEADER_FLAGS == 0,
            "flags: got 0x%04X, expected only bit 0 (0x0001, APPEND_CONTINUES); every other bit "
            "is reserved in version 1" % flags)
    allowed = KNOWN_HEADER_FLAGS if msg_type == MsgType.APPEND else 0
    _expect(flags & ~allowed == 0,
            "flags: got 0x%04X on %s, expected 0 (APPEND_CONTINUES, 0x0001, is valid only on "
            "APPEND)" % (flags, type_name(msg_type)))


def decode_header(frame0: bytes) -> Tuple[int, int]:
    """(type, request_id) of a valid header; raises ProtocolError naming the field. A flag bit
    is accepted only where it belongs (APPEND_CONTINUES on an APPEND request)."""
    _expect(len(frame0) <= MAX_HEADER_FRAME_BYTES,
            "frame 0: %d bytes, expected at most %d" % (len(frame0), MAX_HEADER_FRAME_BYTES))
    _expect(len(frame0) >= HEADER_BYTES, "header: frame 0 has %d bytes, expected at least %d"
            % (len(frame0), HEADER_BYTES))
    magic, version, msg_type, request_id, flags = HEADER.unpack_from(frame0)
    _expect(magic == MAGIC, "magic: got 0x%08X, expected 0x%08X (\"KVCT\")" % (magic, MAGIC))
    _expect(version == VERSION, "version: got %d, expected %d" % (version, VERSION))
    _check_flags(msg_type, flags)
    return msg_type, request_id


def _frame_bytes(frame) -> int:
    return memoryview(frame).nbytes


def _rows(prefix: str, head_dim: int, dtype: int, counts: np.ndarray,
          frames: Sequence) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checks and reads frames 1..3 (positions, k, v) for the given per-pair counts."""
    n = int(counts.sum(dtype=np.uint64))
    row_dtype = DTYPES[dtype][1]
    want = {"positions": n * 8, "k": n * head_dim * row_dtype.itemsize}
    want["v"] = want["k"]
    for name, frame in zip(("positions", "k", "v"), frames):
        size = _frame_bytes(frame)
        _expect(size == want[name], "%s%s: frame has %d bytes, expected %d"
                % (prefix, name, size, want[name]))
        _expect(size <= MAX_TENSOR_FRAME_BYTES, "%s%s: %d bytes exceed the frame limit of %d"
                % (prefix, name, size, MAX_TENSOR_FRAME_BYTES))
    positions = np.frombuffer(frames[0], dtype="<i8").astype(np.int64)
    bad = np.flatnonzero((positions < 0) | (positions >= MAX_POSITION))
    _expect(bad.size == 0, "%spositions[%d]: got %d, expected 0..%d"
            % (prefix, bad[0] if bad.size else 0, positions[bad[0]] if bad.size else 0,
               MAX_POSITION - 1))
    k = np.frombuffer(frames[1], dtype=row_dtype).astype(row_dtype.newbyteorder("="))
    v = np.frombuffer(frames[2], dtype=row_dtype).astype(row_dtype.newbyteorder("="))
    return positions, k.reshape(n, head_dim), v.reshape(n, head_dim)


def _check_pair_shape(v: dict) -> int:
    """Checks the fields both FETCH replies start with; returns the number of pairs."""
    _in_range("n_layers", v["n_layers"], 1, MAX_LAYERS)
    _in_range("layer_begin", v["layer_begin"], 0, MAX_LAYERS - v["n_layers"])
    _in_range("kv_heads", v["kv_heads"], 1, MAX_HEADS)
    head_dim = v["head_dim"]
    _expect(MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM and head_dim % 8 == 0,
            "head_dim: got %d, expected a multiple of 8 in %d..%d"
            % (head_dim, MIN_HEAD_DIM, MAX_HEAD_DIM))
    return v["n_layers"] * v["kv_heads"]


def _side_nnz(v: dict) -> int:
    any_side = any(lay.side_bytes_per_token > 0 for lay in v["layouts"])
    return int(v["indptr"][-1]) if any_side else 0


# messages.def count rules: arrays are sized from the fields before them, the pair shape checked
# first (as ipc's ArrayCount).
_COUNT_RULES = {
    "Pairs": _check_pair_shape,
    "PairsPlusOne": lambda v: _check_pair_shape(v) + 1,
    "Nnz": lambda v: int(v["indptr"][-1]),
    "SideNnz": _side_nnz,
    "WindowNnz": lambda v: int(v["window_indptr"][-1]),
    "RunNnz": lambda v: int(v["run_indptr"][-1]),
    "Known": lambda v: _known_count(v),
}


def _known_count(v: dict) -> int:
    """A FETCH request's known table, bounded as ipc's ArrayCount bounds it."""
    _in_range("layer_end", v["layer_end"], 1, MAX_LAYERS)
    _in_range("layer_begin", v["layer_begin"], 0, v["layer_end"] - 1)
    n = v["n_known"]
    _expect(n == 0 or v["mode"] == MODE_BLOCKS, "n_known: got %d, expected 0 in dense mode (a "
            "known table is for blocks mode)" % n)
    most = (v["layer_end"] - v["layer_begin"]) * MAX_HEADS
    _expect(n <= most, "n_known: got %d, expected at most %d (the range's layers x %d heads)"
            % (n, most, MAX_HEADS))
    return n


def _check_hello(h: HelloReply) -> None:
    on_device = h.pool_location == POOL_CUDA_DEVICE
    _expect(not on_device or not h.shm_name,
            'shm_name: got "%s", expected none for a pool in device memory (pool_location 1)'
            % h.shm_name)
    _expect(on_device or (h.cuda_device == 0 and not any(h.cuda_ipc_handle)),
            "cuda_ipc_handle/cuda_device: got a handle that is not all zero or device %d, "
            "expected zeros for a pool in host memory" % h.cuda_device)
    _expect(h.session_id != 0, "session_id: got 0, expected a session from HELLO")
    _expect(len(h.server_version) > 0, "server_version: length 0 bytes, expected 1..256")
    _in_range("page_bytes", h.page_bytes, 1, 2**32 - 1)
    staging_offset, staging_bytes = h.staging_offset, h.staging_bytes
    _expect(staging_bytes > 0 or staging_offset == 0,
            "staging_offset: got %d, expected 0 when staging_bytes is 0" % staging_offset)
    _expect(not h.staging_shm_name or (not on_device and staging_bytes > 0),
            'staging_shm_name: got "%s", expected none for a device pool or a session without '
            'staging' % h.staging_shm_name)
    _expect(staging_bytes == 0 or staging_offset + staging_bytes < 2**64,
            "staging slot: offset %d + bytes %d ends past 2^64" % (staging_offset, staging_bytes))
    _expect(staging_bytes == 0 or h.staging_shm_name
            or staging_offset + staging_bytes <= h.pool_bytes,
            "staging slot: offset %d + bytes %d ends past pool_bytes %d"
            % (staging_offset, staging_bytes, h.pool_bytes))
    _expect(staging_bytes == 0 or on_device or h.shm_name,
            "shm_name: empty, expected the pool's shm name when staging_bytes is %d"
            % staging_bytes)
    quant = h.quant
    _in_range("quant.method", quant.method, 0, len(QUANT_METHODS) - 1)
    _in_range("quant.k_bits", quant.k_bits, 1, 16)
    _in_range("quant.v_bits", quant.v_bits, 1, 16)
    _in_range("quant.block_tokens", quant.block_tokens, 1, MAX_BLOCK_TOKENS)
    _expect(quant.flush_tokens > 0 and quant.flush_tokens % quant.block_tokens == 0,
            "quant.flush_tokens: got %d, expected a positive multiple of block_tokens (%d)"
            % (quant.flush_tokens, quant.block_tokens))


def _check_layout(i: int, lay: RecordLayout, page_bytes: int, block_tokens: int,
                  side_records_per_page: int, head_dim: int) -> None:
    at = "layouts[%d]." % i
    _in_range(at + "method", lay.method, 0, len(QUANT_METHODS) - 1)
    _in_range(at + "k_bits", lay.k_bits, 1, 16)
    _in_range(at + "v_bits", lay.v_bits, 1, 16)
    _in_range(at + "record_bytes", lay.record_bytes, 1, page_bytes)
    max_per_page = page_bytes // lay.record_bytes
    _expect(1 <= lay.records_per_page <= max_per_page,
            "%srecords_per_page: got %d, expected 1..%d with records_per_page x record_bytes (%d) "
            "<= page_bytes (%d)" % (at, lay.records_per_page, max_per_page, lay.record_bytes,
                                    page_bytes))
    sections = [("k_codes", lay.k_codes_offset, lay.k_codes_bytes),
                ("k_meta", lay.k_meta_offset, lay.k_meta_bytes),
                ("v_codes", lay.v_codes_offset, lay.v_codes_bytes),
                ("v_meta", lay.v_meta_offset, lay.v_meta_bytes)]
    for name, offset, size in sections:
        _expect(offset + size <= lay.record_bytes, "%s%s: offset %d + bytes %d ends past "
                "record_bytes %d" % (at, name, offset, size, lay.record_bytes))
    for a in range(4):
        for b in range(a + 1, 4):
            na, oa, sa = sections[a]
            nb, ob, sb = sections[b]
            if sa and sb and oa < ob + sb and ob < oa + sa:
                raise ProtocolError("%s%s [%d, %d) overlaps %s [%d, %d)"
                                    % (at, na, oa, oa + sa, nb, ob, ob + sb))
    # Window rows: K row then V row per slot.
    min_slot = 2 * head_dim * DTYPES[lay.row_dtype][1].itemsize
    _expect(min_slot <= lay.row_slot_bytes <= page_bytes,
            "%srow_slot_bytes: got %d, expected %d (K and V rows of head_dim %d) .. page_bytes (%d)"
            % (at, lay.row_slot_bytes, min_slot, head_dim, page_bytes))
    _in_range(at + "rows_per_page", lay.rows_per_page, 1, page_bytes // lay.row_slot_bytes)
    side = lay.side_bytes_per_token * block_tokens
    _expect(side == 0 or side <= page_bytes // side_records_per_page,
            "%sside_bytes_per_token: got %d, expected side_records_per_page (%d) * block_tokens "
            "(%d) * it <= page_bytes (%d)" % (at, lay.side_bytes_per_token,
                                              side_records_per_page, block_tokens, page_bytes))


def _check_indptr(name: str, indptr: np.ndarray) -> None:
    """indptr[0] = 0, non-decreasing (as ipc's CheckIndptr)."""
    _expect(indptr[0] == 0, "%s[0]: got %d, expected 0" % (name, indptr[0]))
    bad = np.flatnonzero(np.diff(indptr.astype(np.int64)) < 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise ProtocolError("%s[%d]: got %d, expected >= %s[%d] = %d"
                            % (name, i, indptr[i], name, i - 1, indptr[i - 1]))


def _slot_error(name: str, j: int, slot_id: int, per_page: int, pool_pages: int) -> str:
    return ("%s[%d]: got %d (page %d), expected an id on a page below pool_pages (%d) with %d "
            "slots per page" % (name, j, slot_id, slot_id // per_page, pool_pages, per_page))


def _check_records(v: dict, i: int, lay, any_side: bool) -> None:
    """Pair i's record ids (and side record ids): real ids on pages of the pool."""
    a, b = int(v["indptr"][i]), int(v["indptr"][i + 1])
    if a == b:
        return
    pool_pages, ids = v["pool_pages"], v["indices"][a:b]
    pair_side = lay.side_bytes_per_token > 0
    bad = (ids == NO_PAGE) | (ids // lay.records_per_page >= pool_pages)
    if any_side:
        side = v["side_indices"][a:b]
        bad |= (side != NO_PAGE) != pair_side
        if pair_side:
            bad |= side // v["side_records_per_page"] >= pool_pages
    first = np.flatnonzero(bad)
    if not first.size:
        return
    j = a + int(first[0])
    x = int(v["indices"][j])
    _expect(x != NO_PAGE, "indices[%d]: got %d (no page), expected a page id" % (j, NO_PAGE))
    _expect(x // lay.records_per_page < pool_pages,
            _slot_error("indices", j, x, lay.records_per_page, pool_pages))
    y = int(v["side_indices"][j])
    _expect((y != NO_PAGE) == pair_side, "side_indices[%d]: got %d, expected %s for the layout "
            "of pair %d" % (j, y, "a page id" if pair_side else "4294967295 (no side record)", i))
    raise ProtocolError(_slot_error("side_indices", j, y, v["side_records_per_page"],
                                    pool_pages))


def _check_window(v: dict, i: int, lay) -> None:
    """Pair i's window (as ipc's CheckWindow): row ids on pages of the pool, at most every row a
    sink, position runs non-empty, increasing, covering exactly its rows, below MAX_POSITION."""
    a, b = int(v["window_indptr"][i]), int(v["window_indptr"][i + 1])
    rows, pool_pages = b - a, v["pool_pages"]
    bad = np.flatnonzero(v["window_ids"][a:b] // lay.rows_per_page >= pool_pages)
    if bad.size:
        j = a + int(bad[0])
        raise ProtocolError(_slot_error("window_ids", j, int(v["window_ids"][j]),
                                        lay.rows_per_page, pool_pages))
    _in_range("window_sinks[%d]" % i, int(v["window_sinks"][i]), 0, rows)
    covered = next_start = 0
    for j in range(int(v["run_indptr"][i]), int(v["run_indptr"][i + 1])):
        start, length = int(v["run_starts"][j]), int(v["run_lengths"][j])
        _in_range("run_lengths[%d]" % j, length, 1, rows - min(covered, rows))
        _expect(start >= next_start, "run_starts[%d]: got %d, expected >= %d (past the previous "
                "run of pair %d)" % (j, start, next_start, i))
        _expect(start <= MAX_POSITION - length, "run_starts[%d]: got %d, expected its %d "
                "positions below %d" % (j, start, length, MAX_POSITION))
        covered += length
        next_start = start + length
    _expect(covered == rows, "run_lengths: pair %d's runs cover %d rows, expected its window "
            "rows (%d)" % (i, covered, rows))


def _check_blocks(v: dict) -> None:
    """The page-table rules of a blocks reply (PROTOCOL.md 4.5), as ipc's Validate."""
    pairs = v["n_layers"] * v["kv_heads"]
    page_bytes, block_tokens = v["page_bytes"], v["block_tokens"]
    side_records_per_page, layouts = v["side_records_per_page"], v["layouts"]
    layout_index, last_page_len, indptr = v["layout_index"], v["last_page_len"], v["indptr"]
    any_side = any(lay.side_bytes_per_token > 0 for lay in layouts)
    _in_range("page_bytes", page_bytes, 1, 2**32 - 1)
    _in_range("pool_pages", v["pool_pages"], 1, 2**32 - 1)
    _in_range("block_tokens", block_tokens, 1, MAX_BLOCK_TOKENS)
    _in_range("side_records_per_page", side_records_per_page, 1 if any_side else 0,
              page_bytes if any_side else 0)
    for i, lay in enumerate(layouts):
        _check_layout(i, lay, page_bytes, block_tokens, side_records_per_page, v["head_dim"])
    for name in ("indptr", "window_indptr", "run_indptr"):
        _check_indptr(name, v[name])
    if _pairs_valid(v, pairs, any_side):
        return
    # Something is wrong: find the first problem pair by pair, as ipc's Validate reports it.
    for i in range(pairs):
        _in_range("layout_index[%d]" % i, int(layout_index[i]), 0, len(layouts) - 1)
        lay = layouts[layout_index[i]]
        has_pages = indptr[i + 1] > indptr[i] or v["record_base"][i] > 0
        _in_range("last_page_len[%d]" % i, int(last_page_len[i]), 1 if has_pages else 0,
                  block_tokens if has_pages else 0)
        _check_records(v, i, lay, any_side)
        _check_window(v, i, lay)
    raise AssertionError("blocks reply: the whole-array checks refused what the per-pair "
                         "checks accept")  # Our bug: the two must agree.


def _pairs_valid(v: dict, pairs: int, any_side: bool) -> bool:
    """The per-pair rules of _check_blocks over whole arrays at once (numpy, no Python loop per
    pair): True when every pair passes. The indptr arrays are already checked."""
    layouts, pool_pages, block_tokens = v["layouts"], v["pool_pages"], v["block_tokens"]
    li = v["layout_index"].astype(np.int64)
    if pairs == 0 or (li >= len(layouts)).any():
        return pairs == 0
    counts = np.diff(v["indptr"].astype(np.int64))
    held = (counts > 0) | (v["record_base"] > 0)  # The pair has records, listed or held.
    lpl = v["last_page_len"].astype(np.int64)
    if (held & ((lpl < 1) | (lpl > block_tokens)) | ~held & (lpl != 0)).any():
        return False
    per_layout = lambda name: np.array([getattr(l, name) for l in layouts],  # noqa: E731
                                       dtype=np.int64)
    rec_lay = np.repeat(li, counts)
    ids = v["indices"].astype(np.int64)
    if ((ids == NO_PAGE) | (ids // per_layout("records_per_page")[rec_lay] >= pool_pages)).any():
        return False
    if any_side:
        side = v["side_indices"].astype(np.int64)
        has_side = (per_layout("side_bytes_per_token") > 0)[rec_lay]
        if ((side != NO_PAGE) != has_side).any():
            return False
        if (has_side & (side // v["side_records_per_page"] >= pool_pages)).any():
            return False
    rows = np.diff(v["window_indptr"].astype(np.int64))
    win_lay = np.repeat(li, rows)
    if (v["window_ids"].astype(np.int64) // per_layout("rows_per_page")[win_lay]
            >= pool_pages).any() or (v["window_sinks"].astype(np.int64) > rows).any():
        return False
    runs = np.diff(v["run_indptr"].astype(np.int64))
    starts = v["run_starts"].astype(np.uint64)
    lengths = v["run_lengths"].astype(np.int64)
    if (lengths < 1).any() or (starts > (MAX_POSITION - lengths).astype(np.uint64)).any():
        return False
    covered = np.zeros(pairs, dtype=np.int64)
    np.add.at(covered, np.repeat(np.arange(pairs), runs), lengths)
    if (covered != rows).any():
        return False
    # Runs of one pair increase without overlapping (starts < 2^62 here: no overflow).
    same_pair = np.repeat(np.arange(pairs), runs)
    follows = same_pair[1:] == same_pair[:-1]
    ends = starts[:-1] + lengths[:-1].astype(np.uint64)
    return not (follows & (starts[1:] < ends)).any()


def _text(frame) -> str:
    raw = bytes(frame)
    _expect(len(raw) <= MAX_STATS_TEXT_BYTES, "text: length %d bytes, expected 0..%d"
            % (len(raw), MAX_STATS_TEXT_BYTES))
    _expect(b"\x00" not in raw, "text: not valid UTF-8 (or contains NUL)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("text: not valid UTF-8 (or contains NUL)") from None


def decode_reply(frames: Sequence) -> Reply:
    """Parses and validates one reply (a list of bytes-like frames).

    Raises ProtocolError naming the first field that breaks PROTOCOL.md; an ERROR reply is
    returned as a Reply whose body is an ErrorReply.
    """
    if not frames:
        raise ProtocolError("message: no frames, expected a header frame")
    frame0 = bytes(frames[0])
    msg_type, request_id = decode_header(frame0)
    what = type_name(msg_type)
    known = msg_type == MsgType.ERROR or (
        msg_type & REPLY_BIT and FIRST_REQUEST_TYPE <= msg_type & ~REPLY_BIT <= LAST_REQUEST_TYPE)
    if not known:
        raise ProtocolError("type: got %s, expected a %sreply"
                            % (what, "known " if msg_type & REPLY_BIT else ""))
    if len(frames) > MAX_FRAMES:
        raise ProtocolError("%s: frame count: got %d, expected at most %d"
                            % (what, len(frames), MAX_FRAMES))
    for i in range(1, len(frames)):
        size = _frame_bytes(frames[i])
        if size > MAX_TENSOR_FRAME_BYTES:
            raise ProtocolError("%s: frame %d: %d bytes, expected at most %d"
                                % (what, i, size, MAX_TENSOR_FRAME_BYTES))
    r = wc.Reader(frame0, HEADER_BYTES, len(frames))
    try:
        body = _decode_body(_reply_body_name(msg_type, frame0), r, frames[1:])
    except ProtocolError as e:
        raise ProtocolError("%s: %s" % (what, e)) from None
    return Reply(request_id, msg_type, body)


# The reply body of each request type but FETCH (whose two replies the mode byte tells apart).
_REPLY_BODY_OF = {t: name for name, t in ws.REPLY_BODIES.items() if t != MsgType.FETCH}


def _reply_body_name(msg_type: int, frame0: bytes) -> str:
    if msg_type == MsgType.ERROR:
        return "ErrorReply"
    base = msg_type & ~REPLY_BIT
    if base == MsgType.FETCH:  # The first body byte tells the two FETCH replies apart.
        mode = wc.Reader(frame0, HEADER_BYTES).int("mode", "<B")
        _expect(mode in (MODE_DENSE, MODE_BLOCKS), "mode: got %d, expected 0..1" % mode)
        return "FetchDenseReply" if mode == MODE_DENSE else "FetchBlocksReply"
    return _REPLY_BODY_OF[base]


def _decode_body(name: str, r: wc.Reader, tensors: Sequence):
    """Reads the fields of reply body `name` by its table, then runs the message's own checks
    and reads its tensor frames."""
    v = wc.read_fields(r, name, _COUNT_RULES)
    r.finish(len(wc.frame_fields(name)))
    if name == "ErrorReply":
        pass
    elif name == "HelloReply":
        _check_hello(CLASSES[name](**v))
    elif name == "AppendReply":
        _in_range("tokens_quantized", v["tokens_quantized"], 0, v["tokens_total"])
    elif name == "StatsReply":
        v["text"] = _text(tensors[0])
    elif name == "FetchDenseReply":
        rows = _rows("", v["head_dim"], v["dtype"], v["counts"], tensors)
        v.update(positions=rows[0], k=rows[1], v=rows[2])
    elif name == "FetchBlocksReply":
        _check_blocks(v)
    return CLASSES[name](**v)


def decode_request(frames: Sequence) -> Tuple[int, int, object]:
    """(type, request_id, body) of a request, read by the field tables alone: the structure is
    checked (lengths, strings, enum ranges, frame count for messages with fixed frames), not the
    semantic rules the daemon applies. For tests and tools that play the server."""
    _expect(len(frames) > 0, "message: no frames, expected a header frame")
    frame0 = bytes(frames[0])
    msg_type, request_id = decode_header(frame0)
    _expect(msg_type in ws.REQUEST_BODIES, "type: got %s, expected a request" % type_name(msg_type))
    name = ws.REQUEST_BODIES[msg_type]
    r = wc.Reader(frame0, HEADER_BYTES, len(frames))
    v = wc.read_fields(r, name, _COUNT_RULES)
    tensors = [bytes(f) for f in frames[1:]]
    slots = wc.frame_fields(name)
    _expect(len(tensors) <= len(slots), "frame count: got %d, expected at most %d"
            % (len(frames), 1 + len(slots)))
    r.frames = 1 + len(tensors)
    r.finish(len(tensors))
    for f, tensor in zip(slots, tensors + [None] * (len(slots) - len(tensors))):
        v[f.name] = tensor
    return msg_type, request_id, CLASSES[name](**v)


# ---- bfloat16 helpers (numpy has no bfloat16; bf16 data travels as uint16 bit patterns) -------


def float32_to_bf16(x) -> np.ndarray:
    """Rounds to nearest even into bf16 bit patterns (uint16), as kvctl::FloatToBf16; NaN stays
    NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_to_float32(bits) -> np.ndarray:
    """Widens bf16 bit patterns (uint16) to float32 exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
