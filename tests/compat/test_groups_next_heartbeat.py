"""What a client asks next is never delayed by a heartbeat the broker holds (issue 25).

librdkafka keeps one group heartbeat in flight per member: while one is parked on the broker, the
next one - carrying a new subscription, an acknowledged revocation, a leave - cannot be sent.
Kafka answers every heartbeat at once, and so does this broker with its default settings (no
BROKER_OVERRIDES here: `group.heartbeat.hold.ms` and the heartbeat intervals are the defaults).
Each test replays what a client's own integration suite does:

- confluent-kafka-python's share suite, `test_resubscribe_to_different_topic`;
- librdkafka's 0113-cooperative_rebalance in KIP-848 mode (`group.protocol=consumer`),
  `u_multiple_subscription_changes` and `x_incremental_rebalances`;
- the same test in classic mode, `v_commit_during_rebalance` (a commit inside the revocation
  callback).

confluent-kafka always installs a rebalance callback that runs in poll(), so where librdkafka's C
test leaves a consumer alone (its rebalances then run inside librdkafka) these tests keep polling
every consumer.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from tests.compat.conftest import create_topic
from tests.harness import BrokerProcess


@pytest.fixture
def group_id() -> str:
    return "next-hb-" + uuid.uuid4().hex[:10]


def produce(kafka: BrokerProcess, records: Sequence[tuple[str, int | None, bytes]]) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for topic, partition, value in records:
        if partition is None:
            p.produce(topic, value=value)
        else:
            p.produce(topic, value=value, partition=partition)
    assert p.flush(10) == 0


# ----- share groups: confluent-kafka-python's test_resubscribe_to_different_topic ------------------
def drain(sc: ShareConsumer, want: int, timeout: float = 20.0) -> list[Any]:
    """What arrives until `want` records or the timeout (the suite's drain_share_consumers)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got.extend(m for m in sc.poll(0.5) if m.error() is None)
    return got


def test_share_consumer_resubscribed_to_another_topic_gets_only_that_topic(
        kafka: BrokerProcess, topic_name: str, group_id: str, closing: list[Any]) -> None:
    topic_a, topic_b = topic_name + "-a", topic_name + "-b"
    create_topic(kafka, topic_a)
    create_topic(kafka, topic_b)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group_id, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)
    sc = ShareConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": group_id})
    closing.append(sc)
    sc.subscribe([topic_a])
    produce(kafka, [(topic_a, None, b"a-pre-%d" % i) for i in range(3)])
    first = drain(sc, 3)
    assert [m.topic() for m in first] == [topic_a] * 3

    sc.subscribe([topic_b])
    for _ in range(10):  # the suite's 2 s for the new subscription to reach the coordinator
        sc.poll(0.2)
    produce(kafka, [r for i in range(5) for r in ((topic_a, None, b"a-post-%d" % i), (topic_b, None, b"b-%d" % i))])
    received = drain(sc, 5)
    assert {m.topic() for m in received} == {topic_b}
    assert len(received) == 5


# ----- KIP-848: librdkafka 0113 x_incremental_rebalances ---------------------------------------
def consumer_conf(kafka: BrokerProcess, group_id: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": kafka.bootstrap, "group.id": group_id, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, **extra}


def poll_all(consumers: Sequence[Consumer], seconds: float, on_message: Any = None) -> None:
    """Poll every consumer in turn, each until it has nothing for 10 ms, for `seconds` (0113's
    poll_all_consumers)."""
    deadline = time.monotonic() + seconds
    while True:
        for c in consumers:
            while messages := c.consume(500, 0.01):
                for msg in messages:
                    if msg.error() is None and on_message is not None:
                        on_message(c, msg)
        if time.monotonic() >= deadline:
            return


def partitions_of(c: Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def wait_assignment(consumers: Sequence[Consumer], c: Consumer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not c.assignment():
        assert time.monotonic() < deadline, "no assignment within %.0f s" % timeout
        poll_all(consumers, 0.1)


def test_kip848_incremental_rebalances_keep_partitions_sticky(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                              closing: list[Any]) -> None:
    create_topic(kafka, topic_name, 6)
    c = [Consumer(consumer_conf(kafka, group_id, **{"group.protocol": "consumer", "client.id": "consumer%d" % i}))
         for i in range(3)]
    closing.extend(c)
    c[0].subscribe([topic_name])
    wait_assignment(c[:1], c[0])
    assert partitions_of(c[0]) == {0, 1, 2, 3, 4, 5}

    c[1].subscribe([topic_name])
    wait_assignment(c[:2], c[1])
    poll_all(c[:2], 3.0)  # 0113: rd_sleep(3), then the assignment must have settled
    assert (partitions_of(c[0]), partitions_of(c[1])) == ({0, 1, 2}, {3, 4, 5})

    c[2].subscribe([topic_name])
    wait_assignment(c, c[2])
    poll_all(c, 3.0)
    assert [partitions_of(x) for x in c] == [{0, 1}, {3, 4}, {2, 5}]


# ----- KIP-848: librdkafka 0113 u_multiple_subscription_changes --------------------------------
N_CONSUMERS = 8
PARTS_PER_TOPIC = N_CONSUMERS * 2
MSGS_PER_PARTITION = 1000


class Counting:
    """0113's DefaultRebalanceCb: assignments and records counted per partition since assigned."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}
        self.last_assign = 0.0

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        self.last_assign = time.monotonic()
        for tp in partitions:
            self.counts[(tp.topic, tp.partition)] = 0

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_unassign(partitions)
        for tp in partitions:
            self.counts.pop((tp.topic, tp.partition), None)

    def on_message(self, msg: Any) -> None:
        key = (msg.topic(), msg.partition())
        self.counts[key] = self.counts.get(key, 0) + 1


@pytest.mark.timeout(240)
def test_kip848_many_subscription_changes_settle(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                 closing: list[Any]) -> None:
    """0113's playbook (its subscription variation 1: the second subscription is the other topic):
    eight consumers change their subscriptions 27 times in 15 s; once the group settled, each
    owns its share of the topics it subscribes to and has read every record of its partitions.
    (On main the C test hung when it destroyed its consumers without closing them, which
    confluent-kafka cannot do: it destroys a consumer without the consumer close.)"""
    topics = [topic_name + "-1", topic_name + "-2"]
    for t in topics:
        create_topic(kafka, t, PARTS_PER_TOPIC)
    produce(kafka, [(t, p, b"x") for t in topics for p in range(PARTS_PER_TOPIC) for _ in range(MSGS_PER_PARTITION)])
    sub1 = [topics[0]]
    sub2 = [topics[1]]
    playbook = [(0, 0, sub1), (4000, 1, sub1), (4000, 1, sub1), (4000, 1, sub1), (4000, 2, sub1),
                (6000, 3, sub1), (6000, 4, sub1), (6000, 5, sub1), (6000, 6, sub1), (6000, 7, sub2),
                (6000, 1, sub1), (6000, 1, sub2), (6000, 1, sub1), (6000, 2, sub2), (7000, 2, sub1),
                (7000, 1, sub2), (8000, 0, sub2), (8000, 1, sub1), (8000, 0, sub1), (13000, 2, sub1),
                (13000, 1, sub2), (13000, 5, sub2), (14000, 6, sub2), (15000, 7, sub1), (15000, 1, sub1),
                (15000, 5, sub1), (15000, 6, sub1)]
    callbacks = [Counting() for _ in range(N_CONSUMERS)]
    consumers = [Consumer(consumer_conf(kafka, group_id, **{"group.protocol": "consumer", "client.id": "C_%d" % i}))
                 for i in range(N_CONSUMERS)]
    closing.extend(consumers)
    by_consumer = {id(c): cb for c, cb in zip(consumers, callbacks, strict=True)}
    subscribed: dict[int, list[str]] = {i: [] for i in range(N_CONSUMERS)}

    def count(c: Consumer, msg: Any) -> None:
        by_consumer[id(c)].on_message(msg)

    start = time.monotonic()
    for at_ms, i, sub in playbook:
        poll_all(consumers, start + at_ms / 1000 - time.monotonic(), count)
        subscribed[i] = list(sub)
        if sub:
            consumers[i].subscribe(sub, on_assign=callbacks[i].on_assign, on_revoke=callbacks[i].on_revoke)
        else:
            consumers[i].unsubscribe()

    def expected(i: int) -> int:
        return sum(PARTS_PER_TOPIC // sum(t in s for s in subscribed.values()) for t in subscribed[i])

    # 0113: at least 20 s for the group to settle, then two rounds of 5 s that agree
    settle_until = time.monotonic() + 20
    done = 0
    while done < 2:
        assert time.monotonic() < settle_until + 120, "the group did not settle: %s" % [
            (len(c.assignment()), expected(i)) for i, c in enumerate(consumers)]
        poll_all(consumers, 5.0, count)
        owners: dict[tuple[str, int], int] = {}
        ok = True
        for i, c in enumerate(consumers):
            for tp in c.assignment():
                assert (tp.topic, tp.partition) not in owners, "%s owned twice" % tp
                owners[(tp.topic, tp.partition)] = i
                if done > 0:
                    assert callbacks[i].counts.get((tp.topic, tp.partition)) == MSGS_PER_PARTITION, (i, tp)
            ok = ok and len(c.assignment()) == expected(i)
        if ok and time.monotonic() > settle_until:
            done += 1
    # 0113 disposes of the consumers (each leaves the group with a last heartbeat)
    started = time.monotonic()
    for c in consumers:
        c.close()
        closing.remove(c)
    assert time.monotonic() - started < 10, "closing took %.1f s" % (time.monotonic() - started)


# ----- classic: librdkafka 0113 v_commit_during_rebalance --------------------------------------
class SlowHandler(logging.Handler):
    """0113's v_log_cb: 1 ms a log line slows the client's threads down, as in the C test."""

    def emit(self, record: logging.LogRecord) -> None:
        time.sleep(0.001)


def test_classic_commit_in_the_revocation_callback_is_accepted(kafka: BrokerProcess, topic_name: str,
                                                               group_id: str, closing: list[Any]) -> None:
    """A cooperative-sticky member commits synchronously in its revocation callback, 2 s in: the
    group is stable at its new generation then (the member learned of the rebalance at its
    heartbeat), so the commit succeeds (or finds nothing to commit)."""
    create_topic(kafka, topic_name, 6)
    produce(kafka, [(topic_name, p, b"m%d" % i) for p in range(6) for i in range(100)])
    errors: list[Any] = []

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)

    def on_revoke(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        time.sleep(2)  # 0113: "enough to have the generation-id bumped by rejoin"
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:
            code = exc.args[0].code()
            if code not in (KafkaError._NO_OFFSET, KafkaError.ILLEGAL_GENERATION, KafkaError._DESTROY):
                errors.append(exc.args[0])
        consumer.incremental_unassign(partitions)

    def on_commit(err: Any, _partitions: Any) -> None:
        if err is not None and err.code() not in (KafkaError._NO_OFFSET, KafkaError.ILLEGAL_GENERATION,
                                                   KafkaError._DESTROY):
            errors.append(err)

    round_trips: list[tuple[float, int]] = []  # (when, longest coordinator round trip in µs)

    def on_stats(text: str) -> None:
        for name, b in json.loads(text)["brokers"].items():
            if name.startswith("GroupCoordinator") and b["rtt"]["cnt"]:
                round_trips.append((time.monotonic(), b["rtt"]["max"]))

    slow = logging.getLogger("v_commit_during_rebalance")
    slow.addHandler(SlowHandler())
    slow.propagate = False
    conf = consumer_conf(kafka, group_id, **{"partition.assignment.strategy": "cooperative-sticky",
                                             "session.timeout.ms": 6000, "on_commit": on_commit,
                                             "statistics.interval.ms": 500, "stats_cb": on_stats,
                                             "debug": "consumer,cgrp,topic,fetch", "logger": slow})
    c1, c2 = Consumer(conf), Consumer(conf)
    closing.extend([c1, c2])
    c1.subscribe([topic_name], on_assign=on_assign, on_revoke=on_revoke)
    read = 0
    deadline = time.monotonic() + 30
    while read < 50:
        assert time.monotonic() < deadline, "c1 read %d records" % read
        msg = c1.poll(0.2)
        read += msg is not None and msg.error() is None
    c2.subscribe([topic_name], on_assign=on_assign, on_revoke=on_revoke)
    for _ in range(10):
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the consumers stopped receiving"
            m1, m2 = c1.poll(1.0), c2.poll(1.0)
            if m1 is not None and m1.error() is None:
                try:
                    c1.commit(asynchronous=False)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.ILLEGAL_GENERATION:
                        errors.append(exc.args[0])
            if m1 is not None and m2 is not None:
                break
    # The group is stable: the members' heartbeats (every 3 s) are answered at once. A heartbeat
    # the broker held would tell c2 of c1's leave below at once, c2 would rejoin while it starts
    # closing, and its commit in the callback would find the group in CompletingRebalance with c2's
    # new generation: REBALANCE_IN_PROGRESS (the C test's slow log callback widens that window;
    # here what opens it is checked: the coordinator's round trips, librdkafka's statistics).
    quiet = time.monotonic()
    while time.monotonic() < quiet + 6.5:
        c1.poll(0.1)
        c2.poll(0.1)
    longest = max((rtt for at, rtt in round_trips if at > quiet + 0.5), default=0)
    assert longest < 1_000_000, "a coordinator request took %.1f s" % (longest / 1e6)
    # Closing: c1 leaves the group; c2, revoking everything, commits 2 s into its callback.
    c1.close()
    c2.close()
    assert not errors, errors
