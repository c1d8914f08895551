"""ElectLeaders, Alter/ListPartitionReassignments and DescribeQuorum with raw frames, every version:
a cluster of one node answers as Kafka's controller does."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    BrokerThread,
    broker_thread_fixture,
    client_fixture,
)

ELECT_LEADERS, ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS, DESCRIBE_QUORUM = 43, 45, 46, 55
NOT_NEEDED = (ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.")


@pytest.mark.parametrize("version", range(0, 3))
def test_elect_leaders(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("e", 2)
    R = M.ElectLeadersRequest
    request = R(election_type=0, timeout_ms=1000, topic_partitions=[
        R.TopicPartitions(topic="e", partitions=[0, 1, 5]), R.TopicPartitions(topic="nope", partitions=[0])])
    response = client.call(ELECT_LEADERS, version, request)
    got = {(r.topic, p.partition_id): (p.error_code, p.error_message)
           for r in response.replica_election_results for p in r.partition_result}
    assert got == {("e", 0): NOT_NEEDED, ("e", 1): NOT_NEEDED,
                   ("e", 5): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such partition as e-5"),
                   ("nope", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such topic as nope")}
    # all partitions: every topic is listed, without the partitions that need no election
    every = client.call(ELECT_LEADERS, version, R(election_type=1, timeout_ms=1000, topic_partitions=None))
    assert [(r.topic, r.partition_result) for r in every.replica_election_results] == [("e", [])]
    if version >= 1:
        bad = client.call(ELECT_LEADERS, version, R(election_type=5, timeout_ms=1000, topic_partitions=None))
        assert bad.error_code == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("version", range(0, 2))
def test_partition_reassignments(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("r", 1)
    R = M.AlterPartitionReassignmentsRequest
    request = R(timeout_ms=1000, allow_replication_factor_change=False, topics=[
        R.ReassignableTopic(name="r", partitions=[
            R.ReassignablePartition(partition_index=0, replicas=[1]),
            R.ReassignablePartition(partition_index=0, replicas=[1, 2]),
            R.ReassignablePartition(partition_index=0, replicas=[]),
            R.ReassignablePartition(partition_index=0, replicas=None),
            R.ReassignablePartition(partition_index=3, replicas=[1])]),
        R.ReassignableTopic(name="nope", partitions=[R.ReassignablePartition(partition_index=0, replicas=[1])])])
    response = client.call(ALTER_REASSIGNMENTS, version, request)
    assert (response.error_code, response.error_message) == (0, None)
    if version >= 1:
        assert response.allow_replication_factor_change is False
    got = [(t.name, p.partition_index, p.error_code, p.error_message) for t in response.responses for p in t.partitions]
    assert got == [
        ("r", 0, 0, None),
        ("r", 0, ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "The manual partition assignment includes broker 2, but no such broker is registered."),
        ("r", 0, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes an empty replica list."),
        ("r", 0, ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "No partition reassignment is in progress."),
        ("r", 3, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find partition r:3."),
        ("nope", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find a topic named nope."),
    ]
    L = M.ListPartitionReassignmentsRequest
    for topics in (None, [L.ListPartitionReassignmentsTopics(name="r", partition_indexes=[0])]):
        listed = client.call(LIST_REASSIGNMENTS, 0, L(timeout_ms=1000, topics=topics))
        assert (listed.error_code, listed.error_message, listed.topics) == (0, None, [])


def describe_quorum(c: RawClient, version: int, topic: str = "__cluster_metadata", partition: int = 0) -> object:
    R = M.DescribeQuorumRequest
    request = R(topics=[R.TopicData(topic_name=topic, partitions=[R.PartitionData(partition_index=partition)])])
    return c.call(DESCRIBE_QUORUM, version, request)


@pytest.mark.parametrize("version", range(0, 3))
def test_describe_quorum(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker = broker_thread.broker
    response = describe_quorum(client, version)
    assert response.error_code == 0
    (topic,) = response.topics
    (p,) = topic.partitions
    end = broker.logs.get_log("__cluster_metadata", 0).log_end_offset
    assert (topic.topic_name, p.error_code, p.leader_id, p.leader_epoch, p.high_watermark) == (
        "__cluster_metadata", 0, 1, 1, end)
    (voter,) = p.current_voters
    assert (voter.replica_id, voter.log_end_offset, p.observers) == (1, end, [])
    if version >= 1:
        assert voter.last_fetch_timestamp > 0 and voter.last_caught_up_timestamp > 0
    if version >= 2:
        assert voter.replica_directory_id == broker.metadata_directory_id != voter.replica_directory_id.__class__(int=0)
        (node,) = response.nodes
        assert (node.node_id, [(li.host, li.port) for li in node.listeners]) == (1, [broker.advertised()])
    # the metadata log moves on: its offsets follow
    broker_thread.create_topic("q", 1)
    (p,) = describe_quorum(client, version).topics[0].partitions
    assert p.high_watermark > end
    wrong = describe_quorum(client, version, partition=1)
    assert wrong.error_code == 0
    assert [q.error_code for t in wrong.topics for q in t.partitions] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]


def test_quorum_epoch_grows_at_every_start(tmp_path: Path) -> None:
    epochs = []
    for _ in range(2):
        with BrokerThread(tmp_path) as bt:
            c = bt.client()
            epochs.append(describe_quorum(c, 2).topics[0].partitions[0].leader_epoch)
            c.close()
    assert epochs == [1, 2]


def describe_partitions(c: RawClient, topics: list[str], limit: int = 2000,
                        cursor: tuple[str, int] | None = None) -> object:
    R = M.DescribeTopicPartitionsRequest
    request = R(topics=[R.TopicRequest(name=t) for t in topics], response_partition_limit=limit,
                cursor=R.Cursor(topic_name=cursor[0], partition_index=cursor[1]) if cursor else None)
    return c.call(75, 0, request)


def pages(response: object) -> tuple[list[tuple[str, int, list[int]]], tuple[str, int] | None]:
    topics = [(t.name, t.error_code, [p.partition_index for p in t.partitions]) for t in response.topics]
    cursor = response.next_cursor
    return topics, (cursor.topic_name, cursor.partition_index) if cursor is not None else None


def test_describe_topic_partitions_pages(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("a", 3)
    broker_thread.create_topic("b", 2)
    broker_thread.create_topic("c", 1)
    full = describe_partitions(client, ["c", "a", "missing", "b", "bad name"])
    assert pages(full) == ([("a", 0, [0, 1, 2]), ("b", 0, [0, 1]), ("bad name", ErrorCode.INVALID_TOPIC_EXCEPTION, []),
                            ("c", 0, [0]), ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])], None)
    a = full.topics[0]
    assert a.topic_id == broker_thread.broker.metadata.topic("a").topic_id
    assert (a.partitions[0].leader_id, a.partitions[0].replica_nodes, a.partitions[0].eligible_leader_replicas) == (
        1, [1], [])
    # every topic (an empty list), two partitions a page
    assert pages(describe_partitions(client, [], 2)) == ([("a", 0, [0, 1])], ("a", 2))
    assert pages(describe_partitions(client, [], 2, ("a", 2))) == ([("a", 0, [2]), ("b", 0, [0])], ("b", 1))
    assert pages(describe_partitions(client, [], 2, ("b", 1))) == ([("b", 0, [1]), ("c", 0, [0])], None)
    # the limit ends exactly at a topic's end: the cursor names the next topic
    assert pages(describe_partitions(client, ["a", "c"], 3)) == ([("a", 0, [0, 1, 2])], ("c", 0))
    # the cursor's topic must be in the list, its partition not negative
    assert pages(describe_partitions(client, ["a"], 2, ("b", 0))) == ([("a", ErrorCode.INVALID_REQUEST, [])], None)
    assert pages(describe_partitions(client, ["a"], 2, ("a", -1))) == ([("a", ErrorCode.INVALID_REQUEST, [])], None)
    # a limit below 1 is taken as 1
    assert pages(describe_partitions(client, ["b"], 0)) == ([("b", 0, [0])], ("b", 1))
