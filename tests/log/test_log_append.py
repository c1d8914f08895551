"""Appends (validation, offsets, epochs, LogAppendTime, rolls) and reads (slices, bounds, lookups)."""

from __future__ import annotations

import os

import pytest

from broker.log import AppendOrigin, LogConfig
from protocol.errors import ErrorCode, KafkaError
from protocol.records import (
    build_batch,
    build_control_batch,
    decode_batch,
    iter_batches,
    parse_batch_header,
    validate_batch,
)
from tests.log.log_helpers import T0, Clock, batch, batch_ranges, new_log, offsets_of, read_all, small_config


def codes(fn) -> ErrorCode:  # type: ignore[no-untyped-def]
    with pytest.raises(KafkaError) as e:
        fn()
    return e.value.code


def test_offsets_assigned_and_bytes_stored_as_on_the_wire(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    r1 = log.append(batch(3))
    r2 = log.append(batch(2), leader_epoch=5)
    assert (r1.first_offset, r1.last_offset, r1.log_append_time, r1.log_start_offset) == (0, 2, -1, 0)
    assert (r2.first_offset, r2.last_offset, r2.record_count) == (3, 4, 2)
    assert log.log_end_offset == 5
    data = read_all(log)
    assert batch_ranges(data) == [(0, 2), (3, 4)]
    headers = [validate_batch(data, pos) for pos, _ in iter_batches(data)]  # CRC still valid
    assert [h.partition_leader_epoch for h in headers] == [0, 5]
    assert offsets_of(data) == [0, 1, 2, 3, 4]
    # The segment file holds exactly these bytes.
    with open(os.path.join(log.dir, "00000000000000000000.log"), "rb") as f:
        assert f.read() == data
    assert log.epoch_cache.entries == [(0, 0), (5, 3)]
    assert open(os.path.join(log.dir, "leader-epoch-checkpoint")).read() == "0\n2\n0 0\n5 3\n"


def test_input_is_not_modified(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    log.append(batch(2))
    buf = bytearray(batch(1))
    original = bytes(buf)
    log.append(memoryview(buf))
    assert buf == original
    assert parse_batch_header(log.read(2, 100).records.read()).base_offset == 2


def test_log_append_time(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(message_timestamp_type="LogAppendTime"))
    result = log.append(batch(2, ts=5))
    assert result.log_append_time == clock.now
    header, records = decode_batch(log.read(0, 10_000).records.read())
    assert header.timestamp_type == 1 and header.max_timestamp == clock.now
    assert [r.timestamp for r in records] == [clock.now, clock.now]


def test_validation_errors_leave_the_log_untouched(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(max_message_bytes=500))
    log.append(batch(1))
    good = batch(1)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    big = batch(1, size=600)
    assert codes(lambda: log.append(bytes(corrupt))) is ErrorCode.CORRUPT_MESSAGE
    assert codes(lambda: log.append(good + b"\x00\x01")) is ErrorCode.CORRUPT_MESSAGE  # trailing garbage
    assert codes(lambda: log.append(good[:-5])) is ErrorCode.CORRUPT_MESSAGE  # truncated
    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    assert codes(lambda: log.append(bytes(wrong_magic))) is ErrorCode.CORRUPT_MESSAGE
    assert codes(lambda: log.append(big)) is ErrorCode.MESSAGE_TOO_LARGE
    assert codes(lambda: log.append(good + good)) is ErrorCode.INVALID_RECORD  # clients send one batch
    assert codes(lambda: log.append(batch(1, base_offset=7))) is ErrorCode.INVALID_RECORD
    assert (
        codes(lambda: log.append(build_batch([(b"k", b"v")], offset_deltas=[3]))) is ErrorCode.INVALID_RECORD
    )
    marker = build_control_batch("COMMIT", 1, 0, 0)
    assert codes(lambda: log.append(marker)) is ErrorCode.INVALID_RECORD
    assert codes(lambda: log.append(batch(1, producer_id=5, producer_epoch=0))) is ErrorCode.INVALID_RECORD
    assert log.log_end_offset == 1
    assert batch_ranges(read_all(log)) == [(0, 0)]


def test_record_list_too_large_for_a_segment(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=300))
    assert codes(lambda: log.append(batch(1, size=400))) is ErrorCode.RECORD_LIST_TOO_LARGE


def test_timestamp_bounds(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(message_timestamp_before_max_ms=1000))
    assert codes(lambda: log.append(batch(1, ts=clock.now + 3600_001))) is ErrorCode.INVALID_TIMESTAMP
    assert codes(lambda: log.append(batch(1, ts=clock.now - 1001))) is ErrorCode.INVALID_TIMESTAMP
    lat = new_log(tmp_path / "lat", clock, small_config(message_timestamp_type="LogAppendTime"))
    assert codes(lambda: lat.append(batch(1, timestamp_type=1))) is ErrorCode.INVALID_TIMESTAMP
    log.append(batch(1, ts=clock.now + 3600_000))
    log.append(batch(1, ts=clock.now - 1000))
    assert log.log_end_offset == 2


def test_compacted_topic_requires_keys(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(cleanup_policy=("compact",)))
    assert codes(lambda: log.append(batch(2, keys=[b"a", None]))) is ErrorCode.INVALID_RECORD
    log.append(batch(2, keys=[b"a", b"b"]))


def test_coordinator_origin_allows_markers_and_several_batches(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    records = batch(2, producer_id=9, producer_epoch=0, base_sequence=0, is_transactional=True)
    marker = build_control_batch("COMMIT", 9, 0, 0, base_offset=55)
    result = log.append(records + marker, origin=AppendOrigin.COORDINATOR)
    assert (result.first_offset, result.last_offset) == (0, 2)
    assert batch_ranges(read_all(log)) == [(0, 1), (2, 2)]


def test_a_batch_the_broker_built_is_appended_as_append_would(tmp_path, clock: Clock) -> None:
    """append_built takes the header from its caller instead of parsing and CRC-checking the batch;
    the log and the result are those of a plain append."""
    built, plain = new_log(tmp_path / "built", clock), new_log(tmp_path / "plain", clock)
    built.leader_epoch = plain.leader_epoch = 3
    for n in (1, 3, 2):
        data = build_batch([(b"k%d" % i, b"v") for i in range(n)], base_timestamp=clock.now)
        expected = plain.append(data, origin=AppendOrigin.COORDINATOR)
        assert built.append_built(bytearray(data), parse_batch_header(data, 0)) == expected
    assert read_all(built) == read_all(plain)
    for pos, _ in iter_batches(read_all(built)):
        validate_batch(read_all(built), pos)  # offsets and epoch stamped outside the CRC
    too_large = build_batch([(b"k", b"v" * 200)], base_timestamp=clock.now)
    tight = new_log(tmp_path / "tight", clock, small_config(max_message_bytes=100))
    with pytest.raises(KafkaError) as exc:
        tight.append_built(bytearray(too_large), parse_batch_header(too_large, 0))
    assert exc.value.code is ErrorCode.MESSAGE_TOO_LARGE and tight.log_end_offset == 0


def test_empty_append(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    assert log.append(b"").first_offset == -1
    assert log.log_end_offset == 0


def test_append_as_follower_keeps_offsets(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    log.append_as_follower(build_batch([(b"a", b"1"), (b"b", b"2")], base_offset=0, offset_deltas=[0, 3]))
    log.append_as_follower(build_batch([(b"c", b"3")], base_offset=10, partition_leader_epoch=2))
    assert log.log_end_offset == 11
    assert offsets_of(read_all(log)) == [0, 3, 10]
    assert (
        codes(lambda: log.append_as_follower(build_batch([(b"d", b"4")], base_offset=10)))
        is ErrorCode.INVALID_RECORD
    )
    assert log.epoch_cache.latest_epoch == 2


def test_roll_by_size_time_and_full_index(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=1000, segment_ms=60_000))
    for _ in range(20):
        log.append(batch(1, size=100))
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 2 and all(s.size <= 1000 for s in log.segments)
    # Time: segment.ms measured from the first batch's timestamp to the new batch's.
    log2 = new_log(tmp_path / "b", clock, small_config(segment_ms=60_000))
    log2.append(batch(1, ts=clock.now))
    log2.append(batch(1, ts=clock.now + 60_000))
    assert len(log2.segments) == 1
    log2.append(batch(1, ts=clock.now + 60_001))
    assert [s.base_offset for s in log2.segments] == [0, 2]
    # A full offset index rolls too.
    log3 = new_log(tmp_path / "c", clock, small_config(segment_index_bytes=36, index_interval_bytes=1))
    for _ in range(6):
        log3.append(batch(1))
    assert len(log3.segments) >= 2
    # 36 bytes: 4 offset entries, 3 time entries of which Kafka keeps one free for the roll.
    assert all(s.time_index.entries <= 3 for s in log3.segments)
    assert offsets_of(read_all(log3)) == list(range(6))


def test_roll_writes_kafka_file_names(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=500))
    for _ in range(8):
        log.append(batch(1, size=150))
    names = sorted(os.listdir(log.dir))
    bases = [s.base_offset for s in log.segments]
    for base in bases:
        for suffix in (".log", ".index", ".timeindex"):
            assert f"{base:020d}{suffix}" in names


def test_read_bounds_and_slices(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=100_000, index_interval_bytes=100))
    for _ in range(50):
        log.append(batch(2, size=30))  # offsets 0..99, each batch ~ 150 bytes
    size = parse_batch_header(batch(2, size=30)).size
    # From the middle of a batch: the whole batch is returned.
    info = log.read(41, 3 * size)
    assert batch_ranges(info.records.read()) == [(40, 41), (42, 43), (44, 45)]
    assert info.records.length == 3 * size
    assert os.pread(info.records.fileno(), 8, info.records.position) == (40).to_bytes(8, "big")
    # max_bytes smaller than one batch: still one batch (min_one_message), or nothing.
    assert batch_ranges(log.read(10, 1).records.read()) == [(10, 11)]
    assert log.read(10, 1, min_one_message=False).records.length == 0
    # Upper bound (high watermark / last stable offset): batches reaching it are not returned.
    assert batch_ranges(log.read(90, 10_000, upper_bound=95).records.read()) == [(90, 91), (92, 93)]
    assert log.read(94, 10_000, upper_bound=95).records.length == 0
    # The log end offset is a valid fetch position returning nothing; beyond is out of range.
    assert log.read(100, 10_000).records.length == 0
    assert codes(lambda: log.read(101, 100)) is ErrorCode.OFFSET_OUT_OF_RANGE
    assert codes(lambda: log.read(-1, 100)) is ErrorCode.OFFSET_OUT_OF_RANGE
    assert log.read_bytes(0, 10**9) == read_all(log)


def test_a_slice_walks_its_batch_headers_and_cuts_whole_batches(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=100_000))
    for _ in range(10):
        log.append(batch(2, size=30))
    info = log.read(4, 4 * parse_batch_header(batch(2, size=30)).size)
    data = info.records.read()
    walked = list(info.records.batches())
    assert walked == list(iter_batches(data))  # positions within the slice, headers as parsed from bytes
    assert [h.base_offset for _, h in walked] == [4, 6, 8, 10]
    (start, _), (end, _) = walked[1], walked[3]
    piece = info.records.sub(start, end)
    assert batch_ranges(piece.read()) == [(6, 7), (8, 9)] and piece.read() == data[start:end]
    assert info.records.sub(0, info.records.length) is info.records
    assert list(log.read(20, 100).records.batches()) == []  # the log end: an empty slice


def test_read_across_segments_returns_one_segment(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=600))
    for _ in range(20):
        log.append(batch(1, size=100))
    seg1 = log.segments[1]
    data = log.read(seg1.base_offset - 1, 10**6).records.read()
    ranges = batch_ranges(data)
    assert ranges[0][0] == seg1.base_offset - 1 and ranges[-1][1] == seg1.base_offset - 1
    assert offsets_of(read_all(log)) == list(range(20))


def test_timestamp_lookups(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=800, index_interval_bytes=50))
    for i in range(30):
        log.append(batch(2, ts=T0 + 10 * i))  # both records of batch i at T0 + 10 i
    log.append(
        build_batch([(b"x", b"1", (), T0 + 5), (b"y", b"2", (), T0 + 1000), (b"z", b"3", (), T0 + 1000)])
    )
    found = log.offset_for_timestamp(T0 + 95)
    assert found is not None and (found.timestamp, found.offset, found.leader_epoch) == (T0 + 100, 20, 0)
    assert log.offset_for_timestamp(T0) is not None and log.offset_for_timestamp(T0).offset == 0  # type: ignore[union-attr]
    found = log.offset_for_timestamp(T0 + 291)
    assert found is not None and (found.timestamp, found.offset) == (T0 + 1000, 61)
    assert log.offset_for_timestamp(T0 + 1001) is None
    top = log.max_timestamp_and_offset()
    assert top is not None and (top.timestamp, top.offset) == (T0 + 1000, 61)


def test_max_timestamp_of_empty_log(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    assert log.max_timestamp_and_offset() is None
    assert log.offset_for_timestamp(0) is None


def test_update_config_takes_effect(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=100_000))
    log.append(batch(1))
    log.update_config(small_config(segment_bytes=100_000, max_message_bytes=50))
    assert codes(lambda: log.append(batch(1))) is ErrorCode.MESSAGE_TOO_LARGE
    log.update_config(LogConfig(segment_bytes=100_000, message_timestamp_type="LogAppendTime"))
    assert log.append(batch(1)).log_append_time == clock.now


def test_follower_append_beyond_the_relative_offset_range_rolls(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    far = (1 << 31) + 10
    log.append_as_follower(build_batch([(b"a", b"1")], base_offset=far))
    assert [s.base_offset for s in log.segments] == [far]
    log.append_as_follower(build_batch([(b"b", b"2")], base_offset=2 * far))
    assert [s.base_offset for s in log.segments] == [far, 2 * far]
    assert offsets_of(read_all(log)) == [far, 2 * far]


def test_slices_work_with_sendfile(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    for _ in range(5):
        log.append(batch(3))
    piece = log.read(4, 500).records
    out = os.open(str(tmp_path / "out.bin"), os.O_RDWR | os.O_CREAT)
    try:
        sent = 0
        while sent < piece.length:
            sent += os.sendfile(out, piece.fileno(), piece.position + sent, piece.length - sent)
        assert os.pread(out, piece.length, 0) == piece.read()
    finally:
        os.close(out)
