"""ACL APIs over raw frames: CreateAcls, DescribeAcls (filters), DeleteAcls, validation errors,
persistence across a restart, SECURITY_DISABLED without an authorizer, and unknown codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.security.inprocess import SecureBrokerThread

E = ErrorCode
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
TOPIC, GROUP, CLUSTER = 2, 3, 4
ANY, LITERAL, PREFIXED, MATCH = 1, 3, 4, 2
ALLOW, DENY = 3, 2
READ, WRITE, ALL_OPS, ANY_OP = 3, 4, 2, 1
AUTHZ = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
         "super.users": "User:ANONYMOUS"}


def creation(rtype: int, name: str, pattern: int = LITERAL, principal: str = "User:alice", op: int = READ,
             perm: int = ALLOW, host: str = "*") -> Any:
    return M.CreateAclsRequest.AclCreation(resource_type=rtype, resource_name=name, resource_pattern_type=pattern,
                                           principal=principal, host=host, operation=op, permission_type=perm)


def acl_filter(cls: Any, rtype: int = ANY, name: str | None = None, pattern: int = ANY, principal: str | None = None,
               op: int = ANY_OP, perm: int = ANY) -> Any:
    return cls(resource_type_filter=rtype, resource_name_filter=name, pattern_type_filter=pattern,
               principal_filter=principal, host_filter=None, operation=op, permission_type=perm)


def describe(c: Any, **kw: Any) -> list[tuple[int, str, int, str, int, int]]:
    response = c.call(DESCRIBE_ACLS, 3, acl_filter(M.DescribeAclsRequest, **kw))
    assert response.error_code == 0, response.error_message
    return sorted((r.resource_type, r.resource_name, r.pattern_type, a.principal, a.operation, a.permission_type)
                  for r in response.resources for a in r.acls)


def test_create_describe_delete_and_restart(tmp_path: Path) -> None:
    with SecureBrokerThread(tmp_path, AUTHZ) as bt:
        c = bt.client()
        response = c.call(CREATE_ACLS, 3, M.CreateAclsRequest(creations=[
            creation(TOPIC, "orders"), creation(TOPIC, "logs-", PREFIXED, op=WRITE),
            creation(GROUP, "*", principal="User:*"), creation(TOPIC, "orders"),  # a duplicate: success, one ACL
            creation(CLUSTER, "other"), creation(TOPIC, ""), creation(TOPIC, "x", MATCH),
            creation(TOPIC, "x", principal="alice"),
        ]))
        assert [(r.error_code, r.error_message) for r in response.results] == [
            (0, None), (0, None), (0, None), (0, None),
            (E.INVALID_REQUEST, "The only valid name for the CLUSTER resource is kafka-cluster"),
            (E.INVALID_REQUEST, "Invalid empty resource name"),
            (E.INVALID_REQUEST, "Invalid patternType MATCH"),
            (E.INVALID_REQUEST, "expected a string in format principalType:principalName but got alice"),
        ]
        assert len(describe(c)) == 3
        assert describe(c, rtype=TOPIC, name="logs-app", pattern=MATCH) == [
            (TOPIC, "logs-", PREFIXED, "User:alice", WRITE, ALLOW)]
        assert describe(c, rtype=GROUP, name="g1", pattern=MATCH) == [(GROUP, "*", LITERAL, "User:*", READ, ALLOW)]
        assert describe(c, rtype=TOPIC, name="orders", pattern=LITERAL) == [
            (TOPIC, "orders", LITERAL, "User:alice", READ, ALLOW)]
        assert describe(c, principal="User:*") == [(GROUP, "*", LITERAL, "User:*", READ, ALLOW)]
        c.close()
        bt.restart()  # ACLs live in the metadata log
        c = bt.client()
        assert len(describe(c)) == 3
        response = c.call(DELETE_ACLS, 3, M.DeleteAclsRequest(filters=[
            acl_filter(M.DeleteAclsRequest.DeleteAclsFilter, rtype=TOPIC),
            acl_filter(M.DeleteAclsRequest.DeleteAclsFilter, rtype=GROUP, name="nothing", pattern=LITERAL)]))
        assert [len(r.matching_acls) for r in response.filter_results] == [2, 0]
        assert describe(c) == [(GROUP, "*", LITERAL, "User:*", READ, ALLOW)]
        c.close()


def test_security_disabled_and_unknown_codes(tmp_path: Path) -> None:
    with SecureBrokerThread(tmp_path, {}) as bt:
        c = bt.client()
        response = c.call(DESCRIBE_ACLS, 3, acl_filter(M.DescribeAclsRequest))
        assert (response.error_code, response.error_message) == (E.SECURITY_DISABLED,
                                                                 "No Authorizer is configured on the broker")
        response = c.call(CREATE_ACLS, 3, M.CreateAclsRequest(creations=[creation(TOPIC, "t")]))
        assert response.results[0].error_code == E.SECURITY_DISABLED
        response = c.call(DELETE_ACLS, 3, M.DeleteAclsRequest(filters=[acl_filter(M.DeleteAclsRequest.DeleteAclsFilter)]))
        assert response.filter_results[0].error_code == E.SECURITY_DISABLED
        # an UNKNOWN (0) element: refused as Kafka's request class refuses it, by closing the connection
        c.send(DESCRIBE_ACLS, 3, acl_filter(M.DescribeAclsRequest, rtype=0))
        assert c.is_closed(5)
        other = bt.client()
        assert other.call(DESCRIBE_ACLS, 3, acl_filter(M.DescribeAclsRequest)).error_code == E.SECURITY_DISABLED
        other.close()


def test_mutual_tls_principal_is_authorized_by_its_mapped_name(tmp_path: Path) -> None:
    """A client certificate's DN, mapped by ssl.principal.mapping.rules, is the principal the
    ACLs name: User:alice may describe her topic, the certificate of bob may not."""
    import socket
    import ssl

    from tests.harness import RawClient
    from tests.security.certs import TestCA

    ca = TestCA(tmp_path / "certs")
    server = ca.issue("server", server=True, CN="localhost")
    alice = ca.issue("alice", O="Org", OU="Eng", CN="alice")
    bob = ca.issue("bob", O="Org", OU="Eng", CN="bob")
    with SecureBrokerThread(tmp_path, {
        **AUTHZ,
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(server.combined),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca.path), "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([a-z]+),OU=.*$/$1/,DEFAULT",
    }) as bt:
        bt.create_topic("alice-topic")
        c = bt.client()  # the plaintext super user sets the ACL
        assert c.call(CREATE_ACLS, 3, M.CreateAclsRequest(creations=[
            creation(TOPIC, "alice-topic", op=8)])).results[0].error_code == 0
        c.close()

        def tls_client(who: Any) -> RawClient:
            ctx = ssl.create_default_context(cafile=str(ca.path))
            ctx.load_cert_chain(str(who.cert), str(who.key))
            client = RawClient.__new__(RawClient)
            raw = socket.create_connection(("127.0.0.1", bt.port_of("SSL")), timeout=10)
            client.sock = ctx.wrap_socket(raw, server_hostname="localhost")
            client.client_id, client.correlation_id = "tls", 0
            return client

        def describe_topic(who: Any) -> int:
            client = tls_client(who)
            try:
                response = client.call(3, 12, M.MetadataRequest(topics=[
                    M.MetadataRequest.MetadataRequestTopic(name="alice-topic")], allow_auto_topic_creation=False))
                return int(response.topics[0].error_code)
            finally:
                client.close()

        assert describe_topic(alice) == 0
        assert describe_topic(bob) == E.TOPIC_AUTHORIZATION_FAILED


def test_share_group_apis_check_group_and_topic(tmp_path: Path) -> None:
    """Share APIs as Kafka 4.2's KafkaApis: READ on the group for heartbeats and fetches, DESCRIBE
    on the subscribed topics, DESCRIBE/READ/DELETE on the group for the offset admin APIs."""
    import uuid

    with SecureBrokerThread(tmp_path, AUTHZ) as bt:
        bt.create_topic("shared-topic")
        c = bt.client()
        assert c.call(CREATE_ACLS, 3, M.CreateAclsRequest(creations=[
            creation(GROUP, "sg", principal="User:ANONYMOUS")])).results[0].error_code == 0
        c.close()
        del bt.properties["super.users"]  # from now on User:ANONYMOUS may READ the group "sg", nothing else
        bt.restart()
        c = bt.client()
        member = uuid.uuid4().hex[:22]

        def heartbeat(group: str) -> Any:
            return c.call(76, 1, M.ShareGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=0, rack_id=None,
                subscribed_topic_names=["shared-topic"]))

        assert heartbeat("other").error_code == E.GROUP_AUTHORIZATION_FAILED
        assert heartbeat("sg").error_code == E.TOPIC_AUTHORIZATION_FAILED  # the topic is not describable
        F = M.ShareFetchRequest
        fetch = c.call(78, 1, F(group_id="other", member_id=member, share_session_epoch=0, max_wait_ms=0,
                                min_bytes=1, max_bytes=1024, max_records=10, batch_size=10, topics=[],
                                forgotten_topics_data=[]))
        assert fetch.error_code == E.GROUP_AUTHORIZATION_FAILED
        D = M.DescribeShareGroupOffsetsRequest
        described = c.call(90, 1, D(groups=[D.DescribeShareGroupOffsetsRequestGroup(group_id=g, topics=None)
                                            for g in ("sg", "other")]))
        # READ on a group implies DESCRIBE
        assert [g.error_code for g in described.groups] == [0, E.GROUP_AUTHORIZATION_FAILED]
        X = M.DeleteShareGroupOffsetsRequest
        deleted = c.call(92, 0, X(group_id="sg", topics=[X.DeleteShareGroupOffsetsRequestTopic(topic_name="t")]))
        assert deleted.error_code == E.GROUP_AUTHORIZATION_FAILED  # DELETE is not implied
        c.close()


def test_share_fetch_and_acknowledge_without_a_group_id_are_invalid_under_acls(tmp_path: Path) -> None:
    """A null GroupId is INVALID_REQUEST with an authorizer too (as without one): it is not looked up
    in the ACLs, where a missing name failed the request as an UNKNOWN_SERVER_ERROR."""
    with SecureBrokerThread(tmp_path, AUTHZ) as bt:
        c = bt.client()
        assert c.call(CREATE_ACLS, 3, M.CreateAclsRequest(creations=[
            creation(GROUP, "sg", principal="User:ANONYMOUS")])).results[0].error_code == 0
        c.close()
        del bt.properties["super.users"]  # User:ANONYMOUS is judged by the ACLs from now on
        bt.restart()
        c = bt.client()
        F, A = M.ShareFetchRequest, M.ShareAcknowledgeRequest
        fetch = c.call(78, 1, F(group_id=None, member_id="m", share_session_epoch=0, max_wait_ms=0, min_bytes=1,
                                max_bytes=1024, max_records=10, batch_size=10, topics=[], forgotten_topics_data=[]))
        assert fetch.error_code == E.INVALID_REQUEST
        ack = c.call(79, 1, A(group_id=None, member_id="m", share_session_epoch=1, topics=[]))
        assert ack.error_code == E.INVALID_REQUEST
        c.close()
