"""What a node does when its metadata changes in cluster mode (Kafka's metadata publishers).

Every node replays the same metadata log; this makes the node's own state follow it, in the order
the records came, one change after the other:

- a topic's partitions this node is a replica of get a local log (the others it does not store,
  and deletes when a reassignment moves them away);
  it leads those the metadata says it leads (their epochs, replicas and ISR) and follows the rest:
  its replica fetcher for their leader copies them (replication); a deleted topic's logs go;
- the coordinators' internal partitions (__consumer_offsets, __transaction_state,
  __share_group_state) are loaded where this node leads them and unloaded where it no longer does
  (Kafka's "load the partition and replay");
- topic configs reach their logs, broker configs the broker's defaults, group configs the live
  groups; the group coordinator hears of created, deleted and grown topics (subscriptions).

A replaced image (a snapshot loaded, the image reloaded after a failed append) is reconciled as a
whole.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Protocol

from broker.metadata import (
    RESOURCE_BROKER,
    RESOURCE_GROUP,
    RESOURCE_TOPIC,
    Assignment,
    MetadataImage,
    TopicInfo,
)
from broker.observability.logger import get_logger
from protocol import messages as M

log = get_logger("broker.cluster")


class LocalNode(Protocol):
    """What the publisher changes of the broker (broker.app.Broker)."""

    node_id: int

    def image(self) -> MetadataImage: ...

    def host_partition(self, info: TopicInfo, index: int, assignment: Assignment, fetch: bool = True) -> None:
        """Make sure the partition has a local log; lead it or follow its leader as `assignment` says."""

    async def drop_topic(self, name: str, topic_id: uuid.UUID) -> None:
        """The topic is gone: its local logs and what refers to it."""

    async def drop_replica(self, topic: str, index: int) -> None:
        """This node is no longer a replica of the partition: its copy goes (none: nothing to do)."""

    def local_topics(self) -> dict[str, uuid.UUID]:
        """The topics this node has logs of."""

    async def coordinator_partition(self, topic: str, index: int, lead: bool) -> None:
        """Load (lead) or unload the coordinator shard of an internal partition."""

    async def topics_changed(self, created: set[str], deleted: set[str], changed: set[str]) -> None: ...

    def topic_configs_changed(self, name: str) -> None: ...

    def broker_configs_changed(self) -> None: ...

    def group_configs_changed(self, group_id: str) -> None: ...


INTERNAL = ("__consumer_offsets", "__transaction_state", "__share_group_state")


class MetadataPublisher:
    def __init__(self, node: LocalNode) -> None:
        self.node = node
        self._queue: asyncio.Queue[list[Any] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._names: dict[uuid.UUID, str] = {}  # topic ids seen, for RemoveTopicRecord

    def __call__(self, records: list[Any] | None) -> None:
        """A MetadataStore listener: queue the change (applied in order, on the event loop)."""
        for r in records or ():
            if isinstance(r, M.TopicRecord):
                self._names[r.topic_id] = r.name
        self._queue.put_nowait(None if records is None else list(records))
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="metadata-publisher")

    async def settled(self) -> None:
        """Until every queued change is applied."""
        await self._idle.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while not self._queue.empty():
            records = self._queue.get_nowait()
            try:
                if records is None:
                    await self.reconcile_all()
                else:
                    await self.apply(records)
            except Exception:
                log.exception("applying a metadata change failed")
        self._idle.set()

    async def apply(self, records: list[Any]) -> None:
        image = self.node.image()
        created: set[str] = set()
        changed: set[str] = set()
        deleted: dict[str, uuid.UUID] = {}
        groups: set[str] = set()
        topic_configs: set[str] = set()
        broker_configs = False
        for r in records:
            if isinstance(r, M.TopicRecord):
                created.add(r.name)
            elif isinstance(r, (M.PartitionRecord, M.PartitionChangeRecord)):
                info = image.topics_by_id.get(r.topic_id)
                if info is not None and info.name not in created:
                    changed.add(info.name)
            elif isinstance(r, M.RemoveTopicRecord):
                name = self._names.pop(r.topic_id, None)
                if name is not None:
                    deleted[name] = r.topic_id
                    created.discard(name)
                    changed.discard(name)
            elif isinstance(r, M.ConfigRecord):
                if r.resource_type == RESOURCE_TOPIC:
                    topic_configs.add(r.resource_name)
                elif r.resource_type == RESOURCE_BROKER:
                    broker_configs = True
                elif r.resource_type == RESOURCE_GROUP:
                    groups.add(r.resource_name)
        if broker_configs:
            self.node.broker_configs_changed()
        for name, topic_id in deleted.items():
            await self.node.drop_topic(name, topic_id)
        for name in sorted(created | changed):
            info = image.topics.get(name)
            if info is not None:
                await self._follow_topic(info)
        for name in topic_configs - set(deleted):
            self.node.topic_configs_changed(name)
        for group_id in groups:
            self.node.group_configs_changed(group_id)
        if created or deleted or changed:
            await self.node.topics_changed(created, set(deleted), changed)

    async def reconcile_all(self) -> None:
        image = self.node.image()
        self._names = {t.topic_id: t.name for t in image.topics.values()}
        for name, topic_id in self.node.local_topics().items():
            info = image.topics.get(name)
            if info is None or info.topic_id != topic_id:
                await self.node.drop_topic(name, topic_id)
        self.node.broker_configs_changed()
        for info in list(image.topics.values()):
            await self._follow_topic(info)
            self.node.topic_configs_changed(info.name)
        await self.node.topics_changed(set(image.topics), set(), set())

    async def _follow_topic(self, info: TopicInfo) -> None:
        me = self.node.node_id
        internal = info.name in INTERNAL
        for index, a in sorted(info.assignments.items()):
            lead = a.leader == me
            if internal and not lead:
                # a coordinator lets go of its partition before the follower's fetcher may truncate
                # it; a follower first, so that its writes waiting to be committed fail at once
                if me in a.replicas:
                    self.node.host_partition(info, index, a, fetch=False)
                await self.node.coordinator_partition(info.name, index, False)
            if me in a.replicas:
                self.node.host_partition(info, index, a)
            else:
                await self.node.drop_replica(info.name, index)
            if internal and lead:
                await self.node.coordinator_partition(info.name, index, True)
