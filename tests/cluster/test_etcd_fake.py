"""The in-memory etcd keeps etcd's semantics (the same checks run against a real etcd in
test_etcd_real.py): revisions, compares, leases, watches from the past, compaction, absence."""

from __future__ import annotations

import asyncio

import pytest

from broker.cluster.etcd import (
    Compare,
    DeleteRange,
    EtcdCompacted,
    EtcdUnavailable,
    EventType,
    Get,
    LeaseNotFound,
    Op,
    Put,
    Target,
    WatchBatch,
    prefix_end,
    resumable_watch,
)
from broker.cluster.etcd_fake import FakeEtcd


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


async def test_revisions_and_versions(fake: FakeEtcd) -> None:
    r1 = await fake.put(b"k", b"1")
    r2 = await fake.put(b"k", b"2")
    kv = await fake.get(b"k")
    assert kv is not None and (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"2", r1, r2, 2)
    assert r2 == r1 + 1
    assert await fake.delete_range(b"k") == 1
    assert await fake.get(b"k") is None
    assert await fake.delete_range(b"k") == 0


async def test_range_is_sorted_limited_and_descending(fake: FakeEtcd) -> None:
    for k in (b"/p/3", b"/p/1", b"/p/2", b"/q"):
        await fake.put(k, b"v")
    got = await fake.range(b"/p/", prefix_end(b"/p/"))
    assert [kv.key for kv in got.kvs] == [b"/p/1", b"/p/2", b"/p/3"]
    page = await fake.range(b"/p/", prefix_end(b"/p/"), limit=2)
    assert [kv.key for kv in page.kvs] == [b"/p/1", b"/p/2"] and page.more
    last = await fake.range(b"/p/", prefix_end(b"/p/"), limit=1, descending=True)
    assert [kv.key for kv in last.kvs] == [b"/p/3"]


async def test_range_at_an_older_revision(fake: FakeEtcd) -> None:
    r1 = await fake.put(b"/a", b"1")
    await fake.put(b"/a", b"2")
    await fake.put(b"/b", b"x")
    old = await fake.range(b"/", prefix_end(b"/"), revision=r1)
    assert [(kv.key, kv.value) for kv in old.kvs] == [(b"/a", b"1")]


async def test_compares(fake: FakeEtcd) -> None:
    won = await fake.txn([Compare.absent(b"k")], [Put(b"k", b"1")], [Get(b"k")])
    assert won.succeeded and won.responses == [None]
    lost = await fake.txn([Compare.absent(b"k")], [Put(b"k", b"2")], [Get(b"k")])
    assert not lost.succeeded and [kv.value for kv in lost.responses[0]] == [b"1"]  # type: ignore[union-attr]
    assert (await fake.txn([Compare.value_is(b"k", b"1")], [Put(b"k", b"3")])).succeeded
    kv = await fake.get(b"k")
    assert kv is not None
    assert (await fake.txn([Compare.mod_revision_is(b"k", kv.mod_revision)], [DeleteRange(b"k")])).responses == [1]
    # a VALUE compare on a missing key fails whatever the operand, as in etcd
    assert not (await fake.txn([Compare.value_is(b"k", b"")], [Put(b"x", b"")])).succeeded
    assert (await fake.txn([Compare(b"k", Target.VERSION, Op.LESS, 1)], [Put(b"x", b"")])).succeeded
    # a read-only transaction does not move the revision
    before = fake.revision
    assert (await fake.txn([], [Get(b"x")])).revision == before


async def test_lease_expiry_deletes_its_keys(fake: FakeEtcd) -> None:
    lease = await fake.grant_lease(2)
    await fake.put(b"held", b"v", lease)
    fake.advance(1.5)
    assert await fake.keep_alive(lease) == 2
    fake.advance(1.5)
    assert await fake.get(b"held") is not None
    fake.advance(1.0)
    assert await fake.get(b"held") is None
    with pytest.raises(LeaseNotFound):
        await fake.keep_alive(lease)
    with pytest.raises(LeaseNotFound):
        await fake.put(b"again", b"v", lease)


async def _collect(it, n: int) -> list[WatchBatch]:  # type: ignore[no-untyped-def]
    out = []
    async for batch in it:
        if batch.events:
            out.append(batch)
        if sum(len(b.events) for b in out) >= n:
            return out
    return out


async def test_watch_from_a_past_revision_then_live(fake: FakeEtcd) -> None:
    r1 = await fake.put(b"/w/a", b"1")
    await fake.put(b"/other", b"x")
    await fake.put(b"/w/b", b"2")
    task = asyncio.create_task(_collect(fake.watch(b"/w/", prefix_end(b"/w/"), r1), 4))
    await asyncio.sleep(0)
    await fake.delete_range(b"/w/a")
    lease = await fake.grant_lease(2)
    await fake.put(b"/w/c", b"3", lease)
    batches = await asyncio.wait_for(task, 5)
    events = [(e.type, e.kv.key) for b in batches for e in b.events]
    assert events == [(EventType.PUT, b"/w/a"), (EventType.PUT, b"/w/b"), (EventType.DELETE, b"/w/a"),
                      (EventType.PUT, b"/w/c")]


async def test_compaction(fake: FakeEtcd) -> None:
    r1 = await fake.put(b"k", b"1")
    r2 = await fake.put(b"k", b"2")
    await fake.compact(r2)
    with pytest.raises(EtcdCompacted) as e:
        await fake.range(b"k", revision=r1)
    assert e.value.compact_revision == r2
    with pytest.raises(EtcdCompacted):
        async for _ in fake.watch(b"k", None, r1):
            pass
    assert (await fake.range(b"k", revision=r2)).kvs[0].value == b"2"


async def test_unavailable_breaks_calls_and_watches(fake: FakeEtcd) -> None:
    watch = fake.watch(b"k")
    assert (await anext(watch)).events == []
    fake.set_available(False)
    with pytest.raises(EtcdUnavailable):
        await anext(watch)
    with pytest.raises(EtcdUnavailable):
        await fake.get(b"k")
    fake.set_available(True)
    assert await fake.get(b"k") is None


async def test_resumable_watch_loses_and_repeats_nothing(fake: FakeEtcd) -> None:
    start = fake.revision + 1
    seen: list[bytes] = []

    async def consume() -> None:
        async for batch in resumable_watch(fake, b"/r/", prefix_end(b"/r/"), start, retry_delay=0.01):
            seen.extend(e.kv.value for e in batch.events)

    task = asyncio.create_task(consume())
    for i in range(30):
        await fake.put(b"/r/k", b"%d" % i)
        if i % 7 == 3:
            fake.set_available(False)
            await asyncio.sleep(0.02)
            fake.set_available(True)
            await asyncio.sleep(0)
    try:
        async with asyncio.timeout(5):
            while len(seen) < 30:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert seen == [b"%d" % i for i in range(30)]
