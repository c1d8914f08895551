"""Producer-state snapshots: `<20-digit offset>.snapshot` in the partition directory, Kafka's layout.

The file is the producer state after every batch below `offset`: int16 version (1), uint32
CRC-32C of the rest, int32 count, then per producer: int64 producer id, int16 epoch, int32 last
sequence, int64 last offset, int32 offset delta (last minus first sequence of the last batch),
int64 timestamp, int32 coordinator epoch, int64 first offset of the open transaction (-1: none).
Kafka writes one entry per producer, for its last batch; here a producer gets one entry per
batch it remembers (up to five, oldest first, each with the producer's fields), so a restart
still recognises retries of all five. Kafka reads such a file as its own: the last entry of a
producer, the newest, is the one it keeps.

A partition writes one when its log rolls a segment and at a clean shutdown; loading starts from
the latest usable one and replays only the batches after it. Files are written under a `.tmp`
name, fsynced, then renamed, so a crash leaves the previous snapshots intact (the loader removes
`.tmp` leftovers).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

from broker.log.checkpoint import fsync_dir, read_whole
from broker.log.segment import filename_prefix
from broker.partition.producer_state import BatchMetadata, ProducerEntry
from protocol import checksum

SUFFIX = ".snapshot"
VERSION = 1
_HEAD = struct.Struct(">hIi")  # version, crc, count
_ENTRY = struct.Struct(">qhiqiqiq")
KEEP = 2  # snapshots kept per partition (the latest ones)


class CorruptSnapshotError(Exception):
    pass


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, filename_prefix(offset) + SUFFIX)


def list_snapshots(directory: str, names: Iterable[str] | None = None) -> list[int]:
    """The offsets of the snapshots in `directory` (whose file `names` the caller may know
    already), ascending."""
    offsets = []
    if names is None:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
    for name in names:
        if name.endswith(SUFFIX):
            head = name[: -len(SUFFIX)]
            if head.isdigit():
                offsets.append(int(head))
    return sorted(offsets)


def encode(entries: Iterable[ProducerEntry]) -> bytes:
    body = bytearray()
    count = 0
    for e in entries:
        for b in e.batches or [None]:
            body += _ENTRY.pack(
                e.producer_id, e.epoch,
                b.last_seq if b else -1, b.last_offset if b else -1, b.last_seq - b.first_seq if b else 0,
                e.last_timestamp, e.coordinator_epoch, e.current_txn_first_offset)
            count += 1
    rest = struct.pack(">i", count) + bytes(body)
    return struct.pack(">hI", VERSION, checksum.crc32c(rest)) + rest


def decode(data: bytes) -> list[ProducerEntry]:
    if len(data) < _HEAD.size:
        raise CorruptSnapshotError("snapshot is truncated")
    version, crc, count = _HEAD.unpack_from(data)
    if version != VERSION:
        raise CorruptSnapshotError("unknown snapshot version %d" % version)
    if checksum.crc32c(memoryview(data)[6:]) != crc:
        raise CorruptSnapshotError("snapshot CRC mismatch")
    if count < 0 or len(data) != _HEAD.size + count * _ENTRY.size:
        raise CorruptSnapshotError("snapshot size does not match its %d entries" % count)
    entries: dict[int, ProducerEntry] = {}
    for i in range(count):
        pid, epoch, last_seq, last_offset, delta, ts, coordinator_epoch, txn_first = _ENTRY.unpack_from(
            data, _HEAD.size + i * _ENTRY.size)
        entry = entries.get(pid)
        if entry is None:
            entry = entries[pid] = ProducerEntry(pid)
        # a producer's entries repeat its fields; its last one (the newest batch) counts, as in Kafka
        entry.set_epoch(epoch)
        entry.last_timestamp, entry.coordinator_epoch, entry.current_txn_first_offset = ts, coordinator_epoch, txn_first
        if last_offset >= 0:
            entry.batches.append(BatchMetadata(last_seq - delta, last_seq, last_offset - delta, last_offset, ts))
    return list(entries.values())


def write_snapshot(directory: str, offset: int, entries: Iterable[ProducerEntry]) -> None:
    """Write the snapshot at `offset` durably, then keep only the latest KEEP ones."""
    path = snapshot_path(directory, offset)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, encode(entries))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)
    for old in list_snapshots(directory)[:-KEEP]:
        delete_snapshot(directory, old)


def read_snapshot(directory: str, offset: int) -> list[ProducerEntry]:
    return decode(read_whole(snapshot_path(directory, offset)))


def delete_snapshot(directory: str, offset: int) -> None:
    try:
        os.unlink(snapshot_path(directory, offset))
    except FileNotFoundError:
        pass
