"""protocol.compression: round trips, the framings Kafka clients write, and output bounds."""

from __future__ import annotations

import gzip
import random
import struct

import cramjam
import pytest
from aiokafka import codec as aiocodec
from kafka import codec as kpcodec

from protocol.compression import (
    CODEC_NAMES,
    DEFAULT_MAX_DECOMPRESSED_SIZE,
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    compress,
    decompress,
)
from protocol.errors import ErrorCode, ProtocolError

CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
_rng = random.Random(7)
RANDOM = bytes(_rng.getrandbits(8) for _ in range(100_000))
TEXTISH = b"".join(b"key-%d=value-%d;" % (i, i * 7 % 13) for i in range(20_000))
ZEROS = bytes(3_000_000)
SAMPLES = [b"", b"x", b"hello kafka" * 3, RANDOM, TEXTISH, ZEROS]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: CODEC_NAMES[c])
@pytest.mark.parametrize("data", SAMPLES, ids=["empty", "one", "short", "random", "text", "zeros"])
def test_round_trip(codec: int, data: bytes) -> None:
    packed = compress(codec, data)
    assert decompress(codec, packed) == data
    assert decompress(codec, memoryview(packed)) == data
    assert decompress(codec, bytearray(packed)) == data


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: CODEC_NAMES[c])
def test_input_buffer_types(codec: int) -> None:
    for data in (bytearray(TEXTISH), memoryview(TEXTISH)):
        assert decompress(codec, compress(codec, data)) == TEXTISH


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD], ids=lambda c: CODEC_NAMES[c])
def test_levels(codec: int) -> None:
    assert decompress(codec, compress(codec, TEXTISH, level=1)) == TEXTISH


def test_snappy_writes_xerial_framing_in_32k_blocks() -> None:
    packed = compress(SNAPPY, TEXTISH)
    assert packed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    pos, blocks, out = 16, 0, b""
    while pos < len(packed):
        (size,) = struct.unpack_from(">i", packed, pos)
        out += bytes(cramjam.snappy.decompress_raw(packed[pos + 4 : pos + 4 + size]))
        pos += 4 + size
        blocks += 1
    assert out == TEXTISH
    assert blocks == -(-len(TEXTISH) // 32768)


def test_snappy_reads_raw_and_odd_xerial_streams() -> None:
    assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(TEXTISH))) == TEXTISH
    # librdkafka-style raw output and kafka-python/aiokafka xerial output
    assert decompress(SNAPPY, aiocodec.snappy_encode(TEXTISH, xerial_compatible=False)) == TEXTISH
    assert decompress(SNAPPY, aiocodec.snappy_encode(TEXTISH)) == TEXTISH
    # version fields written little-endian (seen in the wild) are not checked
    le = compress(SNAPPY, TEXTISH)
    le = le[:8] + struct.pack("<ii", 1, 1) + le[16:]
    assert decompress(SNAPPY, le) == TEXTISH
    # two concatenated xerial streams, as snappy-java reads them
    assert decompress(SNAPPY, compress(SNAPPY, b"abc") + compress(SNAPPY, b"def")) == b"abcdef"


@pytest.mark.parametrize(
    "bad",
    [
        b"\x82SNAPPY\x00\x00\x00\x00\x01",  # header cut short
        compress(SNAPPY, TEXTISH)[:-5],  # last block cut short
        compress(SNAPPY, b"abc")[:16] + b"\xff\xff\xff\xf0abc",  # negative block length
        compress(SNAPPY, b"abc") + b"\x00\x00",  # dangling length bytes
        b"\xff\xff\xff\xff\xff\xff",  # raw: bad length varint
    ],
)
def test_snappy_malformed(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        decompress(SNAPPY, bad)


def test_lz4_writes_independent_blocks_without_content_checksum() -> None:
    packed = compress(LZ4, TEXTISH)
    assert packed[:4] == b"\x04\x22\x4d\x18"
    flg = packed[4]
    assert flg >> 6 == 1 and flg & 0x20 and not flg & 0x04


def test_lz4_rejects_dependent_blocks_like_kafka() -> None:
    linked = bytes(cramjam.lz4.compress(TEXTISH))  # cramjam's default links blocks
    assert not linked[4] & 0x20
    with pytest.raises(ProtocolError, match="dependent"):
        decompress(LZ4, linked)


def test_zstd_frame_without_content_size() -> None:
    c = cramjam.zstd.Compressor(level=3)
    c.compress(TEXTISH)
    packed = bytes(c.finish())
    assert packed[4] >> 6 == 0 and not packed[4] & 0x20  # no Frame_Content_Size field
    assert decompress(ZSTD, packed) == TEXTISH
    c = cramjam.zstd.Compressor(level=3)
    c.compress(ZEROS)
    packed = bytes(c.finish())
    assert decompress(ZSTD, packed) == ZEROS  # ratio far above the first buffer guess


def test_zstd_concatenated_frames() -> None:
    assert decompress(ZSTD, compress(ZSTD, b"abc") + compress(ZSTD, TEXTISH)) == b"abc" + TEXTISH


def test_gzip_members_and_trailing_bytes() -> None:
    assert decompress(GZIP, gzip.compress(b"abc") + gzip.compress(b"def")) == b"abcdef"
    # Java's GZIPInputStream ignores bytes after the last member that are not a gzip header
    assert decompress(GZIP, gzip.compress(b"abc") + b"\x00\x00junk") == b"abc"
    with pytest.raises(ProtocolError):
        decompress(GZIP, gzip.compress(TEXTISH)[:-10])
    with pytest.raises(ProtocolError):
        decompress(GZIP, gzip.compress(b"abc") + gzip.compress(b"def")[:-3])
    with pytest.raises(ProtocolError):
        decompress(GZIP, b"")


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=lambda c: CODEC_NAMES[c])
def test_clients_codecs_interoperate(codec: int) -> None:
    encode = {
        GZIP: aiocodec.gzip_encode,
        SNAPPY: aiocodec.snappy_encode,
        LZ4: aiocodec.lz4_encode,
        ZSTD: aiocodec.zstd_encode,
    }[codec]
    decode = {
        GZIP: aiocodec.gzip_decode,
        SNAPPY: aiocodec.snappy_decode,
        LZ4: aiocodec.lz4_decode,
        ZSTD: aiocodec.zstd_decode,
    }[codec]
    for data in (TEXTISH, RANDOM, b"x"):
        assert decompress(codec, encode(data)) == data
        assert decode(compress(codec, data)) == data
    if codec == GZIP:
        assert kpcodec.gzip_decode(compress(GZIP, TEXTISH)) == TEXTISH
        assert decompress(GZIP, kpcodec.gzip_encode(TEXTISH)) == TEXTISH


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: CODEC_NAMES[c])
def test_output_bound(codec: int) -> None:
    packed = compress(codec, ZEROS)
    assert decompress(codec, packed, max_size=len(ZEROS)) == ZEROS
    with pytest.raises(ProtocolError) as info:
        decompress(codec, packed, max_size=len(ZEROS) - 1)
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE


def _zstd_rle_bomb(blocks: int) -> bytes:
    """A zstd frame without content size: RLE blocks of 128 KiB, 4 input bytes each."""
    frame = bytearray(b"\x28\xb5\x2f\xfd\x00\x38")  # no FCS, window 128 KiB
    for i in range(blocks):
        last = 1 if i == blocks - 1 else 0
        frame += ((128 * 1024) << 3 | 1 << 1 | last).to_bytes(3, "little") + b"\x00"
    return bytes(frame)


def test_zstd_bomb_without_content_size_is_bounded() -> None:
    small = _zstd_rle_bomb(4)
    assert decompress(ZSTD, small) == bytes(4 * 128 * 1024)
    bomb = _zstd_rle_bomb(DEFAULT_MAX_DECOMPRESSED_SIZE // (128 * 1024) + 1)  # ~2 KiB of input
    with pytest.raises(ProtocolError, match="exceed"):
        decompress(ZSTD, bomb)
    with pytest.raises(ProtocolError, match="exceed"):
        decompress(ZSTD, _zstd_rle_bomb(4), max_size=100_000)


def test_declared_sizes_beyond_bound_fail_before_decompressing() -> None:
    huge = 1 << 40
    raw_snappy_claim = bytes(cramjam.snappy.compress_raw(b"a"))[1:]  # drop the length varint
    claim = bytearray()
    n = DEFAULT_MAX_DECOMPRESSED_SIZE + 1
    while n > 0x7F:
        claim.append(n & 0x7F | 0x80)
        n >>= 7
    claim.append(n)
    with pytest.raises(ProtocolError, match="exceed"):
        decompress(SNAPPY, bytes(claim) + raw_snappy_claim)
    zstd_claim = b"\x28\xb5\x2f\xfd\xe0" + huge.to_bytes(8, "little") + b"\x01\x00\x00"
    with pytest.raises(ProtocolError, match="exceed"):
        decompress(ZSTD, zstd_claim)


def test_unknown_codec() -> None:
    for codec in (5, 6, 7):
        with pytest.raises(ProtocolError):
            decompress(codec, b"abc")
        with pytest.raises(ValueError):
            compress(codec, b"abc")


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=lambda c: CODEC_NAMES[c])
def test_garbage_raises_protocol_error(codec: int) -> None:
    # (b"\x00" is valid raw snappy: an empty stream)
    for bad in (b"", b"\x01", b"garbage" * 10, RANDOM[:1000], compress(codec, TEXTISH)[:-7]):
        with pytest.raises(ProtocolError):
            decompress(codec, bad)
