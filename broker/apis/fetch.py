"""Fetch (key 1): reads from partition logs with long polling.

A fetch that finds fewer than min_bytes waits on its partitions' append notifications (never a
sleep loop) until enough arrived or max_wait_ms passed. A follower's fetch (a replica id >= 0:
ReplicaState from v15, the ReplicaId field before) reads up to the log end rather than the high
watermark, from the partition's leader only; its history is checked against the leader's epochs
(LastFetchedEpoch, v12+: a DivergingEpoch answer tells it where to truncate), and its fetch offset
is recorded (after the read, as Kafka's fetchRecords): it may move the high watermark and bring the
follower back into the ISR. While the leader's replication throttle is over its rate, a throttled
partition of a follower out of the ISR gets its offsets and no records
(broker/cluster/replication_quota.py). Fetch sessions (KIP-227) are Kafka's
(broker/apis/fetch_sessions.py): a full request at epoch 0 opens one, an incremental request reads
every partition of its session and answers those with news. Records are never null (librdkafka
rejects that); they are the log's FileSlices, which the server sends from the page cache
(broker/network/server.py) rather than copying them through the process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.apis.context import RequestContext
from broker.apis.fetch_sessions import INVALID_SESSION_ID, FetchContext
from broker.apis.registry import api
from broker.observability.logger import get_logger
from broker.partition import READ_COMMITTED, Partition
from broker.partition.partition import LOG_END
from broker.security.authz import Op, Res, authorize, authorize_cluster
from broker.security.quotas import Entity, throttle
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.cluster.replication_quota import ReplicationQuota

R = M.FetchResponse
Q = M.FetchRequest
log = get_logger("broker.fetch")


def _check_leader_epoch(partition: Partition, current_leader_epoch: int) -> ErrorCode | None:
    if current_leader_epoch < 0:
        return None
    if current_leader_epoch < partition.leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    if current_leader_epoch > partition.leader_epoch:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    return None


class _Target:
    __slots__ = ("topic", "topic_id", "request", "partition", "error", "diverging")

    def __init__(self, topic: str, topic_id: uuid.UUID, request: Q.FetchPartition, partition: Partition | None,
                 error: ErrorCode | None) -> None:
        self.topic = topic
        self.topic_id = topic_id
        self.request = request
        self.partition = partition
        self.error = error
        self.diverging: tuple[int, int] | None = None  # a follower's (epoch, end offset) to truncate to


class _Follower:
    """The replica a follower's Fetch comes from, and its broker epoch (KIP-903; -1: not said)."""

    __slots__ = ("replica_id", "broker_epoch")

    def __init__(self, replica_id: int, broker_epoch: int) -> None:
        self.replica_id = replica_id
        self.broker_epoch = broker_epoch


def _follower(request: M.FetchRequest, version: int) -> _Follower | None:
    if version >= 15:
        state = request.replica_state
        return _Follower(state.replica_id, state.replica_epoch) if state.replica_id >= 0 else None
    return _Follower(request.replica_id, -1) if request.replica_id >= 0 else None


def _check_follower(target: _Target, follower: _Follower) -> None:
    """Kafka's fetchRecords checks for a follower, before the read."""
    partition, p = target.partition, target.request
    assert partition is not None
    try:
        target.diverging = partition.follower_fetch(follower.replica_id, follower.broker_epoch,
                                                    p.current_leader_epoch, p.fetch_offset, p.log_start_offset,
                                                    p.last_fetched_epoch)
    except KafkaError as exc:
        target.error = exc.code


def _record_follower_fetches(targets: list[_Target], entries: list[R.PartitionData], follower: _Follower,
                             leader_ends: list[int]) -> None:
    """After the first read: each partition records the follower's fetch offset (its log end); a
    stale broker epoch fails that partition, its data withheld (NOT_LEADER_OR_FOLLOWER)."""
    for target, entry, end in zip(targets, entries, leader_ends):
        partition = target.partition
        if target.error is not None or target.diverging is not None or partition is None or entry.error_code:
            continue
        p = target.request
        try:
            partition.update_follower(follower.replica_id, follower.broker_epoch, p.fetch_offset, p.log_start_offset, end)
        except KafkaError as exc:
            target.error = exc.code
            entry.error_code = int(exc.code)
            entry.records = b""
            entry.high_watermark = entry.last_stable_offset = entry.log_start_offset = -1


def _readable(ctx: RequestContext, request: M.FetchRequest, version: int) -> Callable[[str], bool] | None:
    """None when every topic may be read (no authorizer, or a follower with CLUSTER_ACTION), else
    the check of one topic: consumers need READ on it; a follower without CLUSTER_ACTION nothing."""
    if ctx.broker.authorizer is None:
        return None
    replica_id = request.replica_state.replica_id if version >= 15 else request.replica_id
    if replica_id >= 0:
        return None if authorize_cluster(ctx, Op.CLUSTER_ACTION) else (lambda name: False)
    return lambda name: authorize(ctx, Op.READ, Res.TOPIC, name)


def _resolve(ctx: RequestContext, request: M.FetchRequest, version: int, follower: _Follower | None) -> list[_Target]:
    broker = ctx.broker
    readable = _readable(ctx, request, version)
    routing = ctx.partition_error
    targets = []
    for t in request.topics:
        name = broker.metadata.topic_name(t.topic_id) if version >= 13 else t.topic
        denied = readable is not None and name is not None and not readable(name)
        for p in t.partitions:
            partition = broker.partitions.get(name, p.partition) if name is not None and not denied else None
            routed = routing(name, p.partition) if routing is not None and name is not None and not denied else None
            if denied:
                error: ErrorCode | None = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif routed is not None:  # not this node's to serve (a cluster: another leads it)
                error, partition = routed, None
            elif partition is None:
                # an unknown id, or a known topic without that partition
                error = ErrorCode.UNKNOWN_TOPIC_ID if name is None else \
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                error = _check_leader_epoch(partition, p.current_leader_epoch)
            target = _Target(t.topic, t.topic_id, p, partition, error)
            if follower is not None and error is None:
                _check_follower(target, follower)
            targets.append(target)
    return targets


def _read_all(targets: list[_Target], request: M.FetchRequest, isolation: int,
              throttled: Callable[[Partition], bool] | None = None) -> tuple[list[R.PartitionData], int]:
    """One pass over the partitions: their response entries and the bytes found.

    As Kafka: the response's max_bytes is shared in request order, the first partition with data
    returns at least one batch even when larger than the limits, a partition that failed reports
    its error with unknown (-1) offsets, and one the leader's replication throttle holds back
    (`throttled`) its offsets and no records.
    """
    remaining = request.max_bytes
    total = 0
    out = []
    for target in targets:
        p = target.request
        entry = R.PartitionData(partition_index=p.partition, high_watermark=-1, last_stable_offset=-1,
                                log_start_offset=-1, preferred_read_replica=-1, records=b"")
        # Kafka sends null unless the reader asked for read_committed
        entry.aborted_transactions = [] if isolation == READ_COMMITTED else None
        out.append(entry)
        if target.error is not None:
            entry.error_code = int(target.error)
            continue
        partition = target.partition
        assert partition is not None  # found: no error
        if partition.deleted:  # deleted while this fetch waited
            entry.error_code = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            continue
        if target.diverging is not None:  # the follower truncates first: no records
            entry.diverging_epoch = R.EpochEndOffset(epoch=target.diverging[0], end_offset=target.diverging[1])
            entry.high_watermark = partition.high_watermark
            entry.last_stable_offset = partition.last_stable_offset
            entry.log_start_offset = partition.log_start_offset
            continue
        if throttled is not None and throttled(partition):
            entry.high_watermark = partition.high_watermark
            entry.last_stable_offset = partition.last_stable_offset
            entry.log_start_offset = partition.log_start_offset
            continue
        try:
            info = partition.read(p.fetch_offset, max(min(p.partition_max_bytes, remaining), 0), isolation,
                                  min_one_message=total == 0)
        except KafkaError as exc:
            entry.error_code = int(exc.code)
            continue
        except OSError as exc:  # the disk failed the read
            log.error("read failed", partition=repr(partition), error=str(exc))
            entry.error_code = int(ErrorCode.KAFKA_STORAGE_ERROR)
            continue
        entry.high_watermark = partition.high_watermark
        entry.last_stable_offset = partition.last_stable_offset
        entry.log_start_offset = partition.log_start_offset
        size = len(info.records)
        if size and isolation == READ_COMMITTED:
            upper = info.next_offset if info.next_offset >= 0 else entry.last_stable_offset
            entry.aborted_transactions = [
                R.AbortedTransaction(producer_id=t.producer_id, first_offset=t.first_offset)
                for t in partition.aborted_transactions(p.fetch_offset, upper)]
        if size:
            # the FileSlice itself: the codec passes it through and the server sends it from the
            # page cache (sendfile) or reads it, once the response is written
            entry.records = info.records
            total += size
            remaining -= size
    return out, total


def _assemble(answered: list[tuple[str, uuid.UUID, R.PartitionData]], version: int) -> list[R.FetchableTopicResponse]:
    """The partitions answered, consecutive ones of a topic under one entry (as Kafka's FetchResponse.of)."""
    responses: list[R.FetchableTopicResponse] = []
    current = None
    for topic, topic_id, entry in answered:
        key = topic_id if version >= 13 else topic
        if current is None or (current.topic_id if version >= 13 else current.topic) != key:
            current = R.FetchableTopicResponse(topic=topic, topic_id=topic_id, partitions=[])
            responses.append(current)
        current.partitions.append(entry)
    return responses


@api(1)
async def handle_fetch(ctx: RequestContext, request: M.FetchRequest) -> M.FetchResponse:
    version = ctx.api_version
    broker = ctx.broker
    follower = _follower(request, version)
    context = FetchContext(broker.fetch_sessions, version, request, privileged=follower is not None)
    if context.error is not None:
        return R(throttle_time_ms=0, error_code=int(context.error), session_id=INVALID_SESSION_ID, responses=[])
    request.topics = context.topics  # an incremental fetch reads every partition of its session
    isolation = request.isolation_level if follower is None else LOG_END
    quota = _fetch_quota(ctx, request, version)
    targets = _resolve(ctx, request, version, follower)
    leader_ends = [t.partition.log.log_end_offset if t.partition is not None else -1 for t in targets]
    replication_quota = broker.leader_replication_quota if follower is not None else None
    throttled = _leader_throttle(replication_quota, follower) if replication_quota is not None else None
    entries, total = _read_all(targets, request, isolation, throttled)
    if follower is not None:
        _record_follower_fetches(targets, entries, follower, leader_ends)
    deadline = time.monotonic() + request.max_wait_ms / 1000.0
    waitable = [t.partition for t in targets if t.error is None and t.partition is not None]
    diverging = any(t.diverging is not None for t in targets)
    while (total < request.min_bytes and waitable and not broker.stopping and not diverging
           and not any(e.error_code for e in entries)):
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            break
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for partition in waitable:
            partition.add_waiter(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            for partition in waitable:
                partition.remove_waiter(waiter)
        entries, total = _read_all(targets, request, isolation, throttled)
    if throttled is not None and replication_quota is not None:
        _record_throttled_bytes(replication_quota, targets, entries)
    quotas = broker.quotas
    if quota is not None and quotas is not None:  # a quota comes from the quotas
        throttle_ms = quotas.fetch.record(quota, total)
        if throttle_ms > 0:
            # over consumer_byte_rate: an empty answer with the throttle time, its bytes not counted
            quotas.fetch.unrecord(quota, total)
            response = R(throttle_time_ms=0, error_code=0, session_id=context.throttled_session_id(), responses=[])
            throttle(ctx, response, throttle_ms)
            return response
    error, session_id, answered = context.respond([(t.topic, t.topic_id, e) for t, e in zip(targets, entries)])
    return R(throttle_time_ms=0, error_code=int(error), session_id=session_id, responses=_assemble(answered, version))


def _leader_throttle(quota: ReplicationQuota, follower: _Follower | None) -> Callable[[Partition], bool] | None:
    """Kafka's shouldLeaderThrottle for a follower's fetch: a throttled partition of which the
    follower is out of the ISR, while the leader's replication rate is over its bound."""
    if follower is None or not quota.active:
        return None
    replica_id = follower.replica_id

    def throttled(partition: Partition) -> bool:
        return (replica_id not in partition.isr_state.isr and quota.is_throttled(partition.log.config.extra,
                                                                                    partition.index)
                and quota.exceeded())
    return throttled


def _record_throttled_bytes(quota: ReplicationQuota, targets: list[_Target], entries: list[R.PartitionData]) -> None:
    """What a follower's fetch took of throttled partitions, in sync or not, counts against the bound."""
    size = 0
    for target, entry in zip(targets, entries):
        partition = target.partition
        if partition is not None and entry.records and quota.is_throttled(partition.log.config.extra, partition.index):
            size += len(entry.records)
    quota.record(size)


def _fetch_quota(ctx: RequestContext, request: M.FetchRequest, version: int) -> tuple[Entity, float] | None:
    """A consumer's consumer_byte_rate quota, if it has one; its fetch then asks for no more than
    the quota allows in a window (KafkaApis bounds max_bytes by maxValueInQuotaWindow)."""
    quotas = ctx.broker.quotas
    if quotas is None or not quotas.active:
        return None
    if (request.replica_state.replica_id if version >= 15 else request.replica_id) >= 0:
        return None  # followers are not client-quota'd
    quota = quotas.fetch_quota(ctx)
    if quota is not None:
        request.max_bytes = min(request.max_bytes, int(min(quotas.fetch.max_value_in_window(quota), 2**31 - 1)))
        request.min_bytes = min(request.min_bytes, request.max_bytes)
    return quota
