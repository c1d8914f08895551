"""Fault injection seen by confluent-kafka, kafka-python and aiokafka: a produce that fails twice
succeeds with retries and fails without them, a loading coordinator, a slow fetch, a dropped
connection, an unanswered request and a failing disk. Each test checks the fault was really hit
(its `injected` count) and that the client got through (or failed) as Kafka's clients do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from aiokafka.errors import MessageSizeTooLargeError  # noqa: E402
from confluent_kafka import Consumer, KafkaError, Producer  # noqa: E402
from kafka import KafkaConsumer, KafkaProducer  # noqa: E402
from kafka.errors import NotLeaderForPartitionError  # noqa: E402

from tests.compat.conftest import CompatBroker, create_topic  # noqa: E402

BROKER_OVERRIDES = {"offsets.topic.num.partitions": "3"}
EXPECTED_BROKER_ERRORS = ("injected disk failure",)


@pytest.fixture(autouse=True)
def no_faults_left(kafka: CompatBroker) -> Iterator[None]:
    kafka.faults.clear()
    yield
    kafka.faults.clear()


def confluent_produce(kafka: CompatBroker, topic: str, value: bytes, **config: Any) -> Any:
    """The delivery error of one message (None: delivered)."""
    reports: list[Any] = []
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 0, "retry.backoff.ms": 50,
                  "retry.backoff.max.ms": 200, **config})
    p.produce(topic, value, partition=0, on_delivery=lambda err, msg: reports.append(err))
    assert p.flush(30) == 0
    return reports[0]


def confluent_consume(kafka: CompatBroker, topic: str, count: int, group: str | None = None, **config: Any) -> list[bytes]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group or "reader-" + topic,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 100, **config})
    c.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(values) < count and time.monotonic() < deadline:
            msg = c.poll(0.1)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
    finally:
        c.close()
    return values


# ---- confluent-kafka (librdkafka) ----------------------------------------------------------------
def test_confluent_produce_fails_twice(kafka: CompatBroker, topic_name: str) -> None:
    create_topic(kafka, topic_name)
    moved = kafka.faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", times=2, topic=topic_name)
    assert confluent_produce(kafka, topic_name, b"after a leader change") is None
    short = kafka.faults.fail("Produce", "NOT_ENOUGH_REPLICAS", times=2, topic=topic_name)
    assert confluent_produce(kafka, topic_name, b"retried") is None
    assert (moved.injected, short.injected) == (2, 2)
    # librdkafka does not count a retry after a leader change (NOT_LEADER_OR_FOLLOWER) against
    # `retries`; NOT_ENOUGH_REPLICAS it does
    kafka.faults.fail("Produce", "NOT_ENOUGH_REPLICAS", times=2, topic=topic_name)
    err = confluent_produce(kafka, topic_name, b"given up", retries=0)
    assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS
    assert confluent_consume(kafka, topic_name, 2) == [b"after a leader change", b"retried"]


def test_confluent_coordinator_loading(kafka: CompatBroker, topic_name: str) -> None:
    create_topic(kafka, topic_name)
    assert confluent_produce(kafka, topic_name, b"v") is None
    find = kafka.faults.fail("FindCoordinator", "COORDINATOR_NOT_AVAILABLE", times=1)
    loading = kafka.faults.fail("OffsetFetch", "COORDINATOR_LOAD_IN_PROGRESS", times=2, group="loading")
    assert confluent_consume(kafka, topic_name, 1, group="loading") == [b"v"]
    assert (find.injected, loading.injected) == (1, 2)


def test_confluent_slow_fetch_dropped_connection_and_disk(kafka: CompatBroker, topic_name: str) -> None:
    create_topic(kafka, topic_name)
    dropped = kafka.faults.disconnect("Produce", topic=topic_name)
    assert confluent_produce(kafka, topic_name, b"one") is None
    unanswered = kafka.faults.drop("Produce", topic=topic_name)
    # librdkafka gives up on a request in flight after socket.timeout.ms, then retries it
    assert confluent_produce(kafka, topic_name, b"two", **{"socket.timeout.ms": 1000}) is None
    disk = kafka.faults.fail_disk(topic_name, 0)
    assert confluent_produce(kafka, topic_name, b"three") is None
    slow = kafka.faults.delay("Fetch", 1000, topic=topic_name)
    assert confluent_consume(kafka, topic_name, 3) == [b"one", b"two", b"three"]
    assert (dropped.injected, unanswered.injected, disk.injected, slow.injected) == (1, 1, 1, 1)


# ---- kafka-python ------------------------------------------------------------------------------
def kafka_python_send(kafka: CompatBroker, topic: str, value: bytes, **config: Any) -> Any:
    p = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, retry_backoff_ms=50, **config)
    try:
        return p.send(topic, value, partition=0).get(timeout=30)
    finally:
        p.close(timeout=10)


def kafka_python_consume(kafka: CompatBroker, topic: str, count: int, group: str) -> list[bytes]:
    c = KafkaConsumer(topic, bootstrap_servers=kafka.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                      enable_auto_commit=False, fetch_max_wait_ms=100, consumer_timeout_ms=30000,
                      retry_backoff_ms=50)
    try:
        return [m.value for _, m in zip(range(count), c)]
    finally:
        c.close()


def test_kafka_python_produce_fails_twice(kafka: CompatBroker, topic_name: str) -> None:
    create_topic(kafka, topic_name)
    fault = kafka.faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", times=2, topic=topic_name)
    assert kafka_python_send(kafka, topic_name, b"retried").offset == 0
    assert fault.injected == 2
    kafka.faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", times=2, topic=topic_name)
    with pytest.raises(NotLeaderForPartitionError):
        kafka_python_send(kafka, topic_name, b"given up", retries=0, enable_idempotence=False)


def test_kafka_python_coordinator_loading_slow_fetch_and_dropped_connection(kafka: CompatBroker,
                                                                           topic_name: str) -> None:
    create_topic(kafka, topic_name)
    dropped = kafka.faults.disconnect("Produce", topic=topic_name)
    assert kafka_python_send(kafka, topic_name, b"one").offset == 0
    unanswered = kafka.faults.drop("Produce", topic=topic_name)
    assert kafka_python_send(kafka, topic_name, b"two", request_timeout_ms=1000).offset == 1
    loading = kafka.faults.fail("OffsetFetch", "COORDINATOR_LOAD_IN_PROGRESS", times=2, group="kp-loading")
    slow = kafka.faults.delay("Fetch", 1000, topic=topic_name)
    assert kafka_python_consume(kafka, topic_name, 2, "kp-loading") == [b"one", b"two"]
    assert (dropped.injected, unanswered.injected, loading.injected, slow.injected) == (1, 1, 2, 1)


# ---- aiokafka ----------------------------------------------------------------------------------
async def aiokafka_send(kafka: CompatBroker, topic: str, value: bytes) -> Any:
    p = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, retry_backoff_ms=50)
    await p.start()
    try:
        return await p.send_and_wait(topic, value, partition=0)
    finally:
        await p.stop()


async def aiokafka_consume(kafka: CompatBroker, topic: str, count: int, group: str) -> list[bytes]:
    c = AIOKafkaConsumer(topic, bootstrap_servers=kafka.bootstrap_servers, group_id=group,
                         auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=100,
                         retry_backoff_ms=50)
    await c.start()
    try:
        return [(await asyncio.wait_for(c.getone(), 30)).value for _ in range(count)]
    finally:
        await c.stop()


async def test_aiokafka_produce_fails_twice(kafka: CompatBroker, topic_name: str) -> None:
    create_topic(kafka, topic_name)
    fault = kafka.faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", times=2, topic=topic_name)
    assert (await aiokafka_send(kafka, topic_name, b"retried")).offset == 0
    assert fault.injected == 2
    # aiokafka retries a retriable error until the request times out: without retries means an
    # error that is not retriable
    kafka.faults.fail("Produce", "MESSAGE_TOO_LARGE", topic=topic_name)
    with pytest.raises(MessageSizeTooLargeError):
        await aiokafka_send(kafka, topic_name, b"given up")


async def test_aiokafka_coordinator_loading_slow_fetch_and_dropped_connection(kafka: CompatBroker,
                                                                             topic_name: str) -> None:
    create_topic(kafka, topic_name)
    dropped = kafka.faults.disconnect("Produce", topic=topic_name)
    assert (await aiokafka_send(kafka, topic_name, b"one")).offset == 0
    # aiokafka reads OffsetFetch's errors per partition only (v2+ carries a loading coordinator's
    # error at the top, as Kafka sends it): its joins see the loading coordinator
    loading = kafka.faults.fail("JoinGroup", "COORDINATOR_LOAD_IN_PROGRESS", times=2, group="aio-loading")
    slow = kafka.faults.delay("Fetch", 1000, topic=topic_name)
    assert await aiokafka_consume(kafka, topic_name, 1, "aio-loading") == [b"one"]
    assert (dropped.injected, loading.injected, slow.injected) == (1, 2, 1)
