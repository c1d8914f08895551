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
_MIN_READ = 4096  # less free space than this: continue in another buffer rather than read a sliver


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int
    body_offset: int  # where the request body starts within the frame


_HEADER_VERSIONS: dict[tuple[int, int], tuple[int, int]] = {}  # (api key, version) -> (request, response)
_MAX_CACHED_VERSIONS = 4096  # clients choose the versions: the cache stays bounded whatever they send


def _header_versions(api_key: int, api_version: int) -> tuple[int, int]:
    versions = _HEADER_VERSIONS.get((api_key, api_version))
    if versions is None:
        codec = REQUESTS.get(api_key)
        request = 2 if codec is not None and codec.spec.is_flexible(api_version) else 1
        response = 0 if api_key == API_VERSIONS_KEY or request == 1 else 1
        versions = (request, response)
        if len(_HEADER_VERSIONS) < _MAX_CACHED_VERSIONS:
            _HEADER_VERSIONS[(api_key, api_version)] = versions
    return versions


def request_header_version(api_key: int, api_version: int) -> int:
    """As Kafka: flexible versions (open-ended, so also versions newer than ours) use header v2."""
    return _header_versions(api_key, api_version)[0]


def response_header_version(api_key: int, api_version: int) -> int:
    """v1 after a v2 request header, except for ApiVersions (always v0, for any client to read)."""
    return _header_versions(api_key, api_version)[1]


def decode_request_header(frame: Any, header_version: int | None = None) -> RequestHeader:
    """Decode the header at the start of `frame` (the bytes after the size prefix)."""
    try:
        api_key, api_version, correlation_id = _HEADER_FIXED.unpack_from(frame, 0)
    except struct.error as exc:
        raise ProtocolError("malformed request header: %s" % exc, ErrorCode.INVALID_REQUEST) from None
    if header_version is None:
        header_version = request_header_version(api_key, api_version)
    client_id, pos = decode_header_rest(frame, header_version)
    return RequestHeader(api_key, api_version, correlation_id, client_id, header_version, pos)


def decode_header_rest(frame: Any, header_version: int) -> tuple[str | None, int]:
    """What follows the fixed part of a request header (api key, version, correlation id): the
    client id and where the body starts, for the server, which has read the fixed part itself."""
    pos = 8
    client_id = None
    try:
        if header_version >= 1:
            # client id is a nullable int16-length string even in header v2
            n = (frame[8] << 8) | frame[9]
            pos = 10
            if n < 0x8000:
                end = pos + n
                if end > len(frame):
                    raise ProtocolError("client id overruns the frame", ErrorCode.INVALID_REQUEST)
                client_id = str(frame[pos:end], "utf-8")
                pos = end
        if header_version >= 2:
            count = frame[pos]  # tagged fields: almost always none
            pos += 1
            if count:
                count, pos = P.read_uvarint(frame, pos - 1)
                for _ in range(count):
                    _tag, pos = P.read_uvarint(frame, pos)
                    size, pos = P.read_uvarint(frame, pos)
                    pos += size
                if pos > len(frame):
                    raise ProtocolError("header tagged fields overrun the frame", ErrorCode.INVALID_REQUEST)
    except IndexError:
        raise ProtocolError("the header ends early (a frame of %d bytes)" % len(frame),
                            ErrorCode.INVALID_REQUEST) from None
    except UnicodeDecodeError:
        raise ProtocolError("the client id is not valid UTF-8", ErrorCode.INVALID_REQUEST) from None
    return client_id, pos


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


def _in_use(array: bytearray) -> bool:
    """Whether a memoryview (a frame) still points into `array`: a bytearray refuses to be resized
    while one does. (Shrinking by one byte and growing back never reallocates.)"""
    try:
        last = array.pop()
    except BufferError:
        return True
    array.append(last)
    return False


class BufferPool:
    """Receive buffers that FrameSplitters retire, handed out again once no frame points into them.

    Fresh memory is dear: a large bytearray is mapped anew, page-faulted in and zero-filled, which
    costs more than the copies that receiving in place avoids. One pool serves all the connections
    of a server; it keeps at most `max_bytes` of retired buffers (oldest dropped first).
    """

    __slots__ = ("_retired", "_bytes", "max_bytes", "chunk_size")

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, chunk_size: int = 64 * 1024) -> None:
        self.max_bytes = max_bytes
        self.chunk_size = max(chunk_size, _MIN_READ)
        self._retired: list[bytearray] = []  # oldest first; some may still be in use
        self._bytes = 0

    def take(self, capacity: int) -> bytearray:
        """A buffer of at least `capacity` bytes: the smallest retired one free again, or a new one
        of whole chunks (so that frames of similar sizes fit each other's buffers)."""
        chunk = self.chunk_size
        want = -(-capacity // chunk) * chunk
        retired = self._retired
        best = -1
        best_size = 0
        for i, array in enumerate(retired):
            size = len(array)
            if size >= want and (best < 0 or size < best_size) and not _in_use(array):
                best, best_size = i, size
                if size == want:
                    break
        if best >= 0:
            self._bytes -= best_size
            return retired.pop(best)
        return bytearray(want)

    def trim(self, max_bytes: int) -> int:
        """Drop retired buffers, oldest first, until at most `max_bytes` are kept (when traffic has
        calmed down: the memory goes back to the allocator); returns the bytes dropped."""
        dropped = 0
        while self._bytes > max_bytes and self._retired:
            size = len(self._retired.pop(0))
            self._bytes -= size
            dropped += size
        return dropped

    def give(self, array: bytearray) -> None:
        if len(array) > self.max_bytes // 4:
            return
        self._retired.append(array)
        self._bytes += len(array)
        while self._bytes > self.max_bytes:
            self._bytes -= len(self._retired.pop(0))

    @property
    def retired_bytes(self) -> int:
        return self._bytes


class FrameSplitter:
    """Receives bytes into buffers it owns and yields complete frames (without their size prefix).

    Two ways in: `get_buffer()` + `buffer_updated(n)` let a socket read straight into the buffer
    (asyncio.BufferedProtocol), and `feed(data)` copies bytes in. Frames come out as read-only
    memoryviews over the buffer; a buffer is never resized, and never written where a frame still
    points, so a frame stays valid for as long as it is referenced (the decoded request's records
    fields point into it). Once the size of a frame is known and the frame does not fit in the
    current buffer, the splitter continues in a buffer with room for it (from `pool`) and moves
    the bytes received so far there; the rest of the frame is then received in place, so a large
    request is never copied.

    `max_size` is socket.request.max.bytes: a larger (or negative) size raises FrameTooLarge
    before the frame is buffered, so an oversized request costs no memory. (A frame within the
    limit gets its whole buffer as soon as its size is read, as Kafka allocates its receive
    buffer.) Iterate what `buffer_updated`/`feed` return to its end before the next read.
    """

    __slots__ = ("_array", "_buf", "_start", "_end", "pool", "max_size")

    def __init__(self, max_size: int = 100 * 1024 * 1024, pool: BufferPool | None = None) -> None:
        self.max_size = max_size
        self.pool = pool if pool is not None else BufferPool(max_bytes=4 * 1024 * 1024)
        self._array: bytearray | None = None  # taken at the first read: a silent connection holds none
        self._buf = memoryview(b"")  # the current buffer: over _array
        self._start = 0  # first received byte not handed out yet
        self._end = 0  # end of the received bytes

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Free space to receive into (never empty); report what was written with `buffer_updated`."""
        buf, start, end = self._buf, self._start, self._end
        free = len(buf) - end
        if end - start >= 4:
            (size,) = _SIZE.unpack_from(buf, start)
            if 0 <= size <= self.max_size and start + 4 + size > len(buf):
                self._move(4 + size)
            elif free == 0:  # only after an invalid size, which buffer_updated has reported
                self._move(end - start + _MIN_READ)
        elif free < _MIN_READ:
            self._move(_MIN_READ)
        return self._buf[self._end :]

    def _move(self, capacity: int) -> None:
        """Continue in another buffer of at least `capacity` bytes, taking the bytes of the
        incomplete frame along; the current one goes back to the pool."""
        array = self.pool.take(capacity)
        buf = memoryview(array)
        pending = self._end - self._start
        buf[:pending] = self._buf[self._start : self._end]
        self.release()
        self._array, self._buf, self._start, self._end = array, buf, 0, pending

    def release(self) -> None:
        """Give the current buffer back to the pool (when the connection closes, or on a move)."""
        if self._array is not None:
            self._buf.release()  # our own view of it; the frames' views keep it busy until they go
            self.pool.give(self._array)
            self._array, self._buf, self._start, self._end = None, memoryview(b""), 0, 0

    def buffer_updated(self, nbytes: int) -> Iterator[memoryview]:
        """`nbytes` were written at the start of the last `get_buffer()`: the frames completed."""
        if nbytes < 0 or self._end + nbytes > len(self._buf):
            raise ValueError("buffer_updated(%d) beyond the buffer handed out" % nbytes)
        self._end += nbytes
        return self._frames()

    def frames_into(self, nbytes: int, out: Any) -> int:
        """`buffer_updated`, the completed frames appended to `out` (a deque or list) at once;
        returns their total size."""
        if nbytes < 0 or self._end + nbytes > len(self._buf):
            raise ValueError("buffer_updated(%d) beyond the buffer handed out" % nbytes)
        self._end += nbytes
        buf = self._buf
        pos, end, limit = self._start, self._end, self.max_size
        total = 0
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > limit:
                self._start = pos
                raise FrameTooLarge(size, limit)
            stop = pos + 4 + size
            if stop > end:
                break
            out.append(buf[pos + 4 : stop].toreadonly())
            total += size
            pos = stop
        self._start = pos
        return total

    def _frames(self) -> Iterator[memoryview]:
        buf = self._buf
        pos, end, limit = self._start, self._end, self.max_size
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > limit:
                raise FrameTooLarge(size, limit)
            stop = pos + 4 + size
            if stop > end:
                break
            self._start = stop
            yield buf[pos + 4 : stop].toreadonly()
            pos = stop

    def feed(self, data: Any) -> Iterator[memoryview]:
        """Copy `data` (any bytes-like object) in and yield the frames it completes."""
        view = memoryview(data).cast("B")
        while view:
            target = self.get_buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            yield from self.buffer_updated(n)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet handed out as a frame."""
        return self._end - self._start
