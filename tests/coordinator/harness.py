"""Drive a coordinator shard without the runtime (ShardDriver; ShardHarness for a
GroupCoordinatorShard): operations run synchronously, records go to an in-memory log, timers fire
on a manual clock (each expiry's operation runs before the next timer fires)."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.membership import RequestInfo
from broker.coordinator.group.shard import GroupCoordinatorShard
from broker.coordinator.group.subscription import encode_subscription
from broker.coordinator.result import (
    CoordinatorResult,
    Deferred,
    LoggedItem,
    TransactionalRecord,
    TxnMarker,
)
from broker.coordinator.timer import CoordinatorTimer, ManualClock, Op
from protocol import messages as M
from protocol.errors import ErrorCode

START_MS = 1_700_000_000_000
E = ErrorCode

TEST_CONFIG = GroupCoordinatorConfig(num_partitions=1, initial_rebalance_delay_ms=3000, classic_min_initial_delay_ms=0)


def sub(*topics: str) -> bytes:
    return encode_subscription(list(topics))


class ShardDriver:
    """A shard's operations run as the runtime runs them, but at once: the result's records are
    replayed (when it says so) and logged, then its on_durable runs; timers fire on a manual clock
    and their operations run as it advances. Subclasses make `shard`."""

    shard: Any

    def __init__(self, start_ms: int) -> None:
        self.clock = ManualClock(start_ms)
        self.queue: deque[Op] = deque()
        self.timer = CoordinatorTimer(self.clock, self.queue.append)
        self.log: list[LoggedItem] = []

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    def run(self, op: Op) -> CoordinatorResult[Any]:
        result = op(self.shard, self.now)
        if result.producer is not None:  # a transactional producer's batch: logged as such
            assert not result.replay
            self.log.extend(TransactionalRecord(result.producer[0], k, v) for k, v in result.records)
        else:
            if result.replay:
                for key, value in result.records:
                    self.shard.replay(key, value)
            self.log.extend(result.records)
        if result.marker is not None:
            assert not result.replay
            self.log.append(result.marker)
        if result.on_durable is not None:
            result.on_durable()
        return result

    def call(self, op: Op) -> Any:
        """Run `op` and return its response."""
        return self.run(op).response

    def _drain(self) -> None:
        while self.queue:
            self.run(self.queue.popleft())

    def advance(self, ms: int) -> None:
        self.clock.advance(ms, on_fire=self._drain)
        self._drain()


class ShardHarness(ShardDriver):
    def __init__(self, config: GroupCoordinatorConfig = TEST_CONFIG, start_ms: int = START_MS,
                 log: list[LoggedItem] | None = None) -> None:
        super().__init__(start_ms)
        self.config = config
        self.shard = self._make_shard(config)
        if log is not None:
            for item in log:
                if isinstance(item, TransactionalRecord):
                    self.shard.replay_transactional(item.producer_id, item.key, item.value)
                elif isinstance(item, TxnMarker):
                    self.shard.replay_end_transaction(item.producer_id, item.committed)
                else:
                    self.shard.replay(item[0], item[1])
            self.log = list(log)
        self.shard.on_loaded(self.now)

    def _make_shard(self, config: GroupCoordinatorConfig) -> GroupCoordinatorShard:
        ids = itertools.count()
        return GroupCoordinatorShard(self.timer, config, new_uuid=lambda: "u%d" % next(ids))

    def reload(self) -> ShardHarness:
        """A fresh shard loaded from this one's log, at the same time."""
        return ShardHarness(self.config, self.now, self.log)

    def group(self, group_id: str) -> Any:
        return self.shard.groups[group_id]

    # ----- requests -----------------------------------------------------------------------
    def join(self, group_id: str, member_id: str = "", *, instance: str | None = None,
             protocols: list[tuple[str, bytes]] | None = None, protocol_type: str = "consumer",
             session_ms: int = 10000, rebalance_ms: int = 30000, version: int = 5,
             client_id: str = "client") -> Deferred[Any]:
        request = M.JoinGroupRequest(
            group_id=group_id, session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms, member_id=member_id,
            group_instance_id=instance, protocol_type=protocol_type,
            protocols=[M.JoinGroupRequest.JoinGroupRequestProtocol(name=n, metadata=m)
                       for n, m in (protocols if protocols is not None else [("range", sub("t"))])],
        )
        info = RequestInfo(client_id=client_id, client_host="/127.0.0.1", api_version=version)
        response = self.run(lambda s, now: s.join_group(request, info, now)).response
        assert isinstance(response, Deferred)
        return response

    def join_new(self, group_id: str, **kw: Any) -> str:
        """The two-step join of a new dynamic member (MEMBER_ID_REQUIRED, then the real join);
        returns the member id (the second JoinGroup stays parked)."""
        first = self.join(group_id, **kw).result()
        assert first.error_code == E.MEMBER_ID_REQUIRED, first
        self.pending = self.join(group_id, first.member_id, **kw)
        return str(first.member_id)

    def sync(self, group_id: str, member_id: str, generation: int, *, instance: str | None = None,
             assignments: dict[str, bytes] | None = None, protocol_type: str | None = None,
             protocol_name: str | None = None) -> Deferred[Any]:
        request = M.SyncGroupRequest(
            group_id=group_id, generation_id=generation, member_id=member_id, group_instance_id=instance,
            protocol_type=protocol_type, protocol_name=protocol_name,
            assignments=[M.SyncGroupRequest.SyncGroupRequestAssignment(member_id=m, assignment=a)
                         for m, a in (assignments or {}).items()],
        )
        response = self.run(lambda s, now: s.sync_group(request, RequestInfo(), now)).response
        assert isinstance(response, Deferred)
        return response

    def heartbeat(self, group_id: str, member_id: str, generation: int, instance: str | None = None) -> int:
        request = M.HeartbeatRequest(group_id=group_id, generation_id=generation, member_id=member_id,
                                     group_instance_id=instance)
        return int(self.call(lambda s, now: s.heartbeat(request, now)).error_code)

    def leave(self, group_id: str, *members: tuple[str, str | None]) -> Any:
        identities = [M.LeaveGroupRequest.MemberIdentity(member_id=m, group_instance_id=i) for m, i in members]
        return self.call(lambda s, now: s.leave_group(group_id, identities, now))

    def commit(self, group_id: str, offsets: dict[tuple[str, int], int], *, generation: int = -1,
               member_id: str = "", instance: str | None = None, metadata: str | None = "",
               retention_ms: int = -1, version: int = 8) -> Any:
        topics: dict[str, list[Any]] = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append(M.OffsetCommitRequest.OffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                committed_metadata=metadata))
        request = M.OffsetCommitRequest(
            group_id=group_id, generation_id_or_member_epoch=generation, member_id=member_id,
            group_instance_id=instance, retention_time_ms=retention_ms,
            topics=[M.OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in topics.items()],
        )
        return self.call(lambda s, now: s.commit_offsets(request, version, now))

    def fetch(self, group_id: str, topics: dict[str, list[int]] | None = None, require_stable: bool = False) -> Any:
        request = M.OffsetFetchRequest.OffsetFetchRequestGroup(
            group_id=group_id,
            topics=None if topics is None else [
                M.OffsetFetchRequest.OffsetFetchRequestTopics(name=t, partition_indexes=ps) for t, ps in topics.items()
            ],
        )
        return self.shard.fetch_offsets(request, require_stable)

    def committed(self, group_id: str) -> dict[tuple[str, int], int]:
        response = self.fetch(group_id)
        return {(t.name, p.partition_index): p.committed_offset for t in response.topics for p in t.partitions}

    def join_two(self, group_id: str, **kw: Any) -> tuple[str, str, int]:
        """Two new dynamic members join and the initial delay passes: the group awaits their
        SyncGroups. Returns the leader, the follower and the generation."""
        a = self.join_new(group_id, **kw)
        pa = self.pending
        b = self.join_new(group_id, **kw)
        self.advance(6000)
        generation, leader = pa.result().generation_id, pa.result().leader
        return leader, (b if leader == a else a), generation

    def form_group(self, group_id: str, n: int, *, version: int = 5, session_ms: int = 10000,
                   rebalance_ms: int = 30000, topics: tuple[str, ...] = ("t",)) -> tuple[list[str], int]:
        """n dynamic members join a new group, the initial delay passes, all sync; returns the
        member ids (leader first) and the generation."""
        ids = []
        parked = []
        for _ in range(n):
            ids.append(self.join_new(group_id, version=version, session_ms=session_ms, rebalance_ms=rebalance_ms,
                                     protocols=[("range", sub(*topics))]))
            parked.append(self.pending)
        self.advance(self.config.initial_rebalance_delay_ms * (n + 1))
        responses = [d.result() for d in parked]
        assert all(r.error_code == E.NONE for r in responses), responses
        generation = responses[0].generation_id
        leader = responses[0].leader
        ids.sort(key=lambda m: m != leader)
        syncs = [self.sync(group_id, m, generation,
                           assignments={x: b"assign-" + x.encode() for x in ids} if m == leader else None)
                 for m in ids]
        assert all(s.result().error_code == E.NONE for s in syncs)
        return ids, generation
