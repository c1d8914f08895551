"""Listing, describing and deleting groups and their committed offsets with confluent-kafka's
AdminClient and kafka-python's KafkaAdminClient.

Each test sets up three groups on one topic: a Stable one with a running member, an Empty
consumer group whose member committed and left, and a "simple" group that only committed
offsets (no membership, generation -1).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")
from confluent_kafka import Consumer as CfConsumer  # noqa: E402
from confluent_kafka import (  # noqa: E402
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AclOperation, AdminClient  # noqa: E402
from kafka import KafkaAdminClient  # noqa: E402
from kafka import TopicPartition as KpTopicPartition  # noqa: E402
from kafka.admin import MemberToRemove  # noqa: E402
from kafka.errors import GroupSubscribedToTopicError, NoError  # noqa: E402
from kafka.structs import OffsetAndMetadata  # noqa: E402

from protocol.errors import ErrorCode  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.compat.group_checker import describe_group  # noqa: E402
from tests.harness import BrokerProcess, wait_for  # noqa: E402

PARTITIONS = 3
PER_PARTITION = 10
TIMEOUT = 15


class PolledConsumer(threading.Thread):
    """A subscribed confluent-kafka consumer polled in its own thread (so it can rejoin while
    the test talks to an admin client)."""

    def __init__(self, conf: dict[str, Any], topic: str) -> None:
        super().__init__(daemon=True)
        self.conf = conf
        self.topic = topic
        self.assigned: set[int] = set()
        self.halt = threading.Event()
        self.member_id = ""
        self.start()

    def run(self) -> None:
        c = CfConsumer(self.conf)

        def on_assign(_c: Any, ps: list[Any]) -> None:
            self.assigned = {p.partition for p in ps}

        def on_revoke(_c: Any, ps: list[Any]) -> None:
            self.assigned = set()

        c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
        while not self.halt.is_set():
            c.poll(0.05)
            self.member_id = c.memberid() or ""
        c.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


@dataclass
class Groups:
    topic: str
    active: str  # Stable, one member owning every partition
    empty: str  # Empty, offsets PER_PARTITION on every partition
    simple: str  # no protocol, offset 4 on partition 0
    member: PolledConsumer


def conf(kafka: BrokerProcess, group: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
            "client.id": "admin-test", **extra}


@pytest.fixture
def groups(kafka: BrokerProcess, topic_name: str) -> Iterator[Groups]:
    topic = topic_name
    create_topic(kafka, topic, PARTITIONS)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for i in range(PARTITIONS * PER_PARTITION):
        p.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
    assert p.flush(30) == 0

    empty = "empty-" + topic
    c = CfConsumer(conf(kafka, empty))
    c.subscribe([topic])
    def read_to_end() -> bool:
        for m in c.consume(100, 0.2):
            assert m.error() is None, m.error()
        positions = c.position([TopicPartition(topic, i) for i in range(PARTITIONS)])
        return all(tp.offset == PER_PARTITION for tp in positions)

    wait_for(read_to_end, 30, interval=0, what="the empty group's member to read everything")
    c.commit(asynchronous=False)
    c.close()

    simple = "simple-" + topic
    c = CfConsumer(conf(kafka, simple))
    c.assign([TopicPartition(topic, 0)])
    c.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    c.close()

    active = "active-" + topic
    member = PolledConsumer(conf(kafka, active, **{"group.instance.id": "instance-" + topic}), topic)
    try:
        wait_for(lambda: member.assigned == set(range(PARTITIONS)) and member.member_id, 30,
                 what="the active group's member to own every partition")
        wait_for(lambda: describe_group(kafka.port, active).group_state == "Stable", 10, what="a Stable group")
        yield Groups(topic, active, empty, simple, member)
    finally:
        member.stop()


def offsets_of(result: Any) -> dict[int, int]:
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.error is None}


def error_code(exc: KafkaException) -> int:
    return int(exc.args[0].code())


@pytest.mark.filterwarnings("ignore:list_groups:DeprecationWarning")
def test_confluent_admin(kafka: BrokerProcess, groups: Groups) -> None:
    g = groups
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})

    listed = {x.group_id: x for x in admin.list_consumer_groups(request_timeout=TIMEOUT).result(TIMEOUT).valid}
    assert (listed[g.active].state, listed[g.active].is_simple_consumer_group) == (ConsumerGroupState.STABLE, False)
    assert listed[g.active].type == ConsumerGroupType.CLASSIC
    assert (listed[g.empty].state, listed[g.empty].is_simple_consumer_group) == (ConsumerGroupState.EMPTY, False)
    assert (listed[g.simple].state, listed[g.simple].is_simple_consumer_group) == (ConsumerGroupState.EMPTY, True)
    stable = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(TIMEOUT).valid
    assert g.active in {x.group_id for x in stable} and not {g.empty, g.simple} & {x.group_id for x in stable}
    classic = admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}).result(TIMEOUT).valid
    assert {g.active, g.empty, g.simple} <= {x.group_id for x in classic}
    assert not admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(TIMEOUT).valid

    described = {k: f.result(TIMEOUT) for k, f in admin.describe_consumer_groups(
        [g.active, g.empty], include_authorized_operations=True).items()}
    active = described[g.active]
    assert {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE} <= set(active.authorized_operations)
    assert (active.state, active.partition_assignor, active.is_simple_consumer_group) == (
        ConsumerGroupState.STABLE, "range", False)
    [member] = active.members
    assert member.member_id == g.member.member_id
    assert member.client_id == "admin-test" and member.group_instance_id == "instance-" + g.topic
    assert "127.0.0.1" in member.host
    assert sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions) == [
        (g.topic, i) for i in range(PARTITIONS)]
    assert active.coordinator.host == "127.0.0.1" and active.coordinator.port == kafka.port
    assert (described[g.empty].state, described[g.empty].members) == (ConsumerGroupState.EMPTY, [])

    def list_offsets(group: str, partitions: list[Any] | None = None) -> dict[int, int]:
        [future] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, partitions)]).values()
        return offsets_of(future.result(TIMEOUT))

    assert list_offsets(g.empty) == {i: PER_PARTITION for i in range(PARTITIONS)}
    assert list_offsets(g.simple, [TopicPartition(g.topic, 0)]) == {0: 4}
    assert list_offsets(g.active, [TopicPartition(g.topic, 1)]) == {1: confluent_kafka.OFFSET_INVALID}

    [future] = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        g.empty, [TopicPartition(g.topic, 0, 3), TopicPartition(g.topic, 1, 2)])]).values()
    assert offsets_of(future.result(TIMEOUT)) == {0: 3, 1: 2}
    assert list_offsets(g.empty) == {0: 3, 1: 2, 2: PER_PARTITION}
    # not while the group has members: the admin client is not one of them
    [future] = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        g.active, [TopicPartition(g.topic, 0, 3)])]).values()
    [rejected] = future.result(TIMEOUT).topic_partitions
    assert rejected.error is not None and rejected.error.code() == ErrorCode.UNKNOWN_MEMBER_ID, rejected
    assert list_offsets(g.active, [TopicPartition(g.topic, 0)]) == {0: confluent_kafka.OFFSET_INVALID}

    # legacy listing (ListGroups + DescribeGroups)
    legacy: dict[Any, Any] = {x.id: x for x in admin.list_groups(timeout=TIMEOUT)}
    assert legacy[g.active].state == "Stable" and legacy[g.active].protocol == "range"
    assert legacy[g.active].protocol_type == "consumer" and len(legacy[g.active].members) == 1

    with pytest.raises(KafkaException) as failed:
        admin.delete_consumer_groups([g.active])[g.active].result(TIMEOUT)
    assert error_code(failed.value) == ErrorCode.NON_EMPTY_GROUP
    with pytest.raises(KafkaException) as failed:
        admin.delete_consumer_groups(["no-such-group"])["no-such-group"].result(TIMEOUT)
    assert error_code(failed.value) == ErrorCode.GROUP_ID_NOT_FOUND
    for f in admin.delete_consumer_groups([g.empty, g.simple]).values():
        f.result(TIMEOUT)
    remaining = {x.group_id for x in admin.list_consumer_groups().result(TIMEOUT).valid}
    assert g.active in remaining and not {g.empty, g.simple} & remaining
    assert list_offsets(g.empty, [TopicPartition(g.topic, 0)]) == {0: confluent_kafka.OFFSET_INVALID}


def test_kafka_python_admin(kafka: BrokerProcess, groups: Groups) -> None:
    g = groups
    tps = [KpTopicPartition(g.topic, i) for i in range(PARTITIONS)]
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=TIMEOUT * 1000)
    try:
        listed = {x["group_id"]: x for x in admin.list_groups()}
        assert (listed[g.active]["protocol_type"], listed[g.active]["group_state"]) == ("consumer", "Stable")
        assert (listed[g.empty]["protocol_type"], listed[g.empty]["group_state"]) == ("consumer", "Empty")
        assert (listed[g.simple]["protocol_type"], listed[g.simple]["group_state"]) == ("", "Empty")
        assert listed[g.active]["group_type"] == "classic"
        stable = {x["group_id"] for x in admin.list_groups(states_filter=["Stable"])}
        assert g.active in stable and g.empty not in stable

        described = admin.describe_groups([g.active, g.empty, "no-such-group"])
        active = described[g.active]
        assert (active["group_state"], active["protocol_type"], active["protocol_data"], active["error"]) == (
            "Stable", "consumer", "range", None)
        [member] = active["members"]
        assert member["member_id"] == g.member.member_id
        assert member["group_instance_id"] == "instance-" + g.topic
        assert member["client_host"] == "/127.0.0.1"
        assert member["member_assignment"]["assigned_partitions"] == [
            {"topic": g.topic, "partitions": list(range(PARTITIONS))}]
        assert (described[g.empty]["group_state"], described[g.empty]["members"]) == ("Empty", [])
        assert described["no-such-group"]["group_state"] == "Dead"
        assert "GroupIdNotFound" in described["no-such-group"]["error"]  # DescribeGroups v6

        offsets = admin.list_group_offsets([g.empty, g.simple])
        assert {tp: om.offset for tp, om in offsets[g.empty].items()} == {tp: PER_PARTITION for tp in tps}
        assert {tp: om.offset for tp, om in offsets[g.simple].items()} == {tps[0]: 4}

        result = admin.alter_group_offsets(g.empty, {tps[0]: OffsetAndMetadata(7, "moved", None)})
        assert result == {tps[0]: NoError}
        stored = admin.list_group_offsets({g.empty: [tps[0]]})[g.empty][tps[0]]
        assert (stored.offset, stored.metadata) == (7, "moved")

        # offsets of a topic the running group subscribes to stay; an empty group's go
        assert admin.delete_group_offsets(g.active, [tps[0]]) == {tps[0]: GroupSubscribedToTopicError}
        assert admin.delete_group_offsets(g.empty, [tps[0]]) == {tps[0]: NoError}
        assert set(admin.list_group_offsets(g.empty)[g.empty]) == set(tps[1:])

        # an administrator removes the static member; it notices and joins again as a new member
        old_member = g.member.member_id
        removed = admin.remove_group_members(g.active, [MemberToRemove(group_instance_id="instance-" + g.topic)])
        assert list(removed.values()) == [NoError]
        wait_for(lambda: g.member.member_id not in ("", old_member) and g.member.assigned == set(range(PARTITIONS)),
                 30, what="the removed member to rejoin")
        wait_for(lambda: [m.member_id for m in describe_group(kafka.port, g.active).members] == [g.member.member_id],
                 10, what="the coordinator to hold the new member")

        assert admin.delete_groups([g.active, g.empty, "no-such-group"]) == {
            g.active: "NonEmptyGroupError", g.empty: "OK", "no-such-group": "GroupIdNotFoundError"}
        assert g.empty not in {x["group_id"] for x in admin.list_groups()}
    finally:
        admin.close()
