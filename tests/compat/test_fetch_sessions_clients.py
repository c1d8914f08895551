"""Incremental fetch sessions (KIP-227) with the clients that use them: kafka-python's consumer
opens a session with a full fetch, goes on with incremental ones that carry only what changed,
and reads every record of every partition, also records that arrive while its session is open
and after the broker dropped the session (it starts a new one). librdkafka and aiokafka send
sessionless fetches (epoch -1) and are answered in full, as before."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("kafka")
from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402

from broker.observability.state_metrics import BrokerStateCollector  # noqa: E402
from broker.testing.embedded import EmbeddedBroker  # noqa: E402

TOPIC = "sessions"
PARTITIONS = 4


def produce(broker: EmbeddedBroker, tag: str, per_partition: int) -> list[bytes]:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5)
    values = []
    for p in range(PARTITIONS):
        for i in range(per_partition):
            value = b"%s-%d-%d" % (tag.encode(), p, i)
            producer.send(TOPIC, value, partition=p)
            values.append(value)
    producer.flush(15)
    producer.close()
    return values


def poll_until(consumer: KafkaConsumer, want: int, timeout: float = 30.0) -> list[bytes]:
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            out.extend(r.value for r in records)
    return out


def sessions(broker: EmbeddedBroker) -> list[Any]:
    async def read() -> list[Any]:
        return [(s.epoch, len(s.partitions)) for s in broker.broker.fetch_sessions.sessions.values()]
    result: list[Any] = broker.call(read())
    return result


def metrics(broker: EmbeddedBroker) -> dict[str, float]:
    """The fetch session metrics /metrics would show (read on the broker's loop, as a scrape does)."""
    async def read() -> dict[str, float]:
        return {m.name: m.samples[0].value for m in BrokerStateCollector(broker.broker).collect()
                if m.name.startswith("kafka_fetch_session")}
    result: dict[str, float] = broker.call(read())
    return result


def test_kafka_python_reads_every_partition_through_an_incremental_session(kafka_broker: EmbeddedBroker) -> None:
    kafka_broker.create_topic(TOPIC, partitions=PARTITIONS)
    first = produce(kafka_broker, "first", 5)
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap_servers, group_id=None,
                             enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        assert sorted(poll_until(consumer, len(first))) == sorted(first)
        # records that come while the session is open reach the consumer through it
        second = produce(kafka_broker, "second", 3)
        assert sorted(poll_until(consumer, len(second))) == sorted(second)
        [(epoch, size)] = sessions(kafka_broker)
        assert size == PARTITIONS and epoch >= 2  # opened at 1, then incremental fetches
        # the broker drops the session: the consumer starts a new one and loses nothing
        kafka_broker.call(_drop_sessions(kafka_broker))
        third = produce(kafka_broker, "third", 2)
        assert sorted(poll_until(consumer, len(third))) == sorted(third)
        assert [size for _, size in sessions(kafka_broker)] == [PARTITIONS]
        assert metrics(kafka_broker) == {"kafka_fetch_sessions": 1, "kafka_fetch_session_partitions": PARTITIONS,
                                         "kafka_fetch_session_evictions": 0}
    finally:
        consumer.close()


async def _drop_sessions(broker: EmbeddedBroker) -> None:
    broker.broker.fetch_sessions.sessions.clear()
