"""A consumer group loses no committed offset through the loss of its coordinator's node (issue
23): `__consumer_offsets` has three replicas, a commit is answered once committed (its records
under the high watermark), and when the coordinator's node is killed -9 the new leader of the
group's partition loads it and serves the same offsets (confluent-kafka and kafka-python)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    GROUP,
    coordinator,
    running_cluster,
)
from tests.harness import wait_for

pytestmark = pytest.mark.timeout(150)
TOPIC = "committed"
PARTITIONS = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path / "cluster", overrides={"min.insync.replicas": "2",
                                                          "offsets.topic.replication.factor": "3"}, topic=(TOPIC, PARTITIONS, 3)) as made:
        yield made


def committed_offsets(bootstrap: str, group: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=20)
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_commits_survive_the_coordinators_node(cluster: ProcessCluster, client: str) -> None:
    group = "survivor-%s" % client
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(60):
        producer.produce(TOPIC, value=b"%d" % i, partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    wanted = {0: 7, 1: 11, 2: 13}
    if client == "confluent":
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                             "enable.auto.commit": False})
        try:
            consumer.commit(offsets=[TopicPartition(TOPIC, p, o) for p, o in wanted.items()], asynchronous=False)
        finally:
            consumer.close()
    else:
        from kafka import KafkaConsumer
        from kafka.structs import OffsetAndMetadata
        from kafka.structs import TopicPartition as KTP

        kc = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=group, enable_auto_commit=False)
        try:
            kc.commit({KTP(TOPIC, p): OffsetAndMetadata(o, "", -1) for p, o in wanted.items()})
        finally:
            kc.close()
    node = coordinator(cluster.node(1).port, GROUP, group)
    cluster.node(node).kill()
    alive = [n for n in cluster.nodes if n != node]
    wait_for(lambda: coordinator(cluster.node(alive[0]).port, GROUP, group) in alive, 30, interval=0.2,
             what="a new coordinator for the group")
    bootstrap = ",".join(cluster.node(n).bootstrap for n in alive)
    assert committed_offsets(bootstrap, group) == wanted
