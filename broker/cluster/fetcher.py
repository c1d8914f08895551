"""Replication, the follower's side: Kafka's ReplicaFetcherManager and ReplicaFetcherThread.

A node that is a replica but not the leader of a partition copies the leader's log. One fetcher
per source broker (num.replica.fetchers = 1) fetches every partition this node follows from that
leader in one Fetch, as Kafka's brokers do: ReplicaState (this node's id and broker epoch,
KIP-903), each partition's CurrentLeaderEpoch, FetchOffset = its log end and LastFetchedEpoch (the
epoch of its last batch, for the leader's diverging-epoch check), at the highest version both
sides have (up to 17, Kafka 4.x's), over the inter-broker listener on a connection of its own (a
long poll must not hold up the other inter-broker requests), in an incremental fetch session
(KIP-227, broker/cluster/fetch_session.py): after the first, a fetch carries only the partitions
whose position changed.

What comes back is appended exactly as the leader wrote it (Partition.append_as_follower) and the
leader's high watermark and log start are taken. A DivergingEpoch answer truncates the log where
the histories part (Kafka's truncateOnFetchResponse) and fetching goes on from there;
OFFSET_OUT_OF_RANGE asks the leader for its log end and start (ListOffsets) and truncates to its
end, or starts over at its start (Kafka's fetchOffsetAndTruncate); FENCED_LEADER_EPOCH with the
epoch this node knows stops fetching the partition until the metadata says more; other errors
back off for replica.fetch.backoff.ms and retry.

A partition listed in its topic's follower.replication.throttled.replicas that has not caught up
with the leader's high watermark is left out of the fetch while this node's follower throttle
is over its rate (broker/cluster/replication_quota.py); what such partitions bring is counted.

The manager is told by the metadata publisher which partitions follow which leader, at which
leader epoch; a partition that leaves (this node leads it now, or the topic is gone) is removed
before anything else changes it. Everything runs on the event loop: a fetcher checks, after each
await, that a partition is still its own at the same epoch before it changes the partition's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.cluster.client import NodeClient
from broker.cluster.fetch_session import FetchSessionHandler, SessionFetch
from broker.cluster.replication_quota import ReplicationQuota
from broker.observability.logger import get_logger
from broker.partition import Partition
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from protocol.records import iter_batches

log = get_logger("broker.replication")

FETCH, LIST_OFFSETS, API_VERSIONS = 1, 2, 18
FETCH_MAX_VERSION = 17  # what Kafka 4.x's brokers fetch with
LIST_OFFSETS_MAX_VERSION = 10
API_VERSIONS_VERSION = 3
LATEST_TIMESTAMP, EARLIEST_TIMESTAMP = -1, -2
NO_EPOCH = -1

TopicPartition = tuple[str, int]
Q = M.FetchRequest


@dataclass(frozen=True)
class FetcherSettings:
    """Kafka's replica.fetch.* properties (their defaults)."""

    max_wait_ms: int = 500  # replica.fetch.wait.max.ms
    min_bytes: int = 1  # replica.fetch.min.bytes
    max_bytes: int = 1048576  # replica.fetch.max.bytes, per partition
    response_max_bytes: int = 10485760  # replica.fetch.response.max.bytes
    backoff_ms: int = 1000  # replica.fetch.backoff.ms

    @classmethod
    def from_config(cls, config: Any) -> FetcherSettings:
        return cls(int(config["replica.fetch.wait.max.ms"]), int(config["replica.fetch.min.bytes"]),
                   int(config["replica.fetch.max.bytes"]), int(config["replica.fetch.response.max.bytes"]),
                   int(config["replica.fetch.backoff.ms"]))


class FetchPhase(enum.Enum):
    """Kafka's ReplicaState of a partition in a fetcher."""

    TRUNCATING = "truncating"  # no epoch in its log: first truncate to its high watermark
    FETCHING = "fetching"


@dataclass
class PartitionFetchState:
    """Kafka's PartitionFetchState: where a partition's fetching stands."""

    topic_id: uuid.UUID
    fetch_offset: int
    current_leader_epoch: int
    phase: FetchPhase
    last_fetched_epoch: int | None
    delayed_until: float = 0.0  # monotonic seconds: backing off after an error until then
    lag: int | None = None  # the leader's high watermark less the fetch offset, at the last answer

    @property
    def in_sync(self) -> bool:
        """Kafka's isReplicaInSync: caught up with the leader's high watermark at the last fetch."""
        return self.lag is not None and self.lag <= 0

    def ready(self, now: float) -> bool:
        return self.phase is FetchPhase.FETCHING and now >= self.delayed_until


def truncation_offset(partition: Partition, leader_epoch: int, leader_end_offset: int) -> int:
    """Where a follower truncates when the leader says its history for `leader_epoch` ends at
    `leader_end_offset` (Kafka's getOffsetTruncationState, truncation on fetch): the end of that
    epoch in both logs; when this log does not know the epoch, the end of the largest epoch below
    it (the next fetch compares again from there)."""
    log_end = partition.log.log_end_offset
    if leader_end_offset < 0:
        return min(partition.high_watermark, log_end)
    epoch, end = partition.log.end_offset_for_epoch(leader_epoch)
    if end < 0:  # no epoch at or below it here
        return min(leader_end_offset, log_end)
    if epoch != leader_epoch:
        return min(end, log_end)
    return min(end, leader_end_offset, log_end)


class ReplicaFetcher:
    """Kafka's ReplicaFetcherThread: fetches the partitions this node follows from one leader."""

    def __init__(self, node_id: int, leader: int, client: NodeClient, broker_epoch: Callable[[], int],
                 partition_of: Callable[[str, int], Partition | None], settings: FetcherSettings,
                 clock: Callable[[], float] = time.monotonic, quota: ReplicationQuota | None = None) -> None:
        self.node_id = node_id
        self.leader = leader
        self.client = client
        self.broker_epoch = broker_epoch
        self.partition_of = partition_of
        self.settings = settings
        self.clock = clock
        self.quota = quota  # the follower's replication throttle
        self.session = FetchSessionHandler()  # KIP-227, with this leader
        self.states: dict[TopicPartition, PartitionFetchState] = {}
        self._versions: dict[int, int] | None = None  # the leader's max version per API key
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return "ReplicaFetcher(node %d from %d, %d partitions)" % (self.node_id, self.leader, len(self.states))

    # partitions ----------------------------------------------------------------------------------
    def add_partition(self, tp: TopicPartition, topic_id: uuid.UUID, leader_epoch: int) -> None:
        """Fetch `tp` from here on at `leader_epoch` (Kafka's addPartitions: a partition already
        fetched at that epoch goes on where it is)."""
        current = self.states.get(tp)
        if current is not None and current.current_leader_epoch == leader_epoch:
            return
        partition = self.partition_of(*tp)
        if partition is None:
            return
        latest = partition.log.epoch_cache.latest_epoch
        if latest is not None:
            state = PartitionFetchState(topic_id, partition.log.log_end_offset, leader_epoch, FetchPhase.FETCHING,
                                        latest)
        else:
            state = PartitionFetchState(topic_id, partition.high_watermark, leader_epoch, FetchPhase.TRUNCATING, None)
        self.states[tp] = state
        self._wake.set()

    def remove_partition(self, tp: TopicPartition) -> None:
        self.states.pop(tp, None)

    def _owns(self, tp: TopicPartition, state: PartitionFetchState) -> bool:
        """Whether `tp` is still fetched here in the state seen before an await."""
        return self.states.get(tp) is state

    def _delay(self, tp: TopicPartition) -> None:
        state = self.states.get(tp)
        if state is not None:
            state.delayed_until = self.clock() + self.settings.backoff_ms / 1000.0

    def _fail(self, tp: TopicPartition, why: str) -> None:
        """Stop fetching `tp` until the metadata adds it again (Kafka's markPartitionFailed)."""
        self.states.pop(tp, None)
        log.warning("partition no longer fetched until the metadata changes", partition="%s-%d" % tp,
                    leader=self.leader, reason=why)

    # the task ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="replica-fetcher-%d" % self.leader)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self.client.close()

    async def _run(self) -> None:
        while True:
            try:
                self._truncate_to_high_watermark()
                if not await self.fetch_once():
                    await self._idle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replica fetcher step failed", leader=self.leader)
                await asyncio.sleep(self.settings.backoff_ms / 1000.0)

    async def _idle(self) -> None:
        """Nothing to fetch now: until a partition is added or a backoff ends."""
        now = self.clock()
        waits = [s.delayed_until - now for s in self.states.values() if s.delayed_until > now]
        timeout = min(waits) if waits else self.settings.backoff_ms / 1000.0
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(timeout, 0.001))

    def _truncate_to_high_watermark(self) -> None:
        """Partitions whose log has no leader epoch start at their high watermark (Kafka's
        truncateToHighWatermark)."""
        for tp, state in list(self.states.items()):
            if state.phase is not FetchPhase.TRUNCATING or state.delayed_until > self.clock():
                continue
            partition = self.partition_of(*tp)
            if partition is None or partition.deleted:
                self.states.pop(tp, None)
                continue
            partition.truncate_to(state.fetch_offset)
            state.fetch_offset = partition.log.log_end_offset
            state.last_fetched_epoch = partition.log.epoch_cache.latest_epoch
            state.phase = FetchPhase.FETCHING

    # one fetch -----------------------------------------------------------------------------------
    async def fetch_once(self) -> bool:
        """Send one Fetch for the partitions ready and process the answer; False when none was ready."""
        now = self.clock()
        sent = {tp: s for tp, s in self.states.items() if s.ready(now)}
        quota = self.quota
        if quota is not None and quota.active and sent:
            sent = {tp: s for tp, s in sent.items() if not self._throttled(tp, s, quota)}
        if not sent:
            return False
        fetch: SessionFetch | None = None
        try:
            version = await self._version(FETCH, FETCH_MAX_VERSION)
            request, fetch = self._fetch_request(sent, version)
            response = await self.client.call(FETCH, version, request, unreachable=ErrorCode.NETWORK_EXCEPTION)
        except KafkaError as exc:
            self._versions = None  # a new connection asks again
            self.session.handle_error()
            log.info("fetch from the leader failed; backing off", leader=self.leader, error=exc.code.name)
            for tp in sent:
                self._delay(tp)
            return True
        if fetch is not None and not self.session.handle_response(fetch, response):
            code = ErrorCode(response.error_code)  # type: ignore[call-arg]
            log.info("fetch session reset by the leader; fetching in full", leader=self.leader, error=code.name)
            return True
        if response.error_code:
            code = ErrorCode(response.error_code)  # type: ignore[call-arg]
            log.info("fetch refused by the leader", leader=self.leader, error=code.name)
            for tp in sent:
                self._delay(tp)
            return True
        await self._process(sent, response, version)
        return True

    def _throttled(self, tp: TopicPartition, state: PartitionFetchState, quota: ReplicationQuota) -> bool:
        """Kafka's shouldFollowerThrottle: a throttled partition not caught up waits while the
        follower's rate is over its bound (the partitions in sync are never held back)."""
        if state.in_sync:
            return False
        partition = self.partition_of(*tp)
        return partition is not None and quota.is_throttled(partition.log.config.extra, tp[1]) and quota.exceeded()

    def _fetch_request(self, sent: dict[TopicPartition, PartitionFetchState], version: int
                       ) -> tuple[M.FetchRequest, SessionFetch | None]:
        """The Fetch for `sent`, framed by the fetch session from version 7 (None before: a
        sessionless full fetch)."""
        settings = self.settings
        wanted: dict[TopicPartition, tuple[uuid.UUID, Q.FetchPartition]] = {}
        for (topic, index), state in sent.items():
            partition = self.partition_of(topic, index)
            log_start = partition.log.log_start_offset if partition is not None else -1
            wanted[(topic, index)] = (state.topic_id, Q.FetchPartition(
                partition=index, current_leader_epoch=state.current_leader_epoch, fetch_offset=state.fetch_offset,
                last_fetched_epoch=NO_EPOCH if state.last_fetched_epoch is None else state.last_fetched_epoch,
                log_start_offset=log_start, partition_max_bytes=settings.max_bytes))
        fetch = self.session.build(wanted) if version >= 7 else None
        send, forget = (fetch.send, fetch.forget) if fetch is not None else (wanted, {})
        topics: dict[str, Q.FetchTopic] = {}
        for (topic, _), (topic_id, data) in send.items():
            entry = topics.get(topic)
            if entry is None:
                entry = topics[topic] = Q.FetchTopic(topic=topic, topic_id=topic_id, partitions=[])
            entry.partitions.append(data)
        forgotten: dict[str, Q.ForgottenTopic] = {}
        for (topic, index), topic_id in forget.items():
            gone = forgotten.get(topic)
            if gone is None:
                gone = forgotten[topic] = Q.ForgottenTopic(topic=topic, topic_id=topic_id, partitions=[])
            gone.partitions.append(index)
        request = Q(max_wait_ms=settings.max_wait_ms, min_bytes=settings.min_bytes,
                    max_bytes=settings.response_max_bytes, isolation_level=0,
                    session_id=fetch.session_id if fetch is not None else 0,
                    session_epoch=fetch.epoch if fetch is not None else -1,
                    topics=list(topics.values()), forgotten_topics_data=list(forgotten.values()), rack_id="")
        if version >= 15:
            request.replica_state = Q.ReplicaState(replica_id=self.node_id, replica_epoch=self.broker_epoch())
        else:
            request.replica_id = self.node_id
        return request, fetch

    async def _process(self, sent: dict[TopicPartition, PartitionFetchState], response: M.FetchResponse,
                       version: int) -> None:
        names = {s.topic_id: tp[0] for tp, s in sent.items()}
        for topic in response.responses:
            name = names.get(topic.topic_id) if version >= 13 else topic.topic
            if name is None:
                continue
            for data in topic.partitions:
                tp = (name, data.partition_index)
                state = sent.get(tp)
                if state is None or not self._owns(tp, state):
                    continue  # removed, or added again at a new epoch, while the fetch was out
                await self._process_partition(tp, state, data)

    async def _process_partition(self, tp: TopicPartition, state: PartitionFetchState,
                                 data: M.FetchResponse.PartitionData) -> None:
        code = ErrorCode(data.error_code)  # type: ignore[call-arg]
        partition = self.partition_of(*tp)
        if partition is None or partition.deleted:
            self.states.pop(tp, None)
            return
        if code is ErrorCode.NONE:
            diverging = data.diverging_epoch
            if diverging is not None and (diverging.epoch != NO_EPOCH or diverging.end_offset != -1):
                self._truncate_on_divergence(tp, state, partition, diverging.epoch, diverging.end_offset)
                return
            await self._append(tp, state, partition, data)
        elif code is ErrorCode.OFFSET_OUT_OF_RANGE:
            await self._handle_out_of_range(tp, state, partition)
        elif code is ErrorCode.FENCED_LEADER_EPOCH:
            self._fenced(tp, state)
        elif code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_LEADER_EPOCH,
                      ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID,
                      ErrorCode.INCONSISTENT_TOPIC_ID):
            log.debug("leader not ready for this follower; retrying", partition="%s-%d" % tp, error=code.name)
            self._delay(tp)
        else:
            log.error("fetch error for partition", partition="%s-%d" % tp, offset=state.fetch_offset,
                      error=code.name)
            self._delay(tp)

    async def _append(self, tp: TopicPartition, state: PartitionFetchState, partition: Partition,
                      data: M.FetchResponse.PartitionData) -> None:
        """Kafka's processPartitionData: append, take the leader's high watermark and log start."""
        if state.fetch_offset != partition.log.log_end_offset:
            # the log changed under the fetcher (it should not): start again from where it ends
            log.warning("fetch offset no longer the log end; fetching from the log end", partition="%s-%d" % tp,
                        fetch_offset=state.fetch_offset, log_end_offset=partition.log.log_end_offset)
            state.fetch_offset = partition.log.log_end_offset
            state.last_fetched_epoch = partition.log.epoch_cache.latest_epoch
            return
        records = data.records if data.records is not None else b""
        try:
            result = partition.append_as_follower(records)
        except KafkaError as exc:
            # a corrupt or misplaced batch: fetched again after the backoff
            log.error("invalid records from the leader", partition="%s-%d" % tp, offset=state.fetch_offset,
                      error=exc.code.name, message=str(exc))
            self._delay(tp)
            return
        if result.record_count or result.size:
            state.fetch_offset = result.last_offset + 1
            last = _last_epoch(records)
            if last is not None:
                state.last_fetched_epoch = last
        partition.update_follower_high_watermark(int(data.high_watermark))
        state.lag = max(0, int(data.high_watermark) - state.fetch_offset)
        quota = self.quota
        if quota is not None and quota.active and quota.is_throttled(partition.log.config.extra, tp[1]):
            quota.record(len(records))  # in sync or not: the bound is on the throttled traffic as a whole
        if data.log_start_offset >= 0:
            partition.follow_log_start_offset(int(data.log_start_offset))
        if partition.log.needs_flush():
            await partition.group_commit.commit(partition.log.log_end_offset)

    def _truncate_on_divergence(self, tp: TopicPartition, state: PartitionFetchState, partition: Partition,
                                epoch: int, end_offset: int) -> None:
        offset = truncation_offset(partition, epoch, end_offset)
        log.info("truncating where the leader's history diverges", partition="%s-%d" % tp, offset=offset,
                 leader_epoch=epoch, leader_end_offset=end_offset, log_end_offset=partition.log.log_end_offset)
        partition.truncate_to(offset)
        state.fetch_offset = partition.log.log_end_offset
        state.last_fetched_epoch = partition.log.epoch_cache.latest_epoch

    def _fenced(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        """FENCED_LEADER_EPOCH: the leader is at a newer epoch than this node knows; wait for the
        metadata (Kafka's onPartitionFenced)."""
        self._fail(tp, "leader epoch %d is fenced by the leader" % state.current_leader_epoch)

    async def _handle_out_of_range(self, tp: TopicPartition, state: PartitionFetchState, partition: Partition) -> None:
        """Kafka's fetchOffsetAndTruncate: past the leader's end, truncate to it; before its start,
        start over at its start."""
        log_end = partition.log.log_end_offset
        try:
            leader_end = await self._leader_offset(tp, state, LATEST_TIMESTAMP)
            if not self._owns(tp, state):
                return
            if leader_end < log_end:
                log.warning("truncating to the leader's log end", partition="%s-%d" % tp, log_end_offset=log_end,
                            leader_end_offset=leader_end)
                partition.truncate_to(leader_end)
            else:
                leader_start = await self._leader_offset(tp, state, EARLIEST_TIMESTAMP)
                if not self._owns(tp, state):
                    return
                if leader_start > partition.log.log_end_offset:
                    log.warning("starting over at the leader's log start", partition="%s-%d" % tp,
                                log_end_offset=partition.log.log_end_offset, leader_start_offset=leader_start)
                    partition.truncate_fully_and_start_at(leader_start)
        except KafkaError as exc:
            if exc.code is ErrorCode.FENCED_LEADER_EPOCH:
                self._fenced(tp, state)
            else:
                log.info("could not learn the leader's offsets", partition="%s-%d" % tp, error=exc.code.name)
                self._delay(tp)
            return
        state.fetch_offset = partition.log.log_end_offset
        state.last_fetched_epoch = partition.log.epoch_cache.latest_epoch

    async def _leader_offset(self, tp: TopicPartition, state: PartitionFetchState, timestamp: int) -> int:
        """The leader's log end (LATEST) or start (EARLIEST), asked as its replica (ListOffsets)."""
        version = await self._version(LIST_OFFSETS, LIST_OFFSETS_MAX_VERSION)
        R = M.ListOffsetsRequest
        request = R(replica_id=self.node_id, isolation_level=0, topics=[R.ListOffsetsTopic(name=tp[0], partitions=[
            R.ListOffsetsPartition(partition_index=tp[1], current_leader_epoch=state.current_leader_epoch,
                                   timestamp=timestamp)])])
        response = await self.client.call(LIST_OFFSETS, version, request, unreachable=ErrorCode.NETWORK_EXCEPTION)
        found = response.topics[0].partitions[0]
        if found.error_code:
            raise KafkaError(ErrorCode(found.error_code), "ListOffsets from the leader")  # type: ignore[call-arg]
        return int(found.offset)

    async def _version(self, api_key: int, ours: int) -> int:
        """The highest version of `api_key` both this node and the leader have (ApiVersions once
        per connection)."""
        if self._versions is None:
            request = M.ApiVersionsRequest(client_software_name="kafka-broker", client_software_version="4.0")
            response = await self.client.call(API_VERSIONS, API_VERSIONS_VERSION, request,
                                              unreachable=ErrorCode.NETWORK_EXCEPTION)
            if response.error_code:
                raise KafkaError(ErrorCode(response.error_code), "ApiVersions")  # type: ignore[call-arg]
            self._versions = {k.api_key: k.max_version for k in response.api_keys}
        theirs = self._versions.get(api_key)
        if theirs is None:
            raise KafkaError(ErrorCode.UNSUPPORTED_VERSION, "the leader does not serve API %d" % api_key)
        return min(ours, theirs)


def _last_epoch(records: Any) -> int | None:
    """The partition leader epoch of the last whole batch in `records`."""
    last = None
    for _, header in iter_batches(memoryview(records)):
        last = header.partition_leader_epoch
    return last if last is not None and last >= 0 else None


class ReplicaFetcherManager:
    """Kafka's ReplicaFetcherManager: one fetcher per leader this node follows partitions of."""

    def __init__(self, node_id: int, connect: Callable[[int], NodeClient], broker_epoch: Callable[[], int],
                 partition_of: Callable[[str, int], Partition | None], settings: FetcherSettings,
                 quota: ReplicationQuota | None = None) -> None:
        self.node_id = node_id
        self.connect = connect  # a new connection to a node
        self.broker_epoch = broker_epoch
        self.partition_of = partition_of
        self.settings = settings
        self.quota = quota
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._leader_of: dict[TopicPartition, int] = {}
        self._stopping: list[asyncio.Task[None]] = []

    def add_partition(self, tp: TopicPartition, topic_id: uuid.UUID, leader: int, leader_epoch: int) -> None:
        """Follow `tp` from `leader` at `leader_epoch` (moved from another leader's fetcher)."""
        previous = self._leader_of.get(tp)
        if previous is not None and previous != leader:
            self.remove_partition(tp)
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            fetcher = self.fetchers[leader] = ReplicaFetcher(self.node_id, leader, self.connect(leader),
                                                             self.broker_epoch, self.partition_of, self.settings,
                                                             quota=self.quota)
            fetcher.start()
            log.info("replica fetcher started", leader=leader)
        self._leader_of[tp] = leader
        fetcher.add_partition(tp, topic_id, leader_epoch)

    def remove_partition(self, tp: TopicPartition) -> None:
        """Stop fetching `tp` (this node leads it now, or no longer holds it); a fetcher left
        without partitions stops (Kafka's shutdownIdleFetcherThreads)."""
        leader = self._leader_of.pop(tp, None)
        if leader is None:
            return
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            return
        fetcher.remove_partition(tp)
        if not fetcher.states:
            del self.fetchers[leader]
            self._stopping.append(asyncio.get_running_loop().create_task(fetcher.stop()))
            log.info("replica fetcher stopped: nothing left to fetch from its leader", leader=leader)

    def remove_topic(self, topic: str) -> None:
        for tp in [tp for tp in self._leader_of if tp[0] == topic]:
            self.remove_partition(tp)

    def leader_of(self, tp: TopicPartition) -> int | None:
        return self._leader_of.get(tp)

    async def shutdown(self) -> None:
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        self._leader_of.clear()
        await asyncio.gather(*(f.stop() for f in fetchers), *self._stopping, return_exceptions=True)
        self._stopping = []
