"""/metrics against the truth: offsets and lag under kafka_exporter's names checked against what
real clients see (watermarks and committed offsets through confluent-kafka's admin and consumer,
a kafka-python group and a KIP-848 group), the broker's own metrics, and the Grafana dashboard
asking only for metrics that exist."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from kafka import KafkaConsumer  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.compat.conftest import CompatBroker, create_topic  # noqa: E402
from tests.harness import wait_for  # noqa: E402

BROKER_OVERRIDES = {"metrics.port": "0", "log.flush.interval.messages": "1", "offsets.topic.num.partitions": "3"}
DASHBOARD = Path(__file__).resolve().parents[2] / "docker" / "grafana" / "dashboards" / "kafka-broker.json"
PARTITIONS = 3

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(kafka: CompatBroker) -> Samples:
    assert kafka.broker.http is not None
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % kafka.broker.http.port, timeout=10).read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: Any) -> float | None:
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())))


def produce(kafka: CompatBroker, topic: str, per_partition: int) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
    for i in range(per_partition * PARTITIONS):
        p.produce(topic, b"m%d" % i, partition=i % PARTITIONS)
    assert p.flush(30) == 0


def true_lag(kafka: CompatBroker, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """(committed offset, high watermark - committed) per partition, as confluent-kafka sees them."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    request = confluent_kafka.ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])
    committed = admin.list_consumer_group_offsets([request])[group].result().topic_partitions
    reader = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "watermark-reader"})
    try:
        out = {}
        for tp in committed:
            if tp.offset >= 0:
                _, high = reader.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
                out[tp.partition] = (tp.offset, high - tp.offset)
        return out
    finally:
        reader.close()


def test_lag_and_offsets_match_what_clients_see(kafka: CompatBroker, topic_name: str) -> None:
    create_topic(kafka, topic_name, PARTITIONS)
    produce(kafka, topic_name, 10)
    group = "lagging"
    consumer = KafkaConsumer(topic_name, bootstrap_servers=kafka.bootstrap_servers, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=4,
                             fetch_max_wait_ms=100)
    try:
        read = 0
        deadline = time.monotonic() + 30
        while read < 12 and time.monotonic() < deadline:
            read += sum(len(records) for records in consumer.poll(timeout_ms=500, max_records=4).values())
        assert read >= 12
        consumer.commit()
        truth = true_lag(kafka, group, topic_name)
        assert truth and sum(offset for offset, _ in truth.values()) == read
        samples = scrape(kafka)
        for partition in range(PARTITIONS):
            assert value(samples, "kafka_topic_partition_current_offset", topic=topic_name, partition=partition) == 10
            assert value(samples, "kafka_topic_partition_oldest_offset", topic=topic_name, partition=partition) == 0
        for partition, (offset, lag) in truth.items():
            labels = {"consumergroup": group, "topic": topic_name, "partition": partition}
            assert value(samples, "kafka_consumergroup_current_offset", **labels) == offset
            assert value(samples, "kafka_consumergroup_lag", **labels) == lag
        assert value(samples, "kafka_consumergroup_lag_sum", consumergroup=group, topic=topic_name) == sum(
            lag for _, lag in truth.values())
        assert value(samples, "kafka_consumergroup_members", consumergroup=group) == 1
        assert value(samples, "kafka_topic_partitions", topic=topic_name) == PARTITIONS
        assert value(samples, "kafka_groups", protocol="classic", state="Stable") >= 1  # type: ignore[operator]
        assert value(samples, "kafka_group_rebalances_total", protocol="classic") >= 1  # type: ignore[operator]

        produce(kafka, topic_name, 5)  # the lag grows by what arrives
        later = scrape(kafka)
        for partition, (_, lag) in truth.items():
            labels = {"consumergroup": group, "topic": topic_name, "partition": partition}
            assert value(later, "kafka_consumergroup_lag", **labels) == lag + 5
    finally:
        consumer.close()
    wait_for(lambda: value(scrape(kafka), "kafka_consumergroup_members", consumergroup=group) == 0, 15,
             what="the member to leave")


def test_consumer_protocol_groups_and_the_broker_metrics(kafka: CompatBroker, topic_name: str) -> None:
    create_topic(kafka, topic_name, PARTITIONS)
    produce(kafka, topic_name, 2)
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "kip848", "group.protocol": "consumer",
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic_name])
    try:
        got = 0
        deadline = time.monotonic() + 30
        while got < 2 * PARTITIONS and time.monotonic() < deadline:
            msg = c.poll(0.2)
            got += msg is not None and msg.error() is None
        c.commit(asynchronous=False)
        samples = scrape(kafka)
    finally:
        c.close()
    assert value(samples, "kafka_groups", protocol="consumer", state="Stable") == 1
    assert value(samples, "kafka_group_rebalances_total", protocol="consumer") >= 1  # type: ignore[operator]
    assert value(samples, "kafka_consumergroup_lag_sum", consumergroup="kip848", topic=topic_name) == 0
    assert value(samples, "kafka_brokers") == 1
    assert value(samples, "kafka_broker_info", address="127.0.0.1:%d" % kafka.port, id=1) == 1
    assert value(samples, "kafka_connections") >= 1  # type: ignore[operator]
    for api in ("Produce", "Fetch", "ConsumerGroupHeartbeat"):
        count = value(samples, "kafka_request_latency_seconds_count", api=api)
        assert count is not None and count >= 1
        assert count == value(samples, "kafka_request_latency_seconds_bucket", api=api, le="+Inf")
    assert value(samples, "kafka_log_flush_seconds_count") >= 1  # type: ignore[operator]
    assert value(samples, "kafka_coordinator_queue_size", coordinator="group") == 0


def test_the_dashboard_asks_for_metrics_that_exist(kafka: CompatBroker) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    asked = {m for e in exprs for m in re.findall(r"\b(kafka_[a-z_]+)", e)}
    kafka.faults.fail("Metadata", "UNKNOWN_SERVER_ERROR")  # so that kafka_faults_injected has a sample
    create_topic(kafka, "dashboard")
    Producer({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(timeout=10)
    assert kafka.broker.http is not None
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % kafka.broker.http.port, timeout=10).read().decode()
    # every family the broker exposes (those without samples yet too: share groups, ...)
    names = {name for family in text_string_to_metric_families(text)
             for name in (family.name, *(s.name for s in family.samples))}
    assert asked and asked <= names, asked - names
