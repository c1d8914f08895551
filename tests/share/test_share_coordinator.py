"""The share coordinator: state batches combined, snapshots and updates, fencing, replay, pruning."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from broker.coordinator.runtime import InMemoryWriter
from broker.coordinator.share import (
    ShareCoordinatorShard,
    StateBatch,
    WriteState,
    coordinator_key,
    create_share_coordinator,
)
from broker.coordinator.share.records import SHARE_SNAPSHOT, SHARE_UPDATE, parse_record
from broker.coordinator.share.state import combine_state_batches
from broker.coordinator.timer import ManualClock
from protocol.errors import ErrorCode, KafkaError

T = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
KEY = ("g", T, 0)
AVAILABLE, ACKNOWLEDGED, ARCHIVING, ARCHIVED = 0, 2, 3, 4


def test_combine_prunes_below_the_start_offset_and_lets_the_further_state_win() -> None:
    known = (StateBatch(0, 9, AVAILABLE, 1), StateBatch(10, 19, AVAILABLE, 1))
    new = [StateBatch(5, 12, ACKNOWLEDGED, 1), StateBatch(15, 15, AVAILABLE, 2)]
    assert combine_state_batches(known, new, 3) == (
        StateBatch(3, 4, AVAILABLE, 1), StateBatch(5, 12, ACKNOWLEDGED, 1), StateBatch(13, 14, AVAILABLE, 1),
        StateBatch(15, 15, AVAILABLE, 2), StateBatch(16, 19, AVAILABLE, 1))
    # a higher delivery count wins over a state further along; equal neighbours are joined
    assert combine_state_batches((StateBatch(0, 4, ARCHIVED, 1),), [StateBatch(2, 3, AVAILABLE, 2)], -1) == (
        StateBatch(0, 1, ARCHIVED, 1), StateBatch(2, 3, AVAILABLE, 2), StateBatch(4, 4, ARCHIVED, 1))
    assert combine_state_batches((StateBatch(0, 4, ARCHIVING, 1),), [StateBatch(0, 4, ARCHIVED, 1)], 0) == (
        StateBatch(0, 4, ARCHIVED, 1),)


def write(shard: ShareCoordinatorShard, start: int, *batches: StateBatch, state_epoch: int = 0, now: int = 0) -> int:
    result = shard.write_state(WriteState(KEY, state_epoch, 0, start, 0, tuple(batches)), now)
    for key, value in result.records:
        shard.replay(key, value)
    (record_type,) = {parse_record(k, v)[0] for k, v in result.records}
    return record_type


def test_a_snapshot_first_then_updates_then_a_snapshot_again() -> None:
    shard = ShareCoordinatorShard(snapshot_every=2)
    assert write(shard, 0, StateBatch(0, 4, ACKNOWLEDGED, 1)) == SHARE_SNAPSHOT
    assert write(shard, 5, StateBatch(5, 6, AVAILABLE, 1)) == SHARE_UPDATE
    assert write(shard, 5, StateBatch(7, 7, ARCHIVED, 1)) == SHARE_UPDATE
    assert write(shard, 5, StateBatch(8, 8, ACKNOWLEDGED, 1)) == SHARE_SNAPSHOT  # the third since
    state = shard.read_state(KEY)
    assert state is not None and state.snapshot_epoch == 1 and state.start_offset == 5
    assert state.state_batches == (StateBatch(5, 6, AVAILABLE, 1), StateBatch(7, 7, ARCHIVED, 1),
                                   StateBatch(8, 8, ACKNOWLEDGED, 1))


def test_replaying_the_log_gives_the_same_state() -> None:
    shard = ShareCoordinatorShard(snapshot_every=3)
    log = []
    for i in range(10):
        result = shard.write_state(WriteState(KEY, 0, 0, i, 0, (StateBatch(i, i + 2, AVAILABLE, i % 3 + 1),)), i)
        for key, value in result.records:
            shard.replay(key, value)
            log.append((key, value))
    again = ShareCoordinatorShard(snapshot_every=3)
    for key, value in log:
        again.replay(key, value)
    assert again.read_state(KEY) == shard.read_state(KEY)


def test_delivery_complete_count_is_persisted_and_replayed() -> None:
    """KIP-1226: the count of records done above the start offset rides in snapshots and updates
    (a tagged field); a write that does not know it (-1) keeps the known value."""
    shard = ShareCoordinatorShard(snapshot_every=5)
    log = []
    for count, record_type in ((2, SHARE_SNAPSHOT), (5, SHARE_UPDATE), (-1, SHARE_UPDATE)):
        result = shard.write_state(WriteState(KEY, 0, 0, 0, count, (StateBatch(0, 9, ACKNOWLEDGED, 1),)), 0)
        for key, value in result.records:
            assert parse_record(key, value)[0] == record_type
            if count >= 0:
                assert parse_record(key, value)[2].delivery_complete_count == count
            shard.replay(key, value)
            log.append((key, value))
    state = shard.read_state(KEY)
    assert state is not None and state.delivery_complete_count == 5
    again = ShareCoordinatorShard(snapshot_every=5)
    for key, value in log:
        again.replay(key, value)
    assert again.read_state(KEY) == state


def test_writes_are_fenced_by_state_and_leader_epochs_and_need_the_partition() -> None:
    shard = ShareCoordinatorShard(partition_exists=lambda topic_id, partition: partition < 2)
    for key, value in shard.initialize_state(KEY, 3, 10, 0).records:
        shard.replay(key, value)
    with pytest.raises(KafkaError) as err:
        shard.write_state(WriteState(KEY, 2, 0, 10, 0, ()), 0)
    assert err.value.code is ErrorCode.FENCED_STATE_EPOCH
    write(shard, 10, StateBatch(10, 10, ACKNOWLEDGED, 1), state_epoch=3)
    with pytest.raises(KafkaError) as err:
        shard.write_state(WriteState(("g", T, 5), 0, 0, 0, 0, ()), 0)
    assert err.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_deleting_state_writes_tombstones() -> None:
    shard = ShareCoordinatorShard()
    write(shard, 0, StateBatch(0, 0, ACKNOWLEDGED, 1))
    result = shard.delete_state([KEY, ("g", T, 7)])
    assert len(result.records) == 2 and all(v is None for _, v in result.records)
    for key, value in result.records:
        shard.replay(key, value)
    assert shard.read_state(KEY) is None


def test_the_coordinator_key_is_kafkas() -> None:
    assert coordinator_key(("group", uuid.UUID(int=0), 3)) == "group:AAAAAAAAAAAAAAAAAAAAAA:3"


async def test_pruning_keeps_the_state_and_drops_the_records_before_the_snapshots() -> None:
    writer = InMemoryWriter()
    pruned: list[tuple[int, int]] = []
    coordinator = create_share_coordinator(
        writer, {"share.coordinator.state.topic.num.partitions": 1}, ManualClock(),
        log_end_offset=lambda p: len(writer.logs[p]), prune_before=lambda p, o: pruned.append((p, o)))
    await coordinator.start()
    try:
        for i in range(150):
            await coordinator.write_state(WriteState(KEY, 0, 0, i, 0, (StateBatch(i, i, ACKNOWLEDGED, 1),)))
        assert await coordinator.prune(0)
        assert pruned == [(0, 150)]
        reloaded = ShareCoordinatorShard()
        for key, value in writer.logs[0][150:]:
            reloaded.replay(key, value)
        assert reloaded.read_state(KEY) == await coordinator.read_state(KEY)
        assert not await coordinator.prune(0)  # nothing new to prune
    finally:
        await coordinator.stop()
    await asyncio.sleep(0)
