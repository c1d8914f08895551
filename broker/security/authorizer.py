"""The authorizer: Kafka's StandardAuthorizer semantics over the ACLs of the metadata image.

Turned on by `authorizer.class.name` naming Kafka's StandardAuthorizer (or AclAuthorizer, the
same rules). The ACLs are the AccessControlEntryRecords of the metadata log, so they survive a
restart and CreateAcls/DeleteAcls take effect as soon as their records are durable.

An action (principal, client host, operation, resource type, resource name) is decided as
StandardAuthorizerData.authorize does:
  1. a principal listed in `super.users` (User:admin;User:ops) may do anything;
  2. the ACLs that apply are those of the resource type whose pattern matches the name: LITERAL
     with the same name, PREFIXED with a prefix of it, and the LITERAL wildcard "*"; an ACL
     matches the request if its principal is the client's or User:*, its host the client's
     address or "*", and its operation the one asked for or ALL; an ALLOW of READ, WRITE, DELETE
     or ALTER also allows DESCRIBE, and of ALTER_CONFIGS also DESCRIBE_CONFIGS (never a DENY);
  3. any matching DENY denies; else any matching ALLOW allows;
  4. with no matching ACL: denied if the resource has ACLs at all (for anyone), else
     `allow.everyone.if.no.acl.found` decides (default: denied).
`authorize_by_resource_type` is Kafka's default Authorizer.authorizeByResourceType (may the
principal do the operation on some resource of the type: used by InitProducerId).

Indexes are rebuilt when the image's ACL version moves; decisions are cached per (principal,
host, operation, resource) until then, so a request pays a dict lookup however many ACLs exist.
Denials of explicitly requested resources are logged as Kafka's authorizer logger does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from broker.observability.logger import get_logger
from broker.security.acl import (
    CLUSTER_NAME,
    WILDCARD,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from broker.security.principal import WILDCARD_PRINCIPAL

log = get_logger("kafka.authorizer.logger")

AUTHORIZER_CLASSES = (
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
)
_IMPLIES_DESCRIBE = frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
                               AclOperation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})
_CACHE_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class Acl:
    """One ACL (an AccessControlEntryRecord's content)."""

    id: uuid.UUID
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    @classmethod
    def of(cls, record: Any) -> Acl:
        return cls(record.id, record.resource_type, record.resource_name, record.pattern_type, record.principal,
                   record.host, record.operation, record.permission_type)


def _applies(acl: Acl, principal: str, host: str, operation: int) -> int | None:
    """ALLOW/DENY if the ACL applies to the request (its resource matches already), else None."""
    if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
        return None
    if acl.host != WILDCARD and acl.host != host:
        return None
    if acl.operation != AclOperation.ALL:
        if acl.permission == PermissionType.ALLOW:
            if operation == AclOperation.DESCRIBE:
                if acl.operation not in _IMPLIES_DESCRIBE:
                    return None
            elif operation == AclOperation.DESCRIBE_CONFIGS:
                if acl.operation not in _IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif operation != acl.operation:
                return None
        elif operation != acl.operation:
            return None
    return acl.permission


class _TypeIndex:
    """The ACLs of one resource type: literal by name, prefixed by name (looked up by the
    lengths in use), and the literal wildcard."""

    __slots__ = ("literal", "prefixed", "prefix_lengths", "wildcard")

    def __init__(self) -> None:
        self.literal: dict[str, list[Acl]] = {}
        self.prefixed: dict[str, list[Acl]] = {}
        self.prefix_lengths: list[int] = []
        self.wildcard: list[Acl] = []

    def add(self, acl: Acl) -> None:
        if acl.pattern_type == PatternType.LITERAL:
            if acl.resource_name == WILDCARD:
                self.wildcard.append(acl)
            else:
                self.literal.setdefault(acl.resource_name, []).append(acl)
        elif acl.pattern_type == PatternType.PREFIXED:
            self.prefixed.setdefault(acl.resource_name, []).append(acl)

    def finish(self) -> None:
        self.prefix_lengths = sorted({len(name) for name in self.prefixed})

    def matching(self, name: str) -> Iterator[list[Acl]]:
        found = self.literal.get(name)
        if found:
            yield found
        size = len(name)
        for length in self.prefix_lengths:
            if length > size:
                break
            found = self.prefixed.get(name[:length])
            if found:
                yield found
        if self.wildcard:
            yield self.wildcard


class Authorizer:
    def __init__(self, image: Any, super_users: Iterable[str] = (), allow_if_no_acl: bool = False) -> None:
        self.image = image  # broker.metadata.MetadataImage: its `acls` and `acl_version`
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._version = -1
        self._index: dict[int, _TypeIndex] = {}
        self._cache: dict[tuple[str, str, int, int, str], bool] = {}

    @classmethod
    def from_config(cls, config: Any, image: Any) -> Authorizer | None:
        name = str(config["authorizer.class.name"] or "").strip()
        if not name:
            return None
        from broker.security.errors import SecurityConfigError
        from broker.security.principal import parse_principal

        if name not in AUTHORIZER_CLASSES:
            raise SecurityConfigError("authorizer.class.name=%s is not available: use %s" % (name, AUTHORIZER_CLASSES[0]))
        users = [u.strip() for u in str(config["super.users"] or "").split(";") if u.strip()]
        for u in users:
            try:
                parse_principal(u)
            except ValueError as exc:
                raise SecurityConfigError("Invalid super.users: %s" % exc) from None
        return cls(image, users, bool(config["allow.everyone.if.no.acl.found"]))

    # decisions --------------------------------------------------------------------------------
    def _refresh(self) -> None:
        index: dict[int, _TypeIndex] = {}
        for record in self.image.acls.values():
            acl = Acl.of(record)
            index.setdefault(acl.resource_type, _TypeIndex()).add(acl)
        for type_index in index.values():
            type_index.finish()
        self._index = index
        self._cache = {}
        self._version = self.image.acl_version

    def authorize(self, principal: str, host: str, operation: int, resource_type: int, name: str,
                  log_if_denied: bool = True) -> bool:
        if self._version != self.image.acl_version:
            self._refresh()
        key = (principal, host, operation, resource_type, name)
        allowed = self._cache.get(key)
        if allowed is None:
            allowed = self._decide(principal, host, operation, resource_type, name)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = allowed
        if not allowed and log_if_denied:
            log.info("authorization denied", principal=principal, host=host, operation=AclOperation(operation).name,
                     resource="%s:LITERAL:%s" % (ResourceType(resource_type).name.title().replace("_", ""), name))
        return allowed

    def _decide(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        if principal in self.super_users:
            return True
        type_index = self._index.get(resource_type)
        if type_index is None:
            return self.allow_if_no_acl
        has_acls = False
        allowed = False
        for acls in type_index.matching(name):
            has_acls = True
            for acl in acls:
                result = _applies(acl, principal, host, operation)
                if result == PermissionType.DENY:
                    return False
                if result == PermissionType.ALLOW:
                    allowed = True
        if allowed:
            return True
        return False if has_acls else self.allow_if_no_acl

    def authorize_by_resource_type(self, principal: str, host: str, operation: int, resource_type: int) -> bool:
        """May the principal do `operation` on at least one resource of the type (Kafka's default
        Authorizer.authorizeByResourceType)."""
        if self.authorize(principal, host, operation, resource_type, "hardcode", log_if_denied=False):
            return True
        deny: dict[int, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        allow: dict[int, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        wildcard_allow = False
        for record in self.image.acls.values():
            acl = Acl.of(record)
            if acl.resource_type != resource_type:
                continue
            if acl.host != host and acl.host != WILDCARD:
                continue
            if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
                continue
            if acl.operation != operation and acl.operation != AclOperation.ALL:
                continue
            if acl.pattern_type not in deny:
                continue
            if acl.permission == PermissionType.DENY:
                if acl.pattern_type == PatternType.LITERAL and acl.resource_name == WILDCARD:
                    return False
                deny[acl.pattern_type].add(acl.resource_name)
            elif acl.permission == PermissionType.ALLOW:
                if acl.pattern_type == PatternType.LITERAL and acl.resource_name == WILDCARD:
                    wildcard_allow = True
                    continue
                allow[acl.pattern_type].add(acl.resource_name)
        if wildcard_allow:
            return True
        for pattern_type, names in allow.items():
            for name in names:
                if pattern_type == PatternType.LITERAL and name in deny[PatternType.LITERAL]:
                    continue
                if not any(name[:i] in deny[PatternType.PREFIXED] for i in range(1, len(name) + 1)):
                    return True
        return False

    # listing ----------------------------------------------------------------------------------
    def acls(self) -> list[Acl]:
        return [Acl.of(record) for record in self.image.acls.values()]


def is_cluster_name(name: str) -> bool:
    return name == CLUSTER_NAME
