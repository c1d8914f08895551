"""The share-state RPCs (83-87) over raw frames on one broker, answered by its share coordinator as
Kafka's ShareCoordinatorService: every API and version, a round trip with the local state and the
share-group admin APIs, the per-partition errors (INVALID_REQUEST, FENCED_STATE_EPOCH,
FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
COORDINATOR_NOT_AVAILABLE), empty requests, and CLUSTER_ACTION under an authorizer."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.coordinator.share import ShareCoordinator, StateBatch
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient
from tests.integration.test_server_support import BrokerThread, metadata
from tests.security.inprocess import PLAIN_JAAS, SecureBrokerThread, plain_login

E = ErrorCode
INITIALIZE, READ, WRITE, DELETE, SUMMARY = 83, 84, 85, 86, 87
API_VERSIONS, DESCRIBE_OFFSETS, ALTER_OFFSETS, CREATE_ACLS = 18, 90, 91, 30
AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4
UNINITIALIZED_READ = "Read operation on uninitialized share partition not allowed."
UNINITIALIZED_WRITE = "Write operation on uninitialized share partition not allowed."
NEGATIVE = "The partition id cannot be a negative number."
FENCED_STATE = "The share coordinator rejected the request because the share-group state epoch did not match."
FENCED_LEADER = "The leader epoch in the request is older than the epoch on the broker."
UNKNOWN = "This server does not host this topic-partition."
_names = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    with BrokerThread(Path(tmp_path_factory.mktemp("share-state"))) as bt:
        yield bt


@pytest.fixture
def client(broker: BrokerThread) -> Iterator[RawClient]:
    with broker.client() as c:
        yield c


def new_topic(broker: BrokerThread, client: RawClient, partitions: int = 2) -> tuple[str, uuid.UUID, str]:
    """A topic of its own, its id, and a group name of its own."""
    n = next(_names)
    name = "share-state-%d" % n
    broker.create_topic(name, partitions)
    return name, metadata(client, [name]).topics[0].topic_id, "share-state-group-%d" % n


# ----- requests ----------------------------------------------------------------------------
def initialize(c: RawClient, group: str, topic_id: uuid.UUID, *parts: tuple[int, int, int]) -> Any:
    """parts: (partition, state epoch, start offset)."""
    R = M.InitializeShareGroupStateRequest
    return c.call(INITIALIZE, 0, R(group_id=group, topics=[R.InitializeStateData(topic_id=topic_id, partitions=[
        R.PartitionData(partition=p, state_epoch=e, start_offset=s) for p, e, s in parts])]))


def read(c: RawClient, group: str, topic_id: uuid.UUID, *parts: tuple[int, int]) -> Any:
    """parts: (partition, leader epoch)."""
    R = M.ReadShareGroupStateRequest
    return c.call(READ, 0, R(group_id=group, topics=[R.ReadStateData(topic_id=topic_id, partitions=[
        R.PartitionData(partition=p, leader_epoch=e) for p, e in parts])]))


def write(c: RawClient, group: str, topic_id: uuid.UUID, partition: int, state_epoch: int, leader_epoch: int,
          start: int, batches: list[tuple[int, int, int, int]], complete: int = -1, version: int = 1) -> Any:
    R = M.WriteShareGroupStateRequest
    data = R.PartitionData(partition=partition, state_epoch=state_epoch, leader_epoch=leader_epoch, start_offset=start,
                           delivery_complete_count=complete, state_batches=[
                               R.StateBatch(first_offset=f, last_offset=last, delivery_state=s, delivery_count=n)
                               for f, last, s, n in batches])
    return c.call(WRITE, version, R(group_id=group, topics=[R.WriteStateData(topic_id=topic_id, partitions=[data])]))


def delete(c: RawClient, group: str, topic_id: uuid.UUID, *parts: int) -> Any:
    R = M.DeleteShareGroupStateRequest
    return c.call(DELETE, 0, R(group_id=group, topics=[R.DeleteStateData(topic_id=topic_id, partitions=[
        R.PartitionData(partition=p) for p in parts])]))


def summary(c: RawClient, group: str, topic_id: uuid.UUID, *parts: int, version: int = 1) -> Any:
    R = M.ReadShareGroupStateSummaryRequest
    return c.call(SUMMARY, version, R(group_id=group, topics=[R.ReadStateSummaryData(topic_id=topic_id, partitions=[
        R.PartitionData(partition=p, leader_epoch=0) for p in parts])]))


def errors(response: Any) -> dict[int, tuple[int, str | None]]:
    """partition -> (error code, error message), of the one topic of a response."""
    (result,) = response.results
    return {p.partition: (p.error_code, p.error_message) for p in result.partitions}


def only(response: Any) -> Any:
    (result,) = response.results
    (partition,) = result.partitions
    return partition


def batches(partition: Any) -> list[tuple[int, int, int, int]]:
    return [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in partition.state_batches]


def local_state(broker: BrokerThread, key: tuple[str, uuid.UUID, int]) -> Any:
    return broker.call(broker.broker.share_coordinator.read_state(key))


# ----- every API and version, round trip -------------------------------------------------
def test_every_api_is_advertised_with_kafkas_versions(client: RawClient) -> None:
    response = client.call(API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert {k: versions[k] for k in (INITIALIZE, READ, WRITE, DELETE, SUMMARY)} == {
        INITIALIZE: (0, 0), READ: (0, 0), WRITE: (0, 1), DELETE: (0, 0), SUMMARY: (0, 1)}


def test_round_trip_with_the_local_state_and_the_admin_apis(broker: BrokerThread, client: RawClient) -> None:
    name, topic_id, group = new_topic(broker, client)
    key = (group, topic_id, 0)
    assert errors(initialize(client, group, topic_id, (0, 1, 5), (1, 0, -1))) == {0: (0, None), 1: (0, None)}
    fresh = summary(client, group, topic_id, 0, 1)
    assert [(p.partition, p.state_epoch, p.leader_epoch, p.start_offset, p.delivery_complete_count)
            for p in fresh.results[0].partitions] == [(0, 1, 0, 5, 0), (1, 0, 0, -1, -1)]  # Kafka's fromRequest

    # a read names its leader's epoch: a newer one is recorded (and fences older writers)
    state = only(read(client, group, topic_id, (0, 3)))
    assert (state.error_code, state.state_epoch, state.start_offset, batches(state)) == (0, 1, 5, [])
    assert local_state(broker, key).leader_epoch == 3

    done = write(client, group, topic_id, 0, 1, 3, 5, [(5, 9, ACKNOWLEDGED, 1), (10, 12, AVAILABLE, 2)], complete=5)
    assert errors(done) == {0: (0, None)}
    state = only(read(client, group, topic_id, (0, 3)))
    assert (state.start_offset, batches(state)) == (5, [(5, 9, ACKNOWLEDGED, 1), (10, 12, AVAILABLE, 2)])
    stored = local_state(broker, key)
    assert (stored.start_offset, stored.state_epoch, stored.leader_epoch, stored.delivery_complete_count) == (5, 1, 3, 5)
    assert stored.state_batches == (StateBatch(5, 9, ACKNOWLEDGED, 1), StateBatch(10, 12, AVAILABLE, 2))

    # v1 of the summary carries the delivery-complete count, v0 does not
    s1, s0 = only(summary(client, group, topic_id, 0)), only(summary(client, group, topic_id, 0, version=0))
    assert (s1.error_code, s1.state_epoch, s1.leader_epoch, s1.start_offset, s1.delivery_complete_count) == (0, 1, 3, 5, 5)
    assert (s0.error_code, s0.state_epoch, s0.leader_epoch, s0.start_offset) == (0, 1, 3, 5)
    # a v0 write has no count: the recorded one stays (our shard; Kafka's records -1, "unknown")
    assert errors(write(client, group, topic_id, 0, 1, 3, 10, [(10, 12, ARCHIVED, 2)], version=0)) == {0: (0, None)}
    stored = local_state(broker, key)
    assert (stored.start_offset, stored.delivery_complete_count) == (10, 5)
    assert stored.state_batches == (StateBatch(10, 12, ARCHIVED, 2),)

    # DescribeShareGroupOffsets reads what the RPCs wrote; AlterShareGroupOffsets writes what they read
    R = M.DescribeShareGroupOffsetsRequest
    described = client.call(DESCRIBE_OFFSETS, 1, R(groups=[R.DescribeShareGroupOffsetsRequestGroup(
        group_id=group, topics=[R.DescribeShareGroupOffsetsRequestTopic(topic_name=name, partitions=[0])])]))
    (p,) = described.groups[0].topics[0].partitions
    assert (p.partition_index, p.start_offset, p.leader_epoch) == (0, 10, 3)
    A = M.AlterShareGroupOffsetsRequest  # a new share group: its epoch 0 is the state epoch
    altered = client.call(ALTER_OFFSETS, 0, A(group_id=group, topics=[A.AlterShareGroupOffsetsRequestTopic(
        topic_name=name, partitions=[A.AlterShareGroupOffsetsRequestPartition(partition_index=1, start_offset=0)])]))
    assert altered.error_code == 0 and altered.responses[0].partitions[0].error_code == 0
    state = only(read(client, group, topic_id, (1, 0)))
    assert (state.error_code, state.state_epoch, state.start_offset, batches(state)) == (0, 0, 0, [])

    # deletion: tombstones; a second deletion and one of a share-partition without state are fine
    assert errors(delete(client, group, topic_id, 0, 1)) == {0: (0, None), 1: (0, None)}
    assert errors(delete(client, group, topic_id, 0)) == {0: (0, None)}
    assert local_state(broker, key) is None
    assert errors(read(client, group, topic_id, (0, 3))) == {0: (E.INVALID_REQUEST, UNINITIALIZED_READ)}
    gone = only(summary(client, group, topic_id, 0))
    assert (gone.error_code, gone.state_epoch, gone.leader_epoch, gone.start_offset, gone.delivery_complete_count) == (
        0, 0, 0, -1, -1)


def test_one_request_many_partitions_grouped_by_topic(broker: BrokerThread, client: RawClient) -> None:
    _, first, group = new_topic(broker, client, partitions=3)
    _, second, _ = new_topic(broker, client, partitions=1)
    R = M.InitializeShareGroupStateRequest
    request = R(group_id=group, topics=[
        R.InitializeStateData(topic_id=first, partitions=[R.PartitionData(partition=p, state_epoch=0, start_offset=p)
                                                          for p in (0, 1)]),
        R.InitializeStateData(topic_id=second, partitions=[R.PartitionData(partition=0, state_epoch=0, start_offset=7)]),
        R.InitializeStateData(topic_id=first, partitions=[R.PartitionData(partition=2, state_epoch=0, start_offset=2)]),
    ])
    response = client.call(INITIALIZE, 0, request)
    assert [(r.topic_id, [p.partition for p in r.partitions]) for r in response.results] == [
        (first, [0, 1, 2]), (second, [0])]
    Q = M.ReadShareGroupStateSummaryRequest
    response = client.call(SUMMARY, 1, Q(group_id=group, topics=[
        Q.ReadStateSummaryData(topic_id=t, partitions=[Q.PartitionData(partition=p, leader_epoch=0) for p in ps])
        for t, ps in ((first, [0, 1, 2]), (second, [0]))]))
    assert {(r.topic_id, p.partition): p.start_offset for r in response.results for p in r.partitions} == {
        (first, 0): 0, (first, 1): 1, (first, 2): 2, (second, 0): 7}


# ----- errors ------------------------------------------------------------------------------
def test_uninitialized_negative_and_unknown_partitions(broker: BrokerThread, client: RawClient) -> None:
    _, topic_id, group = new_topic(broker, client)
    unknown_topic = uuid.uuid4()
    # a write or read of a share-partition without state: INVALID_REQUEST (Kafka checks this before the metadata)
    assert errors(write(client, group, topic_id, 0, 0, 0, 0, [])) == {0: (E.INVALID_REQUEST, UNINITIALIZED_WRITE)}
    assert errors(write(client, group, unknown_topic, 0, 0, 0, 0, [])) == {0: (E.INVALID_REQUEST, UNINITIALIZED_WRITE)}
    assert errors(read(client, group, topic_id, (0, 0))) == {0: (E.INVALID_REQUEST, UNINITIALIZED_READ)}
    # a negative partition, on every API
    assert errors(initialize(client, group, topic_id, (-1, 0, 0))) == {-1: (E.INVALID_REQUEST, NEGATIVE)}
    assert errors(read(client, group, topic_id, (-1, 0))) == {-1: (E.INVALID_REQUEST, NEGATIVE)}
    assert errors(write(client, group, topic_id, -1, 0, 0, 0, [])) == {-1: (E.INVALID_REQUEST, NEGATIVE)}
    assert errors(delete(client, group, topic_id, -1)) == {-1: (E.INVALID_REQUEST, NEGATIVE)}
    assert errors(summary(client, group, topic_id, -1)) == {-1: (E.INVALID_REQUEST, NEGATIVE)}
    # a topic or partition the metadata does not have
    for response in (initialize(client, group, unknown_topic, (0, 0, 0)), initialize(client, group, topic_id, (2, 0, 0)),
                     delete(client, group, unknown_topic, 0), summary(client, group, topic_id, 5)):
        assert list(errors(response).values()) == [(E.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN)]
    # a partition's error leaves the others of the request alone
    assert errors(initialize(client, group, topic_id, (0, 0, 3), (-1, 0, 0), (9, 0, 0))) == {
        0: (0, None), -1: (E.INVALID_REQUEST, NEGATIVE), 9: (E.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN)}


def test_state_and_leader_epochs_fence(broker: BrokerThread, client: RawClient) -> None:
    _, topic_id, group = new_topic(broker, client)
    assert errors(initialize(client, group, topic_id, (0, 4, 0))) == {0: (0, None)}
    assert errors(initialize(client, group, topic_id, (0, 3, 0))) == {0: (E.FENCED_STATE_EPOCH, FENCED_STATE)}
    assert errors(write(client, group, topic_id, 0, 3, 0, 0, [])) == {0: (E.FENCED_STATE_EPOCH, FENCED_STATE)}
    assert errors(write(client, group, topic_id, 0, -1, 0, 1, [])) == {0: (0, None)}  # -1: not checked
    assert only(read(client, group, topic_id, (0, 7))).error_code == 0  # the leader of epoch 7 takes over
    assert errors(write(client, group, topic_id, 0, 4, 6, 0, [])) == {0: (E.FENCED_LEADER_EPOCH, FENCED_LEADER)}
    assert errors(read(client, group, topic_id, (0, 6))) == {0: (E.FENCED_LEADER_EPOCH, FENCED_LEADER)}
    assert errors(write(client, group, topic_id, 0, 4, 7, 2, [(2, 2, ACKNOWLEDGED, 1)])) == {0: (0, None)}
    # a new state epoch (offsets altered) fences the writers of the old one; the leader epoch stays
    assert errors(initialize(client, group, topic_id, (0, 5, 10))) == {0: (0, None)}
    assert errors(write(client, group, topic_id, 0, 4, 7, 11, [])) == {0: (E.FENCED_STATE_EPOCH, FENCED_STATE)}
    assert errors(read(client, group, topic_id, (0, 6))) == {0: (E.FENCED_LEADER_EPOCH, FENCED_LEADER)}
    state = only(read(client, group, topic_id, (0, 7)))
    assert (state.state_epoch, state.start_offset, batches(state)) == (5, 10, [])


def test_empty_requests_get_empty_responses(broker: BrokerThread, client: RawClient) -> None:
    _, topic_id, group = new_topic(broker, client)
    W = M.WriteShareGroupStateRequest
    assert client.call(WRITE, 1, W(group_id=group, topics=[])).results == []
    assert client.call(WRITE, 1, W(group_id=group, topics=[W.WriteStateData(topic_id=topic_id, partitions=[])])
                       ).results == []
    assert write(client, "", topic_id, 0, 0, 0, 0, []).results == []
    Init = M.InitializeShareGroupStateRequest
    assert client.call(INITIALIZE, 0, Init(group_id=group, topics=[])).results == []
    assert initialize(client, "", topic_id, (0, 0, 0)).results == []
    D = M.DeleteShareGroupStateRequest
    assert client.call(DELETE, 0, D(group_id=group, topics=[D.DeleteStateData(topic_id=topic_id, partitions=[])])
                       ).results == []
    assert summary(client, "", topic_id, 0).results == []
    assert read(client, "", topic_id, (0, 0)).results == []


def _partition_of(broker: BrokerThread, key: tuple[str, uuid.UUID, int]) -> int:
    return int(broker.broker.share_coordinator.partition_for(key))


def test_not_coordinator_while_the_state_partition_is_not_loaded(broker: BrokerThread, client: RawClient) -> None:
    _, topic_id, group = new_topic(broker, client)
    assert errors(initialize(client, group, topic_id, (0, 0, 0))) == {0: (0, None)}
    coordinator: ShareCoordinator = broker.broker.share_coordinator
    partition = _partition_of(broker, (group, topic_id, 0))
    broker.call(coordinator.runtime.unload(partition))
    try:
        for response, operation in (
                (initialize(client, group, topic_id, (0, 0, 0)), "initialize share group state"),
                (read(client, group, topic_id, (0, 0)), "read share group state"),
                (write(client, group, topic_id, 0, 0, 0, 0, []), "write share group state"),
                (delete(client, group, topic_id, 0), "delete share group state"),
                (summary(client, group, topic_id, 0), "read share group state summary")):
            code, message = errors(response)[0]
            assert code == E.NOT_COORDINATOR
            assert message is not None and message.startswith("Unable to %s: " % operation)
    finally:
        broker.call(coordinator.runtime.load(partition))
    assert only(read(client, group, topic_id, (0, 0))).error_code == 0  # loaded again from its log


def test_coordinator_load_in_progress(broker: BrokerThread, client: RawClient) -> None:
    _, topic_id, group = new_topic(broker, client)
    assert errors(initialize(client, group, topic_id, (0, 0, 4))) == {0: (0, None)}
    coordinator: ShareCoordinator = broker.broker.share_coordinator
    runtime = coordinator.runtime
    partition = _partition_of(broker, (group, topic_id, 0))
    held: dict[str, Any] = {}

    async def hold_the_load() -> None:
        """Unload the partition, then load it again with its replay held until `release` is set."""
        await runtime.unload(partition)
        release = held["release"] = asyncio.Event()
        build = runtime._build_shard

        async def slow(part: Any) -> Any:
            await release.wait()
            return await build(part)

        runtime._build_shard = slow  # type: ignore[method-assign]
        held["load"] = asyncio.get_running_loop().create_task(runtime.load(partition))
        await asyncio.sleep(0)

    async def finish() -> None:
        held["release"].set()
        await held["load"]
        del runtime._build_shard  # the class's again

    broker.call(hold_the_load())
    try:
        code, message = errors(write(client, group, topic_id, 0, 0, 0, 4, []))[0]
        assert code == E.COORDINATOR_LOAD_IN_PROGRESS
        assert message == "Unable to write share group state: The coordinator is loading and hence can't process requests."
        assert errors(summary(client, group, topic_id, 0))[0][0] == E.COORDINATOR_LOAD_IN_PROGRESS
    finally:
        broker.call(finish())
    assert only(summary(client, group, topic_id, 0)).start_offset == 4


def test_no_share_coordinator_is_coordinator_not_available(broker: BrokerThread, client: RawClient) -> None:
    _, topic_id, group = new_topic(broker, client)
    app = broker.broker
    coordinator = app.share_coordinator
    app.share_coordinator = None  # as before the broker started it
    try:
        unavailable = {0: (E.COORDINATOR_NOT_AVAILABLE, "Share coordinator is not available.")}
        assert errors(initialize(client, group, topic_id, (0, 0, 0))) == unavailable
        assert errors(read(client, group, topic_id, (0, 0))) == unavailable
        assert errors(write(client, group, topic_id, 0, 0, 0, 0, [])) == unavailable
        assert errors(delete(client, group, topic_id, 0)) == unavailable
        assert errors(summary(client, group, topic_id, 0)) == unavailable
        # Kafka checks the emptiness of a read or write first, of the others after
        assert write(client, "", topic_id, 0, 0, 0, 0, []).results == []
        assert errors(initialize(client, "", topic_id, (0, 0, 0))) == unavailable
    finally:
        app.share_coordinator = coordinator


# ----- authorization -----------------------------------------------------------------------
def test_cluster_action_is_needed_under_an_authorizer(tmp_path: Path) -> None:
    bt = SecureBrokerThread(tmp_path, {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
    }).start()
    admin, alice = bt.client(), bt.connect("SASL_PLAINTEXT")
    try:
        assert plain_login(alice, "alice", "alice-secret").error_code == 0
        _, topic_id, group = new_topic(bt, admin)
        denied = (E.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
        assert errors(initialize(alice, group, topic_id, (0, 0, 0), (1, 0, 0))) == {0: denied, 1: denied}
        assert errors(read(alice, group, topic_id, (0, 0))) == {0: denied}
        assert errors(write(alice, group, topic_id, 0, 0, 0, 0, [])) == {0: denied}
        assert errors(delete(alice, group, topic_id, 0)) == {0: denied}
        assert errors(summary(alice, group, topic_id, 0)) == {0: denied}
        assert local_state(bt, (group, topic_id, 0)) is None
        A = M.CreateAclsRequest
        created = admin.call(CREATE_ACLS, 3, A(creations=[A.AclCreation(
            resource_type=4, resource_name="kafka-cluster", resource_pattern_type=3, principal="User:alice",
            host="*", operation=9, permission_type=3)]))  # CLUSTER kafka-cluster LITERAL, CLUSTER_ACTION ALLOW
        assert created.results[0].error_code == 0
        assert errors(initialize(alice, group, topic_id, (0, 0, 0))) == {0: (0, None)}
        assert errors(initialize(admin, group, topic_id, (1, 0, 0))) == {1: (0, None)}  # a super user
    finally:
        admin.close()
        alice.close()
        bt.close()
