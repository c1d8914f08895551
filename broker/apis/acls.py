"""ACL APIs: DescribeAcls (29), CreateAcls (30), DeleteAcls (31).

As Kafka's AclApis and AclControlManager: DescribeAcls needs DESCRIBE on the cluster, the other
two ALTER (CLUSTER_AUTHORIZATION_FAILED otherwise); without an authorizer they answer
SECURITY_DISABLED. A request naming an UNKNOWN resource type, pattern type, operation or
permission type is refused as Kafka's request classes refuse it: the connection is closed.
CreateAcls checks each binding (the cluster's only name is "kafka-cluster", no empty name, a
concrete resource type, LITERAL or PREFIXED, a principal "type:name") and writes an
AccessControlEntryRecord for each new one; DeleteAcls writes a RemoveAccessControlEntryRecord
for each ACL a filter matches. Records are durable in the metadata log before the answer.
"""

from __future__ import annotations

import uuid
from enum import IntEnum

from broker.apis.context import RequestContext
from broker.apis.registry import api
from broker.observability.logger import get_logger
from broker.security.acl import CLUSTER_NAME, AclOperation, PatternType, PermissionType, ResourceType
from broker.security.authorizer import Acl
from broker.security.authz import Op, authorize_cluster
from broker.security.principal import parse_principal
from protocol import messages as M
from protocol.errors import ErrorCode

log = get_logger("broker.acls")
MAX_RECORDS_PER_USER_OP = 10_000  # QuorumController's bound on the records of one request


def _known(enum_type: type[IntEnum], code: int) -> bool:
    return code in enum_type._value2member_map_ and code != 0


def _filter_is_known(resource_type: int, pattern_type: int, operation: int, permission: int) -> bool:
    return (_known(ResourceType, resource_type) and _known(PatternType, pattern_type)
            and _known(AclOperation, operation) and _known(PermissionType, permission))


def _refuse(ctx: RequestContext, what: str) -> None:
    log.warning("closing connection: invalid request", api=what, peer=ctx.client_host,
                error="contains UNKNOWN elements")
    ctx.connection.close()


class AclFilter:
    """An AclBindingFilter: resource pattern filter and access control entry filter."""

    def __init__(self, f: M.DescribeAclsRequest | M.DeleteAclsRequest.DeleteAclsFilter) -> None:
        self.resource_type = f.resource_type_filter
        self.name = f.resource_name_filter
        self.pattern_type = f.pattern_type_filter
        self.principal = f.principal_filter
        self.host = f.host_filter
        self.operation = f.operation
        self.permission = f.permission_type

    def matches(self, acl: Acl) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != acl.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != acl.pattern_type:
            return False
        if self.name is not None:
            if self.pattern_type in (PatternType.ANY, acl.pattern_type):
                if self.name != acl.resource_name:
                    return False
            elif acl.pattern_type == PatternType.LITERAL:
                if self.name != acl.resource_name and acl.resource_name != "*":
                    return False
            elif not self.name.startswith(acl.resource_name):
                return False
        if self.principal is not None and self.principal != acl.principal:
            return False
        if self.host is not None and self.host != acl.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != acl.operation:
            return False
        return self.permission == PermissionType.ANY or self.permission == acl.permission


def _disabled(ctx: RequestContext) -> bool:
    return ctx.broker.authorizer is None


def _alter_refusal(ctx: RequestContext) -> tuple[ErrorCode, str | None] | None:
    """Why CreateAcls/DeleteAcls answers every item with an error (ALTER on the cluster is needed,
    and an authorizer), or None."""
    if not authorize_cluster(ctx, Op.ALTER):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None
    if _disabled(ctx):
        return ErrorCode.SECURITY_DISABLED, "No Authorizer is configured."
    return None


# ----- DescribeAcls --------------------------------------------------------------------------
@api(29)
async def handle_describe_acls(ctx: RequestContext, request: M.DescribeAclsRequest) -> M.DescribeAclsResponse | None:
    R = M.DescribeAclsResponse
    if not _filter_is_known(request.resource_type_filter, request.pattern_type_filter, request.operation,
                            request.permission_type):
        _refuse(ctx, "DescribeAcls")
        return None
    if not authorize_cluster(ctx, Op.DESCRIBE):
        return R(throttle_time_ms=0, error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED), resources=[])
    authorizer = ctx.broker.authorizer
    if authorizer is None:
        return R(throttle_time_ms=0, error_code=int(ErrorCode.SECURITY_DISABLED),
                 error_message="No Authorizer is configured on the broker", resources=[])
    wanted = AclFilter(request)
    grouped: dict[tuple[int, str, int], list[M.DescribeAclsResponse.AclDescription]] = {}
    for acl in authorizer.acls():
        if wanted.matches(acl):
            grouped.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
                R.AclDescription(principal=acl.principal, host=acl.host, operation=acl.operation,
                                 permission_type=acl.permission))
    return R(throttle_time_ms=0, error_code=0, error_message=None, resources=[
        R.DescribeAclsResource(resource_type=rt, resource_name=name, pattern_type=pt, acls=acls)
        for (rt, name, pt), acls in grouped.items()
    ])


# ----- CreateAcls ----------------------------------------------------------------------------
def _creation_error(c: M.CreateAclsRequest.AclCreation) -> str | None:
    """Why a creation is refused (INVALID_REQUEST), or None (AclApis then AclControlManager)."""
    if c.resource_type == ResourceType.CLUSTER and c.resource_name != CLUSTER_NAME:
        return "The only valid name for the CLUSTER resource is " + CLUSTER_NAME
    if c.resource_name == "":
        return "Invalid empty resource name"
    if c.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return "Invalid resourceType %s" % ResourceType(c.resource_type).name
    if c.resource_pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return "Invalid patternType %s" % PatternType(c.resource_pattern_type).name
    if c.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return "Invalid operation %s" % AclOperation(c.operation).name
    if c.permission_type not in (PermissionType.DENY, PermissionType.ALLOW):
        return "Invalid permissionType %s" % PermissionType(c.permission_type).name
    try:
        parse_principal(c.principal)
    except ValueError as exc:
        return str(exc)
    return None


@api(30)
async def handle_create_acls(ctx: RequestContext, request: M.CreateAclsRequest) -> M.CreateAclsResponse | None:
    R = M.CreateAclsResponse
    if not all(_filter_is_known(c.resource_type, c.resource_pattern_type, c.operation, c.permission_type)
               for c in request.creations):
        _refuse(ctx, "CreateAcls")
        return None
    refusal = _alter_refusal(ctx)
    if refusal is not None:
        return R(throttle_time_ms=0, results=[
            R.AclCreationResult(error_code=int(refusal[0]), error_message=refusal[1]) for _ in request.creations])
    authorizer = ctx.broker.authorizer
    assert authorizer is not None  # not refused: there is one
    existing = {(a.resource_type, a.resource_name, a.pattern_type, a.principal, a.host, a.operation, a.permission)
                for a in authorizer.acls()}
    results = []
    records = []
    for c in request.creations:
        error = _creation_error(c)
        if error is not None:
            results.append(R.AclCreationResult(error_code=int(ErrorCode.INVALID_REQUEST), error_message=error))
            continue
        key = (c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host, c.operation,
               c.permission_type)
        if key not in existing:  # an ACL that exists already is a success without a record
            existing.add(key)
            records.append(M.AccessControlEntryRecord(
                id=uuid.uuid4(), resource_type=c.resource_type, resource_name=c.resource_name,
                pattern_type=c.resource_pattern_type, principal=c.principal, host=c.host, operation=c.operation,
                permission_type=c.permission_type))
        results.append(R.AclCreationResult(error_code=0, error_message=None))
    if len(records) > MAX_RECORDS_PER_USER_OP:
        message = "Cannot create more than %d acls in a single request." % MAX_RECORDS_PER_USER_OP
        return R(throttle_time_ms=0, results=[
            R.AclCreationResult(error_code=int(ErrorCode.UNKNOWN_SERVER_ERROR), error_message=message)
            for _ in request.creations])
    ctx.broker.metadata.append_records(records)
    return R(throttle_time_ms=0, results=results)


# ----- DeleteAcls ----------------------------------------------------------------------------
@api(31)
async def handle_delete_acls(ctx: RequestContext, request: M.DeleteAclsRequest) -> M.DeleteAclsResponse | None:
    R = M.DeleteAclsResponse
    if not all(_filter_is_known(f.resource_type_filter, f.pattern_type_filter, f.operation, f.permission_type)
               for f in request.filters):
        _refuse(ctx, "DeleteAcls")
        return None
    refusal = _alter_refusal(ctx)
    if refusal is not None:
        return R(throttle_time_ms=0, filter_results=[
            R.DeleteAclsFilterResult(error_code=int(refusal[0]), error_message=refusal[1], matching_acls=[])
            for _ in request.filters])
    authorizer = ctx.broker.authorizer
    assert authorizer is not None  # not refused: there is one
    acls = authorizer.acls()
    removed: dict[uuid.UUID, M.RemoveAccessControlEntryRecord] = {}
    results = []
    for f in request.filters:
        wanted = AclFilter(f)
        matching = [a for a in acls if wanted.matches(a)]
        for a in matching:
            removed[a.id] = M.RemoveAccessControlEntryRecord(id=a.id)
        results.append(R.DeleteAclsFilterResult(error_code=0, error_message=None, matching_acls=[
            R.DeleteAclsMatchingAcl(error_code=0, error_message=None, resource_type=a.resource_type,
                                    resource_name=a.resource_name, pattern_type=a.pattern_type, principal=a.principal,
                                    host=a.host, operation=a.operation, permission_type=a.permission)
            for a in matching]))
    if len(removed) > MAX_RECORDS_PER_USER_OP:
        message = "Cannot remove more than %d acls in a single delete operation." % MAX_RECORDS_PER_USER_OP
        return R(throttle_time_ms=0, filter_results=[
            R.DeleteAclsFilterResult(error_code=int(ErrorCode.UNKNOWN_SERVER_ERROR), error_message=message,
                                     matching_acls=[])
            for _ in request.filters])
    ctx.broker.metadata.append_records(list(removed.values()))
    return R(throttle_time_ms=0, filter_results=results)
