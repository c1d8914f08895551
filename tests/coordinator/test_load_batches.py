"""Loading a group coordinator partition batch by batch (GroupCoordinatorShard.replay_batch, runs
of OffsetCommit records applied at once) gives the state that replaying each record gives:
offsets, tombstones, the latest value winning, group metadata, pending transactional offsets and
their markers, and records that cannot be applied (skipped alone). And the runtime pauses the
cyclic garbage collector while it loads, and only then."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import Iterable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.coordinator.group import create_group_coordinator
from broker.coordinator.group.records import (
    OFFSET_COMMIT,
    OffsetAndMetadata,
    OffsetCommitRun,
    coordinator_record,
    empty_group_metadata_record,
    group_metadata_tombstone,
    offset_commit_record,
    offset_commit_runs,
    offset_commit_tombstone,
    parse_offset_commit,
)
from broker.coordinator.group.shard import GroupCoordinatorShard
from broker.coordinator.result import LoggedItem, Record, TransactionalRecord, TxnMarker
from broker.coordinator.runtime import InMemoryWriter
from broker.coordinator.timer import ManualClock
from protocol import messages as M
from protocol.primitives import ZERO_UUID
from tests.coordinator.test_replay import persisted_view

TOPIC_ID = uuid.UUID(int=0xFEED)
GROUPS = "ab"
TOPICS = ["t", "u"]


def commit(group: str, topic: str, partition: int, offset: int, metadata: str, topic_id: uuid.UUID,
           expire: int | None, version: int) -> Record:
    om = OffsetAndMetadata(offset, 0, metadata, 1000 + offset, expire, topic_id)
    if version != 3:
        return offset_commit_record(group, topic, partition, om)  # v4 (v1 with an expiry)
    value = M.OffsetCommitValue(offset=offset, leader_epoch=0, metadata=metadata, commit_timestamp=om.commit_timestamp_ms)
    return coordinator_record(OFFSET_COMMIT, M.OffsetCommitKey(group=group, topic=topic, partition=partition), value, 3)


_group, _topic, _partition = st.sampled_from(GROUPS), st.sampled_from(TOPICS), st.integers(0, 3)
_record = st.one_of(
    st.builds(commit, _group, _topic, _partition, st.integers(0, 500), st.sampled_from(["", "m", "x" * 130]),
              st.sampled_from([ZERO_UUID, TOPIC_ID]), st.sampled_from([None, None, 5]), st.sampled_from([3, 4, 4])),
    st.builds(offset_commit_tombstone, _group, _topic, _partition),
    st.builds(empty_group_metadata_record, _group, st.just(7)),
    st.builds(group_metadata_tombstone, _group),
    st.sampled_from([(b"\x00\x01\x00", b"damaged"), (b"\x00\x01\x00\x01a\x00\x01t\x00\x00\x00\x01", b"\x00\x09")]),
)
_item = st.one_of(
    st.lists(_record, max_size=8),  # a batch of plain records
    st.builds(lambda pid, r: TransactionalRecord(pid, *r), st.sampled_from([1, 2]), _record),
    st.builds(lambda pid, c: TxnMarker(pid, 0, c), st.sampled_from([1, 2]), st.booleans()),
)


def flattened(items: Iterable[LoggedItem]) -> list[LoggedItem]:
    """The same log with each batch of plain records given one record at a time."""
    return [r for item in items for r in (item if isinstance(item, list) else [item])]


async def load(items: list[LoggedItem]) -> GroupCoordinatorShard:
    writer = InMemoryWriter()
    writer.logs[0] = items
    coordinator = create_group_coordinator(writer, {"offsets.topic.num.partitions": 1}, ManualClock(0))
    await coordinator.start()
    shard = coordinator.runtime.shard(0)
    await coordinator.stop()
    return shard


def state(shard: GroupCoordinatorShard) -> Any:
    offsets = shard.offsets
    pending = {pid: {g: {tp: (p.om, p.superseded) for tp, p in by_tp.items()} for g, by_tp in by_group.items()}
               for pid, by_group in offsets.pending.items()}
    kinds = {g: type(group).__name__ for g, group in shard.groups.items()}
    return persisted_view(shard), kinds, pending, offsets.open_transactions, offsets.markers


@settings(max_examples=300, deadline=None)
@given(st.lists(_item, max_size=12))
def test_loading_by_batches_is_replaying_each_record(items: list[LoggedItem]) -> None:
    by_batch = asyncio.run(load(items))
    by_record = asyncio.run(load(flattened(items)))
    assert state(by_batch) == state(by_record)


def test_a_commit_run_is_one_group_and_topic() -> None:
    om = OffsetAndMetadata(5, 1, "", 9)
    records = [offset_commit_record("g", "t", p, om) for p in range(3)]
    records += [offset_commit_tombstone("g", "t", 7), offset_commit_record("g", "t", 1, om._replace(committed_offset=6))]
    records += [offset_commit_record("g", "u", 0, om), group_metadata_tombstone("g"), offset_commit_record("g", "u", 1, om)]
    runs = list(offset_commit_runs(records))
    assert [type(r) for r in runs] == [OffsetCommitRun, OffsetCommitRun, tuple, OffsetCommitRun]
    first = runs[0]
    assert isinstance(first, OffsetCommitRun)
    assert (first.group, first.topic, first.tombstones) == ("g", "t", True)
    assert first.offsets == [(0, om), (1, om), (2, om), (7, None), (1, om._replace(committed_offset=6))]
    assert [(p, o) for r in runs if isinstance(r, OffsetCommitRun) for p, o in r.offsets] == [
        parse_offset_commit(*r)[2:] for r in records if r[0][1] == OFFSET_COMMIT]  # type: ignore[index]


def test_a_record_that_fails_is_skipped_alone() -> None:
    om = OffsetAndMetadata(5, 1, "", 9)
    batch = [offset_commit_record("g", "t", 0, om), (b"\x00\x01\x00", b"damaged"), offset_commit_record("g", "t", 1, om)]
    shard = asyncio.run(load([batch]))
    assert shard.offsets.store.group("g") == {"t": {0: om, 1: om}}


async def test_the_collector_is_paused_while_loading_only() -> None:
    seen: list[bool] = []

    class Recording(InMemoryWriter):
        def read(self, partition: int) -> list[LoggedItem]:
            seen.append(gc.isenabled())
            return []

    assert gc.isenabled()
    coordinator = create_group_coordinator(Recording(), {"offsets.topic.num.partitions": 3}, ManualClock(0))
    await coordinator.start()
    assert seen == [False, False, False] and gc.isenabled()
    await coordinator.stop()

    gc.disable()  # whoever turned it off keeps it off
    try:
        coordinator = create_group_coordinator(Recording(), {"offsets.topic.num.partitions": 1}, ManualClock(0))
        await coordinator.start()
        assert not gc.isenabled()
        await coordinator.stop()
    finally:
        gc.enable()
