"""The records of `__consumer_offsets`, in Kafka's format, and their parsing.

Key: int16 record type (Kafka's CoordinatorRecordType: 0 legacy offset commit, 1 offset commit,
2 group metadata, 3+ the KIP-848/share group records) followed by the key struct at version 0.
Value: int16 version followed by the value struct at that version; a tombstone is a null value.
Kafka 4.x writes OffsetCommitValue v4 (v1 only when the commit carries an explicit expire
timestamp, i.e. OffsetCommit v2-v4 with a retention time) and GroupMetadataValue v3.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from broker.coordinator.result import Record
from protocol import messages as M
from protocol.errors import ProtocolError
from protocol.primitives import ZERO_UUID

LEGACY_OFFSET_COMMIT = 0
OFFSET_COMMIT = 1
GROUP_METADATA = 2
CONSUMER_GROUP_METADATA = 3
CONSUMER_GROUP_PARTITION_METADATA = 4  # replaced by the metadata hash since Kafka 4.1: only tombstoned
CONSUMER_GROUP_MEMBER_METADATA = 5
CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA = 6
CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER = 7
CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT = 8
CONSUMER_GROUP_REGULAR_EXPRESSION = 16
CONSUMER_GROUP_RECORD_TYPES = frozenset([3, 4, 5, 6, 7, 8, 16])
# Share groups (KIP-932); 9 (ShareGroupPartitionMetadata) is gone since Kafka 4.1.
SHARE_GROUP_MEMBER_METADATA = 10
SHARE_GROUP_METADATA = 11
SHARE_GROUP_TARGET_ASSIGNMENT_METADATA = 12
SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER = 13
SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT = 14
SHARE_GROUP_STATE_PARTITION_METADATA = 15
SHARE_GROUP_RECORD_TYPES = frozenset([10, 11, 12, 13, 14, 15])

OFFSET_COMMIT_VALUE_VERSION = 4
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_VALUE_VERSION = 3

_INT16 = struct.Struct(">h")

# The key and value definitions of each record type, by name: their classes are built when a record
# of the type is first met (a broker whose groups never write KIP-848 or share records builds none
# of theirs), then looked up in _KEYS and _VALUES.
_DEFINITIONS: dict[int, tuple[str, str]] = {
    LEGACY_OFFSET_COMMIT: ("LegacyOffsetCommitKey", "LegacyOffsetCommitValue"),
    OFFSET_COMMIT: ("OffsetCommitKey", "OffsetCommitValue"),
    GROUP_METADATA: ("GroupMetadataKey", "GroupMetadataValue"),
    CONSUMER_GROUP_METADATA: ("ConsumerGroupMetadataKey", "ConsumerGroupMetadataValue"),
    CONSUMER_GROUP_PARTITION_METADATA: ("ConsumerGroupPartitionMetadataKey", "ConsumerGroupPartitionMetadataValue"),
    CONSUMER_GROUP_MEMBER_METADATA: ("ConsumerGroupMemberMetadataKey", "ConsumerGroupMemberMetadataValue"),
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA: ("ConsumerGroupTargetAssignmentMetadataKey", "ConsumerGroupTargetAssignmentMetadataValue"),
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER: ("ConsumerGroupTargetAssignmentMemberKey", "ConsumerGroupTargetAssignmentMemberValue"),
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT: ("ConsumerGroupCurrentMemberAssignmentKey", "ConsumerGroupCurrentMemberAssignmentValue"),
    CONSUMER_GROUP_REGULAR_EXPRESSION: ("ConsumerGroupRegularExpressionKey", "ConsumerGroupRegularExpressionValue"),
    SHARE_GROUP_MEMBER_METADATA: ("ShareGroupMemberMetadataKey", "ShareGroupMemberMetadataValue"),
    SHARE_GROUP_METADATA: ("ShareGroupMetadataKey", "ShareGroupMetadataValue"),
    SHARE_GROUP_TARGET_ASSIGNMENT_METADATA: ("ShareGroupTargetAssignmentMetadataKey", "ShareGroupTargetAssignmentMetadataValue"),
    SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER: ("ShareGroupTargetAssignmentMemberKey", "ShareGroupTargetAssignmentMemberValue"),
    SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT: ("ShareGroupCurrentMemberAssignmentKey", "ShareGroupCurrentMemberAssignmentValue"),
    SHARE_GROUP_STATE_PARTITION_METADATA: ("ShareGroupStatePartitionMetadataKey", "ShareGroupStatePartitionMetadataValue"),
}
_KEYS: dict[int, type] = {}
_VALUES: dict[int, type] = {}


def _classes_of(record_type: int) -> type | None:
    """The key class of `record_type` (its value class into _VALUES too); None for a type this
    module does not know."""
    names = _DEFINITIONS.get(record_type)
    if names is None:
        return None
    _VALUES[record_type] = M.CLASSES[names[1]]
    key_cls = _KEYS[record_type] = M.CLASSES[names[0]]
    return key_cls


_KEY_HEAD = struct.Struct(">hh")  # record type, length of the group id
_INT16_AT = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_V3_HEAD = struct.Struct(">hqih")  # version 3: offset, leader epoch, length of the metadata
_V4_HEAD = struct.Struct(">hqi")  # version 4 (flexible): offset, leader epoch, then a compact string
_INT64 = struct.Struct(">q")
# version 4 with an empty metadata (compact length 1), then the tag buffer: no tags, or the topic id's
_V4_PLAIN = struct.Struct(">hqiBqB")
_V4_TOPIC_ID = struct.Struct(">hqiBqBBB16s")
_new = tuple.__new__  # OffsetAndMetadata(...) without the Python-level NamedTuple __new__ frame


def parse_offset_commit(key: bytes, value: bytes | None) -> tuple[str, str, int, OffsetAndMetadata | None] | None:
    """(group, topic, partition, offset or None for a tombstone) of an OffsetCommit record in the
    formats this broker writes (key type 1, value versions 3 and 4), read with struct alone: a
    broker restart replays one per committed partition. None for anything else (parse_record then)."""
    parsed_key = _offset_commit_key(key)
    if parsed_key is None:
        return None
    group, topic, partition = parsed_key
    if value is None:
        return group, topic, partition, None
    om = _offset_commit_value(value)
    return None if om is None else (group, topic, partition, om)


def _offset_commit_key(key: bytes) -> tuple[str, str, int] | None:
    try:
        record_type, group_len = _KEY_HEAD.unpack_from(key, 0)
        if record_type != OFFSET_COMMIT or group_len < 0:
            return None
        p = 4 + group_len
        group = key[4:p].decode()
        (topic_len,) = _INT16_AT.unpack_from(key, p)
        topic = key[p + 2 : p + 2 + topic_len].decode()
        p += 2 + topic_len
        (partition,) = _INT32.unpack_from(key, p)
        if topic_len < 0 or p + 4 != len(key):
            return None
        return group, topic, partition
    except (struct.error, IndexError, UnicodeDecodeError):
        return None  # parse_record says what is wrong


def _offset_commit_value(value: bytes) -> OffsetAndMetadata | None:
    if len(value) == _V4_PLAIN.size:  # what commits without metadata or topic id write: one unpack
        version, offset, epoch, meta_len, commit_ts, tags = _V4_PLAIN.unpack(value)
        if version == 4 and meta_len == 1 and tags == 0:
            return _new(OffsetAndMetadata, (offset, epoch, "", commit_ts, None, ZERO_UUID))
    elif len(value) == _V4_TOPIC_ID.size:  # ... without metadata, with a topic id
        version, offset, epoch, meta_len, commit_ts, tags, tag, size, raw = _V4_TOPIC_ID.unpack(value)
        if version == 4 and meta_len == 1 and tags == 1 and tag == 0 and size == 16:
            return _new(OffsetAndMetadata, (offset, epoch, "", commit_ts, None, _topic_id(raw)))
    try:
        version = value[0] << 8 | value[1]
        if version == 3:
            _, offset, epoch, meta_len = _V3_HEAD.unpack_from(value, 0)
            p = 16 + meta_len
            metadata = value[16:p].decode()
            (commit_ts,) = _INT64.unpack_from(value, p)
            if meta_len < 0 or p + 8 != len(value):
                return None
            return _new(OffsetAndMetadata, (offset, epoch, metadata, commit_ts, None, ZERO_UUID))
        if version == 4:
            _, offset, epoch = _V4_HEAD.unpack_from(value, 0)
            meta_len = value[14] - 1  # a one-byte compact length (metadata under 127 bytes)
            if value[14] & 0x80 or meta_len < 0:
                return None
            p = 15 + meta_len
            metadata = value[15:p].decode()
            (commit_ts,) = _INT64.unpack_from(value, p)
            p += 8
            tags = value[p:]
            if tags == b"\x00":
                return _new(OffsetAndMetadata, (offset, epoch, metadata, commit_ts, None, ZERO_UUID))
            if len(tags) == 19 and tags[:3] == b"\x01\x00\x10":  # one tagged field: the topic id
                return _new(OffsetAndMetadata, (offset, epoch, metadata, commit_ts, None, _topic_id(tags[3:])))
        return None
    except (struct.error, IndexError, UnicodeDecodeError):
        return None


_TOPIC_IDS: dict[bytes, uuid.UUID] = {}  # the few topics' ids, each read once per committed partition
_MAX_CACHED_TOPIC_IDS = 10_000


def _topic_id(raw: bytes) -> uuid.UUID:
    topic_id = _TOPIC_IDS.get(raw)
    if topic_id is None:
        if len(_TOPIC_IDS) >= _MAX_CACHED_TOPIC_IDS:
            _TOPIC_IDS.clear()
        topic_id = _TOPIC_IDS[raw] = uuid.UUID(bytes=bytes(raw))
    return topic_id


@dataclass(slots=True)
class OffsetCommitRun:
    """Consecutive OffsetCommit records of one group and topic, as one OffsetCommit request writes
    them: (partition, offset or None for a tombstone) in log order."""

    group: str
    topic: str
    offsets: list[tuple[int, OffsetAndMetadata | None]]
    tombstones: bool


def offset_commit_runs(records: Iterable[Record]) -> Iterator[OffsetCommitRun | Record]:
    """The records in order, each run of consecutive OffsetCommit records of one group and topic that
    parse_offset_commit reads gathered into an OffsetCommitRun, every other record as it is. The keys
    of a run differ only in their last 4 bytes (the partition): its group and topic are decoded once."""
    run: OffsetCommitRun | None = None
    same = b""  # the key of the run without its partition
    for key, value in records:
        if run is not None and len(key) == len(same) + 4 and key.startswith(same):
            (partition,) = _INT32.unpack_from(key, len(same))
            if value is None:
                run.offsets.append((partition, None))
                run.tombstones = True
                continue
            om = _offset_commit_value(value)
            if om is not None:
                run.offsets.append((partition, om))
                continue
        if run is not None:
            yield run
            run = None
        parsed = parse_offset_commit(key, value)
        if parsed is None:
            yield key, value
            continue
        group, topic, partition, om = parsed
        run = OffsetCommitRun(group, topic, [(partition, om)], om is None)
        same = key[:-4]
    if run is not None:
        yield run


class OffsetAndMetadata(NamedTuple):
    """A committed offset, as an OffsetCommitValue holds it (a NamedTuple: one is made per
    committed partition)."""

    committed_offset: int
    leader_epoch: int  # -1: none
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int | None = None  # only from OffsetCommit v2-v4 with a retention time
    topic_id: uuid.UUID = ZERO_UUID

    @classmethod
    def from_value(cls, value: Any) -> OffsetAndMetadata:
        expire = getattr(value, "expire_timestamp", -1)
        return cls(
            committed_offset=value.offset,
            leader_epoch=getattr(value, "leader_epoch", -1),
            metadata=value.metadata,
            commit_timestamp_ms=value.commit_timestamp,
            expire_timestamp_ms=None if expire == -1 else expire,
            topic_id=getattr(value, "topic_id", ZERO_UUID),
        )


def coordinator_record(record_type: int, key: Any, value: Any | None, version: int = 0) -> Record:
    """A record of `record_type` (a None value: its tombstone)."""
    return _key(record_type, key), None if value is None else _value(version, value)


def _key(record_type: int, key: Any) -> bytes:
    return _INT16.pack(record_type) + M.encode(key, 0)


def _value(version: int, value: Any) -> bytes:
    return _INT16.pack(version) + M.encode(value, version)


_OFFSET_COMMIT_KEYS: dict[tuple[str, str, int], bytes] = {}  # every commit of a partition has the same key
_MAX_CACHED_KEYS = 100_000


def offset_commit_key(group_id: str, topic: str, partition: int) -> bytes:
    key = _OFFSET_COMMIT_KEYS.get((group_id, topic, partition))
    if key is None:
        if len(_OFFSET_COMMIT_KEYS) >= _MAX_CACHED_KEYS:
            _OFFSET_COMMIT_KEYS.clear()
        key = _OFFSET_COMMIT_KEYS[(group_id, topic, partition)] = _key(
            OFFSET_COMMIT, M.OffsetCommitKey(group=group_id, topic=topic, partition=partition))
    return key


def offset_commit_record(group_id: str, topic: str, partition: int, om: OffsetAndMetadata) -> Record:
    """The OffsetCommit record of a committed offset: value version 4, or 1 with an expiry."""
    if om.expire_timestamp_ms is None:
        metadata = om.metadata.encode()
        if len(metadata) < 127:  # its compact length is one byte: every commit pays for this, write it here
            tags = b"\x00" if not om.topic_id.int else _TOPIC_ID_TAG + om.topic_id.bytes
            value = b"".join((_V4_HEAD.pack(OFFSET_COMMIT_VALUE_VERSION, om.committed_offset, om.leader_epoch),
                              _COMPACT_LENGTH[len(metadata)], metadata, _INT64.pack(om.commit_timestamp_ms), tags))
            return offset_commit_key(group_id, topic, partition), value
    version = OFFSET_COMMIT_VALUE_VERSION if om.expire_timestamp_ms is None else OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY
    record = M.OffsetCommitValue(
        offset=om.committed_offset,
        leader_epoch=om.leader_epoch,
        metadata=om.metadata,
        commit_timestamp=om.commit_timestamp_ms,
        expire_timestamp=-1 if om.expire_timestamp_ms is None else om.expire_timestamp_ms,
        topic_id=om.topic_id,
    )
    return offset_commit_key(group_id, topic, partition), _value(version, record)


_COMPACT_LENGTH = [bytes((n + 1,)) for n in range(127)]  # a string of n bytes
_TOPIC_ID_TAG = b"\x01\x00\x10"  # one tagged field: tag 0 (the topic id), 16 bytes


def offset_commit_tombstone(group_id: str, topic: str, partition: int) -> Record:
    return offset_commit_key(group_id, topic, partition), None


@dataclass(frozen=True)
class MemberSnapshot:
    """One member as a GroupMetadataValue stores it."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


def group_metadata_record(
    group_id: str,
    *,
    protocol_type: str | None,
    generation: int,
    protocol: str | None,
    leader: str | None,
    current_state_timestamp: int | None,
    members: list[MemberSnapshot],
) -> Record:
    value = M.GroupMetadataValue(
        protocol_type=protocol_type or "",
        generation=generation,
        protocol=protocol,
        leader=leader,
        current_state_timestamp=-1 if current_state_timestamp is None else current_state_timestamp,
        members=[
            M.GroupMetadataValue.MemberMetadata(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout=m.rebalance_timeout_ms,
                session_timeout=m.session_timeout_ms,
                subscription=m.subscription,
                assignment=m.assignment,
            )
            for m in members
        ],
    )
    return _key(GROUP_METADATA, M.GroupMetadataKey(group=group_id)), _value(GROUP_METADATA_VALUE_VERSION, value)


def empty_group_metadata_record(group_id: str, current_state_timestamp: int | None) -> Record:
    """What Kafka writes when a group is created by a JoinGroup (no protocol, generation 0)."""
    return group_metadata_record(
        group_id, protocol_type="", generation=0, protocol=None, leader=None,
        current_state_timestamp=current_state_timestamp, members=[],
    )


def group_metadata_tombstone(group_id: str) -> Record:
    return _key(GROUP_METADATA, M.GroupMetadataKey(group=group_id)), None


# ----- KIP-848 consumer groups (all values at version 0) ----------------------------------
PartitionsByTopic = list[tuple[uuid.UUID, list[int]]]
"""(topic id, sorted partitions) pairs, as the records list them."""


def consumer_group_epoch_record(group_id: str, epoch: int, metadata_hash: int) -> Record:
    return (_key(CONSUMER_GROUP_METADATA, M.ConsumerGroupMetadataKey(group_id=group_id)),
            _value(0, M.ConsumerGroupMetadataValue(epoch=epoch, metadata_hash=metadata_hash)))


def consumer_group_epoch_tombstone(group_id: str) -> Record:
    return _key(CONSUMER_GROUP_METADATA, M.ConsumerGroupMetadataKey(group_id=group_id)), None


def consumer_group_partition_metadata_tombstone(group_id: str) -> Record:
    return _key(CONSUMER_GROUP_PARTITION_METADATA, M.ConsumerGroupPartitionMetadataKey(group_id=group_id)), None


@dataclass(frozen=True)
class ClassicProtocolMetadata:
    """A consumer group member that joined with JoinGroup: its session timeout and protocols."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


def consumer_group_member_record(
    group_id: str, member_id: str, *, instance_id: str | None, rack_id: str | None, client_id: str,
    client_host: str, subscribed_topic_names: list[str], subscribed_topic_regex: str | None,
    rebalance_timeout_ms: int, server_assignor: str | None, classic: ClassicProtocolMetadata | None = None,
) -> Record:
    V = M.ConsumerGroupMemberMetadataValue
    value = V(
        instance_id=instance_id, rack_id=rack_id, client_id=client_id, client_host=client_host,
        subscribed_topic_names=subscribed_topic_names, subscribed_topic_regex=subscribed_topic_regex,
        rebalance_timeout_ms=rebalance_timeout_ms, server_assignor=server_assignor,
        classic_member_metadata=None if classic is None else V.ClassicMemberMetadata(
            session_timeout_ms=classic.session_timeout_ms,
            supported_protocols=[V.ClassicProtocol(name=n, metadata=m) for n, m in classic.protocols],
        ),
    )
    return (_key(CONSUMER_GROUP_MEMBER_METADATA, M.ConsumerGroupMemberMetadataKey(group_id=group_id, member_id=member_id)),
            _value(0, value))


def consumer_group_member_tombstone(group_id: str, member_id: str) -> Record:
    return _key(CONSUMER_GROUP_MEMBER_METADATA,
                M.ConsumerGroupMemberMetadataKey(group_id=group_id, member_id=member_id)), None


def target_assignment_epoch_record(group_id: str, epoch: int) -> Record:
    return (_key(CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, M.ConsumerGroupTargetAssignmentMetadataKey(group_id=group_id)),
            _value(0, M.ConsumerGroupTargetAssignmentMetadataValue(assignment_epoch=epoch)))


def target_assignment_epoch_tombstone(group_id: str) -> Record:
    return _key(CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA,
                M.ConsumerGroupTargetAssignmentMetadataKey(group_id=group_id)), None


def target_assignment_record(group_id: str, member_id: str, partitions: PartitionsByTopic) -> Record:
    V = M.ConsumerGroupTargetAssignmentMemberValue
    value = V(topic_partitions=[V.TopicPartition(topic_id=t, partitions=ps) for t, ps in partitions])
    return (_key(CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
                 M.ConsumerGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id)), _value(0, value))


def target_assignment_tombstone(group_id: str, member_id: str) -> Record:
    return _key(CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
                M.ConsumerGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id)), None


def current_assignment_record(
    group_id: str, member_id: str, *, member_epoch: int, previous_member_epoch: int, state: int,
    assigned: PartitionsByTopic, pending_revocation: PartitionsByTopic,
    epoch_of: Callable[[uuid.UUID, int], int] | None = None,
) -> Record:
    """epoch_of(topic id, partition): the epoch the member was given the partition at (KIP-1251's
    AssignmentEpochs, aligned with the partitions); None leaves them out."""
    V = M.ConsumerGroupCurrentMemberAssignmentValue

    def topic(t: uuid.UUID, ps: list[int]) -> Any:
        epochs = None if epoch_of is None else [epoch_of(t, p) for p in ps]
        return V.TopicPartitions(topic_id=t, partitions=ps, assignment_epochs=epochs)

    value = V(
        member_epoch=member_epoch, previous_member_epoch=previous_member_epoch, state=state,
        assigned_partitions=[topic(t, ps) for t, ps in assigned],
        partitions_pending_revocation=[topic(t, ps) for t, ps in pending_revocation],
    )
    return (_key(CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
                 M.ConsumerGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member_id)), _value(0, value))


def current_assignment_tombstone(group_id: str, member_id: str) -> Record:
    return _key(CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
                M.ConsumerGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member_id)), None


def regular_expression_record(group_id: str, regex: str, topics: list[str], version: int, timestamp_ms: int) -> Record:
    return (_key(CONSUMER_GROUP_REGULAR_EXPRESSION,
                 M.ConsumerGroupRegularExpressionKey(group_id=group_id, regular_expression=regex)),
            _value(0, M.ConsumerGroupRegularExpressionValue(topics=topics, version=version, timestamp=timestamp_ms)))


def regular_expression_tombstone(group_id: str, regex: str) -> Record:
    return _key(CONSUMER_GROUP_REGULAR_EXPRESSION,
                M.ConsumerGroupRegularExpressionKey(group_id=group_id, regular_expression=regex)), None


def parse_record(key: bytes, value: bytes | None) -> tuple[int, Any, Any]:
    """(record type, key struct, value struct or None for a tombstone). Types this module does
    not know come back as (type, None, None). Raises ProtocolError for malformed bytes."""
    if len(key) < 2:
        raise ProtocolError("coordinator record key too short")
    (record_type,) = _INT16.unpack_from(key, 0)
    key_cls = _KEYS.get(record_type)
    if key_cls is None:
        key_cls = _classes_of(record_type)  # the first record of its type
        if key_cls is None:
            return record_type, None, None
    key_struct = M.decode(key_cls, 0, memoryview(key)[2:])
    if value is None:
        return record_type, key_struct, None
    if len(value) < 2:
        raise ProtocolError("coordinator record value too short")
    (version,) = _INT16.unpack_from(value, 0)
    value_struct = M.decode(_VALUES[record_type], version, memoryview(value)[2:])
    return record_type, key_struct, value_struct
