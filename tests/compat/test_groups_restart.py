"""Groups and committed offsets survive a broker restart, clean (SIGTERM) or `kill -9`.

Two confluent-kafka members of a group read half of a topic and commit; the broker stops and
comes back on the same port and data dir. The group must come back as it was (Stable, same
members, protocol and assignments, same generation: the members' next commits are accepted
without a rejoin), a simple group's offsets too, and a new member that replaces them must
resume exactly from the committed offsets: nothing committed is delivered again, nothing is
skipped. Each test runs its own broker.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from tests.compat.conftest import create_topic  # noqa: E402
from tests.compat.group_checker import describe_group, librdkafka_group_metadata, raw_commit  # noqa: E402
from tests.harness import BrokerProcess, wait_for  # noqa: E402

PARTITIONS = 6
PER_PARTITION = 100
TOTAL = PARTITIONS * PER_PARTITION
GROUP = "restart-group"
SIMPLE_GROUP = "restart-simple"
TOPIC = "restart-topic"


def member(broker: BrokerProcess, name: str) -> Consumer:
    c = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": GROUP, "client.id": name,
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        # longer than the restart, so the clients do not give up on their membership meanwhile
        "session.timeout.ms": 15000, "heartbeat.interval.ms": 500,
        "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
    })
    c.subscribe([TOPIC])
    return c


def read(consumers: list[Consumer], into: dict[str, set[bytes]], until: Any, timeout: float = 30) -> None:
    """Poll the consumers in turn, collecting values per client, until `until()` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out reading: %s" % {k: len(v) for k, v in into.items()}
        for c in consumers:
            msg = c.poll(0.05)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            value = msg.value()
            assert value is not None
            name = c.memberid() or "?"
            assert all(value not in seen for seen in into.values()), "delivered twice: %r" % value
            into.setdefault(name, set()).add(value)


def group_snapshot(broker: BrokerProcess, group: str) -> Any:
    g = describe_group(broker.port, group)
    return (g.error_code, g.group_state, g.protocol_type, g.protocol_data, sorted(
        (m.member_id, m.group_instance_id, m.client_id, bytes(m.member_metadata), bytes(m.member_assignment))
        for m in g.members))


@pytest.mark.parametrize("how", ["clean", "kill"])
def test_group_and_offsets_survive_broker_restart(tmp_path: Path, how: str) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(data).start()
    consumers: list[Consumer] = []
    try:
        create_topic(broker, TOPIC, PARTITIONS)

        # a simple group: offsets committed without membership
        simple = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": SIMPLE_GROUP})
        simple.commit(offsets=[TopicPartition(TOPIC, i, 7 + i) for i in range(PARTITIONS)], asynchronous=False)
        simple.close()

        consumers = [member(broker, "a"), member(broker, "b")]
        before: dict[str, set[bytes]] = {}
        # the group settles before there is anything to read, so no rebalance redelivers
        read(consumers, before, lambda: all(len(c.assignment()) == PARTITIONS // 2 for c in consumers))
        assert not before
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for i in range(TOTAL):
            p.produce(TOPIC, value=b"m%04d" % i, partition=i % PARTITIONS)
        assert p.flush(30) == 0

        def half_read_everywhere() -> bool:
            values = set().union(*before.values()) if before else set()
            read_partitions = {int(v[1:]) % PARTITIONS for v in values}
            return len(values) >= TOTAL // 2 and read_partitions == set(range(PARTITIONS))

        read(consumers, before, half_read_everywhere)
        for c in consumers:
            c.commit(asynchronous=False)  # everything each member has read
        committed = set().union(*before.values())
        generations = [librdkafka_group_metadata(c.consumer_group_metadata()) for c in consumers]
        wait_for(lambda: describe_group(broker.port, GROUP).group_state == "Stable", 10, what="a Stable group")
        snapshot = group_snapshot(broker, GROUP)
        assert snapshot[1:4] == ("Stable", "consumer", "range") and len(snapshot[4]) == 2

        if how == "clean":
            assert broker.stop() == 0
        else:
            broker.kill()
        broker = BrokerProcess(data, port=broker.port).start()

        # the group is back as it was: same generation, members, protocol and assignments
        assert group_snapshot(broker, GROUP) == snapshot
        for c, generation in zip(consumers, generations, strict=True):
            # a commit at the member's generation is accepted: the coordinator knows it
            positions = [tp for tp in c.position(c.assignment()) if tp.offset >= 0]
            c.commit(offsets=positions, asynchronous=False)
            assert librdkafka_group_metadata(c.consumer_group_metadata()) == generation
        assert group_snapshot(broker, GROUP) == snapshot

        simple = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": SIMPLE_GROUP})
        stored = simple.committed([TopicPartition(TOPIC, i) for i in range(PARTITIONS)], timeout=10)
        assert [tp.offset for tp in stored] == [7 + i for i in range(PARTITIONS)]
        simple.close()

        for c in consumers:
            c.close()
        consumers = []
        wait_for(lambda: describe_group(broker.port, GROUP).group_state == "Empty", 10, what="an Empty group")

        # a new member resumes from the committed offsets
        consumers = [member(broker, "c")]
        after: dict[str, set[bytes]] = {}
        read(consumers, after, lambda: len(committed) + sum(len(v) for v in after.values()) >= TOTAL)
        rest = set().union(*after.values())
        assert not rest & committed, "committed messages delivered again: %s" % sorted(rest & committed)[:5]
        assert rest | committed == {b"m%04d" % i for i in range(TOTAL)}
        assert consumers[0].poll(0.5) is None  # and nothing more
    finally:
        for c in consumers:
            c.close()
        rc = broker.stop()
    assert rc == 0
    assert "Traceback" not in broker.output(), broker.output()[-5000:]


def test_acknowledged_commits_survive_kill_9(tmp_path: Path) -> None:
    """A commit is answered only once its record is in the log: whatever was acknowledged
    before a `kill -9` is there after the restart."""
    data = tmp_path / "data"
    broker = BrokerProcess(data).start()
    acked: list[int] = []
    attempted: list[int] = []
    errors: list[int] = []
    try:
        create_topic(broker, TOPIC, 1)
        stop = threading.Event()

        def commit_loop() -> None:
            offset = 0
            while not stop.is_set():
                offset += 1
                attempted.append(offset)
                try:
                    code = raw_commit(broker.port, "kill-commits", -1, "", (TOPIC, 0), offset)
                except OSError:
                    return  # the broker is gone
                if code != 0:
                    errors.append(code)
                    return
                acked.append(offset)

        committer = threading.Thread(target=commit_loop, daemon=True)
        committer.start()
        wait_for(lambda: len(acked) >= 50, 20, what="some acknowledged commits")
        broker.kill()
        stop.set()
        committer.join(10)
        assert acked and not errors, errors
        broker = BrokerProcess(data, port=broker.port).start()
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kill-commits"})
        try:
            [stored] = c.committed([TopicPartition(TOPIC, 0)], timeout=10)
        finally:
            c.close()
        assert acked[-1] <= stored.offset <= attempted[-1]
    finally:
        rc = broker.stop()
    assert rc == 0
