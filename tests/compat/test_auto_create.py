"""Topic auto-creation as Kafka 4.x does it: the Metadata request that creates a topic answers
UNKNOWN_TOPIC_OR_PARTITION, the next one lists it. kafka-python and kcat produce to and consume
from topics nobody created, as against Kafka."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import BrokerProcess, RawClient

BROKER_OVERRIDES = {"num.partitions": "3"}
KCAT = shutil.which("kcat") or shutil.which("kafkacat")
TIMEOUT = 15


def metadata_error(kafka: BrokerProcess, topic: str) -> tuple[int, int]:
    c = RawClient(kafka.port)
    try:
        request = M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(name=topic)],
                                    allow_auto_topic_creation=True)
        (t,) = c.call(3, 12, request).topics
        return t.error_code, len(t.partitions)
    finally:
        c.close()


def test_the_creating_request_answers_unknown(kafka: BrokerProcess, topic_name: str) -> None:
    assert metadata_error(kafka, topic_name) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0)
    assert metadata_error(kafka, topic_name) == (0, 3)


def test_kafka_python_produces_to_a_new_topic(kafka: BrokerProcess, topic_name: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    metadata = producer.send(topic_name, key=b"k", value=b"v1").get(TIMEOUT)
    assert metadata.topic == topic_name
    producer.close()
    consumer = KafkaConsumer(topic_name, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=TIMEOUT * 1000)
    assert next(consumer).value == b"v1"
    consumer.close()


def test_kafka_python_consumer_subscribed_before_the_topic_exists(kafka: BrokerProcess, topic_name: str) -> None:
    """A consumer's Metadata requests create the topic (kafka-python allows auto-creation)."""
    from kafka import KafkaConsumer, KafkaProducer

    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest",
                             group_id=topic_name, consumer_timeout_ms=TIMEOUT * 1000)
    consumer.subscribe([topic_name])
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    producer.send(topic_name, value=b"later").get(TIMEOUT)
    producer.close()
    assert next(consumer).value == b"later"
    consumer.close()


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed")
def test_kcat_produces_to_a_new_topic(kafka: BrokerProcess, topic_name: str) -> None:
    assert KCAT is not None
    base = [KCAT, "-b", kafka.bootstrap, "-X", "socket.timeout.ms=10000"]
    subprocess.run([*base, "-P", "-t", topic_name], input=b"one\ntwo\n", check=True, timeout=30,
                   capture_output=True)
    out = subprocess.run([*base, "-C", "-t", topic_name, "-o", "beginning", "-e", "-f", "%s\n"], check=True,
                         timeout=30, capture_output=True).stdout.decode()
    assert sorted(out.split()) == ["one", "two"]
    listing = subprocess.run([*base, "-L", "-t", topic_name], check=True, timeout=30,
                             capture_output=True).stdout.decode()
    assert 'topic "%s" with 3 partitions' % topic_name in listing
