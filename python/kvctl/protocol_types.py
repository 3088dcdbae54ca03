# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""The values and errors of the kvctl wire protocol (ipc/PROTOCOL.md): reply bodies as frozen
dataclasses, the status and quantizer code tables, and the exceptions this package raises.
kvctl.protocol re-exports every name here; import them from there.

Thread safety: immutable values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np

# kvctl::StatusCode values carried by ERROR replies (common/status.h).
STATUS_CODES = {
    1: "INVALID_ARGUMENT",
    2: "NOT_FOUND",
    3: "ALREADY_EXISTS",
    4: "RESOURCE_EXHAUSTED",
    5: "FAILED_PRECONDITION",
    6: "UNAVAILABLE",
    7: "DEADLINE_EXCEEDED",
    8: "UNIMPLEMENTED",
    9: "INTERNAL",
    10: "PERMISSION_DENIED",
    11: "DATA_LOSS",
}
STATUS_CODE_VALUES = {name: value for value, name in STATUS_CODES.items()}

# HELLO reply pool_location values, and the size of its cuda_ipc_handle (cudaIpcMemHandle_t).
POOL_HOST_SHM, POOL_CUDA_DEVICE = 0, 1
CUDA_IPC_HANDLE_BYTES = 64

# kvctl::QuantMethod values (kernels/quant_types.h).
QUANT_METHODS = ("fp16", "kivi", "quarot", "kvarn", "oscar")

# ---- Errors -----------------------------------------------------------------------------------


class KvctlError(Exception):
    """Base of every error this package raises (besides ValueError/TypeError for bad arguments)."""


class Timeout(KvctlError):
    """No reply within the client's timeout (DEADLINE_EXCEEDED); the socket was recreated."""


class ServerError(KvctlError):
    """The daemon answered with ERROR.

    Attributes: code (name, e.g. "NOT_FOUND"), code_value (the wire number), message (the
    server's text, naming the field), request (the request type name).
    """

    def __init__(self, code_value: int, message: str, request: str = ""):
        self.code_value = code_value
        self.code = STATUS_CODES.get(code_value, "CODE_%d" % code_value)
        self.message = message
        self.request = request
        where = "%s: " % request if request else ""
        super().__init__("%s%s: %s" % (where, self.code, message))


class SessionLostError(ServerError):
    """The daemon no longer has this client's session: it restarted (kill -9, a crash, an
    upgrade), the session's lease ran out, or BYE ended it. Everything the session held is gone;
    a new session (hello(); KvctlCache does it by itself) starts empty.

    A ServerError with code "NOT_FOUND" (message: the daemon's text, naming session_id).
    Attributes besides ServerError's: session_id, tokens_lost (tokens of cached data the caller
    had sent to the lost session, as far as it knows), sequences_lost.
    """

    def __init__(self, code_value: int, message: str, request: str = "", session_id: int = 0,
                 tokens_lost: int = 0, sequences_lost: int = 0, advice: str = ""):
        super().__init__(code_value, message, request)
        self.session_id = session_id
        self.tokens_lost = tokens_lost
        self.sequences_lost = sequences_lost
        where = "%s: " % request if request else ""
        self.args = ("%ssession lost: the daemon no longer has this session (it restarted, or "
                     "the session's lease expired); %d tokens of cached data in %d sequence(s) "
                     "were lost. %s [daemon: %s]"
                     % (where, tokens_lost, sequences_lost,
                        advice or "Call hello() for a new session and send the data again.",
                        message),)


class ProtocolError(KvctlError):
    """A reply broke the protocol (malformed, wrong type, failed validation); names the field."""


# ---- Values -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantInfo:
    """The quantizer a session gets by default (HELLO reply)."""

    method: int
    k_bits: int
    v_bits: int
    block_tokens: int
    sink_tokens: int
    flush_tokens: int

    @property
    def method_name(self) -> str:
        return QUANT_METHODS[self.method]


@dataclass(frozen=True)
class HelloReply:
    session_id: int
    lease_ms: int
    server_version: str
    pool_bytes: int
    page_bytes: int
    shm_name: str
    staging_offset: int
    staging_bytes: int
    quant: QuantInfo
    pool_location: int = 0  # 0 host shared memory (shm_name), 1 CUDA device memory.
    cuda_device: int = 0
    cuda_ipc_handle: bytes = bytes(CUDA_IPC_HANDLE_BYTES)  # Of a device pool; zeros otherwise.
    # The shm object of this session's staging slot (writable by it alone); "" = the slot lies in
    # the pool (a device pool's) or there is none.
    staging_shm_name: str = ""

    @property
    def pool_on_device(self) -> bool:
        return self.pool_location == POOL_CUDA_DEVICE


@dataclass(frozen=True)
class CloseReply:
    bytes_freed: int


@dataclass(frozen=True)
class ByeReply:
    sequences_closed: int   # Sequences of the session that were open.
    bytes_freed: int        # Pool bytes of their pages.


@dataclass(frozen=True)
class PingReply:
    server_time_us: int


@dataclass(frozen=True)
class AppendReply:
    tokens_total: int       # Sequence length after the append.
    tokens_quantized: int   # <= tokens_total.
    pool_bytes_used: int    # Daemon-wide.


@dataclass(frozen=True)
class Rows:
    """Token rows of FETCH: a dense reply's rows or a blocks reply's fp16 tail.

    Pairs i = (layer - layer_begin) * kv_heads + head; counts[i] rows each, concatenated in pair
    order in positions (int64 [N]), k and v ([N, head_dim] in dtype; bfloat16 as uint16 bits).
    """

    layer_begin: int
    n_layers: int
    kv_heads: int
    head_dim: int
    dtype: int
    counts: np.ndarray
    positions: np.ndarray
    k: np.ndarray
    v: np.ndarray


@dataclass(frozen=True)
class RecordLayout:
    """Byte layout of one block record (56 bytes on the wire). records_per_page is per layout:
    each (layer, head) packs as many records per pool page as fit its own record size."""

    method: int
    k_bits: int
    v_bits: int
    k_group_tokens: int
    v_group_channels: int
    record_bytes: int
    k_codes_offset: int
    k_codes_bytes: int
    k_meta_offset: int
    k_meta_bytes: int
    v_codes_offset: int
    v_codes_bytes: int
    v_meta_offset: int
    v_meta_bytes: int
    side_bytes_per_token: int
    records_per_page: int


@dataclass(frozen=True)
class BlocksReply:
    """FETCH blocks mode: a page table into the shm pool plus the fp16 tail as rows."""

    page_bytes: int
    block_tokens: int
    side_records_per_page: int
    layouts: Tuple[RecordLayout, ...]
    layout_index: np.ndarray        # uint16 [n_pairs]
    indptr: np.ndarray              # uint32 [n_pairs + 1]
    indices: np.ndarray             # uint32 [nnz]
    last_page_len: np.ndarray       # uint32 [n_pairs]
    side_indices: Optional[np.ndarray]  # uint32 [nnz], or None when no layout has side records
    tail: Rows


@dataclass(frozen=True)
class ErrorReply:
    code: int
    message: str


@dataclass(frozen=True)
class Reply:
    request_id: int
    type: int
    body: object = field(repr=False)
