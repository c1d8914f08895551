"""The broker's partitions, created from the metadata image: where each one's log comes from
(the LogManager), what each needs to lead followers in cluster mode, and the work done across all
of them (expired producers, ISR shrinks, producer snapshots at shutdown, a deleted topic)."""

from __future__ import annotations

import asyncio
import uuid

from broker.log import LogConfig, LogManager
from broker.partition.partition import REPLICA_LAG_TIME_MAX_MS, AlterPartitionSubmitter, Partition
from broker.partition.replica import BrokerStatuses


class PartitionManager:
    """All partitions of this broker, created from the metadata image."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.partitions: dict[tuple[str, int], Partition] = {}
        # what each partition needs to lead followers (cluster mode sets them)
        self.local_id = -1
        self.replica_lag_time_max_ms = REPLICA_LAG_TIME_MAX_MS
        self.broker_statuses: BrokerStatuses | None = None
        self.alter_partition: AlterPartitionSubmitter | None = None

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def ensure(self, topic: str, index: int, topic_id: uuid.UUID, config: LogConfig | None = None) -> Partition:
        partition = self.partitions.get((topic, index))
        if partition is None:
            log = self.logs.get_or_create_log(topic, index, config)
            partition = Partition(topic, index, topic_id, log,
                                  self.logs.checkpointed_high_watermarks.get((topic, index), 0))
            partition.local_id, partition.replica_lag_time_max_ms = self.local_id, self.replica_lag_time_max_ms
            partition.broker_statuses, partition.alter_partition = self.broker_statuses, self.alter_partition
            partition.rebuild_producer_state()
            log.release_handles()  # the scan opened every segment: a broker start must not keep them
            self.partitions[(topic, index)] = partition
        return partition

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> None:
        """producer.id.expiration.ms: forget idempotent producers idle that long."""
        for partition in self.partitions.values():
            partition.producers.remove_expired(now_ms, expiration_ms)

    def high_watermark_of(self, tp: tuple[str, int]) -> int | None:
        """For replication-offset-checkpoint: a replicated partition's high watermark."""
        partition = self.partitions.get(tp)
        return None if partition is None or partition.deleted else partition.high_watermark

    def maybe_shrink_isrs(self) -> None:
        """Kafka's isr-expiration task: each partition led with followers drops the lagging ones."""
        for partition in list(self.partitions.values()):
            if partition.followers is not None and not partition.deleted:
                partition.maybe_shrink_isr()

    def take_snapshots(self) -> None:
        """Clean shutdown: a producer snapshot at the log end of every partition, so that the
        next start replays nothing (blocking: nothing may append meanwhile)."""
        for partition in self.partitions.values():
            if not partition.deleted and not partition.log.closed:
                partition.take_snapshot()

    def wake_all(self) -> None:
        """Wake every waiting fetch (shutdown)."""
        for partition in self.partitions.values():
            partition.notify()

    async def remove_topic(self, topic: str) -> None:
        await self.remove([k for k in self.partitions if k[0] == topic])

    async def remove(self, keys: list[tuple[str, int]]) -> None:
        """Forget these partitions and wake their fetchers (here, on the event loop), then delete
        their logs from disk (in a worker thread)."""
        removed = [k for k in keys if k in self.partitions]
        for key in removed:
            partition = self.partitions.pop(key)
            partition.deleted = True
            partition.notify()
        await asyncio.to_thread(self._delete_logs, removed)

    def _delete_logs(self, keys: list[tuple[str, int]]) -> None:
        for topic, index in keys:
            self.logs.delete_log(topic, index)
