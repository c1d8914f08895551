"""KIP-848 consumer groups with confluent-kafka (librdkafka 2.16, `group.protocol=consumer`).

Members run in child processes (tests.compat.group_checker.ChildConsumer) so one can be killed
with SIGKILL; every assign/revoke callback is recorded as an ownership interval and the
checker fails if a partition was ever owned by two members at once. The broker runs with a
short heartbeat interval and session timeout so that rebalances and crash detection are quick
(Kafka's defaults stay the defaults).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupType, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.compat.conftest import create_topic
from tests.compat.group_checker import ChildConsumer, OwnershipLog
from tests.harness import BrokerProcess, wait_for

BROKER_OVERRIDES = {
    "group.consumer.heartbeat.interval.ms": "500",
    "group.consumer.session.timeout.ms": "4000",
    "group.consumer.regex.refresh.interval.ms": "1000",
}


def conf(kafka: BrokerProcess, group_id: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": kafka.bootstrap, "group.id": group_id, "group.protocol": "consumer",
            "auto.offset.reset": "earliest", **extra}


@pytest.fixture
def group_id() -> str:
    return "kip848-" + uuid.uuid4().hex[:10]


@pytest.fixture
def children() -> Iterator[list[ChildConsumer]]:
    started: list[ChildConsumer] = []
    yield started
    for child in started:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait(10)


def settle(log: OwnershipLog, members: Any, timeout: float = 30.0) -> dict[str, set[Any]]:
    """Wait until every partition has one owner among `members` and the loads are balanced (a
    rebalance in progress can cover every partition on its way, unevenly); checks the history."""
    names = list(members)

    def balanced() -> bool:
        if not log.settled(names):
            return False
        loads = [len(ps) for ps in log.assignment().values()]
        return len(loads) == min(len(names), len(log.partitions)) and max(loads) - min(loads) <= 1

    try:
        wait_for(balanced, timeout, what="a balanced assignment")
    except TimeoutError:
        raise AssertionError("not balanced: %s\nevents:\n%s" % (log.assignment(), log.format(log.events))) from None
    log.check()
    return log.assignment()


def start(children: list[ChildConsumer], name: str, log: OwnershipLog, config: dict[str, Any],
          topics: list[str]) -> ChildConsumer:
    child = ChildConsumer(name, log, config, topics)
    children.append(child)
    return child


def test_members_join_leave_and_crash(kafka: BrokerProcess, topic_name: str, group_id: str,
                                      children: list[ChildConsumer]) -> None:
    create_topic(kafka, topic_name, 10)
    log = OwnershipLog((topic_name, p) for p in range(10))
    config = conf(kafka, group_id)
    members = {}
    for i in range(5):  # one by one: 1, 2, ... 5 members
        name = "m%d" % i
        members[name] = start(children, name, log, config, [topic_name])
        settle(log, members)
    assert members.pop("m4").close() == 0  # leaves the group
    settle(log, members)
    members.pop("m1").kill()  # crashes: its partitions move once its session expires
    settle(log, members)
    assert members.pop("m0").close() == 0
    assignment = settle(log, members)
    assert sorted(len(ps) for ps in assignment.values()) == [5, 5]
    for child in members.values():
        assert child.close() == 0
    log.check()


def test_five_members_at_once(kafka: BrokerProcess, topic_name: str, group_id: str,
                              children: list[ChildConsumer]) -> None:
    create_topic(kafka, topic_name, 10)
    log = OwnershipLog((topic_name, p) for p in range(10))
    config = conf(kafka, group_id)
    members = [ChildConsumer("m%d" % i, log, config, [topic_name]) for i in range(5)]
    children.extend(members)
    assignment = settle(log, ["m%d" % i for i in range(5)])
    assert sorted(len(ps) for ps in assignment.values()) == [2, 2, 2, 2, 2]
    for child in members:
        assert child.close() == 0
    log.check()


def test_regex_subscription_picks_up_a_topic_created_later(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                           children: list[ChildConsumer]) -> None:
    first, later = topic_name + "-rx-a", topic_name + "-rx-b"
    create_topic(kafka, first, 2)
    create_topic(kafka, topic_name + "-other", 2)
    log = OwnershipLog([(first, 0), (first, 1), (later, 0), (later, 1), (later, 2)])
    config = conf(kafka, group_id)
    a = start(children, "a", log, config, ["^" + topic_name.replace(".", "\\.") + "-rx-.*"])
    wait_for(lambda: len(log.owned_by("a")) == 2, 20, what="the first topic assigned")
    create_topic(kafka, later, 3)
    settle(log, ["a"])
    assert a.close() == 0
    log.check()


def test_create_partitions_leads_to_a_new_assignment(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                     children: list[ChildConsumer]) -> None:
    create_topic(kafka, topic_name, 2)
    config = conf(kafka, group_id)
    before = OwnershipLog((topic_name, p) for p in range(2))
    after = OwnershipLog((topic_name, p) for p in range(6))

    class Both:  # one ChildConsumer feeds two logs: the partition sets before and after
        def assigned(self, *args: Any) -> None:
            before.assigned(*args) if all(tp in before.partitions for tp in args[1]) else None
            after.assigned(*args)

        def revoked(self, *args: Any) -> None:
            before.revoked(*args)
            after.revoked(*args)

        def gone(self, *args: Any) -> None:
            before.gone(*args)
            after.gone(*args)

    both: Any = Both()
    members = [start(children, n, both, config, [topic_name]) for n in ("a", "b")]
    settle(before, ["a", "b"])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_partitions([NewPartitions(topic_name, 6)])[topic_name].result(20)
    assignment = settle(after, ["a", "b"])
    assert sorted(len(ps) for ps in assignment.values()) == [3, 3]
    for child in members:
        assert child.close() == 0
    after.check()


def test_static_member_restarts_and_keeps_its_partitions(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                         children: list[ChildConsumer]) -> None:
    create_topic(kafka, topic_name, 6)
    log = OwnershipLog((topic_name, p) for p in range(6))
    members = {n: start(children, n, log, conf(kafka, group_id, **{"group.instance.id": "inst-" + n}), [topic_name])
               for n in ("a", "b", "c")}
    assignment = settle(log, members)
    mine = assignment["a"]
    assert members["a"].close() == 0  # a static member leaves for a while (epoch -2)
    # The coordinator keeps its partitions for it: nobody else can get them meanwhile.
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    described = admin.describe_consumer_groups([group_id])[group_id].result(20)
    [away] = [m for m in described.members if m.group_instance_id == "inst-a"]
    assert {(tp.topic, tp.partition) for tp in away.assignment.topic_partitions} == mine
    assert not (log.owned_by("b") | log.owned_by("c")) & mine
    restarted = start(children, "a2", log, conf(kafka, group_id, **{"group.instance.id": "inst-a"}), [topic_name])
    assignment = settle(log, ["a2", "b", "c"])
    assert assignment["a2"] == mine
    for child in (restarted, members["b"], members["c"]):
        child.close()
    log.check()


def test_commit_fetch_and_describe(kafka: BrokerProcess, topic_name: str, group_id: str) -> None:
    create_topic(kafka, topic_name, 3)
    consumer = Consumer(conf(kafka, group_id, **{"enable.auto.commit": False, "client.id": "kip848-client"}))
    try:
        consumer.subscribe([topic_name])
        wait_for(lambda: consumer.poll(0.05) is None and len(consumer.assignment()) == 3, 20,
                 interval=0, what="assignment")
        consumer.commit(offsets=[TopicPartition(topic_name, 1, 42)], asynchronous=False)  # OffsetCommit v9
        committed = consumer.committed([TopicPartition(topic_name, 1)], timeout=10)
        assert committed[0].offset == 42

        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        description = admin.describe_consumer_groups([group_id])[group_id].result(20)
        assert description.type == ConsumerGroupType.CONSUMER
        assert description.state == ConsumerGroupState.STABLE
        assert description.partition_assignor == "uniform"
        [member] = description.members
        assert member.client_id == "kip848-client"
        assert sorted(tp.partition for tp in member.assignment.topic_partitions) == [0, 1, 2]
        listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(20)
        assert group_id in {g.group_id for g in listed.valid}
        assert group_id not in {g.group_id for g in admin.list_consumer_groups(
            types={ConsumerGroupType.CLASSIC}).result(20).valid}
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.delete_consumer_groups([group_id])[group_id].result(20)  # empty now: it can go
    # Not a consumer group any more: librdkafka falls back to DescribeGroups, which reports Dead.
    gone = admin.describe_consumer_groups([group_id])[group_id].result(20)
    assert (gone.state, gone.members) == (ConsumerGroupState.DEAD, [])


def test_mixed_classic_and_consumer_members(kafka: BrokerProcess, topic_name: str, group_id: str,
                                            children: list[ChildConsumer]) -> None:
    """Classic members form the group; a consumer-protocol member joins (online upgrade: the
    classic members are served by the consumer group) and leaves again (downgrade)."""
    create_topic(kafka, topic_name, 6)
    log = OwnershipLog((topic_name, p) for p in range(6))
    classic_conf = {"bootstrap.servers": kafka.bootstrap, "group.id": group_id, "group.protocol": "classic",
                    "session.timeout.ms": 6000, "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"}
    members = {n: start(children, n, log, classic_conf, [topic_name]) for n in ("k1", "k2")}
    settle(log, members)
    members["c1"] = start(children, "c1", log, conf(kafka, group_id), [topic_name])
    settle(log, members)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    description = admin.describe_consumer_groups([group_id])[group_id].result(20)
    assert description.type == ConsumerGroupType.CONSUMER and len(description.members) == 3
    assert members.pop("c1").close() == 0  # the last consumer-protocol member: back to a classic group
    settle(log, members)
    description = admin.describe_consumer_groups([group_id])[group_id].result(20)
    assert description.type == ConsumerGroupType.CLASSIC
    for child in members.values():
        assert child.close() == 0
    log.check()


def test_literal_topics_are_assigned_before_the_regex_topics(kafka: BrokerProcess, topic_name: str,
                                                              group_id: str) -> None:
    """Kafka resolves a regex asynchronously, after the heartbeat's answer: a consumer subscribed
    to a literal topic and a new regex gets the literal topic's partitions first, the regex's at a
    later heartbeat. (Here a new group's first assignment waits for its initial delay; the regex
    is resolved at the first heartbeat after it, never before: the order is deterministic.)"""
    literal, matched = topic_name + "-lit", topic_name + "-rxo-1"
    create_topic(kafka, literal, 2)
    create_topic(kafka, matched, 2)
    assigned: list[set[str]] = []
    c = Consumer(conf(kafka, group_id))
    c.subscribe([literal, "^" + topic_name + "-rxo-.*"],
                on_assign=lambda _c, parts: assigned.append({p.topic for p in parts}))
    try:
        wait_for(lambda: (c.poll(0.1), {t for a in assigned for t in a} == {literal, matched})[1], timeout=30,
                 what="both topics assigned")
        assert assigned[0] == {literal}, assigned
    finally:
        c.close()
