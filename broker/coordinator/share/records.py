"""The records of `__share_group_state`, in Kafka's format.

Key: int16 record type (0 ShareSnapshot, 1 ShareUpdate) then the key struct (group id, topic id,
partition) at version 0. Value: int16 version 0 then the value struct; a tombstone is a null value.
A ShareSnapshot holds a share-partition's whole state; a ShareUpdate holds the batches one write
changed, to be combined with the snapshot before it.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from broker.coordinator.result import Record
from broker.coordinator.share.state import ShareGroupOffset, StateBatch
from protocol import messages as M
from protocol.errors import ProtocolError

SHARE_SNAPSHOT = 0
SHARE_UPDATE = 1
VALUE_VERSION = 0

_INT16 = struct.Struct(">h")

ShareKey = tuple[str, uuid.UUID, int]
"""(group id, topic id, partition): one share-partition."""


def _classes(record_type: int) -> tuple[Any, Any] | None:
    """The key and value classes of a record type (None: a type this module does not know), named
    when asked for: built at the first share state record, not when the broker starts."""
    if record_type == SHARE_SNAPSHOT:
        return M.ShareSnapshotKey, M.ShareSnapshotValue
    if record_type == SHARE_UPDATE:
        return M.ShareUpdateKey, M.ShareUpdateValue
    return None


def _key(record_type: int, key: ShareKey) -> bytes:
    group_id, topic_id, partition = key
    key_cls = M.ShareSnapshotKey if record_type == SHARE_SNAPSHOT else M.ShareUpdateKey
    return _INT16.pack(record_type) + M.encode(key_cls(group_id=group_id, topic_id=topic_id, partition=partition), 0)


def _batches(cls: Any, batches: tuple[StateBatch, ...]) -> list[Any]:
    return [cls.StateBatch(first_offset=b.first_offset, last_offset=b.last_offset,
                           delivery_state=b.delivery_state, delivery_count=b.delivery_count) for b in batches]


def snapshot_record(key: ShareKey, state: ShareGroupOffset) -> Record:
    V = M.ShareSnapshotValue
    value = V(snapshot_epoch=state.snapshot_epoch, state_epoch=state.state_epoch, leader_epoch=state.leader_epoch,
              start_offset=state.start_offset, delivery_complete_count=state.delivery_complete_count,
              create_timestamp=state.create_timestamp, write_timestamp=state.write_timestamp,
              state_batches=_batches(V, state.state_batches))
    return _key(SHARE_SNAPSHOT, key), _INT16.pack(VALUE_VERSION) + M.encode(value, VALUE_VERSION)


def update_record(key: ShareKey, snapshot_epoch: int, leader_epoch: int, start_offset: int,
                  delivery_complete_count: int, batches: tuple[StateBatch, ...]) -> Record:
    V = M.ShareUpdateValue
    value = V(snapshot_epoch=snapshot_epoch, leader_epoch=leader_epoch, start_offset=start_offset,
              delivery_complete_count=delivery_complete_count, state_batches=_batches(V, batches))
    return _key(SHARE_UPDATE, key), _INT16.pack(VALUE_VERSION) + M.encode(value, VALUE_VERSION)


def tombstones(key: ShareKey) -> list[Record]:
    """What deleting a share-partition's state writes: both its keys, null."""
    return [(_key(SHARE_SNAPSHOT, key), None), (_key(SHARE_UPDATE, key), None)]


def parse_record(key: bytes, value: bytes | None) -> tuple[int, ShareKey | None, Any]:
    """(record type, share key, value struct or None). Unknown types come back as (type, None, None);
    malformed bytes raise ProtocolError."""
    if len(key) < 2:
        raise ProtocolError("share state record key too short")
    (record_type,) = _INT16.unpack_from(key, 0)
    classes = _classes(record_type)
    if classes is None:
        return record_type, None, None
    k = M.decode(classes[0], 0, memoryview(key)[2:])
    share_key = (k.group_id, k.topic_id, k.partition)
    if value is None:
        return record_type, share_key, None
    if len(value) < 2:
        raise ProtocolError("share state record value too short")
    (version,) = _INT16.unpack_from(value, 0)
    return record_type, share_key, M.decode(classes[1], version, memoryview(value)[2:])


def state_batches(value: Any) -> tuple[StateBatch, ...]:
    return tuple(StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                 for b in value.state_batches)
