"""Partitions: a log, its high watermark, producer state, and the fetch requests waiting on it.

Appends run on the event loop thread without awaiting between the producer-state check and the
write, so each partition has exactly one writer at a time; the data reaches the OS before the
produce is acknowledged (it survives the death of the process), and when the flush policy asks
for an fsync, concurrent appenders share one (GroupCommit). Single node: the high watermark is
the log end offset once the write returns, and the last stable offset equals it (there are no
transactions yet).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from broker.log import AppendResult, FetchDataInfo, Log, LogConfig, LogManager
from broker.log.group_commit import GroupCommit
from broker.producer_state import ProducerStateManager
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.records import (
    BatchHeader,
    iter_batches,
    validate_batch,
)

READ_UNCOMMITTED = 0
READ_COMMITTED = 1


@dataclass(frozen=True)
class ProduceResult:
    base_offset: int
    log_append_time: int
    log_start_offset: int


class Partition:
    def __init__(self, topic: str, index: int, topic_id: uuid.UUID, log: Log) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.log = log
        self.producers = ProducerStateManager()
        self.deleted = False  # its topic was deleted: readers holding it must let go
        if log.epoch_cache.latest_epoch is None:
            # as Kafka does on becoming leader: the epoch starts here, so OffsetForLeaderEpoch
            # answers the log end offset even for a partition that never had data (derived again
            # at every start, so not worth an fsync per new partition)
            log.epoch_cache.assign(log.leader_epoch, log.log_start_offset)
        self.group_commit = GroupCommit(log.flush, log.recovery_point)
        self._waiters: set[asyncio.Future[None]] = set()

    def __repr__(self) -> str:
        return "Partition(%s-%d)" % (self.topic, self.index)

    @property
    def leader_epoch(self) -> int:
        return self.log.leader_epoch

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        return self.high_watermark

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    # writes ------------------------------------------------------------------------------------
    def append_records(self, records: Any) -> ProduceResult:
        """Validate producer state, append, update state and wake fetchers (synchronous)."""
        try:
            batches = list(iter_batches(records, strict=True))
            headers = [h for _, h in batches]
            if any(h.producer_id >= 0 for h in headers):
                # a corrupt batch is reported as such, not judged by the sequence it seems to carry
                for pos, _ in batches:
                    validate_batch(records, pos)
        except ProtocolError as exc:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from None
        for header in headers:
            duplicate = self.producers.check(header)
            if duplicate is not None:
                return ProduceResult(duplicate.first_offset, -1, self.log.log_start_offset)
        result: AppendResult = self.log.append(records)
        offset = result.first_offset
        for header in headers:
            if header.producer_id >= 0:
                self.producers.update(header._replace(base_offset=offset))
            offset += header.last_offset_delta + 1
        self.notify()
        return ProduceResult(result.first_offset, result.log_append_time, result.log_start_offset)

    async def append(self, records: Any) -> ProduceResult:
        """Append and return once the write is durable under the flush policy."""
        result = self.append_records(records)
        if self.log.needs_flush():
            await self.group_commit.commit(self.log.log_end_offset)
        return result

    # reads -------------------------------------------------------------------------------------
    def fetch_bound(self, isolation_level: int) -> int:
        return self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark

    def read(self, offset: int, max_bytes: int, isolation_level: int, min_one_message: bool = True) -> FetchDataInfo:
        return self.log.read(offset, max_bytes, self.fetch_bound(isolation_level), min_one_message)

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.add(waiter)

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def notify(self) -> None:
        if self._waiters:
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._waiters.clear()

    # startup -----------------------------------------------------------------------------------
    def rebuild_producer_state(self) -> None:
        self.producers.rebuild(scan_batch_headers(self.log))


def scan_batch_headers(log: Log) -> Iterator[BatchHeader]:
    """Every batch header of the log (headers only: no per-record work, no CRC)."""
    for segment in log.segments:
        for _, header in segment.iter_batches_from(0):
            yield header


class PartitionManager:
    """All partitions of this broker, created from the metadata image."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.partitions: dict[tuple[str, int], Partition] = {}

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def ensure(self, topic: str, index: int, topic_id: uuid.UUID, config: LogConfig | None = None) -> Partition:
        partition = self.partitions.get((topic, index))
        if partition is None:
            log = self.logs.get_or_create_log(topic, index, config)
            partition = Partition(topic, index, topic_id, log)
            partition.rebuild_producer_state()
            self.partitions[(topic, index)] = partition
        return partition

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> None:
        """producer.id.expiration.ms: forget idempotent producers idle that long."""
        for partition in self.partitions.values():
            partition.producers.remove_expired(now_ms, expiration_ms)

    def wake_all(self) -> None:
        """Wake every waiting fetch (shutdown)."""
        for partition in self.partitions.values():
            partition.notify()

    async def remove_topic(self, topic: str) -> None:
        """Forget the topic's partitions and wake their fetchers (here, on the event loop), then
        delete their logs from disk (in a worker thread)."""
        removed = [k for k in self.partitions if k[0] == topic]
        for key in removed:
            partition = self.partitions.pop(key)
            partition.deleted = True
            partition.notify()
        await asyncio.to_thread(self._delete_logs, removed)

    def _delete_logs(self, keys: list[tuple[str, int]]) -> None:
        for topic, index in keys:
            self.logs.delete_log(topic, index)
