"""A PartitionWriter on the storage engine: each internal-topic partition (`__consumer_offsets-N`)
is a broker.log Log, compacted like Kafka's.

A write appends one record batch (CreateTime now, uncompressed) with the coordinator's origin,
synchronously, so the data reaches the OS before the response is released (it survives
`kill -9`); only when the log's flush policy (`flush.messages` / `flush.ms`) asks for an fsync
is there something to await, and concurrent waiters of the partition share one (GroupCommit).

A transactional producer's records (TxnOffsetCommit) are written as its transactional batch, and
the transaction's end as a marker; when the partition is served (a registered topic) both go
through its producer state, so its last stable offset and aborted-transaction index are right.
Loading reads every batch from the log start: each batch of plain records as a list, transactional
records one by one, and the markers.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

from broker.coordinator.result import LoggedItem, Record, TransactionalRecord, TxnMarker
from broker.log import AppendOrigin, Log, LogConfig
from broker.log.group_commit import GroupCommit
from broker.log.reader import iter_batch_keys_values
from broker.partition import Partition
from protocol import checksum
from protocol.primitives import encode_varint
from protocol.records import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
    ControlRecordType,
    build_control_batch,
    parse_control_key_value,
)

_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")  # RecordBatch v2, up to the first record
_UINT32 = struct.Struct(">I")


def coordinator_batch(records: Sequence[Record], now_ms: int | None = None) -> bytes:
    """One uncompressed RecordBatch v2 of the records, all stamped `now_ms` (CreateTime; default
    the wall clock), no producer, no headers: the bytes protocol.records.build_batch gives for
    them."""
    return bytes(build_coordinator_batch(records, now_ms)[0])


def build_coordinator_batch(records: Sequence[Record], now_ms: int | None = None,
                            producer: tuple[int, int] | None = None) -> tuple[bytearray, BatchHeader]:
    """`coordinator_batch` and its header, written out here because every commit pays for it
    (the log appends it without parsing it again: Log.append_built). With `producer` (id, epoch)
    it is that producer's transactional batch (no sequence, as Kafka's coordinators write them)."""
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    parts: list[bytes] = []
    for offset_delta, (key, value) in enumerate(records):
        # attributes (unused), timestamp delta 0, offset delta, key, value (-1: a tombstone), no headers
        record = b"".join((b"\x00\x00", _varint(offset_delta), _varint(len(key)), key,
                           b"\x01" if value is None else _varint(len(value)), value or b"", b"\x00"))
        parts += (_varint(len(record)), record)
    body = b"".join(parts)
    batch = bytearray(RECORD_BATCH_OVERHEAD)
    batch += body
    producer_id, epoch = producer if producer is not None else (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    attributes = 0 if producer is None else TRANSACTIONAL_FLAG_MASK
    last_delta, length = len(records) - 1, len(batch) - LOG_OVERHEAD
    _BATCH_HEADER.pack_into(batch, 0, 0, length, NO_PARTITION_LEADER_EPOCH, MAGIC_V2, 0, attributes, last_delta,
                            now_ms, now_ms, producer_id, epoch, NO_SEQUENCE, len(records))
    crc = checksum.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:])
    _UINT32.pack_into(batch, CRC_OFFSET, crc)
    return batch, BatchHeader(0, length, NO_PARTITION_LEADER_EPOCH, MAGIC_V2, crc, attributes, last_delta, now_ms,
                              now_ms, producer_id, epoch, NO_SEQUENCE, len(records))


_SMALL_VARINTS = [encode_varint(n) for n in range(1024)]  # lengths and offset deltas of coordinator records


def _varint(n: int) -> bytes:
    return _SMALL_VARINTS[n] if n < 1024 else encode_varint(n)


def internal_topic_log_config(defaults: LogConfig, segment_bytes: int | None = None) -> LogConfig:
    """Kafka's settings for a coordinator topic: compacted, producer compression, and
    `offsets.topic.segment.bytes` segments when given."""
    props: dict[str, str | None] = {"cleanup.policy": "compact", "compression.type": "producer"}
    if segment_bytes is not None:
        props["segment.bytes"] = str(segment_bytes)
    return defaults.with_overrides(props)


class LogPartitionWriter:
    """`log_for(partition)` returns (creating if needed) the partition's Log; `on_append`
    (optional) is told after each append, e.g. to wake fetches of the internal topic;
    `partition_of` (optional) gives the served Partition, whose producer state transactional
    writes and markers go through."""

    def __init__(
        self,
        log_for: Callable[[int], Log],
        on_append: Callable[[int], None] | None = None,
        existing_log: Callable[[int], Log | None] | None = None,
        partition_of: Callable[[int], Partition | None] | None = None,
        write_timeout_ms: int = 5000,
    ) -> None:
        self._log_for = log_for
        self._on_append = on_append
        # loading must not create logs: Kafka's partitions appear only when the topic is created
        self._existing_log = existing_log or log_for
        self._partition_of = partition_of or (lambda index: None)
        self._commits: dict[int, GroupCommit] = {}
        self._write_timeout_s = write_timeout_ms / 1000

    def _commit_for(self, partition: int, log: Log) -> GroupCommit:
        commit = self._commits.get(partition)
        if commit is None:
            commit = self._commits[partition] = GroupCommit(log.flush, log.recovery_point)
        return commit

    def write(self, partition: int, records: Sequence[Record],
              producer: tuple[int, int] | None = None) -> Awaitable[int] | None:
        """Append one batch to the partition's log (it reaches the OS before this returns); None,
        unless the log's flush policy asks for an fsync: then the shared one to await."""
        if not records:
            return None
        log = self._log_for(partition)
        batch, header = build_coordinator_batch(records, producer=producer)
        result = log.append_built(batch, header)
        if producer is not None:
            served = self._partition_of(partition)
            if served is not None:
                served.producers.update(header._replace(base_offset=result.first_offset))
        return self._appended(partition, log)

    def write_marker(self, partition: int, marker: TxnMarker) -> Awaitable[int] | None:
        """Append a transaction marker, through the partition's producer state when it is served."""
        log = self._log_for(partition)
        served = self._partition_of(partition)
        if served is not None:
            served.append_marker(marker.producer_id, marker.producer_epoch, marker.committed, marker.coordinator_epoch)
        else:
            kind = ControlRecordType.COMMIT if marker.committed else ControlRecordType.ABORT
            log.append(build_control_batch(kind, marker.producer_id, marker.producer_epoch, marker.coordinator_epoch),
                       origin=AppendOrigin.COORDINATOR)
        return self._appended(partition, log)

    def _appended(self, partition: int, log: Log) -> Awaitable[int] | None:
        if self._on_append is not None:
            self._on_append(partition)
        flushed = self._commit_for(partition, log).commit(log.log_end_offset) if log.needs_flush() else None
        served = self._partition_of(partition)
        if served is None or served.leads_alone:
            return flushed
        return self._committed(served, log.log_end_offset, flushed)

    async def _committed(self, served: Partition, offset: int, flushed: Awaitable[int] | None) -> int:
        """A replicated partition: the records count once the high watermark passes them, as
        Kafka's coordinator runtime releases a write's response (appended as acks=1, then held
        until committed): REQUEST_TIMED_OUT after the write timeout, NOT_LEADER_OR_FOLLOWER if the
        leadership moved meanwhile (the runtime turns both into the coordinator's errors)."""
        if flushed is not None:
            await flushed
        await served.replicated(offset, self._write_timeout_s, acks_all=False)
        return offset

    async def append(self, partition: int, records: Sequence[Record]) -> int:
        """`write`, then wait until the records are durable; returns the log end offset."""
        waiting = self.write(partition, records)
        if waiting is not None:
            await waiting
        return self._log_for(partition).log_end_offset

    def read(self, partition: int) -> Iterator[LoggedItem]:
        log = self._existing_log(partition)
        if log is None:
            return
        for header, records in iter_batch_keys_values(log):
            if header.is_control:
                if records and header.has_producer_id:
                    kind, coordinator_epoch = parse_control_key_value(*records[0])
                    if kind in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
                        yield TxnMarker(header.producer_id, header.producer_epoch, kind is ControlRecordType.COMMIT,
                                        coordinator_epoch)
            elif header.is_transactional:
                yield from (TransactionalRecord(header.producer_id, k, v) for k, v in records if k is not None)
            else:  # a batch of plain records, replayed at once
                yield [(k, v) for k, v in records if k is not None]
