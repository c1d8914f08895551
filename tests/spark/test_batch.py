"""Batch reads and writes of the pyspark_kafka data source against the broker, Spark local[2]."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.spark.conftest import consume_all, create_topic, produce

FORMAT = "pyspark_kafka"


def read(spark: Any, bootstrap: str, **options: str) -> Any:
    reader = spark.read.format(FORMAT).option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_multi_partition_topic(spark, kafka, topic_name):
    create_topic(kafka.bootstrap, topic_name, 3)
    records = [{"key": b"k%d" % i, "value": b"v%d" % i, "partition": i % 3} for i in range(300)]
    produce(kafka.bootstrap, topic_name, records)
    df = read(spark, kafka.bootstrap, subscribe=topic_name)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
        ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
    ]
    rows = df.collect()
    assert len(rows) == 300
    assert sorted((r.partition, r.offset) for r in rows) == sorted((p, o) for p in range(3) for o in range(100))
    by_key = {bytes(r.key): r for r in rows}
    assert len(by_key) == 300
    for i in range(300):
        r = by_key[b"k%d" % i]
        assert bytes(r.value) == b"v%d" % i and r.partition == i % 3 and r.offset == i // 3
        assert r.topic == topic_name and r.timestampType == 0  # CreateTime
    # minPartitions splits the three partitions' ranges into more tasks, each record still read once
    split = read(spark, kafka.bootstrap, subscribe=topic_name, minPartitions="7")
    assert split.rdd.getNumPartitions() >= 6
    assert sorted((r.partition, r.offset) for r in split.collect()) == sorted((r.partition, r.offset) for r in rows)


def test_offsets_and_timestamps(spark, kafka, topic_name):
    create_topic(kafka.bootstrap, topic_name, 2)
    base = int(time.time() * 1000) - 100_000
    produce(kafka.bootstrap, topic_name,
            [{"value": b"%d" % i, "partition": i % 2, "timestamp": base + i * 1000} for i in range(20)])

    def offsets(df: Any) -> list[tuple[int, int]]:
        return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())

    df = read(spark, kafka.bootstrap, assign=json.dumps({topic_name: [0, 1]}),
              startingOffsets=json.dumps({topic_name: {"0": 3, "1": -2}}),
              endingOffsets=json.dumps({topic_name: {"0": 5, "1": -1}}))
    assert offsets(df) == [(0, 3), (0, 4)] + [(1, o) for o in range(10)]
    # partition 0 holds even i at offset i//2, timestamp base + i*1000
    df = read(spark, kafka.bootstrap, subscribe=topic_name, startingTimestamp=str(base + 12_000))
    assert offsets(df) == [(0, o) for o in range(6, 10)] + [(1, o) for o in range(6, 10)]
    df = read(spark, kafka.bootstrap, subscribe=topic_name,
              startingOffsetsByTimestamp=json.dumps({topic_name: {"0": base, "1": base + 15_000}}),
              endingOffsetsByTimestamp=json.dumps({topic_name: {"0": base + 4_000, "1": base + 10**9}}))
    assert offsets(df) == [(0, 0), (0, 1)] + [(1, o) for o in range(7, 10)]
    ts = read(spark, kafka.bootstrap, subscribe=topic_name).where("partition = 0 and offset = 1").collect()[0]
    assert int(ts.timestamp.timestamp() * 1000) == base + 2000
    # no record at or after the timestamp: an error by default, the end with the "latest" strategy
    with pytest.raises(Exception, match="No offset matched from request of topic-partition"):
        read(spark, kafka.bootstrap, subscribe=topic_name, startingTimestamp=str(base + 10**9)).collect()
    df = read(spark, kafka.bootstrap, subscribe=topic_name, startingTimestamp=str(base + 10**9),
              startingOffsetsByTimestampStrategy="latest")
    assert df.count() == 0


def test_headers_read_and_written(spark, kafka, topic_name):
    create_topic(kafka.bootstrap, topic_name, 1)
    produce(kafka.bootstrap, topic_name, [
        {"value": b"a", "headers": [("h1", b"x"), ("h2", None), ("h1", b"y")]},
        {"value": b"b"},
    ])
    rows = read(spark, kafka.bootstrap, subscribe=topic_name, includeHeaders="true").orderBy("offset").collect()
    assert [(h.key, None if h.value is None else bytes(h.value)) for h in rows[0].headers] == [
        ("h1", b"x"), ("h2", None), ("h1", b"y")]
    assert rows[1].headers is None
    assert "headers" not in read(spark, kafka.bootstrap, subscribe=topic_name).columns
    # the sink writes the headers column back
    out = topic_name + "-out"
    create_topic(kafka.bootstrap, out, 1)
    (read(spark, kafka.bootstrap, subscribe=topic_name, includeHeaders="true").select("value", "headers")
     .write.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", out).mode("append").save())
    got = sorted(consume_all(kafka.bootstrap, out, 1), key=lambda m: m.offset())
    assert [m.value() for m in got] == [b"a", b"b"]
    assert got[0].headers() == [("h1", b"x"), ("h2", None), ("h1", b"y")] and got[1].headers() is None


def test_batch_write_columns(spark, kafka, topic_name):
    a, b = topic_name + "-a", topic_name + "-b"
    create_topic(kafka.bootstrap, a, 2)
    create_topic(kafka.bootstrap, b, 1)
    rows = [(a if i % 3 else b, "key%d" % i, "value%d" % i, (i % 2) if i % 3 else 0) for i in range(60)]
    df = spark.createDataFrame(rows, "topic string, key string, value string, partition int")
    df.write.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap).mode("append").save()
    got_a = consume_all(kafka.bootstrap, a, 2)
    got_b = consume_all(kafka.bootstrap, b, 1)
    assert sorted((m.key(), m.value(), m.partition()) for m in got_a) == sorted(
        (k.encode(), v.encode(), p) for t, k, v, p in rows if t == a)
    assert sorted(m.value() for m in got_b) == sorted(v.encode() for t, _, v, _ in rows if t == b)
    # the topic option wins over the column; a binary value without key is fine
    spark.createDataFrame([(a, bytearray(b"\x00\x01"))], "topic string, value binary").write.format(FORMAT) \
        .option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", b).mode("append").save()
    assert sorted(m.value() for m in consume_all(kafka.bootstrap, b, 1))[0] == b"\x00\x01"


@pytest.mark.parametrize("options, message", [
    ({}, "One of the following options must be specified for Kafka source: subscribe, subscribepattern, assign"),
    ({"subscribe": "a", "assign": '{"a":[0]}'}, "Only one of the following options can be specified"),
    ({"subscribe": " , "}, "No topics to subscribe to as specified value for option 'subscribe' is ' , '"),
    ({"assign": "a"}, "No topicpartitions to assign as specified value for option 'assign' is 'a'"),
    ({"subscribe": "a", "startingOffsets": "latest"}, "starting offset can't be latest for batch queries on Kafka"),
    ({"subscribe": "a", "endingOffsets": "earliest"}, "ending offset can't be earliest for batch queries on Kafka"),
    ({"subscribe": "a", "kafka.auto.offset.reset": "earliest"}, "Kafka option 'auto.offset.reset' is not supported"),
    ({"subscribe": "a", "kafka.enable.auto.commit": "true"}, "Kafka option 'enable.auto.commit' is not supported"),
    ({"subscribe": "a", "minPartitions": "0"}, "minPartitions must be positive"),
    ({"subscribe": "a", "startingOffsets": "{nope"}, 'Expected e.g. {"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}, got {nope'),
    ({"subscribe": "a", "subscribePatern": "a.*"}, "Unknown option 'subscribepatern' for the Kafka source"),
    # a kafka.* option reaches the client, which refuses a bad value
    ({"subscribe": "a", "kafka.security.protocol": "bogus"}, "security.protocol"),
])
def test_bad_read_options(spark, kafka, options, message):
    reader = spark.read.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match=_escape(message)):
        reader.load().collect()


def test_bad_write_options_and_schema(spark, kafka):
    df = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception, match="topic option required when no 'topic' attribute is present"):
        df.write.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap).mode("append").save()
    with pytest.raises(Exception, match="Required attribute 'value' not found"):
        df.select("key").write.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap) \
            .option("topic", "x").mode("append").save()
    with pytest.raises(Exception, match="key attribute unsupported type int. key must be a\\(n\\) string or binary"):
        df.selectExpr("1 as key", "value").write.format(FORMAT) \
            .option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", "x").mode("append").save()
    with pytest.raises(Exception, match="Save mode Overwrite not allowed for Kafka"):
        df.write.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", "x") \
            .mode("overwrite").save()
    with pytest.raises(Exception, match="Option 'kafka.bootstrap.servers' must be specified"):
        df.write.format(FORMAT).option("topic", "x").mode("append").save()


def _escape(text: str) -> str:
    import re

    return re.escape(text)
