"""The leader side of replication with raw frames: a partition of this broker is made the leader of
replicas 1, 2, 3 (as the metadata of a cluster would say) and the test plays the followers with
hand-made Fetch requests (ReplicaState, LastFetchedEpoch); consumers and acks=all produces see the
high watermark the followers move."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from broker.partition.replica import BrokerStatus
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    FETCH,
    LIST_OFFSETS,
    PRODUCE,
    BrokerThread,
    batch,
    broker_thread_fixture,
    client_fixture,
    fetch_one,
    produce,
    produce_request,
    records_of,
)

pytestmark = pytest.mark.timeout(60)
E = ErrorCode


def lead(bt: BrokerThread, topic: str, replicas: list[int], isr: list[int], epoch: int = 0,
         statuses: dict[int, BrokerStatus] | None = None, min_isr: int | None = None) -> None:
    async def change() -> None:
        p = bt.broker.partitions.get(topic, 0)
        p.local_id = bt.broker.node_id
        p.broker_statuses = statuses.get if statuses is not None else None
        if min_isr is not None:
            p.log.config = p.log.config.with_overrides({"min.insync.replicas": str(min_isr)})
        p.make_leader(epoch, 1, replicas, isr)
    bt.call(change())


def follower_fetch(client: RawClient, topic: str, replica: int, offset: int, version: int = 15,
                   broker_epoch: int = -1, last_fetched_epoch: int = -1, leader_epoch: int = -1,
                   max_wait_ms: int = 0, min_bytes: int = 0) -> Any:
    R = M.FetchRequest
    request = R(max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[R.FetchTopic(topic=topic, partitions=[R.FetchPartition(
                    partition=0, fetch_offset=offset, partition_max_bytes=1 << 20, current_leader_epoch=leader_epoch,
                    last_fetched_epoch=last_fetched_epoch, log_start_offset=0)])])
    if version >= 15:
        request.replica_state = R.ReplicaState(replica_id=replica, replica_epoch=broker_epoch)
    else:
        request.replica_id = replica
    if version >= 13:
        request.topics[0].topic_id = client_topic_ids[topic]
    response = client.call(FETCH, version, request)
    return response.responses[0].partitions[0]


client_topic_ids: dict[str, Any] = {}


def make_topic(bt: BrokerThread, name: str) -> None:
    client_topic_ids[name] = bt.create_topic(name, 1).topic_id


def latest(client: RawClient, topic: str) -> int:
    R = M.ListOffsetsRequest
    request = R(replica_id=-1, isolation_level=0, topics=[R.ListOffsetsTopic(name=topic, partitions=[
        R.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)])])
    return int(client.call(LIST_OFFSETS, 7, request).topics[0].partitions[0].offset)


def test_consumers_read_below_the_high_watermark_followers_to_the_log_end(broker_thread: BrokerThread,
                                                                          client: RawClient) -> None:
    make_topic(broker_thread, "r")
    lead(broker_thread, "r", [1, 2, 3], [1, 2, 3])
    assert produce(client, "r", 0, batch([b"a", b"b"]), acks=1).error_code == 0
    consumer = fetch_one(client, "r", 0, 0)
    assert (consumer.error_code, consumer.high_watermark, bytes(consumer.records)) == (0, 0, b"")
    assert latest(client, "r") == 0
    entry = follower_fetch(client, "r", 2, 0)
    assert entry.error_code == 0 and [r.value for r in records_of(entry.records)] == [b"a", b"b"]
    assert entry.high_watermark == 0
    follower_fetch(client, "r", 2, 2)
    assert fetch_one(client, "r", 0, 0).high_watermark == 0  # replica 3 has nothing yet
    assert follower_fetch(client, "r", 3, 2, version=11).high_watermark == 0  # the old ReplicaId field
    consumer = fetch_one(client, "r", 0, 0)
    assert consumer.high_watermark == 2 and [r.value for r in records_of(consumer.records)] == [b"a", b"b"]
    assert latest(client, "r") == 2
    assert follower_fetch(client, "r", 3, 2).high_watermark == 2  # the follower learns it


def test_acks_all_is_answered_once_the_isr_has_the_batch(broker_thread: BrokerThread, client: RawClient) -> None:
    make_topic(broker_thread, "a")
    lead(broker_thread, "a", [1, 2, 3], [1, 2, 3])
    client.send(PRODUCE, 9, produce_request("a", 0, batch([b"x"]), acks=-1))
    follower = broker_thread.client()
    try:
        assert follower_fetch(follower, "a", 2, 0).error_code == 0
        follower_fetch(follower, "a", 2, 1)
        follower_fetch(follower, "a", 3, 1)
    finally:
        follower.close()
    answer = client.receive(PRODUCE, 9).responses[0].partition_responses[0]
    assert (answer.error_code, answer.base_offset) == (0, 0)


def test_acks_all_times_out_without_the_followers(broker_thread: BrokerThread, client: RawClient) -> None:
    make_topic(broker_thread, "t")
    lead(broker_thread, "t", [1, 2, 3], [1, 2, 3])
    request = produce_request("t", 0, batch([b"x"]), acks=-1)
    request.timeout_ms = 100
    answer = client.call(PRODUCE, 9, request).responses[0].partition_responses[0]
    assert answer.error_code == E.REQUEST_TIMED_OUT


def test_not_enough_replicas(broker_thread: BrokerThread, client: RawClient) -> None:
    make_topic(broker_thread, "n")
    lead(broker_thread, "n", [1, 2, 3], [1], min_isr=2)
    assert produce(client, "n", 0, batch([b"x"])).error_code == E.NOT_ENOUGH_REPLICAS
    assert produce(client, "n", 0, batch([b"x"]), acks=1).error_code == 0


def test_a_waiting_consumer_wakes_when_the_high_watermark_moves(broker_thread: BrokerThread,
                                                               client: RawClient) -> None:
    make_topic(broker_thread, "w")
    lead(broker_thread, "w", [1, 2], [1, 2])
    assert produce(client, "w", 0, batch([b"x"]), acks=1).error_code == 0
    got: list[Any] = []
    consumer = broker_thread.client()
    waiting = threading.Thread(target=lambda: got.append(fetch_one(consumer, "w", 0, 0, max_wait_ms=20000,
                                                                   min_bytes=1)))
    waiting.start()
    try:
        follower_fetch(client, "w", 2, 1)
        waiting.join(15)
        assert not waiting.is_alive() and got[0].high_watermark == 1 and len(records_of(got[0].records)) == 1
    finally:
        waiting.join(25)
        consumer.close()


def test_a_follower_fetch_waits_for_new_data(broker_thread: BrokerThread, client: RawClient) -> None:
    make_topic(broker_thread, "f")
    lead(broker_thread, "f", [1, 2], [1, 2])
    got: list[Any] = []
    follower = broker_thread.client()
    waiting = threading.Thread(target=lambda: got.append(follower_fetch(follower, "f", 2, 0, max_wait_ms=20000,
                                                                        min_bytes=1)))
    waiting.start()
    try:
        assert produce(client, "f", 0, batch([b"x"]), acks=1).error_code == 0
        waiting.join(15)
        assert not waiting.is_alive() and [r.value for r in records_of(got[0].records)] == [b"x"]
    finally:
        waiting.join(25)
        follower.close()


def test_who_may_fetch_as_a_follower(broker_thread: BrokerThread, client: RawClient) -> None:
    make_topic(broker_thread, "u")
    lead(broker_thread, "u", [1, 2], [1, 2], epoch=4, statuses={2: BrokerStatus(10)})
    # not a replica: UNKNOWN_LEADER_EPOCH with a leader epoch, NOT_LEADER_OR_FOLLOWER without one
    assert follower_fetch(client, "u", 5, 0, leader_epoch=4).error_code == E.UNKNOWN_LEADER_EPOCH
    assert follower_fetch(client, "u", 5, 0).error_code == E.NOT_LEADER_OR_FOLLOWER
    assert follower_fetch(client, "u", 2, 0, leader_epoch=3).error_code == E.FENCED_LEADER_EPOCH
    # KIP-903: a fetch from an earlier life of broker 2
    entry = follower_fetch(client, "u", 2, 0, broker_epoch=9)
    assert (entry.error_code, entry.high_watermark) == (E.NOT_LEADER_OR_FOLLOWER, -1)
    assert follower_fetch(client, "u", 2, 0, broker_epoch=10).error_code == 0


def test_a_diverging_follower_is_told_its_truncation_point(broker_thread: BrokerThread, client: RawClient) -> None:
    make_topic(broker_thread, "d")
    lead(broker_thread, "d", [1, 2], [1, 2], epoch=3)
    assert produce(client, "d", 0, batch([b"a", b"b"]), acks=1).error_code == 0
    lead(broker_thread, "d", [1, 2], [1, 2], epoch=5)
    assert produce(client, "d", 0, batch([b"c"]), acks=1).error_code == 0
    # the follower wrote offsets 2..3 in an epoch 4 this leader never had: epoch 3 ends at 2 here
    entry = follower_fetch(client, "d", 2, 4, last_fetched_epoch=4, leader_epoch=5)
    assert entry.error_code == 0 and (entry.diverging_epoch.epoch, entry.diverging_epoch.end_offset) == (3, 2)
    assert bytes(entry.records) == b""
    entry = follower_fetch(client, "d", 2, 2, last_fetched_epoch=3, leader_epoch=5)
    assert entry.diverging_epoch.epoch == -1 and [r.value for r in records_of(entry.records)] == [b"c"]


def test_only_the_leader_answers_list_offsets_and_takes_writes(broker_thread: BrokerThread, client: RawClient) -> None:
    """A replica that does not lead (a follower, or a node just restarted that does not lead yet)
    refuses ListOffsets, as Kafka's fetchOnlyFromLeader, but for the debugging replica id (-2): its
    high watermark may lag what was acknowledged (bench/cluster.py's failover read a restarted
    node's end below the records acknowledged before the kill). It takes no write either."""
    make_topic(broker_thread, "f")
    lead(broker_thread, "f", [1, 2, 3], [1, 2, 3])
    assert produce(client, "f", 0, batch([b"a"]), acks=1).error_code == 0

    async def follow() -> None:
        broker_thread.broker.partitions.get("f", 0).make_follower(2, 1, 2, [1, 2, 3], [1, 2, 3])
    broker_thread.call(follow())
    R = M.ListOffsetsRequest

    def list_latest(replica_id: int) -> Any:
        request = R(replica_id=replica_id, isolation_level=0, topics=[R.ListOffsetsTopic(name="f", partitions=[
            R.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)])])
        return client.call(LIST_OFFSETS, 7, request).topics[0].partitions[0]

    assert list_latest(-1).error_code == E.NOT_LEADER_OR_FOLLOWER
    assert list_latest(-2).error_code == E.NONE
    assert produce(client, "f", 0, batch([b"b"]), acks=1).error_code == E.NOT_LEADER_OR_FOLLOWER
