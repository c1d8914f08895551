"""The transactions benchmark's steps with the pure-Python clients (bench/transactions.py --client).

Each client gets the three steps that transactions.py runs with confluent-kafka, with the same
shape: an idempotent producer and a transactional one (transactions of PER_TXN records, a flush()
then a timed commit), acks=all, the client's own linger (0) and batch size (16 KB) unless
--batch-size is given; and an assign() consumer reading the topic from its start with an isolation level. A warm-up
record first, so that connections, metadata and the producer id are not timed; every phase is
bounded by `limit_s`. (A linger would cost aiokafka one linger a transaction here: its flush()
waits for a lingering batch, where commit_transaction() closes it; a 10 ms linger gave 0.63.)

- kafka-python: KafkaProducer(enable_idempotence / transactional_id), KafkaConsumer.
- aiokafka: AIOKafkaProducer(enable_idempotence / transactional_id) with
  `async with producer.transaction()`, AIOKafkaConsumer; each step in its own asyncio.run().
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

VALUE = b"v" * 1024
PER_TXN = 1000


class ClientError(RuntimeError):
    """A step did not complete (undelivered records, too few read, over its time bound)."""


def _batch_config(batch_size: int | None, key: str) -> dict[str, Any]:
    """The client's default batch size unless one is given; requests big enough to carry it."""
    if batch_size is None:
        return {}
    return {key: batch_size, "max_request_size": max(1 << 20, batch_size + (64 << 10))}


def _check(futures: list[Any], failed: Any) -> None:
    bad = [f for f in futures if failed(f)]
    if bad:
        raise ClientError("%d of %d records not delivered" % (len(bad), len(futures)))


# ------------------------------------------------------------------------------- kafka-python


def _kp_producer(bootstrap: str, batch_size: int | None, **extra: Any) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_block_ms=60000, **_batch_config(batch_size, "batch_size"),
                         **extra)


def kp_produce_idempotent(bootstrap: str, topic: str, records: int, batch_size: int | None,
                          limit_s: float) -> float:
    p = _kp_producer(bootstrap, batch_size, enable_idempotence=True)
    try:
        p.send(topic, b"warm-up", partition=0).get(30)
        start = time.perf_counter()
        futures = [p.send(topic, VALUE, partition=0) for _ in range(records)]
        p.flush(limit_s)
        elapsed = time.perf_counter() - start
        _check(futures, lambda f: not f.succeeded())
        return records / elapsed
    finally:
        p.close(5)


def kp_produce_transactional(bootstrap: str, topic: str, records: int, tid: str, batch_size: int | None,
                             limit_s: float) -> tuple[float, list[float]]:
    p = _kp_producer(bootstrap, batch_size, transactional_id=tid, enable_idempotence=True)
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"warm-up", partition=0).get(30)
        p.commit_transaction()
        commits: list[float] = []
        start = time.perf_counter()
        sent = 0
        while sent < records:
            n = min(PER_TXN, records - sent)
            p.begin_transaction()
            futures = [p.send(topic, VALUE, partition=0) for _ in range(n)]
            p.flush(limit_s)
            _check(futures, lambda f: not f.succeeded())
            t0 = time.perf_counter()
            p.commit_transaction()
            commits.append((time.perf_counter() - t0) * 1000)
            sent += n
            if time.perf_counter() - start > limit_s:
                raise ClientError("transactional produce took longer than %.0f s" % limit_s)
        return records / (time.perf_counter() - start), commits
    finally:
        p.close(5)


def kp_consume(bootstrap: str, topic: str, isolation: str, expected: int, limit_s: float) -> float:
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      isolation_level=isolation, fetch_max_bytes=50 << 20, max_partition_fetch_bytes=10 << 20,
                      fetch_max_wait_ms=100, max_poll_records=10000)
    try:
        tp = KpTopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        got = 0
        deadline = time.perf_counter() + limit_s
        while not got:  # the first record (the warm-up one) starts the clock
            if time.perf_counter() > deadline:
                raise ClientError("%s: no record read in %.0f s" % (isolation, limit_s))
            got += sum(len(v) for v in c.poll(timeout_ms=1000, max_records=1).values())
        start = time.perf_counter()
        deadline = start + limit_s
        while got < expected and time.perf_counter() < deadline:
            got += sum(len(v) for v in c.poll(timeout_ms=500).values())
        elapsed = time.perf_counter() - start
        if got < expected:
            raise ClientError("%s: %d of %d records read" % (isolation, got, expected))
        return got / elapsed
    finally:
        c.close(autocommit=False)


# ------------------------------------------------------------------------------------ aiokafka


def _aio_producer(bootstrap: str, batch_size: int | None, **extra: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=60000, **_batch_config(batch_size, "max_batch_size"), **extra)


async def _aio_idempotent(bootstrap: str, topic: str, records: int, batch_size: int | None,
                          limit_s: float) -> float:
    p = _aio_producer(bootstrap, batch_size, enable_idempotence=True)
    try:
        await p.start()  # InitProducerId
        await (await p.send(topic, b"warm-up", partition=0))
        start = time.perf_counter()
        futures = [await p.send(topic, VALUE, partition=0) for _ in range(records)]
        await asyncio.wait_for(p.flush(), limit_s)
        elapsed = time.perf_counter() - start
        _check(futures, lambda f: f.exception() is not None)
        return records / elapsed
    finally:
        await p.stop()


async def _aio_transactional(bootstrap: str, topic: str, records: int, tid: str, batch_size: int | None,
                             limit_s: float) -> tuple[float, list[float]]:
    p = _aio_producer(bootstrap, batch_size, transactional_id=tid)
    try:
        await p.start()  # FindCoordinator, InitProducerId
        async with p.transaction():
            await (await p.send(topic, b"warm-up", partition=0))
        commits: list[float] = []
        start = time.perf_counter()
        sent = 0
        while sent < records:
            n = min(PER_TXN, records - sent)
            async with p.transaction():
                futures = [await p.send(topic, VALUE, partition=0) for _ in range(n)]
                await asyncio.wait_for(p.flush(), limit_s)
                _check(futures, lambda f: f.exception() is not None)
                t0 = time.perf_counter()
            commits.append((time.perf_counter() - t0) * 1000)  # the context's exit: EndTxn
            sent += n
            if time.perf_counter() - start > limit_s:
                raise ClientError("transactional produce took longer than %.0f s" % limit_s)
        return records / (time.perf_counter() - start), commits
    finally:
        await p.stop()


async def _aio_consume(bootstrap: str, topic: str, isolation: str, expected: int, limit_s: float) -> float:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         isolation_level=isolation, fetch_max_bytes=50 << 20,
                         max_partition_fetch_bytes=10 << 20, fetch_max_wait_ms=100)
    try:
        await c.start()
        tp = AioTopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        got = 0
        deadline = time.perf_counter() + limit_s
        while not got:
            if time.perf_counter() > deadline:
                raise ClientError("%s: no record read in %.0f s" % (isolation, limit_s))
            got += sum(len(v) for v in (await c.getmany(tp, timeout_ms=1000, max_records=1)).values())
        start = time.perf_counter()
        deadline = start + limit_s
        while got < expected and time.perf_counter() < deadline:
            got += sum(len(v) for v in (await c.getmany(tp, timeout_ms=500, max_records=10000)).values())
        elapsed = time.perf_counter() - start
        if got < expected:
            raise ClientError("%s: %d of %d records read" % (isolation, got, expected))
        return got / elapsed
    finally:
        await c.stop()


def aio_produce_idempotent(bootstrap: str, topic: str, records: int, batch_size: int | None,
                           limit_s: float) -> float:
    return asyncio.run(_aio_idempotent(bootstrap, topic, records, batch_size, limit_s))


def aio_produce_transactional(bootstrap: str, topic: str, records: int, tid: str, batch_size: int | None,
                              limit_s: float) -> tuple[float, list[float]]:
    return asyncio.run(_aio_transactional(bootstrap, topic, records, tid, batch_size, limit_s))


def aio_consume(bootstrap: str, topic: str, isolation: str, expected: int, limit_s: float) -> float:
    return asyncio.run(_aio_consume(bootstrap, topic, isolation, expected, limit_s))
