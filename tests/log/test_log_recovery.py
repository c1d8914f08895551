"""Crash recovery: torn and corrupt tails, damaged indexes, interrupted rolls and swaps."""

from __future__ import annotations

import os
import struct

import pytest

from broker.log import Log
from broker.log.segment import segment_paths
from protocol.records import build_batch, iter_batches
from tests.log.log_helpers import (
    Clock,
    batch,
    batch_ranges,
    files,
    new_log,
    offsets_of,
    read_all,
    reopen,
    reopen_with_stats,
    small_config,
)


def filled_log(tmp_path, clock: Clock, n: int = 40, **cfg: object) -> Log:
    log = new_log(tmp_path, clock, small_config(segment_bytes=2000, index_interval_bytes=150, **cfg))
    for i in range(n):
        log.append(batch(1 + i % 3, size=60, ts=clock.now + i))
    return log


def snapshot(log: Log) -> dict[str, bytes]:
    out = {}
    for name in files(log):
        with open(os.path.join(log.dir, name), "rb") as f:
            out[name] = f.read()
    return out


def last_log_path(log: Log) -> str:
    return segment_paths(log.dir, log.segments[-1].base_offset)[0]


def test_clean_restart_keeps_everything_and_trims_nothing(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock)
    data, end = read_all(log), log.log_end_offset
    reopened, stats = reopen_with_stats(log, clean=True)
    assert stats.recovered_segments == 0 and stats.truncated_bytes == 0
    assert reopened.log_end_offset == end and reopened.recovery_point == end
    assert read_all(reopened) == data
    r = reopened.append(batch(1))
    assert r.first_offset == end


def test_unclean_restart_without_damage_rebuilds_identical_indexes(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock)
    log.close()  # close writes the final time index entries, like a rolled segment has
    before = snapshot(log)
    reopened, stats = reopen_with_stats(log, clean=False)
    assert stats.recovered_segments == len(reopened.segments)
    assert stats.truncated_bytes == 0
    reopened.close()
    assert snapshot(reopened) == before


def test_truncated_last_batch(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock)
    end = log.log_end_offset
    last = log.segments[-1]
    last_header = list(iter_batches(open(last.log_path, "rb").read()))[-1][1]
    os.truncate(last.log_path, last.size - 7)
    reopened, stats = reopen_with_stats(log, clean=False)
    assert stats.truncated_bytes == last_header.size - 7
    assert reopened.log_end_offset == end - last_header.records_count
    assert offsets_of(read_all(reopened)) == list(range(reopened.log_end_offset))
    assert reopened.append(batch(1)).first_offset == reopened.log_end_offset - 1


@pytest.mark.parametrize("garbage", [b"\x00" * 100, os.urandom(3), os.urandom(500), b"\xff" * 61])
def test_garbage_appended(tmp_path, clock: Clock, garbage: bytes) -> None:
    log = filled_log(tmp_path, clock)
    data, end = read_all(log), log.log_end_offset
    with open(last_log_path(log), "ab") as f:
        f.write(garbage)
    reopened, stats = reopen_with_stats(log, clean=False)
    assert stats.truncated_bytes == len(garbage)
    assert reopened.log_end_offset == end
    assert read_all(reopened) == data


def test_garbage_after_a_clean_shutdown_is_still_removed(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock)
    log.close()
    data = read_all(log)
    with open(last_log_path(log), "ab") as f:
        f.write(b"\x01" * 77)
    reopened, stats = reopen_with_stats(log, clean=True)
    assert stats.truncated_bytes == 77
    assert read_all(reopened) == data


def test_flipped_byte_truncates_there_and_drops_later_segments(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock, n=60)
    assert len(log.segments) >= 3
    victim = log.segments[1]
    positions = list(iter_batches(open(victim.log_path, "rb").read()))
    pos, header = positions[len(positions) // 2]
    with open(victim.log_path, "r+b") as f:
        f.seek(pos + 40)  # inside the CRC-covered header
        byte = f.read(1)
        f.seek(pos + 40)
        f.write(bytes([byte[0] ^ 0x01]))
    expected = header.base_offset
    reopened, stats = reopen_with_stats(log, clean=False)
    assert reopened.log_end_offset == expected
    assert len(reopened.segments) == 2
    assert stats.deleted_segments >= 1
    assert offsets_of(read_all(reopened)) == list(range(expected))
    assert reopened.append(batch(1)).first_offset == expected


def test_recovery_starts_at_the_recovery_point(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock, n=60)
    log.flush()
    point = log.recovery_point
    log.append(batch(2))
    reopened, stats = reopen_with_stats(log, clean=False, recovery_point=point)
    assert stats.recovered_segments == 1
    assert reopened.recovery_point == point
    assert reopened.log_end_offset == point + 2


def test_zero_filled_tail_is_truncated(tmp_path, clock: Clock) -> None:
    """What a preallocated or extended-but-unwritten file looks like after power loss."""
    log = filled_log(tmp_path, clock)
    path = last_log_path(log)
    size = os.path.getsize(path)
    os.truncate(path, size + 4096)
    reopened = reopen(log, clean=False)
    assert os.path.getsize(path) == size
    assert reopened.log_end_offset == log.log_end_offset


@pytest.mark.parametrize(
    "damage", ["missing", "garbage", "odd_size", "short", "missing_time", "out_of_order"]
)
def test_damaged_indexes_are_rebuilt_after_a_clean_shutdown(tmp_path, clock: Clock, damage: str) -> None:
    log = filled_log(tmp_path, clock, n=60)
    data = read_all(log)
    log.close()
    before = snapshot(log)
    seg = log.segments[0]
    _, index_path, time_path = segment_paths(log.dir, seg.base_offset)
    assert os.path.getsize(index_path) >= 16
    if damage == "missing":
        os.unlink(index_path)
    elif damage == "garbage":
        with open(index_path, "r+b") as f:
            f.write(os.urandom(16))
    elif damage == "odd_size":
        with open(index_path, "ab") as f:
            f.write(b"\x00\x01\x02")
    elif damage == "short":
        os.truncate(index_path, 8)
    elif damage == "missing_time":
        os.unlink(time_path)
    elif damage == "out_of_order":
        raw = open(index_path, "rb").read()
        with open(index_path, "wb") as f:
            f.write(raw[8:16] + raw[0:8] + raw[16:])
    reopened = reopen(log, clean=True)
    assert read_all(reopened) == data
    for offset in range(0, reopened.log_end_offset, 7):
        assert offsets_of(reopened.read(offset, 1).records.read())[-1] >= offset
    reopened.close()
    assert snapshot(reopened) == before


def test_corrupt_active_index_on_clean_start_triggers_recovery(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock)
    data = read_all(log)
    log.close()
    _, index_path, _ = segment_paths(log.dir, log.segments[-1].base_offset)
    with open(index_path, "wb") as f:
        f.write(struct.pack(">ii", 1, 999_999))
    reopened, stats = reopen_with_stats(log, clean=True)
    assert stats.recovered_segments == 1
    assert read_all(reopened) == data


def test_crash_between_roll_steps(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock)
    end = log.log_end_offset
    data = read_all(log)
    # Step 1 of a roll happened (new .log file), the rest did not: no indexes, no final time entry.
    log_path, index_path, time_path = segment_paths(log.dir, end)
    open(log_path, "wb").close()
    for unclean in (True, False):
        reopened = reopen(log, clean=not unclean)
        assert reopened.log_end_offset == end
        assert reopened.segments[-1].base_offset == end and reopened.segments[-1].size == 0
        assert read_all(reopened) == data
        assert os.path.exists(index_path) and os.path.exists(time_path)
        log = reopened
    assert log.append(batch(1)).first_offset == end
    assert offsets_of(read_all(log)) == list(range(end + 1))


def test_orphan_index_and_temp_files_are_removed(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock)
    log.close()
    names = [f"{99999:020d}.index", f"{99999:020d}.timeindex", "leader-epoch-checkpoint.tmp"]
    for name in names:
        open(os.path.join(log.dir, name), "wb").close()
    reopened = reopen(log, clean=True)
    assert not set(names) & set(files(reopened))


def test_leftover_deleted_and_cleaned_files_are_removed(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock)
    data = read_all(log)
    log.close()
    for name in (
        f"{5:020d}.log.deleted",
        f"{5:020d}.index.deleted",
        f"{0:020d}.log.cleaned",
        f"{0:020d}.index.cleaned",
    ):
        with open(os.path.join(log.dir, name), "wb") as f:
            f.write(b"junk")
    reopened = reopen(log, clean=True)
    assert not [f for f in files(reopened) if f.endswith((".deleted", ".cleaned"))]
    assert read_all(reopened) == data


def test_interrupted_swap_is_completed(tmp_path, clock: Clock) -> None:
    """A cleaner swap cut short: the .swap segment replaces the segments it covers."""
    log = filled_log(tmp_path, clock, n=60)
    log.close()
    first, second = log.segments[0], log.segments[1]
    end = log.segments[2].base_offset
    # A "cleaned" segment: one record per old batch's last offset, keeping offsets.
    offsets = list(range(second.base_offset - 1, end, 5))
    cleaned = build_batch(
        [(b"k", b"v")] * len(offsets), offset_deltas=[o - offsets[0] for o in offsets], base_offset=offsets[0]
    )
    swap_path = segment_paths(log.dir, first.base_offset, ".swap")[0]
    with open(swap_path, "wb") as f:
        f.write(cleaned)
    reopened, stats = reopen_with_stats(log, clean=False)
    assert stats.swaps_completed == 1
    assert [s.base_offset for s in reopened.segments][0] == 0
    assert second.base_offset not in [s.base_offset for s in reopened.segments]
    got = offsets_of(read_all(reopened))
    assert got[: len(offsets)] == offsets
    assert got[len(offsets)] == end


def test_leader_epochs_recovered_from_batches(tmp_path, clock: Clock) -> None:
    log = filled_log(tmp_path, clock, n=5)
    log.append(batch(1), leader_epoch=3)
    log.append(batch(1), leader_epoch=7)
    os.unlink(os.path.join(log.dir, "leader-epoch-checkpoint"))
    reopened = reopen(log, clean=False)
    assert reopened.epoch_cache.entries == [(0, 0), (3, log.log_end_offset - 2), (7, log.log_end_offset - 1)]
    assert reopened.end_offset_for_epoch(3) == (3, log.log_end_offset - 1)
    assert reopened.end_offset_for_epoch(7) == (7, log.log_end_offset)
    assert reopened.leader_epoch == 7


def test_empty_log_restarts(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    for clean in (True, False):
        log = reopen(log, clean=clean)
        assert log.log_end_offset == 0 and log.read(0, 100).records.length == 0
    assert batch_ranges(read_all(log)) == []
