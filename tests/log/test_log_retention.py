"""Retention (time, size, log start offset), DeleteRecords, delayed deletion, truncation."""

from __future__ import annotations

import os

import pytest

from broker.log import Log
from protocol.errors import ErrorCode, KafkaError
from tests.log.log_helpers import Clock, batch, files, new_log, offsets_of, read_all, reopen, small_config


def segmented_log(tmp_path, clock: Clock, n: int = 30, **cfg: object) -> Log:
    config = small_config(segment_bytes=600, file_delete_delay_ms=1000, **cfg)
    log = new_log(tmp_path, clock, config)
    for i in range(n):
        log.append(batch(1, size=100, ts=clock.now + i * 1000))
    return log


def test_retention_ms_deletes_old_segments_by_largest_timestamp(tmp_path, clock: Clock) -> None:
    log = segmented_log(tmp_path, clock, retention_ms=10_000)
    segs = log.segments
    assert len(segs) > 3
    # Segment i's largest timestamp is T0 + (last offset) * 1000.
    clock.advance(segs[1].next_offset * 1000 - 1000 + 10_001)
    deleted = log.delete_old_segments()
    assert deleted == 2
    assert log.log_start_offset == segs[2].base_offset
    assert [s.base_offset for s in log.segments] == [s.base_offset for s in segs[2:]]
    assert offsets_of(read_all(log)) == list(range(segs[2].base_offset, 30))
    with pytest.raises(KafkaError) as e:
        log.read(0, 100)
    assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE


def test_retention_ms_can_take_the_active_segment_by_rolling(tmp_path, clock: Clock) -> None:
    log = segmented_log(tmp_path, clock, retention_ms=1000)
    clock.advance(10**9)
    log.delete_old_segments()
    assert len(log.segments) == 1
    assert log.segments[0].base_offset == 30 and log.segments[0].size == 0
    assert log.log_start_offset == 30 and log.log_end_offset == 30
    assert log.append(batch(1)).first_offset == 30
    # A second pass with only an empty active segment deletes nothing.
    clock.advance(10**9)
    assert log.delete_old_segments() == 0 or log.log_end_offset == 31


def test_retention_respects_high_watermark(tmp_path, clock: Clock) -> None:
    log = segmented_log(tmp_path, clock, retention_ms=1000)
    clock.advance(10**9)
    first_end = log.segments[1].base_offset
    assert log.delete_old_segments(high_watermark=first_end) == 1
    assert log.log_start_offset == first_end


def test_infinite_retention_and_compact_policy_keep_everything(tmp_path, clock: Clock) -> None:
    log = segmented_log(tmp_path, clock, retention_ms=-1)
    clock.advance(10**12)
    assert log.delete_old_segments() == 0
    log2 = segmented_log(tmp_path / "c", clock, retention_ms=1, cleanup_policy=("compact",))
    clock.advance(10**12)
    assert log2.delete_old_segments() == 0


def test_retention_bytes(tmp_path, clock: Clock) -> None:
    log = segmented_log(tmp_path, clock, retention_ms=-1, retention_bytes=1500)
    total = log.size
    log.delete_old_segments()
    assert log.size <= 1500 + log.segments[0].size
    assert log.size < total
    kept_size = log.size
    # Deleting one more segment would take the log under the limit: Kafka keeps it.
    assert kept_size - log.segments[0].size < 1500


def test_deleted_files_renamed_then_removed_after_delay(tmp_path, clock: Clock) -> None:
    log = segmented_log(tmp_path, clock, retention_ms=1000)
    clock.advance(10**9)
    old_base = log.segments[0].base_offset
    slice_before = log.read(0, 10_000).records  # a reader holding the first segment
    log.delete_old_segments()
    names = files(log)
    assert f"{old_base:020d}.log.deleted" in names
    assert f"{old_base:020d}.log" not in names
    clock.advance(999)
    log.delete_pending_files()
    assert f"{old_base:020d}.log.deleted" in files(log)
    clock.advance(1)
    log.delete_pending_files()
    assert not [n for n in files(log) if n.endswith(".deleted")]
    # The unlinked file is still readable through the slice handed out before.
    assert offsets_of(slice_before.read())[0] == 0


def test_delete_records_before(tmp_path, clock: Clock) -> None:
    log = segmented_log(tmp_path, clock)
    second = log.segments[1].base_offset
    assert log.delete_records_before(second + 1) == second + 1
    assert log.log_start_offset == second + 1
    assert log.segments[0].base_offset == second  # wholly-below segments go, the holding one stays
    with pytest.raises(KafkaError) as e:
        log.read(second, 100)
    assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
    # Reading at the new start returns the batch holding it.
    assert offsets_of(log.read(second + 1, 10).records.read()) == [second + 1]
    with pytest.raises(KafkaError) as e:
        log.delete_records_before(10**6)
    assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert log.delete_records_before(second) == second + 1  # never moves backwards
    assert log.delete_records_before(-1) == 30  # -1: up to the high watermark
    assert log.log_end_offset == 30
    reopened = reopen(log, clean=True)
    assert reopened.log_start_offset == 30


def test_truncate_to_and_fully(tmp_path, clock: Clock) -> None:
    log = segmented_log(tmp_path, clock)
    log.flush()
    mid = log.segments[2].base_offset + 1
    log.truncate_to(mid)
    assert log.log_end_offset == mid
    assert log.recovery_point == mid
    assert offsets_of(read_all(log)) == list(range(mid))
    assert log.append(batch(1)).first_offset == mid
    reopened = reopen(log, clean=False)
    assert offsets_of(read_all(reopened)) == list(range(mid + 1))
    reopened.truncate_fully_and_start_at(100)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (100, 100)
    assert reopened.append(batch(1)).first_offset == 100
    reopened.delete_pending_files(force=True)
    assert [n for n in files(reopened) if n.endswith(".log")] == [f"{100:020d}.log"]
    assert os.path.exists(os.path.join(reopened.dir, "leader-epoch-checkpoint"))
