"""Wire primitives shared by the generated codecs and by hand-written parsers (headers, records)."""

from __future__ import annotations

import struct
import uuid
from typing import Any

from protocol.errors import ProtocolError

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
UINT16 = struct.Struct(">H")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")
FLOAT64 = struct.Struct(">d")

ZERO_UUID = uuid.UUID(int=0)

# Single-byte unsigned varints are by far the most common (lengths, counts, tag buffers).
_UVARINT_SMALL = [bytes([i]) for i in range(128)]


def encode_uvarint(value: int) -> bytes:
    if 0 <= value < 128:
        return _UVARINT_SMALL[value]
    if value < 0:
        raise ValueError("unsigned varint must not be negative")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint(data: Any, pos: int) -> tuple[int, int]:
    """Read an unsigned varint (at most 5 bytes, as Kafka's 32-bit varints) at `pos`."""
    result = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("unsigned varint is longer than 5 bytes")


def read_uvarlong(data: Any, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtocolError("unsigned varlong is longer than 10 bytes")


def encode_varint(value: int) -> bytes:
    """Zig-zag encoded signed varint (records use these)."""
    return encode_uvarint((value << 1) ^ (value >> 63)) if value >= 0 else encode_uvarint(((-value) << 1) - 1)


def read_varint(data: Any, pos: int) -> tuple[int, int]:
    raw, pos = read_uvarlong(data, pos)
    return (raw >> 1) ^ -(raw & 1), pos


_INT32_ARRAYS: dict[int, struct.Struct] = {}
_INT64_ARRAYS: dict[int, struct.Struct] = {}


def int32_array(n: int) -> struct.Struct:
    s = _INT32_ARRAYS.get(n)
    if s is None:
        s = struct.Struct(">%di" % n)
        if n <= 4096:
            _INT32_ARRAYS[n] = s
    return s


def int64_array(n: int) -> struct.Struct:
    s = _INT64_ARRAYS.get(n)
    if s is None:
        s = struct.Struct(">%dq" % n)
        if n <= 4096:
            _INT64_ARRAYS[n] = s
    return s


def read_uuid(data: Any, pos: int) -> uuid.UUID:
    raw = bytes(data[pos : pos + 16])
    if len(raw) != 16:
        raise ProtocolError("truncated uuid")
    if raw == b"\x00" * 16:
        return ZERO_UUID
    return uuid.UUID(bytes=raw)
