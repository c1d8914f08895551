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
