"""Size-prefixed frames, request headers (v0-v2) and response headers (v0-v1), sans-IO.

A request frame is `int32 size | header | body`. The header version follows from the API's
request version (flexible versions use header v2, others v1; ControlledShutdown v0 used
header v0, which no 4.x API needs, but v0 is decoded for completeness). Responses to flexible
requests use response header v1 (a tag buffer after the correlation id), except ApiVersions,
whose response header is always v0 so that a client can read it before it knows our versions.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

from protocol import primitives as P
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import REQUESTS

API_VERSIONS_KEY = 18
_HEADER_FIXED = struct.Struct(">hhi")  # api key, api version, correlation id
_SIZE = struct.Struct(">i")


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int
    body_offset: int  # where the request body starts within the frame


def request_header_version(api_key: int, api_version: int) -> int:
    """As Kafka: flexible versions (open-ended, so also versions newer than ours) use header v2."""
    codec = REQUESTS.get(api_key)
    if codec is None:
        return 1
    return 2 if codec.spec.is_flexible(api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if request_header_version(api_key, api_version) == 2 else 0


def decode_request_header(frame: Any, header_version: int | None = None) -> RequestHeader:
    """Decode the header at the start of `frame` (the bytes after the size prefix)."""
    try:
        api_key, api_version, correlation_id = _HEADER_FIXED.unpack_from(frame, 0)
        if header_version is None:
            header_version = request_header_version(api_key, api_version)
        pos = 8
        client_id = None
        if header_version >= 1:
            # client id is a nullable int16-length string even in header v2
            (n,) = P.INT16.unpack_from(frame, pos)
            pos += 2
            if n >= 0:
                end = pos + n
                if end > len(frame):
                    raise ProtocolError("client id overruns the frame", ErrorCode.INVALID_REQUEST)
                client_id = str(frame[pos:end], "utf-8")
                pos = end
        if header_version >= 2:
            count, pos = P.read_uvarint(frame, pos)
            for _ in range(count):
                _tag, pos = P.read_uvarint(frame, pos)
                size, pos = P.read_uvarint(frame, pos)
                pos += size
            if pos > len(frame):
                raise ProtocolError("header tagged fields overrun the frame", ErrorCode.INVALID_REQUEST)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ProtocolError("malformed request header: %s" % exc, ErrorCode.INVALID_REQUEST) from None
    return RequestHeader(api_key, api_version, correlation_id, client_id, header_version, pos)


def encode_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, header_version: int | None = None
) -> bytes:
    """Client side of the header (used by tests and tools)."""
    if header_version is None:
        header_version = request_header_version(api_key, api_version)
    out = [_HEADER_FIXED.pack(api_key, api_version, correlation_id)]
    if header_version >= 1:
        if client_id is None:
            out.append(b"\xff\xff")
        else:
            raw = client_id.encode()
            out.append(P.INT16.pack(len(raw)) + raw)
    if header_version >= 2:
        out.append(b"\x00")
    return b"".join(out)


def encode_response_header(correlation_id: int, header_version: int) -> bytes:
    if header_version >= 1:
        return _SIZE.pack(correlation_id) + b"\x00"
    return _SIZE.pack(correlation_id)


def size_prefix(length: int) -> bytes:
    return _SIZE.pack(length)


class FrameTooLarge(ProtocolError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__("frame of %d bytes exceeds the limit of %d bytes" % (size, limit), ErrorCode.INVALID_REQUEST)
        self.size = size
        self.limit = limit


class FrameSplitter:
    """Accumulates received bytes and yields complete frames (without their size prefix).

    `max_size` is socket.request.max.bytes: a larger (or negative) size raises FrameTooLarge
    before the frame is buffered, so an oversized request costs no memory.
    """

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int = 100 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self.max_size = max_size

    def feed(self, data: bytes) -> Iterator[bytes]:
        buf = self._buf
        if not buf and len(data) >= 4:
            # fast path: whole frames in a fresh chunk are sliced without copying into the buffer
            pos = 0
            end = len(data)
            while end - pos >= 4:
                (size,) = _SIZE.unpack_from(data, pos)
                if size < 0 or size > self.max_size:
                    raise FrameTooLarge(size, self.max_size)
                if end - pos - 4 < size:
                    break
                yield data[pos + 4 : pos + 4 + size]
                pos += 4 + size
            if pos < end:
                buf += data[pos:] if pos else data
            return
        buf += data
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > self.max_size:
                raise FrameTooLarge(size, self.max_size)
            if end - pos - 4 < size:
                break
            yield bytes(buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if pos:
            del buf[:pos]

    @property
    def buffered(self) -> int:
        return len(self._buf)
