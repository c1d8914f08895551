"""The group coordinator service over the runtime: a whole group's life, and a restart."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.coordinator.group import RequestInfo, create_group_coordinator
from broker.coordinator.group.coordinator import GroupCoordinator
from broker.coordinator.runtime import InMemoryWriter
from broker.coordinator.timer import ManualClock
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.coordinator.harness import sub

E = ErrorCode
CONFIG = {"offsets.topic.num.partitions": 5, "group.initial.rebalance.delay.ms": 1000}
INFO = RequestInfo(client_id="cli", client_host="/127.0.0.1", api_version=5)


def join_request(group_id: str, member_id: str = "") -> Any:
    return M.JoinGroupRequest(
        group_id=group_id, session_timeout_ms=10000, rebalance_timeout_ms=20000, member_id=member_id,
        protocol_type="consumer", protocols=[M.JoinGroupRequest.JoinGroupRequestProtocol(name="range",
                                                                                          metadata=sub("t"))],
    )


async def settle(coordinator: GroupCoordinator, group_id: str) -> None:
    """Let queued operations (timer expiries included) of the group's partition run."""
    for _ in range(3):
        await coordinator.runtime.read(coordinator.partition_for(group_id), lambda s: None)


async def form(coordinator: GroupCoordinator, clock: ManualClock, group_id: str, n: int) -> tuple[list[str], int]:
    ids = []
    for _ in range(n):
        r = await coordinator.join_group(join_request(group_id), INFO)
        assert r.error_code == E.MEMBER_ID_REQUIRED
        ids.append(r.member_id)
    joins = [asyncio.ensure_future(coordinator.join_group(join_request(group_id, m), INFO)) for m in ids]
    await settle(coordinator, group_id)
    clock.advance(1000)
    await settle(coordinator, group_id)
    clock.advance(1000)
    await settle(coordinator, group_id)
    responses = await asyncio.wait_for(asyncio.gather(*joins), 5)
    generation, leader = responses[0].generation_id, responses[0].leader
    syncs = [
        coordinator.sync_group(M.SyncGroupRequest(
            group_id=group_id, generation_id=generation, member_id=m,
            assignments=[M.SyncGroupRequest.SyncGroupRequestAssignment(member_id=x, assignment=x.encode())
                         for x in ids] if m == leader else [],
        ), INFO)
        for m in ids
    ]
    for s in await asyncio.wait_for(asyncio.gather(*syncs), 5):
        assert s.error_code == E.NONE
    return sorted(ids, key=lambda m: m != leader), generation


async def test_group_life_and_restart() -> None:
    writer, clock = InMemoryWriter(), ManualClock(1_000_000)
    coordinator = create_group_coordinator(writer, CONFIG, clock)
    await coordinator.start()
    (leader, follower), gen = await form(coordinator, clock, "g", 2)

    commit = M.OffsetCommitRequest(
        group_id="g", generation_id_or_member_epoch=gen, member_id=follower,
        topics=[M.OffsetCommitRequest.OffsetCommitRequestTopic(name="t", partitions=[
            M.OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=42,
                                                               committed_metadata="")])],
    )
    assert (await coordinator.commit_offsets(commit, 8)).topics[0].partitions[0].error_code == E.NONE
    stale = M.OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=gen - 1, member_id=follower,
                                  topics=commit.topics)
    assert (await coordinator.commit_offsets(stale, 8)).topics[0].partitions[0].error_code == E.ILLEGAL_GENERATION

    described = await coordinator.describe_groups(["g", "nope"], 5)
    assert [d.group_state for d in described] == ["Stable", "Dead"]
    code, listed = await coordinator.list_groups([], [])
    assert code == E.NONE and [g.group_id for g in listed] == ["g"]
    assert await coordinator.group_counts() == {"Stable": 1}
    # by default a heartbeat is answered at once, as Kafka does
    answered = await asyncio.wait_for(coordinator.heartbeat(
        M.HeartbeatRequest(group_id="g", generation_id=gen, member_id=follower)), 5)
    assert answered.error_code == E.NONE

    # A broker restart (holding heartbeats now): a new coordinator loads the same log.
    await coordinator.stop()
    coordinator = create_group_coordinator(writer, {**CONFIG, "group.heartbeat.hold.ms": "-1"}, clock)
    await coordinator.start()
    d = (await coordinator.describe_groups(["g"], 5))[0]
    assert d.group_state == "Stable" and d.protocol_data == "range"
    assert {m.member_id: m.member_assignment for m in d.members} == {leader: leader.encode(),
                                                                     follower: follower.encode()}
    # With holds on, a heartbeat of a stable group is held until the group changes, or until another request
    # arrives on the member's connection: the server then asks the coordinator to release it.
    held = asyncio.ensure_future(coordinator.heartbeat(
        M.HeartbeatRequest(group_id="g", generation_id=gen, member_id=follower)))
    await settle(coordinator, "g")
    assert not held.done()
    coordinator.release_heartbeat("g", follower)
    assert (await asyncio.wait_for(held, 5)).error_code == E.NONE
    fetched = await coordinator.fetch_offsets(M.OffsetFetchRequest.OffsetFetchRequestGroup(group_id="g", topics=None),
                                              True)
    assert fetched.topics[0].partitions[0].committed_offset == 42

    leave = await coordinator.leave_group("g", [M.LeaveGroupRequest.MemberIdentity(member_id=follower)])
    assert leave.members[0].error_code == E.NONE
    deleted = await coordinator.delete_groups(["g", "nope"])
    assert [(r.group_id, r.error_code) for r in deleted] == [("g", E.NON_EMPTY_GROUP), ("nope", E.GROUP_ID_NOT_FOUND)]
    await coordinator.stop()


async def test_errors_from_the_runtime_become_response_codes() -> None:
    writer, clock = InMemoryWriter(), ManualClock(0)
    coordinator = create_group_coordinator(writer, CONFIG, clock)  # not started: nothing is hosted
    assert (await coordinator.join_group(join_request("g"), INFO)).error_code == E.NOT_COORDINATOR
    hb = await coordinator.heartbeat(M.HeartbeatRequest(group_id="g", generation_id=1, member_id="m"))
    assert hb.error_code == E.NOT_COORDINATOR
    fetched = await coordinator.fetch_offsets(M.OffsetFetchRequest.OffsetFetchRequestGroup(group_id="g"), False)
    assert fetched.error_code == E.NOT_COORDINATOR
    code, groups = await coordinator.list_groups([], [])
    assert (code, groups) == (E.NONE, [])

    await coordinator.start()
    writer.fail_next = OSError("disk gone")
    r = await coordinator.commit_offsets(M.OffsetCommitRequest(group_id="g", topics=[
        M.OffsetCommitRequest.OffsetCommitRequestTopic(name="t", partitions=[
            M.OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)])]), 8)
    assert r.topics[0].partitions[0].error_code == E.NOT_COORDINATOR
    r = await coordinator.delete_offsets(M.OffsetDeleteRequest(group_id="missing"))
    assert r.error_code == E.GROUP_ID_NOT_FOUND
    await coordinator.stop()


async def test_heartbeat_while_loading_is_answered_blindly() -> None:
    class Slow(InMemoryWriter):
        def read(self, partition: int) -> Any:
            return [(b"\x00\x07", None)] * 10  # unknown record types: skipped, but loading yields

    coordinator = create_group_coordinator(Slow(), {"offsets.topic.num.partitions": 1}, ManualClock(0))
    coordinator.runtime.load_yield_every = 1
    loading = asyncio.ensure_future(coordinator.start())
    await asyncio.sleep(0)
    hb = await coordinator.heartbeat(M.HeartbeatRequest(group_id="g", generation_id=1, member_id="m"))
    assert hb.error_code == E.NONE
    joined = await coordinator.join_group(join_request("g"), INFO)
    assert joined.error_code == E.COORDINATOR_LOAD_IN_PROGRESS
    await loading
    await coordinator.stop()
