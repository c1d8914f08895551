"""Share groups (KIP-932) with confluent-kafka's ShareConsumer (librdkafka 2.16); group configs
set with kafka-python's admin (ConfigResourceType.GROUP).

The broker runs with short share group heartbeats, sessions and lock bounds so that the tests
are quick (Kafka's defaults stay the defaults); each test has its own group and topic.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from tests.compat.conftest import create_topic
from tests.compat.share_child import ShareChild
from tests.harness import BrokerProcess, free_port, wait_for

BROKER_OVERRIDES = {
    "group.share.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "500",
    "group.share.session.timeout.ms": "4000",
    "group.share.min.session.timeout.ms": "1000",
    "group.share.min.record.lock.duration.ms": "1000",
}


@pytest.fixture
def group_id() -> str:
    return "share-" + uuid.uuid4().hex[:10]


@pytest.fixture
def consumers() -> Iterator[list[ShareConsumer]]:
    made: list[ShareConsumer] = []
    yield made
    for c in made:
        try:
            c.close()
        except Exception:
            pass


def set_group_configs(kafka: BrokerProcess, group_id: str, **configs: str) -> None:
    """Through kafka-python's admin (IncrementalAlterConfigs of a GROUP resource)."""
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        result = admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group_id, configs=configs)],
                                     incremental=True)
    finally:
        admin.close()
    assert result == {"group": {group_id: "OK"}}, result


def share_consumer(kafka: BrokerProcess, group_id: str, made: list[ShareConsumer], topic: str,
                   explicit: bool = False) -> ShareConsumer:
    conf = {"bootstrap.servers": kafka.bootstrap, "group.id": group_id}
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    c = ShareConsumer(conf)
    made.append(c)
    c.subscribe([topic])
    return c


def produce(kafka: BrokerProcess, topic: str, n: int, partitions: int = 1, start: int = 0) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for i in range(start, start + n):
        p.produce(topic, value=b"v%d" % i, partition=i % partitions)
    assert p.flush(10) == 0


def poll_until(c: ShareConsumer, want: int, timeout: float = 30.0, idle: float | None = None,
               on_message: Any = None) -> list[tuple[int, int, int]]:
    """(partition, offset, delivery count) of what arrives, until `want` records or the timeout
    (or `idle` seconds without a record)."""
    got: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    while len(got) < want and time.monotonic() < deadline:
        messages = c.poll(0.5)
        for m in messages:
            assert m.error() is None, m.error()
            got.append((m.partition(), m.offset(), m.delivery_count()))
            if on_message is not None:
                on_message(c, m)
        if messages:
            last = time.monotonic()
        elif idle is not None and time.monotonic() - last > idle:
            break
    return got


def test_implicit_acknowledgement_delivers_each_record_once(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                             consumers: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 2)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    produce(kafka, topic_name, 40, partitions=2)
    first = share_consumer(kafka, group_id, consumers, topic_name)
    got = poll_until(first, 40)
    assert sorted((p, o) for p, o, _ in got) == sorted((i % 2, i // 2) for i in range(40))
    assert {d for _, _, d in got} == {1}
    first.commit_sync(10)  # librdkafka's close does not acknowledge the last poll's records
    first.close()
    consumers.remove(first)
    # accepted: a new member of the group gets nothing of it, only what comes next
    second = share_consumer(kafka, group_id, consumers, topic_name)
    produce(kafka, topic_name, 2, partitions=2, start=40)
    assert sorted((p, o) for p, o, _ in poll_until(second, 2, idle=5)) == [(0, 20), (1, 20)]


def test_explicit_acknowledgement(kafka: BrokerProcess, topic_name: str, group_id: str,
                                  consumers: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 1)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    produce(kafka, topic_name, 10)
    c = share_consumer(kafka, group_id, consumers, topic_name, explicit=True)
    results: list[Any] = []

    def accept(consumer: ShareConsumer, m: Any) -> None:
        consumer.acknowledge(m, AcknowledgeType.ACCEPT)

    got = poll_until(c, 10, on_message=accept)
    results.append(c.commit_sync(10))
    assert sorted(o for _, o, _ in got) == list(range(10))
    assert all(error is None for r in results for error in r.values()), results
    assert poll_until(c, 1, timeout=3) == []


def test_four_members_on_two_partitions_all_receive_and_none_twice(
        kafka: BrokerProcess, topic_name: str, group_id: str, consumers: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 2)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    members = [share_consumer(kafka, group_id, consumers, topic_name) for _ in range(4)]
    total = 3000
    seen: list[list[tuple[int, int, int]]] = [[] for _ in members]
    done = threading.Event()

    def run(i: int) -> None:
        while not done.is_set():
            for m in members[i].poll(0.2):
                assert m.error() is None
                seen[i].append((m.partition(), m.offset(), m.delivery_count()))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    produced = 0
    try:
        # a steady stream until every member has had a share (members compete for the records of a
        # shared partition, so who wins a batch is a race; the stream bounds the wait)
        deadline = time.monotonic() + 60
        while (produced < total or not all(seen)) and time.monotonic() < deadline:
            produce(kafka, topic_name, 100, partitions=2, start=produced)
            produced += 100
            time.sleep(0.05)
        wait_for(lambda: sum(len(s) for s in seen) >= produced, 60, what="every record delivered")
        time.sleep(1)  # anything delivered twice would show up now
    finally:
        done.set()
        for t in threads:
            t.join(10)
        for c in members:
            c.commit_sync(10)
    everything = [(p, o) for s in seen for p, o, _ in s]
    assert len(everything) == len(set(everything)) == produced  # none delivered (or accepted) twice
    assert all(s for s in seen), [len(s) for s in seen]  # all four members made progress


def test_a_killed_member_gives_its_records_back(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                 consumers: list[ShareConsumer]) -> None:
    """librdkafka's connection closes with the process: as in Kafka the share session ends and
    its acquired records are released at once, their delivery not counted."""
    create_topic(kafka, topic_name, 1)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    produce(kafka, topic_name, 5)
    child = ShareChild({"bootstrap": kafka.bootstrap, "group": group_id, "topic": topic_name, "mode": "explicit",
                        "ack": "none", "hang": True, "max": 5})
    try:
        wait_for(lambda: len(child.records) >= 5, 30, what="the child to get the records")
        child.kill()
    finally:
        child.kill()
    other = share_consumer(kafka, group_id, consumers, topic_name)
    got = poll_until(other, 5)
    assert sorted(o for _, o, _ in got) == [0, 1, 2, 3, 4]
    assert {d for _, _, d in got} == {1}


def test_a_stalled_member_loses_its_records_at_the_lock_expiry(
        kafka: BrokerProcess, topic_name: str, group_id: str, consumers: list[ShareConsumer]) -> None:
    """A member that keeps its connection but stops (SIGSTOP) holds its records until their
    acquisition locks run out; another member then gets them with delivery count 2."""
    create_topic(kafka, topic_name, 1)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest",
                                          "share.record.lock.duration.ms": "2000"})
    produce(kafka, topic_name, 5)
    child = ShareChild({"bootstrap": kafka.bootstrap, "group": group_id, "topic": topic_name, "mode": "explicit",
                        "ack": "none", "hang": True, "max": 5})
    try:
        wait_for(lambda: len(child.records) >= 5, 30, what="the child to get the records")
        child.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        other = share_consumer(kafka, group_id, consumers, topic_name)
        got = poll_until(other, 5, timeout=30)
        assert sorted(o for _, o, _ in got) == [0, 1, 2, 3, 4]
        assert {d for _, _, d in got} == {2}
        assert time.monotonic() - stopped >= 1.5  # not before the lock ran out
    finally:
        child.kill()


def test_release_until_the_delivery_limit_then_archived(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                         consumers: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 1)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3"})
    produce(kafka, topic_name, 3)
    c = share_consumer(kafka, group_id, consumers, topic_name, explicit=True)

    def release(consumer: ShareConsumer, m: Any) -> None:
        consumer.acknowledge(m, AcknowledgeType.RELEASE)

    got: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + 30
    while len(got) < 9 and time.monotonic() < deadline:
        batch = poll_until(c, 9 - len(got), timeout=2, on_message=release)
        if batch:
            c.commit_sync(10)
        got += batch
    assert sorted((o, d) for _, o, d in got) == [(o, d) for o in range(3) for d in (1, 2, 3)]
    c.commit_sync(10)
    assert poll_until(c, 1, timeout=3) == []  # archived: never delivered again


def test_reject_is_never_redelivered(kafka: BrokerProcess, topic_name: str, group_id: str,
                                     consumers: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 1)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    produce(kafka, topic_name, 4)
    c = share_consumer(kafka, group_id, consumers, topic_name, explicit=True)

    def reject(consumer: ShareConsumer, m: Any) -> None:
        consumer.acknowledge(m, AcknowledgeType.REJECT)

    assert len(poll_until(c, 4, on_message=reject)) == 4
    c.commit_sync(10)
    assert poll_until(c, 1, timeout=3) == []
    other = share_consumer(kafka, group_id, consumers, topic_name)
    assert poll_until(other, 1, timeout=3) == []


def test_group_configs_with_kafka_python(kafka: BrokerProcess, group_id: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        ok = admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group_id, configs={
            "share.record.lock.duration.ms": "20000", "consumer.session.timeout.ms": "50000"})], incremental=True)
        assert ok == {"group": {group_id: "OK"}}
        bad = admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group_id, configs={
            "share.record.lock.duration.ms": "120000"})], incremental=True)
        assert "InvalidConfigurationError" in bad["group"][group_id]
        assert "must be in the range 1000 to 60000 inclusive" in bad["group"][group_id]
        unknown = admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group_id, configs={
            "no.such.config": "1"})], incremental=True, raise_on_unknown=False)
        assert "Unknown group config name: no.such.config" in unknown["group"][group_id]
        described = admin.describe_configs([ConfigResource(ConfigResourceType.GROUP, group_id)])
    finally:
        admin.close()
    configs = described["group"][group_id]
    assert configs["share.record.lock.duration.ms"]["value"] == "20000"
    assert configs["consumer.session.timeout.ms"]["value"] == "50000"


def test_a_broker_killed_midway_never_redelivers_what_was_accepted(tmp_path: Path, topic_name: str,
                                                                   group_id: str) -> None:
    port = free_port()
    broker = BrokerProcess(tmp_path / "data", port=port, overrides=BROKER_OVERRIDES).start()
    made: list[ShareConsumer] = []
    try:
        create_topic(broker, topic_name, 1)
        set_group_configs(broker, group_id, **{"share.auto.offset.reset": "earliest"})
        produce(broker, topic_name, 100)
        c = share_consumer(broker, group_id, made, topic_name, explicit=True)
        accepted: list[int] = []
        delivered: list[int] = []

        def accept_half(consumer: ShareConsumer, m: Any) -> None:
            delivered.append(m.offset())
            if len(accepted) < 50:
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                accepted.append(m.offset())
            else:
                consumer.acknowledge(m, AcknowledgeType.RELEASE)

        while len(accepted) < 50:
            if poll_until(c, 100, timeout=5, idle=1, on_message=accept_half):
                result = c.commit_sync(10)
                assert all(e is None for e in result.values()), result
        broker.kill()  # SIGKILL: no clean shutdown
        made.remove(c)
        broker = BrokerProcess(tmp_path / "data", port=port, overrides=BROKER_OVERRIDES).start()
        after = share_consumer(broker, group_id, made, topic_name)
        got = poll_until(after, 100 - len(set(accepted)), timeout=30, idle=8)
        offsets = [o for _, o, _ in got]
        assert not set(offsets) & set(accepted)
        assert sorted(set(offsets) | set(accepted)) == list(range(100))
    finally:
        for consumer in made:
            try:
                consumer.close()
            except Exception:
                pass
        broker.stop()
