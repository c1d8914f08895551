"""Size-prefixed framing and the request/response headers (protocol/frames.py)."""

from __future__ import annotations

import random
import struct

import pytest

from protocol.errors import ErrorCode, ProtocolError
from protocol.frames import (
    BufferPool,
    FrameSplitter,
    FrameTooLarge,
    RequestHeader,
    decode_header_rest,
    decode_request_header,
    encode_request_header,
    encode_response_header,
    request_header_version,
    response_header_version,
    size_prefix,
)
from protocol.messages import CLASSES, REQUESTS, decode, encode


def framed(*bodies: bytes) -> bytes:
    return b"".join(size_prefix(len(b)) + b for b in bodies)


BODIES = [b"", b"x", b"\x00" * 3, b"abcd", bytes(range(256)) * 3, b"\xff" * 5]


# ----- FrameSplitter -------------------------------------------------------------------------


def test_many_frames_in_one_chunk() -> None:
    fs = FrameSplitter()
    assert [bytes(f) for f in fs.feed(framed(*BODIES))] == BODIES
    assert fs.buffered == 0


def test_byte_by_byte() -> None:
    fs = FrameSplitter()
    data = framed(*BODIES)
    out: list[bytes] = []
    for i in range(len(data)):
        out.extend(bytes(f) for f in fs.feed(data[i : i + 1]))
        assert fs.buffered <= max(len(b) for b in BODIES) + 4
    assert out == BODIES
    assert fs.buffered == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_chunking(seed: int) -> None:
    rng = random.Random(seed)
    bodies = [rng.randbytes(rng.choice([0, 1, 3, 4, 5, 100, 1000])) for _ in range(rng.randint(1, 12))]
    data = framed(*bodies)
    fs = FrameSplitter()
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        n = rng.choice([1, 2, 3, 4, 5, 7, 64, 4096])
        chunk = data[pos : pos + n]
        out.extend(bytes(f) for f in fs.feed(chunk))
        pos += n
    assert out == bodies
    assert fs.buffered == 0


def test_partial_frame_is_kept() -> None:
    fs = FrameSplitter()
    data = framed(b"hello", b"world")
    assert [bytes(f) for f in fs.feed(data[:12])] == [b"hello"]
    assert fs.buffered == 3
    assert list(fs.feed(b"")) == []
    assert [bytes(f) for f in fs.feed(data[12:])] == [b"world"]
    assert fs.buffered == 0


def test_empty_frames() -> None:
    fs = FrameSplitter()
    assert [bytes(f) for f in fs.feed(b"\x00\x00\x00\x00" * 3)] == [b"", b"", b""]
    assert [bytes(f) for f in fs.feed(b"\x00\x00")] == []
    assert [bytes(f) for f in fs.feed(b"\x00\x00")] == [b""]


def test_size_limit_is_inclusive() -> None:
    fs = FrameSplitter(max_size=10)
    assert [bytes(f) for f in fs.feed(framed(b"0123456789"))] == [b"0123456789"]
    with pytest.raises(FrameTooLarge) as exc:
        list(fs.feed(size_prefix(11)))
    assert exc.value.size == 11 and exc.value.limit == 10


@pytest.mark.parametrize("size", [-1, -(2**31), 2**31 - 1, 100 * 1024 * 1024 + 1])
def test_oversized_or_negative_before_buffering(size: int) -> None:
    """The size alone is enough to reject a frame: the body is never waited for."""
    for prefix in (b"", framed(b"ok")):
        fs = FrameSplitter()
        frames: list[bytes] = []
        with pytest.raises(FrameTooLarge) as exc:
            for f in fs.feed(prefix + struct.pack(">i", size)):
                frames.append(bytes(f))
        assert isinstance(exc.value, ProtocolError)
        assert exc.value.size == size
        assert frames == ([b"ok"] if prefix else [])


def test_oversized_size_split_across_chunks() -> None:
    fs = FrameSplitter(max_size=1000)
    assert list(fs.feed(b"\x00\x01")) == []
    with pytest.raises(FrameTooLarge):
        list(fs.feed(b"\x00\x00"))


# ----- FrameSplitter: receiving in place (asyncio.BufferedProtocol) ---------------------------


def receive(fs: FrameSplitter, data: bytes, rng: random.Random) -> list[memoryview]:
    """What a socket does: write at most len(get_buffer()) bytes into it, then buffer_updated."""
    out: list[memoryview] = []
    pos = 0
    while pos < len(data):
        target = fs.get_buffer(65536)
        assert len(target) > 0 and not target.readonly
        n = min(len(target), len(data) - pos, rng.choice([1, 3, 4, 7, 100, 4096, 65536, 1 << 20]))
        target[:n] = data[pos : pos + n]
        pos += n
        out.extend(fs.buffer_updated(n))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_receive_in_place_random_reads(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [0, 1, 3, 4, 5, 100, 5000, 70_000, 300_000]
    bodies = [rng.randbytes(rng.choice(sizes)) for _ in range(rng.randint(1, 15))]
    fs = FrameSplitter(pool=BufferPool(max_bytes=1 << 20, chunk_size=4096))
    frames = receive(fs, framed(*bodies), rng)
    assert [bytes(f) for f in frames] == bodies
    assert fs.buffered == 0


def test_frames_are_read_only_and_stay_intact() -> None:
    """Frames handed out are never written again, though reading goes on (and buffers move)."""
    rng = random.Random(7)
    fs = FrameSplitter(pool=BufferPool(max_bytes=1 << 20, chunk_size=4096))
    bodies = [rng.randbytes(n) for n in (10, 3000, 5000, 20_000, 1, 4093)] * 5
    kept: list[memoryview] = []
    for body in bodies:
        kept.extend(receive(fs, framed(body), rng))
    assert [bytes(f) for f in kept] == bodies
    assert all(f.readonly for f in kept)
    with pytest.raises(TypeError):
        kept[0][0] = 1  # type: ignore[index]


def test_large_frame_is_received_in_place() -> None:
    """Once a frame's size is known, get_buffer offers room for all of it: the body goes
    straight into the buffer the frame is handed out from (no copy)."""
    fs = FrameSplitter()
    body = random.Random(1).randbytes(3 * 1024 * 1024 + 17)
    data = framed(body)
    head = fs.get_buffer()
    head[:100] = data[:100]  # the size prefix and a little of the body, as a first read would
    assert list(fs.buffer_updated(100)) == []
    target = fs.get_buffer()
    assert len(target) >= len(data) - 100
    target[: len(data) - 100] = data[100:]
    (frame,) = fs.buffer_updated(len(data) - 100)
    assert frame.obj is target.obj
    assert frame == body
    assert fs.buffered == 0


def test_buffer_updated_checks_the_count() -> None:
    fs = FrameSplitter()
    target = fs.get_buffer()
    with pytest.raises(ValueError):
        fs.buffer_updated(len(target) + 1)
    with pytest.raises(ValueError):
        fs.buffer_updated(-1)


def test_receive_buffers_are_reused_once_frames_are_gone() -> None:
    pool = BufferPool(max_bytes=8 << 20)
    fs = FrameSplitter(pool=pool)
    big = b"\x01" * 500_000
    (first,) = fs.feed(framed(big))
    array = first.obj
    (second,) = fs.feed(framed(big))
    assert second.obj is not array  # the first frame still points into its buffer
    assert first == big and second == big
    del first
    (third,) = fs.feed(framed(big))
    assert third.obj is array  # free again: taken from the pool, not allocated
    assert third == big and second == big


def test_pool_prefers_the_smallest_free_buffer_and_is_bounded() -> None:
    pool = BufferPool(max_bytes=1 << 20, chunk_size=4096)
    small, large = pool.take(4096), pool.take(200_000)
    assert len(small) == 4096 and len(large) == 200_704  # whole chunks
    pool.give(large)
    pool.give(small)
    assert pool.take(100) is small
    view = memoryview(large)[10:20]  # a frame still points into it
    assert len(pool.take(100_000)) == 102_400  # so a new one
    del view
    assert pool.take(100_000) is large
    pool.give(bytearray(300_000))  # more than a quarter of the pool: not kept
    assert pool.retired_bytes == 0
    for _ in range(6):
        pool.give(bytearray(200_000))
    assert pool.retired_bytes <= 1 << 20


def test_release_returns_the_buffer() -> None:
    pool = BufferPool()
    fs = FrameSplitter(pool=pool)
    assert [bytes(f) for f in fs.feed(framed(b"abc") + b"\x00\x00")] == [b"abc"]
    assert pool.retired_bytes == 0
    fs.release()
    assert pool.retired_bytes > 0 and fs.buffered == 0


# ----- request headers -----------------------------------------------------------------------


def test_header_versions_follow_flexible_versions() -> None:
    for key, codec in REQUESTS.items():
        for v in codec.spec.valid_versions:
            flexible = codec.spec.is_flexible(v)
            assert request_header_version(key, v) == (2 if flexible else 1)
            expected = 0 if key == 18 else (1 if flexible else 0)
            assert response_header_version(key, v) == expected
    assert request_header_version(18, 3) == 2 and request_header_version(18, 2) == 1
    assert request_header_version(3, 9) == 2 and request_header_version(3, 8) == 1


def test_header_version_beyond_the_supported_range_follows_kafka() -> None:
    """Kafka derives the header version from the open-ended flexibleVersions alone, so a newer
    client's ApiVersions v5 request (KIP-511: answered with UNSUPPORTED_VERSION) carries header v2."""
    assert request_header_version(18, 5) == 2
    assert request_header_version(3, 14) == 2
    assert request_header_version(0, 2) == 1  # below the range, not flexible
    assert request_header_version(12345, 0) == 1  # unknown api: legacy layout


@pytest.mark.parametrize("client_id", ["rdkafka", "", None, "kafka-python-3.0.12", "é漢🙂"])
@pytest.mark.parametrize(("key", "version"), [(18, 0), (18, 3), (3, 12), (0, 7), (0, 9), (68, 1)])
def test_request_header_round_trip(key: int, version: int, client_id: str | None) -> None:
    hv = request_header_version(key, version)
    raw = encode_request_header(key, version, 0x12345678, client_id)
    body = b"BODY"
    hdr = decode_request_header(raw + body)
    assert hdr == RequestHeader(key, version, 0x12345678, client_id, hv, len(raw))
    assert (raw + body)[hdr.body_offset :] == body
    # the generated RequestHeader codec agrees byte for byte
    generated = CLASSES["RequestHeader"](
        request_api_key=key, request_api_version=version, correlation_id=0x12345678, client_id=client_id
    )
    assert encode(generated, hv) == raw
    assert decode("RequestHeader", hv, raw) == generated


def test_header_v0_has_no_client_id() -> None:
    raw = struct.pack(">hhi", 7, 0, 42)
    hdr = decode_request_header(raw + b"\x01\x02", header_version=0)
    assert hdr == RequestHeader(7, 0, 42, None, 0, 8)
    assert encode_request_header(7, 0, 42, "ignored", header_version=0) == raw


def test_null_client_id() -> None:
    raw = struct.pack(">hhih", 3, 1, 7, -1)
    hdr = decode_request_header(raw)
    assert hdr.client_id is None and hdr.body_offset == 10
    assert encode_request_header(3, 1, 7, None) == raw


def test_header_v2_tagged_fields_are_skipped() -> None:
    base = struct.pack(">hhih", 18, 3, 9, 3) + b"cli"
    tags = b"\x02" + b"\x00\x03abc" + b"\x05\x00"  # two unknown tagged fields
    hdr = decode_request_header(base + tags + b"BODY")
    assert hdr.client_id == "cli" and hdr.header_version == 2
    assert hdr.body_offset == len(base) + len(tags)
    # a large tag number and a tag count as multi-byte varints
    many = b"\x81\x01" + b"".join(b"\xff\x7f\x00" for _ in range(129))
    hdr = decode_request_header(base + many)
    assert hdr.body_offset == len(base) + len(many)


def _headers_for_truncation() -> list[bytes]:
    return [
        encode_request_header(3, 4, 1, "client"),
        encode_request_header(18, 3, 1, "client"),
        struct.pack(">hhih", 18, 3, 9, 3) + b"cli" + b"\x01\x00\x03abc",
        struct.pack(">hhih", 18, 4, 9, -1) + b"\x01\x81\x01\x02xy",
    ]


@pytest.mark.parametrize("raw", _headers_for_truncation())
def test_truncated_headers(raw: bytes) -> None:
    decode_request_header(raw)
    for n in range(len(raw)):
        with pytest.raises(ProtocolError) as exc:
            decode_request_header(raw[:n])
        assert exc.value.code == ErrorCode.INVALID_REQUEST


def test_bad_client_id() -> None:
    with pytest.raises(ProtocolError):
        decode_request_header(struct.pack(">hhih", 3, 1, 7, 2) + b"\xff\xfe")
    # like Kafka's generated readers, any negative length of a nullable string means null
    assert decode_request_header(struct.pack(">hhih", 3, 1, 7, -2)).client_id is None


def test_overlong_tag_varint() -> None:
    raw = struct.pack(">hhih", 18, 3, 9, -1) + b"\xff\xff\xff\xff\xff\xff"
    with pytest.raises(ProtocolError):
        decode_request_header(raw)


def test_unknown_api_keeps_correlation_id() -> None:
    raw = struct.pack(">hhih", 999, 0, 77, 1) + b"c"
    hdr = decode_request_header(raw)
    assert (hdr.api_key, hdr.correlation_id, hdr.client_id, hdr.header_version) == (999, 77, "c", 1)


# ----- response headers ----------------------------------------------------------------------


def test_response_headers() -> None:
    assert encode_response_header(5, 0) == b"\x00\x00\x00\x05"
    assert encode_response_header(-1, 1) == b"\xff\xff\xff\xff\x00"
    for hv in (0, 1):
        raw = encode_response_header(123456, hv)
        obj = decode("ResponseHeader", hv, raw)
        assert obj.correlation_id == 123456
        assert encode(obj, hv) == raw


@pytest.mark.parametrize("version", range(5))
def test_api_versions_response_header_is_always_v0(version: int) -> None:
    assert response_header_version(18, version) == 0
    # also for versions we do not support, so that a newer client can read our error
    assert response_header_version(18, 7) == 0


def test_pool_trim_drops_the_oldest_retired_buffers() -> None:
    pool = BufferPool(max_bytes=1 << 20, chunk_size=4096)
    arrays = [pool.take(4096) for _ in range(4)]
    for a in arrays:
        pool.give(a)
    assert pool.trim(2 * 4096) == 2 * 4096 and pool.retired_bytes == 2 * 4096
    taken = pool.take(4096)
    assert taken is arrays[2] or taken is arrays[3]  # the newest are kept
    assert pool.trim(1 << 20) == 0


@pytest.mark.parametrize(
    "rest, version, message",
    [
        (b"\x00", 1, "the header ends early (a frame of 9 bytes)"),
        (b"\x00\x02ab", 2, "the header ends early (a frame of 12 bytes)"),
        (b"\x00\x10ab", 2, "client id overruns the frame"),
        (b"\x00\x02\xff\xfe", 1, "the client id is not valid UTF-8"),
    ],
)
def test_malformed_header_rest_says_what_is_wrong(rest: bytes, version: int, message: str) -> None:
    """A bad header closes the connection with a warning that names the fault in the protocol's
    terms, not a Python exception's text."""
    with pytest.raises(ProtocolError) as info:
        decode_header_rest(struct.pack(">hhi", 18, 3, 1) + rest, version)
    assert str(info.value) == message
    assert info.value.code is ErrorCode.INVALID_REQUEST
