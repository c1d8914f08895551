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
from dataclasses import dataclass
from typing import Any

from broker.coordinator.result import Record
from protocol import messages as M
from protocol.errors import ProtocolError
from protocol.primitives import ZERO_UUID

LEGACY_OFFSET_COMMIT = 0
OFFSET_COMMIT = 1
GROUP_METADATA = 2

OFFSET_COMMIT_VALUE_VERSION = 4
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_VALUE_VERSION = 3

_INT16 = struct.Struct(">h")

_KEYS: dict[int, type] = {
    LEGACY_OFFSET_COMMIT: M.LegacyOffsetCommitKey,
    OFFSET_COMMIT: M.OffsetCommitKey,
    GROUP_METADATA: M.GroupMetadataKey,
}
_VALUES: dict[int, type] = {
    LEGACY_OFFSET_COMMIT: M.LegacyOffsetCommitValue,
    OFFSET_COMMIT: M.OffsetCommitValue,
    GROUP_METADATA: M.GroupMetadataValue,
}


@dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed offset, as an OffsetCommitValue holds it."""

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


def _key(record_type: int, key: Any) -> bytes:
    return _INT16.pack(record_type) + M.encode(key, 0)


def _value(version: int, value: Any) -> bytes:
    return _INT16.pack(version) + M.encode(value, version)


def offset_commit_record(group_id: str, topic: str, partition: int, om: OffsetAndMetadata) -> Record:
    version = OFFSET_COMMIT_VALUE_VERSION if om.expire_timestamp_ms is None else OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY
    value = M.OffsetCommitValue(
        offset=om.committed_offset,
        leader_epoch=om.leader_epoch,
        metadata=om.metadata,
        commit_timestamp=om.commit_timestamp_ms,
        expire_timestamp=-1 if om.expire_timestamp_ms is None else om.expire_timestamp_ms,
        topic_id=om.topic_id,
    )
    return _key(OFFSET_COMMIT, M.OffsetCommitKey(group=group_id, topic=topic, partition=partition)), _value(version, value)


def offset_commit_tombstone(group_id: str, topic: str, partition: int) -> Record:
    return _key(OFFSET_COMMIT, M.OffsetCommitKey(group=group_id, topic=topic, partition=partition)), None


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


def parse_record(key: bytes, value: bytes | None) -> tuple[int, Any, Any]:
    """(record type, key struct, value struct or None for a tombstone). Types this module does
    not know come back as (type, None, None). Raises ProtocolError for malformed bytes."""
    if len(key) < 2:
        raise ProtocolError("coordinator record key too short")
    (record_type,) = _INT16.unpack_from(key, 0)
    key_cls = _KEYS.get(record_type)
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
