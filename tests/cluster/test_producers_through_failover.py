"""Producers with acks=all keep producing through kill -9 of their partition's leader (issue 23):
librdkafka (confluent-kafka), kafka-python and aiokafka, each on a replication factor 3 topic with
min.insync.replicas 2. Every send is acknowledged (the clients retry), every acknowledged value is
read back once the cluster settles, and the longest gap between two acknowledgements stays within
about the broker session timeout plus the client's metadata refresh."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    leaders,
    read_to_end,
    running_cluster,
    wait_leaders,
)

pytestmark = pytest.mark.timeout(150)
TOPIC = "through-failover"
SESSION_S = 3.0  # tests/cluster/harness.py FAST: broker.session.timeout.ms


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path / "cluster", overrides={"min.insync.replicas": "2"}, topic=(TOPIC, 1, 3)) as made:
        yield made


class Acks:
    """What one producer had acknowledged, and when (monotonic)."""

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.times: list[float] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def ok(self, value: bytes) -> None:
        with self.lock:
            self.values.append(value)
            self.times.append(time.monotonic())

    def longest_gap(self) -> float:
        return max((b - a for a, b in zip(self.times, self.times[1:])), default=0.0)


def confluent(bootstrap: str, values: list[bytes], acks: Acks, pace: Callable[[], None]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0, "message.timeout.ms": 60000, "topic.metadata.refresh.interval.ms": 1000})

    def delivered(err: object, msg: object) -> None:
        if err is None:
            acks.ok(msg.value())  # type: ignore[attr-defined]
        else:
            acks.errors.append(str(err))

    for value in values:
        producer.produce(TOPIC, value=value, partition=0, on_delivery=delivered)
        producer.poll(0)
        pace()
    producer.flush(60)


def kafka_python(bootstrap: str, values: list[bytes], acks: Acks, pace: Callable[[], None]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=2**31 - 1, linger_ms=0,
                             max_in_flight_requests_per_connection=1, request_timeout_ms=10000,
                             metadata_max_age_ms=1000, retry_backoff_ms=100, delivery_timeout_ms=60000)
    futures = []
    for value in values:
        future = producer.send(TOPIC, value=value, partition=0)
        future.add_callback(lambda md, v=value: acks.ok(v))
        future.add_errback(lambda exc: acks.errors.append(repr(exc)))
        futures.append(future)
        pace()
    producer.flush(60)
    producer.close(10)


def aiokafka(bootstrap: str, values: list[bytes], acks: Acks, pace: Callable[[], None]) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                    request_timeout_ms=10000, metadata_max_age_ms=1000, retry_backoff_ms=100)
        await producer.start()
        try:
            for value in values:
                for _ in range(600):  # aiokafka gives up on a batch after its request timeout: send again
                    try:
                        await producer.send_and_wait(TOPIC, value=value, partition=0)
                        acks.ok(value)
                        break
                    except Exception as exc:  # noqa: BLE001 - any retriable error of the failover
                        acks.errors.append(repr(exc))
                        await asyncio.sleep(0.1)
                await asyncio.sleep(0.01)
        finally:
            await producer.stop()

    asyncio.run(run())


def producing(cluster: ProcessCluster, client: Callable[..., None], values: list[bytes], acks: Acks
              ) -> tuple[threading.Thread, int]:
    """`client` producing `values` in a thread, once 50 are acknowledged; and the partition's leader."""
    def pace() -> None:
        time.sleep(0.01)

    worker = threading.Thread(target=client, args=(cluster.bootstrap, values, acks, pace), daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while len(acks.values) < 50 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(acks.values) >= 50, acks.errors[:5]
    return worker, leaders(cluster.node(1).port, TOPIC)[0]


@pytest.mark.parametrize("client", [confluent, kafka_python, aiokafka], ids=["confluent", "kafka-python", "aiokafka"])
def test_acks_all_through_a_leader_killed(cluster: ProcessCluster, client: Callable[..., None]) -> None:
    values = [b"v%04d" % i for i in range(400)]
    acks = Acks()
    started = time.monotonic()
    worker, victim = producing(cluster, client, values, acks)
    cluster.node(victim).kill()
    killed_at = time.monotonic()
    worker.join(120)
    assert not worker.is_alive(), "the producer did not finish"
    gap = acks.longest_gap()
    print("%s: %d acknowledged in %.1f s, longest gap %.2f s (kill at %.1f s), %d retried errors" % (
        client.__name__, len(acks.values), time.monotonic() - started, gap, killed_at - started, len(acks.errors)))
    assert sorted(set(acks.values)) == values  # every send acknowledged (duplicates: aiokafka's resends)
    assert gap < SESSION_S + 10, gap  # the session, the client's metadata refresh and backoffs
    alive = [n for n in cluster.nodes if n != victim]
    wait_leaders(cluster, TOPIC, lambda ls: ls.get(0, -1) not in (-1, victim), nodes=alive)
    got = read_to_end(cluster, TOPIC, 1, len(set(acks.values)), timeout=60)
    assert set(values) <= set(got)


def test_acks_all_through_a_leader_stopped_cleanly(cluster: ProcessCluster) -> None:
    """A clean stop (SIGTERM) of the leader is Kafka's controlled shutdown: the controller moves
    its leadership to another in-sync replica and lets it go only once every live broker knows the
    new leader, while it still serves (a send it gets meanwhile is refused with the new leader's
    address, KIP-951). Nothing waits for a session to expire: every send is acknowledged, once."""
    values = [b"v%04d" % i for i in range(300)]
    acks = Acks()
    worker, victim = producing(cluster, confluent, values, acks)
    output = cluster.node(victim).stop_cleanly()
    assert "controlled shutdown complete" in output, output[-3000:]
    worker.join(60)
    assert not worker.is_alive(), "the producer did not finish"
    print("controlled shutdown: %d acknowledged, longest gap %.2f s" % (len(acks.values), acks.longest_gap()))
    assert sorted(acks.values) == values
    alive = [n for n in cluster.nodes if n != victim]
    wait_leaders(cluster, TOPIC, lambda ls: ls.get(0, -1) not in (-1, victim), nodes=alive)
    got = read_to_end(cluster, TOPIC, 1, len(values), timeout=60)
    assert set(values) <= set(got)
