"""The share-partition manager on in-memory fakes: it reads from the log what the acquisition can
use (a window that grows until it holds the records wanted or the log's end, never MaxBytes of log
for a few records), answers with the log's own whole batches (a FileSlice, not a copy), and
resumes the dead-letter queue after a restart."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

from broker.coordinator.share.records import ShareKey
from broker.coordinator.share.shard import WriteState
from broker.coordinator.share.state import ShareGroupOffset, StateBatch
from broker.coordinator.timer import ManualClock
from broker.log.handles import FileHandle
from broker.log.segment import FileSlice
from broker.share.dlq import DeadLetter, DeadLetterWriter
from broker.share.engine import ShareSettings
from broker.share.inflight import RecordState
from broker.share.manager import READ_WINDOW, SharePartitionManager
from broker.share.ports import ShareGroupSettings
from protocol.records import iter_batches
from tests.share.fakes import LogPartition, Read

TOPIC = uuid.uuid4()
VALUE = b"x" * 1024


class Persister:
    def __init__(self, state: ShareGroupOffset | None = None) -> None:
        self.state = state
        self.writes: list[WriteState] = []

    async def read_state(self, key: ShareKey) -> ShareGroupOffset | None:
        return self.state

    async def write_state(self, write: WriteState) -> None:
        self.writes.append(write)


class FilePartition(LogPartition):
    """The same batches in a segment-like file: reads give FileSlices, as a broker Partition's do."""

    def __init__(self, batches: int, path: Path) -> None:
        super().__init__(batches, VALUE)
        path.write_bytes(b"".join(self.batches))
        self.handle = FileHandle(os.open(path, os.O_RDONLY))

    def read(self, offset: int, max_bytes: int, isolation_level: int, min_one_message: bool = True) -> Read:
        start = sum(len(b) for b in self.batches[:offset // 10])
        return Read(FileSlice(self.handle, start, len(super().read(offset, max_bytes, isolation_level).records)))


def manager(partition: LogPartition, persister: Persister | None = None, dlq: bool = False,
            dead_letters: DeadLetterWriter | None = None) -> SharePartitionManager:
    settings = ShareGroupSettings(engine=ShareSettings(dlq=dlq), auto_offset_reset="earliest")
    return SharePartitionManager(persister or Persister(), lambda topic_id, index: partition,
                                 lambda group_id: settings, ManualClock(), dead_letters=dead_letters)


async def fetch(m: SharePartitionManager, max_records: int) -> list[tuple[int, int]]:
    result = await m.fetch("g", "m", [(TOPIC, 0)], max_wait_ms=0, min_bytes=1, max_bytes=50 << 20,
                           max_records=max_records, batch_size=max_records, record_limit=False)
    return [(a.first_offset, a.last_offset) for a in result[(TOPIC, 0)].acquired]


async def test_a_fetch_of_a_few_records_reads_one_window() -> None:
    partition = LogPartition(batches=300, value=VALUE)  # about 3 MB
    m = manager(partition)
    assert await fetch(m, 100) == [(0, 99)]
    assert partition.reads == [READ_WINDOW]
    await m.stop()


async def test_the_window_grows_until_it_holds_the_records_wanted_or_the_log_end() -> None:
    partition = LogPartition(batches=300, value=VALUE)
    m = manager(partition)
    assert await fetch(m, 1500) == [(0, 1499)]  # 1.5 MB of records: a second, larger read
    assert partition.reads == [READ_WINDOW, 8 * READ_WINDOW]
    partition.reads.clear()
    assert await fetch(m, 500) == [(1500, 1999)]  # at the 2,000 record locks cap
    assert partition.reads == [READ_WINDOW]
    await m.stop()


async def test_the_records_sent_are_a_slice_of_the_log_file_holding_whole_batches(tmp_path: Path) -> None:
    """As Kafka's maybeSliceFetchRecords: the whole batches holding the acquired records, sent
    from the file (no copy); records of a batch acquired only in part go out in their batch, and
    its other records again with the next acquisition."""
    partition = FilePartition(batches=5, path=tmp_path / "00000000000000000000.log")
    size = len(partition.batches[0])
    m = manager(partition)

    async def share_fetch(max_records: int, record_limit: bool) -> tuple[list[tuple[int, int]], Any]:
        result = (await m.fetch("g", "m", [(TOPIC, 0)], max_wait_ms=0, min_bytes=1, max_bytes=50 << 20,
                                max_records=max_records, batch_size=max_records, record_limit=record_limit))[(TOPIC, 0)]
        return [(a.first_offset, a.last_offset) for a in result.acquired], result.records

    acquired, records = await share_fetch(4, record_limit=True)  # part of the first batch
    assert acquired == [(0, 3)]
    assert isinstance(records, FileSlice) and (records.position, records.length) == (0, size)
    assert records.read() == partition.batches[0]
    acquired, records = await share_fetch(12, record_limit=True)  # the rest of it and part of the next
    assert acquired == [(4, 9), (10, 15)]
    assert (records.position, records.length) == (0, 2 * size)
    acquired, records = await share_fetch(15, record_limit=False)  # whole batches (a soft limit)
    assert acquired == [(16, 19), (20, 39)]  # up to the end of the batch holding the 15th record
    assert isinstance(records, FileSlice) and (records.position, records.length) == (size, 3 * size)
    assert [h.base_offset for _, h in iter_batches(records.read())] == [10, 20, 30]
    await m.stop()


async def test_records_left_in_archiving_by_a_crash_go_to_the_dead_letter_queue_on_load() -> None:
    """KIP-1191: ARCHIVING survives a restart; loading the share-partition writes those records to
    the dead-letter queue (again: at least once) and then archives them, durably."""
    partition = LogPartition(batches=1, value=VALUE)
    persisted = ShareGroupOffset(start_offset=0, state_epoch=0, state_batches=(
        StateBatch(0, 1, int(RecordState.ACKNOWLEDGED), 1), StateBatch(2, 4, int(RecordState.ARCHIVING), 5)))
    persister = Persister(persisted)
    letters: list[DeadLetter] = []
    written = asyncio.Event()

    async def write(letter: DeadLetter) -> None:
        letters.append(letter)
        written.set()

    m = manager(partition, persister, dlq=True, dead_letters=write)
    entry = await m.entry("g", (TOPIC, 0))
    await asyncio.wait_for(written.wait(), 5)
    for _ in range(100):  # the archive write follows the DLQ write on the loop
        if entry.engine.start_offset == 5:
            break
        await asyncio.sleep(0)
    assert [(x.first_offset, x.last_offset, x.delivery_count) for x in letters] == [(2, 4, 5)]
    assert entry.engine.start_offset == 5 and m.metrics.dead_lettered == 3
    assert persister.writes[-1].batches == (StateBatch(2, 4, int(RecordState.ARCHIVED), 5),)
    await m.stop()


async def test_a_share_partition_lives_with_its_partitions_leader() -> None:
    """A share-partition is served only where its partition is led, in the epoch it was loaded in
    (Kafka's SharePartitionListener and leader epoch check): a replica that does not lead answers
    NOT_LEADER_OR_FOLLOWER, and one whose leadership moved on forgets what it held in memory and
    loads the state again in its new epoch (found by the fault runs: a restarted node whose
    metadata still named it leader loaded the state the new leader was serving, and both handed
    the same record to two members)."""
    from broker.share.engine import AckBatch
    from protocol.errors import ErrorCode

    partition = LogPartition(batches=2, value=VALUE)
    persister = Persister()
    m = manager(partition, persister)

    async def share_fetch() -> Any:
        return (await m.fetch("g", "m", [(TOPIC, 0)], max_wait_ms=0, min_bytes=1, max_bytes=50 << 20,
                              max_records=10, batch_size=10, record_limit=False))[(TOPIC, 0)]

    partition.is_leader = False  # type: ignore[misc]
    assert (await share_fetch()).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert not m.entries and not persister.writes

    partition.is_leader = True  # type: ignore[misc]
    partition.leader_epoch = 1  # type: ignore[misc]
    assert [(a.first_offset, a.last_offset) for a in (await share_fetch()).acquired] == [(0, 9)]
    acks = {(TOPIC, 0): [AckBatch(0, 4, [1])]}
    assert await m.acknowledge("g", "m", acks) == {(TOPIC, 0): (ErrorCode.NONE, None)}
    assert {w.leader_epoch for w in persister.writes} == {1}

    partition.leader_epoch = 2  # type: ignore[misc]  # it led again, in a new epoch
    writes = len(persister.writes)
    assert await m.acknowledge("g", "m", {(TOPIC, 0): [AckBatch(5, 9, [1])]}) == {
        (TOPIC, 0): (ErrorCode.NOT_LEADER_OR_FOLLOWER, None)}
    assert len(persister.writes) == writes and not m.entries  # nothing written in the old epoch
    persister.state = ShareGroupOffset(start_offset=5, state_epoch=0, state_batches=())
    assert [(a.first_offset, a.last_offset) for a in (await share_fetch()).acquired] == [(5, 19)]

    partition.is_leader = False  # type: ignore[misc]  # a follower now: its locks are not its own
    m.leadership_changed(TOPIC, 0)
    assert not m.entries
    assert await m.acknowledge("g", "m", {(TOPIC, 0): [AckBatch(5, 9, [1])]}) == {
        (TOPIC, 0): (ErrorCode.NOT_LEADER_OR_FOLLOWER, None)}
    await m.stop()
