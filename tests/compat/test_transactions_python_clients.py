"""kafka-python and aiokafka transactional producers, read_committed consumers of both."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("kafka")
pytest.importorskip("aiokafka")
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from aiokafka import TopicPartition as AioTopicPartition  # noqa: E402
from aiokafka.errors import ProducerFenced  # noqa: E402
from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402
from kafka.errors import KafkaError as KafkaPythonError  # noqa: E402

from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess  # noqa: E402


# ----- kafka-python ----------------------------------------------------------------------------
def kp_read(kafka: BrokerProcess, topic: str, partitions: int, isolation: str, timeout: float = 20) -> list[bytes]:
    """Every value below the end offsets (the LSO under read_committed)."""
    c = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False,
                      isolation_level=isolation, fetch_max_wait_ms=100, request_timeout_ms=15000)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=200).values():
                values.extend(r.value for r in records)
        assert all(c.position(tp) >= ends[tp] for tp in tps), "did not reach the end offsets"
        return sorted(values)
    finally:
        c.close()


def kp_producer(kafka: BrokerProcess, tid: str) -> KafkaProducer:
    p = KafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=tid, linger_ms=5, request_timeout_ms=15000)
    p.init_transactions()
    return p


def test_kafka_python_commit_and_abort(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 2)
    p = kp_producer(kafka, "kp-" + topic_name)
    try:
        p.begin_transaction()
        for i in range(20):
            p.send(topic_name, value=b"c%02d" % i, partition=i % 2)
        p.commit_transaction()
        p.begin_transaction()
        for i in range(6):
            p.send(topic_name, value=b"a%02d" % i, partition=i % 2)
        p.flush()
        p.abort_transaction()
        p.begin_transaction()
        p.send(topic_name, value=b"last", partition=1)
        p.commit_transaction()
    finally:
        p.close()
    committed = sorted([b"c%02d" % i for i in range(20)] + [b"last"])
    assert kp_read(kafka, topic_name, 2, "read_committed") == committed
    assert kp_read(kafka, topic_name, 2, "read_uncommitted") == sorted(committed + [b"a%02d" % i for i in range(6)])


def test_kafka_python_zombie_is_fenced(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    zombie = kp_producer(kafka, "kp-" + topic_name)
    zombie.begin_transaction()
    zombie.send(topic_name, value=b"zombie")
    zombie.flush()
    fresh = kp_producer(kafka, "kp-" + topic_name)
    try:
        fresh.begin_transaction()
        fresh.send(topic_name, value=b"fresh")
        fresh.commit_transaction()
        with pytest.raises(KafkaPythonError):
            zombie.commit_transaction()
    finally:
        fresh.close()
        zombie.close(timeout=5)
    assert kp_read(kafka, topic_name, 1, "read_committed") == [b"fresh"]


# ----- aiokafka --------------------------------------------------------------------------------
async def aio_read(kafka: BrokerProcess, topic: str, partitions: int, isolation: str,
                   timeout: float = 20) -> list[bytes]:
    c = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False,
                         isolation_level=isolation, fetch_max_wait_ms=100)
    await c.start()
    try:
        tps = [AioTopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        values: list[bytes] = []

        async def behind() -> bool:
            return any([await c.position(tp) < ends[tp] for tp in tps])

        async def read() -> None:
            while await behind():
                for records in (await c.getmany(timeout_ms=200)).values():
                    values.extend(r.value for r in records)

        await asyncio.wait_for(read(), timeout)
        return sorted(values)
    finally:
        await c.stop()


async def aio_producer(kafka: BrokerProcess, tid: str) -> Any:
    p = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=tid, linger_ms=5)
    await p.start()
    return p


async def test_aiokafka_commit_and_abort(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 2)
    p = await aio_producer(kafka, "aio-" + topic_name)
    try:
        async with p.transaction():
            for i in range(20):
                await p.send(topic_name, value=b"c%02d" % i, partition=i % 2)
        await p.begin_transaction()
        for i in range(6):
            await p.send(topic_name, value=b"a%02d" % i, partition=i % 2)
        await p.abort_transaction()
        async with p.transaction():
            await p.send_and_wait(topic_name, value=b"last", partition=0)
    finally:
        await p.stop()
    committed = sorted([b"c%02d" % i for i in range(20)] + [b"last"])
    assert await aio_read(kafka, topic_name, 2, "read_committed") == committed
    assert await aio_read(kafka, topic_name, 2, "read_uncommitted") == sorted(
        committed + [b"a%02d" % i for i in range(6)])


async def test_aiokafka_zombie_is_fenced(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    zombie = await aio_producer(kafka, "aio-" + topic_name)
    fresh = None
    try:
        await zombie.begin_transaction()
        await zombie.send_and_wait(topic_name, value=b"zombie")
        fresh = await aio_producer(kafka, "aio-" + topic_name)
        async with fresh.transaction():
            await fresh.send_and_wait(topic_name, value=b"fresh")
        with pytest.raises(ProducerFenced):
            await zombie.commit_transaction()
    finally:
        await zombie.stop()
        if fresh is not None:
            await fresh.stop()
    assert await aio_read(kafka, topic_name, 1, "read_committed") == [b"fresh"]


# ----- consume-transform-produce -----------------------------------------------------------------
def seed(kafka: BrokerProcess, topic: str, n: int) -> None:
    create_topic(kafka, topic, 1)
    p = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    for i in range(n):
        p.send(topic, value=b"m%02d" % i, partition=0)
    p.flush()
    p.close()


def committed_offset(kafka: BrokerProcess, group: str, topic: str) -> int | None:
    c = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return c.committed(TopicPartition(topic, 0))  # type: ignore[no-any-return]
    finally:
        c.close()


def test_kafka_python_send_offsets_to_transaction(kafka: BrokerProcess, topic_name: str) -> None:
    from kafka.structs import OffsetAndMetadata

    source, sink, group = topic_name + "-in", topic_name + "-out", "kp-ctp"
    seed(kafka, source, 10)
    create_topic(kafka, sink, 1)
    consumer = KafkaConsumer(source, bootstrap_servers=kafka.bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100)
    p = kp_producer(kafka, "kp-" + topic_name)
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 10 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
        assert len(got) == 10
        for commit, (lo, hi) in ((True, (0, 6)), (False, (6, 10))):
            p.begin_transaction()
            for r in got[lo:hi]:
                p.send(sink, value=r.value.upper(), partition=0)
            p.send_offsets_to_transaction({TopicPartition(source, 0): OffsetAndMetadata(hi, "", -1)},
                                          consumer.group_metadata())
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
    finally:
        p.close()
        consumer.close()
    assert committed_offset(kafka, group, source) == 6
    assert kp_read(kafka, sink, 1, "read_committed") == [b"M%02d" % i for i in range(6)]


async def test_aiokafka_send_offsets_to_transaction(kafka: BrokerProcess, topic_name: str) -> None:
    source, sink, group = topic_name + "-in", topic_name + "-out", "aio-ctp"
    seed(kafka, source, 10)
    create_topic(kafka, sink, 1)
    consumer = AIOKafkaConsumer(source, bootstrap_servers=kafka.bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level="read_committed",
                                fetch_max_wait_ms=100)
    await consumer.start()
    p = await aio_producer(kafka, "aio-" + topic_name)
    try:
        got: list[Any] = []

        async def take() -> None:
            while len(got) < 10:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    got.extend(records)

        await asyncio.wait_for(take(), 20)
        tp = AioTopicPartition(source, 0)
        async with p.transaction():
            for r in got[:6]:
                await p.send(sink, value=r.value.upper(), partition=0)
            await p.send_offsets_to_transaction({tp: 6}, group)
        await p.begin_transaction()
        await p.send(sink, value=b"never", partition=0)
        await p.send_offsets_to_transaction({tp: 10}, group)
        await p.abort_transaction()
        assert await consumer.committed(tp) == 6
    finally:
        await p.stop()
        await consumer.stop()
    assert await aio_read(kafka, sink, 1, "read_committed") == [b"M%02d" % i for i in range(6)]
