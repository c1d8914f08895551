"""A follower's copy of a partition (replication): the leader's batches appended as they are, the
epoch cache, producer state and aborted-transaction index that follow from them, truncation, and
the follower's high watermark."""

from __future__ import annotations

import os
import uuid

import pytest

from broker.log import create_log
from broker.log.txn_index import AbortedTxn
from broker.partition import Partition
from broker.partition.partition import Role
from protocol.errors import ErrorCode, KafkaError
from protocol.records import iter_batches
from tests.log.log_helpers import Clock, batch, read_all, small_config


def new_partition(path: str, clock: Clock, name: str) -> Partition:
    log = create_log(os.path.join(path, name), "t", 0, small_config(), time=clock)
    p = Partition("t", 0, uuid.uuid4(), log)
    p.rebuild_producer_state()
    return p


@pytest.fixture
def leader(tmp_path, clock: Clock) -> Partition:
    return new_partition(str(tmp_path), clock, "leader")


@pytest.fixture
def follower(tmp_path, clock: Clock) -> Partition:
    p = new_partition(str(tmp_path), clock, "follower")
    p.make_follower(1, 0, 0, [1, 2], [1, 2])
    return p


def txn(p: Partition, pid: int, seq: int, n: int = 1) -> None:
    records = batch(n, producer_id=pid, producer_epoch=0, base_sequence=seq, is_transactional=True)
    guard = p.start_verification(pid) if p.needs_verification(next(iter(iter_batches(records)))[1]) else None
    p.append_records(records, guard)


def fill(leader: Partition) -> None:
    """Plain, idempotent and transactional batches over three leader epochs and several segments."""
    for i in range(6):
        leader.append_records(batch(3, size=200))
        leader.append_records(batch(2, producer_id=7, producer_epoch=0, base_sequence=2 * i))
    leader.become_leader(2)
    txn(leader, 8, 0, 2)
    txn(leader, 9, 0)
    leader.append_marker(8, 0, committed=False)
    leader.become_leader(5)
    txn(leader, 9, 1)
    leader.append_records(batch(4, size=300))


def copy(leader: Partition, follower: Partition, max_bytes: int = 1000) -> None:
    """What a fetcher does: read from the follower's end, append, take the high watermark."""
    while follower.log.log_end_offset < leader.log.log_end_offset:
        data = leader.log.read(follower.log.log_end_offset, max_bytes).records.read()
        follower.append_as_follower(data)
        follower.update_follower_high_watermark(leader.high_watermark)


def producer_view(p: Partition) -> dict[int, tuple[int, int, int, int]]:
    return {pid: (e.epoch, e.last_seq, e.current_txn_first_offset, e.coordinator_epoch)
            for pid, e in p.producers.producers.items()}


def test_the_copy_holds_the_leaders_batches_byte_for_byte(leader: Partition, follower: Partition) -> None:
    fill(leader)
    copy(leader, follower)
    assert len(leader.log.segments) > 1
    assert read_all(follower.log) == read_all(leader.log)
    assert follower.log.epoch_cache.entries == leader.log.epoch_cache.entries == [(0, 0), (2, 30), (5, 34)]
    assert producer_view(follower) == producer_view(leader)
    assert follower.producers.ongoing == leader.producers.ongoing
    assert follower.aborted_transactions(0, 100) == leader.aborted_transactions(0, 100) == [AbortedTxn(8, 30, 33, 32)]
    assert follower.high_watermark == leader.high_watermark == follower.log.log_end_offset
    assert follower.last_stable_offset == leader.last_stable_offset == 32


def test_an_incomplete_trailing_batch_is_left_for_the_next_fetch(leader: Partition, follower: Partition) -> None:
    leader.append_records(batch(2))
    leader.append_records(batch(3))
    data = leader.log.read(0, 1 << 20).records.read()
    result = follower.append_as_follower(data[:-5])
    assert (result.first_offset, result.last_offset, follower.log.log_end_offset) == (0, 1, 2)
    follower.append_as_follower(leader.log.read(2, 1 << 20).records.read())
    assert read_all(follower.log) == data


def test_batches_below_the_log_end_or_corrupt_are_refused(leader: Partition, follower: Partition) -> None:
    leader.append_records(batch(2))
    data = leader.log.read(0, 1 << 20).records.read()
    follower.append_as_follower(data)
    with pytest.raises(KafkaError) as exc:
        follower.append_as_follower(data)
    assert exc.value.code == ErrorCode.INVALID_RECORD
    leader.append_records(batch(1))
    bad = bytearray(leader.log.read(2, 1 << 20).records.read())
    bad[-1] ^= 0xFF
    with pytest.raises(KafkaError) as exc:
        follower.append_as_follower(bad)
    assert exc.value.code == ErrorCode.CORRUPT_MESSAGE
    assert follower.log.log_end_offset == 2


def test_the_follower_high_watermark_never_passes_its_log_end(leader: Partition, follower: Partition) -> None:
    assert follower.role is Role.FOLLOWER and follower.high_watermark == 0
    leader.append_records(batch(5))
    follower.append_as_follower(leader.log.read(0, 1 << 20).records.read())
    assert follower.update_follower_high_watermark(3) and follower.high_watermark == 3
    assert not follower.update_follower_high_watermark(3)
    follower.update_follower_high_watermark(99)
    assert follower.high_watermark == 5
    follower.make_leader(1, 1, [2, 1], [2, 1])
    assert follower.high_watermark == 5


@pytest.mark.parametrize("cut", [30, 31, 33, 34, 12])
def test_truncation_leaves_what_a_log_of_only_the_kept_batches_has(tmp_path, clock: Clock, leader: Partition,
                                                                  follower: Partition, cut: int) -> None:
    """Truncated at `cut`, the follower's log, epoch cache, producer state, transaction index and
    producer snapshots are those of a copy that never had the batches after it."""
    fill(leader)
    copy(leader, follower)
    follower.take_snapshot()  # a snapshot beyond the cut must go
    follower.truncate_to(cut)
    end = follower.log.log_end_offset
    assert end <= cut
    fresh = new_partition(str(tmp_path), clock, "fresh")
    fresh.make_follower(1, 0, 0, [1, 2], [1, 2])
    offset = 0
    while offset < end:
        chunk = leader.log.read(offset, 1000).records.read()
        keep = bytearray()
        for pos, h in iter_batches(chunk):
            if h.base_offset >= end:
                break
            keep += chunk[pos:pos + h.size]
        fresh.append_as_follower(bytes(keep))
        offset = fresh.log.log_end_offset
    assert read_all(follower.log) == read_all(fresh.log)
    assert follower.log.epoch_cache.entries == fresh.log.epoch_cache.entries
    assert producer_view(follower) == producer_view(fresh)
    assert follower.producers.ongoing == fresh.producers.ongoing
    assert follower.aborted_transactions(0, 100) == fresh.aborted_transactions(0, 100)
    assert follower.high_watermark <= end
    assert all(int(n.split(".")[0]) <= end for n in os.listdir(follower.log.dir) if n.endswith(".snapshot"))
    # and it goes on from there as the leader's copy
    copy(leader, follower)
    assert read_all(follower.log) == read_all(leader.log)
    assert producer_view(follower) == producer_view(leader)


def test_truncation_inside_a_batch_removes_the_whole_batch(leader: Partition, follower: Partition) -> None:
    leader.append_records(batch(2))
    leader.append_records(batch(3))  # 2-4
    copy(leader, follower)
    follower.truncate_to(3)
    assert follower.log.log_end_offset == 2


def test_truncate_fully_and_start_at_the_leaders_log_start(leader: Partition, follower: Partition) -> None:
    leader.append_records(batch(2, producer_id=4, producer_epoch=0, base_sequence=0))
    copy(leader, follower)
    follower.truncate_fully_and_start_at(50)
    assert (follower.log.log_start_offset, follower.log.log_end_offset, follower.high_watermark) == (50, 50, 50)
    assert follower.producers.producers == {}
    assert follower.log.epoch_cache.entries == []


def test_the_log_start_follows_the_leaders_up_to_the_high_watermark(leader: Partition, follower: Partition) -> None:
    for _ in range(40):
        leader.append_records(batch(2, size=200))
    copy(leader, follower)
    follower.update_follower_high_watermark(30)
    follower.follow_log_start_offset(50)
    assert follower.log.log_start_offset == 30
    assert follower.log.segments[0].base_offset <= 30 < follower.log.segments[0].base_offset + 40
    follower.follow_log_start_offset(10)
    assert follower.log.log_start_offset == 30
