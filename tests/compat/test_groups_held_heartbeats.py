"""Real clients against held heartbeats (group.heartbeat.hold.ms, off by default and turned on
here), with holds far longer than anything the tests wait for: a heartbeat is held for up to a third of a 45 s session (classic)
or all but a second of a 30 s heartbeat interval (consumer protocol).

Members learn of a rebalance as soon as it starts (a join, a leave): were that broken, the
rebalances here would wait for the next heartbeat, long after the bounded waits give up. The
clients commit and close as usual. (That a request behind a held heartbeat releases it is shown
deterministically with raw frames in tests/integration/test_groups_held_heartbeat.py: librdkafka
fetches the committed offsets right after an assignment, which releases the heartbeat then.)
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from kafka import KafkaConsumer  # noqa: E402
from kafka import TopicPartition as KafkaTopicPartition  # noqa: E402
from kafka.structs import OffsetAndMetadata  # noqa: E402

from tests.compat.conftest import create_topic  # noqa: E402
from tests.compat.group_checker import OwnershipLog  # noqa: E402
from tests.harness import BrokerProcess, wait_for  # noqa: E402

BROKER_OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "group.heartbeat.hold.ms": "600000",
    "group.consumer.heartbeat.interval.ms": "30000",
}
PARTITIONS = 4
MESSAGES = 40
COMMITS = 10


def produce(kafka: BrokerProcess, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(MESSAGES):
        producer.produce(topic, b"v%d" % i, partition=i % PARTITIONS)
    assert producer.flush(30) == 0


class Member:
    """A confluent-kafka consumer whose assignments go to the ownership log."""

    def __init__(self, name: str, log: OwnershipLog, conf: dict[str, Any], topic: str) -> None:
        self.name = name
        self.log = log
        self.consumer = Consumer(conf)
        self.received = 0
        self.consumer.subscribe(
            [topic],
            on_assign=lambda _c, ps: log.assigned(name, [(p.topic, p.partition) for p in ps]),
            on_revoke=lambda _c, ps: log.revoked(name, [(p.topic, p.partition) for p in ps]),
            on_lost=lambda _c, ps: log.revoked(name, [(p.topic, p.partition) for p in ps]))

    def poll(self) -> None:
        msg = self.consumer.poll(0.02)
        if msg is not None:
            assert msg.error() is None, msg.error()
            self.received += 1

    def close(self) -> None:
        self.consumer.close()
        self.log.gone(self.name)


def pump_until(members: list[Member], predicate: Any, what: str, timeout: float = 20.0) -> None:
    def done() -> bool:
        for m in members:
            m.poll()
        return bool(predicate())

    wait_for(done, timeout, interval=0, what=what)


def commit_many(member: Member, topic: str) -> None:
    partition = sorted(p for _, p in member.log.owned_by(member.name))[0]
    for i in range(COMMITS):
        member.consumer.commit(offsets=[TopicPartition(topic, partition, i + 1)], asynchronous=False)
    committed = member.consumer.committed([TopicPartition(topic, partition)], timeout=10)
    assert committed[0].offset == COMMITS


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_confluent_members_rebalance_commit_and_close_while_heartbeats_are_held(
        kafka: BrokerProcess, topic_name: str, protocol: str) -> None:
    create_topic(kafka, topic_name, PARTITIONS)
    produce(kafka, topic_name)
    group = "held-%s-%s" % (protocol, uuid.uuid4().hex[:8])
    conf: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap, "group.id": group, "group.protocol": protocol,
                            "auto.offset.reset": "earliest", "enable.auto.commit": False}
    if protocol == "classic":
        conf.update({"session.timeout.ms": 45000, "heartbeat.interval.ms": 3000})
    log = OwnershipLog([(topic_name, p) for p in range(PARTITIONS)])
    a = Member("a", log, dict(conf), topic_name)
    pump_until([a], lambda: log.settled(["a"]) and a.received == MESSAGES, "a owns and reads everything")

    b = Member("b", log, dict(conf), topic_name)  # a's held heartbeat learns of the rebalance
    pump_until([a, b], lambda: log.settled(["a", "b"]) and all(log.owned_by(m) for m in "ab"), "a and b share")
    # A member's heartbeat released by a request behind it is held again only from its next
    # heartbeat on, an interval later: b commits, a, which must learn that b leaves, does not.
    commit_many(b, topic_name)
    b.close()  # its LeaveGroup (or leaving heartbeat) goes out behind a held heartbeat too
    pump_until([a], lambda: log.settled(["a"]), "a takes b's partitions back")
    log.check()
    a.close()


def test_kafka_python_commits_behind_held_heartbeats(kafka: BrokerProcess, topic_name: str) -> None:
    """kafka-python sends its heartbeats, fetches and commits on one connection."""
    create_topic(kafka, topic_name, PARTITIONS)
    produce(kafka, topic_name)
    consumer = KafkaConsumer(
        topic_name, bootstrap_servers=kafka.bootstrap, group_id="held-kp-" + uuid.uuid4().hex[:8],
        enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=45000,
        heartbeat_interval_ms=3000, fetch_max_wait_ms=200, request_timeout_ms=60000)
    try:
        received = 0

        def read() -> bool:
            nonlocal received
            received += sum(len(r) for r in consumer.poll(timeout_ms=1000).values())
            return received == MESSAGES

        wait_for(read, 30, interval=0, what="every message")
        tp = KafkaTopicPartition(topic_name, 0)
        for i in range(COMMITS):
            consumer.commit({tp: OffsetAndMetadata(i + 1, "", -1)})
        assert consumer.committed(tp) == COMMITS
    finally:
        consumer.close()
