"""confluent-kafka (librdkafka) transactional producers and read_committed consumers."""

from __future__ import annotations

import time
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402

from tests.compat.conftest import create_topic  # noqa: E402
from tests.compat.txn_helpers import read_to_end as read_all  # noqa: E402
from tests.compat.txn_helpers import transaction_state  # noqa: E402
from tests.harness import BrokerProcess, wait_for  # noqa: E402

# a timed-out transaction is aborted within half a second
BROKER_OVERRIDES = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}


def txn_producer(kafka: BrokerProcess, tid: str, **config: Any) -> Producer:
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": tid, "linger.ms": 5,
                  "message.timeout.ms": 30000, **config})
    p.init_transactions(30)
    return p


def read_to_end(kafka: BrokerProcess, topic: str, partitions: int, isolation: str) -> list[bytes]:
    return sorted(read_all(kafka.bootstrap, topic, partitions, isolation))


def test_commit_and_abort(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 3)
    p = txn_producer(kafka, "tx-" + topic_name)
    p.begin_transaction()
    for i in range(30):
        p.produce(topic_name, value=b"c%02d" % i, partition=i % 3)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(9):
        p.produce(topic_name, value=b"a%02d" % i, partition=i % 3)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"last", partition=0)
    p.commit_transaction(30)
    committed = sorted([b"c%02d" % i for i in range(30)] + [b"last"])
    assert read_to_end(kafka, topic_name, 3, "read_committed") == committed
    assert read_to_end(kafka, topic_name, 3, "read_uncommitted") == sorted(committed + [b"a%02d" % i for i in range(9)])


def test_an_open_transaction_is_invisible_until_it_commits(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    plain = Producer({"bootstrap.servers": kafka.bootstrap})
    plain.produce(topic_name, value=b"before")
    assert plain.flush(10) == 0
    p = txn_producer(kafka, "tx-" + topic_name)
    p.begin_transaction()
    p.produce(topic_name, value=b"pending")
    p.flush(30)
    plain.produce(topic_name, value=b"after")  # behind the open transaction: held back too
    assert plain.flush(10) == 0
    assert read_to_end(kafka, topic_name, 1, "read_committed") == [b"before"]
    assert read_to_end(kafka, topic_name, 1, "read_uncommitted") == [b"after", b"before", b"pending"]
    p.commit_transaction(30)
    assert read_to_end(kafka, topic_name, 1, "read_committed") == [b"after", b"before", b"pending"]


def test_a_second_producer_fences_the_first(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    tid = "tx-" + topic_name
    zombie = txn_producer(kafka, tid)
    zombie.begin_transaction()
    zombie.produce(topic_name, value=b"zombie")
    zombie.flush(30)
    fresh = txn_producer(kafka, tid)  # aborts the zombie's transaction
    fresh.begin_transaction()
    fresh.produce(topic_name, value=b"fresh")
    fresh.commit_transaction(30)
    with pytest.raises(KafkaException) as exc:
        zombie.commit_transaction(30)
    assert exc.value.args[0].fatal()
    assert read_to_end(kafka, topic_name, 1, "read_committed") == [b"fresh"]


def test_a_transaction_that_times_out_is_aborted(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    p = txn_producer(kafka, "tx-" + topic_name, **{"transaction.timeout.ms": 1000, "message.timeout.ms": 1000})
    p.begin_transaction()
    p.produce(topic_name, value=b"slow")
    p.flush(30)
    # past the timeout, at the next cleanup the coordinator aborts it
    wait_for(lambda: transaction_state(kafka.port, "tx-" + topic_name) == "CompleteAbort", 15, 0.1, "the abort")
    with pytest.raises(KafkaException):
        p.commit_transaction(30)
    assert read_to_end(kafka, topic_name, 1, "read_committed") == []
    assert read_to_end(kafka, topic_name, 1, "read_uncommitted") == [b"slow"]
    # the transactional id is usable again at once
    again = txn_producer(kafka, "tx-" + topic_name)
    again.begin_transaction()
    again.produce(topic_name, value=b"again")
    again.commit_transaction(30)
    assert read_to_end(kafka, topic_name, 1, "read_committed") == [b"again"]


def test_idempotent_producers_are_unaffected(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 2)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True, "linger.ms": 2})
    for i in range(200):
        p.produce(topic_name, value=b"i%03d" % i, partition=i % 2)
    assert p.flush(30) == 0
    assert read_to_end(kafka, topic_name, 2, "read_committed") == [b"i%03d" % i for i in range(200)]


def group_committed(kafka: BrokerProcess, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    try:
        [tp] = c.committed([TopicPartition(topic, 0)], 10)
        return int(tp.offset)
    finally:
        c.close()


def test_consume_transform_produce(kafka: BrokerProcess, topic_name: str) -> None:
    """Only a committed transaction moves the group's offset; its output is all or nothing."""
    source, sink, group = topic_name + "-in", topic_name + "-out", "ctp-" + topic_name
    create_topic(kafka, source, 1)
    create_topic(kafka, sink, 1)
    feeder = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(20):
        feeder.produce(source, value=b"m%02d" % i)
    assert feeder.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    p = txn_producer(kafka, "tx-" + topic_name)
    try:
        consumer.subscribe([source])

        def take(n: int) -> list[Any]:
            got: list[Any] = []
            deadline = time.monotonic() + 20
            while len(got) < n and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and not msg.error():
                    got.append(msg)
            assert len(got) == n
            return got

        def transform(batch: list[Any], commit: bool) -> None:
            p.begin_transaction()
            for msg in batch:
                p.produce(sink, value=msg.value().upper())
            p.send_offsets_to_transaction([TopicPartition(source, 0, batch[-1].offset() + 1)],
                                          consumer.consumer_group_metadata(), 30)
            if commit:
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)

        transform(take(8), commit=True)
        assert group_committed(kafka, group, source) == 8
        transform(take(5), commit=False)
        assert group_committed(kafka, group, source) == 8  # the aborted transaction moved nothing
        consumer.seek(TopicPartition(source, 0, 8))  # the application rewinds to the committed position
        transform(take(12), commit=True)
        assert group_committed(kafka, group, source) == 20
    finally:
        consumer.close()
    assert read_to_end(kafka, sink, 1, "read_committed") == [b"M%02d" % i for i in range(20)]
