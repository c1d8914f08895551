"""A cluster whose only listener is secured: three broker processes on one etcd authenticate to
each other as the inter-broker principal (BrokerRegistration, BrokerHeartbeat, AllocateProducerIds,
Envelope, AddPartitionsToTxn, WriteTxnMarkers) under an authorizer whose super user it is, as
Kafka's docs set a secured cluster up.

SASL_PLAINTEXT with PLAIN: a topic created through a node that is not the controller is forwarded
in an Envelope carrying the client's principal, so the controller refuses a client without CREATE
on the cluster and creates it for one with it (kafka-python's admin pointed at that node; clients
send CreateTopics to the controller Metadata names); a client cannot send an Envelope itself
(CLUSTER_ACTION); confluent-kafka produces and consumes across the three nodes, and a transaction
spans partitions led by all three (markers and verification between brokers). A fourth broker
whose inter-broker password is wrong cannot register: it logs the authentication failure, keeps
trying, and the cluster is unaffected.

SASL with SCRAM-SHA-512 between brokers: their user is made with AlterUserScramCredentials through
the controller, the others register once it exists.

SSL with mutual TLS: the brokers' certificate (CN=broker) maps to User:broker, their super user;
the same clients over TLS.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka import KafkaAdminClient

from broker.apis.forwarding import encode_principal, host_bytes
from broker.cluster.client import NodeClient
from broker.config import BrokerConfig
from broker.security.interbroker import inter_broker_security
from broker.testing.etcd import etcd_available
from protocol import frames
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.cluster.harness import ProcessCluster
from tests.harness import BrokerProcess, free_port, wait_for
from tests.security.clients import Creds, confluent_conf, python_conf

pytestmark = pytest.mark.timeout(180)

E = ErrorCode
ENVELOPE, CREATE_TOPICS = 58, 19
PARTITIONS = 3
AUTHORIZER = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer"}
SMALL = {"offsets.topic.num.partitions": "6", "transaction.state.log.num.partitions": "6",
         "connection.failed.authentication.delay.ms": "10"}


def plain_jaas(username: str, password: str) -> str:
    return ('org.apache.kafka.common.security.plain.PlainLoginModule required username="%s" password="%s" '
            'user_admin="admin-secret" user_alice="alice-secret" user_bob="bob-secret";' % (username, password))


SASL = {**AUTHORIZER, **SMALL, "super.users": "User:admin",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT",
        "security.inter.broker.protocol": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_jaas("admin", "admin-secret")}


def need_etcd() -> None:
    import os

    if not etcd_available():
        if os.environ.get("CI"):
            pytest.fail("etcd is not installed: .ci/run installs Debian's etcd-server")
        pytest.skip("etcd is not installed (Debian: etcd-server)")


def start_secured(base: Path, protocol: str, overrides: dict[str, str], admin: Creds) -> ProcessCluster:
    """Three nodes whose only listener speaks `protocol`, once every one is registered and live
    (which they are only if they could authenticate to the controller)."""
    need_etcd()
    cluster = ProcessCluster(base, 3, overrides)
    for process in cluster.nodes.values():
        process.overrides["listeners"] = "%s://127.0.0.1:%d" % (protocol, process.port)
    try:
        cluster.start()
        wait_live(cluster, admin, set(cluster.nodes))
    except BaseException:
        print(cluster.logs())
        cluster.stop()
        raise
    return cluster


def admin_of(bootstrap: str, creds: Creds) -> AdminClient:
    return AdminClient(confluent_conf(bootstrap, creds))


def live(cluster: ProcessCluster, creds: Creds) -> tuple[set[int], int]:
    """(live brokers, controller) as DescribeCluster tells them."""
    admin = admin_of(cluster.bootstrap, creds)  # kept until its answer is in (a destroyed client fails it)
    described = admin.describe_cluster().result(10)
    controller = described.controller.id if described.controller is not None else -1
    return {n.id for n in described.nodes}, controller


def wait_live(cluster: ProcessCluster, creds: Creds, nodes: set[int], timeout: float = 40.0) -> None:
    wait_for(lambda: live(cluster, creds)[0] == nodes, timeout, interval=0.2, what="brokers %s live" % sorted(nodes))


def check_logs(cluster: ProcessCluster) -> None:
    """No node failed to authenticate to another, and none logged a traceback."""
    for node, process in cluster.nodes.items():
        output = process.output()
        assert "failed authentication" not in output and "TLS handshake failed" not in output, \
            "node %d:\n%s" % (node, output[-5000:])
        assert "Traceback" not in output, "node %d:\n%s" % (node, output[-5000:])


def create_spread_topic(cluster: ProcessCluster, creds: Creds, topic: str) -> dict[int, int]:
    """A topic of PARTITIONS partitions, once its leaders are the three nodes."""
    admin = admin_of(cluster.bootstrap, creds)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    leaders: dict[int, int] = {}

    def spread() -> bool:
        found = admin.list_topics(topic, timeout=10).topics[topic]
        if found.error is not None:
            return False
        leaders.clear()
        leaders.update({p.id: p.leader for p in found.partitions.values()})
        return len(leaders) == PARTITIONS and set(leaders.values()) == set(cluster.nodes)

    wait_for(spread, 30, interval=0.1, what="leaders of %s on every node" % topic)
    return leaders


def produce(bootstrap: str, creds: Creds, topic: str, per_partition: int) -> dict[int, list[bytes]]:
    """Idempotent acks=all records to every partition; what was acknowledged, by partition."""
    acked: dict[int, list[bytes]] = {}
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.setdefault(msg.partition(), []).append(msg.value())

    producer = Producer(confluent_conf(bootstrap, creds, **{"enable.idempotence": True, "acks": "all",
                                                            "linger.ms": 5}))
    for i in range(per_partition):
        for partition in range(PARTITIONS):
            producer.produce(topic, value=b"%d-%d" % (partition, i), partition=partition, on_delivery=delivered)
    assert producer.flush(30) == 0 and not errors, errors
    return acked


def consume(bootstrap: str, creds: Creds, topic: str, count: int, **extra: Any) -> dict[int, list[bytes]]:
    """Every partition read from its start until `count` records came back (and then its end)."""
    consumer = Consumer(confluent_conf(bootstrap, creds, **{"group.id": "read-" + uuid.uuid4().hex[:6],
                                                            "enable.auto.commit": False,
                                                            "enable.partition.eof": True, **extra}))
    read: dict[int, list[bytes]] = {}
    at_end: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])

        def done() -> bool:
            for msg in consumer.consume(100, 0.2):
                if msg.error() is None:
                    read.setdefault(msg.partition(), []).append(msg.value())
                    at_end.discard(msg.partition())
                elif msg.error().code() == -191:  # _PARTITION_EOF
                    at_end.add(msg.partition())
                else:
                    raise AssertionError(msg.error())
            return sum(map(len, read.values())) >= count and len(at_end) == PARTITIONS

        wait_for(done, 30, interval=0, what="%d records of %s" % (count, topic))
    finally:
        consumer.close()
    return read


def transactions_across_nodes(cluster: ProcessCluster, creds: Creds, topic: str) -> None:
    """A committed, an aborted and a committed transaction over partitions led by every node: the
    transaction coordinator is one node, so markers go to the two others (WriteTxnMarkers) and
    their leaders verify the batches with it (AddPartitionsToTxn)."""
    producer = Producer(confluent_conf(cluster.bootstrap, creds, **{"transactional.id": "tx-" + uuid.uuid4().hex[:6],
                                                                    "transaction.timeout.ms": 30000}))
    producer.init_transactions(30)
    for outcome in ("commit", "abort", "commit"):
        producer.begin_transaction()
        for partition in range(PARTITIONS):
            producer.produce(topic, value=b"%s-%d" % (outcome.encode(), partition), partition=partition)
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    read = consume(cluster.bootstrap, creds, topic, 2 * PARTITIONS, **{"isolation.level": "read_committed"})
    assert read == {p: [b"commit-%d" % p] * 2 for p in range(PARTITIONS)}


def node_client(port: int, protocol: str, settings: dict[str, str], user: str | None = None,
                password: str | None = None) -> NodeClient:
    """A raw client of one node with the security of a broker of the cluster (as `user`)."""
    values = {**settings, "listeners": "%s://127.0.0.1:%d" % (protocol, port)}
    if user is not None:
        values["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = plain_jaas(user, password or "")
    security = inter_broker_security(BrokerConfig(values), protocol)
    return NodeClient(lambda: ("127.0.0.1", port), "raw-" + (user or "tls"), security=security)


def envelope_of_create_topics(topic: str, principal: str) -> M.EnvelopeRequest:
    R = M.CreateTopicsRequest
    inner = frames.encode_request_header(CREATE_TOPICS, 7, 1, "forged") + bytes(M.encode(R(
        topics=[R.CreatableTopic(name=topic, num_partitions=1, replication_factor=1, assignments=[], configs=[])],
        timeout_ms=10000, validate_only=False), 7))
    return M.EnvelopeRequest(request_data=inner, request_principal=encode_principal(principal),
                             client_host_address=host_bytes("127.0.0.1"))


# SASL_PLAINTEXT ----------------------------------------------------------------------------------
ADMIN = Creds("SASL_PLAINTEXT", mechanism="PLAIN", username="admin", password="admin-secret")
ALICE = Creds("SASL_PLAINTEXT", mechanism="PLAIN", username="alice", password="alice-secret")
BOB = Creds("SASL_PLAINTEXT", mechanism="PLAIN", username="bob", password="bob-secret")


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    cluster = start_secured(tmp_path_factory.mktemp("sasl-cluster"), "SASL_PLAINTEXT", SASL, ADMIN)
    try:
        yield cluster
        check_logs(cluster)
    finally:
        cluster.stop()


def roles(cluster: ProcessCluster, creds: Creds) -> tuple[int, int]:
    """(the controller, a node that is not it)."""
    _, controller = live(cluster, creds)
    return controller, next(n for n in sorted(cluster.nodes) if n != controller)


def create_via(cluster: ProcessCluster, node: int, creds: Creds, topic: str) -> int:
    """CreateTopics sent by kafka-python's admin to `node` (clients send it to the controller
    Metadata names: pointed at another node, it goes there); the topic's error code."""
    client = KafkaAdminClient(bootstrap_servers=cluster.node(node).bootstrap, request_timeout_ms=20000,
                              **python_conf(creds))
    try:
        client._controller_id = node
        result = client.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}},
                                      timeout_ms=10000, raise_errors=False)
        return int(result["topics"][0]["error_code"])
    finally:
        client.close()


def test_create_through_another_node_is_authorized_as_the_client(sasl_cluster: ProcessCluster) -> None:
    controller, other = roles(sasl_cluster, ADMIN)
    admin = admin_of(sasl_cluster.bootstrap, ADMIN)
    binding = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:alice", "*",
                         AclOperation.CREATE, AclPermissionType.ALLOW)
    admin.create_acls([binding])[binding].result(10)
    refused, created = "bob-" + uuid.uuid4().hex[:6], "alice-" + uuid.uuid4().hex[:6]
    # bob has no CREATE: the controller refuses the request forwarded with bob's principal
    assert create_via(sasl_cluster, other, BOB, refused) == E.TOPIC_AUTHORIZATION_FAILED
    assert create_via(sasl_cluster, other, ALICE, created) == E.NONE
    topics = admin.list_topics(timeout=10).topics
    assert created in topics and refused not in topics

    # a client cannot forward for someone else: Envelope needs CLUSTER_ACTION (alice has CREATE only)
    forged = "forged-" + uuid.uuid4().hex[:6]
    port = sasl_cluster.node(controller).port

    async def send_envelope() -> Any:
        client = node_client(port, "SASL_PLAINTEXT", SASL, "alice", "alice-secret")
        try:
            return await client.call(ENVELOPE, 0, envelope_of_create_topics(forged, "User:admin"))
        finally:
            client.close()

    assert asyncio.run(send_envelope()).error_code == E.CLUSTER_AUTHORIZATION_FAILED
    assert forged not in admin.list_topics(timeout=10).topics


def test_produce_and_consume_across_nodes(sasl_cluster: ProcessCluster) -> None:
    topic = "data-" + uuid.uuid4().hex[:6]
    create_spread_topic(sasl_cluster, ADMIN, topic)
    acked = produce(sasl_cluster.bootstrap, ADMIN, topic, 30)
    assert {p: len(v) for p, v in acked.items()} == {p: 30 for p in range(PARTITIONS)}
    assert consume(sasl_cluster.bootstrap, ADMIN, topic, 30 * PARTITIONS) == acked


def test_transaction_across_nodes(sasl_cluster: ProcessCluster) -> None:
    topic = "txn-" + uuid.uuid4().hex[:6]
    create_spread_topic(sasl_cluster, ADMIN, topic)
    transactions_across_nodes(sasl_cluster, ADMIN, topic)


@pytest.mark.parametrize("user, password, expected", [
    ("admin", "not-the-password", "failed authentication due to: Authentication failed: Invalid username or password"),
    # authenticated, but User:alice has no CLUSTER_ACTION: BrokerRegistration is refused
    ("alice", "alice-secret", "needs CLUSTER_ACTION on the cluster"),
])
def test_a_broker_without_good_inter_broker_credentials_cannot_register(
        sasl_cluster: ProcessCluster, user: str, password: str, expected: str) -> None:
    cluster = sasl_cluster
    data = cluster.base / ("node4-%s" % user) / "data"
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    intruder = BrokerProcess(data, port, overrides={
        **cluster.overrides, "node.id": "4", "etcd.endpoints": cluster.etcd.client_url,
        "listeners": "SASL_PLAINTEXT://127.0.0.1:%d" % port,
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_jaas(user, password)})
    intruder.start(timeout=40)
    try:
        wait_for(lambda: intruder.output().count(expected) >= 3, 30, interval=0.1,
                 what="the fourth broker's failures to register, again and again")
        assert intruder.proc is not None and intruder.proc.poll() is None  # still running, still trying
        assert password not in intruder.output()
        nodes, _ = live(cluster, ADMIN)
        assert nodes == {1, 2, 3}  # never registered
        topic = "still-" + uuid.uuid4().hex[:6]
        create_spread_topic(cluster, ADMIN, topic)
        acked = produce(cluster.bootstrap, ADMIN, topic, 5)
        assert consume(cluster.bootstrap, ADMIN, topic, 5 * PARTITIONS) == acked
    finally:
        assert intruder.stop() == 0, intruder.output()[-3000:]
    assert live(cluster, ADMIN)[0] == {1, 2, 3}


def test_scram_inter_broker_user_made_with_alter_user_scram_credentials(tmp_path: Path) -> None:
    """Brokers authenticating with SCRAM need their user in the metadata first: the first node,
    the controller, registers without the network; the others fail to authenticate (and say so)
    until an admin creates the user through the controller, then register by themselves."""
    need_etcd()
    scram_jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="b-pw";'
    overrides = {**SASL, "super.users": "User:admin;User:broker", "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
                 "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                 "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": scram_jaas}
    cluster = ProcessCluster(tmp_path, 3, overrides)
    for process in cluster.nodes.values():
        process.overrides["listeners"] = "SASL_PLAINTEXT://127.0.0.1:%d" % process.port
    try:
        cluster.start()
        first, others = cluster.node(1), [cluster.node(2), cluster.node(3)]
        failure = "failed authentication due to: Authentication failed during authentication due to invalid " \
                  "credentials with SASL mechanism SCRAM-SHA-512"
        wait_for(lambda: all(failure in p.output() for p in others), 30, interval=0.1,
                 what="the other nodes refused before their user exists")
        # only the controller is live: an admin bootstrapped there reaches it alone
        admin = admin_of(first.bootstrap, ADMIN)
        assert {n.id for n in admin.describe_cluster().result(10).nodes} == {1}
        upsert = UserScramCredentialUpsertion("broker", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                              b"b-pw")
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(10)
        wait_live(cluster, ADMIN, {1, 2, 3})
        topic = "scram-" + uuid.uuid4().hex[:6]
        create_spread_topic(cluster, ADMIN, topic)
        acked = produce(cluster.bootstrap, ADMIN, topic, 5)
        assert consume(cluster.bootstrap, ADMIN, topic, 5 * PARTITIONS) == acked
        assert all("b-pw" not in p.output() for p in cluster.nodes.values())
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()


# SSL with mutual TLS -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProcessCluster, Creds, dict[str, str]]]:
    pytest.importorskip("cryptography")
    from tests.security.certs import TestCA

    base = tmp_path_factory.mktemp("tls-cluster")
    ca = TestCA(base / "certs")
    broker = ca.issue("broker", server=True, client_too=True, O="Brokers", CN="broker")
    admin = ca.issue("admin", O="Clients", CN="admin")
    settings = {**AUTHORIZER, **SMALL, "super.users": "User:broker;User:admin",
                "listener.security.protocol.map": "INTERNAL:SSL", "inter.broker.listener.name": "INTERNAL",
                "ssl.keystore.type": "PEM", "ssl.keystore.location": str(broker.combined),
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca.path),
                "ssl.client.auth": "required", "ssl.principal.mapping.rules": "RULE:^CN=(.*?),O=.*$/$1/,DEFAULT"}
    creds = Creds("SSL", ca=ca.path, cert=admin.cert, key=admin.key)
    cluster = start_secured(base, "INTERNAL", settings, creds)
    try:
        yield cluster, creds, settings
        check_logs(cluster)
    finally:
        cluster.stop()


def test_tls_cluster(tls_cluster: tuple[ProcessCluster, Creds, dict[str, str]]) -> None:
    cluster, creds, settings = tls_cluster
    controller, other = roles(cluster, creds)
    forwarded = "tls-forwarded-" + uuid.uuid4().hex[:6]
    assert create_via(cluster, other, creds, forwarded) == E.NONE  # in an Envelope, as User:broker
    assert forwarded in admin_of(cluster.bootstrap, creds).list_topics(timeout=10).topics
    topic = "tls-" + uuid.uuid4().hex[:6]
    create_spread_topic(cluster, creds, topic)
    acked = produce(cluster.bootstrap, creds, topic, 20)
    assert consume(cluster.bootstrap, creds, topic, 20 * PARTITIONS) == acked
    txn = "tls-txn-" + uuid.uuid4().hex[:6]
    create_spread_topic(cluster, creds, txn)
    transactions_across_nodes(cluster, creds, txn)
