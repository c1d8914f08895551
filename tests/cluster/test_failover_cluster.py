"""kill -9 of a node of a three-process cluster on etcd (issue 22), each test on a cluster of its
own: the controller's node (another node is controller within the lease time, CreateTopics works
through it, the killed node restarts on its port and log directory and serves its partitions
with every acknowledged record), and another node (Metadata stops listing it once its broker
session runs out, its partitions have no leader, and both come back with it).

Partitions have one replica (replication comes with part 2), so a dead node's partitions wait
for it; what it acknowledged (acks=all) is on its disk when it returns. Timings are printed (-s).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    controller,
    create_topic,
    elapsed_until,
    leaders,
    live_brokers,
    metadata,
    roles,
    running_cluster,
    spread,
    wait_leaders,
    wait_live,
)
from tests.harness import wait_for

PARTITIONS = 6
PER_PARTITION = 20
UNFENCED = "unfenced: serving as a live broker"


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path / "cluster") as made:
        yield made


def seconds(cluster: ProcessCluster, name: str) -> float:
    return int(cluster.overrides[name]) / 1000.0


def produce_acked(cluster: ProcessCluster, topic: str, tag: str) -> dict[int, list[bytes]]:
    """PER_PARTITION records to each partition, idempotent and acks=all; what was acknowledged,
    per partition in offset order."""
    acked: dict[int, list[tuple[int, bytes]]] = {}
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    for i in range(PER_PARTITION):
        for partition in range(PARTITIONS):
            producer.produce(topic, value=b"%s-%d-%d" % (tag.encode(), partition, i), partition=partition,
                             on_delivery=delivered)
    assert producer.flush(30) == 0
    assert not errors, errors
    return {p: [v for _, v in sorted(records)] for p, records in acked.items()}


def read_partitions(bootstrap: str, topic: str, want: dict[int, int], timeout: float = 30.0) -> dict[int, list[bytes]]:
    """Each partition of `want` read from offset 0 until its count, then its end (EOF)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-" + uuid.uuid4().hex[:6],
                         "enable.auto.commit": False, "enable.partition.eof": True})
    read: dict[int, list[bytes]] = {p: [] for p in want}
    at_end: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in want])

        def done() -> bool:
            for msg in consumer.consume(100, 0.2):
                if msg.error() is None:
                    read[msg.partition()].append(msg.value())
                    at_end.discard(msg.partition())
                elif msg.error().code() == -191:  # _PARTITION_EOF
                    at_end.add(msg.partition())
            return at_end == set(want) and all(len(read[p]) >= n for p, n in want.items())

        wait_for(done, timeout, interval=0, what="the records of %s" % topic)
    finally:
        consumer.close()
    return read


@pytest.mark.timeout(120)
def test_kill_9_of_the_controller(fresh: ProcessCluster) -> None:
    lease = seconds(fresh, "etcd.lease.timeout.ms")
    assert create_topic(fresh.node(1).port, "acked", PARTITIONS) == (0, None)
    placed = spread(fresh, "acked", PARTITIONS)
    acked = produce_acked(fresh, "acked", "before")
    assert {p: len(v) for p, v in acked.items()} == {p: PER_PARTITION for p in range(PARTITIONS)}

    active, _ = roles(fresh)
    survivors = sorted(set(fresh.nodes) - {active})
    fresh.node(active).kill()

    def new_controller() -> bool:
        try:
            seen = {controller(fresh.node(n).port) for n in survivors}
        except OSError:
            return False
        return len(seen) == 1 and seen <= set(survivors)

    failover = elapsed_until(new_controller, lease + 10, what="another node to be controller")
    successor = controller(fresh.node(survivors[0]).port)
    print("\nkill -9 of controller %d: node %d is controller after %.2f s (lease %.1f s)"
          % (active, successor, failover, lease))
    assert failover <= lease + 1.5

    # CreateTopics through the new controller and through the other survivor (forwarded to it)
    other = next(n for n in survivors if n != successor)
    admin = AdminClient({"bootstrap.servers": ",".join(fresh.node(n).bootstrap for n in survivors)})
    for future in admin.create_topics([NewTopic("after-failover", 2, 1)], operation_timeout=10).values():
        assert future.result(20) is None
    assert create_topic(fresh.node(other).port, "forwarded-after-failover", 2) == (0, None)
    for node in survivors:
        assert {"after-failover", "forwarded-after-failover"} <= {t.name for t in metadata(fresh.node(node).port).topics}

    # the killed node comes back on its port and log directory, and leads its partitions again
    restarted = time.monotonic()
    fresh.restart(active)
    wait_live(fresh, timeout=30)
    wait_leaders(fresh, "acked", lambda ls: ls == placed, what="the leaders from before the kill")
    serving = time.monotonic() - restarted
    print("node %d restarted: live and leading its partitions again after %.2f s" % (active, serving))
    own = {p: PER_PARTITION for p, leader in placed.items() if leader == active}
    assert own, placed
    from_restarted = read_partitions(fresh.node(active).bootstrap, "acked", own)
    assert from_restarted == {p: acked[p] for p in own}
    # and every partition of the cluster holds all it acknowledged, and takes more
    more = produce_acked(fresh, "acked", "after")
    everything = read_partitions(fresh.bootstrap, "acked", {p: 2 * PER_PARTITION for p in range(PARTITIONS)})
    assert everything == {p: acked[p] + more[p] for p in range(PARTITIONS)}


@pytest.mark.timeout(90)
def test_metadata_lists_only_live_brokers(fresh: ProcessCluster) -> None:
    session = seconds(fresh, "broker.session.timeout.ms")
    assert create_topic(fresh.node(1).port, "placed", PARTITIONS) == (0, None)
    placed = spread(fresh, "placed", PARTITIONS)
    active, _ = roles(fresh)
    victim = next(n for n in sorted(fresh.nodes, reverse=True) if n != active)
    survivors = sorted(set(fresh.nodes) - {victim})
    fresh.node(victim).kill()
    fenced = elapsed_until(lambda: all(live_brokers(fresh.node(n).port) == set(survivors) for n in survivors),
                           session + 10, what="node %d gone from Metadata" % victim)
    print("\nkill -9 of node %d: gone from Metadata after %.2f s (broker session %.1f s)" % (victim, fenced, session))
    assert fenced <= session + 2
    orphaned = {p: (-1 if leader == victim else leader) for p, leader in placed.items()}
    wait_leaders(fresh, "placed", lambda ls: ls == orphaned, nodes=survivors, timeout=10,
                 what="no leader for node %d's partitions" % victim)

    restarted = time.monotonic()
    fresh.restart(victim)
    wait_live(fresh, timeout=30)
    wait_leaders(fresh, "placed", lambda ls: ls == placed, what="the leaders from before the kill")
    print("node %d restarted: listed and leading again after %.2f s" % (victim, time.monotonic() - restarted))
    assert leaders(fresh.node(victim).port, "placed") == placed


@pytest.mark.timeout(90)
def test_a_node_killed_and_restarted_at_once(fresh: ProcessCluster) -> None:
    """Restarted before the cluster noticed it died: its old registration still has a session
    (a new incarnation is refused until it runs out) and its node id is still claimed by its old
    lease (the same log directory takes it back); it serves again within the broker session."""
    session = seconds(fresh, "broker.session.timeout.ms")
    assert create_topic(fresh.node(1).port, "bounced", PARTITIONS) == (0, None)
    placed = spread(fresh, "bounced", PARTITIONS)
    acked = produce_acked(fresh, "bounced", "before")
    active, _ = roles(fresh)
    victim = next(n for n in sorted(fresh.nodes, reverse=True) if n != active)
    process = fresh.node(victim)
    unfenced = process.output().count(UNFENCED)
    process.kill()
    restarted = time.monotonic()
    fresh.restart(victim)
    # the new incarnation registered and unfenced (its own log says so: Metadata cannot tell the two apart)
    wait_for(lambda: process.output().count(UNFENCED) > unfenced, session + 20, interval=0.05,
             what="node %d registered again" % victim)
    registered = time.monotonic() - restarted
    wait_live(fresh, timeout=10)
    wait_leaders(fresh, "bounced", lambda ls: ls == placed, what="the leaders from before the kill")
    own = {p: PER_PARTITION for p, leader in placed.items() if leader == victim}
    assert read_partitions(fresh.node(victim).bootstrap, "bounced", own) == {p: acked[p] for p in own}
    print("\nnode %d killed and restarted at once: registered again after %.2f s, serving after %.2f s"
          % (victim, registered, time.monotonic() - restarted))
    assert registered <= session + 5
