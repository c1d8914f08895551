"""Three broker processes on one etcd, used by confluent-kafka, kafka-python and aiokafka: topics
created through the controller and through a node that is not (forwarded), idempotent acks=all
produce to partitions led by each of the three nodes, and every acknowledged record read back
once, in order, from its partition's leader.

Clients send CreateTopics to the controller that Metadata names. Kafka 4 brokers name a random live
broker there (so admin requests reach non-controllers and are forwarded); these nodes name the
active controller, so the tests point a client at another node themselves: kafka-python's and
aiokafka's admins through their controller id, confluent-kafka (whose admin always asks the
controller) by auto-creating the topic through a producer that knows only a non-controller node.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.admin import NewTopic as KNewTopic

from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import roles, shared_cluster, spread, wait_leaders
from tests.harness import wait_for

PARTITIONS = 6
PER_PARTITION = 40

Acked = dict[int, list[tuple[int, bytes]]]  # partition -> (offset, value) in the order sent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    yield from shared_cluster(tmp_path_factory.mktemp("cluster"))


def values(topic: str, partition: int) -> list[bytes]:
    return [b"%s/%d/%d" % (topic.encode(), partition, i) for i in range(PER_PARTITION)]


def check_acked(topic: str, acked: Acked) -> None:
    """Every record sent was acknowledged, at offsets 0.. in the order sent."""
    assert sorted(acked) == list(range(PARTITIONS))
    for partition, records in acked.items():
        assert [v for _, v in records] == values(topic, partition), partition
        assert [o for o, _ in records] == list(range(PER_PARTITION)), partition


def check_read(acked: Acked, read: dict[int, list[tuple[int, bytes]]]) -> None:
    """What was read is what was acknowledged: each record once, in offset order."""
    for partition in range(PARTITIONS):
        assert read.get(partition, []) == acked[partition], partition


# confluent-kafka ----------------------------------------------------------------------------------
def confluent_produce(bootstrap: str, topic: str) -> Acked:
    acked: Acked = {}
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    for i in range(PER_PARTITION):
        for partition in range(PARTITIONS):
            producer.produce(topic, value=values(topic, partition)[i], partition=partition, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors
    return acked


def confluent_read(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, list[tuple[int, bytes]]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-" + uuid.uuid4().hex[:8],
                         "enable.auto.commit": False, "enable.partition.eof": True})
    read: dict[int, list[tuple[int, bytes]]] = {}
    at_end: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])

        def done() -> bool:
            for msg in consumer.consume(100, 0.2):
                if msg.error() is None:
                    read.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))
                elif msg.error().code() == -191:  # _PARTITION_EOF
                    at_end.add(msg.partition())
                else:
                    raise AssertionError(msg.error())
            return len(at_end) == PARTITIONS and sum(map(len, read.values())) >= PARTITIONS * PER_PARTITION

        wait_for(done, timeout, interval=0, what="every record of %s" % topic)
        for partition in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            assert (low, high) == (0, PER_PARTITION), (partition, low, high)
    finally:
        consumer.close()
    return read


def test_confluent_kafka(cluster: ProcessCluster) -> None:
    active, other = roles(cluster)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    assert admin.describe_cluster().result(10).controller.id == active
    through_controller = "ck-ctrl-" + uuid.uuid4().hex[:6]
    for future in admin.create_topics([NewTopic(through_controller, PARTITIONS, 1)],
                                      operation_timeout=10).values():
        assert future.result(20) is None
    spread(cluster, through_controller, PARTITIONS)

    # auto-created by the Metadata request of a producer that knows only the other node
    auto = "ck-auto-" + uuid.uuid4().hex[:6]
    lone = Producer({"bootstrap.servers": cluster.node(other).bootstrap, "enable.idempotence": True})
    lone.produce(auto, value=b"first")
    assert lone.flush(30) == 0
    auto_leaders = wait_leaders(cluster, auto, lambda ls: len(ls) >= 1 and min(ls.values()) >= 0)
    assert auto_leaders

    acked = confluent_produce(cluster.bootstrap, through_controller)
    check_acked(through_controller, acked)
    check_read(acked, confluent_read(cluster.bootstrap, through_controller))


# kafka-python -----------------------------------------------------------------------------------
def kafka_python_create(bootstrap: str, topic: str, via: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        admin._controller_id = via  # where it sends CreateTopics (see the module docstring)
        admin.create_topics([KNewTopic(topic, PARTITIONS, 1)], timeout_ms=10000)
    finally:
        admin.close()


def kafka_python_produce(bootstrap: str, topic: str) -> Acked:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    try:
        sent = [(partition, i, producer.send(topic, value=values(topic, partition)[i], partition=partition))
                for i in range(PER_PARTITION) for partition in range(PARTITIONS)]
        producer.flush(30)
        acked: Acked = {}
        for partition, i, future in sent:
            md = future.get(timeout=30)
            assert md.partition == partition
            acked.setdefault(partition, []).append((md.offset, values(topic, partition)[i]))
    finally:
        producer.close(10)
    return acked


def kafka_python_read(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, list[tuple[int, bytes]]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    read: dict[int, list[tuple[int, bytes]]] = {}
    try:
        parts = [KTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)

        def done() -> bool:
            for tp, records in consumer.poll(timeout_ms=200).items():
                read.setdefault(tp.partition, []).extend((r.offset, r.value) for r in records)
            return sum(map(len, read.values())) >= PARTITIONS * PER_PARTITION

        wait_for(done, timeout, interval=0, what="every record of %s" % topic)
        ends = consumer.end_offsets(parts)
        assert {tp.partition: o for tp, o in ends.items()} == {p: PER_PARTITION for p in range(PARTITIONS)}
    finally:
        consumer.close()
    return read


def test_kafka_python(cluster: ProcessCluster) -> None:
    active, other = roles(cluster)
    for via in (other, active):
        topic = "kp-%d-%s" % (via, uuid.uuid4().hex[:6])
        kafka_python_create(cluster.node(via).bootstrap, topic, via)
        spread(cluster, topic, PARTITIONS)
        acked = kafka_python_produce(cluster.bootstrap, topic)
        check_acked(topic, acked)
        check_read(acked, kafka_python_read(cluster.bootstrap, topic))


# aiokafka ---------------------------------------------------------------------------------------
async def aiokafka_create(bootstrap: str, topic: str, via: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    await admin.start()
    try:
        async def to_node(request: Any) -> Any:  # where it sends CreateTopics (see the module docstring)
            return await admin._send_request_to_node(via, request)

        admin._send_to_controller = to_node  # type: ignore[method-assign]
        response = await admin.create_topics([AioNewTopic(topic, PARTITIONS, 1)], timeout_ms=10000)
        assert [t[1] for t in response.topic_errors] == [0], response
    finally:
        await admin.close()


async def aiokafka_produce(bootstrap: str, topic: str) -> Acked:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        sent = [(partition, i, await producer.send(topic, value=values(topic, partition)[i], partition=partition))
                for i in range(PER_PARTITION) for partition in range(PARTITIONS)]
        acked: Acked = {}
        for partition, i, future in sent:
            md = await asyncio.wait_for(future, 30)
            assert md.partition == partition
            acked.setdefault(partition, []).append((md.offset, values(topic, partition)[i]))
    finally:
        await producer.stop()
    return acked


async def aiokafka_read(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, list[tuple[int, bytes]]]:
    from aiokafka import TopicPartition as ATopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    read: dict[int, list[tuple[int, bytes]]] = {}
    try:
        parts = [ATopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while sum(map(len, read.values())) < PARTITIONS * PER_PARTITION:
            assert loop.time() < deadline, "not every record of %s within %.0f s" % (topic, timeout)
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                read.setdefault(tp.partition, []).extend((r.offset, r.value) for r in records)
        ends = await consumer.end_offsets(parts)
        assert {tp.partition: o for tp, o in ends.items()} == {p: PER_PARTITION for p in range(PARTITIONS)}
    finally:
        await consumer.stop()
    return read


def test_aiokafka(cluster: ProcessCluster) -> None:
    active, other = roles(cluster)

    async def run() -> None:
        for via in (other, active):
            topic = "aio-%d-%s" % (via, uuid.uuid4().hex[:6])
            await aiokafka_create(cluster.node(via).bootstrap, topic, via)
            await asyncio.to_thread(spread, cluster, topic, PARTITIONS)
            acked = await aiokafka_produce(cluster.bootstrap, topic)
            check_acked(topic, acked)
            check_read(acked, await aiokafka_read(cluster.bootstrap, topic))

    asyncio.run(run())
