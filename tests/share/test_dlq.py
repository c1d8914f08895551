"""The dead-letter queue (KIP-1191) of share groups: Kafka's validation rules and messages, the
records and headers written, the partition they go to, topic creation, and the engine's causes."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from broker.share.dlq import (
    DeadLetter,
    DeadLetterQueue,
    DlqSettings,
    TopicView,
    batches,
    dead_letter_records,
    validate,
)
from broker.share.engine import DeadLetterCause, FetchedBatch, SharePartition, ShareSettings
from protocol.errors import ErrorCode, KafkaError
from protocol.records import decode_batch

TOPIC_ID = uuid.uuid4()
ENABLED = {"errors.deadletterqueue.group.enable": "true"}


def settings(name: str = "dlq.g", copy: bool = False, prefix: str = "dlq.", auto_create: bool = False) -> DlqSettings:
    return DlqSettings(name, copy, prefix, auto_create, delivery_count_limit=5)


def topic(name: str = "dlq.g", partitions: int = 1, configs: dict[str, str] | None = None) -> TopicView:
    return TopicView(name, partitions, ENABLED if configs is None else configs, 1048588)


@pytest.mark.parametrize("s, t, message", [
    (settings(""), None, "Configured DLQ topic name in share group: g is empty."),
    (settings("__dlq"), None, "Configured DLQ topic name in share group: g cannot start with __, topic: __dlq."),
    (settings(), topic(configs={}), "DLQ is not enabled on configured DLQ topic for share group: g, topic: dlq.g."),
    (settings(), None, "DLQ topic does not exist and auto create is disabled on cluster for share group: g, "
                       "topic: dlq.g."),
    (settings("errors", auto_create=True), None, "Configured DLQ topic name does not comply with the DLQ topic "
                                                 "prefix in share group: g, topic: errors, prefix: dlq.."),  # (sic)
])
def test_validation_rules_in_kafkas_order(s: DlqSettings, t: TopicView | None, message: str) -> None:
    with pytest.raises(KafkaError) as err:
        validate("g", s, t)
    assert (err.value.code, err.value.message) == (ErrorCode.INVALID_CONFIG, message)


def test_valid_configurations() -> None:
    validate("g", settings(), topic())
    validate("g", settings(auto_create=True), None)
    validate("g", settings("errors", prefix=""), topic("errors"))  # an empty prefix allows any name


def test_records_carry_the_headers_and_the_source_only_when_copied() -> None:
    letter = DeadLetter("g", TOPIC_ID, 3, 10, 11, 2, [(10, 10, DeadLetterCause.CLIENT_REJECT)])
    records = dead_letter_records(letter, "src", {10: (b"k", b"v")}, delivery_count_limit=2, now_ms=1234)
    assert [(r[0], r[1], r[3]) for r in records] == [(b"k", b"v", 1234), (None, None, 1234)]
    assert records[0][2] == [
        ("__dlq.errors.topic", b"src"), ("__dlq.errors.partition", b"3"), ("__dlq.errors.offset", b"10"),
        ("__dlq.errors.group", b"g"), ("__dlq.errors.delivery.count", b"2"),
        ("__dlq.errors.message", b"Offset rejected by client."),
    ]
    # offset 11 has no recorded cause: at the delivery limit it ran out of deliveries
    assert records[1][2][5] == ("__dlq.errors.message", b"Offset delivery count exceeded the threshold.")


def test_batches_stay_under_max_message_bytes() -> None:
    records = [(None, b"x" * 100, [], 0) for _ in range(10)]
    cut = batches(records, 500)
    assert sum(len(b) for b in cut) == 10 and all(len(b) <= 3 for b in cut)
    assert batches([(None, b"x" * 1000, [], 0)], 500) == [[(None, b"x" * 1000, [], 0)]]  # alone, for the log to judge


class FakeCluster:
    def __init__(self, topics: dict[str, TopicView] | None = None) -> None:
        self.topics = topics or {}
        self.created: list[tuple[str, dict[str, str]]] = []
        self.appended: list[tuple[str, int, bytes]] = []

    def topic(self, name: str) -> TopicView | None:
        return self.topics.get(name)

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return "src" if topic_id == TOPIC_ID else None

    async def create_topic(self, name: str, configs: dict[str, str]) -> None:
        self.created.append((name, configs))
        self.topics[name] = TopicView(name, 2, configs, 1048588)

    async def append(self, topic: str, partition: int, records: bytes) -> None:
        self.appended.append((topic, partition, records))

    def read(self, topic_id: uuid.UUID, partition: int, first: int, last: int) -> dict[int, Any]:
        return {o: (None, b"v%d" % o) for o in range(first, last + 1)}


def test_write_creates_the_topic_when_allowed_and_picks_the_partition() -> None:
    cluster = FakeCluster()
    dlq = DeadLetterQueue(cluster, lambda g: settings(copy=True, auto_create=True), wall_clock_ms=lambda: 7)
    asyncio.run(dlq.write(DeadLetter("g", TOPIC_ID, 5, 0, 1, 1, [])))
    assert cluster.created == [("dlq.g", {"errors.deadletterqueue.group.enable": "true",
                                          "message.timestamp.type": "CreateTime"})]
    ((name, partition, data),) = cluster.appended
    assert (name, partition) == ("dlq.g", 1)  # source partition 5 % 2 partitions
    _, records = decode_batch(data, 0)
    assert [bytes(r.value) for r in records] == [b"v0", b"v1"] and records[0].timestamp == 7
    assert dlq.written == 2 and dlq.failed == 0


def test_a_write_that_cannot_be_done_counts_as_failed() -> None:
    dlq = DeadLetterQueue(FakeCluster(), lambda g: settings())
    with pytest.raises(KafkaError):
        asyncio.run(dlq.write(DeadLetter("g", TOPIC_ID, 0, 0, 2, 1, [])))
    assert dlq.failed == 3


def test_the_engine_records_why_records_go_to_archiving() -> None:
    sp = SharePartition(ShareSettings(delivery_count_limit=1, dlq=True))
    sp.load(0, 0, ())
    sp.acquire("m", 0, [FetchedBatch(o, o) for o in range(3)], 500, 500, 0)
    t = sp.acknowledge("m", [AckBatchOf(0, 0, 3), AckBatchOf(1, 1, 2)], 0)
    assert t.dead_letters == [(0, 0, DeadLetterCause.CLIENT_REJECT), (1, 1, DeadLetterCause.DELIVERY_COUNT_EXCEEDED)]
    sp.complete(t, True, 0)
    assert [(r.first_offset, r.last_offset) for r in sp.archiving()] == [(0, 1)]
    expired = sp.expire_locks(10**9)
    assert expired.dead_letters == [(2, 2, DeadLetterCause.DELIVERY_COUNT_EXCEEDED)]


def AckBatchOf(first: int, last: int, type_: int) -> Any:
    from broker.share.engine import AckBatch

    return AckBatch(first, last, [type_])
