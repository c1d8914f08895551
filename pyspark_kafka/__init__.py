"""A PySpark data source for Kafka (the Python Data Source API of PySpark 4.2+).

Reads and writes Kafka topics, batch and streaming, with the contract of Spark's JVM Kafka
connector (schema, options, checkpointed offsets) through confluent-kafka; streaming writes are
exactly-once by default. Works against any Kafka-compatible broker.
"""

from __future__ import annotations

from typing import Any

from pyspark_kafka.source import FORMAT, KafkaDataSource

__all__ = ["FORMAT", "KafkaDataSource", "register"]


def register(spark: Any) -> None:
    """Register the data source in a SparkSession under the format name `pyspark_kafka`."""
    spark.dataSource.register(KafkaDataSource)
