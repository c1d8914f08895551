"""Metadata (key 3): brokers, topics with their ids and partitions; auto-creation of topics."""

from __future__ import annotations

from typing import Any

from broker.apis.registry import api
from broker.metadata import INTERNAL_TOPICS, validate_topic_name
from broker.security.authz import listener_of
from protocol.errors import ErrorCode, KafkaError
from protocol.messages import MetadataResponse

# Without an authorizer every operation is allowed; Kafka then reports all the operations a
# resource supports (AclOperation codes as bit positions).
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
OPERATIONS_NOT_REQUESTED = -2147483648

R = MetadataResponse


def partition_metadata(broker: Any, count: int) -> list[Any]:
    node = broker.node_id
    return [
        R.MetadataResponsePartition(
            error_code=0, partition_index=p, leader_id=node, leader_epoch=broker.leader_epoch,
            replica_nodes=[node], isr_nodes=[node], offline_replicas=[],
        )
        for p in range(count)
    ]


def topic_metadata(broker: Any, info: Any, authorized_ops: int) -> Any:
    return R.MetadataResponseTopic(
        error_code=0, name=info.name, topic_id=info.topic_id, is_internal=info.internal,
        partitions=partition_metadata(broker, info.partitions), topic_authorized_operations=authorized_ops,
    )


def topic_error(name: str | None, code: ErrorCode, topic_id: Any = None) -> Any:
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


@api(3)
async def handle_metadata(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    version = ctx.api_version
    ops = TOPIC_OPERATIONS if request.include_topic_authorized_operations else OPERATIONS_NOT_REQUESTED
    # v0 has no null: an empty list means every topic there
    all_topics = request.topics is None or (version == 0 and not request.topics)
    # auto-creation is always allowed before v4 (the flag does not exist there)
    allow_create = broker.config["auto.create.topics.enable"] and (version < 4 or request.allow_auto_topic_creation)
    topics: list[Any] = []
    if all_topics:
        topics = [topic_metadata(broker, info, ops) for info in list(broker.metadata.topics.values())]
    else:
        for wanted in request.topics:
            if wanted.name is None:
                info = broker.metadata.topic_by_id(wanted.topic_id)
                if info is None:
                    topics.append(topic_error(None, ErrorCode.UNKNOWN_TOPIC_ID, wanted.topic_id))
                else:
                    topics.append(topic_metadata(broker, info, ops))
                continue
            info = broker.metadata.topic(wanted.name)
            # internal topics are created by their coordinators, with their own partition counts
            # and configs: a client's Metadata request must not create them with the defaults
            if info is None and allow_create and wanted.name not in INTERNAL_TOPICS:
                try:
                    info = await broker.create_topic(wanted.name, -1, {})
                except KafkaError as exc:
                    if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                        topics.append(topic_error(wanted.name, exc.code))
                        continue
                    info = broker.metadata.topic(wanted.name)
            if info is None:
                topics.append(topic_error(wanted.name, _missing_topic_error(wanted.name)))
            else:
                topics.append(topic_metadata(broker, info, ops))
    host, port = broker.advertised(listener_of(ctx))
    return R(
        throttle_time_ms=0,
        brokers=[R.MetadataResponseBroker(node_id=broker.node_id, host=host, port=port, rack=broker.config["broker.rack"])],
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        topics=topics,
        cluster_authorized_operations=(
            CLUSTER_OPERATIONS if request.include_cluster_authorized_operations else OPERATIONS_NOT_REQUESTED
        ),
        error_code=0,
    )
