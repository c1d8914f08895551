"""Streaming reads and writes of the pyspark_kafka data source, Spark local[2]."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT, wait_for
from tests.spark.conftest import SPARK_ENV, consume_all, create_topic, produce

FORMAT = "pyspark_kafka"


def stream(spark: Any, bootstrap: str, **options: str) -> Any:
    reader = spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_subscribe_pattern_picks_up_a_new_topic(spark, kafka, topic_name, tmp_path):
    first = topic_name + "-one"
    create_topic(kafka.bootstrap, first, 2)
    produce(kafka.bootstrap, first, [{"value": b"a%d" % i, "partition": i % 2} for i in range(10)])
    df = stream(spark, kafka.bootstrap, subscribePattern=topic_name + "-.*", startingOffsets="earliest")
    name = "pattern_" + topic_name.replace("-", "_")
    query = (df.selectExpr("topic", "partition", "offset", "cast(value as string) as value")
             .writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        query.processAllAvailable()
        assert spark.table(name).count() == 10
        second = topic_name + "-two"
        create_topic(kafka.bootstrap, second, 1)
        produce(kafka.bootstrap, second, [{"value": b"b%d" % i} for i in range(5)])
        produce(kafka.bootstrap, first, [{"value": b"c", "partition": 0}])
        wait_for(lambda: query.processAllAvailable() or spark.table(name).count() == 16, timeout=60,
                 interval=0.5, what="the new topic's records")
        rows = spark.table(name).collect()
        assert sorted(r.value for r in rows if r.topic == second) == ["b%d" % i for i in range(5)]
        assert len({(r.topic, r.partition, r.offset) for r in rows}) == 16
    finally:
        query.stop()
    # the checkpointed offsets are Spark's Kafka JSON: {"topic": {"partition": next offset}}
    offsets_dir = tmp_path / "ckpt" / "offsets"
    last = max(offsets_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    source_offsets = json.loads(last.read_text().splitlines()[-1])
    assert source_offsets == {first: {"0": 6, "1": 5}, second: {"0": 5}}


def test_available_now_respects_max_offsets_per_trigger(spark, kafka, topic_name, tmp_path):
    create_topic(kafka.bootstrap, topic_name, 2)
    produce(kafka.bootstrap, topic_name, [{"value": b"%d" % i, "partition": i % 2} for i in range(100)])
    name = "avnow_" + topic_name.replace("-", "_")
    query = (stream(spark, kafka.bootstrap, subscribe=topic_name, startingOffsets="earliest",
                    maxOffsetsPerTrigger="30")
             .writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert batches == [30, 30, 30, 10]
    assert spark.table(name).count() == 100


def start_driver(bootstrap: str, topic: str, checkpoint: Path, sink: str, mode: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.stream_driver", bootstrap, topic, str(checkpoint), sink, mode],
        cwd=str(ROOT), env={**os.environ, **SPARK_ENV, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def kill_after_batches(proc: subprocess.Popen[bytes], checkpoint: Path, batches: int) -> None:
    try:
        wait_for(lambda: committed_batches(checkpoint) >= batches or proc.poll() is not None,
                 timeout=90, interval=0.1, what="%d committed micro-batches" % batches)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def run_to_end(bootstrap: str, topic: str, checkpoint: Path, sink: str, env: dict[str, str] | None = None) -> None:
    proc = start_driver(bootstrap, topic, checkpoint, sink, "available-now", env)
    _, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, err.decode()[-3000:]


@pytest.mark.timeout(300)
def test_streaming_read_resumes_after_driver_kill_9(spark, kafka, topic_name, tmp_path):
    create_topic(kafka.bootstrap, topic_name, 2)
    produce(kafka.bootstrap, topic_name, [{"value": b"%d" % i, "partition": i % 2} for i in range(1000)])
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    env = {"MAX_OFFSETS": "250"}
    kill_after_batches(start_driver(kafka.bootstrap, topic_name, checkpoint, str(out), "run", env), checkpoint, 2)
    produce(kafka.bootstrap, topic_name, [{"value": b"%d" % i, "partition": i % 2} for i in range(1000, 1200)])
    run_to_end(kafka.bootstrap, topic_name, checkpoint, str(out), env)
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 1200
    assert sorted(int(r.value) for r in rows) == list(range(1200))
    assert len({(r.partition, r.offset) for r in rows}) == 1200


def test_streaming_write_at_least_once(spark, kafka, topic_name, tmp_path):
    source, sink = topic_name + "-in", topic_name + "-out"
    create_topic(kafka.bootstrap, source, 2)
    create_topic(kafka.bootstrap, sink, 2)
    produce(kafka.bootstrap, source, [{"key": b"%d" % i, "value": b"v%d" % i, "partition": i % 2} for i in range(50)])
    query = (stream(spark, kafka.bootstrap, subscribe=source, startingOffsets="earliest")
             .selectExpr("key", "upper(cast(value as string)) as value").writeStream.format(FORMAT)
             .option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", sink)
             .option("deliveryGuarantee", "at-least-once")
             .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    got = consume_all(kafka.bootstrap, sink, 2)
    assert sorted(m.value() for m in got) == sorted(b"V%d" % i for i in range(50))
