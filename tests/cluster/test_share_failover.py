"""A share group keeps its promises through kill -9 of a node (issue 23, item 5; KIP-932).

`__share_group_state`, `__consumer_offsets` and the data topic (one partition) have three
replicas, min.insync.replicas 2. The group id is chosen so that its share coordinator (the
leader of the `__share_group_state` partition of group:topic:0) and the data partition's leader
are different nodes. Member A (librdkafka's ShareConsumer, explicit acknowledgement) gets records,
accepts some of them (commit_sync confirmed: persisted by the share coordinator and committed)
and holds the rest, unacknowledged. Then one node is killed -9:

- "coordinator": the share coordinator's node; the share-partition stays with its leader, whose
  state writes go to the new leader of the `__share_group_state` partition (which loaded it);
- "leader": the data partition's leader; the new leader loads the share-partition from the
  share coordinator.

A closes; members B and C accept whatever they get until every record is accepted. Checked:
a record whose acceptance was confirmed is never delivered again; every held record is
delivered again (delivery count 1 or more); every record produced is accepted by some member; no
record is held by two members at once (a member's confirmed acceptance was sent before any other
member got the record). Then what the share coordinator holds is loaded again: the killed node
back, the partition's leader is killed in turn, and a new member gets only the record produced
after that (none accepted before comes again), and DescribeShareGroupOffsets answers a start
offset past them. (Right after the first kill it may still answer an older one: the start offset
written with each acknowledgement is the one before it, in Kafka as here, and the batches
written say the rest.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer

from broker.coordinator.share.coordinator import kafka_uuid
from protocol import messages as M
from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    GROUP,
    SHARE,
    call,
    coordinator,
    leaders,
    metadata,
    running_cluster,
    wait_leaders,
    wait_live,
)
from tests.compat.share_child import FAST_SHARE_GROUPS
from tests.harness import wait_for

pytestmark = pytest.mark.timeout(120)
TOPIC = "share-failover"
RECORDS = 60
LOCK_MS = 5000
OVERRIDES = {
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "6",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.num.partitions": "6",
    **FAST_SHARE_GROUPS,
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path / "cluster", overrides=OVERRIDES, topic=(TOPIC, 1, 3)) as made:
        yield made


@dataclass
class Delivery:
    member: str
    offset: int
    count: int
    polled: float  # when the poll that returned it began
    at: float  # when it returned


@dataclass
class Accept:
    member: str
    offset: int
    sent: float  # when commit_sync was called
    confirmed: float  # when it returned without an error for the partition


class Members:
    """Share consumers of one group and what they were given and had accepted."""

    def __init__(self, bootstrap: str, group: str) -> None:
        self.bootstrap, self.group = bootstrap, group
        self.consumers: dict[str, ShareConsumer] = {}
        self.deliveries: list[Delivery] = []
        self.accepts: list[Accept] = []

    def join(self, name: str) -> ShareConsumer:
        consumer = ShareConsumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": name,
                                  "share.acknowledgement.mode": "explicit"})
        consumer.subscribe([TOPIC])
        self.consumers[name] = consumer
        return consumer

    def poll(self, name: str, timeout: float = 0.5) -> list[Any]:
        began = time.monotonic()
        messages = [m for m in self.consumers[name].poll(timeout) if m.error() is None]
        now = time.monotonic()
        self.deliveries += [Delivery(name, m.offset(), m.delivery_count(), began, now) for m in messages]
        return messages

    def accept(self, name: str, messages: list[Any]) -> None:
        consumer = self.consumers[name]
        for m in messages:
            consumer.acknowledge(m, AcknowledgeType.ACCEPT)
        sent = time.monotonic()
        try:
            result = consumer.commit_sync(15)
        except Exception:  # noqa: BLE001 - not confirmed: the records may come again
            return
        if result and all(error is None for error in result.values()):
            self.accepts += [Accept(name, m.offset(), sent, time.monotonic()) for m in messages]

    def close(self, name: str) -> None:
        self.consumers.pop(name).close()

    def close_all(self) -> None:
        for name in list(self.consumers):
            self.close(name)

    def accepted(self) -> set[int]:
        return {a.offset for a in self.accepts}


def share_coordinator_key(port: int, group: str) -> str:
    topic_id = metadata(port, [TOPIC]).topics[0].topic_id
    return "%s:%s:0" % (group, kafka_uuid(topic_id))


def group_coordinated_apart(cluster: ProcessCluster, leader: int) -> tuple[str, int]:
    """(a group id whose share coordinator for the topic's partition is not `leader`, that node)."""
    port = cluster.node(leader).port
    for n in range(200):
        group = "share-failover-%d" % n
        node = coordinator(port, SHARE, share_coordinator_key(port, group))
        if node != leader:
            return group, node
    raise AssertionError("every group's share coordinator is the data leader")


def set_group_configs(bootstrap: str, group: str) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group, configs={
            "share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": str(LOCK_MS)})], incremental=True)
    finally:
        admin.close()


def start_offset(port: int, group: str) -> int:
    """DescribeShareGroupOffsets v1 (no Python client has it) of the topic's partition, asked of
    the group's coordinator on `port` (-1: an error)."""
    R = M.DescribeShareGroupOffsetsRequest
    response = call(port, 90, 1, R(groups=[R.DescribeShareGroupOffsetsRequestGroup(
        group_id=group, topics=[R.DescribeShareGroupOffsetsRequestTopic(topic_name=TOPIC, partitions=[0])])]))
    found = response.groups[0]
    if found.error_code or not found.topics or found.topics[0].partitions[0].error_code:
        return -1
    return int(found.topics[0].partitions[0].start_offset)


def violations(members: Members) -> list[str]:
    """KIP-932's promises over what the members were given and had confirmed."""
    out = []
    for accept in members.accepts:
        for d in members.deliveries:
            if d.offset != accept.offset:
                continue
            if d.polled > accept.confirmed:
                out.append("offset %d delivered to %s after %s's acceptance was confirmed" % (
                    d.offset, d.member, accept.member))
            own = [x for x in members.deliveries if x.member == accept.member and x.offset == accept.offset
                   and x.at <= accept.sent]
            if own and d.member != accept.member and own[-1].at < d.at < accept.sent:
                out.append("offset %d held by %s and %s at once (the first's acceptance was confirmed)" % (
                    d.offset, accept.member, d.member))
    return out


@pytest.mark.parametrize("killed", ["coordinator", "leader"])
def test_share_group_through_a_kill(cluster: ProcessCluster, killed: str) -> None:
    leader = leaders(cluster.node(1).port, TOPIC)[0]
    group, share_coordinator = group_coordinated_apart(cluster, leader)
    set_group_configs(cluster.bootstrap, group)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"r%d" % i, partition=0)
    assert producer.flush(30) == 0
    members = Members(cluster.bootstrap, group)
    try:
        members.join("A")
        got: list[Any] = []
        wait_for(lambda: bool(got.extend(members.poll("A")) or got), 30, interval=0, what="A's first records")
        accepted, held = got[: len(got) // 2], got[len(got) // 2:]
        assert held, "A got one record only"
        members.accept("A", accepted)
        assert members.accepted() == {m.offset() for m in accepted}, "A's acceptance was not confirmed"

        victim = share_coordinator if killed == "coordinator" else leader
        cluster.node(victim).kill()
        members.close("A")  # its held records go back (released, or with the leader they lived on)
        members.join("B")
        members.join("C")

        def all_accepted() -> bool:
            for name in ("B", "C"):
                messages = members.poll(name, 0.3)
                if messages:
                    members.accept(name, messages)
            return members.accepted() == set(range(RECORDS))

        wait_for(all_accepted, 60, interval=0, what="every record accepted (%d of %d)" % (
            len(members.accepted()), RECORDS))
    finally:
        members.close_all()
    assert not violations(members), violations(members)
    again = {d.offset for d in members.deliveries if d.member != "A"}
    assert {m.offset() for m in held} <= again, "held records not delivered again"

    # What the share coordinator holds is what a new leader loads: the records accepted after the
    # kill must not come again when the partition fails over a second time. (Its start offset
    # trails by one write, as Kafka's does: SharePartition writes the start offset it had before
    # the acknowledgement moved it, and the batches say the rest.)
    cluster.restart(victim)
    wait_live(cluster)
    now_leading = wait_leaders(cluster, TOPIC, lambda ls: ls.get(0, -1) >= 0)[0]
    cluster.node(now_leading).kill()
    survivors = [n for n in cluster.nodes if n != now_leading]
    wait_leaders(cluster, TOPIC, lambda ls: ls.get(0, -1) in survivors, nodes=survivors)
    producer.produce(TOPIC, value=b"last", partition=0)
    assert producer.flush(30) == 0
    members = Members(cluster.bootstrap, group)
    try:
        members.join("D")
        got_last: list[Any] = []

        def the_last_one() -> bool:
            messages = members.poll("D", 0.3)
            got_last.extend(messages)
            if messages:
                members.accept("D", messages)
            return any(m.value() == b"last" for m in got_last)

        wait_for(the_last_one, 60, interval=0, what="the record produced after the second failover")
    finally:
        members.close_all()
    assert [m.offset() for m in got_last] == [RECORDS], "accepted records delivered again after a reload: %s" % (
        [m.offset() for m in got_last])
    port = cluster.node(survivors[0]).port
    wait_for(lambda: start_offset(cluster.node(coordinator(port, GROUP, group)).port, group) >= RECORDS, 30,
             interval=0.2, what="the share-partition's start offset past the records accepted before")
