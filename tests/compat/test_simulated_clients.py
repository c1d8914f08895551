"""Real clients against a simulated 3-broker cluster (simulated.brokers=3): topics with replication
factor 3 created through each client's admin, and a producer and a consumer group that keep going
while partition leaders and the group's coordinator move and a node goes down and comes back.
Every record produced is consumed (at least once: a group that rebalances may see some again)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient  # noqa: E402
from aiokafka.admin import NewTopic as AioNewTopic  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer  # noqa: E402
from kafka import TopicPartition as KafkaTopicPartition  # noqa: E402
from kafka.admin import NewTopic as KpNewTopic  # noqa: E402

from tests.compat.conftest import CompatBroker  # noqa: E402
from tests.harness import wait_for  # noqa: E402

BROKER_OVERRIDES = {"simulated.brokers": "3", "offsets.topic.num.partitions": "6"}
NODES = {1, 2, 3}
PARTITIONS = 3
PER_STEP = 30
TIMEOUT = 60
# kafka-python and aiokafka take the same names: retry soon, refresh metadata often
PYTHON_CLIENTS: dict[str, Any] = {"retry_backoff_ms": 50, "metadata_max_age_ms": 1000}
PYTHON_GROUPS: dict[str, Any] = {**PYTHON_CLIENTS, "auto_offset_reset": "earliest", "auto_commit_interval_ms": 200,
                                 "fetch_max_wait_ms": 100}


@pytest.fixture(autouse=True)
def every_node_up(kafka: CompatBroker) -> Iterator[None]:
    yield
    for node in NODES:
        kafka.faults.node_up(node)


def leaders(kafka: CompatBroker, topic: str) -> dict[int, int]:
    md = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(topic, timeout=10)
    return {p.id: p.leader for p in md.topics[topic].partitions.values()}


def disruptions(kafka: CompatBroker, topic: str, group: str) -> list[Callable[[], Any]]:
    """What happens between the batches: leaders move, the coordinator moves, a node goes down
    (the leader of partition 1) and comes back."""
    victim: list[int] = []

    def node_down() -> None:
        victim.append(leaders(kafka, topic)[1])
        kafka.faults.node_down(victim[0])

    return [
        lambda: [kafka.faults.move_leader(topic, p) for p in range(PARTITIONS)],
        lambda: kafka.faults.move_coordinator(group),
        node_down,
        lambda: kafka.faults.node_up(victim[0]),
    ]


def values(step: int) -> list[bytes]:
    return [b"%d-%d" % (step, i) for i in range(PER_STEP)]


def test_admin_clients_create_replicated_topics(kafka: CompatBroker) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.create_topics([NewTopic("rf3-confluent", 3, 3)]).values():
        future.result(20)
    too_wide = admin.create_topics([NewTopic("rf4", 1, 4)])["rf4"]
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        too_wide.result(20)
    assert raised.value.args[0].code() == confluent_kafka.KafkaError.INVALID_REPLICATION_FACTOR
    kp = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    kp.create_topics([KpNewTopic("rf3-kafka-python", 2, 3)])
    kp.close()

    async def aio() -> None:
        client = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        await client.start()
        try:
            await client.create_topics([AioNewTopic("rf3-aiokafka", 2, 3)])
        finally:
            await client.close()

    asyncio.run(aio())
    md = admin.list_topics(timeout=10)
    assert set(md.brokers) == NODES
    for name in ("rf3-confluent", "rf3-kafka-python", "rf3-aiokafka"):
        partitions = md.topics[name].partitions.values()
        assert all(sorted(p.replicas) == sorted(NODES) and sorted(p.isrs) == sorted(NODES) for p in partitions)
    assert {p.leader for p in md.topics["rf3-confluent"].partitions.values()} == NODES


def test_kafka_python_reassigns_a_partition_at_once(kafka: CompatBroker, topic_name: str) -> None:
    """Nothing is replicated in a simulated cluster: a reassignment completes in its answer, and the
    new replicas (the first leading, the old leader gone) serve the records produced before."""
    kp = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        kp.create_topics([KpNewTopic(topic_name, 1, 2)])
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "acks": "all"})
        producer.produce(topic_name, b"before the move")
        assert producer.flush(TIMEOUT) == 0
        md = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(topic_name, timeout=10)
        [old] = md.topics[topic_name].partitions.values()
        spare = next(n for n in NODES if n not in old.replicas)
        target = [spare, next(r for r in old.replicas if r != old.leader)]
        tp = KafkaTopicPartition(topic_name, 0)
        assert kp.alter_partition_reassignments({tp: target}) == {tp: None}
        assert kp.list_partition_reassignments() == {}
    finally:
        kp.close()

    def moved() -> bool:
        md = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(topic_name, timeout=10)
        [now] = md.topics[topic_name].partitions.values()
        return now.replicas == target and now.leader == spare

    wait_for(moved, TIMEOUT, what="the new replicas in the metadata")
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": topic_name,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic_name])
    try:
        got = wait_for(lambda: consumer.poll(0.5), TIMEOUT, what="the record produced before the move")
        assert got.error() is None and got.value() == b"before the move"
    finally:
        consumer.close()


def test_confluent_through_moves_and_a_node_down(kafka: CompatBroker, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic_name, PARTITIONS, 3)])[topic_name].result(20)
    group = "confluent-" + topic_name
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True, "linger.ms": 5})
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group,
                         "auto.offset.reset": "earliest", "auto.commit.interval.ms": 200,
                         "topic.metadata.refresh.interval.ms": 1000})
    consumer.subscribe([topic_name])
    seen: set[bytes] = set()
    failed: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)

    try:
        steps = [lambda: None, *disruptions(kafka, topic_name, group)]
        for step, disrupt in enumerate(steps):
            disrupt()
            for i, value in enumerate(values(step)):
                producer.produce(topic_name, value, partition=i % PARTITIONS, on_delivery=delivered)
            assert producer.flush(TIMEOUT) == 0 and not failed, failed
            wanted = {v for s in range(step + 1) for v in values(s)}
            deadline = time.monotonic() + TIMEOUT
            while not wanted <= seen:
                assert time.monotonic() < deadline, "step %d: missing %d" % (step, len(wanted - seen))
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    seen.add(msg.value())
    finally:
        consumer.close()


def test_kafka_python_through_moves_and_a_node_down(kafka: CompatBroker, topic_name: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    admin.create_topics([KpNewTopic(topic_name, PARTITIONS, 3)])
    admin.close()
    group = "kafka-python-" + topic_name
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", **PYTHON_CLIENTS)
    consumer = KafkaConsumer(topic_name, bootstrap_servers=kafka.bootstrap_servers, group_id=group, **PYTHON_GROUPS)
    seen: set[bytes] = set()
    try:
        steps = [lambda: None, *disruptions(kafka, topic_name, group)]
        for step, disrupt in enumerate(steps):
            disrupt()
            futures = [producer.send(topic_name, value, partition=i % PARTITIONS)
                       for i, value in enumerate(values(step))]
            for future in futures:
                future.get(timeout=TIMEOUT)
            wanted = {v for s in range(step + 1) for v in values(s)}
            deadline = time.monotonic() + TIMEOUT
            while not wanted <= seen:
                assert time.monotonic() < deadline, "step %d: missing %d" % (step, len(wanted - seen))
                for records in consumer.poll(timeout_ms=200).values():
                    seen.update(r.value for r in records)
    finally:
        consumer.close()
        producer.close(timeout=10)


async def test_aiokafka_through_moves_and_a_node_down(kafka: CompatBroker, topic_name: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([AioNewTopic(topic_name, PARTITIONS, 3)])
    finally:
        await admin.close()
    group = "aiokafka-" + topic_name
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", **PYTHON_CLIENTS)
    consumer = AIOKafkaConsumer(topic_name, bootstrap_servers=kafka.bootstrap_servers, group_id=group,
                                **PYTHON_GROUPS)
    await producer.start()
    await consumer.start()
    seen: set[bytes] = set()
    try:
        steps = [lambda: None, *disruptions(kafka, topic_name, group)]
        for step, disrupt in enumerate(steps):
            await asyncio.to_thread(disrupt)  # the broker's thread does it; this loop keeps serving the clients
            sent = [await producer.send(topic_name, value, partition=i % PARTITIONS)
                    for i, value in enumerate(values(step))]
            await asyncio.wait_for(asyncio.gather(*sent), TIMEOUT)
            wanted = {v for s in range(step + 1) for v in values(s)}
            deadline = time.monotonic() + TIMEOUT
            while not wanted <= seen:
                assert time.monotonic() < deadline, "step %d: missing %d" % (step, len(wanted - seen))
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    seen.update(r.value for r in records)
            # aiokafka does not find its coordinator again if the one it last knew goes down before
            # it learnt of a move (it keeps asking that node): a commit makes it learn now
            await asyncio.wait_for(consumer.commit(), TIMEOUT)
    finally:
        await stop_aiokafka(consumer)
        await producer.stop()


async def stop_aiokafka(consumer: AIOKafkaConsumer) -> None:
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        # aiokafka 0.14 lets the cancellation of a fetch waiting out its retry backoff (after a
        # node went away) escape from stop(); the consumer is stopped all the same
