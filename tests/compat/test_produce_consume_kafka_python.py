"""kafka-python: KafkaProducer (idempotent by default) and KafkaConsumer with assign().

kafka-python compresses snappy, lz4 and zstd only with the python-snappy, lz4 and zstandard
packages, which are not test dependencies; those codecs are skipped when missing.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("kafka")
from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402
from kafka import codec as kafka_codec  # noqa: E402
from kafka.errors import MessageSizeTooLargeError  # noqa: E402

from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess  # noqa: E402

CODECS = {
    None: lambda: True,
    "gzip": kafka_codec.has_gzip,
    "snappy": kafka_codec.has_snappy,
    "lz4": kafka_codec.has_lz4,
    "zstd": kafka_codec.has_zstd,
}


def producer(broker: BrokerProcess, **config: Any) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=broker.bootstrap, **{"linger_ms": 5, "request_timeout_ms": 15000, **config})


def consume_all(broker: BrokerProcess, topic: str, partitions: int, expected: int, timeout: float = 30) -> list[Any]:
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, group_id=None,
                      request_timeout_ms=15000, fetch_max_wait_ms=200)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=500).values():
                out.extend(records)
        return out
    finally:
        c.close()


def stored_producer_ids(broker: BrokerProcess, topic: str) -> set[int]:
    from protocol.records import iter_batches
    from tests.harness import RawClient
    from tests.integration.test_server_support import FETCH, fetch_request

    c = RawClient(broker.port)
    try:
        response = c.call(FETCH, 12, fetch_request([(topic, 0, 0)]))
    finally:
        c.close()
    return {h.producer_id for _, h in iter_batches(bytes(response.responses[0].partitions[0].records))}


def test_default_producer_is_idempotent(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 3)
    p = producer(kafka)
    try:
        assert p.config["enable_idempotence"]
        futures = []
        for i in range(300):
            headers = [("h", b"%d" % i), ("empty", b"")] if i % 2 else []
            value = None if i % 7 == 0 else b"v%d" % i
            futures.append(p.send(topic_name, key=b"k%d" % i, value=value, headers=headers, partition=i % 3))
        p.flush(30)
        metas = [f.get(timeout=30) for f in futures]
    finally:
        p.close(10)
    for part in range(3):
        assert sorted(m.offset for m in metas if m.partition == part) == list(range(100))
    assert stored_producer_ids(kafka, topic_name) != {-1}  # the batches carry a producer id
    got = consume_all(kafka, topic_name, 3, 300)
    assert len(got) == 300
    for r in got:
        i = int(r.key[1:])
        assert r.partition == i % 3
        assert r.value == (None if i % 7 == 0 else b"v%d" % i)
        assert r.headers == ([("h", b"%d" % i), ("empty", b"")] if i % 2 else [])


@pytest.mark.parametrize("codec", list(CODECS))
def test_compression(kafka: BrokerProcess, topic_name: str, codec: str | None) -> None:
    if not CODECS[codec]():
        pytest.skip("kafka-python needs an extra package for %s" % codec)
    create_topic(kafka, topic_name, 2)
    p = producer(kafka, compression_type=codec, linger_ms=20)
    try:
        values = [b"payload %d " % i * 30 for i in range(400)]
        futures = [p.send(topic_name, value=v, partition=i % 2) for i, v in enumerate(values)]
        p.flush(30)
        for f in futures:
            f.get(timeout=30)
    finally:
        p.close(10)
    got = consume_all(kafka, topic_name, 2, len(values))
    assert sorted(r.value for r in got) == sorted(values)


def test_message_too_large(kafka: BrokerProcess, topic_name: str) -> None:
    limit = 100_000
    create_topic(kafka, topic_name, 1, {"max.message.bytes": str(limit)})
    p = producer(kafka, linger_ms=0, retries=0)
    try:
        fits = b"f" * (limit - 200)
        p.send(topic_name, value=fits).get(timeout=30)
        with pytest.raises(MessageSizeTooLargeError):
            p.send(topic_name, value=b"o" * (limit + 1)).get(timeout=30)
    finally:
        p.close(10)
    assert [r.value for r in consume_all(kafka, topic_name, 1, 1)] == [fits]


def test_many_partitions(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 64)
    p = producer(kafka)
    try:
        futures = [p.send(topic_name, value=b"%d" % i, partition=i % 64) for i in range(64 * 3)]
        p.flush(30)
        for f in futures:
            f.get(timeout=30)
    finally:
        p.close(10)
    got = consume_all(kafka, topic_name, 64, 64 * 3)
    assert sorted((r.partition, int(r.value)) for r in got) == sorted((i % 64, i) for i in range(64 * 3))


def test_offsets_lookups(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    p = producer(kafka)
    try:
        for i in range(5):
            p.send(topic_name, value=b"%d" % i, timestamp_ms=1_000_000 + i * 1000)
        p.flush(30)
    finally:
        p.close(10)
    c = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None, request_timeout_ms=15000)
    try:
        tp = TopicPartition(topic_name, 0)
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 5}
        found = c.offsets_for_times({tp: 1_002_500})[tp]
        assert (found.offset, found.timestamp) == (3, 1_003_000)
        assert c.partitions_for_topic(topic_name) == {0}
    finally:
        c.close()
