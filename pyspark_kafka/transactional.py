"""Exactly-once streaming sink: each task writes its part of a micro-batch in one Kafka transaction.

How a replayed micro-batch never duplicates output:

* Every task of query Q writing partition P of a micro-batch uses the transactional id
  `<transactionalIdPrefix>-Q-P`. Q is the query's id, which Spark keeps in the checkpoint, so a
  restarted query uses the same ids. `init_transactions()` fences every earlier producer with that
  id (a zombie attempt of the task, a speculative copy, the task of a driver that was killed) and
  aborts its open transaction, or waits until its commit has completed.
* Inside the transaction, next to the records, the task commits an offset for the consumer group
  `<transactionalIdPrefix>-Q-P`: the micro-batch id (one entry per output topic, on its partition
  0). Records and marker become visible atomically, or not at all.
* After `init_transactions()` and before writing, the task reads the group's committed offsets
  (require_stable: a commit still being completed makes the broker answer "retry"). If the marker
  already holds this micro-batch id, an earlier attempt committed this part of the micro-batch: the
  task writes nothing. This covers a driver killed after the tasks committed but before Spark
  recorded the micro-batch as done, and a task whose success report was lost.

Two attempts can never both commit: the later `init_transactions()` fences the earlier producer,
and an attempt that starts after a commit sees the marker. Output becomes visible per task, not
per micro-batch (a read_committed consumer may see part of a micro-batch before the rest); the
guarantee is that every input record is written exactly once. It relies on Spark replaying a
micro-batch with the same rows in the same task partitions, as Spark's exactly-once guarantees do
in general. An attempt that dies mid-write leaves its transaction open until the next attempt of
the same task fences it, or until `transaction.timeout.ms` (librdkafka's default 60 s) aborts it;
until then read_committed consumers of its partitions wait at the last stable offset.

`deliveryGuarantee=at-least-once` turns this off (Spark's own sink semantics).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from pyspark_kafka.admin import admin_config
from pyspark_kafka.options import SinkOptions
from pyspark_kafka.writer import KafkaCommitMessage, RecordSender, producer_config

log = logging.getLogger("pyspark_kafka")

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's StreamExecution.QUERY_ID_KEY
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark's MicroBatchExecution.BATCH_ID_KEY
TIMEOUT = 60.0


def transactional_id(prefix: str, query_id: str, partition_id: int) -> str:
    return "%s-%s-%d" % (prefix, query_id, partition_id)


def marker_offsets(topics: set[str], batch_id: int, query_id: str) -> list[TopicPartition]:
    metadata = "pyspark_kafka query %s batch %d" % (query_id, batch_id)
    return [TopicPartition(t, 0, batch_id, metadata=metadata) for t in sorted(topics)]


def committed_batch(admin: AdminClient, group: str) -> int:
    """The highest micro-batch id this task's marker group holds; -1 when none."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], require_stable=True,
                                                request_timeout=TIMEOUT)
    result = futures[group].result()
    offsets = [tp.offset for tp in (result.topic_partitions or []) if tp.error is None]
    return max(offsets, default=-1)


class TransactionalTask:
    """One task's exactly-once write of its part of a micro-batch."""

    def __init__(self, options: SinkOptions, query_id: str, batch_id: int, partition_id: int) -> None:
        self.options = options
        self.query_id = query_id
        self.batch_id = batch_id
        self.partition_id = partition_id
        self.tid = transactional_id(options.transactional_id_prefix, query_id, partition_id)

    def run(self, batches: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:
        conf = producer_config(self.options.kafka)
        conf["transactional.id"] = self.tid
        producer = Producer(conf)
        producer.init_transactions(TIMEOUT)  # fences earlier attempts, ends their transaction
        admin = AdminClient(admin_config(self.options.kafka))
        done = committed_batch(admin, self.tid)
        if done >= self.batch_id:
            log.info("micro-batch %d of task %s was committed by an earlier attempt; nothing to write",
                     self.batch_id, self.tid)
            for _ in batches:  # Spark feeds the whole partition; take it and drop it
                pass
            return KafkaCommitMessage(0, self.partition_id, self.tid)
        sender = _TopicTrackingSender(producer, self.options.topic)
        producer.begin_transaction()
        try:
            sender.send(batches)
            sender.flush()
            if sender.topics:
                group = self._group_metadata()
                producer.send_offsets_to_transaction(
                    marker_offsets(sender.topics, self.batch_id, self.query_id), group, TIMEOUT
                )
            producer.commit_transaction(TIMEOUT)
        except BaseException:
            try:
                producer.abort_transaction(TIMEOUT)
            except KafkaException as e:  # fenced or fatal: the next attempt's init ends it
                log.warning("could not abort transaction of %s: %s", self.tid, e)
            raise
        return KafkaCommitMessage(sender.count, self.partition_id, self.tid)

    def _group_metadata(self) -> Any:
        consumer = Consumer({**admin_config(self.options.kafka), "group.id": self.tid})
        try:
            return consumer.consumer_group_metadata()
        finally:
            consumer.close()


class _TopicTrackingSender(RecordSender):
    """A RecordSender that remembers which topics it wrote to (for the marker)."""

    def __init__(self, producer: Producer, default_topic: str | None) -> None:
        super().__init__(producer, default_topic)
        self.topics: set[str] = set()

    def send(self, batches: Iterator[pa.RecordBatch]) -> None:
        def tracked() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                if batch.num_rows:
                    if self.default_topic is not None:
                        self.topics.add(self.default_topic)
                    else:
                        column = batch.column(batch.schema.get_field_index("topic"))
                        self.topics.update(t for t in column.unique().to_pylist() if t is not None)
                yield batch

        super().send(tracked())


def _task_context() -> tuple[str, int, int]:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the exactly-once Kafka sink runs only inside a Spark task")
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
    if not query_id or batch_id is None:
        raise RuntimeError(
            "the exactly-once Kafka sink needs a streaming query's id and micro-batch id; "
            "set deliveryGuarantee=at-least-once to write without them"
        )
    return query_id, int(batch_id), context.partitionId()


class KafkaTransactionalStreamWriter(DataSourceStreamArrowWriter):
    """`writeStream` (deliveryGuarantee=exactly-once, the default)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:  # type: ignore[override]
        query_id, batch_id, partition_id = _task_context()
        return TransactionalTask(self.options, query_id, batch_id, partition_id).run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        pass  # every task committed its own transaction

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        pass  # committed tasks stay committed; the replay skips them (see the module's doc)
