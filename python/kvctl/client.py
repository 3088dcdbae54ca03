# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Client: one engine's session with the kvctl daemon over ZeroMQ (pyzmq + numpy).

Every call sends one request on a DEALER socket and waits at most ``timeout_ms`` for the reply
with the same request id. On a timeout the socket is closed (linger 0) and recreated ("Lazy
Pirate"), so a late reply can never answer a later call, and ``Timeout`` is raised (the daemon is
down, restarting or stuck); the next call reconnects by itself. Nothing is retried (APPEND is not
idempotent). ERROR replies raise ``ServerError``, and ``SessionLostError`` (a ServerError) when
the daemon no longer has this client's session (it restarted, or the lease expired): call hello()
(or rehello()) for a new one. Replies that break the protocol raise ``ProtocolError``; arguments
that cannot form a valid request raise ValueError before anything is sent. ``disconnect()`` (and
leaving a ``with`` block) ends the session with BYE, so the daemon frees it at once.

Thread safety: calls on one Client are serialised by an internal lock (one request in flight);
use one Client per thread for parallelism. Not fork-safe: create Clients after forking.

    client = kvctl.Client("ipc:///tmp/kvctl.sock", timeout_ms=5000)
    session = client.hello(layers=30, kv_heads=3, head_dim=64, dtype="float16")
    client.open(1); client.append(1, k, v)          # k, v: [layers, tokens, kv_heads, head_dim]
    k_rows, v_rows, positions = client.fetch(1)     # per layer, per head: [count, head_dim]

A complete example that runs (and CI runs): python/README.md.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np
import zmq

from . import protocol as p
from .protocol import KvctlError, ProtocolError, ServerError, SessionLostError, Timeout

_MAX_IPC_PATH = 107  # sizeof(sockaddr_un::sun_path) - 1.
# disconnect() waits at most this long for BYE's reply: a daemon that is gone must not hold up an
# engine's exit (the session's lease frees it then).
_BYE_TIMEOUT_MS = 2000


@dataclass(frozen=True)
class Session:
    """A session from HELLO: the daemon's reply plus the geometry this client declared."""

    session_id: int
    lease_ms: int            # The daemon drops the session after this long without a request.
    server_version: str
    pool_bytes: int
    page_bytes: int
    shm_name: str            # POSIX shm object of the pool ("" = none).
    staging_offset: int      # This session's staging slot (0 bytes = none): in the object
    staging_bytes: int       # staging_shm_name, or in the pool when that is "" (device pools).
    quant: p.QuantInfo
    layers: int
    kv_heads: int
    q_heads: int
    head_dim: int
    dtype: str               # "float32", "float16" or "bfloat16".
    client_name: str
    model_name: str
    pool_location: int = 0   # 0 host shm (shm_name), 1 CUDA device memory (cuda_ipc_handle).
    cuda_device: int = 0
    cuda_ipc_handle: bytes = bytes(p.CUDA_IPC_HANDLE_BYTES)
    staging_shm_name: str = ""  # This session's own staging object (writable by it alone).

    @property
    def has_staging(self) -> bool:
        """A host staging slot this client can map (the session's own staging object; the pool
        itself only from daemons before staging objects). A device pool's slot is written on the
        device by the engine (PROTOCOL.md 4.1); this client then sends tensors inline."""
        return self.staging_bytes > 0 and bool(self.staging_shm_name or self.shm_name)

    def staging_tokens(self, bytes_per_token: int) -> int:
        """The most tokens of bytes_per_token each (K, V and Q of every layer together: the
        staging layout puts the tensors back to back) that one APPEND can carry through the
        slot; 0 without a slot this client can map. A longer prefill goes in pieces of this
        many, APPEND_CONTINUES on all but the last (docs/kvbench_ipc.md "Prefill pieces through
        the staging slot")."""
        return self.staging_bytes // bytes_per_token if self.has_staging else 0

    @property
    def pool_on_device(self) -> bool:
        return self.pool_location == p.POOL_CUDA_DEVICE


class FetchResult(NamedTuple):
    """FETCH rows. Unstacked: k[l][h] and v[l][h] are [count, head_dim] arrays and
    positions[l][h] int64 [count], for l relative to the first fetched layer. Stacked: k and v
    are [layers, tokens, kv_heads, head_dim] and positions [tokens]."""

    k: Union[List[List[np.ndarray]], np.ndarray]
    v: Union[List[List[np.ndarray]], np.ndarray]
    positions: Union[List[List[np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class BlocksTable:
    """The blocks-mode page table of a sequence (Client.fetch_blocks, PROTOCOL.md 4.5): the
    FETCH blocks reply's fields, plus what follows from them. Pairs i = (layer - layer_begin) *
    kv_heads + head. Records and window rows live in the shm pool (read them through
    kvctl.pool_view.PoolView) and stay valid until the next APPEND or CLOSE of the sequence."""

    layer_begin: int
    n_layers: int
    kv_heads: int
    head_dim: int
    page_bytes: int
    pool_pages: int
    block_tokens: int
    side_records_per_page: int
    layouts: Tuple[p.RecordLayout, ...]  # Each with its own records_per_page, row slots, method.
    layout_index: np.ndarray  # uint16 [pairs]: index into layouts.
    indptr: np.ndarray  # uint32 [pairs + 1]: pair i owns indices[indptr[i] .. indptr[i+1]).
    indices: np.ndarray  # uint32 [nnz]: record ids.
    last_page_len: np.ndarray  # uint32 [pairs]: tokens in the pair's last record.
    side_indices: Optional[np.ndarray]  # uint32 [nnz], or None without side records.
    record_offsets: np.ndarray  # uint64 [nnz]: byte offset in the pool of every record.
    quantized_counts: np.ndarray  # int64 [pairs]: tokens in records.
    # The full-precision window (sinks, then tail) of pair i: row slots window_ids[
    # window_indptr[i] .. window_indptr[i+1]), the first window_sinks[i] of them sinks. Each slot
    # holds the K row then the V row in its layout's row_dtype, at window_offsets in the pool.
    window_indptr: np.ndarray  # uint32 [pairs + 1].
    window_ids: np.ndarray  # uint32 [window rows].
    window_sinks: np.ndarray  # uint32 [pairs].
    window_offsets: np.ndarray  # uint64 [window rows]: byte offset of each row slot.
    window_positions: List[List[np.ndarray]]  # int64 per window row, per layer per head.
    # uint64 [pairs]: the daemon's tag of each pair's record ids; fetch_blocks(held=this table)
    # sends them back so the daemon lists only newer records (PROTOCOL.md 4.5).
    table_tags: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    # What readers derive from this table once (PoolView keeps its device-side record index here).
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def window_counts(self) -> np.ndarray:
        """int64 [pairs]: window rows (sinks + tail) of each pair."""
        return np.diff(self.window_indptr.astype(np.int64))

    def window_rows(self, pool: np.ndarray, pair: int) -> Tuple[np.ndarray, np.ndarray]:
        """(k, v) [rows, head_dim] of pair `pair`'s window read (copied) from `pool`, a uint8
        array over the shm object (e.g. np.memmap("/dev/shm" + shm_name, mode="r")), in the
        layout's row_dtype (bfloat16 as uint16 bits, as FETCH rows). Torch readers use
        PoolView.window_rows."""
        n_pairs = len(self.window_indptr) - 1
        if not 0 <= pair < n_pairs:
            raise ValueError("pair: got %d, expected 0..%d" % (pair, n_pairs - 1))
        lay = self.layouts[int(self.layout_index[pair])]
        dtype = p.DTYPES[lay.row_dtype][1]
        row_bytes = self.head_dim * dtype.itemsize
        a, b = int(self.window_indptr[pair]), int(self.window_indptr[pair + 1])
        offsets = self.window_offsets[a:b].astype(np.int64)
        if offsets.size and int(offsets.max()) + 2 * row_bytes > pool.size:
            raise ValueError("window_offsets: a row slot ends past the pool of %d bytes"
                             % pool.size)
        slots = pool[offsets[:, None] + np.arange(2 * row_bytes)]
        k = slots[:, :row_bytes].copy().view(dtype).astype(dtype.newbyteorder("="))
        v = slots[:, row_bytes:].copy().view(dtype).astype(dtype.newbyteorder("="))
        return k, v


def _merge_held(held: BlocksTable, body):
    """The reply `body` with each pair's first record_base[i] record ids (and side ids) taken
    from `held`, so it lists every record again (record_base all 0)."""
    base = body.record_base.astype(np.int64)
    held_counts = np.diff(held.indptr.astype(np.int64))
    if base.shape != held_counts.shape or ((base != 0) & (base != held_counts)).any():
        raise ProtocolError("FETCH_REPLY: record_base: got %s, expected 0 or the held table's "
                            "records per pair %s" % (base.tolist(), held_counts.tolist()))
    listed = np.diff(body.indptr.astype(np.int64))
    pieces, side_pieces = [], []
    has_side = len(body.side_indices) > 0
    for i in range(len(base)):
        a = int(held.indptr[i])
        pieces += [held.indices[a:a + base[i]], body.indices[body.indptr[i]:body.indptr[i + 1]]]
        if has_side:
            old = (held.side_indices[a:a + base[i]] if held.side_indices is not None
                   else np.full(base[i], p.NO_PAGE, dtype=np.uint32))
            side_pieces += [old, body.side_indices[body.indptr[i]:body.indptr[i + 1]]]
    indptr = np.concatenate([[0], np.cumsum(base + listed)]).astype(np.uint32)
    indices = np.concatenate(pieces).astype(np.uint32)
    side = (np.concatenate(side_pieces).astype(np.uint32) if has_side
            else body.side_indices)
    return dataclasses.replace(body, indptr=indptr, indices=indices, side_indices=side,
                               record_base=np.zeros_like(body.record_base))


def _parse_endpoint(endpoint: str) -> bool:
    """Checks a connect endpoint as ipc::ParseConnectEndpoint; returns whether it is IPv6."""
    if not isinstance(endpoint, str):
        raise ValueError("endpoint: got %r, expected ipc://PATH or tcp://HOST:PORT" % (endpoint,))
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if not path or path == "*":
            raise ValueError("endpoint %s: expected ipc://PATH with a socket file path" % endpoint)
        if path.startswith("@"):
            raise ValueError("endpoint %s: abstract Unix sockets (@name) are not supported, "
                             "expected a file path" % endpoint)
        if "\0" in path:
            raise ValueError("endpoint %s: path contains a NUL byte" % endpoint)
        if len(path.encode()) > _MAX_IPC_PATH:
            raise ValueError("endpoint %s: path is %d bytes, expected at most %d (Unix socket "
                             "limit)" % (endpoint, len(path.encode()), _MAX_IPC_PATH))
        return False
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError("endpoint %s: expected tcp://HOST:PORT with PORT 1..65535"
                             % endpoint)
        return host.startswith("[")
    raise ValueError("endpoint: got %r, expected ipc://PATH or tcp://HOST:PORT" % endpoint)


def _to_numpy(name: str, x) -> np.ndarray:
    """numpy view of an ndarray, a torch tensor (any device; bfloat16 widened to float32 exactly)
    or anything numpy.asarray takes."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):  # torch.Tensor without importing torch.
        x = x.detach()
        if hasattr(x, "cpu"):
            x = x.cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":
            x = x.float()  # numpy has no bfloat16; bf16 -> f32 -> bf16 is exact.
        return x.numpy()
    if hasattr(x, "numpy"):
        return np.asarray(x.numpy())
    try:
        return np.asarray(x)  # __array__, buffers, nested lists.
    except (TypeError, ValueError) as e:
        raise TypeError("%s: got %s, expected a numpy array or a tensor (%s)"
                        % (name, type(x).__name__, e)) from None


def _to_wire(name: str, arr: np.ndarray, dtype: str) -> np.ndarray:
    """C-contiguous little-endian rows in the session dtype (bfloat16: uint16 bit patterns;
    uint16 input to a bfloat16 session is taken as bit patterns already)."""
    if arr.dtype.kind not in "fiu":
        raise ValueError("%s: dtype %s, expected real numbers (float or integer)"
                         % (name, arr.dtype))
    if dtype == "bfloat16":
        if arr.dtype == np.uint16:
            return np.ascontiguousarray(arr, dtype="<u2")
        return np.ascontiguousarray(p.float32_to_bf16(arr), dtype="<u2")
    with np.errstate(over="ignore"):  # Out-of-range values become inf; the daemon names them.
        return np.ascontiguousarray(arr, dtype="<f4" if dtype == "float32" else "<f2")


Scalar = Union[int, float, str]
# parse_info's result: {section: {field: value}}, where an entity line's value is {key: value}.
StatsValue = Union[Scalar, Dict[str, Scalar]]
Stats = Dict[str, Dict[str, StatsValue]]

# An entity line (docs/stats.md): "seq_<session>_<sequence>", "layer_<l>", "head_<l>_<h>" (and
# any later kind named the same way), valued "key=value,key=value".
_ENTITY_NAME = re.compile(r"[a-z][a-z0-9]*(_\d+)+")
_ENTITY_ITEMS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[^,=]*(,[A-Za-z_][A-Za-z0-9_]*=[^,=]*)*")
# Entity keys that are text even when they look like numbers (a client may be named "7").
_TEXT_KEYS = frozenset({"client"})


def _parse_value(text: str) -> Scalar:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|-?inf|-?nan", text):
        return float(text)
    return text


def _parse_entity(text: str) -> Dict[str, Scalar]:
    out: Dict[str, Scalar] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        out[key] = value if key in _TEXT_KEYS else _parse_value(value)
    return out


def parse_info(text: str) -> Stats:
    """Parses the STATS text (INFO style: "# Section" then "field:value" lines, docs/stats.md)
    into {section (lower case): {field: value}}. A value is an int, a float or a str; an entity
    line ("seq_1_2", "layer_3", "head_3_1": "key=value,...") becomes a dict {key: int | float |
    str} ("client" stays a str). Fields before any header go to section "". Raises
    ProtocolError for a line that is neither a header nor "field:value"."""
    out: Stats = {}
    section = ""
    for line in text.splitlines():
        line = line.rstrip("\r")
        if not line:
            continue
        if line.startswith("#"):
            section = line[1:].strip().lower()
            out.setdefault(section, {})
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError("STATS text: line %r is neither '# Section' nor 'field:value'"
                                % line)
        if _ENTITY_NAME.fullmatch(key) and _ENTITY_ITEMS.fullmatch(value):
            out.setdefault(section, {})[key] = _parse_entity(value)
        else:
            out.setdefault(section, {})[key] = _parse_value(value)
    return out


class _Staging:
    """This session's staging slot, mapped read-write from its own staging object
    (/dev/shm/<staging_shm_name>). The pool is never mapped writable: it is read-only to clients
    (only daemons before staging objects put the slot in the pool, /dev/shm/<shm_name>)."""

    def __init__(self, session: Session):
        path = "/dev/shm/" + (session.staging_shm_name or session.shm_name).lstrip("/")
        start = session.staging_offset - session.staging_offset % mmap.ALLOCATIONGRANULARITY
        self.skip = session.staging_offset - start
        self.bytes = session.staging_bytes
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise KvctlError("staging: cannot open %s (%s); send tensors inline"
                             % (path, e.strerror)) from None
        try:
            size = os.fstat(fd).st_size
            if size < session.staging_offset + session.staging_bytes:
                raise KvctlError("%s: %d bytes, smaller than the staging slot [%d, %d) from HELLO"
                                 % (path, size, session.staging_offset,
                                    session.staging_offset + session.staging_bytes))
            self.map = mmap.mmap(fd, self.skip + self.bytes, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        finally:
            os.close(fd)

    def write(self, arrays, offsets) -> None:
        """Each array at its offset in the slot (protocol.staging_layout)."""
        for a, offset in zip(arrays, offsets):
            at = self.skip + offset
            self.map[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)

    def close(self) -> None:
        self.map.close()


class Client:
    """A kvctl client: one socket, at most one session (the last hello()) and its sequences."""

    def __init__(self, endpoint: str, timeout_ms: int = 5000,
                 context: Optional[zmq.Context] = None):
        self._ipv6 = _parse_endpoint(endpoint)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1:
            raise ValueError("timeout_ms: got %r, expected an int >= 1" % (timeout_ms,))
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self._ctx = context or zmq.Context.instance()
        self._lock = threading.RLock()
        self._socket: Optional[zmq.Socket] = None
        self._next_id = 1
        self._session: Optional[Session] = None
        self._staging: Optional[_Staging] = None
        self._next_position: Dict[int, int] = {}
        self.stale_replies = 0  # Replies dropped because their request id was not the call's.
        self.socket_resets = 0  # Sockets recreated after timeouts.
        self.staging_fallbacks = 0  # Staging appends sent inline: the slot could not be mapped.
        self._reset_socket()
        self.socket_resets = 0

    # ---- plumbing ------------------------------------------------------------------------

    def _reset_socket(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self.socket_resets += 1
        sock = self._ctx.socket(zmq.DEALER)
        # linger 0: an unanswered request dies with the socket instead of reaching a restarted
        # daemon long after its caller gave up.
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
        sock.setsockopt(zmq.MAXMSGSIZE, p.MAX_TENSOR_FRAME_BYTES)
        if self._ipv6:
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(self.endpoint)
        self._socket = sock

    def call_raw(self, frames: list, expect_type: Optional[int] = None) -> p.Reply:
        """Sends one request whose frame 0 starts with a header (its request id is replaced by
        this client's next id) and returns the decoded reply.

        The escape hatch for hand-built messages; the typed methods below use it. Raises Timeout,
        ServerError for ERROR replies, ProtocolError for malformed replies or (when expect_type
        is given) a reply of another type.
        """
        with self._lock:
            if self._socket is None:
                raise KvctlError("client is disconnected")
            request_id = self._next_id
            self._next_id += 1
            frame0 = bytes(frames[0])
            if len(frame0) >= p.HEADER_BYTES:
                frame0 = frame0[:8] + request_id.to_bytes(8, "little") + frame0[16:]
                request_type = int.from_bytes(frame0[6:8], "little")
            else:
                request_type = 0
            what = "%s request %d" % (p.type_name(request_type), request_id)
            deadline = time.monotonic() + self.timeout_ms / 1000.0
            try:
                return self._exchange(what, request_id, request_type, expect_type,
                                      [frame0] + list(frames[1:]), deadline)
            except zmq.ZMQError as e:
                self._reset_socket()
                raise KvctlError("%s: %s; socket reset" % (what, e)) from None

    def _exchange(self, what: str, request_id: int, request_type: int,
                  expect_type: Optional[int], frames: list, deadline: float) -> p.Reply:
        try:
            self._socket.send_multipart(frames, copy=False)
        except zmq.Again:
            self._reset_socket()
            raise Timeout("%s: cannot queue the request to %s within %d ms; socket reset"
                          % (what, self.endpoint, self.timeout_ms)) from None
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000.0 + 0.999)
            if left_ms <= 0 or not self._socket.poll(left_ms, zmq.POLLIN):
                if time.monotonic() < deadline:
                    continue  # poll() woke early (e.g. rounding): wait out the deadline.
                self._reset_socket()
                raise Timeout("%s: no reply from %s within %d ms (daemon down, restarting or "
                              "stuck); socket reset, the next call reconnects"
                              % (what, self.endpoint, self.timeout_ms))
            while True:
                try:
                    msg = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if not msg or p.peek_request_id(msg[0].bytes) != request_id:
                    self.stale_replies += 1  # The late answer to an abandoned request.
                    continue
                frames_in = [msg[0].bytes] + [f.buffer for f in msg[1:]]
                try:
                    reply = p.decode_reply(frames_in)
                except ProtocolError as e:
                    raise ProtocolError("%s: malformed reply: %s" % (what, e)) from None
                if isinstance(reply.body, p.ErrorReply):
                    raise ServerError(reply.body.code, reply.body.message,
                                      p.type_name(request_type))
                if expect_type is not None and reply.type != expect_type:
                    raise ProtocolError("%s: reply has type %s, expected %s"
                                        % (what, p.type_name(reply.type),
                                           p.type_name(expect_type)))
                return reply

    def _call(self, msg_type: int, frames: list):
        try:
            return self.call_raw(frames, expect_type=msg_type | p.REPLY_BIT).body
        except SessionLostError:
            raise
        except ServerError as e:
            session = self._session
            if session is None or not p.is_session_lost(e.code_value, e.message):
                raise
            raise self._session_lost(e) from None

    def _session_lost(self, e: ServerError) -> SessionLostError:
        """The error for a request whose session the daemon no longer has; forgets what this
        client knew of its sequences (their data is gone with the session)."""
        with self._lock:
            session = self._session
            tokens = sum(self._next_position.values())
            sequences = len(self._next_position)
            self._next_position.clear()
            if self._staging is not None:  # It maps the dead daemon's pool.
                self._staging.close()
                self._staging = None
        return SessionLostError(e.code_value, e.message, e.request,
                                session.session_id if session else 0, tokens, sequences,
                                "Call hello() or rehello() for a new session and send the data "
                                "again.")

    def _require_session(self) -> Session:
        if self._session is None:
            raise KvctlError("no session: call hello() first")
        return self._session

    def disconnect(self) -> None:
        """Ends the session (BYE: the daemon frees its sequences and staging slot at once; a
        daemon that does not answer within 2 s leaves it to the lease), closes the socket and
        unmaps the staging slot. The Client cannot be used afterwards."""
        with self._lock:
            if self._session is not None and self._socket is not None:
                try:
                    self.bye(timeout_ms=_BYE_TIMEOUT_MS)
                except KvctlError:
                    pass  # Gone already, or the daemon is: nothing left to free here.
            if self._staging is not None:
                self._staging.close()
                self._staging = None
            if self._socket is not None:
                self._socket.close(linger=0)
                self._socket = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.disconnect()

    @property
    def session(self) -> Optional[Session]:
        return self._session

    # ---- requests ------------------------------------------------------------------------

    def hello(self, layers: int, kv_heads: int, head_dim: int, dtype="float16", q_heads: int = 0,
              client_name: str = "python", model_name: str = "") -> Session:
        """Starts a session with this geometry; replaces any previous session of this client
        (the daemon frees that one when its lease runs out). dtype: "float32", "float16" or
        "bfloat16" (or a numpy/torch dtype)."""
        code = p.dtype_code(dtype)
        frames = p.encode_hello(0, client_name, model_name, layers, kv_heads, q_heads, head_dim,
                                code)
        reply: p.HelloReply = self._call(p.MsgType.HELLO, frames)
        with self._lock:
            if self._staging is not None:
                self._staging.close()
                self._staging = None
            self._next_position.clear()
            self._session = Session(
                reply.session_id, reply.lease_ms, reply.server_version, reply.pool_bytes,
                reply.page_bytes, reply.shm_name, reply.staging_offset, reply.staging_bytes,
                reply.quant, layers, kv_heads, q_heads, head_dim, p.dtype_name(code),
                client_name, model_name, reply.pool_location, reply.cuda_device,
                reply.cuda_ipc_handle, reply.staging_shm_name)
        return self._session

    def rehello(self) -> Session:
        """A new session with the geometry and names of the current one (after SessionLostError:
        the daemon restarted or the lease expired). Sequences must be opened again."""
        s = self._require_session()
        return self.hello(s.layers, s.kv_heads, s.head_dim, dtype=s.dtype, q_heads=s.q_heads,
                          client_name=s.client_name, model_name=s.model_name)

    def bye(self, timeout_ms: Optional[int] = None) -> p.ByeReply:
        """Ends the session: the daemon closes its sequences and frees their pages and the
        staging slot now, instead of when the lease runs out. Returns ByeReply(sequences_closed,
        bytes_freed). The client then has no session (hello() starts a new one), also when the
        BYE fails. Raises SessionLostError when the daemon no longer had the session, Timeout
        after timeout_ms (default: the client's) without a reply."""
        s = self._require_session()
        with self._lock:
            saved = self.timeout_ms
            if timeout_ms is not None:
                self.timeout_ms = min(saved, timeout_ms)
            try:
                reply: p.ByeReply = self._call(p.MsgType.BYE, p.encode_bye(0, s.session_id))
            finally:
                if self.timeout_ms != saved:
                    self.timeout_ms = saved
                    if self._socket is not None:  # A Timeout made it with the short limit.
                        self._socket.setsockopt(zmq.SNDTIMEO, saved)
                if self._session is s:
                    self._session = None
                    self._next_position.clear()
                    if self._staging is not None:
                        self._staging.close()
                        self._staging = None
        return reply

    def open(self, seq: int) -> None:
        """Opens sequence `seq` (an id of the caller's choosing, unique within the session)."""
        s = self._require_session()
        self._call(p.MsgType.OPEN, p.encode_open(0, s.session_id, seq))
        self._next_position[seq] = 0

    def close(self, seq: int) -> int:
        """Closes sequence `seq` and frees its pool pages; returns the bytes freed."""
        s = self._require_session()
        reply: p.CloseReply = self._call(p.MsgType.CLOSE, p.encode_close(0, s.session_id, seq))
        self._next_position.pop(seq, None)
        return reply.bytes_freed

    def save_prefix(self, seq: int, tokens) -> Tuple[int, int]:
        """Stores sequence `seq`'s prefix in the daemon's local prefix cache and its cluster tier
        (PROTOCOL.md 4.9), so open_prefix on this daemon (sharing its pages) or on any daemon
        sharing the cluster can restore it instead of prefilling.

        tokens: the id of every token `seq` holds, in position order (ints, a 1-D integer array
        or tensor). Returns (saved_tokens, stored_bytes): the daemon stores the longest prefix
        it can cut exactly at a tier.prefix_block_tokens boundary (0 = no such cut yet, nothing
        stored). The sequence is unchanged. Raises ServerError: FAILED_PRECONDITION when the
        daemon keeps no prefixes (no tier and tier.local_prefix_fraction = 0) or `seq` does not
        start at position 0 or evicted tokens, INVALID_ARGUMENT when the id count is not the
        sequence's token count, UNAVAILABLE when the cluster cannot be reached,
        RESOURCE_EXHAUSTED when it is full (or, without a tier, the local cache cannot hold it).
        """
        s = self._require_session()
        reply: p.SavePrefixReply = self._call(
            p.MsgType.SAVE_PREFIX, p.encode_save_prefix(0, s.session_id, seq, tokens))
        return reply.saved_tokens, reply.stored_bytes

    def open_prefix(self, seq: int, tokens) -> int:
        """Opens sequence `seq` (as open()) from the longest prefix of the prompt `tokens` stored
        in the daemon's cluster tier (PROTOCOL.md 4.10); returns restored_tokens M: the sequence
        holds positions 0 .. M - 1 exactly as the saving sequence held them, and the next
        append() continues at position M. M = 0 (an open, empty sequence) when nothing is
        stored, the daemon has no tier, or the tier cannot be reached. Send the prompt without
        its last token when the model needs that token's logits. Errors are those of open()."""
        s = self._require_session()
        reply: p.OpenPrefixReply = self._call(
            p.MsgType.OPEN_PREFIX, p.encode_open_prefix(0, s.session_id, seq, tokens))
        self._next_position[seq] = reply.restored_tokens
        return reply.restored_tokens

    def ping(self) -> int:
        """Liveness check (renews the session's lease, if any); returns the daemon's monotonic
        clock in microseconds."""
        sid = self._session.session_id if self._session else 0
        reply: p.PingReply = self._call(p.MsgType.PING, p.encode_ping(0, sid))
        return reply.server_time_us

    def stats(self, section: str = "") -> Stats:
        """The daemon's STATS text parsed by parse_info: {section: {field: value}}, section
        names in lower case ("server", "pool", "sequences", "layers", "heads", "policy", "ipc",
        "quality"; `section` "" = every section, else that one, case-insensitive). Values are
        ints, floats or strs; per-sequence, per-layer and per-head lines are dicts:
        stats()["heads"]["head_3_1"]["k_bits"] is an int. The "config" section is the daemon's
        effective config as TOML, not fields: read it with stats_text("config")."""
        if section.lower() == "config":
            raise ValueError('stats: section "config" is TOML text, not fields; use '
                             'stats_text("config") (and tomllib.loads) instead')
        sid = self._session.session_id if self._session else 0
        reply: p.StatsReply = self._call(p.MsgType.STATS, p.encode_stats(0, sid, section))
        return parse_info(reply.text)

    def stats_text(self, section: str = "") -> str:
        """The daemon's INFO text as sent."""
        sid = self._session.session_id if self._session else 0
        return self._call(p.MsgType.STATS, p.encode_stats(0, sid, section)).text

    def _tensor(self, name: str, x, heads: int, heads_name: str, tokens: Optional[int],
                s: Session) -> np.ndarray:
        arr = _to_numpy(name, x)
        want = "[layers=%d, tokens, %s=%d, head_dim=%d]" % (s.layers, heads_name, heads,
                                                            s.head_dim)
        if (arr.ndim != 4 or arr.shape[0] != s.layers or arr.shape[2] != heads
                or arr.shape[3] != s.head_dim or arr.shape[1] < 1
                or (tokens is not None and arr.shape[1] != tokens)):
            tok = "tokens=%d" % tokens if tokens is not None else "tokens >= 1"
            raise ValueError("%s: got shape %s, expected %s with %s" % (name, list(arr.shape),
                                                                        want, tok))
        return _to_wire(name, arr, s.dtype)

    def append(self, seq: int, k, v, q=None, first_position: Optional[int] = None,
               use_staging: bool = False, continues: bool = False) -> p.AppendReply:
        """Appends tokens to sequence `seq`.

        k, v: [layers, tokens, kv_heads, head_dim] (q: [layers, tokens, q_heads, head_dim], only
        if the session declared q_heads > 0), numpy arrays or tensors, converted to the session
        dtype (bfloat16 sessions take uint16 arrays as bf16 bit patterns and round floats to
        nearest even). first_position defaults to the position after the last token this client
        appended to `seq` (0 for a new sequence). use_staging writes the tensors into this
        session's slot of the shared pool instead of sending them on the socket (inline when the
        slot's shm object cannot be mapped, counted in staging_fallbacks).

        continues=True sets APPEND_CONTINUES: more tokens of the same prefill follow, so the
        daemon stores these without evicting; the APPEND without it that ends the prefill evicts
        over all of them, exactly as one APPEND of every token would (PROTOCOL.md 4.4).

        After a Timeout the append may or may not have happened: pass first_position explicitly
        (or fetch) before the next append. With use_staging the daemon may still read the slot
        after a Timeout; do not rely on the slot's content until a later call succeeds.
        """
        s = self._require_session()
        k_arr = self._tensor("k", k, s.kv_heads, "kv_heads", None, s)
        n = k_arr.shape[1]
        v_arr = self._tensor("v", v, s.kv_heads, "kv_heads", n, s)
        tensors = [k_arr, v_arr]
        if q is not None:
            if s.q_heads == 0:
                raise ValueError("q: given, but the session declared q_heads = 0")
            tensors.append(self._tensor("q", q, s.q_heads, "q_heads", n, s))
        if n > p.MAX_APPEND_TOKENS:
            raise ValueError("tokens: got %d, expected at most %d per append; split it"
                             % (n, p.MAX_APPEND_TOKENS))
        for name, t in zip("kvq", tensors):
            if t.nbytes > p.MAX_TENSOR_FRAME_BYTES:
                raise ValueError("%s: %d bytes exceed the frame limit of %d; split the append "
                                 "into fewer tokens" % (name, t.nbytes, p.MAX_TENSOR_FRAME_BYTES))
        pos = self._next_position.get(seq, 0) if first_position is None else first_position
        has_q = q is not None
        if use_staging:
            layout = p.staging_layout(s.layers, s.kv_heads, s.q_heads, s.head_dim, s.dtype, n,
                                      has_q)
            payload = layout.total_bytes
            with self._lock:
                if not s.has_staging:
                    raise ValueError("use_staging: this session has no staging slot (HELLO "
                                     "returned staging_bytes 0); send tensors inline")
                if payload > s.staging_bytes:
                    raise ValueError("use_staging: payload of %d bytes exceeds the staging slot "
                                     "of %d bytes; split the append" % (payload, s.staging_bytes))
                frames = p.encode_append(0, s.session_id, seq, pos, n, (), p.SOURCE_STAGING,
                                         has_q, s.staging_offset, continues=continues)
                if self._staging is None:
                    try:
                        self._staging = _Staging(s)
                    except KvctlError:
                        # The object is gone (e.g. the daemon restarted and a PING from another
                        # thread already found the session lost, which unmapped the slot) or
                        # cannot be mapped: inline carries the same data, and the daemon answers
                        # it as any APPEND (SessionLostError for a lost session).
                        self.staging_fallbacks += 1
                        use_staging = False
                if use_staging:
                    self._staging.write(tensors, (0, layout.v_offset, layout.q_offset))
                    reply = self._call(p.MsgType.APPEND, frames)
        if not use_staging:
            frames = p.encode_append(0, s.session_id, seq, pos, n, tensors, p.SOURCE_INLINE,
                                     has_q, continues=continues)
            reply = self._call(p.MsgType.APPEND, frames)
        self._next_position[seq] = pos + n
        return reply

    def _layer_range(self, layers) -> Tuple[int, int]:
        if layers is None:
            return 0, self._require_session().layers
        if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
            begin, end = int(layers), int(layers) + 1
        elif isinstance(layers, (range, slice)):
            if layers.step not in (None, 1):
                raise ValueError("layers: got %r, expected a contiguous range (step 1)"
                                 % (layers,))
            begin = 0 if layers.start is None else layers.start
            end = self._require_session().layers if layers.stop is None else layers.stop
        elif isinstance(layers, (tuple, list)) and len(layers) == 2:
            begin, end = int(layers[0]), int(layers[1])
        else:
            raise ValueError("layers: got %r, expected None, a layer, (begin, end) or a range"
                             % (layers,))
        if not 0 <= begin < end <= p.MAX_LAYERS:
            raise ValueError("layers: got [%d, %d), expected a non-empty range inside [0, %d)"
                             % (begin, end, p.MAX_LAYERS))
        return begin, end

    @staticmethod
    def _split(rows: p.Rows, stacked: bool) -> FetchResult:
        counts = rows.counts.astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(counts)))
        if stacked:
            if counts.size and np.any(counts != counts[0]):
                raise ValueError("stacked: heads hold different token counts %s; use "
                                 "stacked=False" % counts.tolist())
            c = int(counts[0]) if counts.size else 0
            pos = rows.positions.reshape(rows.n_layers * rows.kv_heads, c)
            if c and np.any(pos != pos[0]):
                raise ValueError("stacked: heads hold different token positions; use "
                                 "stacked=False")
            shape = (rows.n_layers, rows.kv_heads, c, rows.head_dim)
            k = np.ascontiguousarray(rows.k.reshape(shape).transpose(0, 2, 1, 3))
            v = np.ascontiguousarray(rows.v.reshape(shape).transpose(0, 2, 1, 3))
            return FetchResult(k, v, pos[0].copy())
        out_k, out_v, out_p = [], [], []
        for layer in range(rows.n_layers):
            lk, lv, lp = [], [], []
            for head in range(rows.kv_heads):
                i = layer * rows.kv_heads + head
                a, b = starts[i], starts[i + 1]
                lk.append(rows.k[a:b])
                lv.append(rows.v[a:b])
                lp.append(rows.positions[a:b])
            out_k.append(lk)
            out_v.append(lv)
            out_p.append(lp)
        return FetchResult(out_k, out_v, out_p)

    def fetch(self, seq: int, layers=None, mode: str = "dense", dtype="float32",
              stacked: bool = False) -> FetchResult:
        """Reads sequence `seq`: layers None (all), a layer, (begin, end) or a range.

        mode "dense" (the only one here) returns every token dequantized; a blocks FETCH
        answers with a page table into the pool only (fetch_blocks, read with PoolView).
        dtype of the returned rows: "float32", "float16" or "bfloat16" (uint16 bit patterns).
        Returns (k, v, positions) per layer per head (see FetchResult), or, with stacked=True
        and equal counts and positions in every head, arrays [layers, tokens, kv_heads,
        head_dim] and positions [tokens]."""
        if mode != "dense":
            raise ValueError("mode: got %r, expected \"dense\" (blocks replies carry no rows: "
                             "use fetch_blocks and kvctl.pool_view.PoolView)" % (mode,))
        s = self._require_session()
        begin, end = self._layer_range(layers)
        body = self._call(p.MsgType.FETCH, p.encode_fetch(0, s.session_id, seq, begin, end,
                                                          p.MODE_DENSE, dtype))
        self._check_fetch(body, p.MODE_DENSE, begin, end)
        if body.dtype != p.dtype_code(dtype):
            raise ProtocolError("FETCH_REPLY: dtype %s, expected %s"
                                % (p.dtype_name(body.dtype), p.dtype_name(p.dtype_code(dtype))))
        return self._split(body, stacked)

    @staticmethod
    def _check_fetch(body, wire_mode: int, begin: int, end: int) -> None:
        want = p.Rows if wire_mode == p.MODE_DENSE else p.BlocksReply
        if not isinstance(body, want):
            raise ProtocolError("FETCH_REPLY: mode: got %s, expected %s"
                                % (type(body).__name__, want.__name__))
        if (body.layer_begin, body.layer_begin + body.n_layers) != (begin, end):
            raise ProtocolError("FETCH_REPLY: layers [%d, %d), expected [%d, %d)"
                                % (body.layer_begin, body.layer_begin + body.n_layers, begin, end))

    def fetch_blocks(self, seq: int, layers=None, held: Optional[BlocksTable] = None
                     ) -> BlocksTable:
        """The blocks-mode page table of sequence `seq` (PROTOCOL.md 4.5): record ids and the
        window's row slot ids, their byte offsets in the pool, each pair's layout and the
        window's positions (see BlocksTable). Read records and rows with PoolView; they stay
        valid until the next APPEND or CLOSE of the sequence. `held`: an earlier table of the
        same layers; the daemon then lists only the records that are new since it (the reply's
        bytes stay flat in the sequence's length) and this merges them: the result is whole."""
        s = self._require_session()
        begin, end = self._layer_range(layers)
        known_records = known_tags = None
        if held is not None:
            if (held.layer_begin, held.layer_begin + held.n_layers) != (begin, end):
                raise ValueError("held: a table of layers [%d, %d), expected [%d, %d)"
                                 % (held.layer_begin, held.layer_begin + held.n_layers, begin,
                                    end))
            if len(held.table_tags) == len(held.indptr) - 1:  # Else no tags: ask for it all.
                known_records = np.diff(held.indptr.astype(np.int64)).astype(np.uint32)
                known_tags = held.table_tags
        # out_dtype means nothing in blocks mode (rows stay in the pool in their stored dtype).
        body: p.BlocksReply = self._call(
            p.MsgType.FETCH, p.encode_fetch(0, s.session_id, seq, begin, end, p.MODE_BLOCKS,
                                            "float16", known_records, known_tags))
        self._check_fetch(body, p.MODE_BLOCKS, begin, end)
        if (body.record_base > 0).any():
            if known_records is None:
                raise ProtocolError("FETCH_REPLY: record_base: got %s, expected all 0 (no known "
                                    "table was sent)" % body.record_base.tolist())
            body = _merge_held(held, body)
        lay_of = body.layout_index.astype(np.int64)
        rpp = np.array([lay.records_per_page for lay in body.layouts], dtype=np.uint64)
        rbytes = np.array([lay.record_bytes for lay in body.layouts], dtype=np.uint64)
        row_pp = np.array([lay.rows_per_page for lay in body.layouts], dtype=np.uint64)
        row_bytes = np.array([lay.row_slot_bytes for lay in body.layouts], dtype=np.uint64)
        counts = np.diff(body.indptr.astype(np.int64))
        rec_lay = np.repeat(lay_of, counts)
        ids = body.indices.astype(np.uint64)
        record_offsets = ((ids // rpp[rec_lay]) * np.uint64(body.page_bytes)
                          + (ids % rpp[rec_lay]) * rbytes[rec_lay])
        quantized = np.where(counts > 0, (counts - 1) * body.block_tokens
                             + body.last_page_len.astype(np.int64), 0)
        win_counts = np.diff(body.window_indptr.astype(np.int64))
        win_lay = np.repeat(lay_of, win_counts)
        wids = body.window_ids.astype(np.uint64)
        window_offsets = ((wids // row_pp[win_lay]) * np.uint64(body.page_bytes)
                          + (wids % row_pp[win_lay]) * row_bytes[win_lay])
        # Runs -> one position per row: runs are in row order, pairs concatenated.
        lengths = body.run_lengths.astype(np.int64)
        run_first_row = np.cumsum(lengths) - lengths
        positions = (np.arange(int(lengths.sum()), dtype=np.int64)
                     + np.repeat(body.run_starts.astype(np.int64) - run_first_row, lengths))
        per_pair = np.split(positions, body.window_indptr[1:-1].astype(np.int64))
        window_positions = [per_pair[l * body.kv_heads:(l + 1) * body.kv_heads]
                            for l in range(body.n_layers)]
        return BlocksTable(
            body.layer_begin, body.n_layers, body.kv_heads, body.head_dim, body.page_bytes,
            body.pool_pages, body.block_tokens, body.side_records_per_page, body.layouts,
            body.layout_index, body.indptr, body.indices, body.last_page_len,
            body.side_indices if len(body.side_indices) else None, record_offsets, quantized,
            body.window_indptr, body.window_ids, body.window_sinks, window_offsets,
            window_positions, table_tags=body.table_tags)
