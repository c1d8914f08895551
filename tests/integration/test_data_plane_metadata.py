"""Metadata (v0-v13): topic list semantics per version, topic ids, auto-creation, internal topics."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from broker.metadata import INTERNAL_TOPICS
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    METADATA,
    BrokerThread,
    broker_thread_fixture,
    client_fixture,
    metadata,
)

R = M.MetadataRequest
ALL_OPERATIONS_NOT_REQUESTED = -2147483648


def names(response: object) -> set[str]:
    """The topics of a response, without the internal ones the broker makes for itself."""
    return {t.name for t in response.topics if t.name not in INTERNAL_TOPICS}  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", range(0, 14))
def test_metadata_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    info = broker_thread.create_topic("m", 3)
    response = metadata(client, ["m"], version)
    [broker] = response.brokers
    assert (broker.node_id, broker.host, broker.port) == (1, "127.0.0.1", broker_thread.port)
    if version >= 1:
        assert response.controller_id == 1
    if version >= 2:
        assert response.cluster_id == broker_thread.broker.cluster_id
    [topic] = response.topics
    assert (topic.error_code, topic.name) == (0, "m")
    assert [p.partition_index for p in topic.partitions] == [0, 1, 2]
    for p in topic.partitions:
        assert (p.error_code, p.leader_id, p.replica_nodes, p.isr_nodes) == (0, 1, [1], [1])
        if version >= 7:
            assert p.leader_epoch == 0
    if version >= 10:
        assert topic.topic_id == info.topic_id
    if version >= 8:
        assert topic.topic_authorized_operations == ALL_OPERATIONS_NOT_REQUESTED


@pytest.mark.parametrize("version", range(0, 14))
def test_null_and_empty_topic_lists(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("t1", 1)
    broker_thread.create_topic("t2", 1)
    if version == 0:
        # v0 has no null: an empty list means every topic
        assert names(client.call(METADATA, 0, R(topics=[]))) == {"t1", "t2"}
        return
    assert names(client.call(METADATA, version, R(topics=None, allow_auto_topic_creation=True))) == {"t1", "t2"}
    assert client.call(METADATA, version, R(topics=[], allow_auto_topic_creation=True)).topics == []


@pytest.mark.parametrize(("version", "null_bytes"), [(1, b"\xff\xff\xff\xff"), (9, b"\x00"), (13, b"\x00")])
def test_all_topics_on_the_wire(broker_thread: BrokerThread, client: RawClient, version: int,
                                null_bytes: bytes) -> None:
    # the encodings librdkafka sends for "all topics": int32 -1 before v9, compact null (0) after
    broker_thread.create_topic("wire", 1)
    body = M.encode(R(topics=None, allow_auto_topic_creation=True), version)
    assert body.startswith(null_bytes)
    assert names(client.call(METADATA, version, R(topics=None, allow_auto_topic_creation=True))) == {"wire"}


@pytest.mark.parametrize("version", [12, 13])
def test_metadata_by_topic_id(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    info = broker_thread.create_topic("byid", 2)
    stranger = uuid.uuid4()
    request = R(topics=[R.MetadataRequestTopic(topic_id=info.topic_id, name=None),
                        R.MetadataRequestTopic(topic_id=stranger, name=None)], allow_auto_topic_creation=True)
    known, unknown = client.call(METADATA, version, request).topics
    assert (known.error_code, known.name, known.topic_id, len(known.partitions)) == (0, "byid", info.topic_id, 2)
    assert (unknown.error_code, unknown.name, unknown.topic_id) == (ErrorCode.UNKNOWN_TOPIC_ID, None, stranger)


def test_auto_create(tmp_path: Path) -> None:
    with BrokerThread(tmp_path, **{"num.partitions": "4"}) as bt:
        c = bt.client()
        # v4+ asks explicitly; a refusal leaves the topic unknown
        refused = metadata(c, ["no-auto"], 4, allow_auto=False).topics[0]
        assert refused.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert bt.broker.metadata.topic("no-auto") is None
        # as Kafka 4.x: the creating request answers UNKNOWN_TOPIC_OR_PARTITION, the next one has it
        creating = metadata(c, ["auto"], 12).topics[0]
        assert (creating.error_code, creating.partitions, creating.topic_id) == (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [], uuid.UUID(int=0))
        created = metadata(c, ["auto"], 12).topics[0]
        assert (created.error_code, len(created.partitions)) == (0, 4)
        assert created.topic_id == bt.broker.metadata.topic("auto").topic_id != uuid.UUID(int=0)
        # before v4 there is no flag: the broker setting decides
        assert metadata(c, ["auto-v1"], 1).topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert metadata(c, ["auto-v1"], 1).topics[0].error_code == 0
        # a topic deleted and asked for again is created again, listed from the next request on
        assert c.call(20, 6, M.DeleteTopicsRequest(topics=[M.DeleteTopicsRequest.DeleteTopicState(name="auto")],
                                                   timeout_ms=1000)).responses[0].error_code == 0
        again = metadata(c, ["auto"], 12).topics[0]
        assert (again.error_code, again.partitions) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])
        recreated = metadata(c, ["auto"], 12).topics[0]
        assert recreated.error_code == 0 and recreated.topic_id not in (created.topic_id, uuid.UUID(int=0))
        bad = metadata(c, ["bad name!"], 12).topics[0]
        assert bad.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
        assert metadata(c, ["a" * 250], 12).topics[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
        c.close()


def test_auto_create_disabled(tmp_path: Path) -> None:
    with BrokerThread(tmp_path, **{"auto.create.topics.enable": "false"}) as bt:
        c = bt.client()
        for version in (1, 4, 12):
            assert metadata(c, ["never"], version).topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert metadata(c, ["bad/name"], version).topics[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
        assert bt.broker.metadata.topic("never") is None
        c.close()


def test_internal_topics_are_not_auto_created(broker_thread: BrokerThread, client: RawClient) -> None:
    # their coordinators create them (some at startup); a client's Metadata request never does
    for name in INTERNAL_TOPICS:
        if broker_thread.broker.metadata.topic(name) is None:
            assert metadata(client, [name], 12).topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert broker_thread.broker.metadata.topic(name) is None


def test_internal_topics_are_flagged(broker_thread: BrokerThread, client: RawClient) -> None:
    if broker_thread.broker.metadata.topic("__consumer_offsets") is None:
        broker_thread.create_topic("__consumer_offsets", 2)
    broker_thread.create_topic("plain", 1)
    for version in (1, 9, 13):
        flags = {t.name: t.is_internal for t in metadata(client, None, version).topics}
        assert flags["__consumer_offsets"] is True and flags["plain"] is False
        assert all(internal == (name in INTERNAL_TOPICS) for name, internal in flags.items())


def test_authorized_operations_when_asked(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("ops", 1)
    request = R(topics=[R.MetadataRequestTopic(name="ops")], allow_auto_topic_creation=False,
                include_cluster_authorized_operations=True, include_topic_authorized_operations=True)
    response = client.call(METADATA, 10, request)
    ops = response.topics[0].topic_authorized_operations
    assert ops != ALL_OPERATIONS_NOT_REQUESTED and ops & (1 << 3)  # READ among them
    assert response.cluster_authorized_operations != ALL_OPERATIONS_NOT_REQUESTED


def test_topic_ids_survive_restart(tmp_path: Path) -> None:
    with BrokerThread(tmp_path) as bt:
        c = bt.client()
        before = {t.name: t.topic_id for t in metadata(c, None, 12).topics}
        metadata(c, ["x", "y"], 12)  # creates them
        before.update({t.name: t.topic_id for t in metadata(c, ["x", "y"], 12).topics})
        c.close()
    with BrokerThread(tmp_path) as bt:
        c = bt.client()
        after = {t.name: t.topic_id for t in metadata(c, None, 12).topics}
        assert after == before and len(set(after.values())) == len(after) >= 2
        c.close()
