"""Reading a whole log back as records: how internal topics (metadata, coordinators) are replayed."""

from __future__ import annotations

from collections.abc import Iterator

from broker.log.log import Log
from protocol.records import BatchHeader, Record, decode_batch, iter_batches

_READ_CHUNK = 1 << 20


def iter_records(log: Log) -> Iterator[Record]:
    """Every data record from the log start offset to the log end (control batches skipped)."""
    for header, records in iter_batch_records(log):
        if not header.is_control:
            yield from records


def iter_batch_records(log: Log) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """Every batch from the log start offset to the log end, control batches too, with its records
    at or after the log start."""
    offset = log.log_start_offset
    end = log.log_end_offset
    while offset < end:
        data = log.read_bytes(offset, _READ_CHUNK)
        if not data:
            break
        for pos, header in iter_batches(data):
            if header.next_offset <= offset:
                continue  # the part of a compacted batch before the start offset
            _, records = decode_batch(data, pos)
            yield header, [r for r in records if r.offset >= offset]
            offset = header.next_offset
