"""Transactions survive the loss of their coordinator's node (issue 23, item 5).

`__transaction_state` has three replicas and the data topic too (min.insync.replicas 2). The
transactional id is chosen so that its coordinator (the leader of its `__transaction_state`
partition) is a node that is not the active controller; that node is then killed -9.

- test_a_transaction_open_at_the_kill: a few transactions committed and aborted, then one open
  (records sent and acknowledged, EndTxn not yet sent) when the coordinator's node dies; the
  producer ends it as its client reports (commit, or abort where the client says it must),
  through NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS, against the new leader of the
  partition, which loaded the transaction from its replica; then more transactions. A
  read_committed consumer then reads exactly the records of the transactions whose commit the
  client saw succeed: none of an aborted one, none twice. librdkafka (confluent-kafka) and
  aiokafka. Not kafka-python 3.0.12: its sender drops a transactional request whose coordinator
  cannot be connected to (`await_ready` raises where the sender expects False, so the request is
  neither sent nor re-enqueued) and commit_transaction() then waits forever, whatever the broker.
- test_a_commit_answered_before_its_markers: EndTxn is answered once the decision
  (PrepareCommit) is committed, before the markers are written when writing them fails (as Kafka
  answers before its markers always). The data partition's leader (another node) refuses
  WriteTxnMarkers (fault injection) until the coordinator's node is killed right after
  commit_transaction returned; the new coordinator finds PrepareCommit when it loads and writes
  the markers: the records become visible to read_committed, and the producer goes on.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    TRANSACTION,
    coordinator,
    key_coordinated_by,
    leaders,
    read_to_end,
    roles,
    running_cluster,
)
from tests.harness import free_port, wait_for

pytestmark = pytest.mark.timeout(120)
TOPIC = "txn-failover"
PARTITIONS = 3
OVERRIDES = {
    "min.insync.replicas": "2",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.num.partitions": "6",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "6",
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path / "cluster", overrides=OVERRIDES, topic=(TOPIC, PARTITIONS, 3)) as made:
        yield made


Records = list[tuple[int, bytes]]  # (partition, value)


class Confluent:
    """librdkafka's transactional producer; ends a transaction as librdkafka advises: retry a
    retriable error, abort after an abortable one."""

    def __init__(self, bootstrap: str, transactional_id: str) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                  "linger.ms": 5, "transaction.timeout.ms": 60000, "message.timeout.ms": 30000,
                                  "topic.metadata.refresh.interval.ms": 1000})
        self.producer.init_transactions(30)

    def send(self, records: Records) -> None:
        self.producer.begin_transaction()
        for partition, value in records:
            self.producer.produce(TOPIC, value=value, partition=partition)
        assert self.producer.flush(30) == 0

    def end(self, commit: bool) -> str:
        from confluent_kafka import KafkaException

        stage = "commit" if commit else "abort"
        for _ in range(20):
            try:
                if stage == "commit":
                    self.producer.commit_transaction(30)
                    return "committed"
                self.producer.abort_transaction(30)
                return "aborted"
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal():
                    raise
                if error.txn_requires_abort():
                    stage = "abort"
                elif not error.retriable():
                    raise
        raise AssertionError("the transaction did not end")

    def close(self) -> None:
        self.producer.flush(5)


class AioKafka:
    """aiokafka's transactional producer, driven on a loop of its own between the test's steps."""

    def __init__(self, bootstrap: str, transactional_id: str) -> None:
        from aiokafka import AIOKafkaProducer

        self.loop = asyncio.new_event_loop()

        async def start() -> Any:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id,
                                        linger_ms=5, metadata_max_age_ms=1000, request_timeout_ms=10000,
                                        retry_backoff_ms=100, transaction_timeout_ms=60000)
            await producer.start()
            return producer

        self.producer = self.loop.run_until_complete(start())

    def send(self, records: Records) -> None:
        async def send() -> None:
            await self.producer.begin_transaction()
            futures = [await self.producer.send(TOPIC, value=value, partition=partition)
                       for partition, value in records]
            await asyncio.gather(*futures)

        self.loop.run_until_complete(asyncio.wait_for(send(), 30))

    def end(self, commit: bool) -> str:
        async def end() -> str:
            if commit:
                await self.producer.commit_transaction()
                return "committed"
            await self.producer.abort_transaction()
            return "aborted"

        return self.loop.run_until_complete(asyncio.wait_for(end(), 60))

    def close(self) -> None:
        self.loop.run_until_complete(self.producer.stop())
        self.loop.close()


CLIENTS: dict[str, Callable[[str, str], Any]] = {"confluent": Confluent, "aiokafka": AioKafka}


def records(name: str, n: int, partitions: list[int]) -> Records:
    return [(partitions[k % len(partitions)], b"%s-%d" % (name.encode(), k)) for k in range(n)]


def doomed_coordinator(cluster: ProcessCluster, prefix: str) -> tuple[int, str]:
    """(a node that is not the controller, a transactional id it coordinates)."""
    _, victim = roles(cluster)
    return victim, key_coordinated_by(cluster.node(victim).port, TRANSACTION, victim, prefix)


def new_coordinator(cluster: ProcessCluster, transactional_id: str, dead: int) -> int:
    alive = [n for n in cluster.nodes if n != dead]
    found = [-1]

    def moved() -> bool:
        found[0] = coordinator(cluster.node(alive[0]).port, TRANSACTION, transactional_id)
        return found[0] in alive

    wait_for(moved, 30, interval=0.2, what="a new coordinator of %s" % transactional_id)
    return found[0]


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_transaction_open_at_the_kill(cluster: ProcessCluster, client: str) -> None:
    victim, transactional_id = doomed_coordinator(cluster, "txn-" + client)
    producer = CLIENTS[client](cluster.bootstrap, transactional_id)
    outcomes: dict[str, str] = {}
    sent: dict[str, Records] = {}
    everywhere = list(range(PARTITIONS))
    try:
        for name, commit in (("t0", True), ("t1", False), ("t2", True)):
            sent[name] = records(name, 6, everywhere)
            producer.send(sent[name])
            outcomes[name] = producer.end(commit)
        assert outcomes == {"t0": "committed", "t1": "aborted", "t2": "committed"}
        sent["open"] = records("open", 6, everywhere)
        producer.send(sent["open"])
        cluster.node(victim).kill()
        outcomes["open"] = producer.end(True)
        for name, commit in (("t3", True), ("t4", False), ("t5", True)):
            sent[name] = records(name, 6, everywhere)
            producer.send(sent[name])
            outcomes[name] = producer.end(commit)
    finally:
        producer.close()
    assert new_coordinator(cluster, transactional_id, victim) != victim
    assert outcomes["t3"] == outcomes["t5"] == "committed" and outcomes["t4"] == "aborted", outcomes
    expected = [value for name, done in outcomes.items() if done == "committed" for _, value in sent[name]]
    got = read_to_end(cluster, TOPIC, PARTITIONS, len(expected), isolation="read_committed")
    assert Counter(got) == Counter(expected), (outcomes, sorted(Counter(got) - Counter(expected)),
                                               sorted(Counter(expected) - Counter(got)))


def http_faults(port: int, method: str, spec: dict[str, Any] | None = None) -> Any:
    """The /faults endpoint of a node's metrics.port (broker/network/http.py)."""
    body = json.dumps(spec).encode() if spec is not None else None
    request = urllib.request.Request("http://127.0.0.1:%d/faults" % port, data=body, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def faulty_cluster(tmp_path: Path) -> Iterator[tuple[ProcessCluster, dict[int, int]]]:
    """A cluster whose nodes serve /faults: (the cluster, node -> its metrics.port)."""
    ports = {n: free_port() for n in (1, 2, 3)}
    with running_cluster(tmp_path / "cluster", overrides=OVERRIDES, topic=(TOPIC, PARTITIONS, 3),
                         node_overrides={n: {"metrics.port": str(p)} for n, p in ports.items()}) as made:
        yield made, ports


def test_a_commit_answered_before_its_markers(faulty_cluster: tuple[ProcessCluster, dict[int, int]]) -> None:
    cluster, metrics_ports = faulty_cluster
    victim, transactional_id = doomed_coordinator(cluster, "txn-markers")
    led = leaders(cluster.node(victim).port, TOPIC)
    elsewhere = sorted(p for p, leader in led.items() if leader != victim)
    assert elsewhere, led
    data_leader = led[elsewhere[0]]
    producer = Confluent(cluster.bootstrap, transactional_id)
    sent: dict[str, Records] = {}
    try:
        sent["t0"] = records("t0", 4, list(range(PARTITIONS)))
        producer.send(sent["t0"])
        assert producer.end(True) == "committed"
        # the data partition's leader refuses every marker until the coordinator is gone
        http_faults(metrics_ports[data_leader], "POST", {"api": "WriteTxnMarkers", "error": "NOT_LEADER_OR_FOLLOWER",
                                                         "times": 100000})
        sent["decided"] = records("decided", 4, elsewhere[:1])
        producer.send(sent["decided"])
        assert producer.end(True) == "committed"
        cluster.node(victim).kill()
        injected = http_faults(metrics_ports[data_leader], "GET")["injected"]
        assert injected and injected[0]["count"] >= 1, injected  # the markers had not been written
        http_faults(metrics_ports[data_leader], "DELETE")
        sent["t1"] = records("t1", 4, list(range(PARTITIONS)))
        producer.send(sent["t1"])
        assert producer.end(True) == "committed"
    finally:
        producer.close()
    assert new_coordinator(cluster, transactional_id, victim) != victim
    expected = [value for batch in sent.values() for _, value in batch]
    got = read_to_end(cluster, TOPIC, PARTITIONS, len(expected), isolation="read_committed")
    assert Counter(got) == Counter(expected), (sorted(Counter(got) - Counter(expected)),
                                               sorted(Counter(expected) - Counter(got)))
