"""Fixtures for the PySpark data source: one local[2] SparkSession for the whole test session and
one broker subprocess per module (tests.harness.BrokerProcess).

Spark runs with its UI off, on 127.0.0.1, with this interpreter as the Python of its workers (so
they import pyspark_kafka, pyarrow and confluent-kafka from the same environment).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import BrokerProcess

SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.streaming.stopTimeout": "30000",
    "spark.python.worker.reuse": "true",
}


def build_spark(app: str) -> Any:
    os.environ.update(SPARK_ENV)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app)
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    import pyspark_kafka

    pyspark_kafka.register(spark)
    return spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = build_spark("pyspark_kafka-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("kafka") / "data") as proc:
        yield proc


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^a-zA-Z0-9._-]", "_", request.node.name)[:200]


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=30)


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    """Produce records (dicts of produce() keyword arguments) and wait for every acknowledgement."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failures: list[Any] = []
    for r in records:
        producer.produce(topic, on_delivery=lambda err, _m: err and failures.append(err), **r)
    assert producer.flush(30) == 0
    assert not failures, failures


def consume_all(bootstrap: str, topic: str, partitions: int, isolation: str = "read_uncommitted",
                timeout: float = 30.0) -> list[Any]:
    """Every record of a topic, read from the beginning to the end offsets seen at the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.auto.commit": False,
                         "isolation.level": isolation, "enable.partition.eof": True})
    try:
        tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
        consumer.assign(tps)
        out: list[Any] = []
        ended: set[int] = set()
        import time

        deadline = time.monotonic() + timeout
        while len(ended) < partitions:
            assert time.monotonic() < deadline, "timed out reading %s" % topic
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                ended.add(msg.partition())
                continue
            ended.discard(msg.partition())
            out.append(msg)
        return out
    finally:
        consumer.close()
