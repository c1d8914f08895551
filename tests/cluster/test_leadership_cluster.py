"""Leaders and ISRs of replicated partitions across a three-process cluster on etcd (issue 23,
the controller's side): kill -9 of a partition's leader elects another in-sync replica within the
broker session timeout and every node's Metadata shows it; the returning broker is out of sync,
so a preferred election (ElectLeaders from a real client) is refused until its leader adds it
back with AlterPartition; then it leads again. Followers do not copy data yet: this is about the
metadata only. Timings are printed (-s)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    GROUP,
    TRANSACTION,
    call,
    coordinator,
    create_topic,
    metadata,
    need_etcd,
    roles,
    running_cluster,
    start_cluster,
    wait_live,
)
from tests.harness import wait_for

TOPIC, PARTITIONS = "replicated", 3
ALTER_PARTITION = 56


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path / "cluster") as made:
        yield made


def partitions(port: int, topic: str) -> dict[int, Any]:
    found = metadata(port, [topic]).topics[0]
    assert found.error_code == 0, found.error_code
    return {p.partition_index: p for p in found.partitions}


def views(cluster: ProcessCluster, nodes: list[int], topic: str) -> list[dict[int, tuple[int, list[int]]]]:
    return [{i: (p.leader_id, sorted(p.isr_nodes)) for i, p in partitions(cluster.node(n).port, topic).items()}
            for n in nodes]


def agreed(cluster: ProcessCluster, nodes: list[int], topic: str, expect: Any) -> dict[int, tuple[int, list[int]]]:
    """Until every node of `nodes` shows the same leaders and ISRs of `topic`, satisfying `expect`."""
    seen: list[dict[int, tuple[int, list[int]]]] = []

    def check() -> bool:
        try:
            found = views(cluster, nodes, topic)
        except (OSError, AssertionError):
            return False
        seen[:] = found[:1]
        return all(v == found[0] for v in found) and bool(expect(found[0]))

    wait_for(check, 30, interval=0.05, what="leaders and ISRs of %s" % topic)
    return seen[0]


def broker_epoch(cluster: ProcessCluster, node: int) -> int:
    found = re.findall(r"registered with the controller.*?broker_epoch=(\d+)", cluster.node(node).output())
    assert found, "node %d logged no registration" % node
    return int(found[-1])


@pytest.mark.timeout(150)
def test_kill_9_of_a_leader_then_preferred_election_through_alter_partition(fresh: ProcessCluster) -> None:
    active, _ = roles(fresh)
    others = sorted(n for n in fresh.nodes if n != active)
    assert create_topic(fresh.node(active).port, TOPIC, PARTITIONS, factor=3)[0] == 0
    everyone = sorted(fresh.nodes)
    before = agreed(fresh, everyone, TOPIC, lambda v: len(v) == PARTITIONS)
    assert all(isr == everyone for _, isr in before.values()), before  # all replicas in sync at creation
    victim = others[0]  # a node that is not the controller, and leads a partition
    led = [i for i, (leader, _) in before.items() if leader == victim]
    assert led, before
    replicas = {i: list(p.replica_nodes) for i, p in partitions(fresh.node(active).port, TOPIC).items()}

    fresh.node(victim).kill()
    killed = time.monotonic()
    survivors = [n for n in everyone if n != victim]
    after = agreed(fresh, survivors, TOPIC, lambda v: all(leader not in (victim, -1) for leader, _ in v.values()))
    elapsed = time.monotonic() - killed
    session = int(fresh.overrides["broker.session.timeout.ms"]) / 1000.0
    print("\nkill -9 of leader %d: new leaders from the ISR after %.2f s (broker session %.1f s)"
          % (victim, elapsed, session))
    for i in led:
        leader, isr = after[i]
        # the first in-sync replica in replica order, and the fenced one left the ISR
        assert leader == next(r for r in replicas[i] if r != victim), (i, replicas[i], after[i])
        assert isr == survivors, after[i]

    fresh.restart(victim)
    wait_live(fresh)
    back = agreed(fresh, everyone, TOPIC, lambda v: all(victim not in isr for _, isr in v.values()))
    admin = AdminClient({"bootstrap.servers": fresh.node(others[1]).bootstrap})
    preferred = [TopicPartition(TOPIC, i) for i in led if replicas[i][0] == victim]
    if preferred:  # its preferred partitions: it is out of sync, the election is refused
        result = admin.elect_leaders(ElectionType.PREFERRED, preferred).result(30)
        for tp in preferred:
            error = result[tp]
            assert error is not None and error.code() == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, error

    # the leader of each partition the victim led adds it back to the ISR (AlterPartition to the controller)
    for i in led:
        leader = back[i][0]
        p = partitions(fresh.node(leader).port, TOPIC)[i]
        AP = M.AlterPartitionRequest
        request = AP(broker_id=leader, broker_epoch=broker_epoch(fresh, leader), topics=[AP.TopicData(
            topic_id=metadata(fresh.node(leader).port, [TOPIC]).topics[0].topic_id,
            partitions=[AP.PartitionData(partition_index=i, leader_epoch=p.leader_epoch, partition_epoch=0,
                                         leader_recovery_state=0,
                                         new_isr_with_epochs=[AP.BrokerState(broker_id=b, broker_epoch=-1)
                                                              for b in sorted({*back[i][1], victim})])])])
        # created at partition epoch 0, changed once since (the victim fenced): 0 is stale
        stale = call(fresh.node(active).port, ALTER_PARTITION, 3, request)
        assert stale.topics[0].partitions[0].error_code == ErrorCode.INVALID_UPDATE_VERSION, stale
        request.topics[0].partitions[0].partition_epoch = 1
        answer = call(fresh.node(active).port, ALTER_PARTITION, 3, request)
        assert answer.error_code == 0, answer
        got = answer.topics[0].partitions[0]
        assert (got.error_code, got.leader_id, sorted(got.isr), got.leader_epoch, got.partition_epoch) == \
            (0, leader, everyone, p.leader_epoch, 2), got
    agreed(fresh, everyone, TOPIC, lambda v: all(victim in v[i][1] for i in led))

    result = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(TOPIC, i) for i in led]).result(30)
    for i in led:
        error = result[TopicPartition(TOPIC, i)]
        expected_leader = replicas[i][0]
        if expected_leader == victim:
            assert error is None, error
        else:  # its preferred replica leads already
            assert error is not None and error.code() == ErrorCode.ELECTION_NOT_NEEDED, error
    final = agreed(fresh, everyone, TOPIC, lambda v: all(v[i][0] == replicas[i][0] for i in led))
    print("preferred leaders back after AlterPartition and ElectLeaders: %s" % final)



@pytest.mark.timeout(90)
def test_internal_topics_are_replicated_with_kafkas_defaults_capped_by_live_brokers(tmp_path: Path) -> None:
    """offsets.topic.replication.factor unset: Kafka's 3 (three live brokers here), every replica
    in sync; transaction.state.log.replication.factor set: as set."""
    need_etcd()
    cluster = start_cluster(tmp_path / "cluster", overrides={"transaction.state.log.replication.factor": "2",
                                                             "transaction.state.log.num.partitions": "3",
                                                             "offsets.topic.num.partitions": "3"})
    try:
        port = cluster.node(1).port
        coordinator(port, GROUP, "a-group")
        coordinator(port, TRANSACTION, "a-transaction")
        for topic, factor in (("__consumer_offsets", 3), ("__transaction_state", 2)):
            found = partitions(port, topic)
            assert len(found) == 3
            for p in found.values():
                assert len(p.replica_nodes) == factor and sorted(p.isr_nodes) == sorted(p.replica_nodes), (topic, p)
                assert p.leader_id == p.replica_nodes[0]
    finally:
        cluster.stop()
