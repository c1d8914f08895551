"""A simulated cluster served by two broker processes (broker/testing/process_cluster.py), with
real clients: each process leads its share of the partitions and coordinators and stores only
that data; the follower process learns topics from the controller's metadata log."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402

from protocol import messages as M  # noqa: E402
from protocol.errors import ErrorCode  # noqa: E402
from tests.compat.conftest import consume_until  # noqa: E402
from tests.harness import BrokerProcess, RawClient, free_port, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(120)
CREATE_TOPICS, FIND_COORDINATOR, METADATA = 19, 10, 3


def _two_free_ports() -> int:
    """A port whose next one is free too (bound and released, as free_port checks one)."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    base = _two_free_ports()
    common = {"listeners": "PLAINTEXT://127.0.0.1:%d" % base, "simulated.brokers": "2",
              "cluster.id": "cHJvY2Vzcy1jbHVzdGVyAA", "simulated.controller.log.dir": str(tmp_path / "node0")}
    nodes = [BrokerProcess(tmp_path / ("node%d" % k), port=base + k,
                           overrides={**common, "simulated.process.node": str(k)}) for k in range(2)]
    started: list[BrokerProcess] = []
    try:
        for node in nodes:
            started.append(node.start())
        yield nodes
    finally:
        codes = [node.stop() for node in reversed(started)]
        assert codes == [0] * len(started)
        for node in nodes:
            assert "Traceback" not in node.output(), node.output()[-3000:]


def leaders(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def known() -> dict[int, int] | None:
        found = admin.list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None or len(found.partitions) != partitions:
            return None
        result = {p.id: p.leader for p in found.partitions.values()}
        return result if all(leader >= 0 for leader in result.values()) else None

    return wait_for(known, 20, what="the partitions of %s on %s" % (topic, bootstrap))  # type: ignore[no-any-return]


def test_two_processes_share_partitions_and_groups(cluster: list[BrokerProcess]) -> None:
    controller, follower = cluster
    topic = "spread-" + uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": follower.bootstrap})  # CreateTopics goes to the controller
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    by_controller = leaders(controller.bootstrap, topic, 4)
    assert leaders(follower.bootstrap, topic, 4) == by_controller  # one metadata, seen by both
    assert set(by_controller.values()) == {1, 2}  # both nodes lead partitions
    brokers = admin.list_topics(timeout=10).brokers
    assert {b.id: b.port for b in brokers.values()} == {1: controller.port, 2: follower.port}

    producer = Producer({"bootstrap.servers": controller.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    failed: list[Any] = []
    for i in range(2000):
        producer.produce(topic, key=b"%d" % i, value=b"value-%d" % i,
                         on_delivery=lambda err, msg: failed.append(err) if err is not None else None)
    assert producer.flush(30) == 0 and failed == []

    # each partition's data is stored by its leader's process only
    for partition, leader in by_controller.items():
        sizes = [sum(f.stat().st_size for f in (node.data_dir / ("%s-%d" % (topic, partition))).glob("*.log"))
                 for node in cluster]
        assert (sizes[leader - 1] > 0, sizes[2 - leader]) == (True, 0), (partition, leader, sizes)

    group = "group-" + uuid.uuid4().hex[:8]
    consumers = [Consumer({"bootstrap.servers": follower.bootstrap, "group.id": group, "group.protocol": protocol,
                           "auto.offset.reset": "earliest", "enable.auto.commit": False})
                 for protocol in ("consumer", "consumer")]  # KIP-848 members
    for consumer in consumers:
        consumer.subscribe([topic])
    seen: list[Any] = []
    deadline = time.monotonic() + 60
    while len(seen) < 2000 and time.monotonic() < deadline:
        for consumer in consumers:
            for message in consumer.consume(num_messages=500, timeout=0.2):
                assert message.error() is None, message.error()
                seen.append(message)
    assert sorted(int(m.key()) for m in seen) == list(range(2000))
    for consumer in consumers:
        consumer.commit(asynchronous=False)
    committed = consumers[0].committed([TopicPartition(topic, p) for p in range(4)], timeout=10)
    assert sum(tp.offset for tp in committed) == 2000
    for consumer in consumers:
        consumer.close()

    # a new topic and new partitions reach the follower; its producer ids are its own
    admin.create_partitions([NewPartitions(topic, 6)])[topic].result(30)
    assert len(leaders(follower.bootstrap, topic, 6)) == 6


def test_follower_forwards_metadata_changes_and_restarts(cluster: list[BrokerProcess]) -> None:
    controller, follower = cluster
    request = M.CreateTopicsRequest(topics=[M.CreateTopicsRequest.CreatableTopic(
        name="sent-to-follower", num_partitions=3, replication_factor=1, assignments=[], configs=[])],
        timeout_ms=10000, validate_only=False)
    M_ = M.MetadataRequest
    wanted = [M_.MetadataRequestTopic(name=n, topic_id=uuid.UUID(int=0)) for n in ("sent-to-follower", "auto")]
    client = RawClient(follower.port)
    try:
        # forwarded to the controller, and known here as soon as it is answered
        assert client.call(CREATE_TOPICS, 5, request).topics[0].error_code == ErrorCode.NONE
        first = client.call(METADATA, 12, M_(topics=wanted, allow_auto_topic_creation=True,
                                              include_topic_authorized_operations=False)).topics
        assert [(t.error_code, len(t.partitions)) for t in first] == [
            (ErrorCode.NONE, 3), (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0)]  # auto-created, as Kafka 4.x answers
        second = client.call(METADATA, 12, M_(topics=wanted[1:], allow_auto_topic_creation=True,
                                               include_topic_authorized_operations=False)).topics
        assert (second[0].error_code, len(second[0].partitions)) == (ErrorCode.NONE, 1)
    finally:
        client.close()
    assert len(leaders(controller.bootstrap, "auto", 1)) == 1  # created by the controller

    topic = "kept-" + uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": controller.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    leaders(follower.bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": controller.bootstrap})
    for p in range(2):
        producer.produce(topic, value=b"before-%d" % p, partition=p)
    assert producer.flush(30) == 0
    assert follower.stop() == 0
    follower.start()
    for p in range(2):
        producer.produce(topic, value=b"after-%d" % p, partition=p)
    assert producer.flush(30) == 0
    reader = Consumer({"bootstrap.servers": follower.bootstrap, "group.id": "after-restart"})
    reader.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(2)])
    values = sorted(m.value() for m in consume_until(reader, 4, 30))
    reader.close()
    assert values == [b"after-0", b"after-1", b"before-0", b"before-1"]


def test_transactions_across_processes(cluster: list[BrokerProcess]) -> None:
    """Coordinators and partition leaders in different processes: verification and markers go
    between them (AddPartitionsToTxn v5, WriteTxnMarkers), also to the group coordinators of
    transactional offsets."""
    controller, follower = cluster
    topic = "txn-" + uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": controller.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    assert set(leaders(follower.bootstrap, topic, 2).values()) == {1, 2}
    client = RawClient(controller.port)
    try:
        found = client.call(FIND_COORDINATOR, 4, M.FindCoordinatorRequest(
            key_type=1, coordinator_keys=["txn-%d" % n for n in range(6)])).coordinators
    finally:
        client.close()
    assert {c.node_id for c in found} == {1, 2}
    for n in range(6):  # transactional ids coordinated by either node, each writing to both nodes
        producer = Producer({"bootstrap.servers": follower.bootstrap, "transactional.id": "txn-%d" % n})
        producer.init_transactions(30)
        producer.begin_transaction()
        for p in range(2):
            producer.produce(topic, value=b"%d-%d" % (n, p), partition=p)
        source = Consumer({"bootstrap.servers": follower.bootstrap, "group.id": "eos-%d" % n})
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, 10 + n)], source.consumer_group_metadata(), 30)
        source.close()
        if n % 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    for n in range(6):  # only committed transactions moved their group's offset
        checker = Consumer({"bootstrap.servers": controller.bootstrap, "group.id": "eos-%d" % n})
        committed = checker.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
        checker.close()
        assert committed == (10 + n if n % 2 == 0 else confluent_kafka.OFFSET_INVALID), (n, committed)
    reader = Consumer({"bootstrap.servers": controller.bootstrap, "group.id": "reader",
                       "isolation.level": "read_committed", "enable.auto.commit": False})
    reader.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(2)])
    values = sorted(m.value() for m in consume_until(reader, 6, 30))
    reader.close()
    assert values == [b"%d-%d" % (n, p) for n in (0, 2, 4) for p in range(2)]
