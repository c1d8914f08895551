"""ACLs with real clients: the StandardAuthorizer on, users authenticated with SASL/PLAIN, ACLs
managed with confluent-kafka's and kafka-python's admin clients; allowed and denied produce,
consume, groups, transactions and admin operations with Kafka's errors in each client; Metadata
hides the topics a principal may not describe; authorized operations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import BrokerProcess, free_port, port_open, wait_for
from tests.security.clients import Creds, confluent_conf, python_conf

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
        + " ".join('user_%s="%s"' % item for item in USERS.items()) + ";")
TOPICS = ["alice-orders", "alice-logs", "shared", "secret"]


def creds(user: str) -> Creds:
    return Creds("SASL_PLAINTEXT", mechanism="PLAIN", username=user, password=USERS[user])


class Secured:
    def __init__(self, proc: BrokerProcess, port: int) -> None:
        self.proc, self.port = proc, port

    @property
    def bootstrap(self) -> str:
        return "127.0.0.1:%d" % self.port

    def conf(self, user: str, **extra: Any) -> dict[str, Any]:
        return confluent_conf(self.bootstrap, creds(user), **extra)

    def admin(self, user: str) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.conf(user))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("acls")
    proc = BrokerProcess(base / "data")
    port = free_port()
    proc.overrides.update({
        "listeners": "PLAINTEXT://127.0.0.1:%d,SASL_PLAINTEXT://127.0.0.1:%d" % (proc.port, port),
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "transaction.state.log.num.partitions": "1",
        "offsets.topic.num.partitions": "1",
    })
    proc.start()
    wait_for(lambda: port_open(port), 10, what="the SASL listener")
    s = Secured(proc, port)
    _setup(s)
    try:
        yield s
    finally:
        proc.stop_cleanly()


def _setup(s: Secured) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        NewTopic,
        ResourcePatternType,
    )
    from confluent_kafka.admin import ResourceType as RT

    admin = s.admin("admin")
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in TOPICS]).values():
        future.result(30)
    allow = AclPermissionType.ALLOW
    acls = [
        AclBinding(RT.TOPIC, "alice-", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.WRITE, allow),
        AclBinding(RT.TOPIC, "alice-", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.READ, allow),
        AclBinding(RT.GROUP, "alice-group", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ, allow),
        AclBinding(RT.TRANSACTIONAL_ID, "alice-tx", ResourcePatternType.LITERAL, "User:alice", "*",
                   AclOperation.WRITE, allow),
        AclBinding(RT.TOPIC, "shared", ResourcePatternType.LITERAL, "User:*", "*", AclOperation.DESCRIBE, allow),
    ]
    for future in admin.create_acls(acls).values():
        future.result(30)
    # an unprivileged user may not manage ACLs
    alice = s.admin("alice")  # held: a client destroyed under its futures fails them
    with pytest.raises(KafkaException) as denied:
        for future in alice.create_acls(acls[:1]).values():
            future.result(30)
    assert denied.value.args[0].code() == 31  # CLUSTER_AUTHORIZATION_FAILED


def test_describe_and_delete_acls_with_both_admin_clients(secured: Secured) -> None:
    from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType
    from confluent_kafka.admin import ResourceType as RT

    admin = secured.admin("admin")
    found = admin.describe_acls(AclBindingFilter(
        RT.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)).result(30)
    assert len(found) == 5
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KRT

    kadmin = KafkaAdminClient(bootstrap_servers=secured.bootstrap, **python_conf(creds("admin")))
    try:
        acls, error = kadmin.describe_acls(ACLFilter(
            principal="User:alice", host="*", operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(KRT.ANY, None, ACLResourcePatternType.ANY)))
        assert error.errno == 0 and len(acls) == 4
        deleted = kadmin.delete_acls([ACLFilter(
            principal="User:nobody", host="*", operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(KRT.ANY, None, ACLResourcePatternType.ANY))])
        assert deleted[0][1] == [] or all(not m for m in deleted[0][1])
    finally:
        kadmin.close()


def test_produce_allowed_and_denied(secured: Secured) -> None:
    from confluent_kafka import KafkaError, Producer

    results: dict[str, Any] = {}
    p = Producer(secured.conf("alice", **{"linger.ms": 0, "enable.idempotence": False}))
    for topic in ("alice-orders", "secret"):
        p.produce(topic, b"?", on_delivery=lambda err, msg: results.__setitem__(msg.topic(), err))
    assert p.flush(30) == 0
    assert results["alice-orders"] is None
    assert results["secret"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    kp = KafkaProducer(bootstrap_servers=secured.bootstrap, enable_idempotence=False, max_block_ms=10000,
                       **python_conf(creds("alice")))
    try:
        kp.send("alice-logs", b"ok").get(timeout=30)
        with pytest.raises(TopicAuthorizationFailedError):
            kp.send("secret", b"no").get(timeout=30)
    finally:
        kp.close()


def test_metadata_hides_undescribable_topics(secured: Secured) -> None:
    alice = set(secured.admin("alice").list_topics(timeout=10).topics)
    bob = set(secured.admin("bob").list_topics(timeout=10).topics)
    admin = set(secured.admin("admin").list_topics(timeout=10).topics)
    assert alice == {"alice-orders", "alice-logs", "shared"}
    assert bob == {"shared"}
    assert set(TOPICS) <= admin
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=secured.bootstrap, **python_conf(creds("bob")))
    try:
        assert c.topics() == {"shared"}
    finally:
        c.close()


def test_groups_allowed_and_denied_with_aiokafka(secured: Secured) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    async def consume(group: str, topic: str) -> list[bytes]:
        c = AIOKafkaConsumer(topic, bootstrap_servers=secured.bootstrap, group_id=group, auto_offset_reset="earliest",
                             **python_conf(creds("alice"), aio=True))
        try:
            await c.start()
            batch = await asyncio.wait_for(c.getmany(timeout_ms=8000), 20)
            await c.commit()
            return [r.value for records in batch.values() for r in records]
        finally:
            await c.stop()

    from confluent_kafka import Producer

    p = Producer(secured.conf("alice"))
    p.produce("alice-logs", b"for-the-group")
    assert p.flush(30) == 0
    assert b"for-the-group" in asyncio.run(consume("alice-group", "alice-logs"))
    with pytest.raises(GroupAuthorizationFailedError):
        asyncio.run(consume("other-group", "alice-logs"))
    with pytest.raises((TopicAuthorizationFailedError, GroupAuthorizationFailedError)):
        asyncio.run(consume("alice-group", "secret"))


def test_confluent_consumer_group_denied(secured: Secured) -> None:
    from confluent_kafka import Consumer, KafkaError

    c = Consumer(secured.conf("alice", **{"group.id": "not-hers", "auto.offset.reset": "earliest"}))
    try:
        c.subscribe(["alice-orders"])
        deadline = time.monotonic() + 20
        error = None
        while error is None and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and msg.error():
                error = msg.error()
        assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        c.close()


def test_idempotence_needs_a_writable_topic(secured: Secured) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer

    p = Producer(secured.conf("bob", **{"enable.idempotence": True}))
    p.produce("shared", b"x")
    with pytest.raises(KafkaException) as fatal:  # librdkafka: a fatal error, raised by flush
        p.flush(20)
    assert fatal.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED and fatal.value.args[0].fatal()
    # alice may write a topic: her idempotent producer gets a producer id
    ok = Producer(secured.conf("alice", **{"enable.idempotence": True}))
    ok.produce("alice-orders", b"idempotent")
    assert ok.flush(30) == 0


def test_transactional_ids(secured: Secured) -> None:
    from confluent_kafka import KafkaException, Producer

    p = Producer(secured.conf("alice", **{"transactional.id": "alice-tx"}))
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("alice-orders", b"in-a-transaction")
    p.commit_transaction(30)
    denied = Producer(secured.conf("alice", **{"transactional.id": "someone-elses"}))
    with pytest.raises(KafkaException) as failure:
        denied.init_transactions(30)
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in str(failure.value) or \
        failure.value.args[0].code() == 53


def test_admin_operations_and_authorized_operations(secured: Secured) -> None:
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AclOperation, NewTopic

    alice, admin = secured.admin("alice"), secured.admin("admin")
    with pytest.raises(KafkaException) as failure:
        for future in alice.create_topics([NewTopic("alice-new", 1, 1)]).values():
            future.result(30)
    assert failure.value.args[0].code() == 29  # TOPIC_AUTHORIZATION_FAILED
    described = alice.describe_topics(
        TopicCollection(["alice-orders"]), include_authorized_operations=True)["alice-orders"].result(30)
    assert set(described.authorized_operations) == {AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE}
    alice_cluster = alice.describe_cluster(include_authorized_operations=True).result(30)
    admin_cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
    assert not alice_cluster.authorized_operations
    assert AclOperation.ALTER in admin_cluster.authorized_operations
