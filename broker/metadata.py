"""Cluster metadata: topics, partitions, topic ids and dynamic configs, kept as a replayed log.

Every change is a KRaft metadata record (TopicRecord, PartitionRecord, ConfigRecord,
RemoveTopicRecord, ProducerIdsRecord) framed as Kafka frames them in `__cluster_metadata`
(unsigned varints frame version, api key, record version, then the record). `MetadataImage`
is the state built by replay; `MetadataStore` validates a change, makes its records durable
through the injected log and only then replays them, so what is acknowledged survives a crash.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker import features
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from protocol.primitives import encode_uvarint, read_uvarint

FRAME_VERSION = 1
INTERNAL_TOPICS = frozenset(["__consumer_offsets", "__transaction_state", "__share_group_state"])
MAX_TOPIC_NAME = 249
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_CLIENT_METRICS = 16
RESOURCE_GROUP = 32
MIN_INSYNC_REPLICAS = "min.insync.replicas"
PRODUCER_ID_BLOCK = 1000
NO_LEADER_CHANGE = -2  # PartitionChangeRecord's leader when it does not change

_RECORD_CLASSES = {
    c.spec.api_key: c.root_class
    for name, c in M.CODECS.items()
    if c.spec.type == "metadata" and c.spec.api_key is not None
}


def encode_record(record: Any, version: int = 0) -> bytes:
    codec = M.codec_of(record)
    assert codec.spec.api_key is not None
    head = encode_uvarint(FRAME_VERSION) + encode_uvarint(codec.spec.api_key) + encode_uvarint(version)
    return head + M.encode(record, version)


def decode_record(data: bytes) -> Any:
    _frame, pos = read_uvarint(data, 0)
    api_key, pos = read_uvarint(data, pos)
    version, pos = read_uvarint(data, pos)
    cls = _RECORD_CLASSES.get(api_key)
    if cls is None:
        return None  # a record type this broker does not use: skipped, as a newer log may hold them
    return M.decode(cls, version, memoryview(data)[pos:])


def validate_topic_name(name: str) -> None:
    """Kafka's rules for topic names (INVALID_TOPIC_EXCEPTION when broken, with Kafka's messages)."""
    reason = None
    if not name:
        reason = "the empty string is not allowed"
    elif name in (".", ".."):
        reason = "'%s' is not allowed" % name
    elif len(name) > MAX_TOPIC_NAME:
        reason = "the length of '%s' is longer than the max allowed length %d" % (name, MAX_TOPIC_NAME)
    elif not _LEGAL_TOPIC.fullmatch(name):
        reason = "'%s' contains one or more characters other than ASCII alphanumerics, '.', '_' and '-'" % name
    if reason is not None:
        raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, "Topic name is invalid: " + reason)


@dataclass
class Assignment:
    """Where a partition lives (PartitionRecord, PartitionChangeRecord): its replicas, the
    in-sync ones and the leader (-1: none)."""

    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int = 0  # bumped by every change of leader


@dataclass
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int = 0
    configs: dict[str, str] = field(default_factory=dict)
    assignments: dict[int, Assignment] = field(default_factory=dict)  # partition -> where it lives

    @property
    def internal(self) -> bool:
        return self.name in INTERNAL_TOPICS


class MetadataImage:
    """The state replayed from metadata records; changed only by `replay`."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicInfo] = {}
        self.topics_by_id: dict[uuid.UUID, TopicInfo] = {}
        self.broker_configs: dict[str, dict[str, str]] = {}  # resource name ("" = cluster-wide) -> configs
        # configs of the other resource types (CLIENT_METRICS subscriptions, GROUP configs):
        # resource type -> resource name -> configs; a resource without configs is gone, as in Kafka
        self.resource_configs: dict[int, dict[str, dict[str, str]]] = {RESOURCE_CLIENT_METRICS: {}, RESOURCE_GROUP: {}}
        self.features: dict[str, int] = {}  # finalized feature levels (FeatureLevelRecord); 0 is absent
        self.next_producer_id = 0
        self.records = 0  # records replayed: the next offset of the metadata log
        # security (broker/security/): ACLs by id, SCRAM credentials by (user, mechanism type),
        # client quotas by entity ((type, name or None for the default), ...); each kind's version
        # moves with every change so that readers rebuild their indexes
        self.acls: dict[uuid.UUID, Any] = {}  # AccessControlEntryRecord
        self.scram: dict[tuple[str, int], Any] = {}  # UserScramCredentialRecord
        self.client_quotas: dict[tuple[tuple[str, str | None], ...], dict[str, float]] = {}
        self.acl_version = 0
        self.quota_version = 0

    def replay(self, record: Any) -> None:
        self.records += 1
        if isinstance(record, M.TopicRecord):
            info = TopicInfo(record.name, record.topic_id)
            self.topics[info.name] = info
            self.topics_by_id[info.topic_id] = info
        elif isinstance(record, M.PartitionRecord):
            topic = self.topics_by_id.get(record.topic_id)
            if topic is not None:
                topic.partitions = max(topic.partitions, record.partition_id + 1)
                topic.assignments[record.partition_id] = Assignment(list(record.replicas), list(record.isr),
                                                                    record.leader, record.leader_epoch)
        elif isinstance(record, M.PartitionChangeRecord):
            topic = self.topics_by_id.get(record.topic_id)
            assignment = topic.assignments.get(record.partition_id) if topic is not None else None
            if assignment is not None:
                if record.replicas is not None:
                    assignment.replicas = list(record.replicas)
                if record.isr is not None:
                    assignment.isr = list(record.isr)
                if record.leader != NO_LEADER_CHANGE:
                    assignment.leader = record.leader
                    assignment.leader_epoch += 1
        elif isinstance(record, M.RemoveTopicRecord):
            gone = self.topics_by_id.pop(record.topic_id, None)
            if gone is not None:
                self.topics.pop(gone.name, None)
        elif isinstance(record, M.ConfigRecord):
            if record.resource_type == RESOURCE_TOPIC:
                t = self.topics.get(record.resource_name)
                target = t.configs if t is not None else None
            elif record.resource_type == RESOURCE_BROKER:
                target = self.broker_configs.setdefault(record.resource_name, {})
            elif record.resource_type in self.resource_configs:
                target = self.resource_configs[record.resource_type].setdefault(record.resource_name, {})
            else:
                target = None
            if target is not None:
                if record.value is None:
                    target.pop(record.name, None)
                else:
                    target[record.name] = record.value
                if not target and record.resource_type in self.resource_configs:
                    del self.resource_configs[record.resource_type][record.resource_name]
        elif isinstance(record, M.ProducerIdsRecord):
            self.next_producer_id = max(self.next_producer_id, record.next_producer_id)
        elif isinstance(record, _SECURITY_RECORDS):
            self._replay_security(record)
        elif isinstance(record, M.FeatureLevelRecord):
            # as Kafka: a kraft.version record is skipped (the quorum owns that level), 0 removes
            if record.name == features.KRAFT_VERSION:
                pass
            elif record.feature_level == 0:
                self.features.pop(record.name, None)
            else:
                self.features[record.name] = record.feature_level


    def _replay_security(self, record: Any) -> None:
        if isinstance(record, M.AccessControlEntryRecord):
            self.acls[record.id] = record
            self.acl_version += 1
        elif isinstance(record, M.RemoveAccessControlEntryRecord):
            self.acls.pop(record.id, None)
            self.acl_version += 1
        elif isinstance(record, M.UserScramCredentialRecord):
            self.scram[(record.name, record.mechanism)] = record
        elif isinstance(record, M.RemoveUserScramCredentialRecord):
            self.scram.pop((record.name, record.mechanism), None)
        else:  # ClientQuotaRecord
            entity = tuple(sorted((e.entity_type, e.entity_name) for e in record.entity))
            values = self.client_quotas.setdefault(entity, {})
            if record.remove:
                values.pop(record.key, None)
                if not values:
                    del self.client_quotas[entity]
            else:
                values[record.key] = record.value
            self.quota_version += 1


_SECURITY_RECORDS = (M.AccessControlEntryRecord, M.RemoveAccessControlEntryRecord, M.UserScramCredentialRecord,
                     M.RemoveUserScramCredentialRecord, M.ClientQuotaRecord)


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
        self.log.append([encode_record(r, self._version_of(r)) for r in records])
        for r in records:
            self.image.replay(r)

    @staticmethod
    def _version_of(record: Any) -> int:
        # PartitionRecord v1 adds Directories; v0 is all a single log dir needs
        return 0

    # queries --------------------------------------------------------------------------------
    def topic(self, name: str) -> TopicInfo | None:
        return self.image.topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self.image.topics_by_id.get(topic_id)

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
                         isr: list[int] | None = None) -> None:
        """A new leader (-1: none) and/or in-sync replica set (PartitionChangeRecord)."""
        info = self.image.topics[topic]
        self._commit([M.PartitionChangeRecord(
            topic_id=info.topic_id, partition_id=partition, isr=isr,
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
