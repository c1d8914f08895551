"""What the share-partition manager (manager.py) works with and gives: the persister it writes
through (the share coordinator, maybe another node's), the partition it reads, a share group's
settings, a partition's part of a ShareFetch answer and the counts of what the engines did. Kept
apart from the manager, below it, so that its users (the APIs, the metrics, the settings) need
only these."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from broker.coordinator.share.records import ShareKey
from broker.coordinator.share.shard import WriteState
from broker.coordinator.share.state import ShareGroupOffset
from broker.log import TimestampAndOffset
from broker.log.segment import FileSlice
from broker.log.txn_index import AbortedTxn
from broker.share.engine import AcquiredRecords, ShareSettings
from protocol.errors import ErrorCode

READ_UNCOMMITTED, READ_COMMITTED = 0, 1


class Persister(Protocol):
    async def read_state(self, key: ShareKey) -> ShareGroupOffset | None: ...

    async def write_state(self, write: WriteState) -> None: ...


@runtime_checkable
class LeaderPersister(Protocol):
    """A persister that reads as Kafka's SharePartition does, naming its leader epoch (recorded
    when newer, fenced when older): broker/share/persister.py's."""

    async def read_state_as_leader(self, key: ShareKey, leader_epoch: int) -> ShareGroupOffset | None: ...


class LogRead(Protocol):
    """What a partition's read gives (broker.log.FetchDataInfo): whole log batches."""

    @property
    def records(self) -> FileSlice | bytes: ...


class PartitionLike(Protocol):
    """What the manager needs of a broker Partition (broker.partition.Partition)."""

    deleted: bool

    @property
    def leader_epoch(self) -> int: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...

    def fetch_bound(self, isolation_level: int) -> int: ...

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]: ...

    def read(self, offset: int, max_bytes: int, isolation_level: int, min_one_message: bool = True) -> LogRead: ...

    def offset_for_timestamp(self, timestamp: int) -> TimestampAndOffset | None: ...

    def add_waiter(self, waiter: asyncio.Future[None]) -> None: ...

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None: ...


@dataclass
class ShareGroupSettings:
    """A share group's settings (group configs over the broker's)."""

    engine: ShareSettings = field(default_factory=ShareSettings)
    auto_offset_reset: str = "latest"  # share.auto.offset.reset
    isolation_level: int = READ_UNCOMMITTED  # share.isolation.level


@dataclass
class PartitionResult:
    """A partition's part of a ShareFetch response."""

    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    records: FileSlice | bytes = b""  # whole log batches: a FileSlice is sent as a Fetch sends it
    acquired: list[AcquiredRecords] = field(default_factory=list)


@dataclass
class ShareMetrics:
    """Counts of what the engines did (broker/observability/metrics.py reads them)."""

    acquired: int = 0  # records handed out
    redelivered: int = 0  # ... of which not for the first time
    acknowledged: int = 0
    released: int = 0
    rejected: int = 0
    lock_expired: int = 0  # records whose acquisition lock ran out
    archived: int = 0  # records that ran out of deliveries or were rejected (incl. those sent to a DLQ)
    dead_lettered: int = 0  # records written to a dead-letter topic
    dead_letter_failed: int = 0  # records archived without reaching their dead-letter topic
