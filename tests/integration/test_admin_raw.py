"""Topic administration and describe APIs with raw frames against an in-process broker:
CreateTopics, DeleteTopics, CreatePartitions, DescribeCluster, DescribeLogDirs, DescribeProducers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    BrokerThread,
    batch,
    broker_thread_fixture,
    client_fixture,
    init_producer_id,
    produce,
)

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 19, 20, 37
DESCRIBE_LOG_DIRS, DESCRIBE_CLUSTER, DESCRIBE_PRODUCERS = 35, 60, 61
ZERO = uuid.UUID(int=0)

CT = M.CreateTopicsRequest


def creatable(name: str, partitions: int = 1, rf: int = 1, configs: dict[str, str | None] | None = None,
              assignments: list[list[int]] | None = None) -> Any:
    return CT.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=rf,
        assignments=[CT.CreatableReplicaAssignment(partition_index=i, broker_ids=b)
                     for i, b in enumerate(assignments or [])],
        configs=[CT.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
    )


def create_topics(c: RawClient, topics: list[Any], version: int = 7, validate_only: bool = False) -> list[Any]:
    response = c.call(CREATE_TOPICS, version, CT(topics=topics, timeout_ms=5000, validate_only=validate_only))
    return list(response.topics)


def create_one(c: RawClient, topic: Any, version: int = 7, validate_only: bool = False) -> Any:
    (result,) = create_topics(c, [topic], version, validate_only)
    return result


def delete_topics(c: RawClient, version: int, names: list[str] | None = None,
                  ids: list[tuple[str | None, uuid.UUID]] | None = None) -> list[Any]:
    R = M.DeleteTopicsRequest
    if version >= 6:
        states = [R.DeleteTopicState(name=n, topic_id=ZERO) for n in names or []]
        states += [R.DeleteTopicState(name=n, topic_id=i) for n, i in ids or []]
        request = R(topics=states, timeout_ms=5000)
    else:
        request = R(topic_names=names or [], timeout_ms=5000)
    return list(c.call(DELETE_TOPICS, version, request).responses)


def create_partitions(c: RawClient, name: str, count: int, version: int = 3, validate_only: bool = False,
                      assignments: list[list[int]] | None = None) -> Any:
    R = M.CreatePartitionsRequest
    topic = R.CreatePartitionsTopic(
        name=name, count=count,
        assignments=None if assignments is None else [R.CreatePartitionsAssignment(broker_ids=b) for b in assignments],
    )
    response = c.call(CREATE_PARTITIONS, version, R(topics=[topic], timeout_ms=5000, validate_only=validate_only))
    return response.results[0]


# -- CreateTopics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(2, 8))
def test_create_topics_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    result = create_one(client, creatable("t", 3, configs={"retention.ms": "1000"}), version)
    assert (result.name, result.error_code, result.error_message) == ("t", 0, None)
    info = broker_thread.broker.metadata.topic("t")
    assert info.partitions == 3 and info.configs == {"retention.ms": "1000"}
    assert broker_thread.broker.partitions.get("t", 2).log.config.retention_ms == 1000
    if version >= 5:
        assert (result.num_partitions, result.replication_factor) == (3, 1)
        configs = {c.name: (c.value, c.config_source, c.read_only, c.is_sensitive) for c in result.configs}
        assert configs["retention.ms"] == ("1000", 1, False, False)
        assert configs["segment.bytes"] == ("1073741824", 5, False, False)
        assert configs["cleanup.policy"] == ("delete", 5, False, False)
        assert [c.name for c in result.configs] == sorted(configs)
    if version >= 7:
        assert result.topic_id == info.topic_id
    again = create_one(client, creatable("t"), version)
    assert again.error_code == ErrorCode.TOPIC_ALREADY_EXISTS
    assert again.error_message == "Topic 't' already exists."


def test_create_topics_defaults_and_validate_only(tmp_path: Path) -> None:
    with BrokerThread(tmp_path, num_partitions="4") as bt:
        c = bt.client()
        result = create_one(c, creatable("defaults", -1, -1))
        assert (result.error_code, result.num_partitions, result.replication_factor) == (0, 4, 1)
        assert bt.broker.metadata.topic("defaults").partitions == 4
        checked = create_one(c, creatable("dry", 2, configs={"cleanup.policy": "compact"}), validate_only=True)
        assert (checked.error_code, checked.num_partitions) == (0, 2)
        assert checked.topic_id != ZERO
        assert {x.name: x.value for x in checked.configs}["cleanup.policy"] == "compact"
        assert bt.broker.metadata.topic("dry") is None
        assert not (tmp_path / "data" / "dry-0").exists()
        assert create_one(c, creatable("defaults"), validate_only=True).error_code == ErrorCode.TOPIC_ALREADY_EXISTS
        c.close()


def test_create_topics_replication_factor(client: RawClient) -> None:
    refused = create_one(client, creatable("r3", 1, 3))
    assert refused.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert refused.error_message == ("Unable to replicate the partition 3 time(s): The target replication factor "
                                     "of 3 cannot be reached because only 1 broker(s) are registered.")
    zero = create_one(client, creatable("r0", 1, 0))
    assert zero.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert zero.error_message == "Replication factor must be larger than 0, or -1 to use the default value."
    for partitions in (0, -2):
        bad = create_one(client, creatable("p0", partitions))
        assert bad.error_code == ErrorCode.INVALID_PARTITIONS
        assert bad.error_message == "Number of partitions was set to an invalid non-positive value."


@pytest.mark.parametrize(("name", "message"), [
    ("", "Topic name is invalid: the empty string is not allowed"),
    ("..", "Topic name is invalid: '..' is not allowed"),
    ("a" * 250, "Topic name is invalid: the length of '%s' is longer than the max allowed length 249" % ("a" * 250)),
    ("bad/name", "Topic name is invalid: 'bad/name' contains one or more characters other than ASCII "
                 "alphanumerics, '.', '_' and '-'"),
    ("trailing\n", None),
])
def test_create_topics_bad_names(client: RawClient, name: str, message: str | None) -> None:
    result = create_one(client, creatable(name))
    assert result.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    if message is not None:
        assert result.error_message == message


def test_create_topics_request_level_errors(broker_thread: BrokerThread, client: RawClient) -> None:
    results = create_topics(client, [creatable("dup"), creatable("ok"), creatable("dup"),
                                     creatable("__cluster_metadata")])
    by_name = {r.name: (r.error_code, r.error_message) for r in results}
    assert by_name == {
        "dup": (ErrorCode.INVALID_REQUEST, "Duplicate topic name."),
        "ok": (0, None),
        "__cluster_metadata": (ErrorCode.INVALID_REQUEST, "Creation of internal topic __cluster_metadata is "
                                                          "prohibited."),
    }
    assert broker_thread.broker.metadata.topic("dup") is None
    collides = create_one(client, creatable("a.b"))
    assert collides.error_code == 0
    clash = create_one(client, creatable("a_b"))
    assert (clash.error_code, clash.error_message) == (ErrorCode.INVALID_TOPIC_EXCEPTION,
                                                       "Topic 'a_b' collides with existing topic: a.b")
    many = create_topics(client, [creatable("big1", 6000), creatable("big2", 6000)])
    assert [(r.error_code, r.error_message) for r in many] == [
        (ErrorCode.POLICY_VIOLATION, "Excessively large number of partitions per request.")] * 2
    assert broker_thread.broker.metadata.topic("big1") is None


@pytest.mark.parametrize(("configs", "message"), [
    ({"no.such.config": "1"}, "Unknown topic config name: no.such.config"),
    ({"retention.ms": "soon"}, "Invalid value soon for configuration retention.ms: Not a number"),
    ({"segment.bytes": "10"}, None),
    ({"cleanup.policy": "shred"}, None),
    ({"retention.ms": None, "segment.ms": None}, "Null value not supported for topic configs: retention.ms,segment.ms"),
])
def test_create_topics_invalid_configs(broker_thread: BrokerThread, client: RawClient,
                                       configs: dict[str, str | None], message: str | None) -> None:
    result = create_one(client, creatable("cfg", configs=configs))
    assert result.error_code == ErrorCode.INVALID_CONFIG
    assert result.error_message and (message is None or result.error_message == message)
    assert broker_thread.broker.metadata.topic("cfg") is None


def test_create_topics_manual_assignments(broker_thread: BrokerThread, client: RawClient) -> None:
    ok = create_one(client, creatable("manual", -1, -1, assignments=[[1], [1], [1]]))
    assert (ok.error_code, ok.num_partitions, ok.replication_factor) == (0, 3, 1)
    assert broker_thread.broker.metadata.topic("manual").partitions == 3
    cases = [
        (creatable("m1", 2, -1, assignments=[[1]]), ErrorCode.INVALID_REQUEST,
         "A manual partition assignment was specified, but numPartitions was not set to -1."),
        (creatable("m2", -1, 1, assignments=[[1]]), ErrorCode.INVALID_REQUEST,
         "A manual partition assignment was specified, but replication factor was not set to -1."),
        (creatable("m3", -1, -1, assignments=[[2]]), ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "The manual partition assignment includes broker 2, but no such broker is registered."),
        (creatable("m4", -1, -1, assignments=[[1, 1]]), ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "The manual partition assignment includes the broker 1 more than once."),
        (creatable("m5", -1, -1, assignments=[[]]), ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "The manual partition assignment includes an empty replica list."),
    ]
    for topic, code, message in cases:
        result = create_one(client, topic)
        assert (result.error_code, result.error_message) == (code, message)
    gap = creatable("m6", -1, -1, assignments=[[1], [1]])
    gap.assignments[1].partition_index = 2
    result = create_one(client, gap)
    assert (result.error_code, result.error_message) == (
        ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partitions should be a consecutive 0-based integer sequence")


# -- DeleteTopics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(1, 7))
def test_delete_topics_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    info = broker_thread.create_topic("gone", 2)
    produce(client, "gone", 1, batch([b"data"]))
    log_dir = Path(broker_thread.broker.partitions.get("gone", 1).log.dir)
    assert log_dir.exists()
    (result,) = delete_topics(client, version, ["gone"])
    assert (result.name, result.error_code) == ("gone", 0)
    if version >= 5:
        assert result.error_message is None
    if version >= 6:
        assert result.topic_id == info.topic_id
    assert broker_thread.broker.metadata.topic("gone") is None
    assert broker_thread.broker.partitions.get("gone", 0) is None
    assert not log_dir.exists()
    assert not [n for n in os.listdir(log_dir.parent) if n.startswith("gone-")]
    (missing,) = delete_topics(client, version, ["gone"])
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if version >= 5:
        assert missing.error_message == "This server does not host this topic-partition."


def test_delete_topics_by_id(broker_thread: BrokerThread, client: RawClient) -> None:
    a = broker_thread.create_topic("by-id", 1)
    b = broker_thread.create_topic("by-name", 1)
    unknown = uuid.uuid4()
    results = delete_topics(client, 6, ["by-name", "twice", "twice"],
                            [(None, a.topic_id), (None, unknown), (None, ZERO), ("both", b.topic_id)])
    got = {(r.name, r.topic_id): (r.error_code, r.error_message) for r in results}
    assert got == {
        ("by-name", b.topic_id): (0, None),
        ("by-id", a.topic_id): (0, None),  # Kafka names the topics it deleted by id
        (None, unknown): (ErrorCode.UNKNOWN_TOPIC_ID, "This server does not host this topic ID."),
        (None, ZERO): (ErrorCode.INVALID_REQUEST, "Neither topic name nor id were specified."),
        ("both", b.topic_id): (ErrorCode.INVALID_REQUEST, "You may not specify both topic name and topic id."),
        ("twice", ZERO): (ErrorCode.INVALID_REQUEST, "Duplicate topic name."),
    }
    assert broker_thread.broker.metadata.topics.keys() == set()
    c = broker_thread.create_topic("same", 1)
    (clash,) = [r for r in delete_topics(client, 6, ["same"], [(None, c.topic_id)]) if r.name == "same"]
    assert (clash.error_code, clash.topic_id) == (ErrorCode.INVALID_REQUEST, c.topic_id)
    assert broker_thread.broker.metadata.topic("same") is not None


def test_delete_internal_topic_as_kraft_does(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("__consumer_offsets", 1)
    (result,) = delete_topics(client, 6, ["__consumer_offsets"])
    assert result.error_code == 0
    (meta,) = delete_topics(client, 6, ["__cluster_metadata"])
    assert meta.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.fixture
def no_delete_broker(tmp_path: Path) -> Iterator[BrokerThread]:
    with BrokerThread(tmp_path, delete_topic_enable="false") as bt:
        yield bt


def test_delete_topics_disabled(no_delete_broker: BrokerThread) -> None:
    no_delete_broker.create_topic("kept", 1)
    c = no_delete_broker.client()
    for version, code in ((1, ErrorCode.INVALID_REQUEST), (3, ErrorCode.TOPIC_DELETION_DISABLED),
                          (6, ErrorCode.TOPIC_DELETION_DISABLED)):
        (result,) = delete_topics(c, version, ["kept"])
        assert (result.name, result.error_code) == ("kept", code)
    assert no_delete_broker.broker.metadata.topic("kept") is not None
    c.close()


# -- CreatePartitions ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(0, 4))
def test_create_partitions_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("grow", 2, {"max.message.bytes": "5000"})
    result = create_partitions(client, "grow", 4, version)
    assert (result.name, result.error_code, result.error_message) == ("grow", 0, None)
    assert broker_thread.broker.metadata.topic("grow").partitions == 4
    new = broker_thread.broker.partitions.get("grow", 3)
    assert new is not None and new.log.config.max_message_bytes == 5000
    assert produce(client, "grow", 3, batch([b"x"])).error_code == 0
    dry = create_partitions(client, "grow", 6, version, validate_only=True)
    assert dry.error_code == 0 and broker_thread.broker.metadata.topic("grow").partitions == 4


def test_create_partitions_errors(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("fixed", 3)
    cases = [
        (("fixed", 3), ErrorCode.INVALID_PARTITIONS, "Topic already has 3 partition(s)."),
        (("fixed", 2), ErrorCode.INVALID_PARTITIONS,
         "The topic fixed currently has 3 partition(s); 2 would not be an increase."),
        (("nope", 2), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None),
    ]
    for (name, count), code, message in cases:
        for validate_only in (False, True):
            result = create_partitions(client, name, count, validate_only=validate_only)
            assert (result.error_code, result.error_message) == (code, message)
    assigned = create_partitions(client, "fixed", 5, assignments=[[1]])
    assert (assigned.error_code, assigned.error_message) == (
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified.")
    elsewhere = create_partitions(client, "fixed", 4, assignments=[[7]])
    assert elsewhere.error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert create_partitions(client, "fixed", 4, assignments=[[1]]).error_code == 0
    R = M.CreatePartitionsRequest
    dup = client.call(CREATE_PARTITIONS, 3, R(topics=[R.CreatePartitionsTopic(name="fixed", count=9)] * 2,
                                               timeout_ms=1000, validate_only=False))
    assert [(r.name, r.error_code, r.error_message) for r in dup.results] == [
        ("fixed", ErrorCode.INVALID_REQUEST, "Duplicate topic name.")]
    assert broker_thread.broker.metadata.topic("fixed").partitions == 4


# -- DescribeCluster, DescribeLogDirs, DescribeProducers -------------------------------------------


@pytest.mark.parametrize("version", range(0, 3))
def test_describe_cluster_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    R = M.DescribeClusterRequest
    response = client.call(DESCRIBE_CLUSTER, version, R(include_cluster_authorized_operations=True,
                                                        include_fenced_brokers=True))
    broker = broker_thread.broker
    assert (response.error_code, response.error_message) == (0, None)
    assert (response.cluster_id, response.controller_id) == (broker.cluster_id, broker.node_id)
    assert [(b.broker_id, b.host, b.port, b.rack) for b in response.brokers] == [
        (broker.node_id, "127.0.0.1", broker_thread.port, None)]
    assert response.cluster_authorized_operations > 0
    plain = client.call(DESCRIBE_CLUSTER, version, R())
    assert plain.cluster_authorized_operations == -2147483648
    if version >= 1:
        assert response.endpoint_type == 1
        controller = client.call(DESCRIBE_CLUSTER, version, R(endpoint_type=2))
        assert controller.error_code == ErrorCode.MISMATCHED_ENDPOINT_TYPE
        unknown = client.call(DESCRIBE_CLUSTER, version, R(endpoint_type=7))
        assert unknown.error_code == ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
        assert unknown.error_message == "Unsupported endpoint type 7"


@pytest.mark.parametrize("version", range(1, 5))
def test_describe_log_dirs_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("sized", 2)
    broker_thread.create_topic("other", 1)
    assert produce(client, "sized", 1, batch([b"x" * 1000])).error_code == 0
    R = M.DescribeLogDirsRequest
    response = client.call(DESCRIBE_LOG_DIRS, version, R(topics=None))
    (result,) = response.results
    assert result.error_code == 0
    assert result.log_dir == os.path.abspath(broker_thread.tmp_path / "data")
    sizes = {(t.name, p.partition_index): (p.partition_size, p.offset_lag, p.is_future_key)
             for t in result.topics for p in t.partitions}
    assert set(sizes) == {("sized", 0), ("sized", 1), ("other", 0)}  # not the metadata log
    assert sizes[("sized", 0)] == (0, 0, False)
    assert sizes[("sized", 1)][0] > 1000
    if version >= 4:
        assert result.total_bytes >= result.usable_bytes > 0
    filtered = client.call(DESCRIBE_LOG_DIRS, version, R(topics=[
        R.DescribableLogDirTopic(topic="sized", partitions=[1, 5]), R.DescribableLogDirTopic(topic="x", partitions=[0]),
    ]))
    topics = filtered.results[0].topics
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in topics] == [("sized", [1])]


def test_describe_producers(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("idem", 2)
    pid, epoch = init_producer_id(client)
    records = batch([b"a", b"b", b"c"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    assert produce(client, "idem", 0, records).error_code == 0
    R = M.DescribeProducersRequest
    response = client.call(DESCRIBE_PRODUCERS, 0, R(topics=[
        R.TopicRequest(name="idem", partition_indexes=[0, 1, 9]),
        R.TopicRequest(name="unknown", partition_indexes=[0]),
        R.TopicRequest(name="bad name", partition_indexes=[0]),
    ]))
    idem, unknown, bad = response.topics
    p0, p1, p9 = idem.partitions
    assert p0.error_code == 0
    (state,) = p0.active_producers
    assert (state.producer_id, state.producer_epoch, state.last_sequence) == (pid, epoch, 2)
    assert state.last_timestamp > 0
    assert (state.coordinator_epoch, state.current_txn_start_offset) == (-1, -1)
    assert (p1.error_code, p1.active_producers) == (0, [])
    assert p9.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert unknown.partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert unknown.partitions[0].error_message == "This server does not host this topic-partition."
    assert bad.partitions[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
