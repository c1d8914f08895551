"""Validation of produced records before they reach the log (Kafka's analyzeAndValidateRecords and
LogValidator, at batch level).

Everything is decided from the batch headers and the CRC, so a 1 MiB batch costs one C CRC pass
and no per-record Python work. Deviations from Kafka, on purpose:
- record timestamps are checked through the header (maxTimestamp for the future bound,
  baseTimestamp for the past bound), not record by record;
- record offset deltas are trusted to match lastOffsetDelta (the CRC covers both);
- a trailing partial batch is CORRUPT_MESSAGE (Kafka silently ignores it).
Compacted topics additionally decode each batch to require keys, as Kafka does. Record-level
failures (a key missing on a compacted topic, a timestamp out of range) name each failing record
(KIP-467: `RecordValidationError`), so that clients fail only those records; the records are
decoded for that only when the header says some record is out of range.
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


class RecordValidationError(KafkaError):
    """Some records of the batch are invalid (Kafka's RecordValidationException): the batch fails
    with the batch index and reason of each, and Kafka's summary as the error message."""

    def __init__(self, code: ErrorCode, record_errors: list[tuple[int, str]]) -> None:
        if code is ErrorCode.INVALID_TIMESTAMP:
            message = "One or more records have been rejected due to invalid timestamp"
        else:
            shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in record_errors[:3])
            message = (f"One or more records have been rejected due to {len(record_errors)} record errors in "
                       f"total, and only showing the first three errors at most: [{shown}]")
        super().__init__(code, message)
        self.record_errors = record_errors
        self.log_start_offset = -1  # the log fills it in: Kafka answers it with record errors


def validate_records(
    buf: Buffer, config: LogConfig, origin: AppendOrigin, now_ms: int, topic_partition: str = "",
    crc_checked: bool = False,
) -> list[tuple[int, BatchHeader]]:
    """(position, header) of each batch, or a KafkaError with Kafka's error code for the whole set
    (a RecordValidationError when only some records are at fault). `topic_partition` ("t-0")
    is named in the record errors as Kafka names it. `crc_checked`: the caller passed every batch
    through validate_batch already (a producer's batches, checked before their sequence is)."""
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
        if client and not crc_checked:  # the broker's own batches were just built, CRC included
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
        for pos, header in out:
            check_client_batch(header)
            timestamps_ok = _check_timestamps(header, config, now_ms)
            if config.compact or not timestamps_ok:
                _check_records(buf, pos, config, now_ms, topic_partition)
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


def _check_timestamps(header: BatchHeader, config: LogConfig, now_ms: int) -> bool:
    """From the header alone: False when some record may be out of the accepted time range."""
    if header.attributes & TIMESTAMP_TYPE_MASK:
        if config.log_append_time or header.max_timestamp < 0:
            raise KafkaError(
                ErrorCode.INVALID_TIMESTAMP, "producers must not set the LogAppendTime timestamp type"
            )
        return True
    if config.log_append_time:
        return True
    after = config.message_timestamp_after_max_ms
    if header.max_timestamp >= 0 and after < LONG_MAX and header.max_timestamp - now_ms > after:
        return False
    before = config.message_timestamp_before_max_ms
    return not (header.base_timestamp >= 0 and before < LONG_MAX and now_ms - header.base_timestamp > before)


def _check_records(buf: Buffer, pos: int, config: LogConfig, now_ms: int, topic_partition: str) -> None:
    """Kafka's per-record checks (LogValidator.validateRecord): the key on a compacted topic, then
    the timestamp; every failing record is named by its index in the batch."""
    try:
        _, records = decode_batch(buf, pos, verify_crc=False)
    except ProtocolError as e:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    before, after = config.message_timestamp_before_max_ms, config.message_timestamp_after_max_ms
    check_time = not config.log_append_time
    errors: list[tuple[int, str]] = []
    bad_time = False
    for index, record in enumerate(records):
        if config.compact and record.key is None:
            errors.append((index, f"Compacted topic cannot accept message without key in topic partition "
                                  f"{topic_partition}"))
        elif check_time and record.timestamp >= 0 and (
            now_ms - record.timestamp > before or record.timestamp - now_ms > after
        ):
            bad_time = True
            errors.append((index, f"Timestamp {record.timestamp} of message with offset {record.offset} is out "
                                  f"of range. The timestamp should be within [{now_ms - before}, {now_ms + after}]"))
    if errors:
        raise RecordValidationError(ErrorCode.INVALID_TIMESTAMP if bad_time else ErrorCode.INVALID_RECORD, errors)
