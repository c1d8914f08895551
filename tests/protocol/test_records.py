"""protocol.records: RecordBatch v2 round trips, header checks, mutators, control batches,
and cross-checks against kafka-python's and aiokafka's independent implementations."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBuilder
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as KpBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder

from protocol import records as R
from protocol.compression import CODEC_NAMES
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.records import (
    BatchHeader,
    ControlRecordType,
    Record,
    build_batch,
    build_control_batch,
    check_client_batch,
    decode_batch,
    iter_batches,
    parse_batch_header,
    parse_control_record,
    parse_control_record_type,
    rewrite_crc,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)

CODECS = [0, 1, 2, 3, 4]
codec_ids = [CODEC_NAMES[c] for c in CODECS]

SAMPLE = [
    (b"key-1", b"value-1", [], 1_700_000_000_000),
    (None, b"no key", [("h1", b"v1"), ("h2", None)], 1_700_000_000_005),
    (b"tombstone", None, [("", b""), ("ünïcode", b"\x00\xff")], 1_699_999_999_990),
    (b"", b"", [], 1_700_000_000_001),
    (b"big", bytes(range(256)) * 100, [("k", b"x" * 300)], 1_700_000_000_002),
]


def _view(records: list[Record]) -> list[tuple[Any, ...]]:
    return [(r.key, r.value, r.headers, r.timestamp) for r in records]


def _reencode(batch: bytearray) -> bytearray:
    """Recompute the CRC after a test tampers with CRC-covered bytes."""
    rewrite_crc(batch, 0)
    return batch


# -- header layout and validation -----------------------------------------------------------------


def test_layout_constants() -> None:
    assert R.RECORD_BATCH_OVERHEAD == R.RECORDS_OFFSET == 61
    offsets = [
        R.BASE_OFFSET_OFFSET, R.BATCH_LENGTH_OFFSET, R.PARTITION_LEADER_EPOCH_OFFSET, R.MAGIC_OFFSET,
        R.CRC_OFFSET, R.ATTRIBUTES_OFFSET, R.LAST_OFFSET_DELTA_OFFSET, R.BASE_TIMESTAMP_OFFSET,
        R.MAX_TIMESTAMP_OFFSET, R.PRODUCER_ID_OFFSET, R.PRODUCER_EPOCH_OFFSET, R.BASE_SEQUENCE_OFFSET,
        R.RECORDS_COUNT_OFFSET,
    ]  # fmt: skip
    assert offsets == [0, 8, 12, 16, 17, 21, 23, 27, 35, 43, 51, 53, 57]


def test_header_fields_and_properties() -> None:
    batch = build_batch(
        SAMPLE,
        base_offset=100,
        compression=3,
        producer_id=42,
        producer_epoch=7,
        base_sequence=11,
        is_transactional=True,
        partition_leader_epoch=5,
    )
    h = validate_batch(batch)
    assert h == parse_batch_header(batch)
    assert (h.base_offset, h.partition_leader_epoch, h.magic) == (100, 5, 2)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (42, 7, 11)
    assert h.records_count == 5 and h.last_offset_delta == 4
    assert h.last_offset == 104 and h.next_offset == 105
    assert h.size == len(batch) == h.batch_length + 12
    assert h.compression == 3 and h.timestamp_type == 0
    assert h.is_transactional and not h.is_control and not h.has_delete_horizon and h.has_producer_id
    assert h.base_timestamp == SAMPLE[0][3]
    assert h.max_timestamp == max(r[3] for r in SAMPLE)
    assert h.crc == crc32c.crc32c(batch[21:])


@pytest.mark.parametrize("codec", CODECS, ids=codec_ids)
def test_round_trip(codec: int) -> None:
    batch = build_batch(SAMPLE, base_offset=7, compression=codec)
    h, recs = decode_batch(batch)
    assert h.compression == codec
    assert _view(recs) == SAMPLE
    assert [r.offset for r in recs] == [7, 8, 9, 10, 11]
    assert all(r.attributes == 0 for r in recs)
    # the same from a memoryview / bytearray, and at an offset inside a larger buffer
    assert decode_batch(memoryview(batch))[1] == recs
    assert decode_batch(bytearray(b"xyz" + batch + b"tail"), 3)[1] == recs


@pytest.mark.parametrize("codec", CODECS, ids=codec_ids)
def test_offset_delta_gaps(codec: int) -> None:
    batch = build_batch(SAMPLE[:3], base_offset=1000, compression=codec, offset_deltas=[0, 5, 9])
    h, recs = decode_batch(batch)
    assert [r.offset for r in recs] == [1000, 1005, 1009]
    assert h.last_offset_delta == 9 and h.records_count == 3
    with pytest.raises(ValueError):
        build_batch(SAMPLE[:3], offset_deltas=[0, 5, 5])
    with pytest.raises(ValueError):
        build_batch(SAMPLE[:3], offset_deltas=[0, 5])
    with pytest.raises(ValueError):
        build_batch(SAMPLE[:1], offset_deltas=[1 << 31])


def test_empty_batch() -> None:
    batch = build_batch([])
    h = validate_batch(batch)
    assert len(batch) == 61 and h.records_count == 0 and h.last_offset_delta == 0
    assert h.base_timestamp == h.max_timestamp == -1
    assert decode_batch(batch) == (h, [])
    # compaction keeps an empty batch covering the offsets it had
    kept = build_batch(
        [], base_offset=50, last_offset_delta=9, producer_id=3, producer_epoch=0, base_sequence=40
    )
    h = validate_batch(kept)
    assert (h.records_count, h.last_offset, h.base_sequence) == (0, 59, 40)
    with pytest.raises(ValueError):
        build_batch(SAMPLE[:2], last_offset_delta=0)


def test_empty_batch_with_bytes_after_header_reads_as_kafka_does() -> None:
    # Kafka returns no records for a batch declaring none, whatever follows the header
    batch = bytearray(build_batch([]))
    batch += b"junk"
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    _reencode(batch)
    assert decode_batch(batch)[1] == []


@pytest.mark.parametrize("codec", [0, 4])
def test_empty_values_and_many_records(codec: int) -> None:
    recs: list[tuple[Any, ...]] = [(None, None, [], 5)] * 1000 + [
        (b"k" * 70_000, b"v" * 200_000, [("x" * 200, b"y" * 200)], 6)
    ]
    h, out = decode_batch(build_batch(recs, compression=codec))
    assert h.records_count == 1001 and _view(out) == recs


def test_timestamps_relative_to_base() -> None:
    recs: list[tuple[Any, ...]] = [
        (b"a", b"1", [], 500),
        (b"b", b"2", [], 100),
        (b"c", b"3", [], -1),
        (b"d", b"4", [], 1 << 50),
    ]
    h, out = decode_batch(build_batch(recs))
    assert h.base_timestamp == 500 and h.max_timestamp == 1 << 50
    assert [r.timestamp for r in out] == [500, 100, -1, 1 << 50]
    h, out = decode_batch(build_batch(recs, base_timestamp=0, max_timestamp=7))
    assert (h.base_timestamp, h.max_timestamp) == (0, 7)
    assert [r.timestamp for r in out] == [500, 100, -1, 1 << 50]


def test_missing_timestamps_use_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R, "_now_ms", lambda: 123_456)
    h, out = decode_batch(build_batch([(b"k", b"v"), (b"k", b"v", [], 100)]))
    assert [r.timestamp for r in out] == [123_456, 100]
    assert h.base_timestamp == 123_456


def test_record_input_forms() -> None:
    @dataclasses.dataclass
    class Msg:
        key: bytes | None
        value: bytes | None

    @dataclasses.dataclass
    class FullMsg:
        key: bytes | None
        value: bytes | None
        headers: list[tuple[str, bytes | None]]
        timestamp: int

    inputs: list[Any] = [
        (memoryview(b"k1"), bytearray(b"v1")),
        (b"k2", b"v2", [("h", b"x")]),
        (b"k3", b"v3", [], 77),
        Record(offset=999, timestamp=78, key=b"k4", value=None, headers=[("a", None)]),
        FullMsg(b"k5", b"v5", [("b", b"c")], 79),
        Msg(None, b"v6"),
    ]
    _, out = decode_batch(build_batch(inputs, base_timestamp=70))
    assert [(r.key, r.value, r.headers) for r in out] == [
        (b"k1", b"v1", []),
        (b"k2", b"v2", [("h", b"x")]),
        (b"k3", b"v3", []),
        (b"k4", None, [("a", None)]),
        (b"k5", b"v5", [("b", b"c")]),
        (None, b"v6", []),
    ]
    assert [r.offset for r in out] == list(range(6))
    assert [r.timestamp for r in out][2:5] == [77, 78, 79]
    with pytest.raises(ValueError):
        build_batch([(b"only key",)])


def test_header_keys_that_are_not_utf8_survive() -> None:
    raw = b"\xff\xfekey"
    key = raw.decode("utf-8", "surrogateescape")
    batch = build_batch([(None, b"v", [(key, b"x")], 1)])
    (rec,) = decode_batch(batch)[1]
    assert rec.headers[0][0].encode("utf-8", "surrogateescape") == raw
    assert raw in batch


def test_parse_header_errors() -> None:
    batch = build_batch(SAMPLE)
    with pytest.raises(ProtocolError) as info:
        parse_batch_header(batch[:60])
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(ProtocolError):
        parse_batch_header(batch, len(batch) - 10)
    with pytest.raises(ProtocolError):
        parse_batch_header(batch, -1)
    for magic in (0, 1, 3, -1):
        bad = bytearray(batch)
        struct.pack_into(">b", bad, 16, magic)
        with pytest.raises(ProtocolError, match="magic"):
            parse_batch_header(bad)
    bad = bytearray(batch)
    struct.pack_into(">i", bad, 8, 48)
    with pytest.raises(ProtocolError, match="length"):
        parse_batch_header(bad)


def test_validate_errors() -> None:
    batch = build_batch(SAMPLE, compression=1)
    with pytest.raises(ProtocolError, match="present"):
        validate_batch(batch[:-1])
    for pos in (17, 21, 30, 61, len(batch) - 1):  # the stored CRC, and CRC'd bytes
        bad = bytearray(batch)
        bad[pos] ^= 0x01
        with pytest.raises(ProtocolError, match="CRC"):
            validate_batch(bad)
    for pos in (0, 7, 12, 15):  # baseOffset and partitionLeaderEpoch are not covered
        ok = bytearray(batch)
        ok[pos] ^= 0x01
        validate_batch(ok)
    for field_offset, fmt, value, msg in [
        (21, ">h", 5, "codec"),
        (21, ">h", 7, "codec"),
        (57, ">i", -1, "count"),
        (23, ">i", -1, "delta"),
    ]:
        bad = bytearray(batch)
        struct.pack_into(fmt, bad, field_offset, value)
        with pytest.raises(ProtocolError, match=msg):
            validate_batch(_reencode(bad))
        with pytest.raises(ProtocolError):
            decode_batch(bad)


def test_check_client_batch() -> None:
    check_client_batch(validate_batch(build_batch(SAMPLE)))
    check_client_batch(validate_batch(build_batch(SAMPLE, producer_id=1, producer_epoch=0, base_sequence=0)))
    bad_batches = [
        build_batch([]),
        build_batch(SAMPLE[:2], offset_deltas=[0, 2]),
        build_batch(SAMPLE, producer_id=1, producer_epoch=0),  # idempotent without a sequence
        build_control_batch("COMMIT", 1, 0, 0, timestamp=1),
    ]
    for batch in bad_batches:
        with pytest.raises(KafkaError) as info:
            check_client_batch(validate_batch(batch))
        assert info.value.code == ErrorCode.INVALID_RECORD


# -- iteration over back-to-back batches --------------------------------------------------------------


def test_iter_batches() -> None:
    batches = [build_batch(SAMPLE[: i + 1], base_offset=10 * i, compression=i % 5) for i in range(5)]
    buf = b"".join(batches)
    got = list(iter_batches(buf))
    positions = [sum(map(len, batches[:i])) for i in range(5)]
    assert [p for p, _ in got] == positions
    assert [h.base_offset for _, h in got] == [0, 10, 20, 30, 40]
    assert list(iter_batches(buf, strict=True, validate=True)) == got
    assert list(iter_batches(memoryview(buf))) == got
    assert list(iter_batches(b"")) == []


def test_iter_batches_partial_tail() -> None:
    first, second = build_batch(SAMPLE[:2]), build_batch(SAMPLE[2:], base_offset=2)
    for cut in (1, 11, 12, 60, 61, len(second) - 1):
        buf = first + second[:cut]
        assert [p for p, _ in iter_batches(buf)] == [0]
        with pytest.raises(ProtocolError):
            list(iter_batches(buf, strict=True))


def test_iter_batches_corrupt() -> None:
    good = build_batch(SAMPLE)
    bad_length = bytearray(good)
    struct.pack_into(">i", bad_length, 8, 10)
    with pytest.raises(ProtocolError):
        list(iter_batches(good + bad_length))
    bad_magic = bytearray(good)
    bad_magic[16] = 1
    with pytest.raises(ProtocolError, match="magic"):
        list(iter_batches(good + bad_magic))
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    assert len(list(iter_batches(good + bad_crc))) == 2  # headers only
    with pytest.raises(ProtocolError, match="CRC"):
        list(iter_batches(good + bad_crc, validate=True))


# -- in-place mutators ----------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=codec_ids)
def test_mutators_keep_the_batch_valid(codec: int) -> None:
    first = build_batch(SAMPLE[:1])
    batch = build_batch(SAMPLE, compression=codec)
    buf = bytearray(first + batch)
    view = memoryview(buf)
    pos = len(first)
    before = validate_batch(buf, pos)

    set_base_offset(view, pos, 5000)
    set_partition_leader_epoch(view, pos, 12)
    h = validate_batch(buf, pos)
    assert h._replace(base_offset=0, partition_leader_epoch=-1) == before
    assert (h.base_offset, h.partition_leader_epoch, h.crc) == (5000, 12, before.crc)

    set_log_append_time(buf, pos, 1_800_000_000_000)
    h = validate_batch(buf, pos)
    assert h.timestamp_type == 1 and h.max_timestamp == 1_800_000_000_000
    assert h.compression == codec and h.crc != before.crc
    assert h.base_timestamp == before.base_timestamp
    _, recs = decode_batch(buf, pos)
    assert [r.offset for r in recs] == list(range(5000, 5005))
    assert {r.timestamp for r in recs} == {1_800_000_000_000}
    assert [(r.key, r.value, r.headers) for r in recs] == [(k, v, hs) for k, v, hs, _ in SAMPLE]
    validate_batch(buf, 0)  # the neighbour is untouched
    # independent readers agree on LogAppendTime semantics
    aio = AioBatch(bytes(buf[pos:]))
    assert aio.validate_crc() and aio.timestamp_type == 1
    assert {r.timestamp for r in aio} == {1_800_000_000_000}


def test_set_log_append_time_keeps_other_flags() -> None:
    batch = bytearray(build_control_batch("ABORT", 9, 2, 4, timestamp=1))
    set_log_append_time(batch, 0, 99)
    h = validate_batch(batch)
    assert h.is_control and h.is_transactional and h.timestamp_type == 1 and h.max_timestamp == 99


def test_rewrite_crc() -> None:
    buf = bytearray(build_batch(SAMPLE))
    struct.pack_into(">q", buf, R.BASE_TIMESTAMP_OFFSET, 1)
    with pytest.raises(ProtocolError):
        validate_batch(buf)
    rewrite_crc(memoryview(buf), 0)
    assert validate_batch(buf).base_timestamp == 1
    with pytest.raises(ProtocolError):
        rewrite_crc(buf[:-1], 0)
    with pytest.raises(ProtocolError):
        rewrite_crc(buf[:30], 0)


# -- malformed records ------------------------------------------------------------------------------


def _batch_with_records_section(section: bytes, count: int) -> bytearray:
    """An uncompressed batch with a hand-written records section and a valid CRC."""
    batch = bytearray(build_batch([]))
    batch += section
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">i", batch, 57, count)
    struct.pack_into(">i", batch, 23, max(count - 1, 0))
    return _reencode(batch)


def _record(body: bytes) -> bytes:
    return bytes(R._zigzag(len(body))) + body


# attributes, timestampDelta 0, offsetDelta 0, key null, value "v", no headers
GOOD_BODY = b"\x00\x00\x00\x01\x02v\x00"


def test_hand_written_record_decodes() -> None:
    _, (rec,) = decode_batch(_batch_with_records_section(_record(GOOD_BODY), 1))
    assert (rec.key, rec.value, rec.headers) == (None, b"v", [])


@pytest.mark.parametrize(
    "section,count,msg",
    [
        (_record(GOOD_BODY), 2, "ends inside"),  # count larger than the records present
        (_record(GOOD_BODY) * 2, 1, "remain"),  # count smaller
        (_record(GOOD_BODY) + b"\x00", 1, "remain"),  # trailing byte
        (_record(GOOD_BODY)[:-1], 1, "length"),  # record cut short
        (b"\x00", 1, "length"),  # zero-length record
        (b"\x03", 1, "length"),  # negative record length
        (_record(b"\x00\x00\x00\x01\x14v\x00"), 1, "value"),  # value length overruns
        (_record(b"\x00\x00\x00\x14\x02v\x00"), 1, "key"),  # key length overruns
        (_record(b"\x00\x00\x00\x01\x02v\x01"), 1, "header count"),  # negative header count
        (_record(b"\x00\x00\x00\x01\x02v\x7e"), 1, "header count"),  # header count > remaining
        (_record(b"\x00\x00\x00\x01\x02v\x02\x03\x00"), 1, "header key"),  # negative header key length
        (_record(b"\x00\x00\x00\x01\x02v\x02\x02a\x02"), 1, "ends inside|header value"),
        (_record(b"\x00\x00\x00\x01\x02v\x00\x00"), 1, "declares"),  # unread bytes in the record
        (_record(b"\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), 1, "varlong"),  # 11-byte varlong
        (_record(b"\x00\x00\xff\xff\xff\xff\xff\x01"), 1, "varint"),  # 6-byte varint
        (b"\xff\xff\xff\xff\xff\xff", 1, "varint"),  # length varint too long
    ],
)
def test_malformed_records(section: bytes, count: int, msg: str) -> None:
    batch = _batch_with_records_section(section, count)
    validate_batch(batch)  # structurally fine: only decoding notices
    with pytest.raises(ProtocolError, match=msg):
        decode_batch(batch)


def test_varints_follow_java_semantics() -> None:
    # 5th byte bits beyond 32 are dropped, as Java's int arithmetic does
    assert R._varint(b"\xfe\xff\xff\xff\x0f", 0) == (2**31 - 1, 5)
    assert R._varint(b"\xff\xff\xff\xff\x0f", 0) == (-(2**31), 5)
    assert R._varint(b"\xff\xff\xff\xff\x7f", 0) == (-(2**31), 5)
    assert R._varlong(b"\xff" * 9 + b"\x01", 0) == (-(2**63), 10)
    for n in (0, -1, 1, 63, -64, 64, 300, -(2**31), 2**31 - 1):
        assert R._varint(bytes(R._zigzag(n)), 0)[0] == n
    for n in (2**40, -(2**63), 2**63 - 1):
        assert R._varlong(bytes(R._zigzag(n)), 0)[0] == n


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_corrupt_compressed_section(codec: int) -> None:
    batch = bytearray(build_batch(SAMPLE, compression=codec))
    del batch[-3:]  # cut the compressed stream short
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    with pytest.raises(ProtocolError):
        decode_batch(_reencode(batch))
    garbage = bytearray(build_batch(SAMPLE, compression=codec))
    garbage[61:] = b"\x01" * (len(garbage) - 61)
    with pytest.raises(ProtocolError):
        decode_batch(_reencode(garbage))


def test_decompression_bound_applies() -> None:
    batch = build_batch([(None, bytes(1_000_000), [], 1)], compression=4)
    assert len(decode_batch(batch)[1][0].value or b"") == 1_000_000
    with pytest.raises(ProtocolError, match="exceed"):
        decode_batch(batch, max_decompressed_size=500_000)


def test_decode_without_crc_check() -> None:
    batch = bytearray(build_batch(SAMPLE))
    batch[20] ^= 0xFF  # the stored CRC
    with pytest.raises(ProtocolError, match="CRC"):
        decode_batch(batch)
    assert _view(decode_batch(batch, verify_crc=False)[1]) == SAMPLE
    with pytest.raises(ProtocolError):
        decode_batch(batch[:-1], verify_crc=False)


# -- control batches --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["COMMIT", "ABORT", ControlRecordType.COMMIT, ControlRecordType.ABORT])
def test_control_batch(kind: Any) -> None:
    batch = build_control_batch(kind, 77, 3, 19, base_offset=500, timestamp=1234, partition_leader_epoch=2)
    h, (rec,) = decode_batch(batch)
    expected = ControlRecordType[kind] if isinstance(kind, str) else kind
    assert h.is_control and h.is_transactional and h.compression == 0 and h.timestamp_type == 0
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (77, 3, -1)
    assert (h.base_offset, h.partition_leader_epoch, h.records_count) == (500, 2, 1)
    assert (rec.offset, rec.timestamp, rec.headers) == (500, 1234, [])
    assert rec.key == struct.pack(">hh", 0, expected)
    assert rec.value == struct.pack(">hi", 0, 19)
    assert parse_control_record(rec) == (expected, 19)
    for batch_cls in (AioBatch, KpBatch):
        other = batch_cls(batch)
        assert other.validate_crc() and other.is_control_batch and other.is_transactional
        (crec,) = list(other)
        assert crec.key == rec.key and crec.value == rec.value
    (kp_rec,) = list(KpBatch(batch))
    assert kp_rec.type == expected


def test_control_batch_rejects_other_kinds() -> None:
    with pytest.raises(ValueError):
        build_control_batch(ControlRecordType.LEADER_CHANGE, 1, 0, 0)
    with pytest.raises(KeyError):
        build_control_batch("PREPARE", 1, 0, 0)


def test_parse_control_record_cases() -> None:
    def rec(key: bytes | None, value: bytes | None) -> Record:
        return Record(0, 0, key, value, [])

    assert parse_control_record(rec(b"\x00\x00\x00\x02", None)) == (ControlRecordType.LEADER_CHANGE, -1)
    assert parse_control_record(rec(b"\x00\x00\x00\x63", None)) == (ControlRecordType.UNKNOWN, -1)
    # newer key/value versions are read as version 0
    assert parse_control_record(rec(b"\x00\x01\x00\x01extra", b"\x00\x05\x00\x00\x00\x09more")) == (
        ControlRecordType.COMMIT,
        9,
    )
    assert parse_control_record_type(b"\x00\x00\x00\x00") == ControlRecordType.ABORT
    for key, value in [
        (None, b"\x00\x00\x00\x00\x00\x01"),
        (b"\x00\x00\x00", b"\x00\x00\x00\x00\x00\x01"),
        (b"\xff\xff\x00\x01", b"\x00\x00\x00\x00\x00\x01"),
        (b"\x00\x00\x00\x01", None),
        (b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00"),
        (b"\x00\x00\x00\x00", b"\xff\xff\x00\x00\x00\x01"),
    ]:
        with pytest.raises(ProtocolError):
            parse_control_record(rec(key, value))


# -- cross-checks with independent implementations ---------------------------------------------------


def _foreign_build(builder_cls: Any, records: list[tuple[Any, ...]], codec: int, **state: Any) -> bytes:
    builder = builder_cls(
        magic=2,
        compression_type=codec,
        is_transactional=state.get("is_transactional", False),
        producer_id=state.get("producer_id", -1),
        producer_epoch=state.get("producer_epoch", -1),
        base_sequence=state.get("base_sequence", -1),
        batch_size=10_000_000,
    )
    for i, (key, value, headers, ts) in enumerate(records):
        assert builder.append(i, timestamp=ts, key=key, value=value, headers=headers) is not None
    return bytes(builder.build())


# compressible enough that aiokafka keeps the compression instead of falling back to none
CROSS: list[tuple[Any, ...]] = [
    (b"key-%d" % i, b"value-%d " % i * 20, [("idx", b"%d" % i)], 1_700_000_000_000 + i) for i in range(50)
]
CROSS += SAMPLE


@pytest.mark.parametrize("codec", CODECS, ids=codec_ids)
def test_aiokafka_builds_we_decode(codec: int) -> None:
    batch = _foreign_build(AioBuilder, CROSS, codec, producer_id=9, producer_epoch=1, base_sequence=100)
    h, recs = decode_batch(batch)
    assert h.compression == codec
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (9, 1, 100)
    assert _view(recs) == CROSS
    assert [r.offset for r in recs] == list(range(len(CROSS)))


@pytest.mark.parametrize("codec", [0, 1], ids=["none", "gzip"])  # kafka-python has no other codec here
def test_kafka_python_builds_we_decode(codec: int) -> None:
    batch = _foreign_build(KpBuilder, CROSS, codec, is_transactional=True, producer_id=5, producer_epoch=0)
    h, recs = decode_batch(batch)
    assert h.compression == codec and h.is_transactional
    assert _view(recs) == CROSS


def _foreign_view(batch: Any) -> list[tuple[Any, ...]]:
    return [(r.key, r.value, list(r.headers), r.timestamp, r.offset) for r in batch]


@pytest.mark.parametrize("codec", CODECS, ids=codec_ids)
def test_we_build_aiokafka_decodes(codec: int) -> None:
    batch = build_batch(
        CROSS, base_offset=40, compression=codec, producer_id=3, producer_epoch=4, base_sequence=5
    )
    theirs = AioBatch(batch)
    assert theirs.validate_crc()
    assert (theirs.base_offset, theirs.compression_type, theirs.producer_id) == (40, codec, 3)
    assert (theirs.producer_epoch, theirs.base_sequence, theirs.next_offset) == (4, 5, 40 + len(CROSS))
    expected = [(k, v, hs, ts, 40 + i) for i, (k, v, hs, ts) in enumerate(CROSS)]
    assert _foreign_view(theirs) == expected


@pytest.mark.parametrize("codec", [0, 1], ids=["none", "gzip"])
def test_we_build_kafka_python_decodes(codec: int) -> None:
    batch = build_batch(CROSS, compression=codec, offset_deltas=[2 * i for i in range(len(CROSS))])
    theirs = KpBatch(batch)
    assert theirs.validate_crc()
    expected = [(k, v, hs, ts, 2 * i) for i, (k, v, hs, ts) in enumerate(CROSS)]
    assert _foreign_view(theirs) == expected


def test_byte_identical_to_kafka_python_uncompressed() -> None:
    ours = build_batch(CROSS, producer_id=5, producer_epoch=0, base_sequence=0)
    theirs = _foreign_build(KpBuilder, CROSS, 0, producer_id=5, producer_epoch=0, base_sequence=0)
    # kafka-python writes partitionLeaderEpoch 0 where the Java producer writes -1 (outside the CRC)
    assert parse_batch_header(theirs).partition_leader_epoch == 0
    mutable = bytearray(ours)
    set_partition_leader_epoch(mutable, 0, 0)
    assert mutable == theirs


# -- properties ---------------------------------------------------------------------------------------

_bytes_or_none = st.none() | st.binary(max_size=64)
_headers = st.lists(st.tuples(st.text(max_size=10), _bytes_or_none), max_size=3)
_record_st = st.tuples(_bytes_or_none, _bytes_or_none, _headers, st.integers(-(2**40), 2**40))


@settings(max_examples=150, deadline=None)
@given(
    recs=st.lists(_record_st, max_size=20),
    codec=st.sampled_from(CODECS),
    base_offset=st.integers(0, 2**62),
    gaps=st.lists(st.integers(1, 1000), min_size=20, max_size=20),
    use_gaps=st.booleans(),
)
def test_property_round_trip(
    recs: list[tuple[Any, ...]], codec: int, base_offset: int, gaps: list[int], use_gaps: bool
) -> None:
    deltas = [sum(gaps[: i + 1]) - gaps[0] for i in range(len(recs))] if use_gaps else None
    batch = build_batch(recs, base_offset=base_offset, compression=codec, offset_deltas=deltas)
    h = validate_batch(batch)
    assert list(iter_batches(batch + batch, strict=True, validate=True)) == [(0, h), (len(batch), h)]
    h2, out = decode_batch(batch)
    assert h2 == h and h.records_count == len(recs)
    assert _view(out) == recs
    expected_deltas = deltas if deltas is not None else list(range(len(recs)))
    assert [r.offset - base_offset for r in out] == expected_deltas
    if recs:
        assert h.max_timestamp == max(r[3] for r in recs)
        assert h.last_offset_delta == expected_deltas[-1]


@settings(max_examples=60, deadline=None)
@given(recs=st.lists(_record_st, min_size=1, max_size=10), codec=st.sampled_from(CODECS))
def test_property_aiokafka_agrees(recs: list[tuple[Any, ...]], codec: int) -> None:
    ours = build_batch(recs, compression=codec)
    expected = [(k, v, hs, ts, i) for i, (k, v, hs, ts) in enumerate(recs)]
    assert _foreign_view(AioBatch(ours)) == expected
    theirs = _foreign_build(AioBuilder, recs, codec)
    assert _view(decode_batch(theirs)[1]) == recs


def test_batch_header_is_a_plain_tuple() -> None:
    h = parse_batch_header(build_batch(SAMPLE))
    assert isinstance(h, tuple) and len(h) == 13 and BatchHeader._fields[0] == "base_offset"
