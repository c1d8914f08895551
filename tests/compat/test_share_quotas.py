"""Client quotas on share consumers (KIP-932) with confluent-kafka's ShareConsumer: a
consumer_byte_rate quota throttles ShareFetch as it throttles Fetch (throttle_time_ms in the
response, then the connection muted), and librdkafka reports it through throttle_cb.

The first two tests are confluent-kafka-python's own (tests/integration/share_consumer/
test_share_consumer_callbacks.py: test_throttle_cb_fires_under_quota and
test_throttle_cb_emits_cleared_zero_event), with the quota set by AlterClientQuotas frames where
they run kafka-configs.sh (no Python client has the admin call), and log batches of about 10 KB
where theirs are librdkafka's default 1 MB: a fetch of a 1 MB batch against 1 KB/s is throttled for
966 s, as Kafka computes it, and librdkafka's close then waits out its request timeout on the
muted connection. Default broker settings: a quota window of 11 samples of 1 s.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer, ShareConsumer, ThrottleEvent
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from protocol import messages as M
from tests.compat.conftest import create_topic
from tests.harness import BrokerProcess, RawClient

A = M.AlterClientQuotasRequest
SMALL_BATCHES = {"batch.size": 10_000, "linger.ms": 5}  # about 9 records of 1 KB a log batch


def set_quota(kafka: BrokerProcess, client_id: str, key: str, value: float | None) -> None:
    """AlterClientQuotas (v1) for a client-id entity; None removes the key."""
    c = RawClient(kafka.port, "quota-admin")
    try:
        response = c.call(49, 1, A(validate_only=False, entries=[A.EntryData(
            entity=[A.EntityData(entity_type="client-id", entity_name=client_id)],
            ops=[A.OpData(key=key, value=value or 0.0, remove=value is None)])]))
    finally:
        c.close()
    assert response.entries[0].error_code == 0, response.entries[0].error_message


@pytest.fixture
def client_id() -> Any:
    """A client id with its own quota, removed afterwards."""
    made: list[tuple[BrokerProcess, str, str]] = []

    def provision(kafka: BrokerProcess, key: str, value: float) -> str:
        name = "throttled-client-" + uuid.uuid4().hex[:8]
        set_quota(kafka, name, key, value)
        made.append((kafka, name, key))
        return name

    yield provision
    for kafka, name, key in made:
        set_quota(kafka, name, key, None)


def earliest(kafka: BrokerProcess, group_id: str, **configs: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        result = admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group_id, configs={
            "share.auto.offset.reset": "earliest", **configs})], incremental=True)
    finally:
        admin.close()
    assert result == {"group": {group_id: "OK"}}, result


def produce_burst(kafka: BrokerProcess, topic: str, count: int, size: int, **conf: Any) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap, **conf})
    payload = b"x" * size
    for _ in range(count):
        p.produce(topic, value=payload)
        p.poll(0)
    assert p.flush(30) == 0


def throttled_share_consumer(kafka: BrokerProcess, topic: str, client_id: Any, events: list[ThrottleEvent]
                             ) -> ShareConsumer:
    """The set-up of confluent-kafka-python's two tests: 5,000 records of 1 KB in `topic`, a
    ShareConsumer of a new share group (from the earliest offset) whose client id has a 1 KB/s
    consumer_byte_rate, its throttle events appended to `events`."""
    cid = client_id(kafka, "consumer_byte_rate", 1024)
    create_topic(kafka, topic)
    msg_count, msg_size = 5000, 1024
    produce_burst(kafka, topic, msg_count, msg_size, **SMALL_BATCHES)
    group = "share-" + uuid.uuid4().hex[:10]
    earliest(kafka, group)
    return ShareConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "client.id": cid,
                          "throttle_cb": events.append, "fetch.max.bytes": msg_size * msg_count})


def test_throttle_cb_fires_under_quota(kafka: BrokerProcess, topic_name: str, client_id: Any) -> None:
    events: list[ThrottleEvent] = []
    sc = throttled_share_consumer(kafka, topic_name, client_id, events)
    try:
        sc.subscribe([topic_name])
        deadline = time.monotonic() + 30
        consumed = 0
        while time.monotonic() < deadline:
            consumed += sum(1 for m in sc.poll(1.0) if m.error() is None)
            if events and consumed > 0:
                break
        assert events, "no throttle event (consumed %d)" % consumed
        for ev in events:
            assert isinstance(ev, ThrottleEvent)
            assert isinstance(ev.broker_name, str) and ev.broker_name
            assert isinstance(ev.broker_id, int)
            assert ev.throttle_time >= 0.0
        assert any(ev.throttle_time > 0.0 for ev in events), [ev.throttle_time for ev in events]
    finally:
        sc.close()


def test_throttle_cb_emits_cleared_zero_event(kafka: BrokerProcess, topic_name: str, client_id: Any) -> None:
    events: list[ThrottleEvent] = []
    sc = throttled_share_consumer(kafka, topic_name, client_id, events)
    try:
        sc.subscribe([topic_name])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(e.throttle_time > 0 for e in events):
            sc.poll(1.0)
        assert any(e.throttle_time > 0 for e in events), "expected a positive throttle_time event"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(e.throttle_time == 0 for e in events):
            sc.poll(1.0)
        assert any(e.throttle_time == 0.0 for e in events), [e.throttle_time for e in events]
    finally:
        sc.close()


@pytest.mark.timeout(180)
def test_share_consumer_is_held_to_its_rate_and_loses_nothing(kafka: BrokerProcess, topic_name: str,
                                                               client_id: Any) -> None:
    """100 KB/s over a window of 11 s lets a consumer take 100 KB x (10 s + t) by t: 2 MB take
    about 10 s. Every record arrives: what a throttled fetch had acquired was not sent and comes
    again once its acquisition lock has run out (group share.record.lock.duration.ms, 15 s here),
    its delivery counted, as in Kafka."""
    rate, size, count = 100_000, 1000, 2000
    cid = client_id(kafka, "consumer_byte_rate", rate)
    create_topic(kafka, topic_name)
    produce_burst(kafka, topic_name, count, size, **{"batch.size": 50_000, "linger.ms": 5})
    group = "share-" + uuid.uuid4().hex[:10]
    earliest(kafka, group, **{"share.record.lock.duration.ms": "15000"})
    events: list[float] = []
    sc = ShareConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "client.id": cid,
                        "throttle_cb": lambda e: events.append(e.throttle_time)})
    got: list[tuple[int, int]] = []
    try:
        sc.subscribe([topic_name])
        start = time.monotonic()
        deadline = start + 90
        while len({o for o, _ in got}) < count and time.monotonic() < deadline:
            for m in sc.poll(0.5):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.delivery_count()))
        elapsed = time.monotonic() - start
    finally:
        sc.close()
    assert sorted({o for o, _ in got}) == list(range(count))
    assert len(got) == len(set(got))  # no delivery of a record twice
    assert max(events, default=0) > 0
    assert elapsed >= (count * size / rate - 10) * 0.8, elapsed
