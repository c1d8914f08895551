"""Classic consumer groups with kafka-python's KafkaConsumer: members (each polling in its own
thread) share a topic's partitions with the range, roundrobin and cooperative-sticky
assignors, take over from a member that leaves, and commit and fetch offsets.

kafka-python 3.0.12 mishandles short polls while a JoinGroup is pending, so every poll here
waits at least one second.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kafka")
from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor  # noqa: E402
from kafka.coordinator.assignors.range import RangePartitionAssignor  # noqa: E402
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor  # noqa: E402
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor  # noqa: E402
from kafka.structs import OffsetAndMetadata  # noqa: E402

from protocol.errors import ErrorCode  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.compat.group_checker import TP, OwnershipLog, broker_assignment, describe_group, raw_commit  # noqa: E402
from tests.harness import BrokerProcess, wait_for  # noqa: E402

PARTITIONS = 6
POLL_MS = 1000
ASSIGNORS = {
    "range": RangePartitionAssignor,
    "roundrobin": RoundRobinPartitionAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
}


def consumer(kafka: BrokerProcess, group: str, **config: Any) -> KafkaConsumer:
    return KafkaConsumer(**{
        "bootstrap_servers": kafka.bootstrap, "group_id": group, "enable_auto_commit": False,
        "auto_offset_reset": "earliest", "session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
        "fetch_max_wait_ms": 200, "request_timeout_ms": 15000, **config,
    })


class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, name: str, log: OwnershipLog) -> None:
        self.name = name
        self.log = log

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.log.revoked(self.name, [(tp.topic, tp.partition) for tp in revoked])

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.log.assigned(self.name, [(tp.topic, tp.partition) for tp in assigned])

    def on_partitions_lost(self, lost: Any) -> None:
        self.on_partitions_revoked(lost)


class Member(threading.Thread):
    """A subscribed KafkaConsumer polling in its own thread until stopped."""

    def __init__(self, name: str, kafka: BrokerProcess, group: str, topic: str, log: OwnershipLog,
                 **config: Any) -> None:
        super().__init__(name="member-" + name, daemon=True)
        self.member_name = name
        self.log = log
        self.consumer = consumer(kafka, group, **config)
        self.consumer.subscribe([topic], listener=Listener(name, log))
        self.halt = threading.Event()
        self.misplaced: list[TP] = []
        self.received = 0
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                for tp, records in self.consumer.poll(timeout_ms=POLL_MS).items():
                    self.received += len(records)
                    if (tp.topic, tp.partition) not in self.log.owned_by(self.member_name):
                        self.misplaced.append((tp.topic, tp.partition))
        except BaseException as exc:  # reported by the test
            self.error = exc

    def generation(self) -> tuple[int, str]:
        g = self.consumer._coordinator._generation  # kafka-python internals: (generation, member id)
        return g.generation_id, g.member_id

    def close(self) -> None:
        self.halt.set()
        self.join(POLL_MS / 1000 + 10)
        self.log.gone(self.member_name)
        self.consumer.close()
        assert self.error is None, self.error


@pytest.fixture
def running() -> Iterator[list[Member]]:
    members: list[Member] = []
    yield members
    for m in members:
        if m.is_alive():
            m.close()


def produce(kafka: BrokerProcess, topic: str, count: int) -> None:
    p = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5, request_timeout_ms=15000)
    try:
        for f in [p.send(topic, value=b"%d" % i, partition=i % PARTITIONS) for i in range(count)]:
            f.get(timeout=30)
    finally:
        p.close(10)


def broker_view_matches(kafka: BrokerProcess, group: str, log: OwnershipLog) -> bool:
    """The coordinator holds the assignment the clients report (as a set of shares)."""
    if describe_group(kafka.port, group).group_state != "Stable":
        return False
    held = sorted(sorted(tps) for tps in broker_assignment(kafka.port, group).values())
    return held == sorted(sorted(tps) for tps in log.assignment().values())


@pytest.mark.parametrize("assignor", list(ASSIGNORS))
def test_members_own_every_partition_once_and_take_over_on_leave(
        kafka: BrokerProcess, topic_name: str, running: list[Member], assignor: str) -> None:
    create_topic(kafka, topic_name, PARTITIONS)
    produce(kafka, topic_name, 60)
    group = "kp-" + topic_name
    log = OwnershipLog([(topic_name, p) for p in range(PARTITIONS)])
    for name in ("k0", "k1", "k2"):
        running.append(Member(name, kafka, group, topic_name, log,
                              partition_assignment_strategy=[ASSIGNORS[assignor]]))
    owned = log.wait_settled(["k0", "k1", "k2"], timeout=45)
    assert sorted(len(tps) for tps in owned.values()) == [2, 2, 2], owned
    wait_for(lambda: broker_view_matches(kafka, group, log), 15, what="the coordinator to agree")
    old_generation, member_id = running[1].generation()

    running[0].close()
    owned = log.wait_settled(["k1", "k2"], timeout=45)
    assert sorted(len(tps) for tps in owned.values()) == [3, 3], owned
    wait_for(lambda: broker_view_matches(kafka, group, log), 15, what="the coordinator to agree")
    log.check()
    assert not any(m.misplaced for m in running), [m.misplaced for m in running]
    assert sum(m.received for m in running) > 0

    # the rebalance fenced the generation k1 had before it
    wait_for(lambda: running[1].generation()[0] > old_generation, 15, what="k1's new generation")
    generation, same_member = running[1].generation()
    assert same_member == member_id
    tp = (topic_name, 0)
    assert raw_commit(kafka.port, group, old_generation, member_id, tp, 1) == ErrorCode.ILLEGAL_GENERATION
    assert raw_commit(kafka.port, group, generation, member_id, tp, 1) == ErrorCode.NONE


def test_commit_and_fetch(kafka: BrokerProcess, topic_name: str) -> None:
    partitions = 3
    create_topic(kafka, topic_name, partitions)
    p = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5, request_timeout_ms=15000)
    try:
        for f in [p.send(topic_name, value=b"%d" % i, partition=i % partitions) for i in range(90)]:
            f.get(timeout=30)
    finally:
        p.close(10)
    group = "kp-commit-" + topic_name
    tps = [TopicPartition(topic_name, i) for i in range(partitions)]

    c = consumer(kafka, group, max_poll_records=10)
    c.subscribe([topic_name])
    try:
        first: list[bytes] = []

        def read_some() -> bool:
            first.extend(r.value for rs in c.poll(timeout_ms=POLL_MS).values() for r in rs)
            return len(first) >= 30

        wait_for(read_some, 30, what="some records")
        positions = {tp: c.position(tp) for tp in tps}
        c.commit()  # what was consumed so far
        assert {tp: c.committed(tp) for tp in tps} == positions
        c.commit({tps[0]: OffsetAndMetadata(positions[tps[0]], "checkpoint", -1)})
        stored = c.committed(tps[0], metadata=True)
        assert (stored.offset, stored.metadata) == (positions[tps[0]], "checkpoint")
    finally:
        c.close()

    # a new member of the group goes on from the committed offsets: nothing again, nothing lost
    c = consumer(kafka, group)
    c.subscribe([topic_name])
    try:
        rest: list[bytes] = []

        def read_rest() -> bool:
            rest.extend(r.value for rs in c.poll(timeout_ms=POLL_MS).values() for r in rs)
            return len(first) + len(rest) >= 90

        wait_for(read_rest, 30, what="the remaining records")
        assert sorted(first + rest) == sorted(b"%d" % i for i in range(90))
        assert not c.poll(timeout_ms=POLL_MS)  # and nothing more
    finally:
        c.close()


def test_protocol_chosen_by_vote_among_common_assignors(
        kafka: BrokerProcess, topic_name: str, running: list[Member]) -> None:
    """Members list assignors in different orders; the group uses the one every member supports
    with the most votes (each member votes for its first choice among the common ones)."""
    create_topic(kafka, topic_name, PARTITIONS)
    group = "kp-vote-" + topic_name
    log = OwnershipLog([(topic_name, p) for p in range(PARTITIONS)])
    preferences = {
        "v0": [StickyPartitionAssignor, RoundRobinPartitionAssignor, RangePartitionAssignor],
        "v1": [RoundRobinPartitionAssignor, RangePartitionAssignor],
        "v2": [RangePartitionAssignor, RoundRobinPartitionAssignor],
    }
    for name, assignors in preferences.items():
        running.append(Member(name, kafka, group, topic_name, log, partition_assignment_strategy=assignors))
    log.wait_settled(list(preferences), timeout=45)
    wait_for(lambda: broker_view_matches(kafka, group, log), 15, what="the coordinator to agree")
    assert describe_group(kafka.port, group).protocol_data == "roundrobin"
