"""The active controller of a cluster: one node at a time, chosen through etcd (election.py).

While it holds the term it is the only writer of the metadata log: every metadata change of the
cluster is made here (CreateTopics and the other forwardable admin requests, which the other
nodes forward; broker registrations and heartbeats; producer-id blocks) and answered once its
records are durable in etcd (`ControllerLog.sync`). On winning it first replays the log up to its
end, gives every registered broker a fresh session and, on a new cluster, finalizes the features.
A timer fences the brokers whose sessions ran out (brokers.py). Partition leaderships and ISRs
change here only (elections.py): AlterPartition from partition leaders, ElectLeaders, and every
`leader.imbalance.check.interval.seconds` the preferred leaders back (auto.leader.rebalance.enable)
and unclean elections of leaderless partitions whose topic allows them. Behind its appends it writes a
snapshot of the image to etcd every `metadata.log.max.snapshot.interval.records` records and
deletes the log behind it, so etcd stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.cluster import brokers, elections, reassignment
from broker.cluster.keys import Leadership
from broker.cluster.metadata_log import MetadataLog, Snapshot
from broker.cluster.metadata_sync import ControllerLog, MetadataLoader, not_controller
from broker.cluster.snapshot import image_records
from broker.metadata import PRODUCER_ID_BLOCK, MetadataStore
from broker.metadata.features import SUPPORTED
from broker.observability.logger import get_logger
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.cluster")


@dataclass(frozen=True)
class ControllerSettings:
    cluster_id: str
    session_timeout_ms: int = 9000  # broker.session.timeout.ms
    heartbeat_interval_ms: int = 2000  # broker.heartbeat.interval.ms
    snapshot_bytes: int = 20 * 1024 * 1024  # metadata.log.max.record.bytes.between.snapshots
    static_min_insync_replicas: int = 1
    catch_up_timeout_s: float = 30.0
    static_unclean_leader_election: bool = False  # unclean.leader.election.enable
    auto_leader_rebalance: bool = True  # auto.leader.rebalance.enable
    leader_imbalance_check_interval_ms: int = 300_000  # leader.imbalance.check.interval.seconds


MAX_ELECTIONS_PER_IMBALANCE = 1000  # partition changes per balancing round, as Kafka's
UNCLEAN_CHECK_INTERVAL_MS = 300_000  # how often leaderless partitions are offered an unclean election (Kafka's)


def supported_levels() -> dict[str, tuple[int, int]]:
    return {name: (spec.min_level, spec.max_level) for name, spec in SUPPORTED.items()}


class ActiveController:
    def __init__(self, node_id: int, store: MetadataStore, clog: ControllerLog, loader: MetadataLoader,
                 mlog: MetadataLog, settings: ControllerSettings, clock_ms: Callable[[], int]) -> None:
        self.node_id = node_id
        self.store = store
        self.clog = clog
        self.loader = loader
        self.mlog = mlog
        self.settings = settings
        self.clock_ms = clock_ms
        self.heartbeats = brokers.Heartbeats()
        self.leadership: Leadership | None = None  # while active
        self._active = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._lock = asyncio.Lock()  # one change at a time: validated against the image of the last
        self._snapshot_at = 0

    @property
    def active(self) -> bool:
        return self._active.is_set()

    # the term ----------------------------------------------------------------------------------
    async def become_active(self, leadership: Leadership) -> None:
        """This node won the election: catch up with the log, then serve as the controller."""
        self.leadership = leadership
        try:
            end = await self.mlog.end_offset()
            await self.loader.wait_for_offset(end, self.settings.catch_up_timeout_s)
        except (Exception, asyncio.CancelledError):
            self.leadership = None
            raise
        if self.leadership != leadership:
            return  # lost meanwhile
        self.heartbeats.start_all(self.store.image, self.clock_ms())
        self.clog.leadership = leadership
        self._snapshot_at = self.clog.appended_bytes
        self._active.set()
        log.info("active controller", node_id=self.node_id, epoch=leadership.epoch, offset=end)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._fence_expired(), name="controller-fencing"),
                       loop.create_task(self._balance(), name="controller-leader-balance")]
        async with self._lock:
            if self.store.bootstrap(self.settings.static_min_insync_replicas):
                await self.clog.sync()

    def resign(self) -> None:
        """The term ended (lost, or the node stops)."""
        if self.leadership is not None:
            log.info("no longer the active controller", node_id=self.node_id, epoch=self.leadership.epoch)
        self.leadership = None
        self.clog.leadership = None
        self._active.clear()
        for task in self._tasks:
            task.cancel()
        self._tasks = []

    async def stop(self) -> None:
        tasks = list(self._tasks)
        self.resign()  # cancels them
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _check_active(self) -> None:
        if not self.active:
            raise not_controller("This node is not the active controller.")

    # changes -----------------------------------------------------------------------------------
    async def change(self, make: Callable[[], Any]) -> Any:
        """Run `make` (which validates against the image and commits records through the store)
        and answer once its records are durable; one change at a time."""
        self._check_active()
        async with self._lock:
            self._check_active()
            result = make()
            await self.clog.sync()
        await self._maybe_snapshot()
        return result

    async def register(self, request: Any) -> Any:
        def make() -> Any:
            if request.broker_id == self.node_id:
                # this very process: an older incarnation of it is dead, however fresh its session
                self.heartbeats.last.pop(self.node_id, None)
            outcome = brokers.register(self.store.image, self.heartbeats, request, self.settings.cluster_id,
                                       self.store.image.records, self.clock_ms(), self.settings.session_timeout_ms,
                                       supported_levels(), self.policy)
            self.store.append_records(outcome.records)
            log.info("broker registered", broker_id=request.broker_id, broker_epoch=outcome.response.broker_epoch)
            return outcome.response

        return await self.change(make)

    async def heartbeat(self, request: Any) -> Any:
        def make() -> Any:
            outcome = brokers.heartbeat(self.store.image, self.heartbeats, request, self.clock_ms(), self.policy)
            self.store.append_records(outcome.records)
            if outcome.records:
                log.info("broker state changed", broker_id=request.broker_id, fenced=outcome.response.is_fenced,
                         shutting_down=outcome.response.should_shut_down)
            return outcome.response

        return await self.change(make)

    @property
    def policy(self) -> elections.Policy:
        return elections.Policy(self.node_id, self.settings.static_min_insync_replicas,
                                self.settings.static_unclean_leader_election)

    async def alter_partition(self, request: Any, version: int) -> Any:
        """AlterPartition from a partition leader: its ISR changes, answered once durable."""
        def make() -> Any:
            changes = elections.Changes(self.store.image, self.policy)
            response = elections.alter_partition(changes, request, version)
            self.store.append_records(changes.records)
            if changes.records:
                log.info("partition ISRs changed", broker_id=request.broker_id, partitions=len(changes.records))
            return response

        return await self.change(make)

    async def elect_leaders(self, election_type: int, topic_partitions: list[tuple[str, list[int]]] | None
                            ) -> list[tuple[str, list[tuple[int, ErrorCode, str | None]]]]:
        """ElectLeaders (PREFERRED 0, UNCLEAN 1): per topic, each partition's (index, error,
        message); None asks for every partition, and those needing no election are left out."""
        def make() -> Any:
            changes = elections.Changes(self.store.image, self.policy)
            results: list[tuple[str, list[tuple[int, ErrorCode, str | None]]]] = []
            if topic_partitions is None:
                for name, info in sorted(self.store.image.topics.items()):
                    found = [(p, *elections.elect_leader(changes, name, p, election_type))
                             for p in sorted(info.assignments)]
                    results.append((name, [r for r in found if r[1] is not ErrorCode.ELECTION_NOT_NEEDED]))
            else:
                for name, indexes in topic_partitions:
                    results.append((name, [(p, *elections.elect_leader(changes, name, p, election_type))
                                           for p in indexes]))
            self.store.append_records(changes.records)
            return results

        return await self.change(make)  # type: ignore[no-any-return]

    async def alter_partition_reassignments(self, asked: list[tuple[str, int, list[int] | None]],
                                            allow_replication_factor_change: bool) -> list[reassignment.Result]:
        """AlterPartitionReassignments: each partition's (error, message), in the order asked."""
        def make() -> Any:
            changes = elections.Changes(self.store.image, self.policy)
            results = [reassignment.reassign(changes, name, index, target, allow_replication_factor_change)
                       for name, index, target in asked]
            self.store.append_records(changes.records)
            if changes.records:
                log.info("partition reassignments changed", partitions=len(changes.records))
            return results

        return await self.change(make)  # type: ignore[no-any-return]

    async def allocate_producer_ids(self, request: Any) -> Any:
        def make() -> Any:
            found = self.store.image.brokers.get(request.broker_id)
            if found is None or found.epoch != request.broker_epoch:
                raise KafkaError(ErrorCode.STALE_BROKER_EPOCH, "Unexpected broker epoch %d of broker %d"
                                 % (request.broker_epoch, request.broker_id))
            start = self.store.image.next_producer_id
            self.store.append_records([M.ProducerIdsRecord(broker_id=request.broker_id,
                                                           broker_epoch=request.broker_epoch,
                                                           next_producer_id=start + PRODUCER_ID_BLOCK)])
            return M.AllocateProducerIdsResponse(error_code=0, producer_id_start=start,
                                                 producer_id_len=PRODUCER_ID_BLOCK)

        return await self.change(make)

    # timers -------------------------------------------------------------------------------------
    async def _fence_expired(self) -> None:
        period = max(0.05, min(self.settings.heartbeat_interval_ms, self.settings.session_timeout_ms) / 4000.0)
        while True:
            await asyncio.sleep(period)
            expired = self.heartbeats.expired(self.store.image, self.clock_ms(), self.settings.session_timeout_ms)
            if not expired:
                continue
            def fence(ids: list[int] = expired) -> None:
                self.store.append_records(brokers.fence(self.store.image, ids, self.policy))

            try:
                await self.change(fence)
                log.warning("brokers fenced: no heartbeat within the session timeout", brokers=expired,
                            session_timeout_ms=self.settings.session_timeout_ms)
            except KafkaError as exc:
                log.warning("brokers not fenced", brokers=expired, error=exc.message)

    async def _balance(self) -> None:
        """Preferred leaders back (auto.leader.rebalance.enable) every check interval, and unclean
        elections for leaderless partitions of topics that allow them; a round that made the
        most changes it may is followed by another at once, as Kafka's."""
        interval_ms = max(50, self.settings.leader_imbalance_check_interval_ms)
        next_unclean = self.clock_ms() + UNCLEAN_CHECK_INTERVAL_MS
        while True:
            await asyncio.sleep(interval_ms / 1000.0)
            more = True
            while more:
                now = self.clock_ms()
                unclean = now >= next_unclean
                if unclean:
                    next_unclean = now + UNCLEAN_CHECK_INTERVAL_MS

                def make(unclean: bool = unclean) -> int:
                    changes = elections.Changes(self.store.image, self.policy)
                    if self.settings.auto_leader_rebalance:
                        changes.preferred(MAX_ELECTIONS_PER_IMBALANCE)
                    if unclean:
                        changes.unclean_leaderless(MAX_ELECTIONS_PER_IMBALANCE)
                    self.store.append_records(changes.records)
                    return len(changes.records)

                try:
                    made = await self.change(make)
                except KafkaError as exc:
                    log.warning("leader balancing not done", error=exc.message)
                    break
                if made:
                    log.info("partition leaders balanced", changes=made)
                more = made >= MAX_ELECTIONS_PER_IMBALANCE

    async def _maybe_snapshot(self) -> None:
        leadership = self.leadership
        image = self.store.image
        if leadership is None or self.clog.appended_bytes - self._snapshot_at < self.settings.snapshot_bytes:
            return
        self._snapshot_at = self.clog.appended_bytes
        try:
            await self.mlog.write_snapshot(leadership, Snapshot(image.records, leadership.epoch, image_records(image)))
            await self.mlog.delete_behind(leadership, image.records)
            log.info("metadata snapshot written to etcd", end_offset=image.records)
        except Exception as exc:  # the log simply grows until the next try
            log.warning("metadata snapshot not written", error=repr(exc))
