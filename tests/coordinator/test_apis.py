"""The group and offset API handlers at every version, over a real coordinator (no sockets):
each request is encoded and decoded at its version, and each response must encode at it."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from broker.apis import group as group_apis
from broker.apis import offsets as offset_apis
from broker.apis.topology import SingleNode
from broker.coordinator.group import create_group_coordinator
from broker.coordinator.runtime import InMemoryWriter
from broker.coordinator.timer import AsyncioClock
from protocol import messages as M
from protocol.errors import ErrorCode
from protocol.primitives import ZERO_UUID
from tests.coordinator.harness import sub

E = ErrorCode
TOPIC_ID = uuid.uuid4()


class FakeMetadata:
    def __init__(self) -> None:
        self.topics = {"t": SimpleNamespace(name="t", topic_id=TOPIC_ID, partitions=3)}

    def topic(self, name: str) -> Any:
        return self.topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> Any:
        return next((t for t in self.topics.values() if t.topic_id == topic_id), None)


class FakeBroker:
    node_id = 7
    authorizer = None

    def __init__(self, coordinator: Any) -> None:
        self.group_coordinator = coordinator
        self.txn_coordinator = object()  # FindCoordinator only asks whether there is one
        self.metadata = FakeMetadata()

        self.topology = SingleNode(self.node_id, self.advertised, None)

    def advertised(self, listener: str | None = None) -> tuple[str, int]:
        return "localhost", 19092

    async def ensure_offsets_topic(self) -> None:
        self.offsets_topic_ensured = True

    async def ensure_transaction_state_topic(self) -> None:
        self.transaction_state_topic_ensured = True


@pytest.fixture
async def broker() -> Any:
    coordinator = create_group_coordinator(
        InMemoryWriter(), {"offsets.topic.num.partitions": 4, "group.initial.rebalance.delay.ms": 0}, AsyncioClock())
    await coordinator.start()
    yield FakeBroker(coordinator)
    await coordinator.stop()


async def call(broker: Any, handler: Any, request: Any, version: int) -> Any:
    """Round-trip the request through its wire format, run the handler, encode the response."""
    key = M.codec_of(request).spec.api_key
    assert key is not None
    wire = M.decode_request(key, version, M.encode(request, version))
    ctx = SimpleNamespace(broker=broker, api_version=version, client_id="cli", client_host="127.0.0.1",
                          connection=SimpleNamespace(principal="User:ANONYMOUS", listener=None),
                          release_on_next_request=lambda release: None)
    response = await asyncio.wait_for(handler(ctx, wire), 5)
    return M.decode_response(key, version, M.encode(response, version))


def join_request(group_id: str, member_id: str = "", instance: str | None = None) -> Any:
    return M.JoinGroupRequest(
        group_id=group_id, session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id=member_id,
        group_instance_id=instance, protocol_type="consumer",
        protocols=[M.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=sub("t"))],
    )


async def join(broker: Any, group_id: str, version: int) -> Any:
    r = await call(broker, group_apis.handle_join_group, join_request(group_id), version)
    if version >= 4:
        assert r.error_code == E.MEMBER_ID_REQUIRED and r.member_id.startswith("cli-")
        r = await call(broker, group_apis.handle_join_group, join_request(group_id, r.member_id), version)
    assert r.error_code == E.NONE, r
    return r


async def form(broker: Any, group_id: str, join_version: int = 5, sync_version: int = 3) -> Any:
    r = await join(broker, group_id, join_version)
    sync = M.SyncGroupRequest(group_id=group_id, generation_id=r.generation_id, member_id=r.member_id,
                              protocol_type="consumer", protocol_name="range",
                              assignments=[M.SyncGroupRequest.SyncGroupRequestAssignment(member_id=r.member_id,
                                                                                         assignment=b"A")])
    s = await call(broker, group_apis.handle_sync_group, sync, sync_version)
    assert s.error_code == E.NONE and s.assignment == b"A"
    return r


@pytest.mark.parametrize("version", range(0, 7))
async def test_find_coordinator(broker: Any, version: int) -> None:
    if version >= 4:
        request = M.FindCoordinatorRequest(key_type=0, coordinator_keys=["g1", "g2"])
        r = await call(broker, group_apis.handle_find_coordinator, request, version)
        assert [(c.key, c.node_id, c.host, c.port, c.error_code) for c in r.coordinators] == [
            ("g1", 7, "localhost", 19092, 0), ("g2", 7, "localhost", 19092, 0)]
        bad = await call(broker, group_apis.handle_find_coordinator,
                         M.FindCoordinatorRequest(key_type=9, coordinator_keys=["x"]), version)
        assert bad.coordinators[0].error_code == E.INVALID_REQUEST and bad.coordinators[0].node_id == -1
    else:
        r = await call(broker, group_apis.handle_find_coordinator, M.FindCoordinatorRequest(key="g"), version)
        assert (r.error_code, r.node_id, r.host, r.port) == (0, 7, "localhost", 19092)
        if version >= 1:
            txn = await call(broker, group_apis.handle_find_coordinator,
                             M.FindCoordinatorRequest(key="tx", key_type=1), version)
            assert txn.error_code == E.NONE
            bad = await call(broker, group_apis.handle_find_coordinator,
                             M.FindCoordinatorRequest(key="x", key_type=2), version)
            assert bad.error_code == E.INVALID_REQUEST  # share keys need v6


@pytest.mark.parametrize("version", range(0, 10))
async def test_join_sync_heartbeat_at_every_join_version(broker: Any, version: int) -> None:
    r = await join(broker, "g%d" % version, version)
    assert r.protocol_name == "range" and r.leader == r.member_id and len(r.members) == 1
    if version >= 7:
        assert r.protocol_type == "consumer"
    for hb_version in range(0, 5):
        hb = await call(broker, group_apis.handle_heartbeat, M.HeartbeatRequest(
            group_id="g%d" % version, generation_id=r.generation_id, member_id=r.member_id), hb_version)
        assert hb.error_code == E.NONE


async def test_join_errors_encode_at_every_version(broker: Any) -> None:
    for version in range(0, 10):
        bad = join_request("g", member_id="ghost")
        r = await call(broker, group_apis.handle_join_group, bad, version)
        assert r.error_code == E.UNKNOWN_MEMBER_ID
        assert r.protocol_name == ("" if version < 7 else None)


@pytest.mark.parametrize("version", range(0, 6))
async def test_sync_versions(broker: Any, version: int) -> None:
    r = await join(broker, "s%d" % version, 5)
    sync = M.SyncGroupRequest(group_id="s%d" % version, generation_id=r.generation_id, member_id=r.member_id,
                              protocol_type="consumer" if version >= 5 else None,
                              protocol_name="range" if version >= 5 else None,
                              assignments=[M.SyncGroupRequest.SyncGroupRequestAssignment(member_id=r.member_id,
                                                                                         assignment=b"A")])
    s = await call(broker, group_apis.handle_sync_group, sync, version)
    assert s.error_code == E.NONE and s.assignment == b"A"
    if version >= 5:
        assert (s.protocol_type, s.protocol_name) == ("consumer", "range")
        missing = M.SyncGroupRequest(group_id="s%d" % version, generation_id=r.generation_id, member_id=r.member_id)
        s2 = await call(broker, group_apis.handle_sync_group, missing, version)
        assert s2.error_code == E.INCONSISTENT_GROUP_PROTOCOL


@pytest.mark.parametrize("version", range(0, 6))
async def test_leave_group(broker: Any, version: int) -> None:
    r = await form(broker, "l%d" % version)
    if version >= 3:
        request = M.LeaveGroupRequest(group_id="l%d" % version, members=[
            M.LeaveGroupRequest.MemberIdentity(member_id=r.member_id),
            M.LeaveGroupRequest.MemberIdentity(member_id="ghost")])
        out = await call(broker, group_apis.handle_leave_group, request, version)
        assert out.error_code == 0 and [m.error_code for m in out.members] == [0, E.UNKNOWN_MEMBER_ID]
    else:
        out = await call(broker, group_apis.handle_leave_group,
                         M.LeaveGroupRequest(group_id="l%d" % version, member_id=r.member_id), version)
        assert out.error_code == 0
        again = await call(broker, group_apis.handle_leave_group,
                           M.LeaveGroupRequest(group_id="l%d" % version, member_id=r.member_id), version)
        assert again.error_code == E.UNKNOWN_MEMBER_ID


@pytest.mark.parametrize("version", range(0, 7))
async def test_describe_groups(broker: Any, version: int) -> None:
    r = await form(broker, "d%d" % version)
    request = M.DescribeGroupsRequest(groups=["d%d" % version, "missing"], include_authorized_operations=True)
    out = await call(broker, group_apis.handle_describe_groups, request, version)
    g, missing = out.groups
    assert (g.group_state, g.protocol_type, g.protocol_data) == ("Stable", "consumer", "range")
    assert g.members[0].member_id == r.member_id and g.members[0].client_host == "/127.0.0.1"
    assert g.members[0].client_id == "cli" and g.members[0].member_assignment == b"A"
    if version >= 3:
        assert g.authorized_operations == group_apis.GROUP_OPERATIONS
    assert missing.group_state == "Dead"
    assert missing.error_code == (E.GROUP_ID_NOT_FOUND if version >= 6 else 0)


async def test_describe_groups_of_the_empty_group_id(broker: Any) -> None:
    """DescribeGroups still describes the empty group id (Kafka keeps it for backwards
    compatibility; ConsumerGroupDescribe and ShareGroupDescribe refuse it), each id once asked."""
    request = M.DescribeGroupsRequest(groups=["", "missing", ""], include_authorized_operations=False)
    out = await call(broker, group_apis.handle_describe_groups, request, 5)
    assert [(g.group_id, g.error_code, g.group_state) for g in out.groups] == [
        ("", 0, "Dead"), ("missing", 0, "Dead"), ("", 0, "Dead")]
    described = await broker.group_coordinator.consumer_group_describe(["", "missing"])
    assert [(g.group_id, g.error_code) for g in described] == [
        ("", E.INVALID_GROUP_ID), ("missing", E.GROUP_ID_NOT_FOUND)]


@pytest.mark.parametrize("version", range(0, 6))
async def test_list_groups(broker: Any, version: int) -> None:
    await form(broker, "stable-one")
    await call(broker, offset_apis.handle_offset_commit, commit_request("simple-one", {0: 5}), 8)
    request = M.ListGroupsRequest(states_filter=["Empty"], types_filter=["classic"])
    out = await call(broker, group_apis.handle_list_groups, request, version)
    names = sorted(g.group_id for g in out.groups)
    assert names == (["simple-one"] if version >= 4 else ["simple-one", "stable-one"])
    if version >= 5:
        assert out.groups[0].group_type == "classic"


@pytest.mark.parametrize("version", range(0, 3))
async def test_delete_groups(broker: Any, version: int) -> None:
    await form(broker, "busy%d" % version)
    await call(broker, offset_apis.handle_offset_commit, commit_request("idle%d" % version, {0: 5}), 8)
    request = M.DeleteGroupsRequest(groups_names=["busy%d" % version, "idle%d" % version, "idle%d" % version, "x"])
    out = await call(broker, group_apis.handle_delete_groups, request, version)
    assert [(r.group_id, r.error_code) for r in out.results] == [
        ("busy%d" % version, E.NON_EMPTY_GROUP), ("idle%d" % version, 0), ("x", E.GROUP_ID_NOT_FOUND)]


def commit_request(group_id: str, offsets: dict[int, int], topic: str = "t", topic_id: uuid.UUID = ZERO_UUID,
                   generation: int = -1, member_id: str = "") -> Any:
    return M.OffsetCommitRequest(
        group_id=group_id, generation_id_or_member_epoch=generation, member_id=member_id,
        topics=[M.OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, topic_id=topic_id, partitions=[
            M.OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=p, committed_offset=o,
                                                               committed_leader_epoch=3, committed_metadata="md")
            for p, o in offsets.items()])])


def fetch_codes(response: Any) -> dict[tuple[str, int], tuple[int, int]]:
    return {(t.name, p.partition_index): (p.committed_offset, p.error_code)
            for t in response.topics for p in t.partitions}


@pytest.mark.parametrize("version", range(2, 11))
async def test_offset_commit_and_fetch(broker: Any, version: int) -> None:
    group_id = "o%d" % version
    tid = TOPIC_ID if version >= 10 else ZERO_UUID
    out = await call(broker, offset_apis.handle_offset_commit, commit_request(group_id, {0: 10, 1: 11, 9: 1},
                                                                              topic_id=tid), version)
    codes = {p.partition_index: p.error_code for t in out.topics for p in t.partitions}
    assert codes == {0: 0, 1: 0, 9: E.UNKNOWN_TOPIC_OR_PARTITION}
    if version >= 10:
        assert all(t.topic_id == TOPIC_ID for t in out.topics)
        unknown = await call(broker, offset_apis.handle_offset_commit,
                             commit_request(group_id, {0: 1}, topic_id=uuid.uuid4()), version)
        assert unknown.topics[0].partitions[0].error_code == E.UNKNOWN_TOPIC_ID
    else:
        unknown = await call(broker, offset_apis.handle_offset_commit,
                             commit_request(group_id, {0: 1}, topic="nope"), version)
        assert unknown.topics[0].partitions[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION

    # Fetch it back at every OffsetFetch version.
    for fv in range(1, 11):
        if fv >= 8:
            request = M.OffsetFetchRequest(require_stable=True, groups=[M.OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id=group_id, member_id=None, member_epoch=-1,
                topics=[M.OffsetFetchRequest.OffsetFetchRequestTopics(
                    name="t", topic_id=TOPIC_ID if fv >= 10 else ZERO_UUID, partition_indexes=[0, 1, 2])])])
            got = (await call(broker, offset_apis.handle_offset_fetch, request, fv)).groups[0]
        else:
            request = M.OffsetFetchRequest(group_id=group_id, topics=[
                M.OffsetFetchRequest.OffsetFetchRequestTopic(name="t", partition_indexes=[0, 1, 2])])
            got = await call(broker, offset_apis.handle_offset_fetch, request, fv)
        offsets = {p.partition_index: p.committed_offset for t in got.topics for p in t.partitions}
        assert offsets == {0: 10, 1: 11, 2: -1}
        epochs = {p.partition_index: p.committed_leader_epoch for t in got.topics for p in t.partitions}
        if fv >= 5:
            assert epochs[0] == (3 if version >= 6 else -1)  # the epoch is committed from v6


async def test_offset_commit_without_topics_gets_an_empty_response(broker: Any) -> None:
    """As Kafka's KafkaApis: nothing to commit, an empty response, whatever the group and its
    generation, and no group comes of it."""
    request = M.OffsetCommitRequest(group_id="never-joined", generation_id_or_member_epoch=7, member_id="m",
                                    topics=[])
    assert (await call(broker, offset_apis.handle_offset_commit, request, 9)).topics == []
    described = await call(broker, group_apis.handle_describe_groups,
                           M.DescribeGroupsRequest(groups=["never-joined"]), 5)
    assert described.groups[0].group_state == "Dead"


async def test_offset_fetch_all_and_multi_group(broker: Any) -> None:
    await call(broker, offset_apis.handle_offset_commit, commit_request("a", {0: 1, 2: 3}), 8)
    await call(broker, offset_apis.handle_offset_commit, commit_request("b", {1: 7}), 8)
    for version in range(2, 8):
        got = await call(broker, offset_apis.handle_offset_fetch, M.OffsetFetchRequest(group_id="a", topics=None),
                         version)
        assert fetch_codes(got) == {("t", 0): (1, 0), ("t", 2): (3, 0)}
    request = M.OffsetFetchRequest(groups=[
        M.OffsetFetchRequest.OffsetFetchRequestGroup(group_id="a", topics=None),
        M.OffsetFetchRequest.OffsetFetchRequestGroup(group_id="b", topics=None),
        M.OffsetFetchRequest.OffsetFetchRequestGroup(group_id="none", topics=None)])
    for version in (8, 9, 10):
        got = await call(broker, offset_apis.handle_offset_fetch, request, version)
        assert [g.group_id for g in got.groups] == ["a", "b", "none"]
        assert {p.partition_index for t in got.groups[0].topics for p in t.partitions} == {0, 2}
        assert got.groups[2].topics == []
        if version >= 10:
            assert got.groups[1].topics[0].topic_id == TOPIC_ID


async def test_offset_fetch_group_errors_per_version() -> None:
    coordinator = create_group_coordinator(InMemoryWriter(), {"offsets.topic.num.partitions": 1}, AsyncioClock())
    broker = FakeBroker(coordinator)  # never started: every group answers NOT_COORDINATOR
    topics = [M.OffsetFetchRequest.OffsetFetchRequestTopic(name="t", partition_indexes=[0, 1])]
    v1 = await call(broker, offset_apis.handle_offset_fetch, M.OffsetFetchRequest(group_id="g", topics=topics), 1)
    assert fetch_codes(v1) == {("t", 0): (-1, E.NOT_COORDINATOR), ("t", 1): (-1, E.NOT_COORDINATOR)}
    v2 = await call(broker, offset_apis.handle_offset_fetch, M.OffsetFetchRequest(group_id="g", topics=topics), 2)
    assert v2.error_code == E.NOT_COORDINATOR and v2.topics == []
    v8 = await call(broker, offset_apis.handle_offset_fetch, M.OffsetFetchRequest(groups=[
        M.OffsetFetchRequest.OffsetFetchRequestGroup(group_id="g", topics=None)]), 8)
    assert v8.groups[0].error_code == E.NOT_COORDINATOR
    commit = await call(broker, offset_apis.handle_offset_commit, commit_request("g", {0: 1}), 8)
    assert commit.topics[0].partitions[0].error_code == E.NOT_COORDINATOR


async def test_offset_commit_generation_checks(broker: Any) -> None:
    r = await form(broker, "gen")
    ok = await call(broker, offset_apis.handle_offset_commit,
                    commit_request("gen", {0: 1}, generation=r.generation_id, member_id=r.member_id), 8)
    assert ok.topics[0].partitions[0].error_code == 0
    stale = await call(broker, offset_apis.handle_offset_commit,
                       commit_request("gen", {0: 1}, generation=r.generation_id - 1, member_id=r.member_id), 8)
    assert stale.topics[0].partitions[0].error_code == E.ILLEGAL_GENERATION


async def test_offset_delete(broker: Any) -> None:
    await call(broker, offset_apis.handle_offset_commit, commit_request("del", {0: 1, 1: 2}), 8)
    request = M.OffsetDeleteRequest(group_id="del", topics=[
        M.OffsetDeleteRequest.OffsetDeleteRequestTopic(name="t", partitions=[
            M.OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=p) for p in (0, 7)]),
        M.OffsetDeleteRequest.OffsetDeleteRequestTopic(name="nope", partitions=[
            M.OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=0)])])
    out = await call(broker, offset_apis.handle_offset_delete, request, 0)
    assert out.error_code == 0
    assert {(t.name, p.partition_index): p.error_code for t in out.topics for p in t.partitions} == {
        ("t", 0): 0, ("t", 7): E.UNKNOWN_TOPIC_OR_PARTITION, ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    got = await call(broker, offset_apis.handle_offset_fetch, M.OffsetFetchRequest(group_id="del", topics=None), 7)
    assert fetch_codes(got) == {("t", 1): (2, 0)}
    missing = await call(broker, offset_apis.handle_offset_delete, M.OffsetDeleteRequest(group_id="zzz"), 0)
    assert missing.error_code == E.GROUP_ID_NOT_FOUND


# ----- ConsumerGroupDescribe / ShareGroupDescribe with an authorizer -------------------------
class DenyingAuthorizer:
    """Allows everything but the resources named in `denied`."""

    def __init__(self, *denied: str) -> None:
        self.denied = set(denied)

    def authorize(self, principal: str, host: str, op: int, resource_type: int, name: str, log: bool) -> bool:
        return name not in self.denied


class DescribingCoordinator:
    """Describes every group it is asked for with one member holding topic `name`."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self.asked: list[list[str]] = []

    def _describe(self, group_ids: list[str]) -> list[Any]:
        self.asked.append(group_ids)
        R = self.response
        tps = [R.TopicPartitions(topic_id=TOPIC_ID, topic_name="t-" + g, partitions=[0]) for g in group_ids]
        return [R.DescribedGroup(group_id=g, group_state="Stable", members=[R.Member(
            member_id="m", member_epoch=1, assignment=R.Assignment(topic_partitions=[tp]))])
            for g, tp in zip(group_ids, tps, strict=True)]

    async def consumer_group_describe(self, group_ids: list[str]) -> list[Any]:
        return self._describe(group_ids)

    async def share_group_describe(self, group_ids: list[str]) -> list[Any]:
        return self._describe(group_ids)


@pytest.mark.parametrize("kind", ["consumer", "share"])
async def test_modern_group_describe_hides_what_the_principal_may_not_see(kind: str) -> None:
    """As KafkaApis: a group the principal may not describe comes first with
    GROUP_AUTHORIZATION_FAILED and is not asked of the coordinator; one whose members hold a
    topic it may not describe is TOPIC_AUTHORIZATION_FAILED with no members; the others carry
    their authorized operations when asked."""
    from broker.apis import consumer_group, share

    handler, request, response = {
        "consumer": (consumer_group.handle_consumer_group_describe, M.ConsumerGroupDescribeRequest,
                     M.ConsumerGroupDescribeResponse),
        "share": (share.handle_share_group_describe, M.ShareGroupDescribeRequest, M.ShareGroupDescribeResponse),
    }[kind]
    coordinator = DescribingCoordinator(response)
    broker = SimpleNamespace(group_coordinator=coordinator, authorizer=DenyingAuthorizer("secret", "t-hidden"),
                             metadata=SimpleNamespace(feature_level=lambda name: 1))
    ctx = SimpleNamespace(broker=broker, api_version=0, client_id="cli", client_host="127.0.0.1",
                          connection=SimpleNamespace(principal="User:alice", listener=None))
    got = await handler(ctx, request(group_ids=["open", "secret", "hidden"], include_authorized_operations=True))
    assert coordinator.asked == [["open", "hidden"]]
    assert [(g.group_id, g.error_code, len(g.members or [])) for g in got.groups] == [
        ("secret", E.GROUP_AUTHORIZATION_FAILED, 0), ("open", E.NONE, 1), ("hidden", E.TOPIC_AUTHORIZATION_FAILED, 0)]
    assert got.groups[1].authorized_operations > 0
    assert got.groups[2].error_message == "The group has described topic(s) that the client is not authorized to describe."
