# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""The body tables of ipc/messages.def (kvctl.wire_schema) as a codec: one generic writer and one
generic reader of frame-0 fields, the Python twin of ipc/wire_fields.h. kvctl.protocol adds the
semantic checks of each message and the tensor frames; nothing here knows a message by name.

Thread safety: pure functions; a Reader is one thread's.

    body = write_fields("PingRequest", wire_schema.PingRequest(session_id=0))   # 8 zero bytes
    values = read_fields(Reader(frame0, HEADER_BYTES), "PingReply")   # {"server_time_us": ...}
"""

from __future__ import annotations

import functools
import json
import operator
import struct
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from . import wire_schema as ws
from .protocol_types import CLASSES, ProtocolError

_INT_FORMATS = {"u8": "<B", "u16": "<H", "u32": "<I", "u64": "<Q", "bool": "<B", "enum8": "<B",
                "enum32": "<I", "tag": "<B", "reserved8": "<B", "count16": "<H"}
_ARRAY_DTYPES = {"u16s": np.dtype("<u2"), "u32s": np.dtype("<u4"), "u64s": np.dtype("<u8")}


@functools.lru_cache(maxsize=None)
def enum_range(name: str) -> Tuple[int, int]:
    values = [e.value for e in getattr(ws, name)]
    return min(values), max(values)


@functools.lru_cache(maxsize=None)
def frame_fields(body: str) -> Tuple[ws.Field, ...]:
    """The tensor frames of a body, in frame order (frame 1 first)."""
    return tuple(f for f in ws.BODIES[body] if f.kind == "frame")


@functools.lru_cache(maxsize=None)
def body_name(cls: type) -> str:
    """The messages.def body a dataclass (or a subclass of one) stands for."""
    return next(c.__name__ for c in cls.__mro__ if c.__name__ in ws.BODIES)


@functools.lru_cache(maxsize=None)
def _fixed(body: str) -> Optional[Tuple[struct.Struct, Tuple[ws.Field, ...], Callable]]:
    """For a body whose frame-0 fields are all fixed-width integers (most requests and replies):
    one struct.Struct, its rows, and a function from the dataclass to the values to pack, so the
    hot path packs and unpacks in one call. None for other bodies."""
    rows = tuple(f for f in ws.BODIES[body] if f.kind != "frame")
    if not all(f.kind in _INT_FORMATS and f.kind != "count16" for f in rows):
        return None
    names = [f.name for f in rows]
    if any(f.kind in ("tag", "reserved8") for f in rows) or len(names) < 2:
        def values(obj, rows=rows):
            return [f.arg if f.kind == "tag" else 0 if f.kind == "reserved8"
                    else getattr(obj, f.name) for f in rows]
    else:
        values = operator.attrgetter(*names)  # A tuple in row order.
    return struct.Struct("<" + "".join(_INT_FORMATS[f.kind][1] for f in rows)), rows, values


class Reader:
    """Reads little-endian fields of frame 0; every failure names the field."""

    def __init__(self, buf: bytes, pos: int, frames: int = 1):
        self.buf, self.pos, self.frames = buf, pos, frames

    def take(self, name: str, n: int) -> bytes:
        if n > len(self.buf) - self.pos:
            raise ProtocolError("truncated at %s: need %d bytes at offset %d, frame has %d left"
                                % (name, n, self.pos, len(self.buf) - self.pos))
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def int(self, name: str, fmt: str) -> int:
        return struct.unpack(fmt, self.take(name, struct.calcsize(fmt)))[0]

    def str(self, name: str, max_bytes: int) -> str:
        n = self.int(name, "<I")
        if n > max_bytes:
            raise ProtocolError("%s: length %d bytes, expected at most %d" % (name, n, max_bytes))
        raw = self.take(name, n)
        if b"\x00" in raw:
            raise ProtocolError("%s: not valid UTF-8 (or contains NUL)" % name)
        try:
            return raw.decode("utf-8")  # Strict: rejects overlongs, surrogates, > U+10FFFF.
        except UnicodeDecodeError:
            raise ProtocolError("%s: not valid UTF-8 (or contains NUL)" % name) from None

    def array(self, name: str, count: int, dtype: np.dtype) -> np.ndarray:
        if count > (len(self.buf) - self.pos) // dtype.itemsize:
            raise ProtocolError("truncated at %s: %d elements of %d bytes at offset %d, frame "
                                "has %d bytes left" % (name, count, dtype.itemsize, self.pos,
                                                       len(self.buf) - self.pos))
        raw = self.take(name, count * dtype.itemsize)
        return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))

    def finish(self, tensor_frames: int = 0) -> None:
        """The body ends exactly at the end of frame 0, and the message has frame 0 plus
        tensor_frames (checked in this order, as PROTOCOL.md section 5)."""
        if self.pos != len(self.buf):
            raise ProtocolError("%d unexpected trailing bytes after the body (body ends at offset "
                                "%d, frame has %d bytes)" % (len(self.buf) - self.pos, self.pos,
                                                              len(self.buf)))
        if self.frames != 1 + tensor_frames:
            raise ProtocolError("frame count: got %d, expected %d"
                                % (self.frames, 1 + tensor_frames))


def _range(f: ws.Field) -> Tuple[int, int]:
    """The values a bool, enum, tag or reserved field may hold."""
    return {"bool": (0, 1), "tag": (f.arg, f.arg), "reserved8": (0, 0)}.get(
        f.kind) or enum_range(f.arg)


def in_range(name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise ProtocolError("%s: got %d, expected %d..%d" % (name, value, lo, hi))


# Count rule -> entries, from the values read so far; kvctl.protocol registers the rules (they
# check the pair shape first, as ipc's ArrayCount does).
CountRules = Dict[str, Callable[[dict], int]]


def read_fields(r: Reader, body: str, rules: CountRules = None, prefix: str = "",
                values: dict = None) -> dict:
    """Reads the frame-0 fields of `body` into a dict of dataclass field values (nested bodies
    become their dataclasses), checking lengths, string limits and UTF-8, enum and bool ranges,
    tags and array counts. Frame rows are left to the caller."""
    values = {} if values is None else values
    fixed = _fixed(body)
    if fixed is not None and fixed[0].size <= len(r.buf) - r.pos:
        for f, v in zip(fixed[1], fixed[0].unpack_from(r.buf, r.pos)):
            if f.kind not in ("u8", "u16", "u32", "u64"):
                lo, hi = _range(f)
                if not lo <= v <= hi:
                    break  # The field loop below names the field and the value.
                if f.kind == "bool":
                    v = bool(v)
                elif f.kind in ("tag", "reserved8"):
                    continue
            values[f.name] = v
        else:
            r.pos += fixed[0].size
            return values
    count = 0
    for f in ws.BODIES[body]:
        name = prefix + f.name
        kind = f.kind
        if kind in ("u8", "u16", "u32", "u64"):
            values[f.name] = r.int(name, _INT_FORMATS[kind])
        elif kind in ("bool", "enum8", "enum32", "tag", "reserved8"):
            v = r.int(name, _INT_FORMATS[kind])
            in_range(name, v, *_range(f))
            if kind == "bool":
                values[f.name] = bool(v)
            elif kind in ("enum8", "enum32"):
                values[f.name] = v
        elif kind == "str":
            values[f.name] = r.str(name, f.arg)
        elif kind == "bytes":
            values[f.name] = bytes(r.take(name, f.arg))
        elif kind == "struct" and not f.name:
            read_fields(r, f.arg, rules, prefix, values)
        elif kind == "struct":
            values[f.name] = CLASSES[f.arg](**read_fields(r, f.arg, rules, name + "."))
        elif kind == "count16":
            count = r.int(name, "<H")
            in_range(name, count, 1, f.arg)
        elif kind == "structs":
            values[f.name] = tuple(
                CLASSES[f.arg](**read_fields(r, f.arg, rules, "%s[%d]." % (name, i)))
                for i in range(count))
        elif kind in _ARRAY_DTYPES:
            values[f.name] = r.array(name, rules[f.arg](values), _ARRAY_DTYPES[kind])
    return values


def write_fields(body: str, obj) -> bytes:
    """The frame-0 bytes of `obj`, a dataclass of `body` (no checks: the caller validated it)."""
    fixed = _fixed(body)
    if fixed is not None:
        return fixed[0].pack(*fixed[2](obj))
    out = []
    for f in ws.BODIES[body]:
        kind = f.kind
        if kind == "tag":
            out.append(struct.pack("<B", f.arg))
        elif kind == "reserved8":
            out.append(b"\x00")
        elif kind == "count16":
            out.append(struct.pack("<H", len(getattr(obj, f.member))))
        elif kind in _INT_FORMATS:
            out.append(struct.pack(_INT_FORMATS[kind], int(getattr(obj, f.name))))
        elif kind == "str":
            raw = getattr(obj, f.name).encode("utf-8")
            out.append(struct.pack("<I", len(raw)) + raw)
        elif kind == "bytes":
            out.append(bytes(getattr(obj, f.name)))
        elif kind == "struct":
            out.append(write_fields(f.arg, getattr(obj, f.name) if f.name else obj))
        elif kind == "structs":
            out.extend(write_fields(f.arg, item) for item in getattr(obj, f.name))
        elif kind in _ARRAY_DTYPES:
            out.append(np.asarray(getattr(obj, f.name)).astype(_ARRAY_DTYPES[kind]).tobytes())
    return b"".join(out)


def describe(body: str, obj, prefix: str = "") -> List[Tuple[str, str]]:
    """(name, value) of every frame-0 field of `obj`, in wire order, in the notation of
    tests/golden/wire_messages.txt: integers in decimal, strings JSON-quoted, raw bytes in hex,
    arrays as [a, b], nested fields as quant.k_bits and layouts[0].method. Derived fields
    (tags, counts, reserved bytes) and frames are left out."""
    out = []
    for f in ws.BODIES[body]:
        kind, name = f.kind, prefix + f.name
        if kind in ("tag", "reserved8", "count16", "frame"):
            continue
        if kind == "struct":
            out += describe(f.arg, getattr(obj, f.name) if f.name else obj,
                            name + "." if f.name else prefix)
        elif kind == "structs":
            for i, item in enumerate(getattr(obj, f.name)):
                out += describe(f.arg, item, "%s[%d]." % (name, i))
        else:
            v = getattr(obj, f.name)
            if kind == "str":
                text = json.dumps(v)
            elif kind == "bytes":
                text = bytes(v).hex()
            elif kind in _ARRAY_DTYPES:
                text = "[%s]" % ", ".join(str(int(x)) for x in np.asarray(v).tolist())
            else:
                text = str(int(v))
            out.append((name, text))
    return out
