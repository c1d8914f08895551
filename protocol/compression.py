"""Record batch compression codecs (attributes bits 0-2) as Kafka writes and reads them.

- gzip (1): RFC 1952 members; several concatenated members are read like Java's GZIPInputStream.
- snappy (2): written with xerial (snappy-java ``SnappyOutputStream``) framing, which is what
  Kafka's Java client and broker write: a 16-byte header (0x82 "SNAPPY" 0x00, int32 version,
  int32 min-compatible version) then blocks of int32 big-endian length + raw snappy data, each
  holding at most 32 KiB of input. Every Kafka client reads it. On read both that framing and
  raw snappy (what librdkafka writes) are accepted; the version fields are not checked
  because some producers write them little-endian.
- lz4 (3): the LZ4 frame format with independent blocks. Kafka's reader rejects frames with
  linked blocks ("Dependent block stream is unsupported"), so this reader does too.
- zstd (4): standard zstd frames, with or without the content size field.

Every failure raises ProtocolError(CORRUPT_MESSAGE). Output size is bounded by ``max_size``
(default ``DEFAULT_MAX_DECOMPRESSED_SIZE``, 64 MiB, about 64 times Kafka's default
``max.message.bytes``) so a small hostile batch cannot expand into gigabytes.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

import cramjam

from protocol.errors import ProtocolError

Buffer = bytes | bytearray | memoryview

NONE: Final = 0
GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4
CODEC_NAMES: Final = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

DEFAULT_MAX_DECOMPRESSED_SIZE: Final = 64 * 1024 * 1024

# Kafka's default levels (KIP-390): gzip 6 (Deflater's default), zstd 3, and lz4 "9", which
# Kafka maps to lz4's fast (non-HC) compressor: liblz4's frame level 0. Other lz4 levels are HC.
_GZIP_LEVEL = 6
_LZ4_LEVEL = 0
_ZSTD_LEVEL = 3

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_SIZE = 32 * 1024
_INT32 = struct.Struct(">i")

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# cramjam's message when the caller-provided output buffer is full.
_OUTPUT_FULL = "failed to write whole buffer"


def compress(codec: int, data: Buffer, level: int | None = None) -> bytes:
    """Compress a batch's records section with ``codec``.

    ``level`` None is Kafka's default for the codec; otherwise the codec library's own level
    (for lz4, 0-2 is the fast compressor and 3-12 high compression).
    """
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        c = zlib.compressobj(_GZIP_LEVEL if level is None else level, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec == SNAPPY:
        return _xerial_compress(data)
    if codec == LZ4:
        lz = cramjam.lz4.Compressor(
            level=_LZ4_LEVEL if level is None else level, content_checksum=False, block_linked=False
        )
        lz.compress(data if type(data) is bytes else bytes(data))  # this API takes only bytes
        return bytes(lz.finish())
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=_ZSTD_LEVEL if level is None else level))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: Buffer, max_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE) -> bytes:
    """Decompress ``data``; ProtocolError when it is malformed or would exceed ``max_size`` bytes."""
    if codec == NONE:
        if len(data) > max_size:
            raise ProtocolError(f"records of {len(data)} bytes exceed {max_size}")
        return bytes(data)
    try:
        if codec == GZIP:
            return _gzip_decompress(data, max_size)
        if codec == SNAPPY:
            return _snappy_decompress(memoryview(data), max_size)
        if codec == LZ4:
            return _bounded(cramjam.lz4, data, _lz4_size_hint(data), max_size)
        if codec == ZSTD:
            return _bounded(cramjam.zstd, data, _zstd_size_hint(data), max_size)
    except ProtocolError:
        raise
    except Exception as e:  # cramjam.DecompressionError, zlib.error, ValueError, ...
        raise ProtocolError(f"{CODEC_NAMES[codec]} decompression failed: {e}") from e
    raise ProtocolError(f"unknown compression codec {codec}")


def _xerial_compress(data: Buffer) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE])
        parts.append(_INT32.pack(len(block)))
        parts.append(bytes(block))
    return b"".join(parts)


def _too_large(max_size: int) -> ProtocolError:
    return ProtocolError(f"decompressed records exceed {max_size} bytes")


def _gzip_decompress(data: Buffer, max_size: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest = bytes(data)
    while True:
        d = zlib.decompressobj(31)
        out = d.decompress(rest, max_size - total + 1)
        total += len(out)
        if total > max_size:
            raise _too_large(max_size)
        if not d.eof:
            raise ProtocolError("gzip stream is truncated")
        parts.append(out)
        rest = d.unused_data
        # Like Java's GZIPInputStream: read further members, ignore trailing non-gzip bytes.
        if not rest.startswith(b"\x1f\x8b"):
            return b"".join(parts)


def _snappy_decompress(view: memoryview, max_size: int) -> bytes:
    if view[:8] != _XERIAL_MAGIC:
        return _snappy_raw(view, max_size, max_size)
    parts: list[bytes] = []
    total = 0
    pos, end = 16, len(view)
    if end < 16:
        raise ProtocolError("snappy xerial header is truncated")
    while pos < end:
        if end - pos < 4:
            raise ProtocolError("snappy xerial block length is truncated")
        if view[pos : pos + 8] == _XERIAL_MAGIC:  # concatenated streams, as snappy-java reads them
            pos += 16
            continue
        (size,) = _INT32.unpack_from(view, pos)
        pos += 4
        if size < 0 or size > end - pos:
            raise ProtocolError(f"snappy xerial block of {size} bytes overruns the data")
        block = _snappy_raw(view[pos : pos + size], max_size - total, max_size)
        total += len(block)
        parts.append(block)
        pos += size
    return b"".join(parts)


def _snappy_raw(view: memoryview, budget: int, max_size: int) -> bytes:
    # The uncompressed length is the stream's leading varint: check it before decompressing.
    if cramjam.snappy.decompress_raw_len(view) > budget:
        raise _too_large(max_size)
    return bytes(cramjam.snappy.decompress_raw(view))


def _bounded(module: object, data: Buffer, hint: int | None, max_size: int) -> bytes:
    """Decompress into a caller-sized buffer, growing it 4x per retry up to max_size + 1 bytes."""
    if hint is not None and hint > max_size:
        raise _too_large(max_size)
    size = min(max_size + 1, 4 * len(data) + 64 * 1024 if hint is None else hint + 1)
    while True:
        out = bytearray(size)
        try:
            n = module.decompress_into(data, out)  # type: ignore[attr-defined]
        except cramjam.DecompressionError as e:
            if _OUTPUT_FULL not in str(e):
                raise
            if size > max_size:
                raise _too_large(max_size) from None
            size = min(max_size + 1, size * 4)
            continue
        if n > max_size:
            raise _too_large(max_size)
        del out[n:]
        return bytes(out)


def _lz4_size_hint(data: Buffer) -> int | None:
    """Content size from an LZ4 frame descriptor, if present; rejects linked-block frames."""
    if len(data) < 7 or bytes(data[:4]) != _LZ4_MAGIC:
        raise ProtocolError("not an LZ4 frame")
    flg = data[4]
    if flg >> 6 != 1:
        raise ProtocolError(f"unsupported LZ4 frame version {flg >> 6}")
    if not flg & 0x20:
        raise ProtocolError("LZ4 frames with dependent blocks are not supported")
    if flg & 0x08 and len(data) >= 14:
        return int.from_bytes(data[6:14], "little")
    return None


def _zstd_size_hint(data: Buffer) -> int | None:
    """Frame_Content_Size of the first zstd frame, if it is recorded in the frame header."""
    if len(data) < 6 or bytes(data[:4]) != _ZSTD_MAGIC:
        return None
    fhd = data[4]
    fcs_flag, single_segment, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    fcs_len = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if not fcs_len:
        return None
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    if len(data) < start + fcs_len:
        return None
    size = int.from_bytes(data[start : start + fcs_len], "little")
    return size + 256 if fcs_len == 2 else size
