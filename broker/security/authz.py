"""What request handlers ask of security: Kafka's AuthHelper, for every API to use the same way.

    from broker.security.authz import Op, Res, authorize, filter_authorized, authorized_operations

    if not authorize(ctx, Op.READ, Res.GROUP, request.group_id):
        return <the response carrying GROUP_AUTHORIZATION_FAILED>
    allowed = filter_authorized(ctx, Op.WRITE, Res.TOPIC, topic_names)     # set of names
    ops = authorized_operations(ctx, Res.TOPIC, name)                       # the int32 bit field

With no authorizer configured every call allows (and costs one attribute read), as Kafka's
AuthHelper with authorizer = None. With one, the principal of the request's connection and the
client's address are checked against the ACLs (broker/security/authorizer.py). Use
`log_if_denied=False` where Kafka does (filters such as Metadata for all topics, authorized
operations). `authorize_cluster(ctx, op)` checks the CLUSTER resource "kafka-cluster";
`authorize_by_resource_type` is Kafka's (InitProducerId without a transactional id).
`require_cluster(ctx, op)` raises KafkaError(CLUSTER_AUTHORIZATION_FAILED) when denied (Kafka's
authorizeClusterOperation: the response's top-level error code says it).
`error_for(Res.X)` is the resource type's authorization error code.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.security.acl import AUTHORIZATION_ERRORS, CLUSTER_NAME, SUPPORTED_OPERATIONS, all_operations
from broker.security.acl import AclOperation as Op
from broker.security.acl import ResourceType as Res
from broker.security.request import SecuredRequest
from protocol.errors import ErrorCode, KafkaError

__all__ = ["Op", "Res", "authorize", "authorize_cluster", "authorize_by_resource_type", "filter_authorized",
           "authorized_operations", "error_for", "listener_of", "principal_of", "require_cluster", "CLUSTER_NAME"]


def principal_of(ctx: SecuredRequest) -> str:
    """The principal of the request's connection ("User:ANONYMOUS" without authentication)."""
    return ctx.connection.principal


def listener_of(ctx: SecuredRequest) -> str | None:
    """The listener the request came in on (None: a bare test server's connection has none)."""
    listener = ctx.connection.listener
    return listener.name if listener is not None else None


def authorize(ctx: SecuredRequest, operation: Op, resource_type: Res, name: str, log_if_denied: bool = True) -> bool:
    authorizer = ctx.broker.authorizer
    if authorizer is None:
        return True
    return authorizer.authorize(principal_of(ctx), ctx.client_host, operation, resource_type, name, log_if_denied)


def authorize_cluster(ctx: SecuredRequest, operation: Op, log_if_denied: bool = True) -> bool:
    return authorize(ctx, operation, Res.CLUSTER, CLUSTER_NAME, log_if_denied)


def require_cluster(ctx: SecuredRequest, operation: Op) -> None:
    """Kafka's authorizeClusterOperation: the whole request fails with CLUSTER_AUTHORIZATION_FAILED
    (the server answers it in the response's top-level error code)."""
    if not authorize(ctx, operation, Res.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)


def filter_authorized(ctx: SecuredRequest, operation: Op, resource_type: Res, names: Iterable[str],
                      log_if_denied: bool = True) -> set[str]:
    """The names (distinct) the principal may do `operation` on."""
    authorizer = ctx.broker.authorizer
    if authorizer is None:
        return set(names)
    principal, host = principal_of(ctx), ctx.client_host
    return {n for n in set(names) if authorizer.authorize(principal, host, operation, resource_type, n, log_if_denied)}


def authorize_by_resource_type(ctx: SecuredRequest, operation: Op, resource_type: Res) -> bool:
    authorizer = ctx.broker.authorizer
    if authorizer is None:
        return True
    return authorizer.authorize_by_resource_type(principal_of(ctx), ctx.client_host, operation, resource_type)


def authorized_operations(ctx: SecuredRequest, resource_type: Res, name: str) -> int:
    """The authorized-operations field of a resource: a bit per allowed supported operation."""
    authorizer = ctx.broker.authorizer
    if authorizer is None:
        return all_operations(resource_type)
    principal, host = principal_of(ctx), ctx.client_host
    return sum(1 << op for op in SUPPORTED_OPERATIONS[resource_type]
               if authorizer.authorize(principal, host, op, resource_type, name, False))


def error_for(resource_type: Res) -> ErrorCode:
    return AUTHORIZATION_ERRORS[resource_type]
