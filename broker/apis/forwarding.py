"""Metadata changes in cluster mode go to the active controller, as Kafka's brokers forward them.

A forwardable admin request (CreateTopics, DeleteTopics, the ACL, config, quota and SCRAM
changes, CreatePartitions, ElectLeaders, reassignments, UpdateFeatures) that reaches a node which
is not the controller is sent on in an Envelope (API 58): the request's bytes, the client's
principal (Kafka's DefaultPrincipalData) and address. The controller serves the inner request as
that principal would be served, answers once its records are durable, and the node returns the
controller's response to the client; it waits (a little) until its own metadata holds the change,
so the client's next request there sees it. A node that is the controller serves the request
itself. Controller unknown or unreachable: NOT_CONTROLLER, which clients retry.

Also here, the controller's own APIs that no client calls and that ApiVersions does not list:
Envelope, BrokerRegistration, BrokerHeartbeat, AllocateProducerIds, AlterPartition (Kafka's
controller listener APIs), served only in cluster mode, only on the inter-broker listener (Kafka serves
them on its privileged listeners only: another listener's connection that sends one is closed)
and only to principals with CLUSTER_ACTION on the cluster (ControllerApis: the other brokers
authenticate as the inter-broker principal, which needs it; super.users, as Kafka's docs
recommend). An Envelope is unwrapped as Kafka's EnvelopeUtils does: a principal that cannot be
read is PRINCIPAL_DESERIALIZATION_FAILURE, a bad client address or an API that is not
forwardable INVALID_REQUEST, an inner request that cannot be parsed UNSUPPORTED_VERSION.
"""

from __future__ import annotations

import copy
import ipaddress
import socket
import struct
from typing import Any

from broker.apis.addressing import fail_whole
from broker.apis.configs import AlterRequest, reassemble, refused_before_forwarding
from broker.apis.registry import APIS, CONTROLLER_APIS, Handler, RequestContext, api
from broker.apis.routing import FORWARDED
from broker.cluster.node import ClusterNode
from broker.observability.logger import get_logger
from broker.security.authz import Op, authorize_cluster, listener_of, principal_of
from protocol import frames
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode
ENVELOPE = 58
CONFIG_CHANGES = frozenset({33, 44})  # AlterConfigs, IncrementalAlterConfigs
log = get_logger("broker.cluster")


def encode_principal(principal: str) -> bytes:
    """A principal as Kafka's KafkaPrincipalSerde writes it into an Envelope: its version (int16),
    then DefaultPrincipalData."""
    kind, _, name = principal.partition(":")
    data = M.DefaultPrincipalData(type=kind, name=name, token_authenticated=False)
    return struct.pack(">h", 0) + bytes(M.encode(data, 0))


def decode_principal(data: bytes) -> str:
    (version,) = struct.unpack_from(">h", data)
    value = M.decode(M.DefaultPrincipalData, version, memoryview(data)[2:])
    return "%s:%s" % (value.type, value.name)


def host_bytes(host: str) -> bytes:
    """A client's address as Envelope carries it: the raw IP address."""
    try:
        return ipaddress.ip_address(host).packed
    except ValueError:
        return socket.inet_aton("127.0.0.1")


def host_text(data: bytes) -> str:
    """The client's address an Envelope carries (ValueError: not an IPv4 or IPv6 address)."""
    return str(ipaddress.ip_address(bytes(data)))


async def forward(node: ClusterNode, ctx: Any, request: Any, handler: Handler) -> Any:
    """Serve a forwardable request here (the controller) or through the controller."""
    if node.is_controller:
        response = await handler(ctx, request)
        try:
            await node.sync()
        except KafkaError as exc:
            return fail_whole(ctx, request, exc.code)
        return response
    if node.controller_id < 0:
        return fail_whole(ctx, request, E.NOT_CONTROLLER)
    if ctx.api_key in CONFIG_CHANGES:
        return await _forward_config_change(node, ctx, request)
    return await _through_controller(node, ctx, request)


async def _through_controller(node: ClusterNode, ctx: Any, request: Any) -> Any:
    inner = frames.encode_request_header(ctx.api_key, ctx.api_version, ctx.correlation_id, ctx.client_id) + \
        bytes(M.encode(request, ctx.api_version))
    principal = getattr(ctx.connection, "principal", "User:ANONYMOUS")
    envelope = M.EnvelopeRequest(request_data=inner, request_principal=encode_principal(principal),
                                 client_host_address=host_bytes(ctx.client_host))
    try:
        answer = await node.controller_client_call(ENVELOPE, 0, envelope)
    except KafkaError as exc:
        return fail_whole(ctx, request, exc.code)
    if answer.error_code:
        return fail_whole(ctx, request, ErrorCode(answer.error_code))  # type: ignore[call-arg]
    data = bytes(answer.response_data)
    offset = 5 if frames.response_header_version(ctx.api_key, ctx.api_version) == 1 else 4
    response = M.decode_response(ctx.api_key, ctx.api_version, memoryview(data)[offset:])
    await node.caught_up_with_controller()
    return response


async def _forward_config_change(node: ClusterNode, ctx: Any, request: AlterRequest) -> Any:
    """AlterConfigs / IncrementalAlterConfigs as Kafka's brokers forward them: what this node
    refuses itself (a broker resource naming another broker) is answered here, the rest by the
    controller, in one response in the request's order."""
    refused = refused_before_forwarding(node.node_id, request)
    if not any(refused):
        return await _through_controller(node, ctx, request)
    rest: Any = copy.copy(request)  # AlterConfigs or IncrementalAlterConfigs, with fewer resources
    rest.resources = [r for r, error in zip(request.resources, refused) if error is None]
    answered = await _through_controller(node, ctx, rest) if rest.resources else None
    if answered is not None and not isinstance(answered, (M.AlterConfigsResponse, M.IncrementalAlterConfigsResponse)):
        return answered  # the connection was closed
    return reassemble(request, refused, answered)


class _Forwarded:
    """The connection of a request the controller serves for another node: the client's
    principal and address, the forwarding broker's listener."""

    def __init__(self, connection: Any, principal: str) -> None:
        self._connection = connection
        self.principal = principal
        self.forwarded = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


class _Closed(Exception):
    """The request came in on a listener that does not serve it: the connection was closed."""


def _cluster(ctx: RequestContext) -> ClusterNode:
    mode = getattr(ctx.broker, "cluster", None)
    node = getattr(mode, "node", None)
    if node is None:
        raise KafkaError(E.UNSUPPORTED_VERSION, "Not a node of a cluster.")
    listener = listener_of(ctx)
    if listener is not None and listener.upper() != node.settings.inter_broker_listener.upper():
        log.warning("closing connection: %s is only accepted on the inter-broker listener %s"
                    % (CONTROLLER_APIS[ctx.api_key].name, node.settings.inter_broker_listener),
                    listener=listener, client_host=ctx.client_host)
        ctx.connection.close()
        raise _Closed()
    if not authorize_cluster(ctx, Op.CLUSTER_ACTION):
        raise KafkaError(E.CLUSTER_AUTHORIZATION_FAILED, "Principal %s does not have required CLUSTER_ACTION"
                         % principal_of(ctx))
    return node  # type: ignore[no-any-return]


def _envelope_error(code: ErrorCode) -> M.EnvelopeResponse:
    return M.EnvelopeResponse(error_code=code, response_data=None)


@api(58, controller=True)
async def handle_envelope(ctx: RequestContext, request: M.EnvelopeRequest) -> M.EnvelopeResponse | None:
    try:
        node = _cluster(ctx)
    except _Closed:
        return None
    if not node.is_controller:
        return _envelope_error(E.NOT_CONTROLLER)
    try:
        principal = decode_principal(bytes(request.request_principal or b""))
    except Exception:
        return _envelope_error(E.PRINCIPAL_DESERIALIZATION_FAILURE)
    try:
        client_host = host_text(bytes(request.client_host_address))
    except ValueError:
        return _envelope_error(E.INVALID_REQUEST)
    data = memoryview(bytes(request.request_data or b""))
    try:
        api_key, api_version, correlation_id = struct.unpack_from(">hhi", data)
    except struct.error:
        return _envelope_error(E.UNSUPPORTED_VERSION)
    if api_key not in FORWARDED:
        return _envelope_error(E.INVALID_REQUEST)  # not eligible for forwarding
    inner_api = APIS.get(api_key)
    if inner_api is None or not inner_api.supports(api_version):
        return _envelope_error(E.UNSUPPORTED_VERSION)
    try:
        header_version = frames.request_header_version(api_key, api_version)
        client_id, body = frames.decode_header_rest(data, header_version)
        inner = M.decode_request(api_key, api_version, data[body:])
    except Exception:
        return _envelope_error(E.UNSUPPORTED_VERSION)  # Kafka's answer to an inner request it cannot parse
    inner_ctx = RequestContext(ctx.broker, api_key, api_version, correlation_id, client_id, client_host, 0,
                               _Forwarded(ctx.connection, principal))
    try:
        response = await inner_api.handler(inner_ctx, inner)
        await node.sync()
    except KafkaError as exc:
        response = fail_whole(inner_ctx, inner, exc.code)
    if response is None:
        return M.EnvelopeResponse(error_code=E.UNKNOWN_SERVER_ERROR, response_data=None)
    head = frames.encode_response_header(correlation_id, frames.response_header_version(api_key, api_version))
    return M.EnvelopeResponse(error_code=0, response_data=head + M.encode(response, api_version))


@api(62, controller=True)
async def handle_broker_registration(ctx: RequestContext,
                                     request: M.BrokerRegistrationRequest) -> M.BrokerRegistrationResponse | None:
    try:
        node = _cluster(ctx)
    except _Closed:
        return None
    try:
        return await _controller(node).register(request)  # type: ignore[no-any-return]
    except KafkaError as exc:
        return M.BrokerRegistrationResponse(error_code=exc.code, broker_epoch=-1)


@api(63, controller=True)
async def handle_broker_heartbeat(ctx: RequestContext,
                                  request: M.BrokerHeartbeatRequest) -> M.BrokerHeartbeatResponse | None:
    try:
        node = _cluster(ctx)
    except _Closed:
        return None
    try:
        return await _controller(node).heartbeat(request)  # type: ignore[no-any-return]
    except KafkaError as exc:
        return M.BrokerHeartbeatResponse(error_code=exc.code, is_caught_up=False, is_fenced=True,
                                         should_shut_down=False)


@api(67, controller=True)
async def handle_allocate_producer_ids(ctx: RequestContext,
                                       request: M.AllocateProducerIdsRequest) -> M.AllocateProducerIdsResponse | None:
    try:
        node = _cluster(ctx)
    except _Closed:
        return None
    try:
        return await _controller(node).allocate_producer_ids(request)  # type: ignore[no-any-return]
    except KafkaError as exc:
        return M.AllocateProducerIdsResponse(error_code=exc.code, producer_id_start=-1, producer_id_len=0)


@api(56, controller=True)
async def handle_alter_partition(ctx: RequestContext,
                                 request: M.AlterPartitionRequest) -> M.AlterPartitionResponse | None:
    """A partition leader's ISR change (its AlterPartitionManager sends it to the active
    controller; broker/cluster/elections.py decides)."""
    try:
        node = _cluster(ctx)
    except _Closed:
        return None
    try:
        return await _controller(node).alter_partition(request, ctx.api_version)  # type: ignore[no-any-return]
    except KafkaError as exc:
        return M.AlterPartitionResponse(throttle_time_ms=0, error_code=exc.code, topics=[])


def _controller(node: ClusterNode) -> Any:
    if node.controller is None or not node.controller.active:
        raise KafkaError(E.NOT_CONTROLLER, "This node is not the active controller.")
    return node.controller
