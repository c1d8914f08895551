"""A KIP-848 heartbeat that brings a change from the client is answered at once (as Kafka answers
every heartbeat), however long the coordinator may hold one that brings nothing new.

The broker holds a heartbeat with nothing new for up to 10 s (`group.heartbeat.hold.ms`) and
tells the clients a 30 s interval, so that a held heartbeat is never answered by its deadline
within the test's bounded waits. librdkafka sends the new subscription in the heartbeat after
`subscribe()` (rd_kafka_cgrp_consumer_group_heartbeat: only when it changed, or was set again);
its `debug=cgrp` log shows when that heartbeat goes out and when its response comes back. Were
such a heartbeat held, its response would come only at the 10 s deadline: the waits for it give
up after 8 s.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess, wait_for  # noqa: E402

HOLD_MS = 10000
BROKER_OVERRIDES = {
    "group.heartbeat.hold.ms": str(HOLD_MS),
    "group.consumer.heartbeat.interval.ms": "30000",
}
ANSWERED_WITHIN_S = 8.0  # well before the hold's deadline
SENT = "ConsumerGroupHeartbeat of member"
ANSWERED = "ConsumerGroupHeartbeat response received"


class CgrpLog:
    """librdkafka's cgrp debug lines, in order (the logger runs on librdkafka's threads)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def log(self, level: int, fmt: str, *args: Any) -> None:
        with self.lock:
            self.lines.append(fmt % args if args else fmt)

    def since(self, mark: int) -> list[str]:
        with self.lock:
            return self.lines[mark:]

    def mark(self) -> int:
        with self.lock:
            return len(self.lines)

    def in_flight(self) -> bool:
        lines = self.since(0)
        return sum(SENT in line for line in lines) > sum(ANSWERED in line for line in lines)


def answered_after(log: CgrpLog, mark: int, sent_marker: str) -> bool:
    """Whether the heartbeat sent after `mark` whose line holds `sent_marker` got its response."""
    lines = log.since(mark)
    sent = next((i for i, line in enumerate(lines) if SENT in line and sent_marker in line), None)
    return sent is not None and any(ANSWERED in line for line in lines[sent + 1:])


def pump(consumer: Any, predicate: Any, what: str, timeout: float) -> None:
    def done() -> bool:
        consumer.poll(0.05)
        return bool(predicate())

    wait_for(done, timeout, interval=0, what=what)


@pytest.mark.timeout(120)
def test_confluent_subscription_changes_are_answered_at_once(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 2)
    log = CgrpLog()
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "hbchange-" + uuid.uuid4().hex[:8],
                         "group.protocol": "consumer", "enable.auto.commit": False, "debug": "cgrp",
                         "logger": log})
    assigned: list[Any] = []
    try:
        consumer.subscribe([topic_name], on_assign=lambda _c, ps: assigned.extend(ps))
        pump(consumer, lambda: len(assigned) == 2, "the assignment", 30)
        # Its acknowledgement (nothing new) is held: a commit on the coordinator's connection
        # releases it, asking the member back within 500 ms; that heartbeat is held briefly, and
        # its answer gives the 30 s interval again: from then on, a heartbeat is held 10 s. On a
        # busy machine the commit may come before the acknowledgement is held, which then waits
        # out its hold, and so may the next heartbeat: two holds and some.
        mark = log.mark()
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 0)], asynchronous=False)
        pump(consumer, lambda: not log.in_flight() and sum(ANSWERED in line for line in log.since(mark)) >= 2,
             "the heartbeats after the commit answered", 2 * HOLD_MS / 1000 + 10)

        missing = topic_name + "-missing"
        changes = [
            ("a topic that does not exist (the assignment stays)", [topic_name, missing], "%s((null))" % missing),
            ("the same subscription again", [topic_name, missing], "%s((null))" % missing),
            ("a regex matching the same topic", ["^%s$" % topic_name], "(^%s$)" % topic_name),
        ]
        for what, subscription, marker in changes:
            mark = log.mark()
            consumer.subscribe(subscription, on_assign=lambda _c, ps: assigned.extend(ps))
            pump(consumer, lambda m=mark, k=marker: answered_after(log, m, k),
                 "the heartbeat with %s answered" % what, ANSWERED_WITHIN_S)
        pump(consumer, lambda: not log.in_flight(), "no heartbeat in flight", 20)
        mark = log.mark()
        consumer.unsubscribe()
        pump(consumer, lambda: answered_after(log, mark, "generation id -1"), "the leave answered",
             ANSWERED_WITHIN_S)
        assert consumer.assignment() == []
    finally:
        consumer.close()
