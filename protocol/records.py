"""Kafka RecordBatch v2 (magic 2): the unit of produce, fetch and the log, as bytes.

Batch layout (big-endian; RECORD_BATCH_OVERHEAD = 61 bytes before the records):

    baseOffset int64 @0, batchLength int32 @8 (bytes after this field),
    partitionLeaderEpoch int32 @12, magic int8 @16, crc uint32 @17 (CRC-32C of
    attributes..end), attributes int16 @21, lastOffsetDelta int32 @23,
    baseTimestamp int64 @27, maxTimestamp int64 @35, producerId int64 @43,
    producerEpoch int16 @51, baseSequence int32 @53, recordsCount int32 @57

The fields before the CRC'd range (baseOffset, partitionLeaderEpoch) are what the broker
rewrites on append, so that costs no CRC work. The records section (compressed as a whole
when the codec is not none) holds, per record: length varint, attributes int8,
timestampDelta varlong, offsetDelta varint, key (varint length, -1 = null), value (same),
header count varint, headers (key: varint length + UTF-8, value: varint length, -1 = null).
Varints are zigzag-encoded like protobuf's sint32/sint64.

The hot path (validate_batch, iter_batches, mutators) touches only the header and runs the
CRC in C over a memoryview; decode_batch builds every record and is meant for internal topics,
tests and tools, not for the produce/fetch path; decode_batch_keys_values gives only each
record's (key, value), for replaying internal topics. Their per-record loops run in C
(protocol/_record_speedups.c) when it is built, else in Python (_decode_records).
"""

from __future__ import annotations

import enum
import importlib
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, NamedTuple, Protocol

from protocol import accel, checksum
from protocol.compression import DEFAULT_MAX_DECOMPRESSED_SIZE, compress, decompress
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.primitives import INT16, INT32, INT64, UINT32

# The records decoders in C (protocol/_record_speedups.c) when the extension is built; switched
# off with the message decoder (KAFKA_PY_NO_SPEEDUPS=1, or accel.ENABLED = False at run time).
_c: Any = None
try:
    _c = importlib.import_module("protocol._record_speedups")
except ImportError:
    pass

Buffer = bytes | bytearray | memoryview
WritableBuffer = bytearray | memoryview
Headers = list[tuple[str, bytes | None]]

# -- header layout -------------------------------------------------------------------------

BASE_OFFSET_OFFSET: Final = 0
BATCH_LENGTH_OFFSET: Final = 8
PARTITION_LEADER_EPOCH_OFFSET: Final = 12
MAGIC_OFFSET: Final = 16
CRC_OFFSET: Final = 17
ATTRIBUTES_OFFSET: Final = 21
LAST_OFFSET_DELTA_OFFSET: Final = 23
BASE_TIMESTAMP_OFFSET: Final = 27
MAX_TIMESTAMP_OFFSET: Final = 35
PRODUCER_ID_OFFSET: Final = 43
PRODUCER_EPOCH_OFFSET: Final = 51
BASE_SEQUENCE_OFFSET: Final = 53
RECORDS_COUNT_OFFSET: Final = 57
RECORDS_OFFSET: Final = 61
RECORD_BATCH_OVERHEAD: Final = 61
# baseOffset + batchLength: the bytes a batch has beyond its batchLength.
LOG_OVERHEAD: Final = 12
MIN_BATCH_LENGTH: Final = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD
MAGIC_V2: Final = 2

COMPRESSION_CODEC_MASK: Final = 0x07
TIMESTAMP_TYPE_MASK: Final = 0x08
TRANSACTIONAL_FLAG_MASK: Final = 0x10
CONTROL_FLAG_MASK: Final = 0x20
DELETE_HORIZON_FLAG_MASK: Final = 0x40
MAX_CODEC: Final = 4  # zstd

CREATE_TIME: Final = 0
LOG_APPEND_TIME: Final = 1
NO_TIMESTAMP: Final = -1
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
NO_PARTITION_LEADER_EPOCH: Final = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == RECORD_BATCH_OVERHEAD
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_VALUE = struct.Struct(">hi")


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        """CREATE_TIME (0) or LOG_APPEND_TIME (1)."""
        return (self.attributes & TIMESTAMP_TYPE_MASK) >> 3

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        """Set by compaction: base_timestamp then holds the delete horizon (ms)."""
        return bool(self.attributes & DELETE_HORIZON_FLAG_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies."""
        return self.batch_length + LOG_OVERHEAD


# -- header-level functions (the broker's hot path) ------------------------------------------


def parse_batch_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """The header of the batch at ``pos``; checks only length and magic, not the CRC."""
    if pos < 0 or len(buf) - pos < RECORD_BATCH_OVERHEAD:
        raise ProtocolError(f"record batch header at {pos} is truncated")
    header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC_V2:
        raise ProtocolError(f"unsupported record batch magic {header.magic}")
    if header.batch_length < MIN_BATCH_LENGTH:
        raise ProtocolError(
            f"record batch length {header.batch_length} is below the minimum {MIN_BATCH_LENGTH}"
        )
    return header


def validate_batch(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Check one whole batch as Kafka's ensureValid does, plus header sanity; no record parsing.

    Checks: complete in ``buf``, magic 2, CRC-32C, a known codec, recordsCount >= 0,
    lastOffsetDelta >= 0. Raises ProtocolError(CORRUPT_MESSAGE).
    """
    header = parse_batch_header(buf, pos)
    end = pos + header.batch_length + LOG_OVERHEAD
    if end > len(buf):
        raise ProtocolError(f"record batch at {pos} needs {header.size} bytes, {len(buf) - pos} present")
    crc = checksum.crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : end])
    if crc != header.crc:
        raise ProtocolError(f"record batch CRC mismatch (stored {header.crc:#010x}, computed {crc:#010x})")
    if header.attributes & COMPRESSION_CODEC_MASK > MAX_CODEC:
        raise ProtocolError(f"unknown compression codec {header.attributes & COMPRESSION_CODEC_MASK}")
    if header.records_count < 0:
        raise ProtocolError(f"invalid record count {header.records_count}")
    if header.last_offset_delta < 0:
        raise ProtocolError(f"invalid last offset delta {header.last_offset_delta}")
    return header


def check_client_batch(header: BatchHeader) -> None:
    """The extra checks Kafka applies to batches produced by clients (INVALID_RECORD).

    The offset range must match the record count (no gaps from clients), no control batches,
    and an idempotent producer's batch must carry a sequence number.
    """
    count = header.records_count
    if count <= 0 or header.last_offset_delta + 1 != count:
        raise KafkaError(
            ErrorCode.INVALID_RECORD,
            f"inconsistent batch: lastOffsetDelta {header.last_offset_delta}, {count} records",
        )
    if header.is_control:
        raise KafkaError(ErrorCode.INVALID_RECORD, "clients may not write control records")
    if header.has_producer_id and header.base_sequence < 0:
        raise KafkaError(ErrorCode.INVALID_RECORD, f"invalid sequence number {header.base_sequence}")


def iter_batches(
    buf: Buffer, *, strict: bool = False, validate: bool = False
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each batch of back-to-back batches (a records field, a segment).

    An incomplete trailing batch ends the iteration (fetch responses may end with one) unless
    ``strict``, which raises instead. A batch whose length or magic is impossible always
    raises. ``validate`` runs validate_batch (CRC and sanity) on each batch.
    """
    n = len(buf)
    pos = 0
    while pos < n:
        if n - pos < LOG_OVERHEAD:
            if strict:
                raise ProtocolError(f"{n - pos} trailing bytes at {pos} are not a record batch")
            return
        (length,) = INT32.unpack_from(buf, pos + BATCH_LENGTH_OFFSET)
        if length < MIN_BATCH_LENGTH:
            raise ProtocolError(
                f"record batch length {length} at {pos} is below the minimum {MIN_BATCH_LENGTH}"
            )
        end = pos + LOG_OVERHEAD + length
        if end > n:
            if strict:
                raise ProtocolError(f"record batch at {pos} needs {end - pos} bytes, {n - pos} present")
            return
        yield pos, validate_batch(buf, pos) if validate else parse_batch_header(buf, pos)
        pos = end


def set_base_offset(buf: WritableBuffer, pos: int, offset: int) -> None:
    """Assign offsets on append: baseOffset is outside the CRC, so nothing else changes."""
    INT64.pack_into(buf, pos + BASE_OFFSET_OFFSET, offset)


def set_partition_leader_epoch(buf: WritableBuffer, pos: int, epoch: int) -> None:
    """Stamp the leader epoch on append (outside the CRC)."""
    INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(buf: WritableBuffer, pos: int, timestamp: int) -> None:
    """For message.timestamp.type=LogAppendTime: set the type bit and maxTimestamp, redo the CRC.

    Readers then report ``timestamp`` for every record of the batch. The CRC is recomputed over
    whatever bytes are there, so validate the batch first.
    """
    (attributes,) = INT16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp)
    rewrite_crc(buf, pos)


def rewrite_crc(buf: WritableBuffer, pos: int) -> None:
    """Recompute the CRC of the batch at ``pos`` after changing CRC-covered header fields."""
    if pos < 0 or len(buf) - pos < RECORD_BATCH_OVERHEAD:
        raise ProtocolError(f"record batch header at {pos} is truncated")
    (length,) = INT32.unpack_from(buf, pos + BATCH_LENGTH_OFFSET)
    end = pos + LOG_OVERHEAD + length
    if length < MIN_BATCH_LENGTH or end > len(buf):
        raise ProtocolError(f"record batch at {pos} with length {length} does not fit the buffer")
    UINT32.pack_into(buf, pos + CRC_OFFSET, checksum.crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : end]))


# -- records ------------------------------------------------------------------------------------


class Record(NamedTuple):
    """One decoded record with absolute offset and timestamp. ``attributes`` is the record's
    own (unused in v2, always 0 when written)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    attributes: int = 0


if _c is not None:
    _c.configure(ProtocolError, Record)


class RecordLike(Protocol):
    """What build_batch reads from a non-tuple record (a Record, a dataclass, ...)."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


def decode_batch(
    buf: Buffer,
    pos: int = 0,
    *,
    verify_crc: bool = True,
    max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
) -> tuple[BatchHeader, list[Record]]:
    """Decode the batch at ``pos`` with all its records (decompressing when needed).

    Offsets are baseOffset + offsetDelta; timestamps baseTimestamp + timestampDelta, or
    maxTimestamp for LogAppendTime batches, as Kafka's readers report them. A negative key,
    value or header value length means null, as in Kafka. ProtocolError on malformed data.
    """
    header, data = _records_section(buf, pos, verify_crc, max_decompressed_size)
    if data is None:  # Kafka reads nothing from a batch that declares no records
        return header, []
    log_append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
    decode = _c.decode_records if _c is not None and accel.ENABLED else _decode_records
    return header, decode(data, header.records_count, header.base_offset, header.base_timestamp, log_append_time)


def decode_batch_keys_values(
    buf: Buffer,
    pos: int = 0,
    *,
    verify_crc: bool = True,
    max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
) -> tuple[BatchHeader, list[tuple[bytes | None, bytes | None]]]:
    """decode_batch giving each record as (key, value) only: what replaying an internal topic
    needs. The records are checked exactly as decode_batch checks them (the same inputs raise),
    but their offsets, timestamps and headers are not built."""
    header, data = _records_section(buf, pos, verify_crc, max_decompressed_size)
    if data is None:
        return header, []
    decode = _c.keys_values if _c is not None and accel.ENABLED else _keys_values
    return header, decode(data, header.records_count)


def _records_section(
    buf: Buffer, pos: int, verify_crc: bool, max_decompressed_size: int
) -> tuple[BatchHeader, bytes | None]:
    """The header of the batch at ``pos`` and its records section, decompressed (None: no records)."""
    if verify_crc:
        header = validate_batch(buf, pos)
    else:
        header = parse_batch_header(buf, pos)
        if pos + header.size > len(buf):
            raise ProtocolError(f"record batch at {pos} needs {header.size} bytes, {len(buf) - pos} present")
    count = header.records_count
    if count < 0:
        raise ProtocolError(f"invalid record count {count}")
    if count == 0:
        return header, None
    section = memoryview(buf)[pos + RECORDS_OFFSET : pos + header.size]
    codec = header.attributes & COMPRESSION_CODEC_MASK
    return header, decompress(codec, section, max_decompressed_size) if codec else bytes(section)


def _zigzag_multibyte(data: bytes, pos: int, max_shift: int, mask: int, what: str) -> tuple[int, int]:
    value = data[pos] & 0x7F
    shift = 7
    while True:
        pos += 1
        b = data[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            value &= mask
            return (value >> 1) ^ -(value & 1), pos + 1
        shift += 7
        if shift > max_shift:
            raise ProtocolError(what)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """Zigzag varint of at most 5 bytes, truncated to 32 bits like Java's readVarint."""
    b = data[pos]
    if b < 0x80:  # the common single-byte case stays inline
        return (b >> 1) ^ -(b & 1), pos + 1
    return _zigzag_multibyte(data, pos, 28, 0xFFFFFFFF, "varint is longer than 5 bytes")


def _varlong(data: bytes, pos: int) -> tuple[int, int]:
    """Zigzag varlong of at most 10 bytes, truncated to 64 bits like Java's readVarlong."""
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    return _zigzag_multibyte(data, pos, 63, 0xFFFFFFFFFFFFFFFF, "varlong is longer than 10 bytes")


def _nullable_bytes(data: bytes, p: int, record_end: int, what: str) -> tuple[bytes | None, int]:
    """A varint-length byte string of a record (negative length: null)."""
    size, p = _varint(data, p)
    if size < 0:
        return None, p
    if p + size > record_end:
        raise ProtocolError(f"record {what} of {size} bytes overruns its record")
    return data[p : p + size], p + size


def _decode_records(
    data: bytes, count: int, base_offset: int, base_timestamp: int, log_append_time: int | None
) -> list[Record]:
    """The records of a (decompressed) records section; protocol/_record_speedups.c mirrors it."""
    try:
        return _decode_records_unchecked(data, count, base_offset, base_timestamp, log_append_time)
    except IndexError:
        raise ProtocolError("record batch ends inside a record") from None


def _keys_values(data: bytes, count: int) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of each record of a records section, checked as _decode_records checks them."""
    return [(r.key, r.value) for r in _decode_records(data, count, 0, 0, None)]


def _decode_records_unchecked(
    data: bytes, count: int, base_offset: int, base_timestamp: int, log_append_time: int | None
) -> list[Record]:
    varint, varlong = _varint, _varlong
    new = tuple.__new__  # Record(...) without the Python-level NamedTuple __new__ frame
    records: list[Record] = []
    append = records.append
    end = len(data)
    p = 0
    for _ in range(count):
        length, p = varint(data, p)
        record_end = p + length
        if length < 1 or record_end > end:
            raise ProtocolError(f"record length {length} does not fit the batch")
        attributes = data[p]
        timestamp_delta, p = varlong(data, p + 1)
        offset_delta, p = varint(data, p)
        key, p = _nullable_bytes(data, p, record_end, "key")
        value, p = _nullable_bytes(data, p, record_end, "value")
        n_headers, p = varint(data, p)
        if n_headers < 0 or n_headers > record_end - p:
            raise ProtocolError(f"invalid record header count {n_headers}")
        headers: Headers = []
        for _ in range(n_headers):
            size, p = varint(data, p)
            if size < 0 or p + size > record_end:
                raise ProtocolError(f"invalid record header key length {size}")
            # surrogateescape: never fails, and re-encoding gives back the same bytes.
            header_key = data[p : p + size].decode("utf-8", "surrogateescape")
            p += size
            size, p = varint(data, p)
            if size < 0:
                header_value = None
            elif p + size > record_end:
                raise ProtocolError(f"record header value of {size} bytes overruns its record")
            else:
                header_value = data[p : p + size]
                p += size
            headers.append((header_key, header_value))
        if p != record_end:
            raise ProtocolError(f"record declares {length} bytes but holds {length + p - record_end}")
        timestamp = base_timestamp + timestamp_delta if log_append_time is None else log_append_time
        append(new(Record, (base_offset + offset_delta, timestamp, key, value, headers, attributes)))
    if p != end:
        raise ProtocolError(f"{end - p} bytes remain after the batch's {count} records")
    return records


_ONE_BYTE_VARINTS = [bytes((z,)) for z in range(0x80)]


def _zigzag(n: int) -> bytes | bytearray:
    z = (n << 1) ^ (n >> 63)
    if z < 0x80:
        return _ONE_BYTE_VARINTS[z]
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return out


def _record_fields(record: Any) -> tuple[Any, Any, Any, int | None]:
    if type(record) is tuple:
        n = len(record)
        if not 2 <= n <= 4:
            raise ValueError("a record tuple is (key, value[, headers[, timestamp]])")
        return record[0], record[1], record[2] if n > 2 else (), record[3] if n > 3 else None
    return (
        record.key,
        record.value,
        getattr(record, "headers", None) or (),
        getattr(record, "timestamp", None),
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def build_batch(
    records: Iterable[RecordLike | tuple[Any, ...]],
    *,
    base_offset: int = 0,
    compression: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    timestamp_type: int = CREATE_TIME,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
    compression_level: int | None = None,
) -> bytes:
    """Encode one batch.

    Each record is either a tuple ``(key, value[, headers[, timestamp]])`` or an object with
    ``.key`` and ``.value`` and optionally ``.headers`` and ``.timestamp`` (a Record works;
    its offset is ignored). Keys and values are bytes-like or None; headers are
    ``(str, bytes | None)`` pairs. A None timestamp is the wall clock (ms).

    Offset deltas are 0, 1, 2, ... unless ``offset_deltas`` gives them (strictly increasing,
    for compacted batches with gaps). ``base_timestamp`` defaults to the first record's
    timestamp and ``max_timestamp`` to the largest, as Kafka's builder does (-1 when empty).
    ``last_offset_delta`` may be raised above the last record's delta (compaction keeps an
    empty batch to remember the producer state of the offsets it covered).
    """
    items = [_record_fields(r) for r in records]
    count = len(items)
    if offset_deltas is None:
        deltas: Sequence[int] = range(count)
    else:
        deltas = offset_deltas
        if len(deltas) != count:
            raise ValueError(f"{len(deltas)} offset deltas for {count} records")
        if any(b <= a for a, b in zip([-1, *deltas], deltas)):
            raise ValueError("offset deltas must be non-negative and strictly increasing")
        if count and deltas[-1] > 0x7FFFFFFF:
            raise ValueError(f"offset delta {deltas[-1]} does not fit an int32")
    timestamps: list[int] = [ts for _, _, _, ts in items if ts is not None]
    if len(timestamps) < count:
        now = _now_ms()
        timestamps = [now if ts is None else ts for _, _, _, ts in items]
    if base_timestamp is None:
        base_timestamp = timestamps[0] if timestamps else NO_TIMESTAMP
    if max_timestamp is None:
        max_timestamp = max(timestamps) if timestamps else NO_TIMESTAMP
    last_delta = deltas[-1] if count else 0
    if last_offset_delta is not None:
        if last_offset_delta < last_delta:
            raise ValueError(f"last_offset_delta {last_offset_delta} is below the last record's {last_delta}")
        last_delta = last_offset_delta

    zigzag = _zigzag
    body = bytearray()
    for (key, value, headers, _), timestamp, delta in zip(items, timestamps, deltas):
        rec = bytearray(b"\x00")  # record attributes: unused in v2
        rec += zigzag(timestamp - base_timestamp)
        rec += zigzag(delta)
        if key is None:
            rec += b"\x01"  # zigzag(-1)
        else:
            rec += zigzag(len(key))
            rec += key
        if value is None:
            rec += b"\x01"
        else:
            rec += zigzag(len(value))
            rec += value
        rec += zigzag(len(headers))
        for header_key, header_value in headers:
            encoded = header_key.encode("utf-8", "surrogateescape")
            rec += zigzag(len(encoded))
            rec += encoded
            if header_value is None:
                rec += b"\x01"
            else:
                rec += zigzag(len(header_value))
                rec += header_value
        body += zigzag(len(rec))
        body += rec

    if compression:
        payload: bytes | bytearray = compress(compression, body, compression_level)
    else:
        payload = body
    attributes = (
        compression
        | (timestamp_type & 1) << 3
        | (TRANSACTIONAL_FLAG_MASK if is_transactional else 0)
        | (CONTROL_FLAG_MASK if is_control else 0)
    )
    batch = bytearray(RECORD_BATCH_OVERHEAD)
    batch += payload
    _HEADER.pack_into(
        batch, 0,
        base_offset, len(batch) - LOG_OVERHEAD, partition_leader_epoch, MAGIC_V2, 0, attributes,
        last_delta, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, count,
    )  # fmt: skip
    UINT32.pack_into(batch, CRC_OFFSET, checksum.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


# -- control records (transaction markers) ---------------------------------------------------------


class ControlRecordType(enum.IntEnum):
    """The type in a control record's key (int16 version + int16 type)."""

    UNKNOWN = -1
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


def build_control_batch(
    kind: ControlRecordType | str,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    *,
    base_offset: int = 0,
    timestamp: int | None = None,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A transaction marker batch: one COMMIT or ABORT record, control + transactional bits set.

    Key: int16 version 0 + int16 type; value: int16 version 0 + int32 coordinatorEpoch.
    ``timestamp`` None is the wall clock.
    """
    marker = ControlRecordType[kind] if isinstance(kind, str) else ControlRecordType(kind)
    if marker not in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
        raise ValueError(f"{marker.name} is not a transaction marker")
    key = _CONTROL_KEY.pack(0, marker)
    value = _END_TXN_VALUE.pack(0, coordinator_epoch)
    return build_batch(
        [(key, value, (), _now_ms() if timestamp is None else timestamp)],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
        partition_leader_epoch=partition_leader_epoch,
    )


def parse_control_record_type(key: bytes | None) -> ControlRecordType:
    """The type in a control record key; UNKNOWN for types this code does not know."""
    if key is None or len(key) < _CONTROL_KEY.size:
        raise ProtocolError("control record key is shorter than 4 bytes")
    version, type_id = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise ProtocolError(f"invalid control record key version {version}")
    try:
        return ControlRecordType(type_id)
    except ValueError:
        return ControlRecordType.UNKNOWN


def parse_control_record(record: Record) -> tuple[ControlRecordType, int]:
    """(type, coordinator epoch) of a control record; the epoch is -1 unless COMMIT/ABORT."""
    return parse_control_key_value(record.key, record.value)


def parse_control_key_value(key: bytes | None, value: bytes | None) -> tuple[ControlRecordType, int]:
    """parse_control_record of a control record's key and value."""
    marker = parse_control_record_type(key)
    if marker not in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
        return marker, -1
    if value is None or len(value) < _END_TXN_VALUE.size:
        raise ProtocolError("transaction marker value is shorter than 6 bytes")
    version, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
    if version < 0:
        raise ProtocolError(f"invalid transaction marker version {version}")
    return marker, coordinator_epoch
