"""A KIP-848 member that commits from its revocation callback (confluent-kafka, the consumer
protocol): the synchronous commit succeeds, as with Kafka 4.3 (KIP-1251), and the rebalance goes
on. Both consumers are polled from the test's thread (librdkafka 2.16 may block for good when
two consumers of one process are polled from two threads and one runs a revocation callback,
against its own mock cluster as well)."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tests.compat.conftest import create_topic
from tests.harness import BrokerProcess, wait_for

BROKER_OVERRIDES = {"group.consumer.heartbeat.interval.ms": "500", "group.consumer.session.timeout.ms": "6000"}
TIMEOUT = 20


def test_commit_from_the_revocation_callback(kafka: BrokerProcess) -> None:
    topic = "revoke-" + uuid.uuid4().hex[:8]
    create_topic(kafka, topic, 4)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(40):
        producer.produce(topic, b"%d" % i, partition=i % 4)
    producer.flush(TIMEOUT)
    group = "revoke-commit-" + uuid.uuid4().hex[:8]
    conf = {"bootstrap.servers": kafka.bootstrap, "group.id": group, "group.protocol": "consumer",
            "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    errors: list[str] = []
    committed: list[list[int]] = []
    revoked: list[list[int]] = []

    def on_revoke(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        revoked.append(sorted(tp.partition for tp in partitions))
        try:
            done = consumer.commit(offsets=consumer.position(partitions), asynchronous=False)
            committed.append(sorted(tp.partition for tp in done or [] if tp.error is None))
        except KafkaException as exc:
            errors.append(str(exc))

    first = Consumer(dict(conf))
    first.subscribe([topic], on_revoke=on_revoke)
    seen = 0

    def consumed() -> bool:
        nonlocal seen
        msg = first.poll(0.1)
        seen += msg is not None and msg.error() is None
        return seen == 40

    wait_for(consumed, TIMEOUT, interval=0, what="the first member to read everything")
    second = Consumer(dict(conf))
    second.subscribe([topic])
    try:
        def settled() -> bool:
            first.poll(0.05)
            second.poll(0.05)
            return bool(revoked) and len(first.assignment()) == 2 and len(second.assignment()) == 2

        wait_for(settled, TIMEOUT, interval=0, what="the group to settle")
        assert not errors, errors
        assert committed == revoked
    finally:
        first.close()
        second.close()
    check = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    offsets = check.committed([TopicPartition(topic, p) for p in revoked[0]], timeout=TIMEOUT)
    check.close()
    assert [tp.offset for tp in offsets] == [10, 10]
