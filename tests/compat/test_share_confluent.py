"""Share groups (KIP-932) with confluent-kafka's ShareConsumer (librdkafka 2.16); group configs
set with kafka-python's admin (ConfigResourceType.GROUP).

The broker runs with short share group heartbeats, sessions and lock bounds so that the tests
are quick (Kafka's defaults stay the defaults); each test has its own group and topic.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Consumer, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from protocol import messages as M
from tests.compat.conftest import create_topic
from tests.compat.share_child import FAST_SHARE_GROUPS, ShareChild
from tests.harness import BrokerProcess, RawClient, free_port, wait_for

BROKER_OVERRIDES = dict(FAST_SHARE_GROUPS)


@pytest.fixture
def group_id() -> str:
    return "share-" + uuid.uuid4().hex[:10]


def set_group_configs(kafka: BrokerProcess, group_id: str, **configs: str) -> None:
    """Through kafka-python's admin (IncrementalAlterConfigs of a GROUP resource)."""
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        result = admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group_id, configs=configs)],
                                     incremental=True)
    finally:
        admin.close()
    assert result == {"group": {group_id: "OK"}}, result


def share_start_offset(kafka: BrokerProcess, group_id: str, topic: str, partition: int = 0) -> int:
    """DescribeShareGroupOffsets (raw: no Python client has it) of one share-partition."""
    R = M.DescribeShareGroupOffsetsRequest
    c = RawClient(kafka.port, "compat-check")
    try:
        response = c.call(90, 1, R(groups=[R.DescribeShareGroupOffsetsRequestGroup(
            group_id=group_id, topics=[R.DescribeShareGroupOffsetsRequestTopic(topic_name=topic,
                                                                                partitions=[partition])])]))
    finally:
        c.close()
    return int(response.groups[0].topics[0].partitions[0].start_offset)


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
                                                             closing: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 2)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    produce(kafka, topic_name, 40, partitions=2)
    first = share_consumer(kafka, group_id, closing, topic_name)
    got = poll_until(first, 40)
    assert sorted((p, o) for p, o, _ in got) == sorted((i % 2, i // 2) for i in range(40))
    assert {d for _, _, d in got} == {1}
    first.commit_sync(10)  # librdkafka's close does not acknowledge the last poll's records
    first.close()
    closing.remove(first)
    # accepted: a new member of the group gets nothing of it, only what comes next
    second = share_consumer(kafka, group_id, closing, topic_name)
    produce(kafka, topic_name, 2, partitions=2, start=40)
    assert sorted((p, o) for p, o, _ in poll_until(second, 2, idle=5)) == [(0, 20), (1, 20)]


def test_the_first_poll_holds_one_partitions_records(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                     closing: list[ShareConsumer]) -> None:
    """librdkafka's test 0179 (destroy_with_explicit_ack): 50 records in each of two partitions;
    the first non-empty poll holds one partition's 50, the second the other's. As Kafka: the
    share-partitions load at the first ShareFetch, which answers with the first to load."""
    create_topic(kafka, topic_name, 2)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for partition in (0, 1):
        for i in range(50):
            p.produce(topic_name, value=b"v%d" % i, partition=partition)
        assert p.flush(10) == 0
    c = share_consumer(kafka, group_id, closing, topic_name, explicit=True)
    batches: list[list[tuple[int, int]]] = []
    deadline = time.monotonic() + 60
    while sum(map(len, batches)) < 100 and time.monotonic() < deadline:
        messages = c.poll(3.0)
        if messages:
            batches.append([(m.partition(), m.offset()) for m in messages])
            for m in messages:
                assert m.error() is None, m.error()
                c.acknowledge(m, AcknowledgeType.ACCEPT)
    assert [len(b) for b in batches] == [50, 50], [len(b) for b in batches]
    first, second = ({p for p, _ in b} for b in batches)
    assert len(first) == 1 and len(second) == 1 and first != second, (first, second)
    assert all(sorted(o for _, o in b) == list(range(50)) for b in batches)
    assert all(e is None for e in c.commit_sync(10).values())


def test_partitions_are_served_in_turn(kafka: BrokerProcess, topic_name: str, group_id: str,
                                       closing: list[ShareConsumer]) -> None:
    """max.poll.records 10 (the ShareFetch's MaxRecords) and 100 records in each of two
    partitions, in batches of 10: a fetch takes them from the first partition in its order only,
    and Kafka's rotation by the share session epoch starts the next fetch at the other one."""
    create_topic(kafka, topic_name, 2)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for partition in (0, 1):
        for batch in range(10):
            for i in range(10):
                p.produce(topic_name, value=b"v%d" % (10 * batch + i), partition=partition)
            assert p.flush(10) == 0  # one log batch each
    c = ShareConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": group_id, "max.poll.records": 10})
    closing.append(c)
    c.subscribe([topic_name])
    served: list[int] = []
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + 60
    while len(got) < 200 and time.monotonic() < deadline:
        messages = c.poll(3.0)
        if messages:
            assert all(m.error() is None for m in messages)
            partitions = {m.partition() for m in messages}
            assert len(partitions) == 1 and len(messages) == 10, [(m.partition(), m.offset()) for m in messages]
            served.append(partitions.pop())
            got += [(m.partition(), m.offset()) for m in messages]
    assert sorted(got) == [(p, o) for p in (0, 1) for o in range(100)]
    assert set(served[:3]) == {0, 1}, served
    runs = [len(list(g)) for _, g in itertools.groupby(served)]
    assert max(runs) <= 2, served  # neither partition waits while the other is drained


def test_explicit_acknowledgement(kafka: BrokerProcess, topic_name: str, group_id: str,
                                  closing: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 1)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    produce(kafka, topic_name, 10)
    c = share_consumer(kafka, group_id, closing, topic_name, explicit=True)
    results: list[Any] = []

    def accept(consumer: ShareConsumer, m: Any) -> None:
        consumer.acknowledge(m, AcknowledgeType.ACCEPT)

    got = poll_until(c, 10, on_message=accept)
    results.append(c.commit_sync(10))
    assert sorted(o for _, o, _ in got) == list(range(10))
    assert all(error is None for r in results for error in r.values()), results
    assert poll_until(c, 1, timeout=3) == []


def test_four_members_on_two_partitions_all_receive_and_none_twice(
        kafka: BrokerProcess, topic_name: str, group_id: str, closing: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 2)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    members = [share_consumer(kafka, group_id, closing, topic_name) for _ in range(4)]
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
                                                 closing: list[ShareConsumer]) -> None:
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
    other = share_consumer(kafka, group_id, closing, topic_name)
    got = poll_until(other, 5)
    assert sorted(o for _, o, _ in got) == [0, 1, 2, 3, 4]
    assert {d for _, _, d in got} == {1}


def test_a_stalled_member_loses_its_records_at_the_lock_expiry(
        kafka: BrokerProcess, topic_name: str, group_id: str, closing: list[ShareConsumer]) -> None:
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
        other = share_consumer(kafka, group_id, closing, topic_name)
        got = poll_until(other, 5, timeout=30)
        assert sorted(o for _, o, _ in got) == [0, 1, 2, 3, 4]
        assert {d for _, _, d in got} == {2}
        assert time.monotonic() - stopped >= 1.5  # not before the lock ran out
    finally:
        child.kill()


def test_release_until_the_delivery_limit_then_archived(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                         closing: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 1)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3"})
    produce(kafka, topic_name, 3)
    c = share_consumer(kafka, group_id, closing, topic_name, explicit=True)

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
                                     closing: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 1)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest"})
    produce(kafka, topic_name, 4)
    c = share_consumer(kafka, group_id, closing, topic_name, explicit=True)

    def reject(consumer: ShareConsumer, m: Any) -> None:
        consumer.acknowledge(m, AcknowledgeType.REJECT)

    assert len(poll_until(c, 4, on_message=reject)) == 4
    c.commit_sync(10)
    assert poll_until(c, 1, timeout=3) == []
    other = share_consumer(kafka, group_id, closing, topic_name)
    assert poll_until(other, 1, timeout=3) == []


def test_dead_letter_queue_contents_and_headers(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                closing: list[ShareConsumer]) -> None:
    """KIP-1191: rejected records and records out of deliveries land in the group's DLQ topic (made
    with confluent-kafka's admin) with the __dlq.errors.* headers, read back by a classic consumer."""
    dlq = "dlq." + topic_name
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    created = admin.create_topics([NewTopic(dlq, 2, config={"errors.deadletterqueue.group.enable": "true"})])
    created[dlq].result(10)
    create_topic(kafka, topic_name, 2)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "2",
                                          "errors.deadletterqueue.topic.name": dlq,
                                          "errors.deadletterqueue.copy.record.enable": "true"})
    produce(kafka, topic_name, 4, partitions=2)  # v0, v2 in partition 0; v1, v3 in partition 1
    c = share_consumer(kafka, group_id, closing, topic_name, explicit=True)

    def reject_even_release_odd(consumer: ShareConsumer, m: Any) -> None:
        odd = int(m.value()[1:]) % 2
        consumer.acknowledge(m, AcknowledgeType.RELEASE if odd else AcknowledgeType.REJECT)

    got = poll_until(c, 6, on_message=reject_even_release_odd, timeout=30)  # v1, v3 come back once
    c.commit_sync(10)
    assert sorted((p, o, dc) for p, o, dc in got) == [(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 0, 2), (1, 1, 1), (1, 1, 2)]

    reader = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group_id + "-reader",
                       "auto.offset.reset": "earliest"})
    try:
        reader.subscribe([dlq])
        letters: list[Any] = []
        deadline = time.monotonic() + 30
        while len(letters) < 4 and time.monotonic() < deadline:
            m = reader.poll(0.5)
            if m is not None and m.error() is None:
                letters.append(m)
    finally:
        reader.close()
    seen = {}
    for m in letters:
        h = {k: v.decode() for k, v in m.headers()}
        seen[m.value()] = (m.partition(), h["__dlq.errors.topic"], h["__dlq.errors.partition"],
                           h["__dlq.errors.offset"], h["__dlq.errors.group"], h["__dlq.errors.delivery.count"],
                           h["__dlq.errors.message"])
    rejected, exceeded = "Offset rejected by client.", "Offset delivery count exceeded the threshold."
    assert seen == {
        b"v0": (0, topic_name, "0", "0", group_id, "1", rejected),
        b"v2": (0, topic_name, "0", "1", group_id, "1", rejected),
        b"v1": (1, topic_name, "1", "0", group_id, "2", exceeded),
        b"v3": (1, topic_name, "1", "1", group_id, "2", exceeded),
    }


def test_read_committed_skips_aborted_transactions(kafka: BrokerProcess, topic_name: str, group_id: str,
                                                    closing: list[ShareConsumer]) -> None:
    create_topic(kafka, topic_name, 1)
    set_group_configs(kafka, group_id, **{"share.auto.offset.reset": "earliest",
                                          "share.isolation.level": "read_committed"})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "tx-" + group_id})
    p.init_transactions(10)
    for i, commit in enumerate([False, True, False, True]):
        p.begin_transaction()
        for j in range(3):
            p.produce(topic_name, value=b"%s-%d-%d" % (b"ok" if commit else b"no", i, j), partition=0)
        p.flush(10)  # in the log before the abort (librdkafka drops what it has not sent)
        if commit:
            p.commit_transaction(10)
        else:
            p.abort_transaction(10)
    c = share_consumer(kafka, group_id, closing, topic_name)
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(values) < 6 and time.monotonic() < deadline:
        values.extend(m.value() for m in c.poll(0.5) if m.error() is None)
    time.sleep(1)
    values.extend(m.value() for m in c.poll(0.5) if m.error() is None)
    assert sorted(values) == sorted(b"ok-%d-%d" % (i, j) for i in (1, 3) for j in range(3))
    c.commit_sync(10)
    # the aborted records were archived by the broker (never handed out), the rest acknowledged:
    # the share-partition start offset reaches the log end (16: four transactions and their markers)
    wait_for(lambda: share_start_offset(kafka, group_id, topic_name) == 16, 10, what="everything done")


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
