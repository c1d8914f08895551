"""KIP-848 consumer group APIs: ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69).

The group coordinator (`broker.group_coordinator`) validates and serves them; this module only
adapts the request and fills what Kafka's KafkaApis adds (authorized operations).
"""

from __future__ import annotations

from typing import Any

from broker import features
from broker.apis.group import GROUP_OPERATIONS, coordinator_of, release_on_next_request, request_info
from broker.apis.registry import api
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode


def consumer_protocol_enabled(ctx: Any) -> bool:
    """As KafkaApis: the consumer rebalance protocol is served while group.version is at least 1."""
    return bool(ctx.broker.metadata.feature_level(features.GROUP_VERSION) >= 1)


UNSUPPORTED = KafkaError(E.UNSUPPORTED_VERSION, "The version of API is not supported.")


@api(68)
async def handle_consumer_group_heartbeat(ctx: Any, request: Any) -> Any:
    if not consumer_protocol_enabled(ctx):
        return M.ConsumerGroupHeartbeatResponse(error_code=UNSUPPORTED.code, error_message=UNSUPPORTED.message)
    try:
        coordinator = coordinator_of(ctx)
        release_on_next_request(ctx, coordinator, request)
        return await coordinator.consumer_group_heartbeat(request, request_info(ctx))
    except KafkaError as exc:
        return M.ConsumerGroupHeartbeatResponse(error_code=exc.code, error_message=exc.message)


@api(69)
async def handle_consumer_group_describe(ctx: Any, request: Any) -> Any:
    group_ids = list(request.group_ids)
    if not consumer_protocol_enabled(ctx):
        return M.ConsumerGroupDescribeResponse(groups=[
            M.ConsumerGroupDescribeResponse.DescribedGroup(group_id=g, error_code=E.UNSUPPORTED_VERSION)
            for g in group_ids])
    try:
        groups = await coordinator_of(ctx).consumer_group_describe(group_ids)
    except KafkaError as exc:
        groups = [M.ConsumerGroupDescribeResponse.DescribedGroup(group_id=g, error_code=exc.code) for g in group_ids]
    if request.include_authorized_operations:
        for g in groups:
            if g.error_code == E.NONE:
                g.authorized_operations = GROUP_OPERATIONS
    return M.ConsumerGroupDescribeResponse(groups=groups)
