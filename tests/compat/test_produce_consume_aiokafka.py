"""aiokafka: AIOKafkaProducer (plain and idempotent) and AIOKafkaConsumer with assign()."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("aiokafka")
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka.errors import MessageSizeTooLargeError  # noqa: E402

from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess  # noqa: E402

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


async def consume_all(broker: BrokerProcess, topic: str, partitions: int, expected: int,
                      timeout: float = 30) -> list[Any]:
    c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, group_id=None,
                         auto_offset_reset="earliest", fetch_max_wait_ms=200)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        out: list[Any] = []

        async def read() -> None:
            while len(out) < expected:
                for records in (await c.getmany(timeout_ms=500)).values():
                    out.extend(records)

        await asyncio.wait_for(read(), timeout)
        return out
    finally:
        await c.stop()


async def test_produce_consume_keys_headers_nulls(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 2)
    p = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5)
    await p.start()
    try:
        futures = []
        for i in range(200):
            value = None if i % 9 == 0 else b"v%d" % i
            headers = [("h", b"%d" % i)] if i % 2 else None
            futures.append(await p.send(topic_name, value=value, key=b"k%d" % i, partition=i % 2, headers=headers))
        metas = await asyncio.gather(*futures)
    finally:
        await p.stop()
    for part in range(2):
        assert sorted(m.offset for m in metas if m.partition == part) == list(range(100))
    got = await consume_all(kafka, topic_name, 2, 200)
    assert len(got) == 200
    for r in got:
        i = int(r.key[1:])
        assert r.value == (None if i % 9 == 0 else b"v%d" % i)
        assert list(r.headers) == ([("h", b"%d" % i)] if i % 2 else [])


@pytest.mark.parametrize("codec", CODECS)
async def test_compression(kafka: BrokerProcess, topic_name: str, codec: str | None) -> None:
    create_topic(kafka, topic_name, 1)
    p = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, compression_type=codec, linger_ms=20)
    await p.start()
    try:
        values = [b"aiokafka %d " % i * 25 for i in range(300)]
        batch_futures = [await p.send(topic_name, value=v) for v in values]
        await asyncio.gather(*batch_futures)
    finally:
        await p.stop()
    got = await consume_all(kafka, topic_name, 1, len(values))
    assert [r.value for r in got] == values


async def test_idempotent_producer(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 3)
    p = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=True, linger_ms=5)
    await p.start()
    try:
        futures = [await p.send(topic_name, value=b"%d" % i, partition=i % 3) for i in range(600)]
        metas = await asyncio.gather(*futures)
    finally:
        await p.stop()
    for part in range(3):
        assert sorted(m.offset for m in metas if m.partition == part) == list(range(200))
    got = await consume_all(kafka, topic_name, 3, 600)
    assert sorted(int(r.value) for r in got) == list(range(600))


async def test_message_too_large(kafka: BrokerProcess, topic_name: str) -> None:
    limit = 100_000
    create_topic(kafka, topic_name, 1, {"max.message.bytes": str(limit)})
    p = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=0)
    await p.start()
    try:
        fits = b"f" * (limit - 200)
        await (await p.send(topic_name, value=fits))
        with pytest.raises(MessageSizeTooLargeError):
            await (await p.send(topic_name, value=b"o" * (limit + 1)))
    finally:
        await p.stop()
    assert [r.value for r in await consume_all(kafka, topic_name, 1, 1)] == [fits]


async def test_many_partitions(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 64)
    p = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5)
    await p.start()
    try:
        futures = [await p.send(topic_name, value=b"%d" % i, partition=i % 64) for i in range(64 * 3)]
        await asyncio.gather(*futures)
    finally:
        await p.stop()
    got = await consume_all(kafka, topic_name, 64, 64 * 3)
    assert sorted((r.partition, int(r.value)) for r in got) == sorted((i % 64, i) for i in range(64 * 3))
