"""The pool of open files: LRU bound, idle close, readers keep their handle, recovery closes what it opened."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import pytest

from broker.log import handles
from broker.log.handles import OPEN_FILES, FilePool, PooledFile
from protocol.errors import ErrorCode, KafkaError
from tests.log.log_helpers import Clock, batch, new_log, read_all, reopen, reopen_with_stats, small_config


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def files(tmp_path, n: int, pool: FilePool) -> list[PooledFile]:
    out = []
    for i in range(n):
        path = tmp_path / ("f%d" % i)
        path.write_bytes(b"file %d" % i)
        out.append(PooledFile(str(path), os.O_RDWR, pool))
    return out


def test_the_pool_keeps_at_most_capacity_files_open_and_drops_the_least_recently_used(tmp_path) -> None:
    pool = FilePool(3)
    f = files(tmp_path, 5, pool)
    for x in f[:3]:
        x.handle()
    f[0].handle()  # f0 is now the most recent: f1 goes first
    f[3].handle()
    assert [x.is_open for x in f] == [True, False, True, True, False]
    f[4].handle()
    assert [x.is_open for x in f] == [True, False, False, True, True]
    assert len(pool) == 3 and pool.dropped == 2
    # a dropped file reopens by path at its next use
    h = f[1].handle()
    assert os.pread(h.fd, 6, 0) == b"file 1"
    assert len(pool) == 3


def test_a_dropped_handle_stays_open_while_a_reader_holds_it(tmp_path) -> None:
    pool = FilePool(1)
    a, b = files(tmp_path, 2, pool)
    held = a.handle()
    fd = held.fd
    b.handle()  # drops a from the pool
    assert not a.is_open
    assert fd_is_open(fd) and os.pread(fd, 6, 0) == b"file 0"
    del held
    assert not fd_is_open(fd)


def test_idle_files_close_after_a_period_without_use(tmp_path) -> None:
    pool = FilePool(10)
    used, idle = files(tmp_path, 2, pool)
    used.handle()
    idle.handle()
    assert pool.close_idle() == 0  # the first sweep only marks
    used.handle()
    assert pool.close_idle() == 1
    assert used.is_open and not idle.is_open
    assert pool.close_idle() == 1
    assert not used.is_open and len(pool) == 0


def test_a_renamed_file_reopens_under_its_new_name(tmp_path) -> None:
    pool = FilePool(1)
    a, b = files(tmp_path, 2, pool)
    a.handle()
    os.replace(a.path, a.path + ".deleted")
    a.rename(a.path + ".deleted")
    b.handle()
    assert os.pread(a.handle().fd, 6, 0) == b"file 0"


def test_running_out_of_descriptors_drops_half_the_pool_then_says_so_clearly(tmp_path, monkeypatch) -> None:
    pool = FilePool(8)
    f = files(tmp_path, 5, pool)
    for x in f[:4]:
        x.handle()
    real_open = os.open
    failures = [1]

    def flaky_open(path, flags, mode=0o777):
        if failures[0] > 0:
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode)

    monkeypatch.setattr(handles.os, "open", flaky_open)
    assert os.pread(f[4].handle().fd, 6, 0) == b"file 4"  # after dropping the oldest half
    assert [x.is_open for x in f] == [False, False, True, True, True]
    failures[0] = 2
    f[0].close()
    with pytest.raises(KafkaError) as info:
        f[0].handle()
    assert info.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert "too many open files" in str(info.value) and "ulimit -n" in str(info.value)


@pytest.fixture
def small_pool() -> Iterator[FilePool]:
    saved = OPEN_FILES.capacity
    OPEN_FILES.configure(4)
    try:
        yield OPEN_FILES
    finally:
        OPEN_FILES.configure(saved)


def test_a_log_with_more_segments_than_the_pool_holds_reads_and_writes_correctly(
    tmp_path, clock: Clock, small_pool: FilePool
) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=400, index_interval_bytes=100))
    for i in range(60):
        log.append(batch(2, size=30, ts=clock.now + i))
    assert len(log.segments) > 10
    written = read_all(log)
    assert len(small_pool) <= 4
    # read every segment again, the oldest first, while slices of early ones are still held
    held = [log.read(s.base_offset, 1 << 20).records for s in log.segments]
    assert len(small_pool) <= 4
    assert b"".join(x.read() for x in held) == written
    assert read_all(reopen(log, clean=True)) == written


def test_a_slice_stays_readable_after_its_segment_is_deleted_and_dropped(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=400, file_delete_delay_ms=0))
    for _ in range(20):
        log.append(batch(2, size=30))
    first = log.segments[0]
    held = log.read(0, 1 << 20).records
    expected = held.read()
    log.delete_records_before(log.segments[2].base_offset)
    log.delete_pending_files(force=True)
    assert not os.path.exists(first.log_path) and not first.holds_handles
    assert held.read() == expected


def test_recovery_after_a_crash_leaves_no_file_open(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=600, index_interval_bytes=100))
    for i in range(40):
        log.append(batch(2, size=30, ts=clock.now + i))
    end = log.log_end_offset
    log.release_handles()
    before = len(OPEN_FILES)
    recovered = reopen(log, clean=False)  # every segment is scanned and its indexes rebuilt
    assert recovered.log_end_offset == end
    assert not any(s.holds_handles for s in recovered.segments)
    assert len(OPEN_FILES) == before
    recovered.append(batch(1))  # the active segment reopens on demand
    assert recovered.active_segment.holds_handles
    recovered.close()
    assert not any(s.holds_handles for s in recovered.segments)


def test_recovery_writes_what_it_rebuilt_only_later_and_only_where_it_differs(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=600, index_interval_bytes=100))
    log.epoch_cache.assign(0, 0)  # as a new Partition does, without a file (and an fsync) per partition
    for i in range(40):
        log.append(batch(2, size=30, ts=clock.now + i))
    end = log.log_end_offset
    epochs = os.path.join(log.dir, "leader-epoch-checkpoint")
    assert not os.path.exists(epochs)
    before = {name: (tmp_path / "t-0" / name).read_bytes() for name in os.listdir(log.dir)}
    recovered = reopen(log, clean=False)
    # A start-up after a crash creates and rewrites nothing: the epochs recovery found wait for
    # the next flush, the indexes it rebuilt for the next write or flush of their segment.
    assert {name: (tmp_path / "t-0" / name).read_bytes() for name in os.listdir(log.dir)} == before
    assert recovered.epoch_cache.pending and recovered.epoch_cache.entries == [(0, 0)]
    recovered.flush()
    assert os.path.exists(epochs) and not recovered.epoch_cache.pending
    recovered.close()
    again, stats = reopen_with_stats(recovered, clean=True)
    assert stats.recovered_segments == 0  # the active segment's indexes pass their check
    assert again.log_end_offset == end and again.epoch_cache.entries == [(0, 0)]
