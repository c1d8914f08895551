"""The metadata image: topics, partitions, topic ids, configs, ACLs, quotas and features as the
metadata log's records built them, and the records' framing.

Every change is a KRaft metadata record (TopicRecord, PartitionRecord, ConfigRecord,
RemoveTopicRecord, ProducerIdsRecord) framed as Kafka frames them in `__cluster_metadata`
(unsigned varints frame version, api key, record version, then the record). `MetadataImage`
is the state built by replay; `MetadataStore` validates a change, makes its records durable
through the injected log and only then replays them, so what is acknowledged survives a crash.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from broker.metadata import features
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from protocol.primitives import encode_uvarint, read_uvarint

FRAME_VERSION = 1
# the coordinators' internal topics (Kafka's names)
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
SHARE_STATE_TOPIC = "__share_group_state"
INTERNAL_TOPICS = frozenset([OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, SHARE_STATE_TOPIC])
MAX_TOPIC_NAME = 249
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_CLIENT_METRICS = 16
RESOURCE_GROUP = 32
MIN_INSYNC_REPLICAS = "min.insync.replicas"
PRODUCER_ID_BLOCK = 1000
NO_LEADER_CHANGE = -2  # PartitionChangeRecord's leader when it does not change

# by name: a type's class is built when the first record of the type is met (most clusters have
# no security records, and a broker that only reads its metadata builds few)
_SECURITY_RECORDS = frozenset(["AccessControlEntryRecord", "RemoveAccessControlEntryRecord", "UserScramCredentialRecord",
                               "RemoveUserScramCredentialRecord", "ClientQuotaRecord"])
# the record types `MetadataImage.replay` applies; decode_record skips every other type the log may
# hold (broker registrations and fencing, NoOp, KRaft's metadata transactions, delegation tokens,
# ...) without decoding it, so a version of one newer than our definition cannot stop a replay
_BROKER_RECORDS = frozenset(["RegisterBrokerRecord", "UnregisterBrokerRecord", "FenceBrokerRecord",
                             "UnfenceBrokerRecord", "BrokerRegistrationChangeRecord"])
REPLAYED = frozenset(["TopicRecord", "PartitionRecord", "PartitionChangeRecord", "RemoveTopicRecord", "ConfigRecord",
                      "ProducerIdsRecord", "FeatureLevelRecord", *_SECURITY_RECORDS, *_BROKER_RECORDS])
_RECORD_CLASSES: dict[int, type] = {}  # the replayed types' classes by record type, as records of each are met


# the version each record is written at (0 unless listed): Kafka 4.2's, where it matters here
RECORD_VERSIONS: dict[str, int] = {"RegisterBrokerRecord": 3, "BrokerRegistrationChangeRecord": 2}


ELR_RECORDS = frozenset(["PartitionRecord", "PartitionChangeRecord"])  # version 2 carries KIP-966's fields


def record_version(record: Any) -> int:
    name = type(record).__name__
    if name in ELR_RECORDS and (record.eligible_leader_replicas or record.last_known_elr
                                or (name == "PartitionChangeRecord" and (record.eligible_leader_replicas is not None
                                                                         or record.last_known_elr is not None))):
        return 2  # only when they are set: a node without ELR writes what it always wrote
    return RECORD_VERSIONS.get(name, 0)


def encode_record(record: Any, version: int | None = None) -> bytes:
    codec = M.codec_of(record)
    assert codec.spec.api_key is not None
    if version is None:
        version = record_version(record)
    head = encode_uvarint(FRAME_VERSION) + encode_uvarint(codec.spec.api_key) + encode_uvarint(version)
    return head + M.encode(record, version)


def decode_record(data: bytes) -> Any:
    _frame, pos = read_uvarint(data, 0)
    api_key, pos = read_uvarint(data, pos)
    version, pos = read_uvarint(data, pos)
    cls = _RECORD_CLASSES.get(api_key)
    if cls is None:
        codec = M.METADATA_RECORDS.get(api_key)
        if codec is None or codec.spec.name not in REPLAYED:
            return None  # a record type the image does not replay: skipped (it still takes an offset)
        cls = _RECORD_CLASSES[api_key] = codec.root_class
    if version not in M.CODECS[cls.__name__].spec.valid_versions:
        return None  # a version newer than ours (a later metadata.version): skipped alike
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
    partition_epoch: int = 0  # bumped by every change of the partition (ISR, leader, replicas)
    # KIP-966: replicas that left the ISR while it was below min.insync.replicas yet may lead (ELR),
    # and those known to have been in it last (LastKnownElr)
    elr: list[int] = field(default_factory=list)
    last_known_elr: list[int] = field(default_factory=list)
    leader_recovery_state: int = 0  # RECOVERED (0); RECOVERING (1) after an unclean election (KIP-704)
    # a reassignment in progress (KIP-455): replicas joining, and leaving once those are in sync
    adding_replicas: list[int] = field(default_factory=list)
    removing_replicas: list[int] = field(default_factory=list)

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    def merge(self, record: Any) -> None:
        """A PartitionChangeRecord applied, as Kafka's PartitionRegistration.merge: the leader
        epoch moves only with a leader, the partition epoch with every change."""
        if record.replicas is not None:
            self.replicas = list(record.replicas)
        if record.isr is not None:
            self.isr = list(record.isr)
        if record.leader != NO_LEADER_CHANGE:
            self.leader = record.leader
            self.leader_epoch += 1
        if record.leader_recovery_state != -1:
            self.leader_recovery_state = record.leader_recovery_state
        if getattr(record, "eligible_leader_replicas", None) is not None:
            self.elr = list(record.eligible_leader_replicas)
        if getattr(record, "last_known_elr", None) is not None:
            self.last_known_elr = list(record.last_known_elr)
        if record.adding_replicas is not None:
            self.adding_replicas = list(record.adding_replicas)
        if record.removing_replicas is not None:
            self.removing_replicas = list(record.removing_replicas)
        self.partition_epoch += 1


@dataclass(frozen=True)
class Endpoint:
    """Where a registered broker listens (RegisterBrokerRecord's EndPoints)."""

    name: str  # the listener name, upper case as Kafka keeps it
    host: str
    port: int
    security_protocol: int


@dataclass
class BrokerRegistration:
    """A broker as the controller registered it (KRaft's BrokerRegistration): its epoch (the offset
    of its RegisterBrokerRecord), the process's incarnation, endpoints, rack and whether it is
    fenced (not offered as a leader or a coordinator) or in controlled shutdown."""

    node_id: int
    epoch: int
    incarnation_id: uuid.UUID
    endpoints: list[Endpoint]
    rack: str | None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    features: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (min, max) supported

    def endpoint(self, listener: str | None) -> Endpoint | None:
        """The endpoint of `listener` (None: the first one)."""
        if listener is None:
            return self.endpoints[0] if self.endpoints else None
        wanted = listener.upper()
        return next((e for e in self.endpoints if e.name.upper() == wanted), None)


FENCE, UNFENCE = 1, -1  # BrokerRegistrationChangeRecord's Fenced (0: no change)


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
        self.acls: dict[uuid.UUID, M.AccessControlEntryRecord] = {}
        self.scram: dict[tuple[str, int], M.UserScramCredentialRecord] = {}
        self.client_quotas: dict[tuple[tuple[str, str | None], ...], dict[str, float]] = {}
        self.acl_version = 0
        self.quota_version = 0
        self.brokers: dict[int, BrokerRegistration] = {}  # registered brokers by id (cluster mode)

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
                topic.assignments[record.partition_id] = Assignment(
                    list(record.replicas), list(record.isr), record.leader, record.leader_epoch, record.partition_epoch,
                    list(record.eligible_leader_replicas or ()),
                    list(record.last_known_elr or ()), record.leader_recovery_state,
                    list(record.adding_replicas or ()), list(record.removing_replicas or ()))
        elif isinstance(record, M.PartitionChangeRecord):
            topic = self.topics_by_id.get(record.topic_id)
            assignment = topic.assignments.get(record.partition_id) if topic is not None else None
            if assignment is not None:
                assignment.merge(record)
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
        elif type(record).__name__ in _SECURITY_RECORDS:
            self._replay_security(record)
        elif type(record).__name__ in _BROKER_RECORDS:
            self._replay_broker(record)
        elif isinstance(record, M.FeatureLevelRecord):
            # as Kafka: a kraft.version record is skipped (the quorum owns that level), 0 removes
            if record.name == features.KRAFT_VERSION:
                pass
            elif record.feature_level == 0:
                self.features.pop(record.name, None)
            else:
                self.features[record.name] = record.feature_level


    def _replay_broker(self, record: Any) -> None:
        if isinstance(record, M.RegisterBrokerRecord):
            self.brokers[record.broker_id] = BrokerRegistration(
                record.broker_id, record.broker_epoch, record.incarnation_id,
                [Endpoint(e.name, e.host, e.port, e.security_protocol) for e in record.end_points],
                record.rack, record.fenced, record.in_controlled_shutdown,
                {f.name: (f.min_supported_version, f.max_supported_version) for f in record.features})
            return
        node_id = record.id if isinstance(record, (M.FenceBrokerRecord, M.UnfenceBrokerRecord)) else record.broker_id
        epoch = record.epoch if isinstance(record, (M.FenceBrokerRecord, M.UnfenceBrokerRecord)) else record.broker_epoch
        found = self.brokers.get(node_id)
        if found is None or found.epoch != epoch:
            return  # about an older registration of the broker
        if isinstance(record, M.UnregisterBrokerRecord):
            del self.brokers[node_id]
        elif isinstance(record, M.FenceBrokerRecord):
            found.fenced = True
        elif isinstance(record, M.UnfenceBrokerRecord):
            found.fenced = False
        else:
            if record.fenced == FENCE:
                found.fenced = True
            elif record.fenced == UNFENCE:
                found.fenced = False
            if record.in_controlled_shutdown == 1:
                found.in_controlled_shutdown = True

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
