"""The pytest plugin as a user's project sees it: a throwaway project (its own pytest.ini and test
file, nothing of ours but the installed package) run by pytest in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PYTEST_INI = """\
[pytest]
kafka_broker_properties =
    num.partitions=2
    log.level=WARNING
"""

USER_TESTS = '''
import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from broker.testing import EmbeddedBroker


def partitions_of(bootstrap, topic):
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"x")  # auto-creates the topic
    assert producer.flush(10) == 0
    return len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic].partitions)


def round_trip(bootstrap, topic, values):
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for v in values:
        producer.send(topic, v, partition=0)
    producer.flush(10)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=5000)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    got = [m.value for _, m in zip(values, consumer)]
    consumer.close()
    return got


def test_fresh_broker_round_trip(kafka_broker):
    kafka_broker.create_topic("orders", partitions=1, retention_ms=60000)
    assert round_trip(kafka_broker.bootstrap_servers, "orders", [b"a", b"b"]) == [b"a", b"b"]


def test_each_test_has_its_own_broker(kafka_broker):
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    assert "orders" not in admin.list_topics(timeout=10).topics


def test_ini_properties(kafka_broker):
    assert partitions_of(kafka_broker.bootstrap_servers, "auto") == 2


@pytest.mark.kafka_broker(num_partitions=3)
def test_marker_wins_over_ini(kafka_broker):
    assert partitions_of(kafka_broker.bootstrap_servers, "auto") == 3


@pytest.mark.kafka_broker({"num.partitions": 5})
class TestClassMarker:
    @pytest.mark.kafka_broker({"num.partitions": 4})
    def test_closest_marker_wins(self, kafka_broker):
        assert partitions_of(kafka_broker.bootstrap_servers, "auto") == 4

    def test_class_marker(self, kafka_broker):
        assert partitions_of(kafka_broker.bootstrap_servers, "auto") == 5


SEEN = []


def test_session_broker_first(kafka_broker_session):
    kafka_broker_session.create_topic("shared")
    kafka_broker_session.faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER")
    SEEN.append(kafka_broker_session.bootstrap_servers)


def test_session_broker_is_shared(kafka_broker_session):
    assert SEEN == [kafka_broker_session.bootstrap_servers]
    assert kafka_broker_session.faults.armed == []  # the previous test's fault is gone
    admin = AdminClient({"bootstrap.servers": kafka_broker_session.bootstrap_servers})
    assert "shared" in admin.list_topics(timeout=10).topics


@pytest.mark.parametrize("clean", [True, False])
def test_restart_keeps_acknowledged_records(kafka_broker, clean):
    kafka_broker.create_topic("kept")
    address = kafka_broker.bootstrap_servers
    round_trip(address, "kept", [b"before"])
    kafka_broker.restart(clean=clean)
    assert kafka_broker.bootstrap_servers == address
    assert round_trip(address, "kept", [b"after"]) == [b"before"]


def test_faults_through_the_fixture(kafka_broker):
    kafka_broker.create_topic("flaky")
    fault = kafka_broker.faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", times=2, topic="flaky")
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    producer.produce("flaky", b"x")
    assert producer.flush(10) == 0
    assert fault.injected == 2


def test_async_context_manager():
    async def main():
        async with EmbeddedBroker() as kafka:
            kafka.create_topic("async")
            producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
            await producer.start()
            await producer.send_and_wait("async", b"hello", partition=0)
            await producer.stop()
            consumer = AIOKafkaConsumer("async", bootstrap_servers=kafka.bootstrap_servers,
                                        auto_offset_reset="earliest", group_id="g")
            await consumer.start()
            try:
                message = await asyncio.wait_for(consumer.getone(), 20)
            finally:
                await consumer.stop()
            return message.value

    assert asyncio.run(main()) == b"hello"
'''


def test_plugin_in_a_users_project(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text(PYTEST_INI)
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error::pytest.PytestUnknownMarkWarning",
         "test_user.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=110,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "12 passed" in result.stdout, result.stdout[-3000:]
