"""KIP-848 consumer group APIs: ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69).

The group coordinator (`broker.group_coordinator`) validates and serves them; this module only
adapts the request and fills what Kafka's KafkaApis adds (authorized operations). ShareGroupDescribe
is answered by the same describe_modern_groups.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from broker.apis.context import RequestContext
from broker.apis.group import coordinator_of, release_on_next_request, request_info
from broker.apis.registry import api
from broker.metadata import features
from broker.security.authz import Op, Res, authorize, authorized_operations, filter_authorized
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode


def consumer_protocol_enabled(ctx: RequestContext) -> bool:
    """As KafkaApis: the consumer rebalance protocol is served while group.version is at least 1."""
    return bool(ctx.broker.metadata.feature_level(features.GROUP_VERSION) >= 1)


UNSUPPORTED = KafkaError(E.UNSUPPORTED_VERSION, "The version of API is not supported.")


@api(68)
async def handle_consumer_group_heartbeat(ctx: RequestContext, request: M.ConsumerGroupHeartbeatRequest
                                          ) -> M.ConsumerGroupHeartbeatResponse:
    if not consumer_protocol_enabled(ctx):
        return M.ConsumerGroupHeartbeatResponse(error_code=UNSUPPORTED.code, error_message=UNSUPPORTED.message)
    if not authorize(ctx, Op.READ, Res.GROUP, request.group_id):
        return M.ConsumerGroupHeartbeatResponse(error_code=E.GROUP_AUTHORIZATION_FAILED,
                                                error_message="Group authorization failed.")
    if request.subscribed_topic_names and len(filter_authorized(
            ctx, Op.DESCRIBE, Res.TOPIC, request.subscribed_topic_names)) < len(set(request.subscribed_topic_names)):
        # a member may not subscribe to topics it may not describe
        return M.ConsumerGroupHeartbeatResponse(error_code=E.TOPIC_AUTHORIZATION_FAILED)
    try:
        coordinator = coordinator_of(ctx)
        release_on_next_request(ctx, coordinator, request)
        return await coordinator.consumer_group_heartbeat(request, request_info(ctx))
    except KafkaError as exc:
        return M.ConsumerGroupHeartbeatResponse(error_code=exc.code, error_message=exc.message)


@api(69)
async def handle_consumer_group_describe(ctx: RequestContext, request: M.ConsumerGroupDescribeRequest
                                         ) -> M.ConsumerGroupDescribeResponse:
    D = M.ConsumerGroupDescribeResponse.DescribedGroup
    if not consumer_protocol_enabled(ctx):
        return M.ConsumerGroupDescribeResponse(groups=[
            D(group_id=g, error_code=E.UNSUPPORTED_VERSION) for g in request.group_ids])
    return M.ConsumerGroupDescribeResponse(groups=await describe_modern_groups(
        ctx, list(request.group_ids), request.include_authorized_operations, D,
        lambda ids: coordinator_of(ctx).consumer_group_describe(ids), _topics))


def _topics(group: M.ConsumerGroupDescribeResponse.DescribedGroup) -> set[str]:
    """The topics of the members' assignments and target assignments."""
    return {tp.topic_name for m in group.members or [] for a in (m.assignment, m.target_assignment)
            if a is not None for tp in a.topic_partitions}


# ----- shared with ShareGroupDescribe ------------------------------------------------------
class DescribedGroup(Protocol):
    """A ConsumerGroupDescribe or ShareGroupDescribe group: the fields filled here."""

    group_id: str
    error_code: int
    authorized_operations: int


Described = TypeVar("Described", bound=DescribedGroup)


async def describe_modern_groups(ctx: RequestContext, group_ids: list[str], include_authorized_operations: bool,
                                 described: Callable[..., Described],
                                 describe: Callable[[list[str]], Awaitable[list[Described]]],
                                 topics_of: Callable[[Described], set[str]]) -> list[Described]:
    """ConsumerGroupDescribe and ShareGroupDescribe as KafkaApis answers them: the groups the
    principal may not describe first (GROUP_AUTHORIZATION_FAILED), then the others as the
    coordinator describes them (`describe`; its error for each when it fails), with their
    authorized operations when asked. With an authorizer, a group whose members hold topics
    (`topics_of`) the principal may not describe is not shown."""
    allowed = [g for g in group_ids if authorize(ctx, Op.DESCRIBE, Res.GROUP, g)]
    denied = [described(group_id=g, error_code=E.GROUP_AUTHORIZATION_FAILED) for g in group_ids if g not in allowed]
    try:
        groups = await describe(allowed) if allowed else []
    except KafkaError as exc:
        groups = [described(group_id=g, error_code=exc.code) for g in allowed]
    if include_authorized_operations:
        for g in groups:
            if g.error_code == E.NONE:
                g.authorized_operations = authorized_operations(ctx, Res.GROUP, g.group_id)
    groups = denied + groups
    if ctx.broker.authorizer is None:
        return groups
    return [g if _may_describe_all(ctx, topics_of(g)) else described(
        group_id=g.group_id, error_code=E.TOPIC_AUTHORIZATION_FAILED, members=[],
        error_message="The group has described topic(s) that the client is not authorized to describe.")
        for g in groups]


def _may_describe_all(ctx: RequestContext, topics: set[str]) -> bool:
    return len(filter_authorized(ctx, Op.DESCRIBE, Res.TOPIC, topics)) == len(topics)
