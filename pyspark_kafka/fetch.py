"""Executor side of a read: one offset range consumed with confluent-kafka into Arrow record batches.

The hot path makes no per-row Python objects of its own: each consume() call returns a list of
Message objects (made in C by the client), and every column is built from that list by one C-level
pass (`map` over an unbound Message method, then `pyarrow.array`); topic and partition are
constant columns (`pyarrow.repeat`), timestamps are converted by Arrow kernels.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator
from itertools import repeat
from operator import is_not, itemgetter
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from pyspark_kafka.planning import OffsetRange, report_data_loss

log = logging.getLogger("pyspark_kafka")

HEADERS_TYPE = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))

_BASE_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow form of Spark's Kafka schema, as Spark converts it (timestamps in UTC microseconds)."""
    return pa.schema(_BASE_FIELDS + ([pa.field("headers", HEADERS_TYPE)] if include_headers else []))


_SCHEMAS = {False: arrow_schema(False), True: arrow_schema(True)}

# Consumer settings that keep the client's prefetch queue full: with librdkafka's defaults a
# partition read stalls for `fetch.queue.backoff.ms` whenever the queue is at its threshold.
EXECUTOR_DEFAULTS = {
    "queued.min.messages": "1000000",
    "fetch.queue.backoff.ms": "0",
}
# Settings the source owns (Spark's kafkaParamsForExecutors).
EXECUTOR_FORCED = {
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    "auto.offset.reset": "error",
    "enable.partition.eof": "true",
}

_KEY = Message.key
_VALUE = Message.value
_OFFSET = Message.offset
_TIMESTAMP = Message.timestamp
_HEADERS = Message.headers
_ERROR = Message.error

CONSUME_BATCH = 10_000
_NONES = repeat(None)
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)
_MS = pa.timestamp("ms", tz="UTC")
_US = pa.timestamp("us", tz="UTC")
_ONE = pa.scalar(1, pa.int32())


def consumer_config(kafka: dict[str, str], group_id: str) -> dict[str, Any]:
    conf: dict[str, Any] = dict(EXECUTOR_DEFAULTS)
    conf["group.id"] = group_id
    conf.update(kafka)
    conf.update(EXECUTOR_FORCED)
    conf["logger"] = log
    return conf


def to_record_batch(msgs: list[Message], offsets: list[int], topic: str, partition: int,
                    include_headers: bool) -> pa.RecordBatch:
    """Arrow columns for a list of data messages of one partition (`offsets`: their offsets)."""
    n = len(msgs)
    stamps = list(map(_TIMESTAMP, msgs))  # (type, milliseconds) pairs
    columns = [
        pa.array(list(map(_KEY, msgs)), pa.binary()),
        pa.array(list(map(_VALUE, msgs)), pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pa.array(list(map(_SECOND, stamps)), pa.int64()).cast(_MS).cast(_US),
        # confluent-kafka: 0 none, 1 create time, 2 log append time; Kafka's ids are one less
        pc.subtract(pa.array(list(map(_FIRST, stamps)), pa.int32()), _ONE),
    ]
    if include_headers:
        columns.append(pa.array(list(map(_HEADERS, msgs)), HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=_SCHEMAS[include_headers])


class RangeReader:
    """Reads one OffsetRange; raises on data loss when failOnDataLoss is true (Spark's KafkaDataConsumer)."""

    def __init__(self, conf: dict[str, Any], rng: OffsetRange, include_headers: bool,
                 poll_timeout_ms: int, fail_on_data_loss: bool) -> None:
        self.conf = conf
        self.rng = rng
        self.include_headers = include_headers
        self.poll_timeout = poll_timeout_ms / 1000.0
        self.fail_on_data_loss = fail_on_data_loss

    def batches(self) -> Iterator[pa.RecordBatch]:
        rng = self.rng
        if rng.size <= 0:
            return
        consumer = Consumer(self.conf)
        try:
            consumer.assign([TopicPartition(rng.topic, rng.partition, rng.from_offset)])
            yield from self._consume(consumer)
        finally:
            consumer.close()

    def _consume(self, consumer: Consumer) -> Iterator[pa.RecordBatch]:
        rng = self.rng
        position = rng.from_offset  # the next offset we expect
        deadline = time.monotonic() + self.poll_timeout
        done = False
        while not done and position < rng.until_offset:
            msgs = consumer.consume(num_messages=CONSUME_BATCH, timeout=min(1.0, self.poll_timeout))
            if not msgs:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        "Cannot fetch record for offset %d in %d milliseconds"
                        % (position, int(self.poll_timeout * 1000))
                    )
                continue
            deadline = time.monotonic() + self.poll_timeout
            errors = list(map(_ERROR, msgs))
            if any(map(is_not, errors, _NONES)):  # identity: KafkaError does not compare with None
                msgs, position, done = self._handle_events(consumer, msgs, errors, position)
            if not msgs:
                continue
            offsets = cast(list[int], list(map(_OFFSET, msgs)))  # data messages all have one
            if offsets[0] > position:
                self._check_gap(consumer, position, offsets[0])
            cut = bisect.bisect_left(offsets, rng.until_offset)
            if cut < len(msgs):
                msgs = msgs[:cut]
                done = True
            if msgs:
                position = offsets[len(msgs) - 1] + 1
                if cut < len(offsets):
                    offsets = offsets[:cut]
                yield to_record_batch(msgs, offsets, rng.topic, rng.partition, self.include_headers)

    def _handle_events(self, consumer: Consumer, msgs: list[Message], errors: list[Any],
                       position: int) -> tuple[list[Message], int, bool]:
        """Separate end-of-partition events and errors from the data messages.

        Returns (data messages, next expected offset, whether the range is complete). The end of
        the log (the last stable offset under read_committed) at or past the range's end means the
        offsets not received were transaction markers or aborted records."""
        rng = self.rng
        data = [m for m, e in zip(msgs, errors) if e is None]
        done = False
        for msg, err in zip(msgs, errors):
            if err is None:
                continue
            code = err.code()
            if code == KafkaError._PARTITION_EOF:
                done = done or (msg.offset() or 0) >= rng.until_offset
            elif code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                low, _high = consumer.get_watermark_offsets(TopicPartition(rng.topic, rng.partition), timeout=10)
                report_data_loss(
                    "Cannot fetch offset %d (GroupId: %s, TopicPartition: %s-%d). "
                    % (position, self.conf.get("group.id"), rng.topic, rng.partition)
                    + "Some data may have been lost because they are not available in Kafka any more",
                    self.fail_on_data_loss, log.warning,
                )
                position = max(low, position)
                if position >= rng.until_offset:
                    return [], position, True
                consumer.seek(TopicPartition(rng.topic, rng.partition, position))
                return [], position, False
            elif err.fatal() or not err.retriable():
                raise RuntimeError("Kafka error reading %s-%d: %s" % (rng.topic, rng.partition, err.str()))
            else:
                log.warning("transient Kafka error reading %s-%d: %s", rng.topic, rng.partition, err.str())
        return data, position, done

    def _check_gap(self, consumer: Consumer, expected: int, got: int) -> None:
        """A jump forward is normal after compaction or transaction markers; it is data loss when
        the offsets we skipped are below the log start offset."""
        tp = TopicPartition(self.rng.topic, self.rng.partition)
        low, _high = consumer.get_watermark_offsets(tp, cached=True)
        if low < 0:  # not known yet from fetch responses
            low, _high = consumer.get_watermark_offsets(tp, timeout=10)
        if expected < low:
            report_data_loss(
                "Cannot fetch offset %d (GroupId: %s, TopicPartition: %s-%d); the earliest available "
                "offset is %d" % (expected, self.conf.get("group.id"), self.rng.topic, self.rng.partition, low),
                self.fail_on_data_loss, log.warning,
            )
