"""Client quota APIs over raw frames (AlterClientQuotas / DescribeClientQuotas with Kafka's
validation and filters, persistence) and enforcement: throttle_time_ms and the muted connection
for request_percentage and producer_byte_rate."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.security.inprocess import SecureBrokerThread

E = ErrorCode
DESCRIBE_QUOTAS, ALTER_QUOTAS, PRODUCE, METADATA = 48, 49, 0, 3
A = M.AlterClientQuotasRequest
D = M.DescribeClientQuotasRequest


def entry(entity: dict[str, str | None], ops: dict[str, float | None]) -> Any:
    return A.EntryData(entity=[A.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()],
                       ops=[A.OpData(key=k, value=v or 0.0, remove=v is None) for k, v in ops.items()])


def alter(c: Any, *entries: Any, validate_only: bool = False) -> list[tuple[int, str | None]]:
    response = c.call(ALTER_QUOTAS, 1, A(entries=list(entries), validate_only=validate_only))
    return [(e.error_code, e.error_message) for e in response.entries]


def describe(c: Any, components: list[tuple[str, int, str | None]], strict: bool = False) -> Any:
    return c.call(DESCRIBE_QUOTAS, 1, D(components=[D.ComponentData(entity_type=t, match_type=m, match=v)
                                                    for t, m, v in components], strict=strict))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[SecureBrokerThread]:
    with SecureBrokerThread(tmp_path, {"quota.window.num": "2"}) as bt:
        yield bt


def test_alter_and_describe(broker: SecureBrokerThread) -> None:
    c = broker.client()
    assert alter(c, entry({"user": "alice"}, {"producer_byte_rate": 1024.0}),
                 entry({"user": None, "client-id": "app"}, {"consumer_byte_rate": 2048.0}),
                 entry({"client-id": None}, {"request_percentage": 12.5})) == [(0, None)] * 3
    assert alter(c, entry({"user": "bob"}, {"producer_byte_rate": 1.5})) == [
        (E.INVALID_REQUEST, "producer_byte_rate cannot be a fractional value.")]
    assert alter(c, entry({"user": "bob"}, {"nonsense": 1.0})) == [(E.INVALID_REQUEST, "Invalid configuration key nonsense")]
    assert alter(c, entry({"user": "bob"}, {"request_percentage": -1.0})) == [
        (E.INVALID_REQUEST, "Quota request_percentage must be greater than 0")]
    assert alter(c, entry({"group": "g"}, {"producer_byte_rate": 1.0})) == [
        (E.INVALID_REQUEST, "Unhandled client quota entity type: group")]
    assert alter(c, entry({"ip": "not-an-ip"}, {"connection_creation_rate": 5.0}))[0][0] == E.INVALID_REQUEST
    assert alter(c, entry({"user": "carol"}, {"producer_byte_rate": 5.0}), validate_only=True) == [(0, None)]
    everything = describe(c, [])
    assert sorted(repr(sorted((e.entity_type, e.entity_name) for e in x.entity)) for x in everything.entries) == [
        "[('client-id', 'app'), ('user', None)]", "[('client-id', None)]", "[('user', 'alice')]"]
    alice = describe(c, [("user", 0, "alice")]).entries
    assert [(v.key, v.value) for v in alice[0].values] == [("producer_byte_rate", 1024.0)]
    assert len(describe(c, [("user", 1, None)]).entries) == 1  # the default user
    assert len(describe(c, [("client-id", 2, None)]).entries) == 2  # any specified client-id
    assert len(describe(c, [("client-id", 2, None)], strict=True).entries) == 1
    bad = describe(c, [("user", 0, None)])
    assert (bad.error_code, bad.entries) == (E.INVALID_REQUEST, None)
    assert describe(c, [("group", 0, "g")]).error_code == E.UNSUPPORTED_VERSION
    # removal, and persistence across a restart
    assert alter(c, entry({"user": "alice"}, {"producer_byte_rate": None})) == [(0, None)]
    c.close()
    broker.restart()
    c = broker.client()
    assert len(describe(c, []).entries) == 2
    c.close()


def test_request_percentage_throttles_and_mutes(broker: SecureBrokerThread) -> None:
    c = broker.client(client_id="busy")
    assert alter(c, entry({"client-id": "busy"}, {"request_percentage": 0.01})) == [(0, None)]
    throttles = []
    for _ in range(40):
        throttles.append(c.call(METADATA, 12, M.MetadataRequest(topics=[], allow_auto_topic_creation=False))
                         .throttle_time_ms)
        if throttles[-1]:
            break
    assert throttles[-1] > 0
    start = time.monotonic()
    c.call(METADATA, 12, M.MetadataRequest(topics=[], allow_auto_topic_creation=False))
    assert time.monotonic() - start >= min(throttles[-1], 1000) / 1000.0 * 0.8  # muted for the throttle time
    other = broker.client(client_id="other")  # another client is not throttled
    assert other.call(METADATA, 12, M.MetadataRequest(topics=[], allow_auto_topic_creation=False)).throttle_time_ms == 0
    other.close()
    c.close()


def test_producer_byte_rate_throttles_produce(broker: SecureBrokerThread) -> None:
    broker.create_topic("t")
    c = broker.client(client_id="producer")
    assert alter(c, entry({"client-id": "producer"}, {"producer_byte_rate": 10_000.0})) == [(0, None)]
    P = M.ProduceRequest
    records = build_batch([(None, b"x" * 5000)] * 4, base_timestamp=None)
    request = P(transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
        P.TopicProduceData(name="t", partition_data=[P.PartitionProduceData(index=0, records=records)])])
    first = c.call(PRODUCE, 9, request)
    assert first.responses[0].partition_responses[0].error_code == 0
    assert first.throttle_time_ms > 0  # 20 kB against 10 kB/s over a 1 s window
    c.close()
