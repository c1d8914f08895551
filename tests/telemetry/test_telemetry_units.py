"""Client telemetry without a broker: the OTLP decoder, subscriptions and their matching, the
rate limits of GetTelemetrySubscriptions and PushTelemetry on a manual clock, the collector."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from broker.observability.telemetry import ClientTelemetry
from broker.observability.telemetry.exporter import TelemetryCollector, prometheus_name
from broker.observability.telemetry.manager import ClientMetricsManager, validate_subscription
from broker.observability.telemetry.otlp import (
    CUMULATIVE,
    DELTA,
    GAUGE,
    SUM,
    OtlpError,
    Point,
    decode_metrics_data,
    encode_metrics_data,
)
from protocol.compression import compress
from protocol.errors import ErrorCode, KafkaError

CLIENT = {"client_id": "app-1", "client_software_name": "librdkafka", "client_software_version": "2.16.0",
          "client_source_address": "127.0.0.1", "client_source_port": "5000"}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def test_otlp_round_trip_and_bad_input() -> None:
    points = [
        Point("org.apache.kafka.producer.connection.creation.rate", GAUGE, 1.5, (("node.id", "1"),), 7),
        Point("org.apache.kafka.producer.connection.creation.total", SUM, 3.0, (), 8, DELTA, True),
    ]
    decoded = decode_metrics_data(encode_metrics_data({"client_rack": "r1"}, points))
    assert decoded.resource == (("client_rack", "r1"),)
    assert decoded.points == points
    for bad in (b"\x0a\x05abc", b"\x0b", b"\xff" * 12):
        with pytest.raises(OtlpError):
            decode_metrics_data(bad)
    assert decode_metrics_data(b"").points == []


def test_subscription_validation() -> None:
    validate_subscription("s", {"metrics": "org.apache.kafka.", "interval.ms": "100", "match": "client_id=app.*"})
    cases = [
        ("", {}, ErrorCode.INVALID_REQUEST),
        ("s", {"nope": "1"}, ErrorCode.INVALID_REQUEST),
        ("s", {"interval.ms": "99"}, ErrorCode.INVALID_REQUEST),
        ("s", {"interval.ms": "x"}, ErrorCode.INVALID_CONFIG),
        ("s", {"match": "client_id"}, ErrorCode.INVALID_CONFIG),
        ("s", {"match": "color=red"}, ErrorCode.INVALID_CONFIG),
        ("s", {"match": "client_id=("}, ErrorCode.INVALID_CONFIG),
    ]
    for name, configs, code in cases:
        with pytest.raises(KafkaError) as info:
            validate_subscription(name, configs)
        assert info.value.code == code, (name, configs)


def test_matching_and_rate_limits() -> None:
    subs: dict[str, dict[str, str]] = {
        "producers": {"metrics": "org.apache.kafka.producer.", "interval.ms": "1000", "match": "client_id=app-.*"},
        "others": {"metrics": "org.apache.kafka.consumer.", "match": "client_software_name=java"},
    }
    clock = Clock()
    m = ClientMetricsManager(lambda: subs, clock, 100)
    got = m.get_subscriptions(uuid.UUID(int=0), CLIENT)
    assert got.error == ErrorCode.NONE and got.instance_id.int != 0
    assert (got.metrics, got.push_interval_ms) == (["org.apache.kafka.producer."], 1000)
    # again before the interval: throttled; after it: answered
    assert m.get_subscriptions(got.instance_id, CLIENT).error == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    clock.now += 1000
    again = m.get_subscriptions(got.instance_id, CLIENT)
    assert (again.error, again.subscription_id) == (ErrorCode.NONE, got.subscription_id)
    # a push right after a get is accepted; the next one only an interval later
    m.check_push(got.instance_id, CLIENT, got.subscription_id, False, 0, 10)
    with pytest.raises(KafkaError) as early:
        m.check_push(got.instance_id, CLIENT, got.subscription_id, False, 0, 10)
    assert early.value.code == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    clock.now += 1000
    for sub_id, compression, size, code in [(got.subscription_id + 1, 0, 10, ErrorCode.UNKNOWN_SUBSCRIPTION_ID),
                                            (got.subscription_id, 9, 10, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
                                            (got.subscription_id, 0, 101, ErrorCode.TELEMETRY_TOO_LARGE)]:
        clock.now += 1000
        with pytest.raises(KafkaError) as info:
            m.check_push(got.instance_id, CLIENT, sub_id, False, compression, size)
        assert info.value.code == code
    # a changed subscription gives a new subscription id (and the old one is unknown)
    subs["producers"]["metrics"] = "*"
    clock.now += 1000
    changed = m.get_subscriptions(got.instance_id, CLIENT)
    assert changed.metrics == ["*"] and changed.subscription_id != got.subscription_id
    # terminating: accepted once, nothing after
    m.check_push(got.instance_id, CLIENT, changed.subscription_id, True, 0, 0)
    with pytest.raises(KafkaError) as done:
        m.check_push(got.instance_id, CLIENT, changed.subscription_id, True, 0, 0)
    assert done.value.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(KafkaError) as zero:
        m.check_push(uuid.UUID(int=0), CLIENT, 0, False, 0, 0)
    assert zero.value.code == ErrorCode.INVALID_REQUEST
    # a client nothing matches is told to push nothing, at the default interval
    other = m.get_subscriptions(uuid.UUID(int=0), {**CLIENT, "client_id": "x"})
    assert (other.metrics, other.push_interval_ms) == ([], 300000)


def test_pushed_metrics_reach_the_collector() -> None:
    clock = Clock()
    subs = {"all": {"metrics": "*", "interval.ms": "100"}}
    telemetry = ClientTelemetry(lambda: subs, clock, 1 << 20)
    registry = CollectorRegistry()
    registry.register(telemetry.collector)
    got = telemetry.get_subscriptions(uuid.UUID(int=0), CLIENT)
    points = [Point("org.apache.kafka.producer.record.send.total", SUM, 5, (("topic", "t"),), 1, DELTA, True),
              Point("org.apache.kafka.producer.io.wait.ratio", GAUGE, 0.25, (), 1)]
    payload = compress(1, encode_metrics_data({}, points))
    telemetry.push(got.instance_id, CLIENT, got.subscription_id, False, 1, payload)
    clock.now += 100
    telemetry.push(got.instance_id, CLIENT, got.subscription_id, False, 0, encode_metrics_data({}, points[:1]))
    text = generate_latest(registry).decode()
    assert 'org_apache_kafka_producer_record_send_total{client_id="app-1"' in text
    line = next(x for x in text.splitlines() if x.startswith("org_apache_kafka_producer_record_send_total{"))
    assert 'topic="t"' in line and 'client_software_name="librdkafka"' in line and line.endswith(" 10.0")
    assert any(x.startswith("org_apache_kafka_producer_io_wait_ratio{") and x.endswith(" 0.25")
               for x in text.splitlines())
    with pytest.raises(KafkaError) as bad:
        clock.now += 100
        telemetry.push(got.instance_id, CLIENT, got.subscription_id, False, 0, b"\xff\xff")
    assert bad.value.code == ErrorCode.INVALID_RECORD


def test_collector_cumulative_and_expiry() -> None:
    c = TelemetryCollector()
    c.record({"client_instance_id": "a"}, [Point("m", SUM, 3, (), 0, CUMULATIVE, True)], 0, 1000)
    c.record({"client_instance_id": "a"}, [Point("m", SUM, 4, (), 0, CUMULATIVE, True)], 10, 1000)
    assert [s.value for f in c.collect() for s in f.samples if s.name == "m_total"] == [4]
    c.record({"client_instance_id": "b"}, [], 5000, 1000)  # a's series expired meanwhile
    assert list(c.collect()) == []
    assert prometheus_name("1.a-b") == "_1_a_b"
