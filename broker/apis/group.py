"""Classic group APIs: FindCoordinator (10), JoinGroup (11), Heartbeat (12), LeaveGroup (13),
SyncGroup (14), DescribeGroups (15), ListGroups (16), DeleteGroups (42).

Decode is done by the server; these handlers adapt each version to the group coordinator
(`broker.group_coordinator`, a broker.coordinator.group.GroupCoordinator) and fix per-version
details of the responses, as Kafka's request/response classes do.
"""

from __future__ import annotations

import re

from broker.apis.context import RequestContext
from broker.apis.registry import api
from broker.coordinator.group import GroupCoordinator, RequestInfo
from broker.security.authz import Op, Res, authorize, authorize_cluster, authorized_operations, listener_of
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
KEY_TYPE_SHARE = 2
# Without an authorizer every operation is allowed; Kafka then reports those a group supports:
# READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS (AclOperation codes as bit positions).
GROUP_OPERATIONS = sum(1 << op for op in (3, 6, 8, 10, 11))
_SHARE_KEY = re.compile(r"^.+:[A-Za-z0-9_-]{22}:\d+$")  # groupId:topicId:partition

_MESSAGES = {
    E.NONE: "NONE",  # what Kafka puts in FindCoordinator's error message on success
    E.INVALID_REQUEST: "Unsupported coordinator key type or malformed key.",
    E.COORDINATOR_NOT_AVAILABLE: "The coordinator is not available.",
}


def coordinator_of(ctx: RequestContext) -> GroupCoordinator:
    coordinator = ctx.broker.group_coordinator
    if coordinator is None:
        raise KafkaError(E.COORDINATOR_NOT_AVAILABLE)
    return coordinator


def request_info(ctx: RequestContext) -> RequestInfo:
    # Kafka reports the client's address as Java's InetAddress prints it: "/127.0.0.1".
    return RequestInfo(client_id=ctx.client_id or "", client_host="/" + ctx.client_host, api_version=ctx.api_version)


# ----- FindCoordinator -------------------------------------------------------------------
def _find(ctx: RequestContext, key_type: int, key: str) -> ErrorCode:
    """This single broker coordinates every group, transactional id and share partition (which
    the principal must be allowed to DESCRIBE; share partitions need CLUSTER_ACTION)."""
    if key_type == KEY_TYPE_GROUP and not authorize(ctx, Op.DESCRIBE, Res.GROUP, key):
        return E.GROUP_AUTHORIZATION_FAILED
    if key_type == KEY_TYPE_TRANSACTION and not authorize(ctx, Op.DESCRIBE, Res.TRANSACTIONAL_ID, key):
        return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if key_type == KEY_TYPE_SHARE and ctx.api_version >= 6 and not authorize_cluster(ctx, Op.CLUSTER_ACTION):
        return E.CLUSTER_AUTHORIZATION_FAILED
    if key_type == KEY_TYPE_GROUP:
        return E.NONE if ctx.broker.group_coordinator is not None else E.COORDINATOR_NOT_AVAILABLE
    if key_type == KEY_TYPE_TRANSACTION:
        return E.NONE if ctx.broker.txn_coordinator is not None else E.COORDINATOR_NOT_AVAILABLE
    if key_type == KEY_TYPE_SHARE:
        return E.NONE if ctx.api_version >= 6 and _SHARE_KEY.match(key) else E.INVALID_REQUEST
    return E.INVALID_REQUEST


@api(10)
async def handle_find_coordinator(ctx: RequestContext, request: M.FindCoordinatorRequest) -> M.FindCoordinatorResponse:
    unavailable = False
    try:
        if request.key_type == KEY_TYPE_GROUP:
            await ctx.broker.ensure_offsets_topic()
        elif request.key_type == KEY_TYPE_TRANSACTION:
            await ctx.broker.ensure_transaction_state_topic()
        elif request.key_type == KEY_TYPE_SHARE and ctx.api_version >= 6:
            await ctx.broker.ensure_share_state_topic()  # as Kafka: made on the first ask
    except KafkaError:  # as Kafka: the internal topic cannot be created (too few brokers)
        unavailable = True
    listener = listener_of(ctx)
    R = M.FindCoordinatorResponse

    def locate(key: str) -> tuple[ErrorCode, tuple[int, str, int]]:
        code = _find(ctx, request.key_type, key)
        if code is E.NONE and unavailable:
            code = E.COORDINATOR_NOT_AVAILABLE
        found = ctx.broker.topology.coordinator_node(request.key_type, key, listener) if code is E.NONE else None
        if code is E.NONE and found is None:  # its partition has no leader (simulated cluster)
            code = E.COORDINATOR_NOT_AVAILABLE
        return code, found or (-1, "", -1)

    if ctx.api_version >= 4:
        coordinators = []
        for key in request.coordinator_keys:
            code, (node, host, port) = locate(key)
            coordinators.append(R.Coordinator(key=key, node_id=node, host=host, port=port, error_code=code,
                                              error_message=_MESSAGES.get(code, code.name)))
        return R(coordinators=coordinators)
    code, (node, host, port) = locate(request.key)
    return R(error_code=code, error_message=_MESSAGES.get(code, code.name), node_id=node, host=host, port=port)


# ----- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ------------------------------------
def _require_read(ctx: RequestContext, group_id: str) -> None:
    """The member APIs need READ on the group (before anything else is looked at)."""
    if not authorize(ctx, Op.READ, Res.GROUP, group_id):
        raise KafkaError(E.GROUP_AUTHORIZATION_FAILED)


@api(11)
async def handle_join_group(ctx: RequestContext, request: M.JoinGroupRequest) -> M.JoinGroupResponse:
    version = ctx.api_version
    if version == 0:
        request.rebalance_timeout_ms = request.session_timeout_ms  # v0 has none: the session timeout
    try:
        _require_read(ctx, request.group_id)
        response = await coordinator_of(ctx).join_group(request, request_info(ctx))
    except KafkaError as exc:
        response = M.JoinGroupResponse(error_code=exc.code, protocol_type=None, protocol_name=None)
    # Before v7 the protocol name is not nullable; from v7 an empty one is sent as null.
    if version < 7 and response.protocol_name is None:
        response.protocol_name = ""
    elif version >= 7 and response.protocol_name == "":
        response.protocol_name = None
    return response


@api(14)
async def handle_sync_group(ctx: RequestContext, request: M.SyncGroupRequest) -> M.SyncGroupResponse:
    if ctx.api_version >= 5 and (request.protocol_type is None or request.protocol_name is None):
        return M.SyncGroupResponse(error_code=E.INCONSISTENT_GROUP_PROTOCOL)
    try:
        _require_read(ctx, request.group_id)
        return await coordinator_of(ctx).sync_group(request, request_info(ctx))
    except KafkaError as exc:
        return M.SyncGroupResponse(error_code=exc.code)


def release_on_next_request(ctx: RequestContext, coordinator: GroupCoordinator, request: M.HeartbeatRequest
                            | M.ConsumerGroupHeartbeatRequest | M.ShareGroupHeartbeatRequest) -> None:
    """With group.heartbeat.hold.ms on, a heartbeat may be held until its group changes: the
    server releases it when another request arrives behind it on the connection (a commit, a
    LeaveGroup). Off (the default), every heartbeat is answered at once: nothing to release."""
    if not coordinator.config.holds_heartbeats:
        return
    group_id, member_id = request.group_id, request.member_id
    ctx.release_on_next_request(lambda: coordinator.release_heartbeat(group_id, member_id))


@api(12)
async def handle_heartbeat(ctx: RequestContext, request: M.HeartbeatRequest) -> M.HeartbeatResponse:
    try:
        _require_read(ctx, request.group_id)
        coordinator = coordinator_of(ctx)
        release_on_next_request(ctx, coordinator, request)
        return await coordinator.heartbeat(request)
    except KafkaError as exc:
        return M.HeartbeatResponse(error_code=exc.code)


@api(13)
async def handle_leave_group(ctx: RequestContext, request: M.LeaveGroupRequest) -> M.LeaveGroupResponse:
    version = ctx.api_version
    if version >= 3:
        identities = request.members
    else:
        identities = [M.LeaveGroupRequest.MemberIdentity(member_id=request.member_id, group_instance_id=None)]
    try:
        _require_read(ctx, request.group_id)
        response = await coordinator_of(ctx).leave_group(request.group_id, identities)
    except KafkaError as exc:
        response = M.LeaveGroupResponse(error_code=exc.code)
    if version < 3:
        # One member and no member list: its error becomes the response's.
        code = response.error_code or next((m.error_code for m in response.members if m.error_code), E.NONE)
        return M.LeaveGroupResponse(error_code=code)
    return response


# ----- DescribeGroups / ListGroups / DeleteGroups ----------------------------------------
@api(15)
async def handle_describe_groups(ctx: RequestContext, request: M.DescribeGroupsRequest) -> M.DescribeGroupsResponse:
    D = M.DescribeGroupsResponse
    allowed = [g for g in request.groups if authorize(ctx, Op.DESCRIBE, Res.GROUP, g)]
    denied = [D.DescribedGroup(group_id=g, error_code=E.GROUP_AUTHORIZATION_FAILED)
              for g in request.groups if g not in allowed] if len(allowed) < len(request.groups) else []
    try:
        groups = await coordinator_of(ctx).describe_groups(allowed, ctx.api_version)
    except KafkaError as exc:
        groups = [D.DescribedGroup(group_id=g, error_code=exc.code) for g in allowed]
    if ctx.api_version >= 3 and request.include_authorized_operations:
        for g in groups:
            if g.error_code == E.NONE:
                g.authorized_operations = authorized_operations(ctx, Res.GROUP, g.group_id)
    return D(groups=denied + groups)


@api(16)
async def handle_list_groups(ctx: RequestContext, request: M.ListGroupsRequest) -> M.ListGroupsResponse:
    states = list(request.states_filter) if ctx.api_version >= 4 else []
    types = list(request.types_filter) if ctx.api_version >= 5 else []
    try:
        code, groups = await coordinator_of(ctx).list_groups(states, types)
    except KafkaError as exc:
        code, groups = exc.code, []
    if not authorize_cluster(ctx, Op.DESCRIBE, log_if_denied=False):
        # without DESCRIBE on the cluster, only the groups the principal may describe
        groups = [g for g in groups if authorize(ctx, Op.DESCRIBE, Res.GROUP, g.group_id, log_if_denied=False)]
    return M.ListGroupsResponse(error_code=code, groups=groups)


@api(42)
async def handle_delete_groups(ctx: RequestContext, request: M.DeleteGroupsRequest) -> M.DeleteGroupsResponse:
    names = list(dict.fromkeys(request.groups_names))  # duplicates are deleted once
    group_ids = [g for g in names if authorize(ctx, Op.DELETE, Res.GROUP, g)]
    try:
        results = await coordinator_of(ctx).delete_groups(group_ids) if group_ids else []
    except KafkaError as exc:
        results = [M.DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=exc.code) for g in group_ids]
    results += [M.DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=E.GROUP_AUTHORIZATION_FAILED)
                for g in names if g not in group_ids]
    return M.DeleteGroupsResponse(results=results)
