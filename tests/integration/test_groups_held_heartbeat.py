"""Held heartbeats over the wire: a heartbeat held until its group changes never delays the
requests behind it on the same connection (the server releases it), and is answered at once when
the group starts rebalancing. The hold is set far beyond the socket timeout of RawClient (10 s):
a response that waited for it would fail the test instead of arriving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient
from tests.integration.test_server_support import BrokerThread

E = ErrorCode
FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, SYNC_GROUP, OFFSET_COMMIT = 10, 11, 12, 14, 8
CONSUMER_GROUP_HEARTBEAT = 68
SESSION_MS = 1_800_000  # group.max.session.timeout.ms: holds of up to 600 s


@pytest.fixture(name="broker")
def broker_fixture(tmp_path: Path) -> Iterator[BrokerThread]:
    with BrokerThread(tmp_path, **{"group.heartbeat.hold.ms": "600000",
                                   "group.consumer.heartbeat.interval.ms": "60000"}) as bt:
        yield bt


def join(client: RawClient, group_id: str, member_id: str = "") -> Any:
    request = M.JoinGroupRequest(
        group_id=group_id, session_timeout_ms=SESSION_MS, rebalance_timeout_ms=60000, member_id=member_id,
        protocol_type="consumer", protocols=[M.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")])
    return client.call(JOIN_GROUP, 5, request)


def stable_member(client: RawClient, group_id: str) -> tuple[str, int]:
    """A one-member classic group, synced: (member id, generation)."""
    client.call(FIND_COORDINATOR, 3, M.FindCoordinatorRequest(key=group_id, key_type=0))
    first = join(client, group_id)
    assert first.error_code == E.MEMBER_ID_REQUIRED
    joined = join(client, group_id, first.member_id)
    assert joined.error_code == E.NONE
    sync = client.call(SYNC_GROUP, 3, M.SyncGroupRequest(
        group_id=group_id, generation_id=joined.generation_id, member_id=joined.member_id,
        assignments=[M.SyncGroupRequest.SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b"a")]))
    assert sync.error_code == E.NONE
    return joined.member_id, joined.generation_id


def commit_request(group_id: str, member_id: str, generation: int) -> Any:
    R = M.OffsetCommitRequest
    return R(group_id=group_id, generation_id_or_member_epoch=generation, member_id=member_id, topics=[
        R.OffsetCommitRequestTopic(name="t", partitions=[R.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=7, committed_metadata="")])])


def test_a_request_behind_a_held_heartbeat_releases_it(broker: BrokerThread) -> None:
    broker.create_topic("t")
    client = broker.client()
    member_id, generation = stable_member(client, "g")
    client.send(HEARTBEAT, 3, M.HeartbeatRequest(group_id="g", generation_id=generation, member_id=member_id))
    heartbeat_id = client.correlation_id
    client.send(OFFSET_COMMIT, 8, commit_request("g", member_id, generation))
    assert client.receive(HEARTBEAT, 3, heartbeat_id).error_code == E.NONE
    committed = client.receive(OFFSET_COMMIT, 8)
    assert committed.topics[0].partitions[0].error_code == E.NONE
    client.close()


def test_a_held_heartbeat_learns_of_a_rebalance(broker: BrokerThread) -> None:
    client, other = broker.client(), broker.client()
    member_id, generation = stable_member(client, "g")
    client.send(HEARTBEAT, 3, M.HeartbeatRequest(group_id="g", generation_id=generation, member_id=member_id))
    newcomer = join(other, "g")  # MEMBER_ID_REQUIRED: not yet a member
    other.send(JOIN_GROUP, 5, M.JoinGroupRequest(
        group_id="g", session_timeout_ms=SESSION_MS, rebalance_timeout_ms=60000, member_id=newcomer.member_id,
        protocol_type="consumer", protocols=[M.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")]))
    assert client.receive(HEARTBEAT, 3).error_code == E.REBALANCE_IN_PROGRESS
    client.close()
    other.close()


def test_a_steady_consumer_group_heartbeat_is_released_by_the_next_request(broker: BrokerThread) -> None:
    broker.create_topic("t", 2)
    client = broker.client()
    client.call(FIND_COORDINATOR, 4, M.FindCoordinatorRequest(key_type=0, coordinator_keys=["cg"]))
    R = M.ConsumerGroupHeartbeatRequest
    joined = client.call(CONSUMER_GROUP_HEARTBEAT, 0, R(
        group_id="cg", member_id="", member_epoch=0, rebalance_timeout_ms=60000, subscribed_topic_names=["t"],
        topic_partitions=[]))
    assert joined.error_code == E.NONE and joined.assignment is not None
    owned = [R.TopicPartitions(topic_id=tp.topic_id, partitions=tp.partitions)
             for tp in joined.assignment.topic_partitions]
    # The acknowledgement leaves the member with nothing to do: it is held.
    client.send(CONSUMER_GROUP_HEARTBEAT, 0, R(group_id="cg", member_id=joined.member_id,
                                                member_epoch=joined.member_epoch, topic_partitions=owned))
    heartbeat_id = client.correlation_id
    client.send(OFFSET_COMMIT, 9, commit_request("cg", joined.member_id, joined.member_epoch))
    steady = client.receive(CONSUMER_GROUP_HEARTBEAT, 0, heartbeat_id)
    assert (steady.error_code, steady.member_epoch, steady.assignment) == (E.NONE, joined.member_epoch, None)
    assert client.receive(OFFSET_COMMIT, 9).topics[0].partitions[0].error_code == E.NONE
    client.close()
