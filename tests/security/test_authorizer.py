"""The authorizer's decisions, case by case as Kafka's StandardAuthorizer makes them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from broker.security.acl import AclOperation as Op
from broker.security.acl import PatternType as P
from broker.security.acl import PermissionType as Perm
from broker.security.acl import ResourceType as Res
from broker.security.authorizer import Authorizer
from protocol import messages as M

ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


class Image:
    def __init__(self) -> None:
        self.acls: dict[uuid.UUID, Any] = {}
        self.acl_version = 0

    def add(self, rtype: Res, name: str, pattern: P, principal: str, op: Op, perm: Perm, host: str = "*") -> uuid.UUID:
        acl_id = uuid.uuid4()
        self.acls[acl_id] = M.AccessControlEntryRecord(
            id=acl_id, resource_type=rtype, resource_name=name, pattern_type=pattern, principal=principal, host=host,
            operation=op, permission_type=perm)
        self.acl_version += 1
        return acl_id

    def remove(self, acl_id: uuid.UUID) -> None:
        del self.acls[acl_id]
        self.acl_version += 1


@pytest.fixture
def image() -> Image:
    return Image()


def can(authz: Authorizer, principal: str, op: Op, rtype: Res, name: str, host: str = HOST) -> bool:
    return authz.authorize(principal, host, op, rtype, name, log_if_denied=False)


def test_no_acls_default_deny_and_allow_everyone(image: Image) -> None:
    assert not can(Authorizer(image), ALICE, Op.READ, Res.TOPIC, "t")
    assert can(Authorizer(image, allow_if_no_acl=True), ALICE, Op.READ, Res.TOPIC, "t")
    # ACLs on the resource for someone else: allow.everyone.if.no.acl.found no longer applies
    image.add(Res.TOPIC, "t", P.LITERAL, BOB, Op.READ, Perm.ALLOW)
    assert not can(Authorizer(image, allow_if_no_acl=True), ALICE, Op.READ, Res.TOPIC, "t")
    assert can(Authorizer(image, allow_if_no_acl=True), ALICE, Op.READ, Res.TOPIC, "other")


def test_literal_prefixed_wildcard(image: Image) -> None:
    authz = Authorizer(image)
    image.add(Res.TOPIC, "orders", P.LITERAL, ALICE, Op.WRITE, Perm.ALLOW)
    image.add(Res.TOPIC, "logs-", P.PREFIXED, ALICE, Op.READ, Perm.ALLOW)
    image.add(Res.GROUP, "*", P.LITERAL, ALICE, Op.READ, Perm.ALLOW)
    assert can(authz, ALICE, Op.WRITE, Res.TOPIC, "orders")
    assert not can(authz, ALICE, Op.WRITE, Res.TOPIC, "orders2")  # literal is exact
    assert can(authz, ALICE, Op.READ, Res.TOPIC, "logs-app")
    assert not can(authz, ALICE, Op.READ, Res.TOPIC, "logs")
    assert can(authz, ALICE, Op.READ, Res.GROUP, "any-group")
    assert not can(authz, BOB, Op.READ, Res.GROUP, "any-group")


def test_deny_wins_and_implied_describe(image: Image) -> None:
    authz = Authorizer(image)
    image.add(Res.TOPIC, "t", P.PREFIXED, "User:*", Op.ALL, Perm.ALLOW)
    image.add(Res.TOPIC, "t-secret", P.LITERAL, ALICE, Op.READ, Perm.DENY)
    assert can(authz, ALICE, Op.READ, Res.TOPIC, "t-public")
    assert not can(authz, ALICE, Op.READ, Res.TOPIC, "t-secret")
    assert can(authz, ALICE, Op.DESCRIBE, Res.TOPIC, "t-secret")  # a DENY of READ does not deny DESCRIBE
    image2 = Image()
    authz2 = Authorizer(image2)
    image2.add(Res.TOPIC, "x", P.LITERAL, ALICE, Op.READ, Perm.ALLOW)
    image2.add(Res.TOPIC, "x", P.LITERAL, ALICE, Op.ALTER_CONFIGS, Perm.ALLOW)
    assert can(authz2, ALICE, Op.DESCRIBE, Res.TOPIC, "x")  # READ implies DESCRIBE
    assert can(authz2, ALICE, Op.DESCRIBE_CONFIGS, Res.TOPIC, "x")  # ALTER_CONFIGS implies DESCRIBE_CONFIGS
    assert not can(authz2, ALICE, Op.WRITE, Res.TOPIC, "x")


def test_hosts_super_users_and_cache_invalidation(image: Image) -> None:
    authz = Authorizer(image, super_users=["User:admin"])
    acl = image.add(Res.CLUSTER, "kafka-cluster", P.LITERAL, ALICE, Op.ALTER, Perm.ALLOW, host=HOST)
    assert can(authz, ALICE, Op.ALTER, Res.CLUSTER, "kafka-cluster")
    assert not can(authz, ALICE, Op.ALTER, Res.CLUSTER, "kafka-cluster", host="10.0.0.2")
    image.add(Res.CLUSTER, "kafka-cluster", P.LITERAL, "User:admin", Op.ALL, Perm.DENY)
    assert can(authz, "User:admin", Op.ALTER, Res.CLUSTER, "kafka-cluster")  # super users skip every ACL
    image.remove(acl)
    assert not can(authz, ALICE, Op.ALTER, Res.CLUSTER, "kafka-cluster")  # the index follows the image


def test_authorize_by_resource_type(image: Image) -> None:
    authz = Authorizer(image)
    assert not authz.authorize_by_resource_type(ALICE, HOST, Op.WRITE, Res.TOPIC)
    image.add(Res.TOPIC, "ab", P.LITERAL, ALICE, Op.WRITE, Perm.ALLOW)
    assert authz.authorize_by_resource_type(ALICE, HOST, Op.WRITE, Res.TOPIC)
    image.add(Res.TOPIC, "a", P.PREFIXED, ALICE, Op.WRITE, Perm.DENY)  # dominates the allowed literal
    assert not authz.authorize_by_resource_type(ALICE, HOST, Op.WRITE, Res.TOPIC)
    image.add(Res.TOPIC, "b", P.PREFIXED, "User:*", Op.ALL, Perm.ALLOW)
    assert authz.authorize_by_resource_type(ALICE, HOST, Op.WRITE, Res.TOPIC)
    image.add(Res.TOPIC, "*", P.LITERAL, ALICE, Op.WRITE, Perm.DENY)
    assert not authz.authorize_by_resource_type(ALICE, HOST, Op.WRITE, Res.TOPIC)


def test_many_acls_index(image: Image) -> None:
    authz = Authorizer(image)
    for i in range(1000):
        image.add(Res.TOPIC, "topic-%04d" % i, P.LITERAL if i % 2 else P.PREFIXED, "User:u%d" % i, Op.READ, Perm.ALLOW)
    assert can(authz, "User:u2", Op.READ, Res.TOPIC, "topic-0002-suffix")
    assert not can(authz, "User:u3", Op.READ, Res.TOPIC, "topic-0003-suffix")
    assert can(authz, "User:u3", Op.READ, Res.TOPIC, "topic-0003")
