"""A streaming pipeline on Spark through the pyspark_kafka data source.

Events (JSON) are produced into the topic `events`; a Structured Streaming job parses them,
counts actions per 10-second event-time window with a 5-second watermark, and writes each closed
window as JSON to the topic `action-counts`, keeping its progress in a checkpoint directory.

Against `make run`'s broker (in another terminal):

    make pipeline                       # = .venv/bin/python examples/spark_pipeline.py

Options: --bootstrap HOST:PORT (127.0.0.1:9092), --seconds N (how long events are produced, 40),
--checkpoint DIR (./data-pipeline-checkpoint; run again with the same directory and the query
resumes where it stopped). Needs a Java 17 runtime and the `spark` extra (pyspark, pyarrow).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

EVENTS, COUNTS = "events", "action-counts"
ACTIONS = ["view", "click", "cart", "buy"]


def ensure_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=10).topics
    new = [NewTopic(t, 3, 1) for t in (EVENTS, COUNTS) if t not in existing]
    for future in admin.create_topics(new).values() if new else []:
        future.result(timeout=30)


def produce_events(bootstrap: str, seconds: float, stop: threading.Event) -> None:
    """About 200 events a second for `seconds`; a few arrive late (up to 3 s in the past)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline and not stop.is_set():
        now = datetime.now(UTC)
        for _ in range(20):
            late = timedelta(seconds=random.random() * 3) if random.random() < 0.1 else timedelta()
            event = {"user": "user-%d" % random.randrange(50), "action": random.choice(ACTIONS),
                     "ts": (now - late).isoformat()}
            producer.produce(EVENTS, json.dumps(event).encode(), key=event["user"].encode())
            n += 1
        producer.poll(0)
        time.sleep(0.1)
    producer.flush(30)
    print("produced %d events" % n, file=sys.stderr)


def run_query(spark, bootstrap: str, checkpoint: str):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    schema = "user string, action string, ts timestamp"
    events = (spark.readStream.format("pyspark_kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", EVENTS)
              .option("startingOffsets", "earliest")
              .load()
              .select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
              .select("e.*"))
    counts = (events.withWatermark("ts", "5 seconds")
              .groupBy(F.window("ts", "10 seconds"), "action")
              .count())
    out = counts.select(
        F.col("action").alias("key"),
        F.to_json(F.struct(F.col("window.start").alias("start"), F.col("window.end").alias("end"),
                           "action", "count")).alias("value"),
    )
    return (out.writeStream.format("pyspark_kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", COUNTS)
            .option("checkpointLocation", checkpoint)
            .outputMode("append")
            .trigger(processingTime="2 seconds")
            .start())


def print_counts(bootstrap: str) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pipeline-printer",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(COUNTS, p, 0) for p in range(3)])
    rows = []
    idle = time.monotonic() + 3
    while time.monotonic() < idle:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            rows.append(json.loads(msg.value()))
            idle = time.monotonic() + 1
    consumer.close()
    for r in sorted(rows, key=lambda r: (r["start"], r["action"])):
        print("%s .. %s  %-6s %5d" % (r["start"], r["end"][11:19], r["action"], r["count"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--checkpoint", default="./data-pipeline-checkpoint")
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import pyspark_kafka

    ensure_topics(args.bootstrap)
    spark = (SparkSession.builder.master("local[2]").appName("pyspark_kafka pipeline")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    pyspark_kafka.register(spark)

    stop = threading.Event()
    producer = threading.Thread(target=produce_events, args=(args.bootstrap, args.seconds, stop), daemon=True)
    producer.start()
    query = run_query(spark, args.bootstrap, args.checkpoint)
    try:
        producer.join()
        # let the watermark pass the last windows: one more late batch of events moves it on
        time.sleep(8)
        produce_events(args.bootstrap, 1, stop)
        time.sleep(6)
        query.processAllAvailable()
    finally:
        stop.set()
        query.stop()
        spark.stop()
    print_counts(args.bootstrap)


if __name__ == "__main__":
    main()
