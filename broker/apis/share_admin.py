"""Share group offset admin APIs (KIP-932): DescribeShareGroupOffsets (90), AlterShareGroupOffsets
(91) and DeleteShareGroupOffsets (92).

As Kafka's KafkaApis and GroupCoordinatorService: the group coordinator validates the group (a
share group with no members; 91 creates one that does not exist yet, as Kafka 4.2, 92 needs it to
exist) and keeps which share-partitions are initialized;
the share coordinator holds their state. Describe reads each share-partition's start offset and
(v1) its lag = log end - start offset - records already delivered above the start offset, -1 while
unknown (from the share-partition in memory when loaded: the persisted start offset trails by one
write, as in Kafka); a share-partition without state has start offset -1. Naming no topics (null) describes
every initialized share-partition of the group; an unknown topic comes back with a zero topic id
and start offset -1. Alter initializes the state at the given start offsets under the group epoch
as state epoch; delete removes the state of whole topics. The share-partitions this broker holds
in memory are dropped, so the next fetch reads the new state.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from broker.apis.context import BrokerServices, RequestContext
from broker.apis.group import coordinator_of
from broker.apis.registry import api
from broker.apis.share import UNSUPPORTED, share_groups_enabled
from broker.security.acl import AUTHORIZATION_MESSAGES
from broker.security.authz import Op, Res, authorize
from broker.share.manager import SharePartitionManager
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:  # for annotations only (not imported with the handlers)
    from broker.coordinator.share import ShareCoordinator
    from broker.share.persister import ShareStateRouter

E = ErrorCode
DR = M.DescribeShareGroupOffsetsResponse
AR = M.AlterShareGroupOffsetsResponse
XR = M.DeleteShareGroupOffsetsResponse
ZERO_UUID = uuid.UUID(int=0)
UNINITIALIZED_START_OFFSET = -1
UNINITIALIZED_LAG = -1
NO_DELIVERY_COMPLETE_COUNT = -1
UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."


def _error(exc: BaseException) -> tuple[ErrorCode, str | None]:
    if isinstance(exc, KafkaError):
        return exc.code, exc.message
    return E.UNKNOWN_SERVER_ERROR, str(exc)


def broker_coordinator(broker: BrokerServices) -> ShareCoordinator:
    coordinator = broker.share_coordinator
    if coordinator is None:
        raise KafkaError(E.COORDINATOR_NOT_AVAILABLE)
    return coordinator


def _share_state(broker: BrokerServices) -> tuple[ShareCoordinator | ShareStateRouter, SharePartitionManager]:
    """Where the durable state is (this node's share coordinator; in a cluster, the share-state
    router: each key's share coordinator, maybe another node) and the share-partition manager
    (what is in memory here)."""
    coordinator, manager = broker.share_coordinator, broker.share_manager
    if coordinator is None or manager is None:  # not started yet
        raise KafkaError(E.COORDINATOR_NOT_AVAILABLE)
    return broker.share_state or coordinator, manager


# ----- DescribeShareGroupOffsets -----------------------------------------------------------
async def _describe_partition(broker: BrokerServices, group_id: str, topic_id: uuid.UUID, name: str, index: int
                              ) -> DR.DescribeShareGroupOffsetsResponsePartition:
    key = (group_id, topic_id, index)
    _, manager = _share_state(broker)
    router = broker.share_state  # in a cluster, Kafka's ReadShareGroupStateSummary to the key's coordinator
    state = await router.read_summary(key) if router is not None else await broker_coordinator(broker).read_state(key)
    if state is None or state.start_offset == UNINITIALIZED_START_OFFSET:
        return DR.DescribeShareGroupOffsetsResponsePartition(
            partition_index=index, start_offset=UNINITIALIZED_START_OFFSET,
            leader_epoch=0 if state is None else state.leader_epoch, lag=UNINITIALIZED_LAG)
    # the share-partition this broker serves is fresher than its last write
    start, complete = manager.live_offsets(key) or (state.start_offset, state.delivery_complete_count)
    lag = UNINITIALIZED_LAG
    if complete != NO_DELIVERY_COMPLETE_COUNT:
        end = await broker.partition_end_offset(name, index)  # the leader's high watermark, maybe another node's
        if end is None:
            return DR.DescribeShareGroupOffsetsResponsePartition(
                partition_index=index, error_code=E.UNKNOWN_TOPIC_OR_PARTITION, error_message=UNKNOWN_TOPIC_MESSAGE)
        lag = end - start - complete
    return DR.DescribeShareGroupOffsetsResponsePartition(
        partition_index=index, start_offset=start, leader_epoch=state.leader_epoch, lag=lag)


async def _describe_group(ctx: RequestContext, group: M.DescribeShareGroupOffsetsRequest.DescribeShareGroupOffsetsRequestGroup
                          ) -> DR.DescribeShareGroupOffsetsResponseGroup:
    broker = ctx.broker
    group_id = group.group_id
    if not share_groups_enabled(ctx):
        return DR.DescribeShareGroupOffsetsResponseGroup(group_id=group_id, error_code=UNSUPPORTED.code, topics=[])
    if not authorize(ctx, Op.DESCRIBE, Res.GROUP, group_id):
        return DR.DescribeShareGroupOffsetsResponseGroup(group_id=group_id, error_code=E.GROUP_AUTHORIZATION_FAILED,
                                                         topics=[])
    if group.topics is not None and not group.topics:
        return DR.DescribeShareGroupOffsetsResponseGroup(group_id=group_id, topics=[])
    try:
        wanted: list[tuple[uuid.UUID, str, list[int]]] = []
        unknown: list[DR.DescribeShareGroupOffsetsResponseTopic] = []
        if group.topics is None:
            initialized = await coordinator_of(ctx).initialized_share_partitions(group_id)
            for topic_id, partitions in initialized.items():
                info = broker.metadata.topic_by_id(topic_id)
                # the offsets of topics the principal may not describe are left out
                if info is not None and authorize(ctx, Op.DESCRIBE, Res.TOPIC, info.name):
                    wanted.append((topic_id, info.name, partitions))
        else:
            for t in group.topics:
                info = broker.metadata.topic(t.topic_name)
                if not authorize(ctx, Op.DESCRIBE, Res.TOPIC, t.topic_name):
                    denied = E.TOPIC_AUTHORIZATION_FAILED
                    unknown.append(DR.DescribeShareGroupOffsetsResponseTopic(
                        topic_name=t.topic_name, topic_id=ZERO_UUID, partitions=[
                            DR.DescribeShareGroupOffsetsResponsePartition(
                                partition_index=p, start_offset=UNINITIALIZED_START_OFFSET, error_code=denied,
                                error_message=AUTHORIZATION_MESSAGES[denied])
                            for p in t.partitions]))
                elif info is None:
                    unknown.append(DR.DescribeShareGroupOffsetsResponseTopic(
                        topic_name=t.topic_name, topic_id=ZERO_UUID, partitions=[
                            DR.DescribeShareGroupOffsetsResponsePartition(
                                partition_index=p, start_offset=UNINITIALIZED_START_OFFSET)
                            for p in t.partitions]))
                else:
                    wanted.append((info.topic_id, info.name, list(t.partitions)))
        topics = []
        for topic_id, name, partitions in wanted:
            topics.append(DR.DescribeShareGroupOffsetsResponseTopic(
                topic_name=name, topic_id=topic_id,
                partitions=[await _describe_partition(broker, group_id, topic_id, name, p) for p in partitions]))
    except Exception as exc:
        code, message = _error(exc)
        return DR.DescribeShareGroupOffsetsResponseGroup(group_id=group_id, error_code=code, error_message=message,
                                                         topics=[])
    return DR.DescribeShareGroupOffsetsResponseGroup(group_id=group_id, topics=topics + unknown)


@api(90)
async def handle_describe_share_group_offsets(ctx: RequestContext, request: M.DescribeShareGroupOffsetsRequest
                                              ) -> M.DescribeShareGroupOffsetsResponse:
    return DR(groups=[await _describe_group(ctx, g) for g in request.groups])


# ----- AlterShareGroupOffsets --------------------------------------------------------------
def _refused(ctx: RequestContext, group_id: str, operation: Op) -> KafkaError | None:
    """Why an alter or delete is refused before the group is looked at (share.version, the
    principal's READ or DELETE on the group, group id)."""
    if not share_groups_enabled(ctx):
        return UNSUPPORTED
    if not authorize(ctx, operation, Res.GROUP, group_id):
        return KafkaError(E.GROUP_AUTHORIZATION_FAILED, AUTHORIZATION_MESSAGES[E.GROUP_AUTHORIZATION_FAILED])
    if not group_id:
        return KafkaError(E.INVALID_GROUP_ID, "The group id is invalid.")
    return None


@api(91)
async def handle_alter_share_group_offsets(ctx: RequestContext, request: M.AlterShareGroupOffsetsRequest
                                           ) -> M.AlterShareGroupOffsetsResponse:
    broker = ctx.broker
    group_id = request.group_id
    refused = _refused(ctx, group_id, Op.READ)
    if refused is not None:
        return AR(error_code=refused.code, error_message=refused.message, responses=[])
    errors: list[AR.AlterShareGroupOffsetsResponseTopic] = []
    known = []
    for t in request.topics:
        if not authorize(ctx, Op.READ, Res.TOPIC, t.topic_name):
            errors.append(AR.AlterShareGroupOffsetsResponseTopic(topic_name=t.topic_name, partitions=[
                AR.AlterShareGroupOffsetsResponsePartition(
                    partition_index=p.partition_index, error_code=E.TOPIC_AUTHORIZATION_FAILED,
                    error_message=AUTHORIZATION_MESSAGES[E.TOPIC_AUTHORIZATION_FAILED])
                for p in t.partitions]))
        elif broker.metadata.topic(t.topic_name) is None:
            errors.append(AR.AlterShareGroupOffsetsResponseTopic(topic_name=t.topic_name, partitions=[
                AR.AlterShareGroupOffsetsResponsePartition(partition_index=p.partition_index,
                                                           error_code=E.UNKNOWN_TOPIC_OR_PARTITION,
                                                           error_message=UNKNOWN_TOPIC_MESSAGE)
                for p in t.partitions]))
        else:
            known.append(t)
    request.topics = known
    try:
        share_coordinator, share_manager = _share_state(broker)
        result = await coordinator_of(ctx).alter_share_group_offsets(group_id, request)
    except Exception as exc:
        code, message = _error(exc)
        return AR(error_code=code, error_message=message, responses=[])
    failed: dict[tuple[uuid.UUID, int], tuple[ErrorCode, str | None]] = {}
    for (topic_id, index), start_offset in result.offsets.items():
        try:
            await share_coordinator.initialize_state((group_id, topic_id, index), result.state_epoch, start_offset)
        except Exception as exc:
            failed[(topic_id, index)] = _error(exc)
    share_manager.drop([(group_id, topic_id, index) for topic_id, index in result.offsets])
    for topic in result.response.responses:
        for p in topic.partitions:
            if (topic.topic_id, p.partition_index) in failed:
                p.error_code, p.error_message = failed[(topic.topic_id, p.partition_index)]
    return AR(responses=errors + list(result.response.responses))


# ----- DeleteShareGroupOffsets -------------------------------------------------------------
@api(92)
async def handle_delete_share_group_offsets(ctx: RequestContext, request: M.DeleteShareGroupOffsetsRequest
                                            ) -> M.DeleteShareGroupOffsetsResponse:
    broker = ctx.broker
    group_id = request.group_id
    refused = _refused(ctx, group_id, Op.DELETE)
    if refused is not None:
        return XR(error_code=refused.code, error_message=refused.message, responses=[])
    denied = [XR.DeleteShareGroupOffsetsResponseTopic(
        topic_name=t.topic_name, error_code=E.TOPIC_AUTHORIZATION_FAILED,
        error_message=AUTHORIZATION_MESSAGES[E.TOPIC_AUTHORIZATION_FAILED])
        for t in request.topics if not authorize(ctx, Op.READ, Res.TOPIC, t.topic_name)]
    request.topics = [t for t in request.topics if t.topic_name not in {d.topic_name for d in denied}]
    coordinator = coordinator_of(ctx)
    try:
        share_coordinator, share_manager = _share_state(broker)
        result = await coordinator.initiate_delete_share_group_offsets(group_id, request)
    except Exception as exc:
        code, message = _error(exc)
        return XR(error_code=code, error_message=message, responses=[])
    deleted: list[XR.DeleteShareGroupOffsetsResponseTopic] = []
    errors = denied + list(result.errors)
    for topic_id, (name, partitions) in result.to_delete.items():
        keys = [(group_id, topic_id, p) for p in partitions]
        try:
            await share_coordinator.delete_state(keys)
        except Exception as exc:
            code, message = _error(exc)
            errors.append(XR.DeleteShareGroupOffsetsResponseTopic(topic_name=name, topic_id=topic_id, error_code=code,
                                                                  error_message=message))
            continue
        share_manager.drop(keys)
        deleted.append(XR.DeleteShareGroupOffsetsResponseTopic(topic_name=name, topic_id=topic_id))
    if deleted:
        try:
            await coordinator.complete_delete_share_group_offsets(group_id, [t.topic_id for t in deleted])
        except Exception as exc:
            code, message = _error(exc)
            return XR(error_code=code, error_message=message, responses=[])
    return XR(responses=deleted + errors)
