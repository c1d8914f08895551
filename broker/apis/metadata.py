"""Metadata (key 3): brokers, topics with their ids and partitions; auto-creation of topics.
DescribeTopicPartitions (key 75): the same partitions in pages."""

from __future__ import annotations

import uuid
from typing import TypeVar

from broker.apis.context import BrokerServices, RequestContext
from broker.apis.registry import api
from broker.metadata import INTERNAL_TOPICS, TopicInfo, validate_topic_name
from broker.security.authz import (
    CLUSTER_NAME,
    Op,
    Res,
    authorize,
    authorize_cluster,
    authorized_operations,
    listener_of,
)
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

# Without an authorizer every operation is allowed; Kafka then reports all the operations a
# resource supports (AclOperation codes as bit positions).
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
OPERATIONS_NOT_REQUESTED = -2147483648

R = M.MetadataResponse
DT = M.DescribeTopicPartitionsResponse
# a partition entry of Metadata or of DescribeTopicPartitions (the same fields)
PartitionEntry = TypeVar("PartitionEntry", R.MetadataResponsePartition, DT.DescribeTopicPartitionsResponsePartition)


def partition_states(broker: BrokerServices, topic: str, start: int, stop: int, cls: type[PartitionEntry]
                     ) -> list[PartitionEntry]:
    """Metadata's (or DescribeTopicPartitions') partition entries: leader (none: LEADER_NOT_AVAILABLE),
    its epoch, replicas, in-sync and offline replicas."""
    offline = broker.topology.offline_nodes()
    out = []
    for p in range(start, stop):
        leader, replicas, isr = broker.topology.assignment(topic, p)
        out.append(cls(
            error_code=0 if leader >= 0 else int(ErrorCode.LEADER_NOT_AVAILABLE), partition_index=p,
            leader_id=leader, leader_epoch=broker.leader_epoch_of(topic, p), replica_nodes=list(replicas),
            isr_nodes=list(isr), offline_replicas=[r for r in replicas if r in offline],
        ))
    return out


def topic_metadata(broker: BrokerServices, info: TopicInfo, authorized_ops: int) -> R.MetadataResponseTopic:
    return R.MetadataResponseTopic(
        error_code=0, name=info.name, topic_id=info.topic_id, is_internal=info.internal,
        partitions=partition_states(broker, info.name, 0, info.partitions, R.MetadataResponsePartition),
        topic_authorized_operations=authorized_ops,
    )


def topic_error(name: str | None, code: ErrorCode, topic_id: uuid.UUID | None = None) -> R.MetadataResponseTopic:
    t = R.MetadataResponseTopic(error_code=int(code), name=name, partitions=[])
    if topic_id is not None:
        t.topic_id = topic_id
    return t


def _missing_topic_error(name: str) -> ErrorCode:
    """As Kafka: an unknown topic whose name could never exist is INVALID_TOPIC_EXCEPTION."""
    try:
        validate_topic_name(name)
    except KafkaError as exc:
        return exc.code
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def _creatable(ctx: RequestContext, name: str) -> bool:
    """Auto-creation needs CREATE on the cluster or on the topic."""
    return authorize_cluster(ctx, Op.CREATE, log_if_denied=False) or authorize(ctx, Op.CREATE, Res.TOPIC, name)


@api(3)
async def handle_metadata(ctx: RequestContext, request: M.MetadataRequest) -> M.MetadataResponse:
    broker = ctx.broker
    version = ctx.api_version
    secured = broker.authorizer is not None
    want_ops = version >= 8 and request.include_topic_authorized_operations
    ops = TOPIC_OPERATIONS if want_ops else OPERATIONS_NOT_REQUESTED
    # v0 has no null: an empty list means every topic there
    # auto-creation is always allowed before v4 (the flag does not exist there)
    allow_create = broker.config["auto.create.topics.enable"] and (version < 4 or request.allow_auto_topic_creation)
    topics: list[R.MetadataResponseTopic] = []
    if request.topics is None or (version == 0 and not request.topics):
        # as Kafka: the topics the principal may not describe are left out
        topics = [topic_metadata(broker, info, ops) for info in list(broker.metadata.topics.values())
                  if not secured or authorize(ctx, Op.DESCRIBE, Res.TOPIC, info.name, log_if_denied=False)]
    else:
        for wanted in request.topics:
            if wanted.name is None:
                info = broker.metadata.topic_by_id(wanted.topic_id)
                if info is None:
                    topics.append(topic_error(None, ErrorCode.UNKNOWN_TOPIC_ID, wanted.topic_id))
                elif secured and not authorize(ctx, Op.DESCRIBE, Res.TOPIC, info.name):
                    # topic ids are not secret: the id is answered, the name is not
                    topics.append(topic_error(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED, wanted.topic_id))
                else:
                    topics.append(topic_metadata(broker, info, ops))
                continue
            if secured and not authorize(ctx, Op.DESCRIBE, Res.TOPIC, wanted.name):
                # whether the topic exists is not disclosed
                topics.append(topic_error(wanted.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            info = broker.metadata.topic(wanted.name)
            # internal topics are created by their coordinators, with their own partition counts
            # and configs: a client's Metadata request must not create them with the defaults
            if info is None and allow_create and wanted.name not in INTERNAL_TOPICS:
                if secured and not _creatable(ctx, wanted.name):
                    topics.append(topic_error(wanted.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    continue
                # As Kafka 4.x (DefaultAutoTopicCreationManager): the creation goes to the
                # controller and this answer says UNKNOWN_TOPIC_OR_PARTITION; the client asks
                # again and then sees the partitions.
                try:
                    await broker.create_topic(wanted.name, -1, {})
                except KafkaError as exc:
                    if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                        topics.append(topic_error(wanted.name, exc.code))
                        continue
                topics.append(topic_error(wanted.name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            if info is None:
                topics.append(topic_error(wanted.name, _missing_topic_error(wanted.name)))
            else:
                topics.append(topic_metadata(broker, info, ops))
    if secured and want_ops:
        for t in topics:
            if t.error_code == 0:
                t.topic_authorized_operations = authorized_operations(ctx, Res.TOPIC, t.name or "")
    cluster_ops = OPERATIONS_NOT_REQUESTED
    if 8 <= version <= 10 and request.include_cluster_authorized_operations:
        cluster_ops = cluster_authorized_operations(ctx)
    nodes = broker.topology.live_brokers(listener_of(ctx))
    return R(
        throttle_time_ms=0,
        brokers=[R.MetadataResponseBroker(node_id=node, host=host, port=port, rack=broker.topology.rack(node))
                 for node, host, port in nodes],
        cluster_id=broker.cluster_id,
        controller_id=broker.topology.controller_id(),
        topics=topics,
        cluster_authorized_operations=cluster_ops,
        error_code=0,
    )


def cluster_authorized_operations(ctx: RequestContext) -> int:
    """The cluster's authorized operations: none without DESCRIBE on it (KafkaApis, DescribeCluster)."""
    if not authorize_cluster(ctx, Op.DESCRIBE):
        return 0
    return authorized_operations(ctx, Res.CLUSTER, CLUSTER_NAME)


# ---------------------------------------------------------------------------------------------
# DescribeTopicPartitions (key 75): the partitions of topics in pages bounded by a partition limit,
# continued with a cursor (Kafka's DescribeTopicPartitionsRequestHandler and
# KRaftMetadataCache.describeTopicResponse, in their order).

MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000  # Kafka's max.request.partition.size.limit default


def _described_partitions(broker: BrokerServices, info: TopicInfo, start: int, limit: int
                          ) -> tuple[list[DT.DescribeTopicPartitionsResponsePartition], int]:
    """The partitions from `start` (at most `limit`) and the next index, or -1 when none is left."""
    upper = min(info.partitions, start + limit)
    partitions = partition_states(broker, info.name, start, upper, DT.DescribeTopicPartitionsResponsePartition)
    for p in partitions:
        p.eligible_leader_replicas, p.last_known_elr = [], []
    return partitions, upper if upper < info.partitions else -1


def _invalid_request(request: M.DescribeTopicPartitionsRequest) -> M.DescribeTopicPartitionsResponse:
    """The whole request fails (Kafka raises InvalidRequestException: the topic list must hold the
    cursor's topic, the cursor's partition must not be negative): each asked topic carries the error."""
    return DT(throttle_time_ms=0, topics=[
        DT.DescribeTopicPartitionsResponseTopic(error_code=int(ErrorCode.INVALID_REQUEST), name=t.name,
                                                topic_id=uuid.UUID(int=0), partitions=[])
        for t in request.topics])


@api(75)
async def handle_describe_topic_partitions(ctx: RequestContext, request: M.DescribeTopicPartitionsRequest
                                           ) -> M.DescribeTopicPartitionsResponse:
    broker = ctx.broker
    cursor = request.cursor
    cursor_topic = cursor.topic_name if cursor is not None else ""
    every_topic = not request.topics
    names = list(broker.metadata.topics) if every_topic else [t.name for t in request.topics]
    wanted = sorted({n for n in names if n >= cursor_topic})
    if not every_topic and cursor is not None and cursor.topic_name not in wanted:
        return _invalid_request(request)
    if cursor is not None and cursor.partition_index < 0:
        return _invalid_request(request)
    remaining = max(min(MAX_REQUEST_PARTITION_SIZE_LIMIT, request.response_partition_limit), 1)
    response = DT(throttle_time_ms=0, topics=[], next_cursor=None)
    unauthorized = []
    if broker.authorizer is not None:
        # topics the principal may not describe: left out of "every topic", else refused
        # without saying whether they exist
        allowed = [n for n in wanted if authorize(ctx, Op.DESCRIBE, Res.TOPIC, n)]
        if not every_topic:
            unauthorized = [DT.DescribeTopicPartitionsResponseTopic(
                error_code=int(ErrorCode.TOPIC_AUTHORIZATION_FAILED), name=n, topic_id=uuid.UUID(int=0),
                is_internal=False, partitions=[]) for n in wanted if n not in allowed]
        wanted = allowed
    for name in wanted:
        if remaining == 0:
            # the cursor points at the start of the topic the limit left out
            response.next_cursor = DT.Cursor(topic_name=name, partition_index=0)
            break
        info = broker.metadata.topic(name)
        if info is None:
            if not every_topic:
                response.topics.append(DT.DescribeTopicPartitionsResponseTopic(
                    error_code=int(_missing_topic_error(name)), name=name, topic_id=uuid.UUID(int=0),
                    is_internal=name in INTERNAL_TOPICS, partitions=[], topic_authorized_operations=TOPIC_OPERATIONS))
            continue
        start = cursor.partition_index if name == cursor_topic and cursor is not None else 0
        partitions, next_index = _described_partitions(broker, info, start, remaining)
        response.topics.append(DT.DescribeTopicPartitionsResponseTopic(
            error_code=0, name=name, topic_id=info.topic_id, is_internal=info.internal, partitions=partitions,
            topic_authorized_operations=TOPIC_OPERATIONS))
        if next_index != -1:
            response.next_cursor = DT.Cursor(topic_name=name, partition_index=next_index)
            break
        remaining -= len(partitions)
    if unauthorized or broker.authorizer is not None:
        for t in response.topics:
            t.topic_authorized_operations = authorized_operations(ctx, Res.TOPIC, t.name or "")
        response.topics.extend(unauthorized)
    return response
