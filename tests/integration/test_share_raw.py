"""Share groups with raw frames: share session errors, acknowledgement validation, unknown topic
ids, the share offset admin APIs (90-92) and their error paths, DeleteGroups of a share group, and
the share.version gate. One broker for the module; each test uses its own topic and group."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.harness import RawClient, wait_for
from tests.integration.test_server_support import (
    BrokerThread,
    batch,
    fetch_one,
    metadata,
    produce,
    records_of,
)

E = ErrorCode
SHARE_HEARTBEAT, SHARE_DESCRIBE, SHARE_FETCH, SHARE_ACK = 76, 77, 78, 79
DESCRIBE_OFFSETS, ALTER_OFFSETS, DELETE_OFFSETS = 90, 91, 92
DELETE_GROUPS, UPDATE_FEATURES, INCREMENTAL_ALTER_CONFIGS, LIST_CONFIG_RESOURCES = 42, 57, 44, 74
_names = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    # locks as short as 1 s, so that a test can see one expire
    with BrokerThread(Path(tmp_path_factory.mktemp("share-raw")),
                      **{"group.share.min.record.lock.duration.ms": "1000"}) as bt:
        yield bt


@pytest.fixture
def client(broker: BrokerThread) -> Iterator[RawClient]:
    with broker.client() as c:
        yield c


class Share:
    """A share group member driven by hand: a topic of `partitions` with `records` records in
    partition 0, the group reading from the earliest offset."""

    def __init__(self, broker: BrokerThread, client: RawClient, records: int = 10, partitions: int = 1) -> None:
        n = next(_names)
        self.client, self.topic, self.group = client, "share-raw-%d" % n, "share-raw-group-%d" % n
        broker.create_topic(self.topic, partitions)
        self.topic_id = metadata(client, [self.topic]).topics[0].topic_id
        if records:
            assert produce(client, self.topic, 0, batch([b"v%d" % i for i in range(records)])).error_code == 0
        self.set_configs(**{"share.auto.offset.reset": "earliest"})
        self.member = uuid.uuid4().hex[:22]
        self.epoch = 0

    def set_configs(self, **configs: str) -> None:
        R = M.IncrementalAlterConfigsRequest
        request = R(resources=[R.AlterConfigsResource(resource_type=32, resource_name=self.group, configs=[
            R.AlterableConfig(name=k, config_operation=0, value=v) for k, v in configs.items()])], validate_only=False)
        assert self.client.call(INCREMENTAL_ALTER_CONFIGS, 1, request).responses[0].error_code == 0

    def heartbeat(self, epoch: int | None = None, member: str | None = None, topics: list[str] | None = None) -> Any:
        epoch = self.epoch if epoch is None else epoch
        request = M.ShareGroupHeartbeatRequest(
            group_id=self.group, member_id=self.member if member is None else member, member_epoch=epoch,
            rack_id=None, subscribed_topic_names=[self.topic] if topics is None and epoch == 0 else topics)
        return self.client.call(SHARE_HEARTBEAT, 1, request)

    def join(self) -> Any:
        response = self.heartbeat()
        assert response.error_code == 0, response
        self.epoch = response.member_epoch
        return response

    def leave(self) -> None:
        assert self.heartbeat(epoch=-1).error_code == 0

    def fetch(self, epoch: int, partitions: list[int] | None = None, acks: dict[int, list[Any]] | None = None,
              topic_id: uuid.UUID | None = None, max_wait_ms: int = 0, version: int = 1,
              member: str | None = None, client: RawClient | None = None, forget: list[int] | None = None,
              **fields: Any) -> Any:
        """A ShareFetch; `fields` set other request fields (max_records, share_acquire_mode, ...).
        With `client`, the request is only sent (the caller receives the response)."""
        R = M.ShareFetchRequest
        parts = sorted(set(partitions or []) | set(acks or {}))
        topics = [R.FetchTopic(topic_id=topic_id or self.topic_id, partitions=[
            R.FetchPartition(partition_index=p, acknowledgement_batches=(acks or {}).get(p, [])) for p in parts])
        ] if parts else []
        forgotten = [R.ForgottenTopic(topic_id=self.topic_id, partitions=forget)] if forget else []
        request = R(group_id=self.group, member_id=member or self.member, share_session_epoch=epoch,
                    max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, max_records=500, batch_size=500,
                    topics=topics, forgotten_topics_data=forgotten)
        for name, value in fields.items():
            setattr(request, name, value)
        if client is not None:
            client.send(SHARE_FETCH, version, request)
            return None
        return self.client.call(SHARE_FETCH, version, request)

    def acknowledge(self, epoch: int, acks: dict[int, list[Any]], version: int = 1, member: str | None = None,
                    renew: bool = False) -> Any:
        R = M.ShareAcknowledgeRequest
        request = R(group_id=self.group, member_id=member or self.member, share_session_epoch=epoch, topics=[
            R.AcknowledgeTopic(topic_id=self.topic_id, partitions=[
                R.AcknowledgePartition(partition_index=p, acknowledgement_batches=b) for p, b in acks.items()])])
        if renew:
            request.is_renew_ack = True
        return self.client.call(SHARE_ACK, version, request)

    def describe_offsets(self, topics: list[tuple[str, list[int]]] | None = None, version: int = 1) -> Any:
        R = M.DescribeShareGroupOffsetsRequest
        wanted = None if topics is None else [R.DescribeShareGroupOffsetsRequestTopic(topic_name=t, partitions=ps)
                                              for t, ps in topics]
        request = R(groups=[R.DescribeShareGroupOffsetsRequestGroup(group_id=self.group, topics=wanted)])
        return self.client.call(DESCRIBE_OFFSETS, version, request).groups[0]

    def alter_offsets(self, offsets: dict[tuple[str, int], int], group: str | None = None) -> Any:
        R = M.AlterShareGroupOffsetsRequest
        by_topic: dict[str, list[Any]] = {}
        for (t, p), offset in offsets.items():
            by_topic.setdefault(t, []).append(R.AlterShareGroupOffsetsRequestPartition(partition_index=p,
                                                                                       start_offset=offset))
        request = R(group_id=self.group if group is None else group, topics=[
            R.AlterShareGroupOffsetsRequestTopic(topic_name=t, partitions=ps) for t, ps in by_topic.items()])
        return self.client.call(ALTER_OFFSETS, 0, request)

    def delete_offsets(self, topics: list[str], group: str | None = None) -> Any:
        R = M.DeleteShareGroupOffsetsRequest
        request = R(group_id=self.group if group is None else group,
                    topics=[R.DeleteShareGroupOffsetsRequestTopic(topic_name=t) for t in topics])
        return self.client.call(DELETE_OFFSETS, 0, request)


def ack(first: int, last: int, *types: int) -> Any:
    return M.ShareFetchRequest.AcknowledgementBatch(first_offset=first, last_offset=last,
                                                    acknowledge_types=list(types) or [1])


def ack_batch(first: int, last: int, *types: int) -> Any:
    return M.ShareAcknowledgeRequest.AcknowledgementBatch(first_offset=first, last_offset=last,
                                                          acknowledge_types=list(types) or [1])


def partition_of(response: Any, index: int = 0) -> Any:
    return next(p for t in response.responses for p in t.partitions if p.partition_index == index)


def acquired(response: Any, index: int = 0) -> list[tuple[int, int, int]]:
    parts = [p for t in response.responses for p in t.partitions if p.partition_index == index]
    return [(a.first_offset, a.last_offset, a.delivery_count) for p in parts for a in p.acquired_records]


def offsets_of(group: Any) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (start offset, lag) of a DescribeShareGroupOffsets group."""
    return {(t.topic_name, p.partition_index): (p.start_offset, p.lag) for t in group.topics for p in t.partitions}


# ----- share sessions and acknowledgements -------------------------------------------------
def test_share_session_epochs(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client)
    s.join()
    assert s.fetch(1, [0]).error_code == E.SHARE_SESSION_NOT_FOUND  # no session yet
    opened = s.fetch(0, [0])
    assert opened.error_code == 0 and acquired(opened) == [(0, 9, 1)]
    assert opened.acquisition_lock_timeout_ms == 30000
    assert s.fetch(5).error_code == E.INVALID_SHARE_SESSION_EPOCH
    assert s.acknowledge(3, {0: [ack_batch(0, 9)]}).error_code == E.INVALID_SHARE_SESSION_EPOCH
    # a ShareFetch at epoch 0 that carries acknowledgements is refused
    assert s.fetch(0, acks={0: [ack(0, 9)]}).error_code == E.INVALID_REQUEST
    done = s.acknowledge(1, {0: [ack_batch(0, 9)]})
    assert done.error_code == 0 and partition_of(done).error_code == 0
    # the session goes on at epoch 2, closes at -1 (its last acknowledgements applied)
    assert s.fetch(2).error_code == 0
    assert s.fetch(-1).error_code == 0
    assert s.fetch(3).error_code == E.SHARE_SESSION_NOT_FOUND
    assert s.acknowledge(3, {0: [ack_batch(0, 0)]}).error_code == E.SHARE_SESSION_NOT_FOUND


def test_acknowledgement_errors(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client)
    s.join()
    assert acquired(s.fetch(0, [0])) == [(0, 9, 1)]
    # overlapping batches, an unknown type, a length that does not match: INVALID_REQUEST on the partition
    epoch = 1
    for bad in ([ack(0, 4), ack(3, 5)], [ack(0, 0, 7)], [ack(0, 2, 1, 1)], [ack(5, 4)]):
        response = s.fetch(epoch, acks={0: bad})
        epoch += 1
        assert partition_of(response).acknowledge_error_code == E.INVALID_REQUEST, bad
    # past the acquired records: INVALID_REQUEST, nothing applied (as Kafka's SharePartition)
    response = s.acknowledge(epoch, {0: [ack_batch(0, 12)]})
    epoch += 1
    assert (partition_of(response).error_code, partition_of(response).error_message) == (
        E.INVALID_REQUEST, "Batch record not found. The last offset in request is past acquired records.")
    # records no longer acquired (acknowledged already) above the start offset: INVALID_RECORD_STATE;
    # below it they are skipped (as Kafka)
    assert partition_of(s.acknowledge(epoch, {0: [ack_batch(0, 1), ack_batch(5, 6)]})).error_code == 0
    response = s.acknowledge(epoch + 1, {0: [ack_batch(5, 6)]})
    assert (partition_of(response).error_code, partition_of(response).error_message) == (
        E.INVALID_RECORD_STATE, "The offset cannot be acknowledged. The offset is not acquired.")
    assert partition_of(s.acknowledge(epoch + 2, {0: [ack_batch(0, 1)]})).error_code == 0
    epoch += 3
    # an unknown topic id: UNKNOWN_TOPIC_ID
    R = M.ShareAcknowledgeRequest
    unknown = uuid.uuid4()
    request = R(group_id=s.group, member_id=s.member, share_session_epoch=epoch, topics=[R.AcknowledgeTopic(
        topic_id=unknown, partitions=[R.AcknowledgePartition(partition_index=0, acknowledgement_batches=[
            ack_batch(0, 0)])])])
    response = client.call(SHARE_ACK, 1, request)
    epoch += 1
    assert [(t.topic_id, t.partitions[0].error_code) for t in response.responses] == [(unknown, E.UNKNOWN_TOPIC_ID)]
    # RENEW (4) exists from v2 only
    v1 = s.acknowledge(epoch, {0: [ack_batch(0, 0, 4)]})
    assert partition_of(v1).error_code == E.INVALID_REQUEST
    assert partition_of(s.acknowledge(epoch + 1, {0: [ack_batch(2, 4), ack_batch(7, 9)]})).error_code == 0


def test_an_acknowledgement_after_the_lock_expired(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=3)
    s.set_configs(**{"share.record.lock.duration.ms": "1000"})
    s.join()
    first = s.fetch(0, [0])
    assert acquired(first) == [(0, 2, 1)] and first.acquisition_lock_timeout_ms == 1000
    time.sleep(1.5)  # the lock runs out: the records are AVAILABLE again
    late = s.acknowledge(1, {0: [ack_batch(0, 2)]})
    assert (partition_of(late).error_code, partition_of(late).error_message) == (
        E.INVALID_RECORD_STATE, "The batch cannot be acknowledged. The batch is not in the acquired state.")
    assert acquired(s.fetch(2, [0])) == [(0, 2, 2)]  # delivered again, counted
    assert partition_of(s.acknowledge(3, {0: [ack_batch(0, 2)]})).error_code == 0


def test_max_records_is_bounded_by_the_record_locks(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=0)
    for n in range(15):  # batches of 10: the cap is soft up to a batch boundary (as Kafka's)
        assert produce(client, s.topic, 0, batch([b"v%d" % (n * 10 + i) for i in range(10)])).error_code == 0
    s.set_configs(**{"share.partition.max.record.locks": "100"})
    s.join()
    R = M.ShareFetchRequest
    request = R(group_id=s.group, member_id=s.member, share_session_epoch=0, max_wait_ms=0, min_bytes=1,
                max_bytes=1 << 20, max_records=2**31 - 1, batch_size=2**31 - 1, topics=[R.FetchTopic(
                    topic_id=s.topic_id, partitions=[R.FetchPartition(partition_index=0, acknowledgement_batches=[])])],
                forgotten_topics_data=[])
    response = client.call(SHARE_FETCH, 1, request)
    assert response.error_code == 0
    got = acquired(response)
    assert sum(last - first + 1 for first, last, _ in got) == 100 and got[0][0] == 0


def _lock_deadline(broker: BrokerThread, s: Share, offset: int, partition: int = 0) -> tuple[int, int, int | None]:
    """(state, delivery count, lock deadline) of an offset of a partition, read on the broker's loop."""
    async def read() -> tuple[int, int, int | None]:
        st = broker.broker.share_manager.entries[(s.group, s.topic_id, partition)].engine.state_of(offset)
        assert st is not None
        return int(st.state), st.delivery_count, st.deadline

    return broker.call(read())  # type: ignore[no-any-return]


def test_share_fetch_v2_acquire_modes_and_renew(broker: BrokerThread, client: RawClient) -> None:
    """ShareFetch v2: record_limit acquires exactly MaxRecords (KIP-1206), batch_optimized up to a
    batch boundary; RENEW (KIP-1222) extends a lock under the group's current lock duration, with no
    new delivery, in a ShareAcknowledge v2 or in a ShareFetch with IsRenewAck that fetches nothing."""
    s = Share(broker, client, records=10)  # one log batch of 10
    s.join()
    assert acquired(s.fetch(0, [0], version=2, max_records=3, share_acquire_mode=1)) == [(0, 2, 1)]
    assert acquired(s.fetch(1, [0], version=2, max_records=3, share_acquire_mode=1)) == [(3, 5, 1)]
    assert acquired(s.fetch(2, [0], version=2, max_records=3)) == [(6, 9, 1)]
    _, _, before = _lock_deadline(broker, s, 0)
    assert before is not None
    s.set_configs(**{"share.record.lock.duration.ms": "45000"})  # obeyed by the loaded share-partition at once
    renewed = s.acknowledge(3, {0: [ack_batch(0, 2, 4)]}, version=2, renew=True)
    assert partition_of(renewed).error_code == 0 and renewed.acquisition_lock_timeout_ms == 45000
    state, count, after = _lock_deadline(broker, s, 0)
    assert (state, count) == (1, 1) and after is not None and after >= before + 15000  # ACQUIRED, not redelivered
    assert produce(client, s.topic, 0, batch([b"late"])).error_code == 0
    # KIP-1222: a renewing fetch must ask for nothing; otherwise INVALID_REQUEST and nothing changes
    refused = s.fetch(4, acks={0: [ack(3, 5, 4)]}, version=2, is_renew_ack=True, max_records=0, min_bytes=0)
    assert refused.error_code == E.INVALID_REQUEST and refused.responses == []
    renew_fetch = s.fetch(4, acks={0: [ack(3, 5, 4)]}, version=2, is_renew_ack=True, max_records=0, min_bytes=0,
                          max_bytes=0)
    assert renew_fetch.error_code == 0 and acquired(renew_fetch) == []  # offset 10 is not handed out
    assert partition_of(renew_fetch).acknowledge_error_code == 0
    assert _lock_deadline(broker, s, 3)[2] >= before + 15000  # type: ignore[operator]
    assert partition_of(s.acknowledge(5, {0: [ack_batch(0, 9)]}, version=2)).error_code == 0
    assert s.fetch(6, [0], version=2, share_acquire_mode=7).error_code == E.INVALID_REQUEST


def test_acknowledging_another_members_records_changes_nothing(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=4)
    s.join()
    assert acquired(s.fetch(0, [0])) == [(0, 3, 1)]
    other = uuid.uuid4().hex[:22]
    assert s.heartbeat(epoch=0, member=other, topics=[s.topic]).error_code == 0
    assert acquired(s.fetch(0, [0], member=other)) == []  # everything is acquired by s
    refused = s.acknowledge(1, {0: [ack_batch(0, 3)]}, member=other)
    assert (partition_of(refused).error_code, partition_of(refused).error_message) == (
        E.INVALID_RECORD_STATE, "Member is not the owner of batch record")
    piggybacked = s.fetch(2, [0], acks={0: [ack(1, 1, 3)]}, member=other)
    assert partition_of(piggybacked).acknowledge_error_code == E.INVALID_RECORD_STATE
    assert acquired(piggybacked) == []
    assert [_lock_deadline(broker, s, o)[:2] for o in range(4)] == [(1, 1)] * 4  # still s's, ACQUIRED
    assert partition_of(s.acknowledge(1, {0: [ack_batch(0, 3)]})).error_code == 0
    assert offsets_of(s.describe_offsets())[(s.topic, 0)] == (4, 0)


def test_a_bad_acknowledgement_affects_only_its_partition(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=3, partitions=2)
    assert produce(client, s.topic, 1, batch([b"a", b"b", b"c"])).error_code == 0
    s.join()
    # the share-partitions load at the first fetch, which answers with the first to load (as
    # Kafka's DelayedShareFetch); the other comes with the next fetch
    opened = s.fetch(0, [0, 1])
    assert (acquired(opened, 0), acquired(opened, 1)) == ([(0, 2, 1)], [])
    second = s.fetch(1)
    assert (acquired(second, 0), acquired(second, 1)) == ([], [(0, 2, 1)])
    response = s.acknowledge(2, {0: [ack_batch(0, 2)], 1: [ack_batch(0, 1), ack_batch(2, 5)]})
    assert (partition_of(response, 0).error_code, partition_of(response, 1).error_code) == (0, E.INVALID_REQUEST)
    assert [_lock_deadline(broker, s, o, 1)[:2] for o in range(3)] == [(1, 1)] * 3  # p1 untouched, all of it
    assert partition_of(s.acknowledge(3, {1: [ack_batch(0, 2)]}), 1).error_code == 0
    assert offsets_of(s.describe_offsets()) == {(s.topic, 0): (3, 0), (s.topic, 1): (3, 0)}


def test_a_long_poll_wakes_on_released_records_and_new_data(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=3)
    s.join()
    assert acquired(s.fetch(0, [0])) == [(0, 2, 1)]
    other = uuid.uuid4().hex[:22]
    assert s.heartbeat(epoch=0, member=other, topics=[s.topic]).error_code == 0
    poller = broker.client("share-poller")
    try:
        # MaxWaitMs far beyond the socket timeout (10 s): only a wake-up answers in time
        s.fetch(0, [0], member=other, client=poller, max_wait_ms=120_000)
        assert partition_of(s.acknowledge(1, {0: [ack_batch(0, 2, 2)]})).error_code == 0  # RELEASE
        assert acquired(poller.receive(SHARE_FETCH, 1)) == [(0, 2, 2)]
        s.fetch(1, [0], member=other, client=poller, max_wait_ms=120_000)
        assert produce(client, s.topic, 0, batch([b"new"])).error_code == 0
        assert acquired(poller.receive(SHARE_FETCH, 1)) == [(3, 3, 1)]
        # a forgotten partition leaves the session: what it has is no longer fetched
        assert produce(client, s.topic, 0, batch([b"more"])).error_code == 0
        s.fetch(2, member=other, client=poller, forget=[0])
        forgot = poller.receive(SHARE_FETCH, 1)
        assert forgot.error_code == 0 and acquired(forgot) == []
    finally:
        poller.close()


def test_share_auto_offset_reset_latest_and_by_duration(broker: BrokerThread, client: RawClient) -> None:
    recent = Share(broker, client, records=5)
    recent.set_configs(**{"share.auto.offset.reset": "by_duration:PT1H"})
    recent.join()
    assert acquired(recent.fetch(0, [0])) == [(0, 4, 1)]  # produced within the hour
    latest = Share(broker, client, records=5)
    latest.set_configs(**{"share.auto.offset.reset": "latest"})
    latest.join()
    assert acquired(latest.fetch(0, [0])) == []
    assert produce(client, latest.topic, 0, batch([b"after"])).error_code == 0
    assert acquired(latest.fetch(1, [0])) == [(5, 5, 1)]


def test_list_config_resources_lists_groups_with_configs(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=0)  # its group has share.auto.offset.reset set
    listed = client.call(LIST_CONFIG_RESOURCES, 1, M.ListConfigResourcesRequest(resource_types=[32]))
    assert listed.error_code == 0
    found = {(r.resource_name, r.resource_type) for r in listed.config_resources}
    assert (s.group, 32) in found and all(t == 32 for _, t in found)


def test_heartbeat_settings_of_group_configs_reach_live_members(broker: BrokerThread, client: RawClient) -> None:
    """share.heartbeat.interval.ms and (KIP-848) consumer.heartbeat.interval.ms set on live groups
    are in their members' next heartbeat responses (a heartbeat with something new is not held)."""
    s = Share(broker, client, records=0)
    assert s.join().heartbeat_interval_ms == 5000
    s.set_configs(**{"share.heartbeat.interval.ms": "7000"})
    request = M.ShareGroupHeartbeatRequest(group_id=s.group, member_id=s.member, member_epoch=s.epoch,
                                           rack_id="rack-b", subscribed_topic_names=None)  # new: answered at once
    assert client.call(SHARE_HEARTBEAT, 1, request).heartbeat_interval_ms == 7000

    C = M.ConsumerGroupHeartbeatRequest
    group = s.group + "-consumer"

    def heartbeat(member: str, epoch: int, topics: list[str] | None) -> Any:
        response = client.call(68, 0, C(group_id=group, member_id=member, member_epoch=epoch, instance_id=None,
                                        rack_id=None, rebalance_timeout_ms=30000 if epoch == 0 else -1,
                                        subscribed_topic_names=topics, server_assignor=None,
                                        topic_partitions=[] if epoch == 0 else None))
        assert response.error_code == 0, response
        return response

    def consumer_join(member: str) -> Any:
        """The interval a joining member is told once it is in the group: a join that waits for
        the group's first assignment is asked back when that is due (and comes back then, as a
        client does)."""
        response = heartbeat(member, 0, [s.topic])
        deadline = time.monotonic() + 10
        while response.heartbeat_interval_ms <= 500 and time.monotonic() < deadline:
            time.sleep(response.heartbeat_interval_ms / 1000)
            response = heartbeat(member, response.member_epoch, None)
        return response

    assert consumer_join(uuid.uuid4().hex[:22]).heartbeat_interval_ms == 5000
    R = M.IncrementalAlterConfigsRequest
    altered = client.call(INCREMENTAL_ALTER_CONFIGS, 1, R(resources=[R.AlterConfigsResource(
        resource_type=32, resource_name=group, configs=[R.AlterableConfig(
            name="consumer.heartbeat.interval.ms", config_operation=0, value="7000")])], validate_only=False))
    assert altered.responses[0].error_code == 0
    assert consumer_join(uuid.uuid4().hex[:22]).heartbeat_interval_ms == 7000  # the group is live: no restart


def test_the_dead_letter_queue(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=4)
    dlq = "dlq.%s" % s.topic
    broker.create_topic(dlq, 1, {"errors.deadletterqueue.group.enable": "true"})
    s.set_configs(**{"errors.deadletterqueue.topic.name": dlq, "errors.deadletterqueue.copy.record.enable": "true",
                     "share.delivery.count.limit": "2"})
    s.join()
    assert acquired(s.fetch(0, [0])) == [(0, 3, 1)]
    # 0-1 rejected, 2-3 released; released again they run out of deliveries
    assert partition_of(s.acknowledge(1, {0: [ack_batch(0, 1, 3), ack_batch(2, 3, 2)]})).error_code == 0
    assert acquired(s.fetch(2, [0])) == [(2, 3, 2)]
    assert partition_of(s.acknowledge(3, {0: [ack_batch(2, 3, 2)]})).error_code == 0

    def dead_letters() -> list[Any]:
        return records_of(fetch_one(client, dlq, 0, 0).records)

    got = wait_for(lambda: len(dead_letters()) == 4 and dead_letters(), 10, what="four dead letters")
    headers = [{k: bytes(v).decode() for k, v in r.headers} for r in got]
    assert [bytes(r.value) for r in got] == [b"v0", b"v1", b"v2", b"v3"]
    assert [(h["__dlq.errors.offset"], h["__dlq.errors.delivery.count"], h["__dlq.errors.message"]) for h in headers] == [
        ("0", "1", "Offset rejected by client."), ("1", "1", "Offset rejected by client."),
        ("2", "2", "Offset delivery count exceeded the threshold."),
        ("3", "2", "Offset delivery count exceeded the threshold.")]
    assert {(h["__dlq.errors.topic"], h["__dlq.errors.partition"], h["__dlq.errors.group"]) for h in headers} == {
        (s.topic, "0", s.group)}
    wait_for(lambda: offsets_of(s.describe_offsets())[(s.topic, 0)] == (4, 0), 10, what="all archived")


def test_a_dead_letter_queue_that_cannot_be_written_archives_the_records(broker: BrokerThread,
                                                                         client: RawClient) -> None:
    s = Share(broker, client, records=2)
    missing = "dlq.missing-%s" % s.topic  # not there, and the cluster does not create it
    s.set_configs(**{"errors.deadletterqueue.topic.name": missing})
    s.join()
    assert acquired(s.fetch(0, [0])) == [(0, 1, 1)]
    assert partition_of(s.acknowledge(1, {0: [ack_batch(0, 1, 3)]})).error_code == 0
    wait_for(lambda: offsets_of(s.describe_offsets())[(s.topic, 0)] == (2, 0), 10, what="archived anyway")
    assert metadata(client, [missing], allow_auto=False).topics[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION


def test_fetching_an_unknown_topic_id_or_partition(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client)
    s.join()
    unknown = uuid.uuid4()
    response = s.fetch(0, [0], topic_id=unknown)
    assert response.error_code == 0
    assert [(t.topic_id, t.partitions[0].error_code) for t in response.responses] == [(unknown, E.UNKNOWN_TOPIC_ID)]
    s.fetch(-1)
    response = s.fetch(0, [7])
    assert partition_of(response, 7).error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert partition_of(response, 7).records == b""  # never null (librdkafka rejects a null)


def test_share_heartbeat_errors(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=0)
    assert s.heartbeat(member="").error_code == E.INVALID_REQUEST
    assert s.heartbeat(topics=[]).error_code == E.INVALID_REQUEST  # joining needs a subscription
    missing = s.heartbeat(epoch=3)
    assert (missing.error_code, missing.error_message) == (E.GROUP_ID_NOT_FOUND,
                                                           "Share group %s not found." % s.group)
    s.join()
    assert s.heartbeat(epoch=3, member="x" * 22).error_code == E.UNKNOWN_MEMBER_ID
    assert s.heartbeat(epoch=s.epoch + 5).error_code == E.FENCED_MEMBER_EPOCH
    described = client.call(SHARE_DESCRIBE, 1, M.ShareGroupDescribeRequest(group_ids=[s.group, "nope"],
                                                                           include_authorized_operations=False))
    assert [(g.group_id, g.error_code, g.group_state) for g in described.groups][0] == (s.group, 0, "Stable")
    assert described.groups[1].error_code == E.GROUP_ID_NOT_FOUND


# ----- DescribeShareGroupOffsets / AlterShareGroupOffsets / DeleteShareGroupOffsets --------
def test_share_group_offsets(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=10, partitions=2)
    s.join()
    assert acquired(s.fetch(0, [0, 1])) == [(0, 9, 1)]
    s.acknowledge(1, {0: [ack_batch(0, 3), ack_batch(6, 7)]})  # 0-3 done: start offset 4; 6-7 done above it
    group = s.describe_offsets()
    assert offsets_of(group) == {(s.topic, 0): (4, 4), (s.topic, 1): (0, 0)}
    assert offsets_of(s.describe_offsets(version=0))[(s.topic, 0)][0] == 4
    named = s.describe_offsets([(s.topic, [0]), ("no-such-topic", [0])])
    assert offsets_of(named) == {(s.topic, 0): (4, 4), ("no-such-topic", 0): (-1, -1)}
    assert [t.topic_id for t in named.topics][1] == uuid.UUID(int=0)
    assert s.describe_offsets([]).topics == []

    # a group with members cannot be altered or have its offsets deleted
    assert s.alter_offsets({(s.topic, 0): 2}).error_code == E.NON_EMPTY_GROUP
    assert s.delete_offsets([s.topic]).error_code == E.NON_EMPTY_GROUP
    unknown = s.delete_offsets([s.topic], group="no-such-group")
    assert (unknown.error_code, unknown.error_message) == (E.GROUP_ID_NOT_FOUND, "Group no-such-group not found.")
    s.fetch(-1)
    s.leave()

    altered = s.alter_offsets({(s.topic, 0): 2, (s.topic, 5): 0, ("no-such-topic", 0): 1})
    assert altered.error_code == 0
    results = {(t.topic_name, p.partition_index): p.error_code for t in altered.responses for p in t.partitions}
    assert results == {(s.topic, 0): 0, (s.topic, 5): E.UNKNOWN_TOPIC_OR_PARTITION,
                       ("no-such-topic", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert offsets_of(s.describe_offsets())[(s.topic, 0)] == (2, 8)  # the new start: nothing delivered above it
    # a member joining now reads from offset 2 (the broker let go of what it held in memory)
    s.member, s.epoch = uuid.uuid4().hex[:22], 0
    s.join()
    assert acquired(s.fetch(0, [0])) == [(2, 9, 1)]
    s.fetch(-1)
    s.leave()

    deleted = s.delete_offsets([s.topic, "no-such-topic"])
    assert deleted.error_code == 0
    assert [(t.topic_name, t.error_code) for t in deleted.responses] == [
        (s.topic, 0), ("no-such-topic", E.UNKNOWN_TOPIC_OR_PARTITION)]
    assert s.describe_offsets().topics == []
    assert offsets_of(s.describe_offsets([(s.topic, [0])])) == {(s.topic, 0): (-1, -1)}
    again = s.delete_offsets([s.topic])
    assert [(t.error_code, t.error_message) for t in again.responses] == [
        (E.UNKNOWN_TOPIC_OR_PARTITION, "There is no offset information to delete.")]


def test_altering_the_offsets_of_a_new_group_creates_it(broker: BrokerThread, client: RawClient) -> None:
    """Kafka 4.2 (KAFKA-19662): an operator positions a share group before its first member."""
    s = Share(broker, client, records=10)
    altered = s.alter_offsets({(s.topic, 0): 6})
    assert [(p.partition_index, p.error_code) for t in altered.responses for p in t.partitions] == [(0, 0)]
    listed = client.call(16, 5, M.ListGroupsRequest(states_filter=[], types_filter=["share"])).groups
    assert [(g.group_id, g.group_state, g.group_type) for g in listed if g.group_id == s.group] == [
        (s.group, "Empty", "share")]
    described = client.call(SHARE_DESCRIBE, 1, M.ShareGroupDescribeRequest(
        group_ids=[s.group], include_authorized_operations=False)).groups[0]
    assert (described.error_code, described.group_state, described.group_epoch) == (0, "Empty", 0)
    assert offsets_of(s.describe_offsets()) == {(s.topic, 0): (6, 4)}
    s.join()  # share.auto.offset.reset is earliest, but the altered start offset is where it begins
    assert acquired(s.fetch(0, [0])) == [(6, 9, 1)]
    again = s.alter_offsets({(s.topic, 0): 0})
    assert (again.error_code, again.error_message) == (E.NON_EMPTY_GROUP, "The group is not empty.")
    s.fetch(-1)
    s.leave()


def test_delete_groups_deletes_the_share_state(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=5)
    s.join()
    assert acquired(s.fetch(0, [0])) == [(0, 4, 1)]
    s.acknowledge(1, {0: [ack_batch(0, 4)]})
    R = M.DeleteGroupsRequest
    assert client.call(DELETE_GROUPS, 2, R(groups_names=[s.group])).results[0].error_code == E.NON_EMPTY_GROUP
    s.fetch(-1)
    s.leave()
    assert offsets_of(s.describe_offsets())[(s.topic, 0)] == (5, 0)
    assert client.call(DELETE_GROUPS, 2, R(groups_names=[s.group])).results[0].error_code == 0
    assert offsets_of(s.describe_offsets([(s.topic, [0])])) == {(s.topic, 0): (-1, -1)}


def test_share_version_zero_turns_the_share_apis_off(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=1)
    R = M.UpdateFeaturesRequest

    def set_level(level: int, upgrade_type: int) -> None:
        request = R(timeout_ms=60000, validate_only=False, feature_updates=[R.FeatureUpdateKey(
            feature="share.version", max_version_level=level, upgrade_type=upgrade_type,
            allow_downgrade=upgrade_type != 1)])
        assert client.call(UPDATE_FEATURES, 1, request).error_code == 0

    set_level(0, 2)
    try:
        assert s.heartbeat().error_code == E.UNSUPPORTED_VERSION
        assert s.fetch(0, [0]).error_code == E.UNSUPPORTED_VERSION
        assert s.acknowledge(1, {0: [ack_batch(0, 0)]}).error_code == E.UNSUPPORTED_VERSION
        assert s.describe_offsets().error_code == E.UNSUPPORTED_VERSION
        assert s.alter_offsets({(s.topic, 0): 0}).error_code == E.UNSUPPORTED_VERSION
        assert s.delete_offsets([s.topic]).error_code == E.UNSUPPORTED_VERSION
        described = client.call(SHARE_DESCRIBE, 1, M.ShareGroupDescribeRequest(group_ids=[s.group]))
        assert described.groups[0].error_code == E.UNSUPPORTED_VERSION
    finally:
        set_level(1, 1)
    assert s.heartbeat().error_code == 0


def test_share_metrics(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=5)
    s.join()
    assert acquired(s.fetch(0, [0])) == [(0, 4, 1)]
    assert partition_of(s.acknowledge(1, {0: [ack_batch(0, 1), ack_batch(2, 2, 2)]})).error_code == 0

    async def scrape() -> str:
        from prometheus_client import generate_latest

        return generate_latest(broker.broker.metrics.registry).decode()

    text = broker.call(scrape())
    labels = '{group="%s",partition="0",topic="%s"}' % (s.group, s.topic)
    assert "kafka_share_start_offset%s 2.0" % labels in text
    assert "kafka_share_in_flight_records%s 3.0" % labels in text  # 2-4: 2 released, 3-4 acquired
    assert "kafka_share_lag%s 3.0" % labels in text
    assert 'kafka_groups{protocol="share",state="Stable"}' in text  # broker/observability/state_metrics.py
    assert "kafka_share_sessions " in text
    for counter in ("acquired", "redelivered", "acknowledged", "released", "rejected", "lock_expired", "archived",
                    "dead_lettered", "dead_letter_failed"):
        assert "kafka_share_records_%s_total " % counter in text


def test_a_deleted_topic_takes_its_share_state_along(broker: BrokerThread, client: RawClient) -> None:
    s = Share(broker, client, records=3)
    s.join()
    assert acquired(s.fetch(0, [0])) == [(0, 2, 1)]
    assert partition_of(s.acknowledge(1, {0: [ack_batch(0, 1)]})).error_code == 0
    coordinator = broker.broker.share_coordinator
    assert broker.call(coordinator.topic_keys(s.topic_id)) == [(s.group, s.topic_id, 0)]
    R = M.DeleteTopicsRequest
    deleted = client.call(20, 6, R(topics=[R.DeleteTopicState(name=s.topic)], timeout_ms=10000))
    assert deleted.responses[0].error_code == 0
    assert broker.call(coordinator.topic_keys(s.topic_id)) == []
    assert s.describe_offsets().topics == []  # no longer an initialized share-partition of the group


def test_a_state_topic_that_cannot_be_made_now_is_a_retriable_coordinator_error(
        broker: BrokerThread, client: RawClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A joining share member whose group's state topic cannot be created now (cluster mode: no
    controller for a moment) gets COORDINATOR_NOT_AVAILABLE, which clients retry, not the admin
    error NOT_CONTROLLER (fatal to librdkafka's share consumer; found by tests/chaos)."""

    async def no_controller() -> None:
        raise KafkaError(ErrorCode.NOT_CONTROLLER, "no active controller")

    monkeypatch.setattr(broker.broker, "ensure_share_state_topic", no_controller)
    request = M.ShareGroupHeartbeatRequest(group_id="no-state-topic-yet", member_id=uuid.uuid4().hex[:22],
                                           member_epoch=0, rack_id=None, subscribed_topic_names=["t"])
    assert client.call(SHARE_HEARTBEAT, 1, request).error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_find_coordinator_of_a_share_key_makes_the_share_state_topic(tmp_path: Path) -> None:
    """As Kafka (KafkaApis.getCoordinator): FindCoordinator of a share-partition key creates
    `__share_group_state` when it does not exist, as it does `__consumer_offsets` for a group;
    a share-partition's leader may ask before any member's ShareGroupHeartbeat made it."""
    from broker.coordinator.share.coordinator import kafka_uuid

    with BrokerThread(tmp_path / "fresh") as fresh, fresh.client() as c:
        key = "a-group:%s:0" % kafka_uuid(uuid.uuid4())
        response = c.call(10, 6, M.FindCoordinatorRequest(key_type=2, coordinator_keys=[key]))
        assert response.coordinators[0].error_code in (E.NONE, E.COORDINATOR_NOT_AVAILABLE)
        wait_for(lambda: "__share_group_state" in {t.name for t in metadata(c, None).topics}, 10,
                 what="__share_group_state listed")
