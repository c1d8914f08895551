"""The exactly-once streaming sink (deliveryGuarantee=exactly-once, the default): a micro-batch that
Spark replays is not written twice, also after the driver is killed -9 in the middle of one."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.harness import wait_for
from tests.spark.conftest import consume_all, create_topic, produce
from tests.spark.test_streaming import committed_batches, run_to_end, start_driver

FORMAT = "pyspark_kafka"


def copy_query(spark: Any, bootstrap: str, source: str, checkpoint: Path, **sink_options: str) -> Any:
    writer = (spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "40").load()
              .selectExpr("key", "value", "concat('%s-', cast(key as string) %% 2) as topic" % source)
              .writeStream.format(FORMAT).option("kafka.bootstrap.servers", bootstrap)
              .option("checkpointLocation", str(checkpoint)))
    for k, v in sink_options.items():
        writer = writer.option(k, v)
    return writer.trigger(availableNow=True).start()


def values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    return sorted(m.value() for m in consume_all(bootstrap, topic, partitions, isolation="read_committed"))


def forget_last_commit(checkpoint: Path) -> None:
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / (".%d.crc" % last)).unlink(missing_ok=True)


def test_replayed_micro_batch_is_not_written_twice(spark, kafka, topic_name, tmp_path):
    """Spark replays the last micro-batch when the driver died after the tasks committed but before
    the batch was recorded as done: here its commit-log entry is removed, as such a crash leaves it."""
    out = [topic_name + "-0", topic_name + "-1"]
    create_topic(kafka.bootstrap, topic_name, 2)
    for t in out:
        create_topic(kafka.bootstrap, t, 2)
    produce(kafka.bootstrap, topic_name, [{"key": b"%d" % i, "value": b"v%d" % i, "partition": i % 2}
                                          for i in range(100)])
    checkpoint = tmp_path / "c"
    query = copy_query(spark, kafka.bootstrap, topic_name, checkpoint)
    query.awaitTermination(120)
    assert query.exception() is None
    forget_last_commit(checkpoint)
    replay = copy_query(spark, kafka.bootstrap, topic_name, checkpoint)
    replay.awaitTermination(120)
    assert replay.exception() is None
    assert [p["numInputRows"] for p in replay.recentProgress][0] > 0  # the batch ran again
    expected = sorted(b"v%d" % i for i in range(100))
    assert sorted(values(kafka.bootstrap, out[0], 2) + values(kafka.bootstrap, out[1], 2)) == expected
    # without transactions the same replay writes the batch twice (Spark's own sink semantics)
    checkpoint2 = tmp_path / "c2"
    alo = copy_query(spark, kafka.bootstrap, topic_name, checkpoint2, deliveryGuarantee="at-least-once",
                     topic=topic_name + "-alo")
    create_topic(kafka.bootstrap, topic_name + "-alo", 1)
    alo.awaitTermination(120)
    forget_last_commit(checkpoint2)
    again = copy_query(spark, kafka.bootstrap, topic_name, checkpoint2, deliveryGuarantee="at-least-once",
                       topic=topic_name + "-alo")
    again.awaitTermination(120)
    assert len(values(kafka.bootstrap, topic_name + "-alo", 1)) > 100


def batch_in_flight(checkpoint: Path) -> bool:
    """The offset log has a micro-batch the commit log has not: Spark is running it."""
    offsets = checkpoint / "offsets"
    if not offsets.exists():
        return False
    planned = [int(p.name) for p in offsets.iterdir() if p.name.isdigit()]
    return bool(planned) and max(planned) >= 2 and committed_batches(checkpoint) == max(planned)


@pytest.mark.timeout(300)
def test_exactly_once_sink_after_driver_kill_9_mid_batch(spark, kafka, topic_name, tmp_path):
    source, sink = topic_name + "-in", topic_name + "-out"
    create_topic(kafka.bootstrap, source, 2)
    create_topic(kafka.bootstrap, sink, 2)
    produce(kafka.bootstrap, source, [{"key": b"%d" % i, "value": b"%d" % i, "partition": i % 2}
                                      for i in range(3000)])
    checkpoint = tmp_path / "checkpoint"
    env = {"MAX_OFFSETS": "300", "DELIVERY": "exactly-once"}
    proc = start_driver(kafka.bootstrap, source, checkpoint, "kafka:" + sink, "run", env)
    try:
        wait_for(lambda: batch_in_flight(checkpoint) or proc.poll() is not None, timeout=120, interval=0.02,
                 what="a micro-batch in flight")
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    produce(kafka.bootstrap, source, [{"key": b"%d" % i, "value": b"%d" % i, "partition": i % 2}
                                      for i in range(3000, 3500)])
    run_to_end(kafka.bootstrap, source, checkpoint, "kafka:" + sink, env)
    got = values(kafka.bootstrap, sink, 2)
    assert len(got) == 3500, (len(got), len(set(got)))
    assert sorted(int(v) for v in got) == list(range(3500))
    # the checkpoint's offsets are Spark's JSON for the source topic
    last = max((p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    assert json.loads(last.read_text().splitlines()[-1]) == {source: {"0": 1750, "1": 1750}}
