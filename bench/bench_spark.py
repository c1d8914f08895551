"""The pyspark_kafka data source against reading the same topic with confluent-kafka directly.

    flock /work/notes/bench.lock .venv/bin/python bench/bench_spark.py [--records 1000000] [--repeat 3]

Starts our broker (or uses --bootstrap), fills a 2-partition topic with N 100-byte records, then,
alternating, --repeat times:
  client        one process, confluent-kafka consume(num_messages=10000) of both partitions to the
                end: the client's ceiling (rows/s)
  client+arrow  the same, each consumed list turned into an Arrow record batch by the data
                source's converter (pyspark_kafka.fetch.to_record_batch)
  spark batch   spark.read.format("pyspark_kafka") ... .write.format("noop"): every row through
                Spark, local[2] (rows/s, after one warm-up run)
  spark stream  readStream -> writeStream to a second topic with the pyspark_kafka sink
                (at-least-once and exactly-once when the broker has transactions),
                Trigger.AvailableNow, end to end (records/s)
Prints one JSON object (medians and every run); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import peers  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from pyspark_kafka.fetch import EXECUTOR_DEFAULTS, to_record_batch  # noqa: E402

PARTITIONS = 2


def log(msg: str) -> None:
    print("[bench_spark] %s" % msg, file=sys.stderr, flush=True)


def create(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)


def fill(bootstrap: str, topic: str, n: int) -> None:
    create(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000})
    value = os.urandom(50).hex().encode()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value, b"%08d" % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def client_read(bootstrap: str, topic: str, n: int, arrow: bool) -> float:
    """confluent-kafka alone: both partitions by one consumer; with `arrow`, one partition after
    the other (as the data source's tasks read them), every consumed list made a record batch."""
    conf = {"bootstrap.servers": bootstrap, "group.id": "bench-" + uuid.uuid4().hex, "enable.auto.commit": False,
            "enable.partition.eof": True, **EXECUTOR_DEFAULTS}
    got = 0
    start = time.perf_counter()
    for assignment in ([[0], [1]] if arrow else [[0, 1]]):
        consumer = Consumer(conf)
        consumer.assign([TopicPartition(topic, p, 0) for p in assignment])
        eof = 0
        while eof < len(assignment):
            msgs = consumer.consume(num_messages=10_000, timeout=1.0)
            data = [m for m in msgs if m.error() is None]
            eof += len(msgs) - len(data)
            got += len(data)
            if arrow and data:
                to_record_batch(data, [m.offset() for m in data], topic, assignment[0], False)
        consumer.close()
    elapsed = time.perf_counter() - start
    assert got == n, (got, n)
    return n / elapsed


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import pyspark_kafka

    spark = (SparkSession.builder.master("local[2]").appName("bench_spark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    pyspark_kafka.register(spark)
    return spark


def spark_batch(spark: Any, bootstrap: str, topic: str, n: int) -> float:
    df = spark.read.format("pyspark_kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic).load()
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return n / (time.perf_counter() - start)


def spark_stream(spark: Any, bootstrap: str, topic: str, n: int, guarantee: str, workdir: Path) -> float:
    out = "%s-copy-%s" % (topic, uuid.uuid4().hex[:8])
    create(bootstrap, out)
    start = time.perf_counter()
    query = (spark.readStream.format("pyspark_kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest").load()
             .select("key", "value").writeStream.format("pyspark_kafka")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", out)
             .option("deliveryGuarantee", guarantee)
             .option("checkpointLocation", str(workdir / out)).trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - start
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    assert rows == n, (rows, n)
    return n / elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bootstrap", default=None, help="use this broker instead of starting ours")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench_spark-"))
    peer = None if args.bootstrap else peers.start_ours(workdir=workdir)
    bootstrap = args.bootstrap or peer.bootstrap  # type: ignore[union-attr]
    runs: dict[str, list[float | None]] = {k: [] for k in
                                            ("client", "client_arrow", "spark_batch", "stream_alo", "stream_eos")}
    notes: list[str] = []
    try:
        topic = "bench-spark-" + uuid.uuid4().hex[:8]
        log("filling %s with %d records" % (topic, args.records))
        fill(bootstrap, topic, args.records)
        spark = spark_session()
        spark_batch(spark, bootstrap, topic, args.records)  # warm-up: JIT, Python workers
        for r in range(args.repeat):
            runs["client"].append(client_read(bootstrap, topic, args.records, arrow=False))
            runs["spark_batch"].append(spark_batch(spark, bootstrap, topic, args.records))
            runs["client_arrow"].append(client_read(bootstrap, topic, args.records, arrow=True))
            runs["stream_alo"].append(spark_stream(spark, bootstrap, topic, args.records, "at-least-once", workdir))
            try:
                runs["stream_eos"].append(spark_stream(spark, bootstrap, topic, args.records, "exactly-once", workdir))
            except Exception as e:  # a broker without transactions
                runs["stream_eos"].append(None)
                notes.append("exactly-once stream: %s" % str(e).splitlines()[0][:300])
            log("run %d: %s" % (r + 1, {k: (round(v[-1]) if v[-1] else None) for k, v in runs.items()}))
        spark.stop()
    finally:
        if peer is not None:
            peer.stop()

    def median(values: list[float | None]) -> float | None:
        good = [v for v in values if v is not None]
        return round(statistics.median(good)) if good else None

    print(json.dumps({
        "records": args.records, "value_bytes": 100, "partitions": PARTITIONS,
        "rows_per_s": {k: median(v) for k, v in runs.items()},
        "runs": {k: [round(x) if x else None for x in v] for k, v in runs.items()},
        "notes": sorted(set(notes)),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
