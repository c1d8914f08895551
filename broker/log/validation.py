"""Validation of produced records before they reach the log (Kafka's analyzeAndValidateRecords and
LogValidator, at batch level).

Everything is decided from the batch headers and the CRC, so a 1 MiB batch costs one C CRC pass
and no per-record Python work. Deviations from Kafka, on purpose:
- record timestamps are checked through the header (maxTimestamp for the future bound,
  baseTimestamp for the past bound), not record by record;
- record offset deltas are trusted to match lastOffsetDelta (the CRC covers both);
- a trailing partial batch is CORRUPT_MESSAGE (Kafka silently ignores it).
Compacted topics additionally decode each batch to require keys, as Kafka does.
"""

from __future__ import annotations

import enum

from broker.log.config import LONG_MAX, LogConfig
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.records import (
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    check_client_batch,
    decode_batch,
    iter_batches,
    validate_batch,
)

Buffer = bytes | bytearray | memoryview


class AppendOrigin(enum.Enum):
    """Who appends: clients get Kafka's strict checks; the broker's own writers (coordinators,
    transaction markers) may write several batches and control batches."""

    CLIENT = "client"
    COORDINATOR = "coordinator"


def validate_records(
    buf: Buffer, config: LogConfig, origin: AppendOrigin, now_ms: int
) -> list[tuple[int, BatchHeader]]:
    """(position, header) of each batch, or a KafkaError with Kafka's error code for the whole set."""
    client = origin is AppendOrigin.CLIENT
    try:
        positions = list(iter_batches(buf, strict=True))
    except ProtocolError as e:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    out: list[tuple[int, BatchHeader]] = []
    for pos, header in positions:
        if client and header.base_offset != 0:
            raise KafkaError(
                ErrorCode.INVALID_RECORD, f"batch baseOffset must be 0, got {header.base_offset}"
            )
        check_batch_size(header.size, config)
        if client:  # the broker's own batches were just built, CRC included
            try:
                validate_batch(buf, pos)
            except ProtocolError as e:
                raise KafkaError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
        out.append((pos, header))
    if not out:
        return out
    if client:
        if len(out) > 1:
            raise KafkaError(ErrorCode.INVALID_RECORD, "a produced record set must hold exactly one batch")
        for _, header in out:
            check_client_batch(header)
            _check_timestamps(header, config, now_ms)
        if config.compact:
            _check_keys(buf, out)
    else:
        for _, header in out:
            if header.records_count > header.last_offset_delta + 1:
                raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "more records than offsets in a batch")
    check_record_set_size(sum(h.size for _, h in out), config)
    return out


def check_batch_size(size: int, config: LogConfig) -> None:
    if size > config.max_message_bytes:
        raise KafkaError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"record batch of {size} bytes exceeds max.message.bytes {config.max_message_bytes}",
        )


def check_record_set_size(size: int, config: LogConfig) -> None:
    if size > config.segment_bytes:
        raise KafkaError(
            ErrorCode.RECORD_LIST_TOO_LARGE,
            f"record set of {size} bytes exceeds segment.bytes {config.segment_bytes}",
        )


def _check_timestamps(header: BatchHeader, config: LogConfig, now_ms: int) -> None:
    if header.attributes & TIMESTAMP_TYPE_MASK:
        if config.log_append_time or header.max_timestamp < 0:
            raise KafkaError(
                ErrorCode.INVALID_TIMESTAMP, "producers must not set the LogAppendTime timestamp type"
            )
        return
    if config.log_append_time:
        return
    after = config.message_timestamp_after_max_ms
    if header.max_timestamp >= 0 and after < LONG_MAX and header.max_timestamp - now_ms > after:
        raise KafkaError(
            ErrorCode.INVALID_TIMESTAMP,
            f"timestamp {header.max_timestamp} is more than {after} ms ahead of the broker's clock",
        )
    before = config.message_timestamp_before_max_ms
    if header.base_timestamp >= 0 and before < LONG_MAX and now_ms - header.base_timestamp > before:
        raise KafkaError(
            ErrorCode.INVALID_TIMESTAMP,
            f"timestamp {header.base_timestamp} is more than {before} ms behind the broker's clock",
        )


def _check_keys(buf: Buffer, batches: list[tuple[int, BatchHeader]]) -> None:
    for pos, _ in batches:
        try:
            _, records = decode_batch(buf, pos, verify_crc=False)
        except ProtocolError as e:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
        if any(r.key is None for r in records):
            raise KafkaError(ErrorCode.INVALID_RECORD, "compacted topic cannot accept a record without a key")
