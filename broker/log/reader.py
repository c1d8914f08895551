"""Reading a whole log back as records: how internal topics (metadata, coordinators) are replayed."""

from __future__ import annotations

from collections.abc import Iterator

from broker.log.log import Log
from protocol.records import BatchHeader, Record, decode_batch, decode_batch_keys_values, iter_batches

_READ_CHUNK = 1 << 20

KeyValue = tuple[bytes | None, bytes | None]


def iter_records(log: Log) -> Iterator[Record]:
    """Every data record from the log start offset to the log end (control batches skipped)."""
    for header, records in iter_batch_records(log):
        if not header.is_control:
            yield from records


def iter_batch_records(log: Log) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """Every batch from the log start offset to the log end, control batches too, with its records
    at or after the log start."""
    for data, pos, header, start in _batches(log):
        _, records = decode_batch(data, pos)
        yield header, [r for r in records if r.offset >= start]


def iter_batch_keys_values(log: Log) -> Iterator[tuple[BatchHeader, list[KeyValue]]]:
    """iter_batch_records with each record as (key, value) alone: what replaying a coordinator's
    log needs, decoded without building offsets, timestamps and headers."""
    for data, pos, header, start in _batches(log):
        if header.base_offset >= start:
            yield header, decode_batch_keys_values(data, pos)[1]
        else:  # a compacted batch that began before the log start: only its records after it
            yield header, [(r.key, r.value) for r in decode_batch(data, pos)[1] if r.offset >= start]


def _batches(log: Log) -> Iterator[tuple[bytes, int, BatchHeader, int]]:
    """(bytes read, position in them, header, log start or the previous batch's end) of every batch
    that ends after the log start offset."""
    offset = log.log_start_offset
    end = log.log_end_offset
    while offset < end:
        data = log.read_bytes(offset, _READ_CHUNK)
        if not data:
            break
        for pos, header in iter_batches(data):
            if header.next_offset <= offset:
                continue  # the part of a compacted batch before the start offset
            yield data, pos, header, offset
            offset = header.next_offset
