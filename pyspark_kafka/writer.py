"""Batch and streaming sinks: Arrow batches from Spark produced with confluent-kafka.

Column conventions are Spark's Kafka sink: `value` (string or binary, required), `key` (string or
binary), `topic` (string; the `topic` option wins over it), `headers` (array of struct<key string,
value binary>), `partition` (int), `timestamp` (timestamp). Other columns are ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
    TimestampType,
)

from pyspark_kafka.options import OptionError, SinkOptions

log = logging.getLogger("pyspark_kafka")

HEADERS_SPARK_TYPE = ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))

NULL_TOPIC_MESSAGE = (
    "The Kafka message data sent to the producer contains a null topic. "
    "Use the `topic` option for setting a default topic."
)


def _same_type(a: DataType, b: DataType) -> bool:
    """Spark's DataTypeUtils.sameType: equal ignoring nullability."""
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return _same_type(a.elementType, b.elementType)
    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and _same_type(x.dataType, y.dataType) for x, y in zip(a.fields, b.fields)
        )
    return type(a) is type(b)


def validate_schema(schema: StructType, topic: str | None) -> None:
    """Spark's KafkaWriter.validateQuery, with its messages."""
    fields = {f.name: f.dataType for f in schema.fields}

    def check(name: str, desired: list[DataType], missing: str | None) -> None:
        if name not in fields:
            if missing is not None:
                raise OptionError(missing)
            return
        actual = fields[name]
        if not any(_same_type(actual, d) for d in desired):
            raise OptionError(
                "%s attribute unsupported type %s. %s must be a(n) %s"
                % (name, actual.simpleString(), name, " or ".join(d.simpleString() for d in desired))
            )

    if topic is None:
        check("topic", [StringType()],
              "topic option required when no 'topic' attribute is present. Use the topic option for setting a topic.")
    check("key", [StringType(), BinaryType()], None)
    check("value", [StringType(), BinaryType()], "Required attribute 'value' not found")
    check("headers", [HEADERS_SPARK_TYPE], None)
    check("partition", [IntegerType()], None)
    check("timestamp", [TimestampType()], None)


def producer_config(kafka: dict[str, str]) -> dict[str, Any]:
    conf: dict[str, Any] = {"linger.ms": "5", "batch.size": "1000000"}
    conf.update(kafka)
    conf["delivery.report.only.error"] = True  # a delivery callback only for failures
    conf["logger"] = log
    return conf


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


def _bytes_column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    index = batch.schema.get_field_index(name)
    if index < 0:
        return None
    col = batch.column(index)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary())
    return col.to_pylist()


class RecordSender:
    """Produces rows and remembers the first delivery failure (Spark's KafkaRowWriter)."""

    def __init__(self, producer: Producer, default_topic: str | None) -> None:
        self.producer = producer
        self.default_topic = default_topic
        self.failure: KafkaError | None = None
        self.count = 0

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None and self.failure is None:
            self.failure = err

    def check(self) -> None:
        if self.failure is not None:
            raise KafkaException(self.failure)

    def send(self, batches: Iterator[pa.RecordBatch]) -> None:
        produce = self.producer.produce
        poll = self.producer.poll
        callback = self._on_delivery
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            values = _bytes_column(batch, "value")
            assert values is not None
            keys = _bytes_column(batch, "key") or [None] * n
            if self.default_topic is not None:
                topics: list[Any] = [self.default_topic] * n
            else:
                topics = _column(batch, "topic") or [None] * n
            partitions = _column(batch, "partition")
            headers = _column(batch, "headers")
            timestamps = self._timestamps(batch)
            for i in range(n):
                topic = topics[i]
                if topic is None:
                    raise RuntimeError(NULL_TOPIC_MESSAGE)
                kwargs: dict[str, Any] = {}
                if partitions is not None and partitions[i] is not None:
                    kwargs["partition"] = partitions[i]
                if timestamps is not None and timestamps[i] is not None:
                    kwargs["timestamp"] = timestamps[i]
                if headers is not None and headers[i]:
                    kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
                while True:
                    try:
                        produce(topic, values[i], keys[i], on_delivery=callback, **kwargs)
                        break
                    except BufferError:
                        poll(0.1)  # the client's queue is full: wait for deliveries
            self.count += n
            poll(0)
            self.check()

    @staticmethod
    def _timestamps(batch: pa.RecordBatch) -> list[Any] | None:
        index = batch.schema.get_field_index("timestamp")
        if index < 0:
            return None
        col = batch.column(index)
        # microseconds since the epoch -> milliseconds, as Spark strips the micros
        ms = col.cast(pa.timestamp("ms", tz=col.type.tz), safe=False).cast(pa.int64())
        return ms.to_pylist()

    def flush(self, timeout: float = 300.0) -> None:
        remaining = self.producer.flush(timeout)
        self.check()
        if remaining:
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "%d records not delivered" % remaining))


@dataclass
class KafkaCommitMessage(WriterCommitMessage):
    records: int
    partition_id: int
    transactional_id: str | None = None


def _task_partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def write_at_least_once(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:
    producer = Producer(producer_config(options.kafka))
    sender = RecordSender(producer, options.topic)
    sender.send(batches)
    sender.flush()
    return KafkaCommitMessage(sender.count, _task_partition_id())


class KafkaBatchWriter(DataSourceArrowWriter):
    """`df.write`: every task produces its rows and waits for their acknowledgements (at-least-once,
    as Spark's sink: a retried task may write its rows twice)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:  # type: ignore[override]
        return write_at_least_once(self.options, iterator)


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """`writeStream` with deliveryGuarantee=at-least-once: Spark's own sink semantics."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:  # type: ignore[override]
        return write_at_least_once(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        pass
