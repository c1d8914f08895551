"""The HTTP client against real etcd processes: the same semantics as the fake, a clear error when
etcd is unreachable at start, retriable errors while it is gone and recovery when it returns
(also for the metadata log's readers: every batch once, in order, across restarts), and a
three-member etcd losing the member a client talks to."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.cluster.election import ControllerElection, Session, campaign, claim_node_id
from broker.cluster.etcd import (
    Compare,
    EtcdCompacted,
    EtcdUnavailable,
    EventType,
    Get,
    LeaseNotFound,
    Put,
    prefix_end,
    resumable_watch,
)
from broker.cluster.etcd_http import HttpEtcd
from broker.cluster.keys import ClusterKeys, NotController
from broker.cluster.metadata_log import Batch, MetadataLog, StaleEndOffset
from broker.testing.etcd import EtcdCluster, EtcdMember, free_port

KEYS = ClusterKeys("real")


async def test_kv_txn_lease_watch_compaction(etcd: HttpEtcd) -> None:
    r1 = await etcd.put(b"/t/a", b"1")
    won = await etcd.txn([Compare.absent(b"/t/b")], [Put(b"/t/b", b"2"), Get(b"/t/", prefix_end(b"/t/"))])
    assert won.succeeded and [kv.key for kv in won.responses[1]] == [b"/t/a", b"/t/b"]  # type: ignore[union-attr]
    lost = await etcd.txn([Compare.absent(b"/t/b")], [Put(b"/t/b", b"3")], [Get(b"/t/b")])
    assert not lost.succeeded and lost.responses[0][0].value == b"2"  # type: ignore[index]
    assert not (await etcd.txn([Compare.value_is(b"/t/none", b"")], [Put(b"/t/x", b"")])).succeeded
    lease = await etcd.grant_lease(1)
    await etcd.put(b"/t/l", b"v", lease)
    events: list[tuple[EventType, bytes]] = []

    async def watch() -> None:
        async for batch in etcd.watch(b"/t/", prefix_end(b"/t/"), r1):
            events.extend((e.type, e.kv.key) for e in batch.events)

    task = asyncio.create_task(watch())
    try:
        async with asyncio.timeout(10):  # the lease expires (1 s, etcd sweeps every 0.5 s): its key goes
            while (EventType.DELETE, b"/t/l") not in events:
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert events == [(EventType.PUT, b"/t/a"), (EventType.PUT, b"/t/b"), (EventType.PUT, b"/t/l"),
                      (EventType.DELETE, b"/t/l")]
    with pytest.raises(LeaseNotFound):
        await etcd.keep_alive(lease)
    now = await etcd.put(b"/t/a", b"9")
    await etcd.compact(now)
    await etcd.compact(now)  # again: nothing to do
    with pytest.raises(EtcdCompacted):
        await etcd.range(b"/t/a", revision=r1)
    with pytest.raises(EtcdCompacted) as e:
        async for _ in etcd.watch(b"/t/", prefix_end(b"/t/"), r1):
            pass
    assert e.value.compact_revision == now


async def test_unreachable_at_start_is_a_clear_error() -> None:
    port = free_port()
    client = HttpEtcd(["http://127.0.0.1:%d" % port], timeout=1.0)
    began = time.monotonic()
    with pytest.raises(EtcdUnavailable, match=r"etcd is unreachable \(http://127.0.0.1:%d: connection refused\)" % port):
        await client.check()
    assert time.monotonic() - began < 2
    with pytest.raises(ValueError, match="expected http://host:port"):
        HttpEtcd(["https://127.0.0.1:1"])


async def test_a_dead_endpoint_is_skipped(etcd_member: EtcdMember) -> None:
    client = HttpEtcd(["http://127.0.0.1:%d" % free_port(), etcd_member.client_url])
    try:
        await client.check()
        assert await client.put(b"k", b"v") > 1
    finally:
        await client.close()


async def test_lost_while_running_then_back(etcd_member: EtcdMember, etcd: HttpEtcd) -> None:
    await etcd.put(b"k", b"1")
    etcd_member.kill()
    with pytest.raises(EtcdUnavailable):
        await etcd.put(b"k", b"2")
    with pytest.raises(EtcdUnavailable):
        await etcd.get(b"k")
    etcd_member.start()
    print("etcd restart on its data: %.2f s" % etcd_member.start_seconds)
    assert (await etcd.get(b"k")).value == b"1"  # type: ignore[union-attr]
    await etcd.put(b"k", b"2")


async def test_a_paused_etcd_times_out_as_retriable(etcd_member: EtcdMember) -> None:
    client = HttpEtcd([etcd_member.client_url], timeout=0.5, watch_idle_timeout=0.5)
    first = await client.put(b"k", b"1")
    seen: list[bytes] = []

    async def follow() -> None:
        async for batch in resumable_watch(client, b"k", None, first, retry_delay=0.05):
            seen.extend(e.kv.value for e in batch.events)

    watch = asyncio.create_task(follow())
    async with asyncio.timeout(5):
        while not seen:
            await asyncio.sleep(0.01)
    etcd_member.pause()
    try:
        with pytest.raises(EtcdUnavailable, match="did not answer"):
            await client.get(b"k")
        broken = client.watch(b"k")
        with pytest.raises(EtcdUnavailable):
            async with asyncio.timeout(5):
                async for _ in broken:
                    pass
    finally:
        etcd_member.resume()
    await asyncio.sleep(1.0)  # the watch, broken by its idle probe meanwhile, is back or retrying
    await client.put(b"k", b"2")
    try:
        async with asyncio.timeout(5):
            while len(seen) < 2:
                await asyncio.sleep(0.01)
    finally:
        watch.cancel()
    assert seen == [b"1", b"2"]
    await client.close()


async def append_retrying(log: MetadataLog, leader, record: bytes, end: int) -> int:  # type: ignore[no-untyped-def]
    """Append one record at `end`, through etcd's absence; an append whose outcome was unknown
    and did happen shows as the log's end having moved past `end`."""
    async with asyncio.timeout(20):
        while True:
            try:
                return await log.append(leader, [record], end)
            except EtcdUnavailable:
                await asyncio.sleep(0.05)
            except StaleEndOffset as e:
                assert e.actual == end + 1  # our earlier try went through
                return e.actual


async def test_readers_see_every_batch_once_across_etcd_restarts(etcd_member: EtcdMember, etcd: HttpEtcd) -> None:
    log = MetadataLog(etcd, KEYS)
    leader = await campaign(etcd, KEYS, 1, await etcd.grant_lease(60))
    assert leader is not None
    seen: list[tuple[int, bytes]] = []

    async def read() -> None:
        async for item in log.read(0, retry_delay=0.05):
            assert isinstance(item, Batch)
            seen.extend(zip(range(item.base_offset, item.end_offset), item.records))

    reader = asyncio.create_task(read())
    end = 0
    for i in range(30):
        end = await append_retrying(log, leader, b"r%d" % i, end)
        if i % 10 == 5:
            etcd_member.kill()  # the reader's watch breaks; it resumes after the last revision it saw
            etcd_member.start()
    try:
        async with asyncio.timeout(20):
            while len(seen) < 30:
                await asyncio.sleep(0.05)
    finally:
        reader.cancel()
    assert seen == [(i, b"r%d" % i) for i in range(30)]


async def test_three_members_losing_the_one_a_client_talks_to(etcd_cluster: EtcdCluster) -> None:
    print("three-member etcd healthy after %.2f s" % etcd_cluster.start_seconds)
    client = HttpEtcd(etcd_cluster.endpoints, timeout=2.0, watch_idle_timeout=1.0)
    log = MetadataLog(client, KEYS)
    session = Session(client, 2000)
    await session.start()
    election = ControllerElection(client, KEYS, 1, session)
    election.start()
    seen: list[bytes] = []

    async def read() -> None:
        async for item in log.read(0, retry_delay=0.05):
            seen.extend(item.records)

    reader = asyncio.create_task(read())
    try:
        await election.wait_for(lambda e: e.leadership is not None, 10)
        leader = election.leadership
        end = await append_retrying(log, leader, b"before", 0)
        etcd_cluster.members[0].kill()  # the member the client (and its watch) use first
        end = await append_retrying(log, leader, b"after", end)
        async with asyncio.timeout(10):
            while len(seen) < 2:
                await asyncio.sleep(0.05)
        assert seen == [b"before", b"after"]
        assert election.leadership == leader  # the session's keep-alives went to another member
    finally:
        reader.cancel()
        await election.stop()
        await session.close()
        await client.close()


async def test_a_session_outlives_the_pause_of_the_member_it_talks_to(etcd_cluster: EtcdCluster) -> None:
    """A paused member answers nothing and refuses nothing: the session's keep-alive gives it up
    within a third of the lease and goes to another member, before the 2 s lease runs out (the
    client's own 5 s timeout is longer than the lease)."""
    client = HttpEtcd(etcd_cluster.endpoints)
    session = Session(client, 2000)
    await session.start()
    try:
        etcd_cluster.members[0].pause()  # the member the client uses first
        try:
            await asyncio.sleep(4)  # two lease lengths: a lease kept alive on member 0 alone would be gone
            assert not session.lost.is_set(), "the lease was lost while a majority of etcd was up"
            assert session.generation == 1
            assert await client.keep_alive(session.lease) > 0
        finally:
            etcd_cluster.members[0].resume()
    finally:
        await session.close()
        await client.close()


async def test_a_watch_on_a_member_cut_off_from_the_majority_ends(etcd_cluster: EtcdCluster) -> None:
    """With `hasleader`, a member that lost the raft leader cancels its watches instead of leaving
    them silent, so a node's watch moves to a member of the majority."""
    alone = etcd_cluster.members[0]
    client = HttpEtcd([alone.client_url], timeout=1.0, watch_idle_timeout=30.0)  # the probe stays out of it
    watch = client.watch(b"k")
    assert (await anext(watch)).events == []
    for m in etcd_cluster.members[1:]:
        m.pause()
    try:
        with pytest.raises(EtcdUnavailable, match="no leader"):
            async with asyncio.timeout(15):
                async for _ in watch:
                    pass
    finally:
        for m in etcd_cluster.members[1:]:
            m.resume()
        await client.close()


async def test_a_controller_outlasting_its_lease_without_etcd_steps_down_and_recovers(
        etcd_member: EtcdMember, etcd: HttpEtcd) -> None:
    """etcd gone for longer than the lease: the controller stops acting as such by its own clock;
    when etcd returns the node takes a new lease, claims its id again and is elected anew (a new
    epoch: the old term's writes stay fenced)."""
    session = Session(etcd, 1000)
    await session.start()
    claims: list[int] = []

    async def reclaim(lease: int) -> None:
        await claim_node_id(etcd, KEYS, 1, "dir-1", lease)
        claims.append(lease)

    await reclaim(session.lease)
    session.on_renew.append(reclaim)
    election = ControllerElection(etcd, KEYS, 1, session)
    election.start()
    log = MetadataLog(etcd, KEYS)
    try:
        await election.wait_for(lambda e: e.leadership is not None, 10)
        first = election.leadership
        assert first is not None
        end = await log.append(first, [b"one"], 0)
        etcd_member.kill()
        await election.wait_for(lambda e: e.leadership is None, 5)  # by its own clock, etcd still away
        assert session.lost.is_set()
        etcd_member.start()
        await election.wait_for(lambda e: e.leadership is not None, 15)
        second = election.leadership
        assert second is not None and second.epoch == first.epoch + 1
        assert len(claims) == 2 and claims[-1] == session.lease
        with pytest.raises(NotController):
            await log.append(first, [b"stale"], end)
        assert await log.append(second, [b"two"], end) == 2
    finally:
        await election.stop()
        await session.close()
