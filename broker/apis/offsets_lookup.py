"""ListOffsets (key 2), OffsetForLeaderEpoch (key 23) and DeleteRecords (key 21)."""

from __future__ import annotations

from broker.apis.context import BrokerServices, RequestContext
from broker.apis.fetch import _check_leader_epoch
from broker.apis.registry import api
from broker.partition import Partition
from broker.security.authz import Op, Res, authorize, authorize_cluster
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6

DEBUGGING_REPLICA_ID = -2  # Kafka's: a ListOffsets or OffsetForLeaderEpoch any replica answers
L = M.ListOffsetsResponse


def _leader_partition(broker: BrokerServices, topic: str, index: int, current_leader_epoch: int = -1,
                      replica_id: int = -1) -> tuple[Partition | None, int]:
    """The partition a per-partition request addresses, or the error code to answer instead. Only
    its leader answers (Kafka's fetchOnlyFromLeader), unless the debugging replica id asks: a
    replica that follows (or, just restarted, does not lead yet) knows only a high watermark that
    may lag what was acknowledged."""
    partition = broker.partitions.get(topic, index)
    if partition is None:
        return None, int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    if not partition.is_leader and replica_id != DEBUGGING_REPLICA_ID:
        return None, int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    error = _check_leader_epoch(partition, current_leader_epoch)
    return (None, int(error)) if error is not None else (partition, 0)


def _list_offset(partition: Partition, timestamp: int, isolation: int) -> tuple[int, int, int]:
    """(timestamp, offset, leader epoch) for one ListOffsets query."""
    epoch = partition.leader_epoch
    if timestamp == LATEST:
        return -1, partition.fetch_bound(isolation), epoch
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return -1, partition.log_start_offset, epoch
    if timestamp in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        return -1, -1, -1  # no tiered storage
    if timestamp == MAX_TIMESTAMP:
        found = partition.log.max_timestamp_and_offset()
    else:
        found = partition.log.offset_for_timestamp(timestamp)
    if found is None or found.offset >= partition.fetch_bound(isolation):
        return -1, -1, -1
    return found.timestamp, found.offset, found.leader_epoch


@api(2)
async def handle_list_offsets(ctx: RequestContext, request: M.ListOffsetsRequest) -> M.ListOffsetsResponse:
    broker = ctx.broker
    isolation = request.isolation_level if ctx.api_version >= 2 else 0
    topics = []
    for t in request.topics:
        out = L.ListOffsetsTopicResponse(name=t.name, partitions=[])
        topics.append(out)
        denied = not authorize(ctx, Op.DESCRIBE, Res.TOPIC, t.name)
        for p in t.partitions:
            entry = L.ListOffsetsPartitionResponse(partition_index=p.partition_index, timestamp=-1, offset=-1)
            out.partitions.append(entry)
            if denied:
                entry.error_code = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                continue
            partition, entry.error_code = _leader_partition(broker, t.name, p.partition_index, p.current_leader_epoch,
                                                            request.replica_id)
            if partition is None:
                continue
            if p.timestamp == MAX_TIMESTAMP and ctx.api_version < 7 or p.timestamp < EARLIEST_PENDING_UPLOAD:
                entry.error_code = int(ErrorCode.UNSUPPORTED_VERSION)
                continue
            entry.timestamp, entry.offset, entry.leader_epoch = _list_offset(partition, p.timestamp, isolation)
    return L(throttle_time_ms=0, topics=topics)


E = M.OffsetForLeaderEpochResponse


@api(23)
async def handle_offset_for_leader_epoch(ctx: RequestContext, request: M.OffsetForLeaderEpochRequest
                                         ) -> M.OffsetForLeaderEpochResponse:
    broker = ctx.broker
    topics = []
    # a follower with CLUSTER_ACTION may ask for any topic, a consumer needs DESCRIBE on it
    everything = authorize_cluster(ctx, Op.CLUSTER_ACTION, log_if_denied=False)
    for t in request.topics:
        out = E.OffsetForLeaderTopicResult(topic=t.topic, partitions=[])
        topics.append(out)
        denied = not everything and not authorize(ctx, Op.DESCRIBE, Res.TOPIC, t.topic)
        for p in t.partitions:
            entry = E.EpochEndOffset(partition=p.partition, leader_epoch=-1, end_offset=-1)
            out.partitions.append(entry)
            if denied:
                entry.error_code = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                continue
            partition, entry.error_code = _leader_partition(broker, t.topic, p.partition, p.current_leader_epoch,
                                                            request.replica_id if ctx.api_version >= 3 else -1)
            if partition is None:
                continue
            entry.leader_epoch, entry.end_offset = partition.log.end_offset_for_epoch(p.leader_epoch)
    return E(throttle_time_ms=0, topics=topics)


D = M.DeleteRecordsResponse


@api(21)
async def handle_delete_records(ctx: RequestContext, request: M.DeleteRecordsRequest) -> M.DeleteRecordsResponse:
    broker = ctx.broker
    topics = []
    for t in request.topics:
        out = D.DeleteRecordsTopicResult(name=t.name, partitions=[])
        topics.append(out)
        denied = not authorize(ctx, Op.DELETE, Res.TOPIC, t.name)
        for p in t.partitions:
            entry = D.DeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=-1)
            out.partitions.append(entry)
            if denied:
                entry.error_code = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                continue
            partition, entry.error_code = _leader_partition(broker, t.name, p.partition_index)
            if partition is None:
                continue
            # -1 means "up to the high watermark"
            offset = partition.high_watermark if p.offset == -1 else p.offset
            if offset < 0 or offset > partition.high_watermark:
                entry.error_code = int(ErrorCode.OFFSET_OUT_OF_RANGE)
                continue
            try:
                entry.low_watermark = partition.log.delete_records_before(offset, partition.high_watermark)
            except KafkaError as exc:
                entry.error_code = int(exc.code)
    return D(throttle_time_ms=0, topics=topics)
