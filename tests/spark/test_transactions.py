"""pyspark_kafka over transactional topics: kafka.isolation.level passes through to the client, and
read_committed reads skip aborted transactions and stop at the last stable offset."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

from tests.spark.conftest import create_topic

FORMAT = "pyspark_kafka"


def transactional_producer(bootstrap: str, tid: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5})
    producer.init_transactions(30)
    return producer


def write_transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for i, v in enumerate(values):
        producer.produce(topic, v, partition=i % 2)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def values(df: Any) -> list[str]:
    return sorted(bytes(r.value).decode() for r in df.select("value").collect())


def test_read_committed_skips_aborted_and_open_transactions(spark, kafka, topic_name, tmp_path):
    create_topic(kafka.bootstrap, topic_name, 2)
    producer = transactional_producer(kafka.bootstrap, topic_name + "-tx")
    write_transaction(producer, topic_name, [b"c%d" % i for i in range(5)], commit=True)
    write_transaction(producer, topic_name, [b"a%d" % i for i in range(5)], commit=False)
    write_transaction(producer, topic_name, [b"c%d" % i for i in range(5, 10)], commit=True)
    # a transaction left open: read_committed stops at the last stable offset before it
    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic_name, b"o%d" % i, partition=i % 2)
    producer.flush(30)
    try:
        def read(isolation: str) -> Any:
            return (spark.read.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap)
                    .option("subscribe", topic_name).option("kafka.isolation.level", isolation).load())

        committed = ["c%d" % i for i in range(10)]
        assert values(read("read_committed")) == committed
        assert values(read("read_uncommitted")) == sorted(
            committed + ["a%d" % i for i in range(5)] + ["o%d" % i for i in range(4)])
        name = "rc_" + topic_name.replace("-", "_")
        query = (spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap)
                 .option("subscribe", topic_name).option("startingOffsets", "earliest")
                 .option("kafka.isolation.level", "read_committed").option("maxOffsetsPerTrigger", "7").load()
                 .writeStream.format("memory").queryName(name)
                 .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        assert values(spark.table(name)) == committed
    finally:
        producer.abort_transaction(30)
