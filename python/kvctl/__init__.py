# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kvctl: Python client of the kvctl KV-cache daemon (wire protocol v1, ipc/PROTOCOL.md).

Pure Python on pyzmq and numpy. bfloat16 data travels as uint16 bit patterns (numpy has no
bfloat16): pass uint16 arrays (or float arrays, rounded to nearest even, or torch bfloat16
tensors) to a bfloat16 session, and convert fetched bits with bf16_to_float32().

    import kvctl
    with kvctl.Client("ipc:///tmp/kvctl.sock") as client:
        client.hello(layers=2, kv_heads=1, head_dim=64, dtype="float16")
        client.open(1)
        client.append(1, k, v)                         # [layers, tokens, kv_heads, head_dim]
        k, v, positions = client.fetch(1, stacked=True)
"""

from . import protocol
from .client import BlocksTable, Client, FetchResult, Session, parse_info
from .protocol import (AppendReply, ByeReply, KvctlError, ProtocolError, QuantInfo, ServerError,
                       SessionLostError, Timeout, bf16_to_float32, float32_to_bf16)

__version__ = "0.1.0"

__all__ = [
    "AppendReply", "BlocksTable", "ByeReply", "Client", "FetchResult", "KvctlError",
    "ProtocolError", "QuantInfo", "ServerError", "Session", "SessionLostError", "Timeout", "bf16_to_float32",
    "float32_to_bf16", "parse_info", "protocol", "__version__",
]
