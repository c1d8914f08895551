"""A Structured Streaming driver run as its own process by the tests (so that it can be killed -9).

    python -m tests.spark.stream_driver BOOTSTRAP SOURCE_TOPIC CHECKPOINT SINK MODE [TARGET]

SINK is a directory (parquet file sink) or kafka:TOPIC (the pyspark_kafka sink, deliveryGuarantee
from the environment variable DELIVERY, default exactly-once). MODE is `run` (trigger every
200 ms until killed) or `available-now` (everything there is, then exit).
"""

from __future__ import annotations

import os
import sys

from tests.spark.conftest import build_spark


def main() -> None:
    bootstrap, topic, checkpoint, sink, mode = sys.argv[1:6]
    spark = build_spark("pyspark_kafka-driver")
    df = (spark.readStream.format("pyspark_kafka").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", os.environ.get("MAX_OFFSETS", "100")).load())
    if sink.startswith("kafka:"):
        writer = (df.selectExpr("key", "value").writeStream.format("pyspark_kafka")
                  .option("kafka.bootstrap.servers", bootstrap).option("topic", sink[len("kafka:"):])
                  .option("deliveryGuarantee", os.environ.get("DELIVERY", "exactly-once")))
    else:
        writer = (df.selectExpr("cast(value as string) as value", "partition", "offset")
                  .writeStream.format("parquet").option("path", sink))
    writer = writer.option("checkpointLocation", checkpoint)
    if mode == "available-now":
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        writer.trigger(processingTime="200 milliseconds").start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
