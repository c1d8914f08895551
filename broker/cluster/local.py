"""The broker's side of the metadata publisher (publisher.py's LocalNode): what following the
cluster's metadata changes in one broker process (broker.app.Broker, reached as `broker`: this
module sits below the wiring)."""

from __future__ import annotations

import uuid
from typing import Any

from broker.metadata import MetadataImage, TopicInfo
from broker.metadata.image import OFFSETS_TOPIC, SHARE_STATE_TOPIC, TRANSACTION_STATE_TOPIC
from broker.observability.logger import get_logger

log = get_logger("broker.cluster")


class LocalBroker:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.node_id: int = broker.node_id

    def image(self) -> MetadataImage:
        return self.broker.metadata.image  # type: ignore[no-any-return]

    def host_partition(self, info: TopicInfo, index: int, leader_epoch: int | None) -> None:
        b = self.broker
        partition = b.partitions.get(info.name, index)
        if partition is None:
            partition = b.partitions.ensure(info.name, index, info.topic_id, b.topic_log_config(info.name))
        if leader_epoch is not None:
            partition.become_leader(leader_epoch)

    async def drop_topic(self, name: str, topic_id: uuid.UUID) -> None:
        b = self.broker
        b.log_dir_mover.cancel_topic(name)
        await b.partitions.remove_topic(name)
        log.info("topic deleted", topic=name)
        await b.share_topic_deleted(topic_id)

    def local_topics(self) -> dict[str, uuid.UUID]:
        out: dict[str, uuid.UUID] = {}
        for (topic, _), partition in self.broker.partitions.partitions.items():
            out[topic] = partition.topic_id
        return out

    async def coordinator_partition(self, topic: str, index: int, lead: bool) -> None:
        runtime = self._runtime(topic)
        if runtime is None:
            return
        loaded = runtime.state(index) is not None
        if lead and not loaded:
            log.info("coordinator partition loading", topic=topic, partition=index)
            await runtime.load(index)
        elif not lead and loaded:
            log.info("coordinator partition unloading", topic=topic, partition=index)
            await runtime.unload(index)

    def _runtime(self, topic: str) -> Any:
        b = self.broker
        coordinator = {OFFSETS_TOPIC: b.group_coordinator, TRANSACTION_STATE_TOPIC: b.txn_coordinator,
                       SHARE_STATE_TOPIC: b.share_coordinator}.get(topic)
        return coordinator.runtime if coordinator is not None else None

    async def topics_changed(self, created: set[str], deleted: set[str], changed: set[str]) -> None:
        await self.broker.topics_changed(created=created, deleted=deleted, changed=changed)

    def topic_configs_changed(self, name: str) -> None:
        b = self.broker
        config = b.topic_log_config(name) or b.default_log_config
        b.logs.update_topic_config(name, config)

    def broker_configs_changed(self) -> None:
        self.broker.apply_dynamic_configs()

    def group_configs_changed(self, group_id: str) -> None:
        self.broker.group_configs_changed(group_id)
