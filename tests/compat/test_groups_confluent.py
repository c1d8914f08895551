"""Classic consumer groups with confluent-kafka (librdkafka): range, roundrobin and
cooperative-sticky members share a topic's partitions, take over from a member that leaves or
is killed, a static member restarts without a rebalance, and a stale generation cannot commit.

The module's broker runs with Kafka's default session timeout bounds (6 s to 30 min) and
`group.initial.rebalance.delay.ms=0`; one test runs its own broker with the 3 s default delay.
Ownership is checked from the clients' callbacks (group_checker.OwnershipLog) and compared
with the coordinator's own view (DescribeGroups).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from protocol.errors import ErrorCode  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.compat.group_checker import (  # noqa: E402
    TP,
    ChildConsumer,
    OwnershipLog,
    broker_assignment,
    describe_group,
    librdkafka_group_metadata,
    raw_commit,
)
from tests.harness import BrokerProcess, wait_for  # noqa: E402

PARTITIONS = 6
STRATEGIES = ["range", "roundrobin", "cooperative-sticky"]
SESSION_TIMEOUT_MS = 6000  # group.min.session.timeout.ms, Kafka's default
HEARTBEAT_MS = 500


def consumer_conf(kafka: BrokerProcess, group: str, strategy: str = "range", **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": kafka.bootstrap,
        "group.id": group,
        "partition.assignment.strategy": strategy,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "topic.metadata.refresh.interval.ms": 1000,
        **extra,
    }


class Members:
    """In-process consumers of one group, polled in turn from the test's thread."""

    def __init__(self, kafka: BrokerProcess, group: str, topic: str, log: OwnershipLog, strategy: str = "range"):
        self.kafka = kafka
        self.group = group
        self.topic = topic
        self.log = log
        self.strategy = strategy
        self.consumers: dict[str, Consumer] = {}
        self.misplaced: list[tuple[str, TP]] = []  # messages from partitions the member did not own
        self.received = 0

    def add(self, name: str, **extra: Any) -> Consumer:
        c = Consumer(consumer_conf(self.kafka, self.group, self.strategy, **extra))
        c.subscribe([self.topic],
                    on_assign=lambda _c, ps: self.log.assigned(name, [(p.topic, p.partition) for p in ps]),
                    on_revoke=lambda _c, ps: self.log.revoked(name, [(p.topic, p.partition) for p in ps]),
                    on_lost=lambda _c, ps: self.log.revoked(name, [(p.topic, p.partition) for p in ps]))
        self.consumers[name] = c
        return c

    def pump(self) -> None:
        for name, c in list(self.consumers.items()):
            msg = c.poll(0.02)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            self.received += 1
            tp = (str(msg.topic()), int(msg.partition() or 0))
            if tp not in self.log.owned_by(name):
                self.misplaced.append((name, tp))

    def pump_until(self, predicate: Any, timeout: float, what: str) -> None:
        def done() -> bool:
            self.pump()
            return bool(predicate())

        wait_for(done, timeout, interval=0, what=what)

    def pump_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.pump()

    def close(self, name: str) -> None:
        self.consumers.pop(name).close()
        self.log.gone(name)

    def close_all(self) -> None:
        for name in list(self.consumers):
            self.close(name)

    def member_ids(self) -> dict[str, str]:
        return {name: c.memberid() for name, c in self.consumers.items()}

    def generation(self, name: str) -> int:
        return librdkafka_group_metadata(self.consumers[name].consumer_group_metadata())[0]


def partitions_of(topic: str) -> list[TP]:
    return [(topic, p) for p in range(PARTITIONS)]


def produce(kafka: BrokerProcess, topic: str, per_partition: int) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for i in range(per_partition * PARTITIONS):
        p.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
    assert p.flush(30) == 0


def assert_broker_agrees(kafka: BrokerProcess, group: str, log: OwnershipLog, ids: dict[str, str],
                         pump: Any) -> None:
    """The coordinator's stored assignment is what the clients say they own."""
    expected = {ids[name]: tps for name, tps in log.assignment().items() if name in ids}

    def agrees() -> bool:
        pump()
        return describe_group(kafka.port, group).group_state == "Stable" and \
            broker_assignment(kafka.port, group) == expected

    wait_for(agrees, 15, interval=0, what="the coordinator's assignment to match the clients'")


@pytest.fixture
def members(kafka: BrokerProcess, topic_name: str) -> Iterator[Any]:
    created: list[Members] = []

    def make(strategy: str = "range") -> Members:
        create_topic(kafka, topic_name, PARTITIONS)
        m = Members(kafka, "g-" + topic_name, topic_name, OwnershipLog(partitions_of(topic_name)), strategy)
        created.append(m)
        return m

    yield make
    for m in created:
        m.close_all()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_members_own_every_partition_once_and_take_over_on_leave(
        kafka: BrokerProcess, members: Any, strategy: str) -> None:
    g: Members = members(strategy)
    produce(kafka, g.topic, 20)
    for name in ("c0", "c1", "c2"):
        g.add(name)
    owned = g.log.wait_settled(["c0", "c1", "c2"], pump=g.pump)
    assert sorted(len(tps) for tps in owned.values()) == [2, 2, 2], owned
    assert_broker_agrees(kafka, g.group, g.log, g.member_ids(), g.pump)

    left_at = time.monotonic()
    g.close("c0")
    owned = g.log.wait_settled(["c1", "c2"], pump=g.pump)
    assert sorted(len(tps) for tps in owned.values()) == [3, 3], owned
    assert_broker_agrees(kafka, g.group, g.log, g.member_ids(), g.pump)
    if strategy == "cooperative-sticky":
        # incremental: the survivors kept what they had and only gained c0's partitions
        for name in ("c1", "c2"):
            assert not [e for e in g.log.events_of(name, since=left_at) if e.kind == "revoke"], \
                g.log.format(g.log.events)
    g.log.check()
    assert not g.misplaced, g.misplaced
    assert g.received > 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_killed_member_partitions_move_after_session_timeout(
        kafka: BrokerProcess, members: Any, strategy: str) -> None:
    g: Members = members(strategy)
    # the child joins first, so it is the group's leader when it dies
    child = ChildConsumer("killed", g.log, consumer_conf(kafka, g.group, strategy), [g.topic])
    try:
        g.log.wait_settled(["killed"])
        g.add("c0")
        g.add("c1")
        owned = g.log.wait_settled(["c0", "c1", "killed"], pump=g.pump)
        assert owned.get("killed"), owned  # the child got its share before being killed
        assert_broker_agrees(kafka, g.group, g.log, {**g.member_ids(), "killed": child.member_id}, g.pump)
        killed_at = child.kill()
        owned = g.log.wait_settled(["c0", "c1"], timeout=SESSION_TIMEOUT_MS / 1000 + 20, pump=g.pump)
    finally:
        child.close()
    assert sorted(len(tps) for tps in owned.values()) == [3, 3], owned
    # The coordinator only notices a silent member when its session expires: its last heartbeat
    # was at most one interval before the kill.
    first_move = min(e.at for name in ("c0", "c1") for e in g.log.events_of(name, since=killed_at))
    assert first_move - killed_at >= (SESSION_TIMEOUT_MS - HEARTBEAT_MS) / 1000 - 0.5, g.log.format(g.log.events)
    assert_broker_agrees(kafka, g.group, g.log, g.member_ids(), g.pump)
    g.log.check()


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_static_member_restarts_without_rebalance(kafka: BrokerProcess, members: Any, strategy: str) -> None:
    g: Members = members(strategy)
    names = ["s0", "s1", "s2"]
    for name in names:
        g.add(name, **{"group.instance.id": "instance-" + name, "session.timeout.ms": 10000})
    g.log.wait_settled(names, pump=g.pump)
    assert_broker_agrees(kafka, g.group, g.log, g.member_ids(), g.pump)
    generation = g.generation("s0")
    assert {g.generation(n) for n in names} == {generation}

    # a follower, then the first member (the leader) restarts within its session timeout
    for restarted in ("s2", "s0"):
        before = describe_group(kafka.port, g.group)
        by_instance = {m.group_instance_id: m for m in before.members}
        owned_before = g.log.owned_by(restarted)
        others = [n for n in g.consumers if n != restarted]
        since = time.monotonic()
        g.close(restarted)  # a static member does not leave the group on close()
        new_name = restarted + "'"
        g.add(new_name, **{"group.instance.id": "instance-" + restarted, "session.timeout.ms": 10000})
        g.pump_until(partial(lambda name, tps: g.log.owned_by(name) == tps, new_name, owned_before), 15,
                     "the restarted member to get its partitions back")
        g.pump_for(3 * HEARTBEAT_MS / 1000)  # long enough for the others to hear of a rebalance
        for other in others:
            assert not g.log.events_of(other, since=since), g.log.format(g.log.events)
            assert g.generation(other) == generation
        assert g.generation(new_name) == generation

        after = describe_group(kafka.port, g.group)
        assert after.group_state == "Stable"
        after_by_instance = {m.group_instance_id: m for m in after.members}
        assert after_by_instance.keys() == by_instance.keys()
        for instance, m in after_by_instance.items():
            assert bytes(m.member_assignment) == bytes(by_instance[instance].member_assignment)
            # only the restarted instance has a new member id
            assert (m.member_id != by_instance[instance].member_id) == (instance == "instance-" + restarted)
        names = [n if n != restarted else new_name for n in names]
    g.log.check()


def test_commit_with_stale_generation_is_rejected(kafka: BrokerProcess, members: Any) -> None:
    g: Members = members()
    tp = (g.topic, 0)
    g.add("a")
    g.log.wait_settled(["a"], pump=g.pump)
    old_generation, member_id = librdkafka_group_metadata(g.consumers["a"].consumer_group_metadata())
    assert member_id == g.consumers["a"].memberid()
    assert raw_commit(kafka.port, g.group, old_generation, member_id, tp, 1) == ErrorCode.NONE

    g.add("b")  # a rebalance: a new generation
    g.log.wait_settled(["a", "b"], pump=g.pump)
    generation, same_member = librdkafka_group_metadata(g.consumers["a"].consumer_group_metadata())
    assert same_member == member_id and generation > old_generation
    assert raw_commit(kafka.port, g.group, old_generation, member_id, tp, 2) == ErrorCode.ILLEGAL_GENERATION
    assert raw_commit(kafka.port, g.group, generation, "not-a-member", tp, 2) == ErrorCode.UNKNOWN_MEMBER_ID
    assert raw_commit(kafka.port, g.group, -1, "", tp, 2) == ErrorCode.UNKNOWN_MEMBER_ID  # not while it runs
    committed = g.consumers["a"].committed([TopicPartition(*tp)], timeout=10)
    assert committed[0].offset == 1  # the rejected commits changed nothing

    # the member's own commit, at its current generation, goes through and can be read back
    g.consumers["a"].commit(offsets=[TopicPartition(tp[0], tp[1], 5)], asynchronous=False)
    assert g.consumers["b"].committed([TopicPartition(*tp)], timeout=10)[0].offset == 5
    assert raw_commit(kafka.port, g.group, generation, member_id, tp, 6) == ErrorCode.NONE
    assert g.consumers["b"].committed([TopicPartition(*tp)], timeout=10)[0].offset == 6


def test_initial_rebalance_delay_gathers_members_into_one_generation(tmp_path: Path) -> None:
    """At Kafka's default group.initial.rebalance.delay.ms (3 s) members that join a new group
    together get their partitions in its first generation, without revocations."""
    broker = BrokerProcess(tmp_path / "data", overrides={"group.initial.rebalance.delay.ms": "3000"}).start()
    try:
        topic = "delayed"
        create_topic(broker, topic, PARTITIONS)
        g = Members(broker, "delayed-group", topic, OwnershipLog(partitions_of(topic)))
        try:
            for name in ("d0", "d1", "d2"):
                g.add(name)
            owned = g.log.wait_settled(["d0", "d1", "d2"], pump=g.pump)
            assert sorted(len(tps) for tps in owned.values()) == [2, 2, 2]
            for name in ("d0", "d1", "d2"):
                assert [e.kind for e in g.log.events_of(name)] == ["assign"], g.log.format(g.log.events)
                assert g.generation(name) == 1
        finally:
            g.close_all()
    finally:
        assert broker.stop() == 0
