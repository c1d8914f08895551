"""Client quotas with real clients: producer_byte_rate slows confluent-kafka's and kafka-python's
producers to their rate, consumer_byte_rate slows a consumer, and the clients see the throttle
time the broker answers with. Quotas are set with AlterClientQuotas frames (none of the Python
clients has the admin call); a two-second quota window keeps the test short."""

from __future__ import annotations

import json
import time
from typing import Any

from protocol import messages as M
from tests.compat.conftest import create_topic
from tests.harness import BrokerProcess, RawClient

BROKER_OVERRIDES = {"quota.window.num": "2", "quota.window.size.seconds": "1"}
RATE = 200_000  # bytes per second
TOTAL = 1_200_000  # six seconds' worth: at least five beyond the first window's allowance
A = M.AlterClientQuotasRequest


def set_quota(kafka: BrokerProcess, client_id: str, key: str, value: float) -> None:
    c = RawClient(kafka.port, "quota-admin")
    try:
        response = c.call(49, 1, A(validate_only=False, entries=[A.EntryData(
            entity=[A.EntityData(entity_type="client-id", entity_name=client_id)],
            ops=[A.OpData(key=key, value=value, remove=False)])]))
    finally:
        c.close()
    assert response.entries[0].error_code == 0, response.entries[0].error_message


def test_confluent_producer_is_slowed_to_its_rate(kafka: BrokerProcess, topic_name: str) -> None:
    from confluent_kafka import Producer

    create_topic(kafka, topic_name)
    set_quota(kafka, "slow-producer", "producer_byte_rate", RATE)
    throttles: list[int] = []

    def stats(text: str) -> None:
        for b in json.loads(text)["brokers"].values():
            throttles.append(b["throttle"]["max"])

    p = Producer({"bootstrap.servers": kafka.bootstrap, "client.id": "slow-producer", "linger.ms": 5,
                  "statistics.interval.ms": 200, "stats_cb": stats})
    start = time.monotonic()
    for _ in range(TOTAL // 10_000):
        p.produce(topic_name, b"x" * 10_000)
        p.poll(0)
    assert p.flush(60) == 0
    elapsed = time.monotonic() - start
    p.poll(0.5)  # a last statistics report
    assert elapsed >= (TOTAL / RATE - 2) * 0.8, elapsed  # held near its rate (one window's allowance aside)
    assert max(throttles, default=0) > 0  # librdkafka saw the broker's throttle_time_ms


def test_kafka_python_producer_sees_the_throttle(kafka: BrokerProcess, topic_name: str) -> None:
    from kafka import KafkaProducer

    create_topic(kafka, topic_name)
    set_quota(kafka, "slow-kp", "producer_byte_rate", RATE)
    p = KafkaProducer(bootstrap_servers=kafka.bootstrap, client_id="slow-kp", linger_ms=5)
    try:
        start = time.monotonic()
        futures = [p.send(topic_name, b"y" * 10_000) for _ in range(TOTAL // 10_000)]
        for f in futures:
            f.get(timeout=60)
        elapsed = time.monotonic() - start
        metrics: Any = p.metrics()
        throttle = max(v for group in metrics.values() for k, v in group.items() if k == "throttle-time-max")
        assert throttle > 0  # kafka-python saw the broker's throttle_time_ms
        assert elapsed >= (TOTAL / RATE - 2) * 0.8, elapsed
    finally:
        p.close()


def test_consumer_is_slowed_to_its_rate(kafka: BrokerProcess, topic_name: str) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    create_topic(kafka, topic_name)
    # batches smaller than what the quota allows in a window (a larger batch could never be fetched:
    # as in Kafka, a fetch beyond the window's allowance is throttled and answered empty)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.size": 50_000})
    for _ in range(TOTAL // 10_000):
        p.produce(topic_name, b"z" * 10_000)
    assert p.flush(60) == 0
    set_quota(kafka, "slow-consumer", "consumer_byte_rate", RATE)
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "client.id": "slow-consumer", "group.id": "slow",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic_name, 0, 0)])
        received = 0
        start = time.monotonic()
        deadline = start + 60
        while received < TOTAL and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                received += len(msg.value())
        elapsed = time.monotonic() - start
    finally:
        c.close()
    assert received == TOTAL
    assert elapsed >= (TOTAL / RATE - 2) * 0.8, elapsed
