"""Loading many partitions cheaply: what recovery learns on its scan (segments without producer
batches, whole small files read at once), what one directory listing answers (which files
exist), and small files read in three syscalls; none of it may change what is recovered."""

from __future__ import annotations

import gc
import os
import uuid

import pytest

from broker.gc_policy import collector_paused
from broker.log import Log, create_log
from broker.log import segment as segment_module
from broker.log.checkpoint import LEADER_EPOCH_CHECKPOINT, read_whole
from broker.partition import Partition
from tests.log.log_helpers import Clock, batch, offsets_of, read_all, reopen, reopen_with_stats, small_config


def partition_of(log: Log) -> Partition:
    p = Partition(log.topic, log.partition, uuid.uuid4(), log)
    p.rebuild_producer_state()
    return p


def idempotent(pid: int, seq: int, n: int = 1) -> bytes:
    return batch(n, producer_id=pid, producer_epoch=0, base_sequence=seq, size=60)


@pytest.mark.parametrize("mapped", [False, True], ids=["read-whole", "mapped"])
def test_a_torn_tail_is_truncated_whether_the_segment_is_read_or_mapped(tmp_path, clock: Clock,
                                                                       monkeypatch, mapped: bool) -> None:
    if mapped:  # files above the bound are mapped: make every file "large"
        monkeypatch.setattr(segment_module, "_READ_WHOLE_BYTES", 0)
    log = create_log(str(tmp_path), "t", 0, small_config(segment_bytes=1 << 20), time=clock)
    for i in range(20):
        log.append(batch(2, size=50, ts=clock.now + i))
    end = log.log_end_offset
    path = log.active_segment.log_path
    os.truncate(path, os.path.getsize(path) - 5)
    reopened, stats = reopen_with_stats(log, clean=False)
    assert stats.recovered_segments == 1 and stats.truncated_bytes > 0
    assert reopened.log_end_offset == end - 2
    assert offsets_of(read_all(reopened)) == list(range(end - 2))
    assert reopened.append(batch(1)).first_offset == end - 2


def test_recovery_tells_which_segments_hold_producer_batches(tmp_path, clock: Clock) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config(segment_bytes=600), time=clock)
    p = partition_of(log)
    p.append_records(idempotent(7, 0))
    while len(log.segments) < 3:
        p.append_records(batch(1, size=60))  # plain batches only from the second segment on
    p.append_records(idempotent(7, 1))  # the active segment has one again
    reopened = reopen(log, clean=False, clock=clock)
    assert [s.producer_batches for s in reopened.segments] == [True] + [False] * (len(reopened.segments) - 2) + [True]
    p2 = partition_of(reopened)
    assert p2.producers.producers[7].last_seq == 1
    # a retry of the producer's last batch is still recognised as a duplicate
    assert p2.append_records(idempotent(7, 1)).base_offset == p.log.log_end_offset - 1


def test_a_crash_replays_the_producers_of_segments_below_the_recovery_point(tmp_path, clock: Clock) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config(segment_bytes=600), time=clock)
    p = partition_of(log)
    p.append_records(idempotent(3, 0))
    while len(log.segments) < 3:
        p.append_records(batch(1, size=60))
    log.flush()  # the recovery point moves past the producer's batch: it is not scanned again
    for _ in range(3):
        p.append_records(batch(1, size=60))
    reopened = reopen(log, clean=False, clock=clock, recovery_point=log.recovery_point)
    assert reopened.segments[0].producer_batches is None  # not scanned: not known
    assert partition_of(reopened).producers.producers[3].last_seq == 0


def test_the_listing_answers_which_files_exist(tmp_path, clock: Clock) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config(), time=clock)
    p = partition_of(log)
    p.become_leader(3)  # writes the leader-epoch-checkpoint
    p.append_records(idempotent(1, 0))
    p.take_snapshot()
    log.close()
    reopened = reopen(log, clean=False, clock=clock)
    listing = reopened.listing
    assert listing is not None and "%020d.snapshot" % 1 in listing and LEADER_EPOCH_CHECKPOINT in listing
    assert reopened.epoch_cache.latest_epoch == 3
    p2 = partition_of(reopened)
    assert reopened.listing is None  # used once: later it may be stale
    assert p2.producers.producers[1].last_seq == 0
    # a file that the listing did not show is created when it is written
    seg = reopened.active_segment
    assert not os.path.exists(seg.txn_index.path) and seg.txn_index.entries == []
    records = batch(1, producer_id=2, producer_epoch=0, base_sequence=0, is_transactional=True)
    p2.append_records(records, p2.start_verification(2))  # verified, as the produce path does
    p2.append_marker(2, 0, committed=False)
    assert os.path.getsize(seg.txn_index.path) > 0


def test_read_whole_reads_files_larger_than_one_read(tmp_path) -> None:
    for size in (0, 10, 64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, 300_000):
        path = tmp_path / ("f%d" % size)
        data = os.urandom(size)
        path.write_bytes(data)
        assert read_whole(str(path)) == data
    with pytest.raises(FileNotFoundError):
        read_whole(str(tmp_path / "missing"))


def test_collector_pauses_nest_and_leave_a_disabled_collector_alone() -> None:
    assert gc.isenabled()
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # whoever turned it off keeps it off
    finally:
        gc.enable()


def test_a_new_directory_is_made_durable_by_the_first_flush(tmp_path, clock: Clock, monkeypatch) -> None:
    import broker.log.log as log_module

    synced: list[str] = []
    monkeypatch.setattr(log_module, "fsync_dir", lambda path: synced.append(path))
    log = create_log(str(tmp_path), "t", 0, small_config(), time=clock)
    assert synced == [] and log.needs_flush()  # the background flusher's next pass takes it
    log.flush()
    assert synced == [log.dir, str(tmp_path)]
    assert not log.needs_flush()
    log.append(batch(1))
    log.flush()
    assert synced == [log.dir, str(tmp_path)]  # once


def test_placement_counts_partitions_per_log_dir(tmp_path) -> None:
    from broker.log import LogManager

    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    logs = LogManager(dirs, small_config())
    logs.startup()
    for i in range(4):
        logs.get_or_create_log("t", i)
    assert sorted(logs.log_dir_of("t", i) for i in range(4)) == [dirs[0], dirs[0], dirs[1], dirs[1]]
    logs.delete_log("t", 0)
    logs.delete_log("t", 2)
    assert logs.log_dir_of("t", 0) is None
    logs.get_or_create_log("t", 9)  # the dir that lost both goes first
    assert logs.log_dir_of("t", 9) == dirs[0]
    logs.shutdown()


def test_the_flusher_syncs_a_log_dir_once_for_its_new_partitions(tmp_path, monkeypatch) -> None:
    import broker.log.log as log_module
    import broker.log.manager as manager_module
    from broker.log import LogManager

    synced: list[str] = []
    monkeypatch.setattr(log_module, "fsync_dir", lambda path: synced.append(path))
    monkeypatch.setattr(manager_module, "fsync_dir", lambda path: synced.append(path))
    logs = LogManager([str(tmp_path)], small_config())
    logs.startup()
    created = [logs.get_or_create_log("t", i) for i in range(3)]
    synced.clear()
    assert logs.flush_dirty_logs() == 3
    assert sorted(synced) == sorted([str(tmp_path)] + [log.dir for log in created])  # the log dir once
    synced.clear()
    assert logs.flush_dirty_logs() == 0 and synced == []
    logs.shutdown()
