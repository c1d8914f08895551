"""The metadata log on etcd: fenced appends in order, readers that see each batch once and in
order (across etcd's absences and compaction), snapshots that let etcd forget the log behind
them. Each test runs on the in-memory fake and on a real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.cluster import metadata_log as ml
from broker.cluster.election import campaign
from broker.cluster.etcd import Etcd, EtcdCompacted, EtcdUnavailable, prefix_end
from broker.cluster.etcd_fake import FakeEtcd
from broker.cluster.etcd_http import HttpEtcd
from broker.cluster.keys import ClusterKeys, Leadership, NotController
from broker.cluster.metadata_log import (
    Batch,
    LocalSnapshots,
    MetadataLog,
    MetadataLogError,
    RecordTooLarge,
    Snapshot,
    StaleEndOffset,
)
from broker.metadata import MetadataImage, decode_record, encode_record
from broker.testing.etcd import EtcdMember
from protocol import messages as M

KEYS = ClusterKeys("test-cluster")


@pytest.fixture(params=["fake", "etcd"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def member(backend: str, request: pytest.FixtureRequest) -> Iterator[EtcdMember | None]:
    yield request.getfixturevalue("etcd_member") if backend == "etcd" else None


@pytest.fixture
async def store(backend: str, member: EtcdMember | None) -> AsyncIterator[Etcd]:
    if member is None:
        yield FakeEtcd()
        return
    client = HttpEtcd([member.client_url], timeout=2.0, watch_idle_timeout=1.0)
    try:
        yield client
    finally:
        await client.close()


async def lead(etcd: Etcd, node_id: int) -> Leadership:
    lease = await etcd.grant_lease(5)
    won = await campaign(etcd, KEYS, node_id, lease)
    assert won is not None
    return won


def records(n: int, start: int = 0) -> list[bytes]:
    return [encode_record(M.ProducerIdsRecord(broker_id=1, broker_epoch=0, next_producer_id=i))
            for i in range(start, start + n)]


async def take(reader: AsyncIterator[Batch | Snapshot], until: int, timeout: float = 10.0) -> list[Batch | Snapshot]:
    """Items from the reader until it has delivered offset `until` (exclusive)."""
    out: list[Batch | Snapshot] = []
    async with asyncio.timeout(timeout):
        async for item in reader:
            out.append(item)
            if item.end_offset >= until:
                return out
    return out


def flat(items: list[Batch | Snapshot]) -> list[bytes]:
    return [r for item in items for r in item.records]


async def test_appends_in_order_and_read_back(store: Etcd) -> None:
    log = MetadataLog(store, KEYS)
    leader = await lead(store, 1)
    assert await log.end_offset() == 0
    end = await log.append(leader, records(3), 0)
    end = await log.append(leader, records(2, 3), end)
    assert end == 5 and await log.end_offset() == 5
    items = await take(log.read(0), 5)
    assert [(b.base_offset, len(b.records)) for b in items] == [(0, 3), (3, 2)]
    assert flat(items) == records(5)
    assert all(isinstance(b, Batch) and b.epoch == leader.epoch for b in items)
    # the bytes are the records of the broker's metadata log
    image = MetadataImage()
    for r in flat(items):
        image.replay(decode_record(r))
    assert image.next_producer_id == 4
    # a reader starting inside a batch gets the rest of it
    assert flat(await take(log.read(1), 5)) == records(5)[1:]


async def test_append_must_start_at_the_end(store: Etcd) -> None:
    log = MetadataLog(store, KEYS)
    leader = await lead(store, 1)
    await log.append(leader, records(2), 0)
    with pytest.raises(StaleEndOffset) as e:
        await log.append(leader, records(1), 0)
    assert (e.value.expected, e.value.actual) == (0, 2)
    assert await log.end_offset() == 2


async def test_only_the_current_epoch_appends(store: Etcd) -> None:
    """Two controllers racing: the one deposed by a newer epoch can never append again."""
    log = MetadataLog(store, KEYS)
    first = await lead(store, 1)
    end = await log.append(first, records(1), 0)
    await store.revoke_lease(first.lease)  # its lease is gone: the key too
    second = await lead(store, 2)
    assert second.epoch == first.epoch + 1
    with pytest.raises(NotController) as e:
        await log.append(first, records(1, 1), end)
    assert (e.value.epoch, e.value.holder) == (second.epoch, 2)

    async def writer(who: Leadership, start: int) -> int:
        written = 0
        for i in range(10):
            try:
                await log.append(who, records(1, start + i), await log.end_offset())
                written += 1
            except (NotController, StaleEndOffset):
                pass
        return written

    a, b = await asyncio.gather(writer(first, 100), writer(second, 200))
    assert (a, b) == (0, 10)
    items = await take(log.read(0), 11)
    assert [b.epoch for b in items] == [first.epoch] + [second.epoch] * 10
    assert [b.base_offset for b in items] == list(range(11))


async def test_a_controller_whose_lease_expired_cannot_append(store: Etcd) -> None:
    log = MetadataLog(store, KEYS)
    leader = await lead(store, 1)
    await store.revoke_lease(leader.lease)  # no newer controller yet: the epoch is unchanged
    with pytest.raises(NotController):
        await log.append(leader, records(1), 0)


async def test_large_appends_are_split_into_keys_within_etcd_limits(store: Etcd) -> None:
    log = MetadataLog(store, KEYS)
    leader = await lead(store, 1)
    big = [b"x" * 100_000 for _ in range(30)]  # 3 MB: several keys and several transactions
    end = await log.append(leader, big, 0)
    assert end == 30
    keys = (await store.range(KEYS.log, prefix_end(KEYS.log))).kvs
    assert len(keys) > 3 and all(len(kv.value) <= ml.MAX_VALUE_BYTES for kv in keys)
    assert flat(await take(log.read(0), 30)) == big
    with pytest.raises(RecordTooLarge):
        await log.append(leader, [b"y" * ml.MAX_VALUE_BYTES], end)


async def test_reader_follows_appends_live(store: Etcd) -> None:
    log = MetadataLog(store, KEYS)
    leader = await lead(store, 1)
    await log.append(leader, records(2), 0)
    reader = log.read(0)
    got = await take(reader, 2)
    end = 2
    for i in range(5):
        end = await log.append(leader, records(1, 10 + i), end)
    got += await take(reader, end)
    assert [b.base_offset for b in got] == [0, 2, 3, 4, 5, 6]
    await reader.aclose()  # type: ignore[attr-defined]


async def test_snapshot_compaction_and_a_reader_that_was_behind(store: Etcd, tmp_path: Path) -> None:
    log = MetadataLog(store, KEYS)
    leader = await lead(store, 1)
    end = 0
    for i in range(10):
        end = await log.append(leader, records(1, i), end)
    old_revision = (await store.range(KEYS.log_end)).revision
    state = [b"image-record-%d" % i for i in range(3)] + [b"z" * 300_000]  # chunks over several keys
    await log.write_snapshot(leader, Snapshot(end, leader.epoch, state))
    deleted_at = await log.delete_behind(leader, end)
    end = await log.append(leader, records(2, 50), end)
    assert [kv.key for kv in (await store.range(KEYS.log, prefix_end(KEYS.log))).kvs] == [KEYS.log_key(10)]
    with pytest.raises(EtcdCompacted):
        await store.range(KEYS.log_end, revision=old_revision)
    assert deleted_at > old_revision
    # a node at offset 4 (its local snapshot) is behind the log's start: it gets the snapshot first
    local = LocalSnapshots(tmp_path / "meta")
    items = await take(MetadataLog(store, KEYS, local).read(4), 12)
    assert isinstance(items[0], Snapshot) and items[0].end_offset == 10 and items[0].records == state
    assert [(b.base_offset, b.records) for b in items[1:]] == [(10, records(2, 50))]
    kept = local.latest()
    assert kept is not None and kept.end_offset == 10 and kept.records == state
    # a node already past the snapshot reads on from the log
    assert flat(await take(log.read(10), 12)) == records(2, 50)
    # a newer snapshot replaces the older one's chunks
    await log.write_snapshot(leader, Snapshot(end, leader.epoch, [b"newer"]))
    await log.delete_behind(leader, end)
    assert [kv.key for kv in (await store.range(KEYS.snapshot_chunks, prefix_end(KEYS.snapshot_chunks))).kvs] \
        == [KEYS.chunk_key(12, 0)]


async def test_a_node_ahead_of_etcd_is_refused(store: Etcd) -> None:
    log = MetadataLog(store, KEYS)
    with pytest.raises(MetadataLogError, match="ends at 0"):
        await take(log.read(5), 6)


def test_local_snapshots_keep_the_newest_readable(tmp_path: Path) -> None:
    local = LocalSnapshots(tmp_path)
    assert local.latest() is None
    for end in (3, 7, 9):
        local.save(Snapshot(end, 1, [b"r%d" % end]))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["%020d.etcd-snapshot" % 7, "%020d.etcd-snapshot" % 9]
    newest = tmp_path / files[-1]
    newest.write_bytes(newest.read_bytes()[:-1])  # torn
    got = local.latest()
    assert got is not None and got.end_offset == 7 and got.records == [b"r7"]


async def test_reader_delivers_once_across_absences_fake() -> None:
    fake = FakeEtcd()
    log = MetadataLog(fake, KEYS)
    leader = await lead(fake, 1)
    seen: list[int] = []

    async def consume() -> None:
        async for item in log.read(0, retry_delay=0.01):
            seen.extend(range(item.base_offset if isinstance(item, Batch) else 0, item.end_offset))

    task = asyncio.create_task(consume())
    end = 0
    for i in range(40):
        while True:
            try:
                end = await log.append(leader, records(1, i), end)
                break
            except EtcdUnavailable:
                await asyncio.sleep(0.01)
        if i % 9 == 4:
            fake.set_available(False)
            asyncio.get_running_loop().call_later(0.03, fake.set_available, True)
    try:
        async with asyncio.timeout(10):
            while len(seen) < 40:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert seen == list(range(40))
