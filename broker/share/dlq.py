"""The share groups' dead-letter queue (KIP-1191), as Kafka's ShareGroupDLQStateManager.

A record a member rejects, or that runs out of deliveries, goes to ARCHIVING when its group names a
dead-letter topic (`errors.deadletterqueue.topic.name`); `DeadLetterQueue.write` then appends one
record per offset to that topic, and the share-partition manager archives the offsets (ARCHIVED)
whether the write worked or not. Kafka's rules, checked before each write with its messages:

- the group names a topic that does not start with "__";
- an existing topic has `errors.deadletterqueue.group.enable=true`;
- a missing one is created (broker default partitions, that flag, CreateTime) only when
  `errors.deadletterqueue.auto.create.topics.enable` is true;
- the name starts with `errors.deadletterqueue.topic.name.prefix` ("dlq." by default) unless the
  prefix is empty.

The record for source partition p goes to dead-letter partition p % partitions, timestamped now,
with the headers __dlq.errors.topic / .partition / .offset / .group / .delivery.count / .message;
its key and value are the source record's only with `errors.deadletterqueue.copy.record.enable`.
The write is not atomic with the state change: after a crash between the two the offsets are
written again (the dead-letter topic may hold a record twice, as in Kafka).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from broker.share.engine import DeadLetterCause
from protocol.errors import ErrorCode, KafkaError
from protocol.records import build_batch, decode_batch, iter_batches

HEADER_TOPIC = "__dlq.errors.topic"
HEADER_PARTITION = "__dlq.errors.partition"
HEADER_OFFSET = "__dlq.errors.offset"
HEADER_GROUP = "__dlq.errors.group"
HEADER_DELIVERY_COUNT = "__dlq.errors.delivery.count"
HEADER_MESSAGE = "__dlq.errors.message"
GROUP_ENABLE = "errors.deadletterqueue.group.enable"
RECORD_OVERHEAD = 64  # bytes a record adds to a batch beside its key, value and headers (an upper bound)
BATCH_OVERHEAD = 61


class DeadLetter(NamedTuple):
    """Offsets first..last of a share-partition, delivered `delivery_count` times, going to the DLQ;
    `causes` gives (first, last, cause) pieces (an offset in none of them: DELIVERY_COUNT_EXCEEDED
    at the limit, CLIENT_REJECT below it)."""

    group_id: str
    topic_id: uuid.UUID
    partition: int
    first_offset: int
    last_offset: int
    delivery_count: int
    causes: Sequence[tuple[int, int, DeadLetterCause]] = ()

    def cause_of(self, offset: int, delivery_count_limit: int) -> DeadLetterCause:
        for first, last, cause in self.causes:
            if first <= offset <= last:
                return cause
        if self.delivery_count >= delivery_count_limit:
            return DeadLetterCause.DELIVERY_COUNT_EXCEEDED
        return DeadLetterCause.CLIENT_REJECT


@dataclass(frozen=True)
class DlqSettings:
    topic_name: str  # errors.deadletterqueue.topic.name of the group ("" : none)
    copy_record: bool  # errors.deadletterqueue.copy.record.enable of the group
    prefix: str  # errors.deadletterqueue.topic.name.prefix of the cluster
    auto_create: bool  # errors.deadletterqueue.auto.create.topics.enable of the cluster
    delivery_count_limit: int


class TopicView(NamedTuple):
    name: str
    partitions: int
    configs: Mapping[str, str]
    max_message_bytes: int


class Cluster(Protocol):
    """What the dead-letter queue needs of the broker."""

    def topic(self, name: str) -> TopicView | None: ...

    def topic_name(self, topic_id: uuid.UUID) -> str | None: ...

    async def create_topic(self, name: str, configs: dict[str, str]) -> None: ...

    async def append(self, topic: str, partition: int, records: bytes) -> None: ...

    def read(self, topic_id: uuid.UUID, partition: int, first: int, last: int
             ) -> dict[int, tuple[bytes | None, bytes | None]]: ...


def validate(group_id: str, settings: DlqSettings, topic: TopicView | None) -> None:
    """Kafka's validateDlqTopic, in its order (raises KafkaError INVALID_CONFIG with its message)."""
    name = settings.topic_name
    if not name:
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Configured DLQ topic name in share group: %s is empty." % group_id)
    if name.startswith("__"):
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Configured DLQ topic name in share group: %s cannot start with "
                         "__, topic: %s." % (group_id, name))
    if topic is not None and topic.configs.get(GROUP_ENABLE, "false").strip().lower() != "true":
        raise KafkaError(ErrorCode.INVALID_CONFIG, "DLQ is not enabled on configured DLQ topic for share group: %s, "
                         "topic: %s." % (group_id, name))
    if topic is None and not settings.auto_create:
        raise KafkaError(ErrorCode.INVALID_CONFIG, "DLQ topic does not exist and auto create is disabled on cluster "
                         "for share group: %s, topic: %s." % (group_id, name))
    if settings.prefix and not name.startswith(settings.prefix):
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Configured DLQ topic name does not comply with the DLQ topic "
                         "prefix in share group: %s, topic: %s, prefix: %s." % (group_id, name, settings.prefix))


def dead_letter_records(letter: DeadLetter, source_topic: str, sources: Mapping[int, tuple[bytes | None, bytes | None]],
                        delivery_count_limit: int, now_ms: int) -> list[tuple[Any, ...]]:
    """(key, value, headers, timestamp) of each offset's dead-letter record."""
    out: list[tuple[Any, ...]] = []
    for offset in range(letter.first_offset, letter.last_offset + 1):
        key, value = sources.get(offset, (None, None))
        headers = [
            (HEADER_TOPIC, source_topic.encode()),
            (HEADER_PARTITION, str(letter.partition).encode()),
            (HEADER_OFFSET, str(offset).encode()),
            (HEADER_GROUP, letter.group_id.encode()),
            (HEADER_DELIVERY_COUNT, str(letter.delivery_count).encode()),
            (HEADER_MESSAGE, letter.cause_of(offset, delivery_count_limit).value.encode()),
        ]
        out.append((key, value, headers, now_ms))
    return out


def _size(record: tuple[Any, ...]) -> int:
    key, value, headers, _ = record
    return (RECORD_OVERHEAD + len(key or b"") + len(value or b"")
            + sum(len(k) + len(v or b"") + 10 for k, v in headers))


def batches(records: list[tuple[Any, ...]], max_message_bytes: int) -> list[list[tuple[Any, ...]]]:
    """The records cut into batches under max.message.bytes (a record too large alone goes alone,
    for the log to refuse, as Kafka sends it)."""
    out: list[list[tuple[Any, ...]]] = []
    size = BATCH_OVERHEAD
    for record in records:
        n = _size(record)
        if out and out[-1] and size + n <= max_message_bytes:
            out[-1].append(record)
            size += n
        else:
            out.append([record])
            size = BATCH_OVERHEAD + n
    return out


class DeadLetterQueue:
    def __init__(self, cluster: Cluster, settings_of: Callable[[str], DlqSettings],
                 wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.cluster = cluster
        self.settings_of = settings_of
        self.wall_clock_ms = wall_clock_ms
        self.written = 0  # records written to dead-letter topics
        self.failed = 0  # records given up on (invalid configuration, failed write)

    async def write(self, letter: DeadLetter) -> None:
        """Append the offsets' dead-letter records; raises KafkaError when they cannot be."""
        try:
            await self._write(letter)
        except BaseException:
            self.failed += letter.last_offset - letter.first_offset + 1
            raise
        self.written += letter.last_offset - letter.first_offset + 1

    async def _write(self, letter: DeadLetter) -> None:
        settings = self.settings_of(letter.group_id)
        topic = self.cluster.topic(settings.topic_name) if settings.topic_name else None
        validate(letter.group_id, settings, topic)
        if topic is None:
            await self.cluster.create_topic(settings.topic_name, {GROUP_ENABLE: "true",
                                                                  "message.timestamp.type": "CreateTime"})
            topic = self.cluster.topic(settings.topic_name)
            if topic is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "DLQ topic %s could not be created."
                                 % settings.topic_name)
        source_topic = self.cluster.topic_name(letter.topic_id) or str(letter.topic_id)
        sources = (self.cluster.read(letter.topic_id, letter.partition, letter.first_offset, letter.last_offset)
                   if settings.copy_record else {})
        records = dead_letter_records(letter, source_topic, sources, settings.delivery_count_limit,
                                      self.wall_clock_ms())
        partition = letter.partition % topic.partitions
        for batch in batches(records, topic.max_message_bytes):
            await self.cluster.append(topic.name, partition, build_batch(batch))


DeadLetterWriter = Callable[[DeadLetter], Awaitable[None]]

__all__ = ["DeadLetter", "DeadLetterQueue", "DeadLetterWriter", "DlqSettings", "TopicView", "batches",
           "dead_letter_records", "validate"]


# The broker side of the share groups' dead-letter queue (broker/share/dlq.py): topics from the
# metadata, topic creation, appends to this broker's partitions and reads of the source records.
# (Kafka sends CreateTopics and Produce to the controller and the leader; on one node they are calls.)

READ_CHUNK = 1024 * 1024  # Kafka reads 1 MiB at a time for the DLQ


class BrokerDlqCluster:
    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def topic(self, name: str) -> TopicView | None:
        info = self.broker.metadata.topic(name)
        if info is None:
            return None
        partition = self.broker.partitions.get(name, 0)
        max_bytes = partition.log.config.max_message_bytes if partition is not None else 1048588
        return TopicView(name, info.partitions, dict(info.configs), max_bytes)

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return self.broker.metadata.topic_name(topic_id)

    async def create_topic(self, name: str, configs: dict[str, str]) -> None:
        try:
            await self.broker.create_topic(name, -1, configs)
        except KafkaError as exc:
            if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise

    async def append(self, topic: str, partition: int, records: bytes) -> None:
        target = self.broker.partitions.get(topic, partition)
        if target is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "DLQ partition %s-%d is not here." % (topic, partition))
        await target.append(records)

    def read(self, topic_id: uuid.UUID, partition: int, first: int, last: int
             ) -> dict[int, tuple[bytes | None, bytes | None]]:
        """Key and value of the source records first..last that the log still has."""
        name = self.topic_name(topic_id)
        source = self.broker.partitions.get(name, partition) if name is not None else None
        out: dict[int, tuple[bytes | None, bytes | None]] = {}
        if source is None:
            return out
        offset = max(first, source.log_start_offset)
        while offset <= last:
            data = source.log.read_bytes(offset, READ_CHUNK)
            if not data:
                break
            next_offset = offset
            for pos, header in iter_batches(data):
                next_offset = max(next_offset, header.next_offset)
                if header.is_control:
                    continue
                for record in decode_batch(data, pos)[1]:
                    if offset <= record.offset <= last:
                        key = None if record.key is None else bytes(record.key)
                        value = None if record.value is None else bytes(record.value)
                        out[record.offset] = (key, value)
            if next_offset <= offset:
                break
            offset = next_offset
        return out
