"""The share-partition manager reads from the log what the acquisition can use: a window that grows
until it holds the records wanted (or the log's end), never MaxBytes of log for a few records."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from broker.coordinator.share.records import ShareKey
from broker.coordinator.share.shard import WriteState
from broker.coordinator.share.state import ShareGroupOffset
from broker.coordinator.timer import ManualClock
from broker.share.manager import READ_WINDOW, ShareGroupSettings, SharePartitionManager
from protocol.records import build_batch

TOPIC = uuid.uuid4()
VALUE = b"x" * 1024


class Persister:
    async def read_state(self, key: ShareKey) -> ShareGroupOffset | None:
        return None

    async def write_state(self, write: WriteState) -> None:
        return None


class Read:
    def __init__(self, records: bytes) -> None:
        self.records = records


class LogPartition:
    """A partition of `batches` batches of 10 records of 1 KB, reads recorded."""

    leader_epoch = 0
    deleted = False
    log_start_offset = 0

    def __init__(self, batches: int) -> None:
        self.batches = [build_batch([(None, VALUE)] * 10, base_offset=10 * i) for i in range(batches)]
        self.high_watermark = 10 * batches
        self.reads: list[int] = []

    def fetch_bound(self, isolation_level: int) -> int:
        return self.high_watermark

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[Any]:
        return []

    def read(self, offset: int, max_bytes: int, isolation_level: int, min_one_message: bool = True) -> Read:
        self.reads.append(max_bytes)
        out = b""
        for b in self.batches[offset // 10:]:
            if out and len(out) + len(b) > max_bytes:
                break
            out += b
        return Read(out)

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        pass

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        pass


def manager(partition: LogPartition) -> SharePartitionManager:
    return SharePartitionManager(Persister(), lambda topic_id, index: partition,
                                 lambda group_id: ShareGroupSettings(auto_offset_reset="earliest"), ManualClock())


async def fetch(m: SharePartitionManager, max_records: int) -> list[tuple[int, int]]:
    result = await m.fetch("g", "m", [(TOPIC, 0)], max_wait_ms=0, min_bytes=1, max_bytes=50 << 20,
                           max_records=max_records, batch_size=max_records, record_limit=False)
    return [(a.first_offset, a.last_offset) for a in result[(TOPIC, 0)].acquired]


async def test_a_fetch_of_a_few_records_reads_one_window() -> None:
    partition = LogPartition(batches=300)  # about 3 MB
    m = manager(partition)
    assert await fetch(m, 100) == [(0, 99)]
    assert partition.reads == [READ_WINDOW]
    await m.stop()


async def test_the_window_grows_until_it_holds_the_records_wanted_or_the_log_end() -> None:
    partition = LogPartition(batches=300)
    m = manager(partition)
    assert await fetch(m, 1500) == [(0, 1499)]  # 1.5 MB of records: a second, larger read
    assert partition.reads == [READ_WINDOW, 8 * READ_WINDOW]
    partition.reads.clear()
    assert await fetch(m, 500) == [(1500, 1999)]  # at the 2,000 record locks cap
    assert partition.reads == [READ_WINDOW]
    await m.stop()
