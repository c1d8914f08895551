"""Committed-offset APIs: OffsetCommit (8), OffsetFetch (9), OffsetDelete (47).

As in Kafka's KafkaApis: topics are checked against the metadata first (unknown topic ids get
UNKNOWN_TOPIC_ID, unknown topics or partitions UNKNOWN_TOPIC_OR_PARTITION for commits and
deletes), v10 topic ids are resolved to names for the coordinator, and the single-group form of
OffsetFetch v1-v7 is served through the multi-group form of v8+.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Generic, TypeVar

from broker.apis.context import RequestContext
from broker.apis.group import coordinator_of
from broker.apis.registry import api
from broker.security.authz import Op, Res, authorize, filter_authorized
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from protocol.primitives import ZERO_UUID

E = ErrorCode
OC = M.OffsetCommitResponse
OF = M.OffsetFetchResponse
OD = M.OffsetDeleteResponse
OCRequest = M.OffsetCommitRequest
OFRequest = M.OffsetFetchRequest


Topic = TypeVar("Topic", OC.OffsetCommitResponseTopic, OD.OffsetDeleteResponseTopic)


class _TopicResponses(Generic[Topic]):
    """Response topics keyed by (name, id) in arrival order (OffsetDelete: by name, ids all zero); the
    caller adds their partitions."""

    def __init__(self, make_topic: Callable[[str, uuid.UUID], Topic]) -> None:
        self.make_topic: Callable[[str, uuid.UUID], Topic] = make_topic
        self.topics: dict[tuple[str, uuid.UUID], Topic] = {}

    def topic(self, name: str, topic_id: uuid.UUID) -> Topic:
        key = (name, topic_id)
        topic = self.topics.get(key)
        if topic is None:
            topic = self.topics[key] = self.make_topic(name, topic_id)
        return topic

    def all(self) -> list[Topic]:
        return list(self.topics.values())


# ----- OffsetCommit ----------------------------------------------------------------------
@api(8)
async def handle_offset_commit(ctx: RequestContext, request: OCRequest) -> OC:
    version = ctx.api_version
    use_ids = version >= 10
    metadata = ctx.broker.metadata
    # as KafkaApis: READ on the group, then READ on each topic before its existence is looked at
    secured = ctx.broker.authorizer is not None
    if secured and not authorize(ctx, Op.READ, Res.GROUP, request.group_id):
        return _failed_commit(request.topics, E.GROUP_AUTHORIZATION_FAILED)
    valid: list[OCRequest.OffsetCommitRequestTopic] = []  # the topics (with their known partitions) for the coordinator
    unknown: list[tuple[OCRequest.OffsetCommitRequestTopic, list[OCRequest.OffsetCommitRequestPartition],
                        ErrorCode]] = []  # answered here
    for topic in request.topics:
        if use_ids:
            info = metadata.topic_by_id(topic.topic_id) if topic.topic_id != ZERO_UUID else None
            if info is None:
                unknown.append((topic, topic.partitions, E.UNKNOWN_TOPIC_ID))
                continue
            topic.name = info.name
        if secured and not authorize(ctx, Op.READ, Res.TOPIC, topic.name):
            unknown.append((topic, topic.partitions, E.TOPIC_AUTHORIZATION_FAILED))
            continue
        if not use_ids:
            info = metadata.topic(topic.name)
            if info is None:
                unknown.append((topic, topic.partitions, E.UNKNOWN_TOPIC_OR_PARTITION))
                continue
        assert info is not None
        count = info.partitions
        known = [p for p in topic.partitions if 0 <= p.partition_index < count]
        if len(known) == len(topic.partitions):
            valid.append(topic)
            continue
        unknown.append((topic, [p for p in topic.partitions if not 0 <= p.partition_index < count],
                        E.UNKNOWN_TOPIC_OR_PARTITION))
        if known:
            valid.append(OCRequest.OffsetCommitRequestTopic(name=topic.name, topic_id=topic.topic_id, partitions=known))

    if not 2 <= version <= 4:
        request.retention_time_ms = -1  # the field of v2-v4 only
    all_topics = request.topics
    if valid and not unknown and (len(valid) == 1 or len({t.name for t in valid}) == len(valid)):
        # Every partition is known and no topic repeats (the usual commit): the coordinator's
        # response is the whole response.
        try:
            response: OC = await coordinator_of(ctx).commit_offsets(request, version)
        except KafkaError as exc:
            return _failed_commit(all_topics, exc.code)
        return response

    out = _TopicResponses(lambda name, tid: OC.OffsetCommitResponseTopic(name=name, topic_id=tid, partitions=[]))
    for topic, partitions, code in unknown:
        out.topic(topic.name, topic.topic_id).partitions.extend([
            OC.OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code) for p in partitions])
    if valid:
        request.topics = valid
        try:
            response = await coordinator_of(ctx).commit_offsets(request, version)
        except KafkaError as exc:
            return _failed_commit(all_topics, exc.code)
        for t in response.topics:
            out.topic(t.name, t.topic_id).partitions.extend(t.partitions)
    return OC(topics=out.all())


def _failed_commit(topics: list[OCRequest.OffsetCommitRequestTopic], code: ErrorCode) -> OC:
    """A group-level failure: every partition of the request carries its code."""
    return OC(topics=[
        OC.OffsetCommitResponseTopic(name=t.name, topic_id=t.topic_id, partitions=[
            OC.OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code)
            for p in t.partitions])
        for t in topics
    ])


# ----- OffsetFetch -----------------------------------------------------------------------
def _group_error(group: OFRequest.OffsetFetchRequestGroup, code: int, version: int) -> OF.OffsetFetchResponseGroup:
    """A group-level failure: from v2 the error code; v1 has none, so every partition carries it."""
    if version >= 2 or group.topics is None:
        return OF.OffsetFetchResponseGroup(group_id=group.group_id, error_code=code, topics=[])
    return OF.OffsetFetchResponseGroup(group_id=group.group_id, topics=[
        OF.OffsetFetchResponseTopics(name=t.name, topic_id=t.topic_id, partitions=[
            OF.OffsetFetchResponsePartitions(partition_index=p, committed_offset=-1, committed_leader_epoch=-1,
                                             metadata="", error_code=code)
            for p in t.partition_indexes])
        for t in group.topics
    ])


def _unknown_topic(name: str, topic_id: uuid.UUID, partitions: list[int], code: ErrorCode) -> OF.OffsetFetchResponseTopics:
    return OF.OffsetFetchResponseTopics(name=name, topic_id=topic_id, partitions=[
        OF.OffsetFetchResponsePartitions(partition_index=p, committed_offset=-1, committed_leader_epoch=-1,
                                         metadata="", error_code=code)
        for p in partitions])


async def _fetch_group(ctx: RequestContext, group: OFRequest.OffsetFetchRequestGroup,
                       require_stable: bool) -> OF.OffsetFetchResponseGroup:
    version = ctx.api_version
    use_ids = version >= 10
    metadata = ctx.broker.metadata
    secured = ctx.broker.authorizer is not None
    if secured and not authorize(ctx, Op.DESCRIBE, Res.GROUP, group.group_id):
        return _group_error(group, E.GROUP_AUTHORIZATION_FAILED, version)
    try:
        coordinator = coordinator_of(ctx)
    except KafkaError as exc:
        return _group_error(group, exc.code, version)

    response: OF.OffsetFetchResponseGroup
    if group.topics is None:
        response = await coordinator.fetch_offsets(group, require_stable)
        if response.error_code:
            return _group_error(group, response.error_code, version)
        if secured:  # the offsets of topics the principal may not describe are left out
            allowed = filter_authorized(ctx, Op.DESCRIBE, Res.TOPIC, [t.name for t in response.topics])
            response.topics = [t for t in response.topics if t.name in allowed]
        if use_ids:
            topics = []
            for t in response.topics:
                if t.topic_id == ZERO_UUID:
                    info = metadata.topic(t.name)
                    t.topic_id = info.topic_id if info is not None else ZERO_UUID
                if t.topic_id != ZERO_UUID:  # a topic without an id cannot be sent by id
                    topics.append(t)
            response.topics = topics
        return response

    wanted: list[OFRequest.OffsetFetchRequestTopics] = []
    unknown: list[OF.OffsetFetchResponseTopics] = []
    for asked in group.topics:
        if use_ids:
            info = metadata.topic_by_id(asked.topic_id) if asked.topic_id != ZERO_UUID else None
            if info is None:
                unknown.append(_unknown_topic("", asked.topic_id, asked.partition_indexes, E.UNKNOWN_TOPIC_ID))
                continue
            asked.name = info.name
        if secured and not authorize(ctx, Op.DESCRIBE, Res.TOPIC, asked.name):
            unknown.append(_unknown_topic(asked.name, asked.topic_id, asked.partition_indexes,
                                          E.TOPIC_AUTHORIZATION_FAILED))
            continue
        wanted.append(asked)
    asking = group
    if len(wanted) != len(group.topics):
        asking = OFRequest.OffsetFetchRequestGroup(
            group_id=group.group_id, member_id=group.member_id, member_epoch=group.member_epoch, topics=wanted)
    response = await coordinator.fetch_offsets(asking, require_stable)
    if response.error_code:
        return _group_error(group, response.error_code, version)
    if unknown:
        response.topics = list(response.topics) + unknown
    return response


@api(9)
async def handle_offset_fetch(ctx: RequestContext, request: OFRequest) -> OF:
    version = ctx.api_version
    require_stable = bool(request.require_stable) if version >= 7 else False
    if version >= 8:
        if len(request.groups) == 1:  # the usual request: one group, answered without a task
            groups = [await _fetch_group(ctx, request.groups[0], require_stable)]
        else:
            groups = list(await asyncio.gather(*(_fetch_group(ctx, g, require_stable) for g in request.groups)))
        return OF(groups=groups)

    group = OFRequest.OffsetFetchRequestGroup(
        group_id=request.group_id,
        topics=None if request.topics is None else [
            OFRequest.OffsetFetchRequestTopics(name=t.name, partition_indexes=list(t.partition_indexes))
            for t in request.topics
        ],
    )
    result = await _fetch_group(ctx, group, require_stable)
    return OF(
        error_code=result.error_code,
        topics=[
            OF.OffsetFetchResponseTopic(name=t.name, partitions=[
                OF.OffsetFetchResponsePartition(
                    partition_index=p.partition_index, committed_offset=p.committed_offset,
                    committed_leader_epoch=p.committed_leader_epoch, metadata=p.metadata, error_code=p.error_code)
                for p in t.partitions])
            for t in result.topics
        ],
    )


# ----- OffsetDelete ----------------------------------------------------------------------
@api(47)
async def handle_offset_delete(ctx: RequestContext, request: M.OffsetDeleteRequest) -> OD:
    metadata = ctx.broker.metadata
    if not authorize(ctx, Op.DELETE, Res.GROUP, request.group_id):
        return OD(error_code=E.GROUP_AUTHORIZATION_FAILED)
    out = _TopicResponses(lambda name, _tid: OD.OffsetDeleteResponseTopic(name=name, partitions=[]))
    valid = []
    for topic in request.topics:
        if not authorize(ctx, Op.READ, Res.TOPIC, topic.name):
            out.topic(topic.name, ZERO_UUID).partitions.extend([OD.OffsetDeleteResponsePartition(
                partition_index=p.partition_index, error_code=E.TOPIC_AUTHORIZATION_FAILED) for p in topic.partitions])
            continue
        info = metadata.topic(topic.name)
        count = info.partitions if info is not None else 0
        bad = [p for p in topic.partitions if not 0 <= p.partition_index < count]
        out.topic(topic.name, ZERO_UUID).partitions.extend([
            OD.OffsetDeleteResponsePartition(partition_index=p.partition_index, error_code=E.UNKNOWN_TOPIC_OR_PARTITION)
            for p in bad])
        good = [p for p in topic.partitions if 0 <= p.partition_index < count]
        if good:
            valid.append(M.OffsetDeleteRequest.OffsetDeleteRequestTopic(name=topic.name, partitions=good))
    try:
        response = await coordinator_of(ctx).delete_offsets(
            M.OffsetDeleteRequest(group_id=request.group_id, topics=valid))
    except KafkaError as exc:
        return OD(error_code=exc.code)
    if response.error_code:
        return OD(error_code=response.error_code)
    for t in response.topics:
        out.topic(t.name, ZERO_UUID).partitions.extend(t.partitions)
    return OD(topics=out.all())
