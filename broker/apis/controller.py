"""APIs a Kafka broker forwards to its controller: a single node is its own controller; in a
cluster they run on the active controller (ElectLeaders and AlterPartitionReassignments there go
to broker/cluster's controller).

UpdateFeatures (57), ElectLeaders (43), AlterPartitionReassignments (45),
ListPartitionReassignments (46) and DescribeQuorum (55), answered as Kafka's controller answers
them.

UpdateFeatures changes finalized feature levels (broker.metadata.features), all or nothing as
Kafka's FeatureControlManager: the first failing update is the top-level error and nothing
changes. v0-1 list a result per feature on success; v2 has only the top-level error.
"""

from __future__ import annotations

import time
from typing import Any

from broker.apis.context import BrokerServices, RequestContext
from broker.apis.registry import api
from broker.apis.topics import assigned_brokers
from broker.metadata import features
from broker.metadata.image import Assignment, MetadataImage
from broker.metadata.quorum import Replica
from broker.security.authz import Op, authorize_cluster, listener_of, require_cluster
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError


def now_ms() -> int:
    return int(time.time() * 1000)

UF = M.UpdateFeaturesResponse


@api(57)
async def handle_update_features(ctx: RequestContext, request: M.UpdateFeaturesRequest) -> M.UpdateFeaturesResponse:
    require_cluster(ctx, Op.ALTER)
    updates = []
    for u in request.feature_updates:
        if ctx.api_version == 0:
            upgrade_type = features.SAFE_DOWNGRADE if u.allow_downgrade else features.UPGRADE
        else:
            upgrade_type = u.upgrade_type
        updates.append((u.feature, u.max_version_level, upgrade_type))
    validate_only = ctx.api_version >= 1 and request.validate_only
    try:
        ctx.broker.metadata.update_features(updates, validate_only, ctx.broker.config.static_min_insync_replicas)
    except KafkaError as exc:
        return UF(throttle_time_ms=0, error_code=int(exc.code), error_message=exc.message, results=[])
    if not validate_only:
        ctx.broker.apply_dynamic_configs()  # enabling ELR may have moved min.insync.replicas
    results = [UF.UpdatableFeatureResult(feature=name, error_code=0, error_message=None) for name, _, _ in updates]
    return UF(throttle_time_ms=0, error_code=0, error_message=None, results=results)


# ---------------------------------------------------------------------------------------------
# ElectLeaders (key 43): every partition has its leader, this node (ReplicationControlManager),
# unless a simulated cluster moved it away from its preferred replica

PREFERRED, UNCLEAN = 0, 1
EL = M.ElectLeadersResponse


async def _elect(broker: BrokerServices, topic: str, index: int, election_type: int) -> KafkaError | None:
    info = broker.metadata.topic(topic)
    if info is None:
        return KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such topic as %s" % topic)
    if not 0 <= index < info.partitions:
        return KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such partition as %s-%d" % (topic, index))
    leader, replicas, isr = broker.topology.assignment(topic, index)
    if election_type == UNCLEAN or leader == replicas[0]:
        return ELECTION_NOT_NEEDED  # the preferred replica leads (or, unclean, a leader is there)
    # a simulated cluster whose leader moved: the preferred replica takes over if it is in sync
    if replicas[0] not in isr or replicas[0] in broker.topology.offline_nodes():
        return KafkaError(ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                          "Failed to elect leader for partition %s-%d under strategy PREFERRED" % (topic, index))
    await broker.move_leader(topic, index, replicas[0])
    return None


def _cluster_controller(broker: BrokerServices) -> Any:
    """The active controller of a cluster node (KafkaError NOT_CONTROLLER if this node is not
    it); None for a single node or a simulated cluster."""
    node = getattr(getattr(broker, "cluster", None), "node", None)
    if node is None:
        return None
    if node.controller is None or not node.controller.active:
        raise KafkaError(ErrorCode.NOT_CONTROLLER, "This node is not the active controller.")
    return node.controller


ELECTION_NOT_NEEDED = KafkaError(ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.")


def _partition_result(index: int, error: KafkaError | None) -> EL.PartitionResult:
    return EL.PartitionResult(partition_id=index, error_code=int(error.code) if error else 0,
                              error_message=error.message if error else None)


@api(43)
async def handle_elect_leaders(ctx: RequestContext, request: M.ElectLeadersRequest) -> M.ElectLeadersResponse:
    broker = ctx.broker
    if not authorize_cluster(ctx, Op.ALTER):
        denied = KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None)
        return EL(throttle_time_ms=0, error_code=int(denied.code), replica_election_results=[
            EL.ReplicaElectionResult(topic=t.topic, partition_result=[_partition_result(p, denied)
                                                                      for p in t.partitions])
            for t in request.topic_partitions or []])
    election_type = request.election_type if ctx.api_version >= 1 else PREFERRED
    if election_type not in (PREFERRED, UNCLEAN):
        return EL(throttle_time_ms=0, error_code=int(ErrorCode.INVALID_REQUEST), replica_election_results=[])
    controller = _cluster_controller(broker)
    if controller is not None:  # a cluster: the active controller elects (broker/cluster/elections.py)
        asked = None if request.topic_partitions is None else \
            [(t.topic, list(t.partitions)) for t in request.topic_partitions]
        elected = await controller.elect_leaders(election_type, asked)
        return EL(throttle_time_ms=0, error_code=0, replica_election_results=[
            EL.ReplicaElectionResult(topic=name, partition_result=[
                EL.PartitionResult(partition_id=p, error_code=int(code), error_message=message)
                for p, code, message in found]) for name, found in elected])
    results = []
    if request.topic_partitions is None:
        # every partition; those that already have the desired leader are left out of the answer
        for name, info in sorted(broker.metadata.topics.items()):
            errors = [(p, await _elect(broker, name, p, election_type)) for p in range(info.partitions)]
            results.append(EL.ReplicaElectionResult(topic=name, partition_result=[
                _partition_result(p, e) for p, e in errors if e is not ELECTION_NOT_NEEDED]))
    else:
        for t in request.topic_partitions:
            results.append(EL.ReplicaElectionResult(topic=t.topic, partition_result=[
                _partition_result(p, await _elect(broker, t.topic, p, election_type)) for p in t.partitions]))
    return EL(throttle_time_ms=0, error_code=0, replica_election_results=results)


# ---------------------------------------------------------------------------------------------
# AlterPartitionReassignments (key 45) / ListPartitionReassignments (key 46): a cluster's active
# controller reassigns (broker/cluster/reassignment.py); a simulated cluster moves the replicas at
# once (it replicates nothing); a single node is the only valid target, with nothing to do.

AR = M.AlterPartitionReassignmentsResponse
LR = M.ListPartitionReassignmentsResponse


def _check_target(broker: BrokerServices, topic: str, index: int, replicas: list[int] | None) -> None:
    """Kafka's checks in its order: the partition, then the target against the registered brokers."""
    info = broker.metadata.topic(topic)
    if info is None:
        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find a topic named %s." % topic)
    if not 0 <= index < info.partitions:
        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find partition %s:%d." % (topic, index))
    if replicas is not None:
        assigned_brokers(list(replicas), broker.topology.node_ids(), None)


async def _reassign(broker: BrokerServices, asked: list[tuple[str, int, list[int] | None]], allow: bool
                    ) -> list[KafkaError | None]:
    errors: list[KafkaError | None] = []
    valid = []
    for topic, index, replicas in asked:
        try:
            _check_target(broker, topic, index, replicas)
            errors.append(None)
            valid.append((topic, index, replicas))
        except KafkaError as exc:
            errors.append(exc)
    controller = _cluster_controller(broker)
    if controller is not None:
        done = iter(await controller.alter_partition_reassignments(valid, allow))
        for i, error in enumerate(errors):
            if error is None:
                code, message = next(done)
                errors[i] = KafkaError(code, message) if code != ErrorCode.NONE else None
        return errors
    for i, (topic, index, replicas) in enumerate(asked):
        if errors[i] is not None:
            continue
        current = broker.topology.assignment(topic, index)[1]
        if replicas is None:  # none is ever in progress: each completes at once
            errors[i] = KafkaError(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "No partition reassignment is in progress.")
        elif not allow and len(replicas) != len(current):
            errors[i] = KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR, "The replication factor is changed from "
                                   "%d to %d" % (len(current), len(replicas)))
        elif replicas != current:
            await broker.move_replicas(topic, index, replicas)
    return errors


@api(45)
async def handle_alter_partition_reassignments(ctx: RequestContext, request: M.AlterPartitionReassignmentsRequest
                                               ) -> M.AlterPartitionReassignmentsResponse:
    require_cluster(ctx, Op.ALTER)
    allow = request.allow_replication_factor_change if ctx.api_version >= 1 else True
    asked = [(t.name, p.partition_index, None if p.replicas is None else list(p.replicas))
             for t in request.topics for p in t.partitions]
    errors = iter(await _reassign(ctx.broker, asked, allow))
    responses = []
    for t in request.topics:
        partitions = []
        for p in t.partitions:
            error = next(errors)
            partitions.append(AR.ReassignablePartitionResponse(
                partition_index=p.partition_index, error_code=int(error.code) if error else 0,
                error_message=error.message if error else None))
        responses.append(AR.ReassignableTopicResponse(name=t.name, partitions=partitions))
    return AR(throttle_time_ms=0, allow_replication_factor_change=allow, error_code=0, error_message=None,
              responses=responses)


def ongoing_reassignments(image: MetadataImage, asked: list[tuple[str, list[int]]] | None
                          ) -> list[tuple[str, list[tuple[int, Assignment]]]]:
    """The partitions being reassigned, of every topic (None) or of those asked (unknown topics
    and partitions left out, as Kafka does)."""
    if asked is None:
        asked = [(name, sorted(t.assignments)) for name, t in sorted(image.topics.items())]
    out = []
    for name, indexes in asked:
        topic = image.topics.get(name)
        found = [(i, topic.assignments[i]) for i in indexes
                 if i in topic.assignments and topic.assignments[i].reassigning] if topic is not None else []
        if found:
            out.append((name, found))
    return out


@api(46)
async def handle_list_partition_reassignments(ctx: RequestContext, request: M.ListPartitionReassignmentsRequest
                                              ) -> M.ListPartitionReassignmentsResponse:
    require_cluster(ctx, Op.DESCRIBE)
    asked = None if request.topics is None else [(t.name, list(t.partition_indexes)) for t in request.topics]
    return LR(throttle_time_ms=0, error_code=0, error_message=None, topics=[
        LR.OngoingTopicReassignment(name=name, partitions=[
            LR.OngoingPartitionReassignment(partition_index=index, replicas=list(a.replicas),
                                            adding_replicas=list(a.adding_replicas),
                                            removing_replicas=list(a.removing_replicas))
            for index, a in found])
        for name, found in ongoing_reassignments(ctx.broker.metadata.image, asked)])


# ---------------------------------------------------------------------------------------------
# DescribeQuorum (key 55): a single node is the voter and leader of its metadata log; a node of
# a cluster reports the active controller as the leader (broker/metadata/quorum.py QuorumState)

DQ = M.DescribeQuorumResponse
METADATA_TOPIC = "__cluster_metadata"


def _quorum_partition(broker: BrokerServices, now_ms: int) -> DQ.PartitionData:
    quorum = broker.metadata_quorum()

    def state(r: Replica) -> DQ.ReplicaState:
        seen = now_ms if r.log_end_offset >= 0 else -1
        return DQ.ReplicaState(replica_id=r.node_id, replica_directory_id=r.directory_id,
                               log_end_offset=r.log_end_offset, last_fetch_timestamp=seen,
                               last_caught_up_timestamp=seen)

    return DQ.PartitionData(partition_index=0, error_code=0, error_message=None, leader_id=quorum.leader_id,
                            leader_epoch=quorum.leader_epoch, high_watermark=quorum.high_watermark,
                            current_voters=[state(r) for r in quorum.voters],
                            observers=[state(r) for r in quorum.observers])


@api(55)
async def handle_describe_quorum(ctx: RequestContext, request: M.DescribeQuorumRequest) -> M.DescribeQuorumResponse:
    require_cluster(ctx, Op.DESCRIBE)
    broker = ctx.broker
    valid = (len(request.topics) == 1 and request.topics[0].topic_name == METADATA_TOPIC
             and [p.partition_index for p in request.topics[0].partitions] == [0])
    topics = []
    if valid:
        topics = [DQ.TopicData(topic_name=METADATA_TOPIC, partitions=[_quorum_partition(broker, now_ms())])]
    else:
        code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        topics = [DQ.TopicData(topic_name=t.topic_name, partitions=[
            DQ.PartitionData(partition_index=p.partition_index, error_code=int(code), error_message="This server does not host this topic-partition.",
                             leader_id=-1, leader_epoch=-1, high_watermark=-1, current_voters=[], observers=[])
            for p in t.partitions]) for t in request.topics]
    listener = listener_of(ctx)
    nodes = [DQ.Node(node_id=node, listeners=[DQ.Listener(name=listener or "PLAINTEXT", host=host, port=port)])
             for node, host, port in broker.topology.live_brokers(listener)]
    return DQ(error_code=0, error_message=None, topics=topics, nodes=nodes)
