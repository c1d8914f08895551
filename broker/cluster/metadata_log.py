"""The KRaft metadata log kept in etcd: appended by the controller, read and watched by every node.

The records are the bytes `broker.metadata.encode_record` makes (what `__cluster_metadata`
holds); this module orders and stores them, it never decodes them.

Key layout, everything of a cluster under `<root>/<cluster id>/` (root `/kafka` by default;
offsets are 20-digit zero-padded decimals so that etcd's byte order is offset order):

    <root>/cluster-id                      the cluster id the first node created (election.py)
    .../controller                         {"node_id", "epoch"} of the active controller; held by
                                           its lease, so it vanishes when the controller dies
    .../controller-epoch                   the last controller epoch (decimal); never deleted
    .../nodes/<node id>                    a node's claim on its id, held by its lease
    .../log/<base offset>                  one batch of records (below), at most MAX_VALUE_BYTES
    .../log-end                            the next offset of the log (decimal)
    .../snapshot                           manifest of the last snapshot (JSON: end_offset, epoch,
                                           chunks, size, crc32)
    .../snapshot/<end offset>/<chunk>      the snapshot's bytes (the batch encoding), in chunks

An append is one transaction: the controller's fence (the epoch counter's mod revision and the
controller key's create revision are those of the transaction that made it controller, so a
deposed controller or one whose lease expired cannot write) and `log-end` equal to the end the
caller's records were validated against; it puts the batch key(s) and the new `log-end`. An
append larger than MAX_TXN_BYTES is written as consecutive transactions (as KRaft's non-atomic
appends: each part whole batches, a part may commit and a later one fail).

A reader lists the batches from its offset at one revision R (paged), then watches the `log/`
prefix from R+1: each batch is delivered once, in offset order, across reconnects (the watch
resumes after the last revision seen) and compaction (it lists again from where it is). A
reader whose offset is behind the log's first batch loads the snapshot first.

A snapshot is written by the controller in fenced transactions, chunks first and the manifest
last; then `delete_behind` removes the batches and older chunks it covers and compacts etcd's
history at that revision, so etcd holds one snapshot plus the log since.

Batch encoding: version (int8, 0), epoch (int32), base offset (int64), record count (int32),
then each record as an unsigned varint length and its bytes.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.cluster.etcd import (
    Compare,
    DeleteRange,
    Etcd,
    EtcdCompacted,
    EtcdUnavailable,
    EventType,
    Get,
    KeyValue,
    Put,
    TxnOp,
    prefix_end,
    resumable_watch,
)
from broker.cluster.keys import ClusterKeys, Leadership, NotController
from broker.log.checkpoint import write_atomic
from protocol.primitives import encode_uvarint

FORMAT_VERSION = 0
_HEADER = struct.Struct(">biqi")
# etcd refuses requests above 1.5 MiB (--max-request-bytes) and transactions of more than 128
# operations (--max-txn-ops); the JSON gateway sends values base64-encoded (4/3)
MAX_VALUE_BYTES = 256 * 1024
MAX_TXN_BYTES = 1024 * 1024
MAX_TXN_OPS = 64
PAGE_SIZE = 256  # batches per range request when catching up


class MetadataLogError(Exception):
    """The log in etcd cannot continue this node's history (a gap, or the node is ahead of it)."""


class RecordTooLarge(MetadataLogError):
    pass


class StaleEndOffset(Exception):
    """The log's end is not where the caller's records were validated (retriable: catch up first)."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__("the metadata log ends at %d, not %d" % (actual, expected))
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True)
class Batch:
    base_offset: int
    epoch: int
    records: list[bytes]

    @property
    def end_offset(self) -> int:
        return self.base_offset + len(self.records)


@dataclass(frozen=True)
class Snapshot:
    """Every record needed to rebuild the image as of `end_offset` (the next offset)."""

    end_offset: int
    epoch: int
    records: list[bytes]


def encode_batch(epoch: int, base_offset: int, records: Sequence[bytes]) -> bytes:
    parts = [_HEADER.pack(FORMAT_VERSION, epoch, base_offset, len(records))]
    for r in records:
        parts.append(encode_uvarint(len(r)))
        parts.append(r)
    return b"".join(parts)


def decode_batch(data: bytes) -> Batch:
    version, epoch, base, count = _HEADER.unpack_from(data, 0)
    if version != FORMAT_VERSION:
        raise MetadataLogError("unknown metadata batch version %d" % version)
    pos = _HEADER.size
    records = []
    for _ in range(count):
        size = shift = 0
        while True:  # an unsigned varint of any length (records may exceed the 5 bytes of Kafka's)
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        records.append(bytes(data[pos:pos + size]))
        pos += size
    if pos != len(data):
        raise MetadataLogError("metadata batch at %d: %d bytes left over" % (base, len(data) - pos))
    return Batch(base, epoch, records)


def _split(records: Sequence[bytes], base_offset: int, epoch: int) -> list[tuple[int, bytes]]:
    """Whole records in batches of at most MAX_VALUE_BYTES encoded: (base offset, value) each."""
    batches: list[tuple[int, bytes]] = []
    start, size = 0, _HEADER.size
    for i, r in enumerate(records):
        cost = len(encode_uvarint(len(r))) + len(r)
        if cost + _HEADER.size > MAX_VALUE_BYTES:
            raise RecordTooLarge("a metadata record of %d bytes is larger than %d" % (len(r), MAX_VALUE_BYTES))
        if size + cost > MAX_VALUE_BYTES:
            batches.append((base_offset + start, encode_batch(epoch, base_offset + start, records[start:i])))
            start, size = i, _HEADER.size
        size += cost
    if start < len(records):
        batches.append((base_offset + start, encode_batch(epoch, base_offset + start, records[start:])))
    return batches


def _groups(items: list[tuple[int, bytes]]) -> list[list[tuple[int, bytes]]]:
    """Consecutive items in groups that fit one transaction."""
    groups: list[list[tuple[int, bytes]]] = [[]]
    size = 0
    for item in items:
        if groups[-1] and (size + len(item[1]) > MAX_TXN_BYTES or len(groups[-1]) >= MAX_TXN_OPS):
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += len(item[1])
    return groups


class MetadataLog:
    def __init__(self, etcd: Etcd, keys: ClusterKeys, local: LocalSnapshots | None = None) -> None:
        self.etcd = etcd
        self.keys = keys
        self.local = local  # snapshots loaded from etcd are kept there too

    # the controller's side --------------------------------------------------------------------
    async def end_offset(self) -> int:
        kv = await self.etcd.get(self.keys.log_end)
        return int(kv.value) if kv is not None else 0

    def _end_compare(self, end: int) -> list[Compare]:
        return [Compare.absent(self.keys.log_end) if end == 0 else Compare.value_is(self.keys.log_end, b"%d" % end)]

    def _diagnose(self) -> list[TxnOp]:
        return [Get(self.keys.controller_epoch), Get(self.keys.controller), Get(self.keys.log_end)]

    def _refusal(self, leadership: Leadership, responses: list[Any]) -> Exception:
        epoch_kvs, controller_kvs, end_kvs = responses
        epoch_kv = epoch_kvs[0] if epoch_kvs else None
        controller_kv = controller_kvs[0] if controller_kvs else None
        if (epoch_kv is None or epoch_kv.mod_revision != leadership.revision or controller_kv is None
                or controller_kv.create_revision != leadership.revision):
            holder = json.loads(controller_kv.value).get("node_id", -1) if controller_kv is not None else -1
            epoch = int(epoch_kv.value) if epoch_kv is not None else -1
            return NotController("node %d is no longer the controller of epoch %d (epoch now %d, controller %d)"
                                 % (leadership.node_id, leadership.epoch, epoch, holder), epoch, holder)
        return StaleEndOffset(-1, int(end_kvs[0].value) if end_kvs else 0)

    async def append(self, leadership: Leadership, records: Sequence[bytes], expected_end: int) -> int:
        """Append `records` at `expected_end` (where the caller's image is); returns the new end.
        NotController when fenced, StaleEndOffset when the log moved, EtcdUnavailable when etcd
        could not answer (the records may or may not be in the log: a reader will tell)."""
        if not records:
            return expected_end
        end = expected_end
        for group in _groups(_split(records, expected_end, leadership.epoch)):
            new_end = group[-1][0] + len(decode_batch(group[-1][1]).records)
            ops: list[TxnOp] = [Put(self.keys.log_key(base), value) for base, value in group]
            ops.append(Put(self.keys.log_end, b"%d" % new_end))
            result = await self.etcd.txn(self.keys.fence(leadership) + self._end_compare(end), ops, self._diagnose())
            if not result.succeeded:
                error = self._refusal(leadership, result.responses)
                if isinstance(error, StaleEndOffset):
                    error = StaleEndOffset(end, error.actual)
                raise error
            end = new_end
        return end

    async def write_snapshot(self, leadership: Leadership, snapshot: Snapshot) -> int:
        """Store a snapshot (chunks, then its manifest); returns the manifest's revision."""
        blob = encode_batch(snapshot.epoch, snapshot.end_offset, snapshot.records)
        chunks = [(i, blob[pos:pos + MAX_VALUE_BYTES]) for i, pos in enumerate(range(0, len(blob), MAX_VALUE_BYTES))]
        fence = self.keys.fence(leadership)
        for group in _groups(chunks):
            ops: list[TxnOp] = [Put(self.keys.chunk_key(snapshot.end_offset, i), data) for i, data in group]
            result = await self.etcd.txn(fence, ops, self._diagnose())
            if not result.succeeded:
                raise self._refusal(leadership, result.responses)
        manifest = json.dumps({"end_offset": snapshot.end_offset, "epoch": snapshot.epoch, "chunks": len(chunks),
                               "size": len(blob), "crc32": zlib.crc32(blob)}).encode()
        result = await self.etcd.txn(fence, [Put(self.keys.snapshot, manifest)], self._diagnose())
        if not result.succeeded:
            raise self._refusal(leadership, result.responses)
        return result.revision

    async def delete_behind(self, leadership: Leadership, end_offset: int, compact: bool = True) -> int:
        """Delete the batches wholly before `end_offset` (a snapshot's end) and the chunks of older
        snapshots, then compact etcd's history there; returns the deletion's revision."""
        below = await self.etcd.range(self.keys.log, self.keys.log_key(end_offset), limit=1, descending=True)
        upto = end_offset
        if below.kvs and decode_batch(below.kvs[0].value).end_offset > end_offset:
            upto = decode_batch(below.kvs[0].value).base_offset  # never cut a batch
        ops: list[TxnOp] = [DeleteRange(self.keys.log, self.keys.log_key(upto)),
                            DeleteRange(self.keys.snapshot_chunks, self.keys.chunk_prefix(end_offset))]
        result = await self.etcd.txn(self.keys.fence(leadership), ops, self._diagnose())
        if not result.succeeded:
            raise self._refusal(leadership, result.responses)
        if compact:
            await self.etcd.compact(result.revision)
        return result.revision

    # every node's side ------------------------------------------------------------------------
    async def read_snapshot(self, revision: int = 0) -> Snapshot | None:
        found = await self.etcd.range(self.keys.snapshot, revision=revision)
        if not found.kvs:
            return None
        manifest = json.loads(found.kvs[0].value)
        end = int(manifest["end_offset"])
        parts: list[KeyValue] = []
        start = self.keys.chunk_prefix(end)
        while True:  # a few chunks per request: each may be MAX_VALUE_BYTES
            page = await self.etcd.range(start, prefix_end(self.keys.chunk_prefix(end)), limit=4,
                                         revision=found.revision)
            parts += page.kvs
            if not page.more or not page.kvs:
                break
            start = page.kvs[-1].key + b"\0"
        blob = b"".join(kv.value for kv in parts)
        if len(parts) != manifest["chunks"] or len(blob) != manifest["size"] or zlib.crc32(blob) != manifest["crc32"]:
            raise MetadataLogError("the snapshot at %d in etcd is incomplete or corrupt" % end)
        decoded = decode_batch(blob)
        return Snapshot(decoded.base_offset, decoded.epoch, decoded.records)

    async def read(self, from_offset: int, retry_delay: float = 0.2) -> AsyncGenerator[Batch | Snapshot, None]:
        """Everything after `from_offset`, in order, once, then what is appended, forever: batches,
        and a Snapshot first when `from_offset` is behind the log's start (replace the image with
        it). Waits out etcd's absences; raises MetadataLogError when the log cannot continue."""
        position = from_offset
        while True:
            try:
                listing = _Listing()
                async for item in self._catch_up(position, listing):
                    yield item
                    position = item.end_offset
                async for watched in resumable_watch(self.etcd, self.keys.log, prefix_end(self.keys.log),
                                                     listing.revision + 1):
                    for event in watched.events:
                        if event.type is not EventType.PUT:
                            continue  # batches deleted behind a snapshot
                        batch = decode_batch(event.kv.value)
                        if batch.end_offset <= position:
                            continue
                        if batch.base_offset > position:
                            raise MetadataLogError("metadata log gap: batch at %d while at %d"
                                                   % (batch.base_offset, position))
                        batch = _trim(batch, position)
                        yield batch
                        position = batch.end_offset
            except EtcdCompacted:
                continue  # history gone while away: list again from the position
            except EtcdUnavailable:
                await asyncio.sleep(retry_delay)

    async def _catch_up(self, position: int, listing: _Listing) -> AsyncIterator[Batch | Snapshot]:
        """What the log holds after `position`, all read at one revision (kept in `listing`)."""
        head = await self.etcd.range(self.keys.log_end)
        revision = listing.revision = head.revision
        end = int(head.kvs[0].value) if head.kvs else 0
        if position > end:
            raise MetadataLogError("this node's metadata is at offset %d but the log in etcd ends at %d "
                                   "(was etcd's data replaced?)" % (position, end))
        below = await self.etcd.range(self.keys.log, self.keys.log_key(position + 1), limit=1, descending=True,
                                      revision=revision)
        start = self.keys.log_key(position)
        if below.kvs and decode_batch(below.kvs[0].value).end_offset > position:
            start = below.kvs[0].key
        loaded = False
        while True:
            page = await self.etcd.range(start, prefix_end(self.keys.log), limit=PAGE_SIZE, revision=revision)
            for kv in page.kvs:
                batch = decode_batch(kv.value)
                if batch.end_offset <= position:
                    continue
                if batch.base_offset > position:
                    if loaded:
                        raise MetadataLogError("metadata log gap: batch at %d while at %d"
                                               % (batch.base_offset, position))
                    snapshot = await self._load_snapshot(position, revision)
                    loaded = True
                    yield snapshot
                    position = snapshot.end_offset
                    if batch.end_offset <= position:
                        continue
                batch = _trim(batch, position)
                yield batch
                position = batch.end_offset
            if not page.more or not page.kvs:
                break
            start = page.kvs[-1].key + b"\0"
        if position < end and not loaded:
            snapshot = await self._load_snapshot(position, revision)
            yield snapshot
            position = snapshot.end_offset
        if position < end:
            raise MetadataLogError("the metadata log in etcd ends at %d but holds records only to %d" % (end, position))

    async def _load_snapshot(self, position: int, revision: int) -> Snapshot:
        snapshot = await self.read_snapshot(revision)
        if snapshot is None or snapshot.end_offset <= position:
            raise MetadataLogError("metadata log gap after offset %d and no snapshot covers it" % position)
        if self.local is not None:
            await asyncio.to_thread(self.local.save, snapshot)
        return snapshot


class _Listing:
    revision = 0


def _trim(batch: Batch, position: int) -> Batch:
    if batch.base_offset >= position:
        return batch
    return Batch(position, batch.epoch, batch.records[position - batch.base_offset:])


class LocalSnapshots:
    """A node's last snapshot of the metadata, in its metadata log directory
    (`<20-digit end offset>.etcd-snapshot`: magic, crc32, the batch encoding)."""

    SUFFIX = ".etcd-snapshot"
    MAGIC = b"KMS0"
    KEEP = 2

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def save(self, snapshot: Snapshot) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        blob = encode_batch(snapshot.epoch, snapshot.end_offset, snapshot.records)
        path = self.directory / ("%020d%s" % (snapshot.end_offset, self.SUFFIX))
        write_atomic(str(path), self.MAGIC + struct.pack(">I", zlib.crc32(blob)) + blob)
        for old in self._files()[:-self.KEEP]:
            os.unlink(old)
        return path

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob("*" + self.SUFFIX)) if self.directory.is_dir() else []

    def latest(self) -> Snapshot | None:
        """The newest readable snapshot (a torn or corrupt file is skipped)."""
        for path in reversed(self._files()):
            data = path.read_bytes()
            if data[:4] != self.MAGIC or len(data) < 8 or struct.unpack(">I", data[4:8])[0] != zlib.crc32(data[8:]):
                continue
            batch = decode_batch(data[8:])
            return Snapshot(batch.base_offset, batch.epoch, batch.records)
        return None
