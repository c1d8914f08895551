"""Kafka 4.x's admin long tail with real admin clients (kafka-python's KafkaAdminClient and
confluent-kafka's AdminClient) against one broker subprocess: feature flags, leader elections,
partition reassignments, the metadata quorum, log directories, config resources and
DescribeTopicPartitions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.harness import BrokerProcess

kafka = pytest.importorskip("kafka")
from kafka import KafkaAdminClient  # noqa: E402

TIMEOUT = 15


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("admin4") / "data").start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0
    assert "Traceback" not in proc.output()


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT * 1000)
    try:
        yield client
    finally:
        client.close()


def unique(prefix: str) -> str:
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


# -- features (ApiVersions, UpdateFeatures) -------------------------------------------------------


def test_kafka_python_describes_and_updates_features(admin: KafkaAdminClient) -> None:
    described = admin.describe_features()
    assert described["metadata.version"]["supported"] == (7, 29)
    assert described["metadata.version"]["finalized"] == (29, 29)
    assert described["group.version"]["finalized"] == (1, 1)
    assert described["kraft.version"]["finalized"] == (1, 1)
    assert "finalized" not in described["streams.version"]
    assert admin.update_features({"group.version": ("SAFE_DOWNGRADE", 0)}, validate_only=True) == {
        "group.version": "OK"}
    assert admin.describe_features()["group.version"]["finalized"] == (1, 1)
    with pytest.raises(kafka.errors.InvalidUpdateVersionError, match="only supports versions 0-1"):
        admin.update_features({"group.version": 5})
    # an upgrade to the level the cluster has is no change
    assert admin.update_features({"metadata.version": 29}) == {"metadata.version": "OK"}
