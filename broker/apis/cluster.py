"""DescribeCluster (key 60), DescribeLogDirs (key 35), AlterReplicaLogDirs (key 34) and DescribeProducers (key 61)."""

from __future__ import annotations

import os
from collections import defaultdict

from broker.apis.context import BrokerServices, RequestContext
from broker.apis.metadata import cluster_authorized_operations
from broker.apis.registry import api
from broker.metadata import validate_topic_name
from broker.observability.logger import get_logger
from broker.partition import Partition
from broker.security.authz import Op, Res, authorize, authorize_cluster, listener_of
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

ENDPOINT_BROKER = 1
ENDPOINT_CONTROLLER = 2
LONG_MAX = (1 << 63) - 1
CLUSTER_METADATA_TOPIC = "__cluster_metadata"  # the metadata log lives in a log dir but is not a topic

DC = M.DescribeClusterResponse
log = get_logger("broker.cluster")


@api(60)
async def handle_describe_cluster(ctx: RequestContext, request: M.DescribeClusterRequest) -> M.DescribeClusterResponse:
    broker = ctx.broker
    endpoint = request.endpoint_type if ctx.api_version >= 1 else ENDPOINT_BROKER
    if endpoint not in (ENDPOINT_BROKER, ENDPOINT_CONTROLLER):
        code = ErrorCode.INVALID_REQUEST if ctx.api_version == 0 else ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
        return DC(error_code=int(code), error_message="Unsupported endpoint type %d" % endpoint)
    if endpoint != ENDPOINT_BROKER:
        code = ErrorCode.INVALID_REQUEST if ctx.api_version == 0 else ErrorCode.MISMATCHED_ENDPOINT_TYPE
        return DC(error_code=int(code), error_message="The request was sent to an endpoint of type BROKER, but we "
                  "wanted an endpoint of type CONTROLLER")
    nodes = broker.topology.live_brokers(listener_of(ctx))
    return DC(
        throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=ENDPOINT_BROKER,
        cluster_id=broker.cluster_id, controller_id=broker.topology.controller_id(),
        brokers=[DC.DescribeClusterBroker(broker_id=node, host=host, port=port, rack=broker.topology.rack(node),
                                          is_fenced=False) for node, host, port in nodes],
        cluster_authorized_operations=(
            cluster_authorized_operations(ctx) if request.include_cluster_authorized_operations else -2147483648
        ),
    )


L = M.DescribeLogDirsResponse


def _disk_space(path: str) -> tuple[int, int]:
    """Total and usable bytes of the file system holding `path` (what Java's FileStore reports)."""
    st = os.statvfs(path)
    return min(st.f_blocks * st.f_frsize, LONG_MAX), min(st.f_bavail * st.f_frsize, LONG_MAX)


def describe_log_dir(broker: BrokerServices, log_dir: str, wanted: set[tuple[str, int]] | None
                     ) -> L.DescribeLogDirsResult:
    """One log dir as ReplicaManager.describeLogDirs reports it: its partitions (and the future
    replicas being copied into it) among `wanted` (None: all), topics without any left out."""
    logs = broker.logs
    topics: dict[str, list[L.DescribeLogDirsPartition]] = defaultdict(list)
    for (topic, index), log in sorted(logs.logs.items()):
        if topic == CLUSTER_METADATA_TOPIC or (wanted is not None and (topic, index) not in wanted):
            continue
        if logs.log_dir_of(topic, index) == log_dir:
            partition = broker.partitions.get(topic, index)
            lag = max(0, partition.high_watermark - log.log_end_offset) if partition is not None else 0
            topics[topic].append(L.DescribeLogDirsPartition(partition_index=index, partition_size=log.size,
                                                            offset_lag=lag, is_future_key=False))
        future = broker.log_dir_mover.future_of(topic, index)
        if future is not None and future[0] == log_dir:
            topics[topic].append(L.DescribeLogDirsPartition(partition_index=index, partition_size=future[1],
                                                            offset_lag=future[2], is_future_key=True))
    try:
        total, usable = _disk_space(log_dir)
    except OSError:
        return L.DescribeLogDirsResult(error_code=int(ErrorCode.KAFKA_STORAGE_ERROR), log_dir=log_dir, topics=[])
    return L.DescribeLogDirsResult(
        error_code=0, log_dir=log_dir, total_bytes=total, usable_bytes=usable,
        topics=[L.DescribeLogDirsTopic(name=t, partitions=p) for t, p in topics.items()],
    )


@api(35)
async def handle_describe_log_dirs(ctx: RequestContext, request: M.DescribeLogDirsRequest) -> M.DescribeLogDirsResponse:
    broker = ctx.broker
    if not authorize_cluster(ctx, Op.DESCRIBE):
        return L(throttle_time_ms=0, error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED), results=[])
    wanted = None
    if request.topics is not None:
        wanted = {(t.topic, p) for t in request.topics for p in t.partitions}
    return L(throttle_time_ms=0, error_code=0,
             results=[describe_log_dir(broker, d, wanted) for d in broker.logs.log_dirs])


A = M.AlterReplicaLogDirsResponse


@api(34)
async def handle_alter_replica_log_dirs(ctx: RequestContext, request: M.AlterReplicaLogDirsRequest
                                        ) -> M.AlterReplicaLogDirsResponse:
    """Each partition starts moving to its directory (the answer does not wait for the copy); the
    errors are ReplicaManager.alterReplicaLogDirs'."""
    targets: dict[tuple[str, int], str] = {}
    for d in request.dirs:
        for t in d.topics:
            for p in t.partitions:
                targets[(t.name, p)] = d.path
    allowed = authorize_cluster(ctx, Op.ALTER)
    results: dict[str, list[A.AlterReplicaLogDirPartitionResult]] = defaultdict(list)
    for (topic, index), path in targets.items():
        code = ErrorCode.NONE if allowed else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        try:
            if allowed:
                ctx.broker.log_dir_mover.alter(topic, index, path)
        except KafkaError as exc:
            log.warning("unable to alter log dirs", topic=topic, partition=index, error=exc.message)
            code = exc.code
        results[topic].append(A.AlterReplicaLogDirPartitionResult(partition_index=index, error_code=int(code)))
    return A(throttle_time_ms=0, results=[A.AlterReplicaLogDirTopicResult(topic_name=t, partitions=p)
                                          for t, p in results.items()])


DP = M.DescribeProducersResponse


def active_producers(partition: Partition) -> list[DP.ProducerState]:
    return [
        DP.ProducerState(producer_id=pid, producer_epoch=entry.epoch, last_sequence=entry.last_seq,
                         last_timestamp=entry.last_timestamp, coordinator_epoch=entry.coordinator_epoch,
                         current_txn_start_offset=entry.current_txn_first_offset)
        for pid, entry in sorted(partition.producers.producers.items())
    ]


@api(61)
async def handle_describe_producers(ctx: RequestContext, request: M.DescribeProducersRequest) -> M.DescribeProducersResponse:
    broker = ctx.broker
    topics = []
    for t in request.topics:
        error: KafkaError | None = None
        try:
            validate_topic_name(t.name)
        except KafkaError as exc:
            error = exc
        if error is None and not authorize(ctx, Op.READ, Res.TOPIC, t.name):
            error = KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, None)
        if error is None and broker.metadata.topic(t.name) is None:
            error = KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition.")
        partitions = []
        for index in t.partition_indexes:
            partition = broker.partitions.get(t.name, index) if error is None else None
            if error is not None:
                partitions.append(DP.PartitionResponse(partition_index=index, error_code=int(error.code),
                                                       error_message=error.message))
            elif partition is None:
                partitions.append(DP.PartitionResponse(partition_index=index,
                                                       error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)))
            else:
                partitions.append(DP.PartitionResponse(partition_index=index, error_code=0,
                                                       active_producers=active_producers(partition)))
        topics.append(DP.TopicResponse(name=t.name, partitions=partitions))
    return DP(throttle_time_ms=0, topics=topics)
