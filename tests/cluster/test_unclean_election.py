"""An unclean election across processes (issue 23, item 4): with replication factor 2 the follower
dies, its leader goes on alone (min.insync.replicas 1) and then dies too; the follower back alone
cannot be elected cleanly (it is not in the ISR), and the partition stays offline, as in Kafka
with `unclean.leader.election.enable` false. ElectLeaders(UNCLEAN) (confluent-kafka's admin) then
makes it leader, losing what only the old leader had; the old leader, back, truncates where its
history diverges and follows, so both replicas end with the same batches."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient

from protocol.records import iter_batches
from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    create_topic,
    metadata,
    produce_acked,
    read_to_end,
    running_cluster,
    wait_leaders,
    wait_live,
)
from tests.harness import wait_for

pytestmark = pytest.mark.timeout(150)
TOPIC = "unclean"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path / "cluster") as made:
        yield made


def produce(cluster: ProcessCluster, tag: str, n: int = 10) -> list[bytes]:
    return produce_acked(cluster, TOPIC, tag, n)


def batches(cluster: ProcessCluster, node: int) -> list[bytes]:
    directory = cluster.node(node).data_dir / ("%s-0" % TOPIC)
    out: list[bytes] = []
    for name in sorted(n for n in os.listdir(directory) if n.endswith(".log")):
        data = (directory / name).read_bytes()
        out += [data[pos:pos + h.size] for pos, h in iter_batches(data)]
    return out


def test_an_unclean_election_elects_the_out_of_sync_replica_and_the_old_leader_truncates(
        cluster: ProcessCluster) -> None:
    port = cluster.node(1).port
    assert create_topic(port, TOPIC, 1, 2) == (0, None)
    leader = wait_leaders(cluster, TOPIC, lambda ls: ls.get(0, -1) >= 0)[0]
    [part] = metadata(port, [TOPIC]).topics[0].partitions
    follower = next(r for r in part.replica_nodes if r != leader)
    other = next(n for n in cluster.nodes if n not in (leader, follower))
    before = produce(cluster, "both")  # acks=all: on both replicas

    cluster.node(follower).kill()
    alone = produce(cluster, "leader-alone")  # once the follower is out of the ISR
    cluster.node(leader).kill()
    cluster.restart(follower)
    wait_live(cluster, [follower, other])
    # not in the ISR: no clean election brings it back as leader
    wait_leaders(cluster, TOPIC, lambda ls: ls.get(0) == -1, nodes=[follower, other])

    admin = AdminClient({"bootstrap.servers": cluster.node(other).bootstrap})
    future = admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(TOPIC, 0)])
    result = future.result(30)
    assert all(err is None for err in result.values()), result
    wait_leaders(cluster, TOPIC, lambda ls: ls.get(0) == follower, nodes=[follower, other])
    after = produce(cluster, "after")

    cluster.restart(leader)
    wait_live(cluster)
    wait_for(lambda: batches(cluster, leader) == batches(cluster, follower) != [], 30, interval=0.1,
             what="the old leader truncated to the new one's history")
    got = read_to_end(cluster, TOPIC, 1, len(before) + len(after), timeout=30)
    assert sorted(got) == sorted(before + after)  # what only the old leader had is gone: unclean
    assert not set(alone) & set(got)
