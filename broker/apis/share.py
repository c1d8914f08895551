"""Share group APIs (KIP-932): ShareGroupHeartbeat (76), ShareGroupDescribe (77), ShareFetch (78) and
ShareAcknowledge (79).

Membership goes to the group coordinator (`broker.group_coordinator`); fetching and acknowledging
to the share-partition manager (`broker.share_manager`, broker/share/), which keeps the share
sessions. As Kafka's KafkaApis: a request's acknowledgements are validated per partition (bad
batches get INVALID_REQUEST, unknown topic ids UNKNOWN_TOPIC_ID) and applied before its fetch; the
response of a ShareFetch that opens a session lists every partition, later ones only those with
records or errors; Records is never null (librdkafka rejects that). A request at epoch -1 closes
the session once answered, releasing the member's acquired records. A consumer_byte_rate quota
bounds a ShareFetch's MaxBytes and counts its records as Fetch's: over it, the response carries
only the acknowledgements, with throttle_time_ms, and what it acquired is available again.

As KafkaApis' isShareGroupProtocolEnabled: every share API answers UNSUPPORTED_VERSION while the
finalized share.version is 0.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable

from broker.apis.consumer_group import describe_modern_groups
from broker.apis.context import RequestContext
from broker.apis.group import coordinator_of, release_on_next_request, request_info
from broker.apis.registry import api
from broker.metadata import features
from broker.observability.logger import get_logger
from broker.security.acl import AUTHORIZATION_MESSAGES
from broker.security.authz import Op, Res, authorize, filter_authorized
from broker.security.quotas import Entity, throttle
from broker.share.engine import AckBatch, AckType
from broker.share.manager import SharePartitionManager
from broker.share.ports import PartitionResult
from broker.share.session import FINAL_EPOCH, INITIAL_EPOCH, TopicIdPartition
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.share")

E = ErrorCode
F = M.ShareFetchResponse
A = M.ShareAcknowledgeResponse
# the acknowledgements of a ShareFetch or a ShareAcknowledge (the same fields)
AckTopic = M.ShareFetchRequest.FetchTopic | M.ShareAcknowledgeRequest.AcknowledgeTopic
RECORD_LIMIT = 1  # ShareAcquireMode (KIP-1206): 0 batch_optimized, 1 record_limit


def share_groups_enabled(ctx: RequestContext) -> bool:
    return bool(ctx.broker.metadata.feature_level(features.SHARE_VERSION) >= 1)


UNSUPPORTED = KafkaError(E.UNSUPPORTED_VERSION, "The version of API is not supported.")


def manager_of(ctx: RequestContext) -> SharePartitionManager:
    manager = ctx.broker.share_manager
    if manager is None:
        raise KafkaError(E.COORDINATOR_NOT_AVAILABLE)
    return manager


# ----- ShareGroupHeartbeat / ShareGroupDescribe --------------------------------------------
@api(76)
async def handle_share_group_heartbeat(ctx: RequestContext, request: M.ShareGroupHeartbeatRequest
                                       ) -> M.ShareGroupHeartbeatResponse:
    try:
        if not share_groups_enabled(ctx):
            raise UNSUPPORTED
        if not authorize(ctx, Op.READ, Res.GROUP, request.group_id):
            raise KafkaError(E.GROUP_AUTHORIZATION_FAILED, AUTHORIZATION_MESSAGES[E.GROUP_AUTHORIZATION_FAILED])
        if request.subscribed_topic_names and len(filter_authorized(
                ctx, Op.DESCRIBE, Res.TOPIC, request.subscribed_topic_names)) < len(set(request.subscribed_topic_names)):
            return M.ShareGroupHeartbeatResponse(error_code=E.TOPIC_AUTHORIZATION_FAILED)
        coordinator = coordinator_of(ctx)
        if request.member_epoch == 0:
            try:
                await ctx.broker.ensure_share_state_topic()
            except KafkaError as exc:  # cannot be made now (no controller, too few brokers): retriable
                raise KafkaError(E.COORDINATOR_NOT_AVAILABLE, exc.message) from None
        elif request.member_epoch > 0:
            release_on_next_request(ctx, coordinator, request)  # the heartbeat may be held
        response = await coordinator.share_group_heartbeat(request, request_info(ctx))
    except KafkaError as exc:
        return M.ShareGroupHeartbeatResponse(error_code=exc.code, error_message=exc.message)
    if response.error_code == E.NONE and response.assignment is not None:
        _initialize(ctx, request.group_id, response.assignment.topic_partitions)
    return response


def _initialize(ctx: RequestContext, group_id: str,
                topic_partitions: Iterable[M.ShareGroupHeartbeatResponse.TopicPartitions]) -> None:
    """Newly assigned share-partitions get their state now (the start offset is fixed when the
    partition is first assigned, as Kafka initializes it from the heartbeat)."""
    manager = ctx.broker.share_manager
    if manager is not None:
        manager.initialize(group_id, [(tp.topic_id, p) for tp in topic_partitions for p in tp.partitions])


@api(77)
async def handle_share_group_describe(ctx: RequestContext, request: M.ShareGroupDescribeRequest
                                      ) -> M.ShareGroupDescribeResponse:
    D = M.ShareGroupDescribeResponse.DescribedGroup
    if not share_groups_enabled(ctx):
        return M.ShareGroupDescribeResponse(groups=[
            D(group_id=g, error_code=UNSUPPORTED.code) for g in request.group_ids])
    return M.ShareGroupDescribeResponse(groups=await describe_modern_groups(
        ctx, list(request.group_ids), request.include_authorized_operations, D,
        lambda ids: coordinator_of(ctx).share_group_describe(ids), _topics))


def _topics(group: M.ShareGroupDescribeResponse.DescribedGroup) -> set[str]:
    """The topics of the members' assignments."""
    return {tp.topic_name for m in group.members or [] if m.assignment is not None
            for tp in m.assignment.topic_partitions}


# ----- acknowledgements --------------------------------------------------------------------
def _validate_batches(batches: list[AckBatch], max_type: int) -> bool:
    """Kafka's validateAcknowledgementBatches: ordered, non-overlapping, well-formed batches."""
    previous_end = -1
    for b in batches:
        if b.first_offset > b.last_offset or b.first_offset < previous_end or not b.types:
            return False
        if len(b.types) > 1 and b.last_offset - b.first_offset != len(b.types) - 1:
            return False
        if any(t < 0 or t > max_type for t in b.types):
            return False
        previous_end = b.last_offset
    return True


def readable_topics(ctx: RequestContext) -> Callable[[uuid.UUID], bool] | None:
    """The check of READ on a topic (by id) for share fetches and acknowledgements; None: all."""
    if ctx.broker.authorizer is None:
        return None
    metadata = ctx.broker.metadata

    def readable(topic_id: uuid.UUID) -> bool:
        info = metadata.topic_by_id(topic_id)
        return info is None or authorize(ctx, Op.READ, Res.TOPIC, info.name)

    return readable


def _collect_acks(ctx: RequestContext, topics: Iterable[AckTopic]) -> tuple[dict[TopicIdPartition, list[AckBatch]],
                                                                         dict[TopicIdPartition, ErrorCode]]:
    """The request's acknowledgements by partition (the same topic may appear several times:
    librdkafka does not group its partitions), and the errors of those that cannot be applied."""
    metadata = ctx.broker.metadata
    readable = readable_topics(ctx)
    acks: dict[TopicIdPartition, list[AckBatch]] = {}
    errors: dict[TopicIdPartition, ErrorCode] = {}
    for t in topics:
        for p in t.partitions:
            if not p.acknowledgement_batches:
                continue
            tp = (t.topic_id, p.partition_index)
            if metadata.topic_by_id(t.topic_id) is None:
                errors[tp] = E.UNKNOWN_TOPIC_ID
                continue
            if readable is not None and not readable(t.topic_id):
                errors[tp] = E.TOPIC_AUTHORIZATION_FAILED
                continue
            acks.setdefault(tp, []).extend(
                AckBatch(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in p.acknowledgement_batches)
    max_type = AckType.RENEW if ctx.api_version >= 2 else AckType.REJECT
    for tp, batches in list(acks.items()):
        if not _validate_batches(batches, max_type):
            errors[tp] = E.INVALID_REQUEST
            del acks[tp]
    return acks, errors


async def _acknowledge(ctx: RequestContext, manager: SharePartitionManager, group_id: str, member_id: str,
                       topics: Iterable[AckTopic]) -> dict[TopicIdPartition, tuple[ErrorCode, str | None]]:
    acks, errors = _collect_acks(ctx, topics)
    results: dict[TopicIdPartition, tuple[ErrorCode, str | None]] = {tp: (code, None) for tp, code in errors.items()}
    if acks:
        results.update(await manager.acknowledge(group_id, member_id, acks))
    return results


def _watch_connection(ctx: RequestContext, manager: SharePartitionManager) -> None:
    """The member's share session ends with its connection (Kafka's ShareSessionCache listener)."""
    connection = ctx.connection
    if not connection.share_watched:
        connection.share_watched = True
        connection.on_close.append(lambda: manager.on_connection_closed(connection))


def _leader(ctx: RequestContext) -> F.LeaderIdAndEpoch:
    return F.LeaderIdAndEpoch(leader_id=ctx.broker.node_id, leader_epoch=0)


# ----- ShareFetch --------------------------------------------------------------------------
@api(78)
async def handle_share_fetch(ctx: RequestContext, request: M.ShareFetchRequest) -> M.ShareFetchResponse:
    manager = manager_of(ctx)
    group_id, member_id, epoch = request.group_id, request.member_id, request.share_session_epoch
    lock_ms = manager.lock_duration_ms(group_id) if group_id else 0

    def failed(code: ErrorCode, message: str | None = None) -> M.ShareFetchResponse:
        return F(error_code=code, error_message=message, acquisition_lock_timeout_ms=lock_ms, responses=[],
                 node_endpoints=[])

    if not share_groups_enabled(ctx):
        return failed(UNSUPPORTED.code, UNSUPPORTED.message)

    # a null group id is no resource name: the request is invalid (below), not looked up in the ACLs
    if group_id is not None and not authorize(ctx, Op.READ, Res.GROUP, group_id):
        return failed(E.GROUP_AUTHORIZATION_FAILED, AUTHORIZATION_MESSAGES[E.GROUP_AUTHORIZATION_FAILED])
    if not group_id or not member_id:
        return failed(E.INVALID_REQUEST, "A share fetch needs a group id and a member id.")
    version = ctx.api_version
    renew_only = version >= 2 and request.is_renew_ack
    if renew_only and (request.max_bytes or request.min_bytes or request.max_records or request.max_wait_ms):
        # KIP-1222 (Kafka's KAFKA-19844): a fetch that renews locks fetches nothing, and says so
        return failed(E.INVALID_REQUEST, "A ShareFetch with IsRenewAck must have MaxBytes, MinBytes, MaxRecords and "
                                         "MaxWaitMs 0.")
    mode = request.share_acquire_mode if version >= 2 else 0
    if mode not in (0, RECORD_LIMIT):
        return failed(E.INVALID_REQUEST, "Unknown share acquire mode %d." % mode)
    metadata = ctx.broker.metadata
    quota = _fetch_quota(ctx)
    wanted: list[TopicIdPartition] = []
    for t in request.topics:
        for p in t.partitions:
            wanted.append((t.topic_id, p.partition_index))
    forget = [(f.topic_id, p) for f in request.forgotten_topics_data for p in f.partitions]
    acknowledging = any(p.acknowledgement_batches for t in request.topics for p in t.partitions)
    try:
        session = manager.sessions.fetch(group_id, member_id, epoch, dict.fromkeys(wanted), forget, acknowledging,
                                         ctx.connection)
    except KafkaError as exc:
        if exc.code == E.SHARE_SESSION_LIMIT_REACHED:
            await asyncio.sleep(max(request.max_wait_ms, 0) / 1000)  # as Kafka: answered after MaxWaitMs
        return failed(exc.code, exc.message)
    if epoch == INITIAL_EPOCH:
        _watch_connection(ctx, manager)

    ack_results = await _acknowledge(ctx, manager, group_id, member_id, request.topics) if acknowledging else {}

    fetch_results: dict[TopicIdPartition, PartitionResult] = {}
    if session is not None and not renew_only:
        valid: list[TopicIdPartition] = []
        readable = readable_topics(ctx)
        for tp in session.partitions:
            info = metadata.topic_by_id(tp[0])
            if info is None:
                fetch_results[tp] = PartitionResult(E.UNKNOWN_TOPIC_ID)
            elif readable is not None and not readable(tp[0]):
                fetch_results[tp] = PartitionResult(E.TOPIC_AUTHORIZATION_FAILED)
            elif not 0 <= tp[1] < info.partitions:
                fetch_results[tp] = PartitionResult(E.UNKNOWN_TOPIC_OR_PARTITION)
            else:
                valid.append(tp)
        if valid:
            max_bytes, min_bytes = _quota_bounded(ctx, quota, request.max_bytes, request.min_bytes)
            fetch_results.update(await manager.fetch(
                group_id, member_id, valid, request.max_wait_ms, min_bytes, max_bytes,
                request.max_records, max(request.batch_size, 1), mode == RECORD_LIMIT, epoch))

    throttle_ms = _record_fetched(ctx, quota, fetch_results)
    if throttle_ms:
        # over consumer_byte_rate: answered empty (but for the acknowledgements), as Kafka's
        # throttleResponse; what was acquired for it stays acquired until its lock runs out and
        # its delivery counts, as in Kafka
        fetch_results = {}
    full = epoch == INITIAL_EPOCH and not throttle_ms
    order: list[TopicIdPartition] = list(dict.fromkeys([
        *(session.partitions if session is not None and full else ()), *fetch_results, *ack_results]))
    by_topic: dict[uuid.UUID, F.ShareFetchableTopicResponse] = {}
    for tp in order:
        result = fetch_results.get(tp, PartitionResult())
        ack = ack_results.get(tp)
        if not full and not result.acquired and result.error == E.NONE and ack is None:
            continue
        topic = by_topic.get(tp[0])
        if topic is None:
            topic = by_topic[tp[0]] = F.ShareFetchableTopicResponse(topic_id=tp[0], partitions=[])
        topic.partitions.append(F.PartitionData(
            partition_index=tp[1], error_code=result.error, error_message=result.message,
            acknowledge_error_code=ack[0] if ack else E.NONE, acknowledge_error_message=ack[1] if ack else None,
            current_leader=_leader(ctx), records=result.records,
            acquired_records=[F.AcquiredRecords(first_offset=a.first_offset, last_offset=a.last_offset,
                                                delivery_count=a.delivery_count) for a in result.acquired]))
    if epoch == FINAL_EPOCH:
        manager.close_session(group_id, member_id)
    response = F(error_code=E.NONE, acquisition_lock_timeout_ms=lock_ms, responses=list(by_topic.values()),
                 node_endpoints=[])
    throttle(ctx, response, throttle_ms)
    return response


def _fetch_quota(ctx: RequestContext) -> tuple[Entity, float] | None:
    """The member's consumer_byte_rate quota, if it has one (ShareFetch is counted as Fetch is)."""
    quotas = ctx.broker.quotas
    if quotas is None or not quotas.active:
        return None
    return quotas.fetch_quota(ctx)


def _quota_bounded(ctx: RequestContext, quota: tuple[Entity, float] | None, max_bytes: int,
                   min_bytes: int) -> tuple[int, int]:
    """MaxBytes no larger than the quota allows in a window (more would be throttled for sure:
    KafkaApis bounds it by maxValueInQuotaWindow), MinBytes no larger than MaxBytes."""
    quotas = ctx.broker.quotas
    if quota is None or quotas is None:
        return max_bytes, min_bytes
    max_bytes = min(max_bytes, int(min(quotas.fetch.max_value_in_window(quota), 2**31 - 1)))
    return max_bytes, min(min_bytes, max_bytes)


def _record_fetched(ctx: RequestContext, quota: tuple[Entity, float] | None,
                    results: dict[TopicIdPartition, PartitionResult]) -> int:
    """Count the fetched bytes against the quota; over it, the throttle time (their count taken
    back, as the response will not carry them)."""
    quotas = ctx.broker.quotas
    if quota is None or quotas is None:
        return 0
    manager = quotas.fetch
    size = sum(len(r.records) for r in results.values())
    throttle_ms = int(manager.record(quota, size))
    if throttle_ms > 0:
        manager.unrecord(quota, size)
    return throttle_ms


# ----- ShareAcknowledge --------------------------------------------------------------------
@api(79)
async def handle_share_acknowledge(ctx: RequestContext, request: M.ShareAcknowledgeRequest
                                   ) -> M.ShareAcknowledgeResponse:
    manager = manager_of(ctx)
    group_id, member_id, epoch = request.group_id, request.member_id, request.share_session_epoch
    lock_ms = manager.lock_duration_ms(group_id) if group_id else 0
    if not share_groups_enabled(ctx):
        return A(error_code=UNSUPPORTED.code, error_message=UNSUPPORTED.message, acquisition_lock_timeout_ms=lock_ms,
                 responses=[], node_endpoints=[])
    if group_id is not None and not authorize(ctx, Op.READ, Res.GROUP, group_id):
        return A(error_code=E.GROUP_AUTHORIZATION_FAILED, error_message=AUTHORIZATION_MESSAGES[
            E.GROUP_AUTHORIZATION_FAILED], acquisition_lock_timeout_ms=lock_ms, responses=[], node_endpoints=[])
    if not group_id or not member_id:
        return A(error_code=E.INVALID_REQUEST, acquisition_lock_timeout_ms=lock_ms, responses=[], node_endpoints=[])
    try:
        manager.sessions.acknowledge(group_id, member_id, epoch)
    except KafkaError as exc:
        return A(error_code=exc.code, error_message=exc.message, acquisition_lock_timeout_ms=lock_ms, responses=[],
                 node_endpoints=[])
    results = await _acknowledge(ctx, manager, group_id, member_id, request.topics)
    by_topic: dict[uuid.UUID, A.ShareAcknowledgeTopicResponse] = {}
    for (topic_id, index), (code, message) in results.items():
        topic = by_topic.get(topic_id)
        if topic is None:
            topic = by_topic[topic_id] = A.ShareAcknowledgeTopicResponse(topic_id=topic_id, partitions=[])
        topic.partitions.append(A.PartitionData(partition_index=index, error_code=code, error_message=message,
                                                current_leader=A.LeaderIdAndEpoch(leader_id=ctx.broker.node_id,
                                                                                   leader_epoch=0)))
    if epoch == FINAL_EPOCH:
        manager.close_session(group_id, member_id)
    return A(error_code=E.NONE, acquisition_lock_timeout_ms=lock_ms, responses=list(by_topic.values()),
             node_endpoints=[])
