"""A node's image following the metadata log (MetadataLoader), on the in-memory etcd: a reload
(after a failed append of the controller) swaps the image rebuilt from etcd in whole, and never
shows the listeners an empty one, whatever etcd does meanwhile."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from broker.cluster.election import campaign
from broker.cluster.etcd_fake import FakeEtcd
from broker.cluster.keys import ClusterKeys
from broker.cluster.metadata_log import LocalSnapshots, MetadataLog
from broker.cluster.metadata_sync import ClusterMetadataStore, MetadataLoader
from broker.metadata import encode_record
from protocol import messages as M

KEYS = ClusterKeys("sync-cluster")


class NoLog:
    def append(self, values: list[bytes]) -> None:
        raise AssertionError("the loader's store is not written to")

    def read_all(self) -> Iterable[bytes]:
        return ()


def topic(name: str) -> list[bytes]:
    topic_id = uuid.uuid4()
    return [encode_record(M.TopicRecord(name=name, topic_id=topic_id)),
            encode_record(M.PartitionRecord(partition_id=0, topic_id=topic_id, replicas=[1], isr=[1], leader=1))]


async def until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_a_reload_keeps_the_image_until_etcd_gives_the_whole_new_one(tmp_path: Path) -> None:
    etcd = FakeEtcd()
    mlog = MetadataLog(etcd, KEYS, LocalSnapshots(tmp_path / "snapshots"))
    leadership = await campaign(etcd, KEYS, 1, await etcd.grant_lease(5))
    assert leadership is not None
    end = await mlog.append(leadership, topic("kept"), 0)
    store = ClusterMetadataStore(NoLog(), 1)  # type: ignore[arg-type]
    seen: list[set[str]] = []  # the topics each listener call saw
    store.listeners.append(lambda records: seen.append(set(store.image.topics)))
    loader = MetadataLoader(store, mlog, LocalSnapshots(tmp_path / "local"))
    loader.start()
    try:
        await loader.wait_for_offset(end, 5)
        assert set(store.image.topics) == {"kept"}

        etcd.set_available(False)  # a failed append, etcd away: the image must be loaded anew
        loader.reload()
        asked = etcd.requests
        await until(lambda: etcd.requests >= asked + 3)  # the reload asked etcd, in vain, a few times
        assert set(store.image.topics) == {"kept"}

        etcd.set_available(True)
        end = await mlog.append(leadership, topic("added"), end)
        await loader.wait_for_offset(end, 5)
        assert set(store.image.topics) == {"kept", "added"}
    finally:
        await loader.stop()
    assert seen and all("kept" in topics for topics in seen), seen


async def test_the_node_acts_only_on_the_controllers_changes_once_durable(tmp_path: Path) -> None:
    """The controller validates against its image, changed at once, but the node's own state (the
    publisher, its routing) follows `committed`, and the listeners hear of a change only once it
    is appended. A controller that lost its term (paused past its lease) and changes the metadata
    on waking: the append fails, the image is reloaded, and the node never acted on it (found by
    the fault runs: a paused controller fenced the brokers it had not heard from and led their
    partitions alone in an epoch no other node knew)."""
    from broker.cluster.metadata_sync import ControllerLog

    etcd = FakeEtcd()
    mlog = MetadataLog(etcd, KEYS, LocalSnapshots(tmp_path / "snapshots"))
    lease = await etcd.grant_lease(5)
    leadership = await campaign(etcd, KEYS, 1, lease)
    assert leadership is not None
    store = ClusterMetadataStore(NoLog(), 1)  # type: ignore[arg-type]
    loader = MetadataLoader(store, mlog, LocalSnapshots(tmp_path / "local"))
    failures: list[int] = []
    clog = ControllerLog(mlog, lambda: store.image, lambda: (failures.append(1), loader.reload()))
    store.log = clog
    heard: list[tuple[set[str], set[str]]] = []  # (the records' topics, the committed image's) at each call
    store.listeners.append(lambda records: heard.append((
        {r.name for r in records or () if isinstance(r, M.TopicRecord)}, set(store.committed.topics))))
    end = await mlog.append(leadership, topic("kept"), 0)
    loader.start()
    try:
        await loader.wait_for_offset(end, 5)  # caught up, as a controller is before it takes up its term
        heard.clear()
        clog.leadership = leadership
        topic_id = uuid.uuid4()
        store.append_records([M.TopicRecord(name="made", topic_id=topic_id),
                              M.PartitionRecord(partition_id=0, topic_id=topic_id, replicas=[1], isr=[1], leader=1)])
        assert "made" in store.image.topics and "made" not in store.committed.topics and not heard
        await clog.sync()
        await until(lambda: bool(heard))
        assert heard == [({"made"}, {"kept", "made"})]

        await etcd.revoke_lease(lease)  # the term ends while the node does not know it yet
        other = await campaign(etcd, KEYS, 2, await etcd.grant_lease(5))
        assert other is not None
        zombie = uuid.uuid4()
        store.append_records([M.TopicRecord(name="zombie", topic_id=zombie),
                              M.PartitionRecord(partition_id=0, topic_id=zombie, replicas=[1], isr=[1], leader=1)])
        assert "zombie" in store.image.topics and "zombie" not in store.committed.topics
        await until(lambda: bool(failures))
        await until(lambda: "zombie" not in store.image.topics)  # reloaded from etcd
        assert set(store.committed.topics) == {"kept", "made"}
        assert all("zombie" not in named and "zombie" not in seen for named, seen in heard), heard
    finally:
        clog.stop()
        await loader.stop()
