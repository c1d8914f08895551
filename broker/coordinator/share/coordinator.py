"""The share coordinator service: share-partition states in `__share_group_state`, on the runtime.

The persister of the share-partition engine (broker/share/) and of the group coordinator (state
initialization and deletion) calls this. A share-partition `(group, topic id, partition)` lives on
the partition `partition_for("group:topicId:partition")` (Kafka's SharePartitionKey coordinator
key, the topic id in Kafka's base64 form), as FindCoordinator with key type 2 reports.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.coordinator.result import CoordinatorResult
from broker.coordinator.runtime import CoordinatorRuntime, PartitionWriter
from broker.coordinator.share.records import ShareKey
from broker.coordinator.share.shard import PartitionExists, ShareCoordinatorShard, WriteState
from broker.coordinator.share.state import ShareGroupOffset
from broker.coordinator.timer import Clock, Timer
from broker.metadata.image import SHARE_STATE_TOPIC
from broker.observability.logger import get_logger
from protocol.errors import KafkaError

log = get_logger("broker.coordinator.share")


# the broker properties the share coordinator reads
CONFIG_KEYS = (
    "share.coordinator.state.topic.num.partitions", "share.coordinator.snapshot.update.records.per.snapshot",
    "share.coordinator.state.topic.segment.bytes", "share.coordinator.state.topic.prune.interval.ms",
)


@dataclass(frozen=True)
class ShareCoordinatorConfig:
    num_partitions: int = 50  # share.coordinator.state.topic.num.partitions
    snapshot_update_records_per_snapshot: int = 500  # share.coordinator.snapshot.update.records.per.snapshot
    segment_bytes: int = 104857600  # share.coordinator.state.topic.segment.bytes
    prune_interval_ms: int = 300000  # share.coordinator.state.topic.prune.interval.ms

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> ShareCoordinatorConfig:
        d = cls()

        def get(name: str, default: int) -> int:
            raw = values.get(name)
            return default if raw is None else int(raw)

        return cls(
            num_partitions=get("share.coordinator.state.topic.num.partitions", d.num_partitions),
            snapshot_update_records_per_snapshot=get(
                "share.coordinator.snapshot.update.records.per.snapshot", d.snapshot_update_records_per_snapshot),
            segment_bytes=get("share.coordinator.state.topic.segment.bytes", d.segment_bytes),
            prune_interval_ms=get("share.coordinator.state.topic.prune.interval.ms", d.prune_interval_ms),
        )


def kafka_uuid(topic_id: uuid.UUID) -> str:
    """A UUID as Kafka's Uuid.toString writes it: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


def coordinator_key(key: ShareKey) -> str:
    group_id, topic_id, partition = key
    return "%s:%s:%d" % (group_id, kafka_uuid(topic_id), partition)


class ShareCoordinator:
    def __init__(self, runtime: CoordinatorRuntime[ShareCoordinatorShard], config: ShareCoordinatorConfig,
                 log_end_offset: Callable[[int], int] | None = None,
                 prune_before: Callable[[int, int], Any] | None = None) -> None:
        self.runtime = runtime
        self.config = config
        self._log_end_offset = log_end_offset
        self._prune_before = prune_before
        self._pruner: asyncio.Task[None] | None = None

    async def start(self, load: bool = True) -> None:
        """Load every partition of __share_group_state (a node of a cluster: those it leads, as it
        learns of them)."""
        if load:
            await self.runtime.load_all()
        if self._prune_before is not None and self.config.prune_interval_ms > 0:
            self._pruner = asyncio.get_running_loop().create_task(self._prune_loop())

    async def stop(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
            await asyncio.gather(self._pruner, return_exceptions=True)
        await self.runtime.close()

    def partition_for(self, key: ShareKey) -> int:
        return self.runtime.partition_for(coordinator_key(key))

    # ----- the persister ------------------------------------------------------------------
    async def write_state(self, write: WriteState, require_state: bool = False) -> None:
        """Make the write durable; raises KafkaError (fencing, unknown partition, storage;
        `require_state`: INVALID_REQUEST for a share-partition without state, as Kafka)."""
        await self.runtime.write(self.partition_for(write.key),
                                 lambda s, now: s.write_state(write, now, require_state), "write-state")

    async def read_state(self, key: ShareKey) -> ShareGroupOffset | None:
        result: ShareGroupOffset | None = await self.runtime.read_now(
            self.partition_for(key), lambda s: s.read_state(key), "read-state")
        return result

    async def read_for_leader(self, key: ShareKey, leader_epoch: int) -> ShareGroupOffset:
        """ReadShareGroupState: the state as the leader of `leader_epoch` reads it (a newer epoch
        is recorded first, an older one fenced; INVALID_REQUEST without state). A write, as in
        Kafka, so that the epoch it records is durable before the state is answered."""
        result: ShareGroupOffset = await self.runtime.write(
            self.partition_for(key), lambda s, now: s.read_for_leader(key, leader_epoch, now), "read-state-for-leader")
        return result

    async def read_summary(self, key: ShareKey) -> ShareGroupOffset:
        """ReadShareGroupStateSummary: start offset, epochs and delivery-complete count (Kafka's
        defaults for a share-partition without state)."""
        result: ShareGroupOffset = await self.runtime.read_now(
            self.partition_for(key), lambda s: s.read_summary(key), "read-state-summary")
        return result

    async def initialize_state(self, key: ShareKey, state_epoch: int, start_offset: int) -> None:
        await self.runtime.write(self.partition_for(key),
                                 lambda s, now: s.initialize_state(key, state_epoch, start_offset, now),
                                 "initialize-state")

    async def delete_state(self, keys: list[ShareKey], require_partition: bool = False) -> None:
        """Tombstones for the keys that have state (`require_partition`: UNKNOWN_TOPIC_OR_PARTITION
        when a key's partition is not in the metadata, as Kafka's DeleteShareGroupState)."""
        by_partition: dict[int, list[ShareKey]] = {}
        for key in keys:
            by_partition.setdefault(self.partition_for(key), []).append(key)
        def delete(keys: list[ShareKey]) -> Callable[[ShareCoordinatorShard, int], CoordinatorResult[Any]]:
            return lambda shard, now: shard.delete_state(keys, require_partition)

        await asyncio.gather(*(self.runtime.write(p, delete(ks), "delete-state") for p, ks in by_partition.items()))

    async def group_keys(self, group_id: str) -> list[ShareKey]:
        """Every share-partition of the group that has state (from all partitions)."""
        return await self._keys(lambda k: k[0] == group_id)

    async def topic_keys(self, topic_id: uuid.UUID) -> list[ShareKey]:
        """Every share-partition of the topic that has state, of any group."""
        return await self._keys(lambda k: k[1] == topic_id)

    async def _keys(self, select: Callable[[ShareKey], bool]) -> list[ShareKey]:
        async def one(p: int) -> list[ShareKey]:
            try:
                keys: list[ShareKey] = await self.runtime.read_now(
                    p, lambda s: [k for k in s.states if select(k)], "share-keys")
                return keys
            except KafkaError:
                return []

        parts = await asyncio.gather(*(one(p) for p in self.runtime.active_partitions()))
        return [k for part in parts for k in part]

    # ----- pruning ------------------------------------------------------------------------
    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.prune_interval_ms / 1000.0)
            for p in self.runtime.active_partitions():
                try:
                    await self.prune(p)
                except Exception:
                    log.exception("pruning the share state failed", partition=p)

    async def prune(self, partition: int) -> bool:
        """Snapshot every share-partition of `partition` and drop the records before those
        snapshots, when enough records piled up since the last time (a snapshot per key, at least
        as many records again as there are keys). Returns whether it pruned."""
        if self._log_end_offset is None or self._prune_before is None:
            return False
        shard = self.runtime.shard(partition)
        if shard.records_since_prune < max(2 * len(shard.states), 100):
            return False
        boundary = self._log_end_offset(partition)

        def snapshot_all(s: ShareCoordinatorShard, now: int) -> CoordinatorResult[Any]:
            s.records_since_prune = 0
            return s.snapshot_all(now)

        written = await self.runtime.write(partition, snapshot_all, "prune")
        self._prune_before(partition, boundary)
        log.info("pruned the share state", partition=partition, log_start_offset=boundary, snapshots=written)
        return True


def create_share_coordinator(
    writer: PartitionWriter, config_values: Mapping[str, Any], clock: Clock,
    partition_exists: PartitionExists | None = None,
    log_end_offset: Callable[[int], int] | None = None,
    prune_before: Callable[[int, int], Any] | None = None,
) -> ShareCoordinator:
    """A share coordinator over `writer` (one log per __share_group_state partition)."""
    config = ShareCoordinatorConfig.from_values(config_values)

    def shard_factory(partition: int, timer: Timer) -> ShareCoordinatorShard:
        return ShareCoordinatorShard(config.snapshot_update_records_per_snapshot, partition_exists)

    runtime: CoordinatorRuntime[ShareCoordinatorShard] = CoordinatorRuntime(
        writer, shard_factory, config.num_partitions, clock, name="share-coordinator")
    return ShareCoordinator(runtime, config, log_end_offset, prune_before)


__all__ = [
    "SHARE_STATE_TOPIC", "ShareCoordinator", "ShareCoordinatorConfig", "coordinator_key", "create_share_coordinator",
    "kafka_uuid",
]
