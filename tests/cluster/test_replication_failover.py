"""Replication through failures (issue 23) on three processes, replication factor 3 and
min.insync.replicas 2: the leader of a partition killed with -9 and started again, producers with
acks=all go on, every acknowledged record is still there, and every replica converges on the
leaders' batches once the node is back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    read_to_end,
    running_cluster,
    wait_leaders,
    wait_live,
)
from tests.cluster.test_replication_cluster import PARTITIONS, TOPIC, current_leaders, wait_replicated

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path / "cluster", overrides={"min.insync.replicas": "2"}, topic=(TOPIC, PARTITIONS, 3)) as made:
        yield made


def produce_all(cluster: ProcessCluster, tag: str, per_partition: int = 20, timeout: float = 60.0) -> list[bytes]:
    """acks=all to every partition; the values acknowledged (every send must be)."""
    acked: list[bytes] = []
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        (errors if err is not None else acked).append(err if err is not None else msg.value())

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": int(timeout * 1000)})
    for i in range(per_partition):
        for p in range(PARTITIONS):
            producer.produce(TOPIC, value=b"%s-%d-%d" % (tag.encode(), p, i), partition=p, on_delivery=delivered)
    assert producer.flush(timeout + 10) == 0
    assert not errors, errors
    return acked


@pytest.mark.parametrize("restart", [True, False])
def test_a_killed_leader_loses_nothing_acknowledged(cluster: ProcessCluster, restart: bool) -> None:
    acked = produce_all(cluster, "before")
    wait_replicated(cluster)
    victim = current_leaders(cluster)[1]
    cluster.node(victim).kill()
    alive = [n for n in cluster.nodes if n != victim]
    wait_leaders(cluster, TOPIC, lambda ls: victim not in ls.values() and min(ls.values()) >= 0, nodes=alive)
    acked += produce_all(cluster, "while-down")
    if restart:
        cluster.restart(victim)
        wait_live(cluster)
        acked += produce_all(cluster, "after")
        wait_replicated(cluster, timeout=60)
    got = read_to_end(cluster, TOPIC, PARTITIONS, len(acked), timeout=60)
    assert sorted(got) == sorted(acked)
