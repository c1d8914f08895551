"""Partition reassignment across processes, with kafka-python's admin client (confluent-kafka and
aiokafka have no reassignment API): a partition's leader replica moves to the broker that had
none; the new replica copies the log from the leader, takes over the lead once in sync, the old
one deletes its copy, and every acknowledged record is still there when only the new replica
is left."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import NoReassignmentInProgressError

from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    logged_errors,
    metadata,
    produce_acked,
    read_to_end,
    running_cluster,
    wait_leaders,
)
from tests.harness import wait_for

pytestmark = pytest.mark.timeout(150)
TOPIC = "moving"


def produce(cluster: ProcessCluster, tag: str, n: int) -> list[bytes]:
    return produce_acked(cluster, TOPIC, tag, n, linger_ms=5)


def replicas(port: int) -> list[int]:
    return list(metadata(port, [TOPIC]).topics[0].partitions[0].replica_nodes)


def test_kafka_python_moves_the_leader_replica_to_another_broker(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", topic=(TOPIC, 1, 2)) as cluster:
        port = cluster.node(1).port
        leader = wait_leaders(cluster, TOPIC, lambda ls: ls.get(0, -1) >= 0)[0]
        follower = next(r for r in replicas(port) if r != leader)
        spare = next(n for n in cluster.nodes if n not in (leader, follower))
        before = produce(cluster, "before", 300)

        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
        try:
            tp = KafkaTopicPartition(TOPIC, 0)
            assert admin.alter_partition_reassignments({tp: [spare, follower]}) == {tp: None}
            wait_for(lambda: replicas(port) == [spare, follower] and not admin.list_partition_reassignments(),
                     60, what="the reassignment to complete")
            # the joining replica, first of the target and in sync, leads; the old leader's copy is gone
            wait_leaders(cluster, TOPIC, lambda ls: ls.get(0) == spare)
            wait_for(lambda: not (cluster.node(leader).data_dir / ("%s-0" % TOPIC)).exists(), 30,
                     what="the old leader to delete its copy")
            # nothing in progress to cancel
            assert admin.alter_partition_reassignments({tp: None}) == {tp: NoReassignmentInProgressError}
        finally:
            admin.close()
        after = produce(cluster, "after", 50)
        # the moved replica alone has every acknowledged record, those copied and those since
        cluster.node(follower).kill()
        wait_leaders(cluster, TOPIC, lambda ls: ls.get(0) == spare, nodes=[leader, spare])
        assert sorted(read_to_end(cluster, TOPIC, 1, len(before) + len(after))) == sorted(before + after)
        assert logged_errors(cluster) == []
