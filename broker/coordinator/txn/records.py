"""The records of `__transaction_state`, in Kafka's format.

Key: int16 record type 0 (TRANSACTION_LOG) followed by TransactionLogKey v0 (the transactional id).
Value: int16 version followed by TransactionLogValue at that version; Kafka 4.x writes version 1
(flexible, with the previous/next producer ids as tagged fields) once transaction.version >= 1,
version 0 before.
A tombstone (null value) removes an expired transactional id. The partitions of an Empty
transaction are written as null, as Kafka does.
"""

from __future__ import annotations

import struct
from typing import Any

from broker.coordinator.result import Record
from broker.coordinator.txn.state import NO_PRODUCER_EPOCH, TV_1, TV_2, TransactionMetadata, TransactionState
from protocol import messages as M
from protocol.errors import ProtocolError

TRANSACTION_LOG = 0  # the key's record type
VALUE_VERSION = 1

_INT16 = struct.Struct(">h")


def transaction_key(transactional_id: str) -> bytes:
    return _INT16.pack(TRANSACTION_LOG) + M.encode(M.TransactionLogKey(transactional_id=transactional_id), 0)


def transaction_record(meta: TransactionMetadata, transaction_version: int = TV_2) -> Record:
    """The record of `meta`; the value's version follows the finalized transaction.version (0: v0)."""
    partitions = None
    if meta.state is not TransactionState.EMPTY:
        V = M.TransactionLogValue
        partitions = [V.PartitionsSchema(topic=t, partition_ids=ps) for t, ps in meta.describe_partitions().items()]
    value = M.TransactionLogValue(
        producer_id=meta.producer_id,
        previous_producer_id=meta.prev_producer_id,
        next_producer_id=meta.next_producer_id,
        producer_epoch=meta.producer_epoch,
        next_producer_epoch=NO_PRODUCER_EPOCH,
        transaction_timeout_ms=meta.txn_timeout_ms,
        transaction_status=meta.state.value,
        transaction_partitions=partitions,
        transaction_last_update_timestamp_ms=meta.txn_last_update_timestamp,
        transaction_start_timestamp_ms=meta.txn_start_timestamp,
        client_transaction_version=meta.client_transaction_version,
    )
    version = VALUE_VERSION if transaction_version >= TV_1 else 0
    return transaction_key(meta.transactional_id), _INT16.pack(version) + M.encode(value, version)


def tombstone(transactional_id: str) -> Record:
    return transaction_key(transactional_id), None


def parse_key(key: bytes) -> str:
    """The transactional id of a record key; ProtocolError for another record type."""
    if len(key) < 2:
        raise ProtocolError("transaction log key is too short")
    (record_type,) = _INT16.unpack_from(key)
    if record_type != TRANSACTION_LOG:
        raise ProtocolError("unknown transaction log key version %d" % record_type)
    transactional_id: str = M.decode(M.TransactionLogKey, 0, memoryview(key)[2:]).transactional_id
    return transactional_id


def parse_value(transactional_id: str, value: bytes) -> TransactionMetadata:
    if len(value) < 2:
        raise ProtocolError("transaction log value is too short")
    (version,) = _INT16.unpack_from(value)
    if version not in (0, 1):
        raise ProtocolError("unknown transaction log value version %d" % version)
    v: Any = M.decode(M.TransactionLogValue, version, memoryview(value)[2:])
    state = TransactionState(v.transaction_status)
    partitions: frozenset[tuple[str, int]] = frozenset()
    if state is not TransactionState.EMPTY and v.transaction_partitions:
        partitions = frozenset((p.topic, i) for p in v.transaction_partitions for i in p.partition_ids)
    return TransactionMetadata(
        transactional_id=transactional_id,
        producer_id=v.producer_id,
        prev_producer_id=v.previous_producer_id,
        next_producer_id=v.next_producer_id,
        producer_epoch=v.producer_epoch,
        last_producer_epoch=NO_PRODUCER_EPOCH,  # not persisted
        txn_timeout_ms=v.transaction_timeout_ms,
        state=state,
        partitions=partitions,
        txn_start_timestamp=v.transaction_start_timestamp_ms,
        txn_last_update_timestamp=v.transaction_last_update_timestamp_ms,
        client_transaction_version=v.client_transaction_version,
    )
