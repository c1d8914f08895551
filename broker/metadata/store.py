"""Changes to the cluster metadata: validated, made durable through the injected metadata log,
then replayed into the image (broker/metadata/image.py), so what is acknowledged survives a crash."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from broker.metadata import features
from broker.metadata.image import (
    MIN_INSYNC_REPLICAS,
    NO_LEADER_CHANGE,
    PRODUCER_ID_BLOCK,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    MetadataImage,
    TopicInfo,
    decode_record,
    encode_record,
    validate_topic_name,
)
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError


class MetadataLog(Protocol):
    def append(self, values: list[bytes]) -> None:
        """Make the values durable (fsynced) before returning."""

    def read_all(self) -> Iterable[bytes]: ...


class InMemoryMetadataLog:
    def __init__(self) -> None:
        self.values: list[bytes] = []

    def append(self, values: list[bytes]) -> None:
        self.values.extend(values)

    def read_all(self) -> Iterator[bytes]:
        return iter(list(self.values))


class MetadataStore:
    """Validated changes to the metadata image, written durably before they are applied."""

    def __init__(self, log: MetadataLog, node_id: int) -> None:
        self.log = log
        self.node_id = node_id
        self.image = MetadataImage()
        self._producer_ids_left = 0
        self._next_producer_id = 0
        # told of every record replayed (None: the image was replaced); cluster mode only
        self.listeners: list[Callable[[list[Any] | None], None]] = []

    def load(self) -> None:
        for value in self.log.read_all():
            record = decode_record(value)
            if record is None:
                self.image.records += 1  # a record type this broker does not use still has its offset
            else:
                self.image.replay(record)

    def bootstrap(self, static_min_insync_replicas: int) -> bool:
        """A new cluster (or one written before features were recorded) finalizes the bootstrap
        feature levels; with ELR on, `min.insync.replicas` becomes a cluster-level dynamic config
        first (Kafka's maybeGenerateElrSafetyRecords). True if anything was written."""
        if features.METADATA_VERSION in self.image.features:
            return False
        levels = features.bootstrap_levels()
        records: list[Any] = [M.FeatureLevelRecord(name=n, feature_level=v) for n, v in levels.items()]
        if levels.get(features.ELR_VERSION, 0) >= 1:
            records = self._elr_safety_records(static_min_insync_replicas) + records
        self._commit(records)
        return True

    def _elr_safety_records(self, static_min_insync_replicas: int) -> list[Any]:
        records: list[Any] = []
        if MIN_INSYNC_REPLICAS not in self.image.broker_configs.get("", {}):
            records.append(M.ConfigRecord(resource_type=RESOURCE_BROKER, resource_name="", name=MIN_INSYNC_REPLICAS,
                                          value=str(static_min_insync_replicas)))
        for name, configs in sorted(self.image.broker_configs.items()):
            if name and MIN_INSYNC_REPLICAS in configs:
                records.append(M.ConfigRecord(resource_type=RESOURCE_BROKER, resource_name=name,
                                              name=MIN_INSYNC_REPLICAS, value=None))
        return records

    def feature_level(self, name: str) -> int:
        return self.image.features.get(name, 0)

    @property
    def finalized_features_epoch(self) -> int:
        """Kafka reports the offset of the last metadata record applied."""
        return self.image.records - 1

    def update_features(self, updates: list[tuple[str, int, int]], validate_only: bool,
                        static_min_insync_replicas: int) -> None:
        """UpdateFeatures, all or nothing (KafkaError with Kafka's code and message)."""
        current = {**self.image.features, features.KRAFT_VERSION: features.KRAFT_VERSION_LEVEL}
        changes = features.plan_update(updates, current, self.node_id)
        if validate_only or not changes:
            return
        records: list[Any] = []
        if changes.get(features.ELR_VERSION, 0) >= 1 and self.feature_level(features.ELR_VERSION) == 0:
            records += self._elr_safety_records(static_min_insync_replicas)
        records += [M.FeatureLevelRecord(name=n, feature_level=v) for n, v in changes.items()]
        self._commit(records)

    def _commit(self, records: list[Any]) -> None:
        self.log.append([encode_record(r) for r in records])
        for r in records:
            self.image.replay(r)
        if self.listeners:
            self.replayed(records)

    @property
    def committed(self) -> MetadataImage:
        """The image of what is durable (cluster mode: the controller's own changes join it once
        appended; here every change is durable before it is applied)."""
        return self.image

    def replayed(self, records: list[Any] | None) -> None:
        """Tell the listeners what was replayed (None: the image was replaced)."""
        for listener in list(self.listeners):
            listener(records)

    # queries --------------------------------------------------------------------------------
    def topic(self, name: str) -> TopicInfo | None:
        return self.image.topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self.image.topics_by_id.get(topic_id)

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        """The name of the topic with this id (None: no such topic), as MetadataCache.getTopicName."""
        info = self.image.topics_by_id.get(topic_id)
        return info.name if info is not None else None

    @property
    def topics(self) -> dict[str, TopicInfo]:
        return self.image.topics

    # changes --------------------------------------------------------------------------------
    def create_topic(
        self, name: str, partitions: int, configs: dict[str, str] | None = None, topic_id: uuid.UUID | None = None,
        replicas: Callable[[int], list[int]] | None = None,
    ) -> TopicInfo:
        """Create a topic; `replicas(partition)` places each partition (default: this node)."""
        validate_topic_name(name)
        if name in self.image.topics:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, "Topic '%s' already exists." % name)
        collides = name.replace(".", "_")
        for other in self.image.topics:
            if other.replace(".", "_") == collides:
                raise KafkaError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION, "Topic '%s' collides with existing topic: %s" % (name, other)
                )
        if partitions <= 0:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
        topic_id = topic_id or uuid.uuid4()
        records: list[Any] = [M.TopicRecord(name=name, topic_id=topic_id)]
        for (key, value) in sorted((configs or {}).items()):
            records.append(M.ConfigRecord(resource_type=RESOURCE_TOPIC, resource_name=name, name=key, value=value))
        records += [self._partition_record(topic_id, p, replicas) for p in range(partitions)]
        self._commit(records)
        return self.image.topics[name]

    def _partition_record(self, topic_id: uuid.UUID, index: int,
                          replicas: Callable[[int], list[int]] | None = None) -> Any:
        nodes = replicas(index) if replicas is not None else [self.node_id]
        return M.PartitionRecord(
            partition_id=index, topic_id=topic_id, replicas=nodes, isr=list(nodes),
            leader=nodes[0], leader_epoch=0, partition_epoch=0,
        )

    def change_partition(self, topic: str, partition: int, leader: int | None = None,
                         isr: list[int] | None = None, replicas: list[int] | None = None) -> None:
        """A new leader (-1: none), in-sync replica set and/or replicas (PartitionChangeRecord)."""
        info = self.image.topics[topic]
        self._commit([M.PartitionChangeRecord(
            topic_id=info.topic_id, partition_id=partition, isr=isr, replicas=replicas,
            leader=NO_LEADER_CHANGE if leader is None else leader)])

    def delete_topic(self, name: str) -> TopicInfo:
        info = self.image.topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition.")
        self._commit([M.RemoveTopicRecord(topic_id=info.topic_id)])
        return info

    def create_partitions(self, name: str, total: int, replicas: Callable[[int], list[int]] | None = None) -> TopicInfo:
        info = self.image.topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The topic '%s' does not exist." % name)
        if total < info.partitions:
            raise KafkaError(
                ErrorCode.INVALID_PARTITIONS,
                "The topic %s currently has %d partition(s); %d would not be an increase."
                % (name, info.partitions, total),
            )
        if total == info.partitions:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Topic already has %d partition(s)." % total)
        self._commit([self._partition_record(info.topic_id, p, replicas) for p in range(info.partitions, total)])
        return info

    def set_configs(self, resource_type: int, resource_name: str, changes: dict[str, str | None]) -> None:
        """Set (value) or remove (None) dynamic configs of a topic or the broker."""
        records = [
            M.ConfigRecord(resource_type=resource_type, resource_name=resource_name, name=k, value=v)
            for k, v in sorted(changes.items())
        ]
        if records:
            self._commit(records)

    def append_records(self, records: list[Any]) -> None:
        """Make records already validated by their owner durable, then apply them (ACLs, SCRAM
        credentials and client quotas are checked in broker/security/, as Kafka's control managers)."""
        if records:
            self._commit(records)

    def allocate_producer_id(self) -> int:
        """Producer ids come from blocks reserved durably, so none is reused after a restart."""
        if self._producer_ids_left == 0:
            self._next_producer_id = self._reserve_producer_ids()
            self._producer_ids_left = PRODUCER_ID_BLOCK
        pid = self._next_producer_id
        self._next_producer_id += 1
        self._producer_ids_left -= 1
        return pid

    def _reserve_producer_ids(self) -> int:
        """The first id of a new block of PRODUCER_ID_BLOCK ids, reserved durably."""
        start = self.image.next_producer_id
        self._commit([M.ProducerIdsRecord(broker_id=self.node_id, broker_epoch=0,
                                          next_producer_id=start + PRODUCER_ID_BLOCK)])
        return start
