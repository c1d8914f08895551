"""confluent-kafka (librdkafka) producing and consuming with assign()."""

from __future__ import annotations

import time
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402

from tests.compat.conftest import consume_until, create_topic  # noqa: E402
from tests.harness import BrokerProcess  # noqa: E402

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def producer(kafka: BrokerProcess, **config: Any) -> Producer:
    return Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "socket.timeout.ms": 10000,
                     "message.timeout.ms": 30000, **config})


def produce_all(p: Producer, topic: str, messages: list[dict[str, Any]]) -> list[Any]:
    """Produce and flush; returns the delivery reports (Message objects), failing on errors."""
    reports: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        reports.append((err, msg))

    for m in messages:
        p.produce(topic, on_delivery=on_delivery, **m)
        p.poll(0)
    assert p.flush(30) == 0
    errors = [err for err, _ in reports if err is not None]
    assert not errors, errors[:3]
    return [msg for _, msg in reports]


def consume_all(kafka: BrokerProcess, topic: str, partitions: int, expected: int, timeout: float = 30,
                config: dict[str, Any] | None = None) -> list[Any]:
    """Assign every partition from the beginning and read until `expected` messages arrived."""
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "compat-assign", "enable.auto.commit": False,
                  "enable.partition.eof": False, **(config or {})})
    try:
        c.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)])
        return consume_until(c, expected, timeout)
    finally:
        c.close()


def test_keys_headers_and_null_values(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 3)
    messages: list[dict[str, Any]] = []
    for i in range(300):
        m: dict[str, Any] = {"key": b"k%d" % i, "partition": i % 3}
        if i % 10 == 0:
            m["value"] = None  # a tombstone-like null value
        else:
            m["value"] = b"value-%d" % i
        if i % 3 == 0:
            m["headers"] = [("h1", b"x%d" % i), ("h2", None), ("h1", b"dup")]
        messages.append(m)
    reports = produce_all(producer(kafka), topic_name, messages)
    assert sorted((r.partition(), r.offset()) for r in reports) == sorted(
        (p, o) for p in range(3) for o in range(100))
    got = consume_all(kafka, topic_name, 3, len(messages))
    by_key = {m.key(): m for m in got}
    assert len(got) == len(by_key) == 300
    for i, sent in enumerate(messages):
        msg = by_key[b"k%d" % i]
        assert msg.value() == sent["value"]
        assert msg.partition() == i % 3
        assert (msg.headers() or None) == sent.get("headers")
        assert msg.timestamp()[0] == confluent_kafka.TIMESTAMP_CREATE_TIME


@pytest.mark.parametrize("codec", CODECS)
def test_compression(kafka: BrokerProcess, topic_name: str, codec: str) -> None:
    create_topic(kafka, topic_name, 2)
    messages: list[dict[str, Any]] = [
        {"key": b"%d" % i, "value": b"compressible %d " % i * 20, "partition": i % 2} for i in range(500)
    ]
    produce_all(producer(kafka, **{"compression.type": codec, "linger.ms": 20}), topic_name, messages)
    got = consume_all(kafka, topic_name, 2, len(messages))
    assert sorted(m.value() for m in got) == sorted(m["value"] for m in messages)


def test_idempotent_producer(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 4)
    p = producer(kafka, **{"enable.idempotence": True, "acks": "all", "max.in.flight.requests.per.connection": 5})
    messages: list[dict[str, Any]] = [{"value": b"idem-%d" % i, "partition": i % 4} for i in range(2000)]
    reports = produce_all(p, topic_name, messages)
    # offsets are dense per partition: no duplicates, no gaps
    for part in range(4):
        assert sorted(r.offset() for r in reports if r.partition() == part) == list(range(500))
    got = consume_all(kafka, topic_name, 4, len(messages))
    assert sorted(m.value() for m in got) == sorted(m["value"] for m in messages)


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(kafka: BrokerProcess, topic_name: str, acks: str) -> None:
    create_topic(kafka, topic_name, 1)
    reports = produce_all(producer(kafka, acks=acks), topic_name, [{"value": b"%d" % i} for i in range(100)])
    if acks != "0":
        assert [r.offset() for r in reports] == list(range(100))
    assert [m.value() for m in consume_all(kafka, topic_name, 1, 100)] == [b"%d" % i for i in range(100)]


def test_messages_up_to_max_message_bytes(kafka: BrokerProcess, topic_name: str) -> None:
    limit = 200_000
    create_topic(kafka, topic_name, 1, {"max.message.bytes": str(limit)})
    # the client's own limit is raised so the broker is the one deciding
    p = producer(kafka, **{"message.max.bytes": 2 * limit, "linger.ms": 0, "retries": 0})
    fits = b"f" * (limit - 200)  # batch overhead included
    produce_all(p, topic_name, [{"value": fits}])
    errors: list[Any] = []
    p.produce(topic_name, value=b"o" * (limit + 1), on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0
    assert [e.code() for e in errors] == [KafkaError.MSG_SIZE_TOO_LARGE]
    got = consume_all(kafka, topic_name, 1, 1)
    assert [m.value() for m in got] == [fits]


def test_a_message_near_the_broker_default_limit(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)  # max.message.bytes 1048588, Kafka's default
    p = producer(kafka, **{"message.max.bytes": 2_000_000, "linger.ms": 0})
    value = bytes(range(256)) * 4000  # 1,024,000 bytes
    produce_all(p, topic_name, [{"value": value}])
    assert [m.value() for m in consume_all(kafka, topic_name, 1, 1)] == [value]


def test_many_partitions(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 64)
    messages = [{"value": b"%d" % i, "partition": i % 64} for i in range(64 * 5)]
    produce_all(producer(kafka), topic_name, messages)
    got = consume_all(kafka, topic_name, 64, len(messages))
    assert sorted((m.partition(), int(m.value())) for m in got) == sorted((i % 64, i) for i in range(64 * 5))


def test_default_partitioner_and_read_uncommitted(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 8)
    messages = [{"key": b"key-%d" % (i % 16), "value": b"%d" % i} for i in range(400)]
    produce_all(producer(kafka), topic_name, messages)
    got = consume_all(kafka, topic_name, 8, len(messages), config={"isolation.level": "read_uncommitted"})
    partitions_of_key: dict[bytes, set[int]] = {}
    for m in got:
        partitions_of_key.setdefault(m.key(), set()).add(m.partition())
    assert all(len(ps) == 1 for ps in partitions_of_key.values())  # a key always lands on one partition
    assert len(got) == 400


def test_consumer_waits_for_new_data(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "compat-wait", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 5000})
    try:
        c.assign([TopicPartition(topic_name, 0, confluent_kafka.OFFSET_END)])
        assert c.consume(num_messages=10, timeout=1.0) == []  # caught up
        produce_all(producer(kafka), topic_name, [{"value": b"late"}])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = [m for m in c.consume(num_messages=10, timeout=0.5) if m.error() is None]
        assert [m.value() for m in got] == [b"late"]
    finally:
        c.close()


def test_list_metadata_and_watermarks(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 2)
    produce_all(producer(kafka), topic_name, [{"value": b"x", "partition": 1}] * 3)
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "compat-wm"})
    try:
        md = c.list_topics(topic_name, timeout=10)
        assert sorted(md.topics[topic_name].partitions) == [0, 1]
        assert c.get_watermark_offsets(TopicPartition(topic_name, 1), timeout=10) == (0, 3)
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, 0)
        ts = c.offsets_for_times([TopicPartition(topic_name, 1, 0)], timeout=10)
        assert ts[0].offset == 0
    finally:
        c.close()
