"""What real clients see of a leader whose followers lag: confluent-kafka (librdkafka) and
kafka-python consumers read and list offsets only up to the high watermark, and an acks=all
confluent-kafka producer is acknowledged once the followers have the batch. The followers are
played with raw Fetch frames (tests/integration/test_replication_leader.py)."""

from __future__ import annotations

import threading
import time

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka_python = pytest.importorskip("kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from tests.integration.test_replication_leader import follower_fetch, lead, make_topic  # noqa: E402
from tests.integration.test_server_support import (  # noqa: E402, F401  (fixtures)
    BrokerThread,
    batch,
    broker_thread_fixture,
    client_fixture,
    produce,
)

pytestmark = pytest.mark.timeout(90)


def test_confluent_consumer_reads_up_to_the_high_watermark(broker_thread: BrokerThread, client) -> None:
    make_topic(broker_thread, "hw")
    lead(broker_thread, "hw", [1, 2], [1, 2])
    for value in (b"a", b"b", b"c"):  # a batch each: followers fetch whole batches
        assert produce(client, "hw", 0, batch([value]), acks=1).error_code == 0
    consumer = Consumer({"bootstrap.servers": broker_thread.bootstrap_servers, "group.id": "g-hw",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("hw", 0), timeout=10) == (0, 0)
        follower_fetch(client, "hw", 2, 2)  # the follower has 2 of the 3
        assert consumer.get_watermark_offsets(TopicPartition("hw", 0), timeout=10) == (0, 2)
        consumer.assign([TopicPartition("hw", 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
        assert got == [b"a", b"b"]
        follower_fetch(client, "hw", 2, 3)
        while len(got) < 3 and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
        assert got == [b"a", b"b", b"c"]
    finally:
        consumer.close()


def test_kafka_python_end_offsets_are_the_high_watermark(broker_thread: BrokerThread, client) -> None:
    make_topic(broker_thread, "kp")
    lead(broker_thread, "kp", [1, 2], [1, 2])
    for value in (b"a", b"b"):
        assert produce(client, "kp", 0, batch([value]), acks=1).error_code == 0
    follower_fetch(client, "kp", 2, 1)
    consumer = kafka_python.KafkaConsumer(bootstrap_servers=broker_thread.bootstrap_servers,
                                          request_timeout_ms=10000, consumer_timeout_ms=5000)
    try:
        tp = kafka_python.TopicPartition("kp", 0)
        assert consumer.end_offsets([tp]) == {tp: 1}
        consumer.assign([tp])
        consumer.seek(tp, 0)
        records = consumer.poll(timeout_ms=5000)
        assert [r.value for r in records.get(tp, [])] == [b"a"]
    finally:
        consumer.close()


def test_confluent_acks_all_waits_for_the_followers(broker_thread: BrokerThread, client) -> None:
    make_topic(broker_thread, "aa")
    lead(broker_thread, "aa", [1, 2], [1, 2])
    producer = Producer({"bootstrap.servers": broker_thread.bootstrap_servers, "acks": "all",
                         "enable.idempotence": True, "message.timeout.ms": 30000, "linger.ms": 0})
    delivered = threading.Event()
    reports: list[tuple[object, int]] = []

    def on_delivery(err: object, msg: object) -> None:
        reports.append((err, msg.offset()))  # type: ignore[attr-defined]
        delivered.set()

    producer.produce("aa", b"v", partition=0, on_delivery=on_delivery)
    deadline = time.monotonic() + 20
    # the batch reaches the leader's log, unacknowledged: the follower has not fetched it
    while time.monotonic() < deadline and follower_fetch(client, "aa", 2, 0).high_watermark < 0:
        producer.poll(0.05)
    appended = False
    while time.monotonic() < deadline and not appended:
        producer.poll(0.05)
        appended = len(follower_fetch(client, "aa", 2, 0).records) > 0
    assert appended and not reports
    follower_fetch(client, "aa", 2, 1)
    while time.monotonic() < deadline and not delivered.is_set():
        producer.poll(0.05)
    assert reports == [(None, 0)]
    producer.flush(5)
