# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""The values and errors of the kvctl wire protocol (ipc/PROTOCOL.md): the reply bodies (frozen
dataclasses generated from ipc/messages.def into kvctl.wire_schema, a few with conveniences
added here), the status and quantizer code tables, and the exceptions this package raises.
kvctl.protocol re-exports every name here; import them from there.

Thread safety: immutable values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import wire_schema as ws
from .wire_schema import (  # noqa: F401 (re-exported)
    AppendReply, ByeReply, CloseReply, ErrorReply, FetchDenseReply, OpenPrefixReply, OpenReply,
    PingReply, SavePrefixReply, StatsReply)

# kvctl::StatusCode values carried by ERROR replies (common/status.h, listed in messages.def).
STATUS_CODES = {code.value: code.name for code in ws.StatusCode}
STATUS_CODE_VALUES = {name: value for value, name in STATUS_CODES.items()}

# HELLO reply pool_location values, and the size of its cuda_ipc_handle (cudaIpcMemHandle_t).
POOL_HOST_SHM, POOL_CUDA_DEVICE = ws.PoolLocation.HOST_SHM, ws.PoolLocation.CUDA_DEVICE
CUDA_IPC_HANDLE_BYTES = ws.CUDA_IPC_HANDLE_BYTES

# kvctl::QuantMethod values (kernels/quant_types.h), as names.
QUANT_METHODS = tuple(method.name.lower() for method in ws.QuantMethod)

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


# ---- Values: the generated body dataclasses (wire_schema), with the conveniences below -----------


class QuantInfo(ws.QuantInfo):
    """The quantizer a session gets by default (HELLO reply)."""

    @property
    def method_name(self) -> str:
        return QUANT_METHODS[self.method]


class HelloReply(ws.HelloReply):
    @property
    def pool_on_device(self) -> bool:
        return self.pool_location == POOL_CUDA_DEVICE


class RecordLayout(ws.RecordLayout):
    """Byte layout of one block record and of the pair's window row slots (64 bytes on the
    wire). records_per_page and rows_per_page are per layout: each (layer, head) packs as many
    slots per pool page as fit its own slot size."""

    @property
    def method_name(self) -> str:
        return QUANT_METHODS[self.method]


# Token rows of a dense FETCH. Pairs i = (layer -
# layer_begin) * kv_heads + head; counts[i] rows each, concatenated in pair order in positions
# (int64 [N]), k and v ([N, head_dim] in dtype; bfloat16 as uint16 bits).
Rows = FetchDenseReply


class BlocksReply(ws.FetchBlocksReply):
    """FETCH blocks mode: a page table into the shm pool, over the records and the row slots of
    the full-precision window, with the window's positions as runs. side_indices is empty when
    no layout has side records."""


# The class the decoder builds for each body of messages.def.
CLASSES = dict(ws.CLASSES, QuantInfo=QuantInfo, HelloReply=HelloReply, RecordLayout=RecordLayout,
               FetchBlocksReply=BlocksReply)


@dataclass(frozen=True)
class Reply:
    request_id: int
    type: int
    body: object = field(repr=False)
