"""Drive KIP-848 consumer groups on a GroupCoordinatorShard without the runtime: operations run
synchronously, records go to an in-memory log, timers fire on a manual clock, topics live in a
StaticTopicMetadata. `Client` plays a consumer the way librdkafka does (owned partitions follow
the last assignment received; it acknowledges with a full list of what it owns)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import StaticTopicMetadata
from broker.coordinator.group.consumer_heartbeat import validate_heartbeat_request
from broker.coordinator.group.membership import RequestInfo
from broker.coordinator.group.shard import GroupCoordinatorShard
from broker.coordinator.result import Deferred, Record
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.coordinator.harness import ShardHarness

START_MS = 1_700_000_000_000
E = ErrorCode
REQ = M.ConsumerGroupHeartbeatRequest

CONFIG = GroupCoordinatorConfig(num_partitions=1, consumer_heartbeat_interval_ms=5000,
                                consumer_session_timeout_ms=45000, consumer_initial_assignment_delay_ms=0,
                                classic_min_initial_delay_ms=0)


def tid(name: str) -> uuid.UUID:
    """Deterministic topic ids, so that assignments are reproducible."""
    return uuid.uuid5(uuid.NAMESPACE_DNS, name)


class ConsumerHarness(ShardHarness):
    """A ShardHarness (its classic join/sync/heartbeat/leave/commit helpers work here too) with
    topics and ConsumerGroupHeartbeat helpers."""

    def __init__(self, config: GroupCoordinatorConfig = CONFIG, start_ms: int = START_MS,
                 log: list[Record] | None = None, metadata: StaticTopicMetadata | None = None) -> None:
        self.metadata = metadata if metadata is not None else StaticTopicMetadata()
        self.allow_held = False  # whether a heartbeat may come back as a Deferred (consumer_wait.py)
        super().__init__(config, start_ms, log)

    def _make_shard(self, config: GroupCoordinatorConfig) -> GroupCoordinatorShard:
        return GroupCoordinatorShard(self.timer, config, metadata=self.metadata)

    def topic(self, name: str, partitions: int) -> uuid.UUID:
        existed = self.metadata.topic(name) is not None
        self.metadata.add(name, partitions, tid(name))
        self.run(lambda s, now: s.on_metadata_change(set() if existed else {name}, set(),
                                                     {name} if existed else set(), now))
        return tid(name)

    def delete_topic(self, name: str) -> None:
        self.metadata.remove(name)
        self.run(lambda s, now: s.on_metadata_change(set(), {name}, set(), now))

    def drain(self) -> None:
        self._drain()

    def reload(self) -> ConsumerHarness:
        return ConsumerHarness(self.config, self.now, self.log, self.metadata)

    def group(self, group_id: str = "g") -> Any:
        return self.shard.groups[group_id]

    # ----- requests -----------------------------------------------------------------------
    def cg_heartbeat(self, request: Any, *, version: int = 1, client_id: str = "client") -> Any:
        """A heartbeat as the service runs it: validation, then the shard; errors become the
        response's error code."""
        info = RequestInfo(client_id=client_id, client_host="/127.0.0.1", api_version=version)
        try:
            validate_heartbeat_request(request, version, self.config.consumer_assignors)
            response = self.run(lambda s, now: s.consumer_group_heartbeat(request, info, now)).response
        except KafkaError as exc:
            return M.ConsumerGroupHeartbeatResponse(error_code=exc.code, error_message=exc.message)
        assert self.allow_held or not isinstance(response, Deferred)
        return response

    def hb(self, member_id: str, epoch: int, *, group: str = "g", topics: list[str] | None = None,
           regex: str | None = None, owned: dict[uuid.UUID, list[int]] | None = None, instance: str | None = None,
           rebalance_timeout_ms: int = -1, assignor: str | None = None, rack: str | None = None) -> Any:
        request = REQ(
            group_id=group, member_id=member_id, member_epoch=epoch, instance_id=instance, rack_id=rack,
            rebalance_timeout_ms=rebalance_timeout_ms, subscribed_topic_names=topics, subscribed_topic_regex=regex,
            server_assignor=assignor,
            topic_partitions=None if owned is None else [
                REQ.TopicPartitions(topic_id=t, partitions=sorted(ps)) for t, ps in owned.items()],
        )
        return self.cg_heartbeat(request)

    def cjoin(self, member_id: str, topics: list[str] | None = None, *, regex: str | None = None,
             instance: str | None = None, group: str = "g", assignor: str | None = None,
             rebalance_timeout_ms: int = 300000) -> Any:
        """A first heartbeat as librdkafka sends it (regex "" when subscribing by names)."""
        return self.hb(member_id, 0, group=group, topics=topics if topics is not None else [],
                       regex="" if regex is None else regex, owned={}, instance=instance,
                       rebalance_timeout_ms=rebalance_timeout_ms, assignor=assignor)

    def commit9(self, group: str, member_id: str, epoch: int, offsets: dict[tuple[str, int], int],
               version: int = 9) -> dict[tuple[str, int], int]:
        topics: dict[str, list[Any]] = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append(M.OffsetCommitRequest.OffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""))
        request = M.OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=epoch, member_id=member_id, group_instance_id=None,
            retention_time_ms=-1,
            topics=[M.OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in topics.items()],
        )
        try:
            response = self.run(lambda s, now: s.commit_offsets(request, version, now)).response
        except KafkaError as exc:
            return {tp: int(exc.code) for tp in offsets}
        return {(t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions}


@dataclasses.dataclass
class Client:
    """A KIP-848 consumer as librdkafka behaves: joins with epoch 0 and a client-chosen member
    id, adopts each assignment it receives (revoking what is not in it first), acknowledges by
    reporting what it owns, rejoins with epoch 0 after FENCED_MEMBER_EPOCH/UNKNOWN_MEMBER_ID."""

    h: ConsumerHarness
    member_id: str
    topics: list[str]
    group: str = "g"
    instance: str | None = None
    epoch: int = 0
    owned: dict[uuid.UUID, frozenset[int]] = dataclasses.field(default_factory=dict)
    joined: bool = False
    errors: list[int] = dataclasses.field(default_factory=list)
    last_ok_ms: int = 0  # when the coordinator last accepted a heartbeat of this client
    inflight: Deferred[Any] | None = None  # a heartbeat the coordinator holds back (consumer_wait.py)
    sent_ms: int = 0

    def poll(self) -> Any:
        """One heartbeat and its response; None while a held heartbeat is still unanswered (the
        client sends no other meanwhile)."""
        if self.inflight is not None:
            if not self.inflight.done():
                return None
            response, self.inflight = self.inflight.result(), None
            return self._apply(response)
        self.sent_ms = self.h.now
        if not self.joined:
            response = self.h.cjoin(self.member_id, self.topics, instance=self.instance, group=self.group)
        else:
            response = self.h.hb(self.member_id, self.epoch, group=self.group, instance=self.instance,
                                 owned={t: sorted(ps) for t, ps in self.owned.items()})
        if isinstance(response, Deferred):
            if not response.done():
                self.inflight = response
                return None
            response = response.result()
        return self._apply(response)

    def _apply(self, response: Any) -> Any:
        if response.error_code:
            self.errors.append(response.error_code)
            if response.error_code in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
                self.owned = {}  # the partitions are lost; rejoin
                self.joined = False
                self.epoch = 0
            return response
        self.joined = True
        self.last_ok_ms = self.sent_ms
        self.epoch = response.member_epoch
        if response.assignment is not None:
            self.owned = {tp.topic_id: frozenset(tp.partitions) for tp in response.assignment.topic_partitions
                          if tp.partitions}
        return response

    def leave(self) -> Any:
        self.inflight = None  # a held heartbeat is answered with an error once the member is gone
        epoch = -2 if self.instance is not None else -1
        response = self.h.hb(self.member_id, epoch, group=self.group, instance=self.instance)
        self.owned = {}
        self.joined = False
        return response

    def partitions(self) -> set[tuple[uuid.UUID, int]]:
        return {(t, p) for t, ps in self.owned.items() for p in ps}

    def session_alive(self) -> bool:
        """Whether its session is still open: past the session timeout the partitions are lost
        (a client that cannot heartbeat in time gives them up, as librdkafka does)."""
        return self.joined and self.h.now - self.last_ok_ms < self.h.config.consumer_session_timeout_ms
