"""CreateTopics (key 19), DeleteTopics (key 20) and CreatePartitions (key 37).

Validation follows Kafka 4.x's controller, in its order and with its messages: the topic name,
an existing topic, the configs, then the partition layout. The registered nodes are this broker
(or those of a simulated cluster): a larger replication factor, or a manual assignment naming
another broker, is refused.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Collection

from broker.apis.configs import effective_topic_configs, validate_topic_configs
from broker.apis.context import BrokerServices, RequestContext
from broker.apis.registry import api
from broker.metadata import TopicInfo, validate_topic_name
from broker.security.acl import AUTHORIZATION_MESSAGES
from broker.security.authz import Op, Res, authorize, authorize_cluster
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

CLUSTER_METADATA_TOPIC = "__cluster_metadata"
MAX_PARTITIONS_PER_BATCH = 10_000  # Kafka's bound on the partitions one request may create
ZERO_UUID = uuid.UUID(int=0)

# Kafka's default messages, sent when an error is raised without a specific one
DEFAULT_MESSAGES = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "This server does not host this topic-partition.",
    ErrorCode.UNKNOWN_TOPIC_ID: "This server does not host this topic ID.",
}


def assigned_brokers(broker_ids: list[int], nodes: Collection[int], replication_factor: int | None) -> None:
    """Kafka's checks of one manual partition assignment (INVALID_REPLICA_ASSIGNMENT) over the
    registered `nodes`."""
    if not broker_ids:
        raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         "The manual partition assignment includes an empty replica list.")
    previous = None
    for broker_id in sorted(broker_ids):
        if broker_id not in nodes:
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             "The manual partition assignment includes broker %d, but no such broker is registered."
                             % broker_id)
        if broker_id == previous:
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             "The manual partition assignment includes the broker %d more than once." % broker_id)
        previous = broker_id
    if replication_factor is not None and len(broker_ids) != replication_factor:
        raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         "The manual partition assignment includes a partition with %d replica(s), but this is not "
                         "consistent with previous partitions, which have %d replica(s)."
                         % (len(broker_ids), replication_factor))


def _unable_to_replicate(replication_factor: int, registered: int) -> KafkaError:
    return KafkaError(
        ErrorCode.INVALID_REPLICATION_FACTOR,
        "Unable to replicate the partition %d time(s): The target replication factor of %d cannot be reached "
        "because only %d broker(s) are registered." % (replication_factor, replication_factor, registered),
    )


# ---------------------------------------------------------------------------------------------
# CreateTopics

C = M.CreateTopicsResponse


def partition_layout(broker: BrokerServices, topic: M.CreateTopicsRequest.CreatableTopic
                     ) -> tuple[int, int, list[list[int]] | None]:
    """(partitions, replication factor, manual assignments by partition or None) of a
    CreatableTopic, or KafkaError as Kafka's controller."""
    if topic.assignments:
        if topic.replication_factor != -1:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             "A manual partition assignment was specified, but replication factor was not set to -1.")
        if topic.num_partitions != -1:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             "A manual partition assignment was specified, but numPartitions was not set to -1.")
        seen: dict[int, list[int]] = {}
        replication_factor: int | None = None
        nodes = broker.topology.node_ids()
        for a in topic.assignments:
            if a.partition_index in seen:
                raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 "Found multiple manual partition assignments for partition %d" % a.partition_index)
            assigned_brokers(a.broker_ids, nodes, replication_factor)
            replication_factor = len(a.broker_ids)
            seen[a.partition_index] = list(a.broker_ids)
        if set(seen) != set(range(len(seen))):
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             "partitions should be a consecutive 0-based integer sequence")
        return len(seen), replication_factor or 1, [seen[p] for p in range(len(seen))]
    if topic.replication_factor < -1 or topic.replication_factor == 0:
        raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR,
                         "Replication factor must be larger than 0, or -1 to use the default value.")
    if topic.num_partitions < -1 or topic.num_partitions == 0:
        raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")
    partitions = int(broker.config["num.partitions"]) if topic.num_partitions == -1 else topic.num_partitions
    factor = (int(broker.config["default.replication.factor"]) if topic.replication_factor == -1
              else topic.replication_factor)
    if factor <= 0:
        raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR, "Unable to replicate the partition %d time(s): Invalid "
                         "replication factor %d: the replication factor must be positive." % (factor, factor))
    if factor > broker.topology.broker_count():
        raise _unable_to_replicate(factor, broker.topology.broker_count())
    return partitions, factor, None


def _check_name(broker: BrokerServices, name: str) -> None:
    validate_topic_name(name)
    collides = name.replace(".", "_")
    if "." in name or "_" in name:
        for other in broker.metadata.topics:
            if other != name and other.replace(".", "_") == collides:
                raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                                 "Topic '%s' collides with existing topic: %s" % (name, other))


async def _create_topic(broker: BrokerServices, topic: M.CreateTopicsRequest.CreatableTopic, validate_only: bool
                        ) -> C.CreatableTopicResult:
    name = topic.name
    if broker.metadata.topic(name) is not None:
        raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, "Topic '%s' already exists." % name)
    _check_name(broker, name)
    nulls = [c.name for c in topic.configs if c.value is None]
    if nulls:
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Null value not supported for topic configs: " + ",".join(nulls))
    configs = {c.name: c.value for c in topic.configs if c.value is not None}  # no nulls: refused above
    validate_topic_configs(broker, configs)
    partitions, factor, assignments = partition_layout(broker, topic)
    if validate_only:
        topic_id = uuid.uuid4()  # Kafka answers a validation with the id the topic would have had
    else:
        topic_id = (await broker.create_topic(name, partitions, configs, replication_factor=factor,
                                              assignments=assignments)).topic_id
    return C.CreatableTopicResult(
        name=name, topic_id=topic_id, error_code=0, error_message=None, num_partitions=partitions,
        replication_factor=factor, topic_config_error_code=0,
        configs=[
            C.CreatableTopicConfigs(name=n, value=v, read_only=False, config_source=source, is_sensitive=False)
            for n, v, source in effective_topic_configs(configs, broker.config)
        ],
    )


def _create_error(name: str, code: ErrorCode, message: str | None) -> C.CreatableTopicResult:
    return C.CreatableTopicResult(name=name, error_code=int(code), error_message=message)


def _requested_partitions(broker: BrokerServices, topics: list[M.CreateTopicsRequest.CreatableTopic]) -> int:
    total = 0
    for t in topics:
        if t.assignments:
            total += len(t.assignments)
        elif t.num_partitions == -1:
            total += int(broker.config["num.partitions"])
        elif t.num_partitions > 0:
            total += t.num_partitions
    return total


@api(19)
async def handle_create_topics(ctx: RequestContext, request: M.CreateTopicsRequest) -> M.CreateTopicsResponse:
    broker = ctx.broker
    if _requested_partitions(broker, request.topics) > MAX_PARTITIONS_PER_BATCH:
        message = "Excessively large number of partitions per request."
        return C(throttle_time_ms=0, topics=[
            _create_error(t.name, ErrorCode.POLICY_VIOLATION, message) for t in request.topics
        ])
    counts = Counter(t.name for t in request.topics)
    results = []
    answered: set[str] = set()
    # CREATE on the cluster allows every topic, else CREATE on each; the configs are answered
    # only with DESCRIBE_CONFIGS on the topic (ControllerApis.createTopics)
    cluster_create = authorize_cluster(ctx, Op.CREATE, log_if_denied=False)
    for topic in request.topics:
        if topic.name in answered:
            continue
        answered.add(topic.name)
        if counts[topic.name] > 1:
            results.append(_create_error(topic.name, ErrorCode.INVALID_REQUEST, "Duplicate topic name."))
        elif topic.name == CLUSTER_METADATA_TOPIC:
            results.append(_create_error(topic.name, ErrorCode.INVALID_REQUEST,
                                         "Creation of internal topic %s is prohibited." % CLUSTER_METADATA_TOPIC))
        elif not cluster_create and not authorize(ctx, Op.CREATE, Res.TOPIC, topic.name):
            results.append(_create_error(topic.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed."))
        else:
            try:
                result = await _create_topic(broker, topic, request.validate_only)
            except KafkaError as exc:
                results.append(_create_error(topic.name, exc.code, exc.message))
                continue
            if not authorize(ctx, Op.DESCRIBE_CONFIGS, Res.TOPIC, topic.name, log_if_denied=False):
                result.configs, result.num_partitions, result.replication_factor = [], -1, -1
                result.topic_config_error_code = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            results.append(result)
    return C(throttle_time_ms=0, topics=results)


# ---------------------------------------------------------------------------------------------
# DeleteTopics

T = M.DeleteTopicsResponse


def _deleted(name: str | None, topic_id: uuid.UUID, code: ErrorCode = ErrorCode.NONE,
             message: str | None = None) -> T.DeletableTopicResult:
    return T.DeletableTopicResult(name=name, topic_id=topic_id, error_code=int(code), error_message=message)


def _requested_topics(request: M.DeleteTopicsRequest, version: int) -> list[tuple[str | None, uuid.UUID]]:
    if version >= 6:
        return [(t.name, t.topic_id) for t in request.topics]
    return [(name, ZERO_UUID) for name in request.topic_names]


@api(20)
async def handle_delete_topics(ctx: RequestContext, request: M.DeleteTopicsRequest) -> M.DeleteTopicsResponse:
    broker = ctx.broker
    version = ctx.api_version
    requested = _requested_topics(request, version)
    if not broker.config["delete.topic.enable"]:
        code = ErrorCode.INVALID_REQUEST if version < 3 else ErrorCode.TOPIC_DELETION_DISABLED
        return T(throttle_time_ms=0, responses=[_deleted(n, i, code) for n, i in requested])
    responses = []
    by_name = Counter(n for n, i in requested if n is not None and i == ZERO_UUID)
    by_id = Counter(i for n, i in requested if n is None and i != ZERO_UUID)
    for name, topic_id in requested:
        if name is None and topic_id == ZERO_UUID:
            responses.append(_deleted(None, ZERO_UUID, ErrorCode.INVALID_REQUEST,
                                      "Neither topic name nor id were specified."))
        elif name is not None and topic_id != ZERO_UUID:
            responses.append(_deleted(name, topic_id, ErrorCode.INVALID_REQUEST,
                                      "You may not specify both topic name and topic id."))
    for name, count in by_name.items():
        if count > 1:
            responses.append(_deleted(name, ZERO_UUID, ErrorCode.INVALID_REQUEST, "Duplicate topic name."))
    for topic_id, count in by_id.items():
        if count > 1:
            responses.append(_deleted(None, topic_id, ErrorCode.INVALID_REQUEST, "Duplicate topic id."))
    doomed: dict[uuid.UUID, str] = {}
    # DELETE on the cluster allows every topic, else DESCRIBE and DELETE on each are looked at
    # (ControllerApis.deleteTopics): a name the principal may not describe is not looked up
    everything = authorize_cluster(ctx, Op.DELETE, log_if_denied=False)

    def describable(topic: str) -> bool:
        return everything or authorize(ctx, Op.DESCRIBE, Res.TOPIC, topic)

    def deletable(topic: str) -> bool:
        return everything or authorize(ctx, Op.DELETE, Res.TOPIC, topic)

    denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    for topic_id, count in by_id.items():
        if count == 1:
            info = broker.metadata.topic_by_id(topic_id)
            if info is None:
                responses.append(_deleted(None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID,
                                          DEFAULT_MESSAGES[ErrorCode.UNKNOWN_TOPIC_ID]))
            elif not deletable(info.name):
                responses.append(_deleted(info.name if describable(info.name) else None, topic_id, denied,
                                          AUTHORIZATION_MESSAGES[denied]))
            else:
                doomed[topic_id] = info.name
    for name, count in by_name.items():
        if count == 1:
            if not describable(name):
                responses.append(_deleted(name, ZERO_UUID, denied, AUTHORIZATION_MESSAGES[denied]))
                continue
            info = broker.metadata.topic(name)
            if info is None:
                responses.append(_deleted(name, ZERO_UUID, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                          DEFAULT_MESSAGES[ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]))
            elif not deletable(name):
                responses.append(_deleted(name, ZERO_UUID, denied, AUTHORIZATION_MESSAGES[denied]))
            elif info.topic_id in doomed:
                del doomed[info.topic_id]
                responses.append(_deleted(name, info.topic_id, ErrorCode.INVALID_REQUEST,
                                          "The provided topic name maps to an ID that was already supplied."))
            else:
                doomed[info.topic_id] = name
    for topic_id, name in doomed.items():
        try:
            await broker.delete_topic(name)
            responses.append(_deleted(name, topic_id))
        except KafkaError as exc:
            responses.append(_deleted(name, topic_id, exc.code, exc.message))
    return T(throttle_time_ms=0, responses=responses)


# ---------------------------------------------------------------------------------------------
# CreatePartitions

P = M.CreatePartitionsResponse


def check_new_partitions(broker: BrokerServices, topic: M.CreatePartitionsRequest.CreatePartitionsTopic) -> TopicInfo:
    """Kafka's checks of a CreatePartitionsTopic against the topic as it is (returned)."""
    info = broker.metadata.topic(topic.name)
    if info is None:
        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    if topic.count == info.partitions:
        raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Topic already has %d partition(s)." % info.partitions)
    if topic.count < info.partitions:
        raise KafkaError(ErrorCode.INVALID_PARTITIONS, "The topic %s currently has %d partition(s); %d would not be "
                         "an increase." % (topic.name, info.partitions, topic.count))
    additional = topic.count - info.partitions
    if topic.assignments is not None:
        if len(topic.assignments) != additional:
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Attempted to add %d additional partition(s), but "
                             "only %d assignment(s) were specified." % (additional, len(topic.assignments)))
        factor = len(info.assignments[0].replicas) if 0 in info.assignments else 1
        for a in topic.assignments:
            assigned_brokers(a.broker_ids, broker.topology.node_ids(), factor)
    return info


@api(37)
async def handle_create_partitions(ctx: RequestContext, request: M.CreatePartitionsRequest) -> M.CreatePartitionsResponse:
    broker = ctx.broker
    counts = Counter(t.name for t in request.topics)
    results = [
        P.CreatePartitionsTopicResult(name=name, error_code=int(ErrorCode.INVALID_REQUEST),
                                      error_message="Duplicate topic name.")
        for name, count in counts.items() if count > 1
    ]
    budget = MAX_PARTITIONS_PER_BATCH
    for topic in request.topics:
        if counts[topic.name] > 1:
            continue
        if not authorize(ctx, Op.ALTER, Res.TOPIC, topic.name):
            results.append(P.CreatePartitionsTopicResult(
                name=topic.name, error_code=int(ErrorCode.TOPIC_AUTHORIZATION_FAILED), error_message=None))
            continue
        try:
            info = check_new_partitions(broker, topic)
            budget -= topic.count - info.partitions
            if budget < 0:
                raise KafkaError(ErrorCode.POLICY_VIOLATION, "Excessively large number of partitions per request.")
            assignments = [list(a.broker_ids) for a in topic.assignments] if topic.assignments is not None else None
            await broker.create_partitions(topic.name, topic.count, request.validate_only, assignments)
            results.append(P.CreatePartitionsTopicResult(name=topic.name, error_code=0, error_message=None))
        except KafkaError as exc:
            results.append(P.CreatePartitionsTopicResult(name=topic.name, error_code=int(exc.code),
                                                         error_message=exc.message))
    return P(throttle_time_ms=0, results=results)
