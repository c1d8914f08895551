"""Produce (key 0). Transactional batches are verified with the transaction coordinator before they
open a transaction in a partition (broker/apis/txn.py)."""

from __future__ import annotations

import asyncio
import itertools

from broker.apis.context import RequestContext
from broker.apis.registry import api
from broker.apis.txn import verify_transactional_produce
from broker.log.log import Buffer
from broker.log.validation import RecordValidationError
from broker.observability.logger import get_logger
from broker.partition import Partition
from broker.security.authz import Op, Res, authorize
from broker.security.quotas import ClientQuotas, throttle
from protocol import messages as M
from protocol.compression import ZSTD
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.records import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    MAGIC_OFFSET,
    TRANSACTIONAL_FLAG_MASK,
    iter_batches,
    parse_batch_header,
)

R = M.ProduceResponse
log = get_logger("broker.produce")


def _partition_error(index: int, code: ErrorCode, message: str | None = None) -> R.PartitionProduceResponse:
    return R.PartitionProduceResponse(
        index=index, error_code=int(code), base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
        error_message=message,
    )


def check_produce_records(version: int, records: Buffer | None) -> KafkaError | None:
    """Kafka's request-level checks of one partition's records: exactly one complete RecordBatch
    v2, and no zstd before v7 (the log validates the batch itself: CRC, sizes, timestamps)."""
    try:
        if records is not None and len(records) > MAGIC_OFFSET and records[MAGIC_OFFSET] in (0, 1):
            return KafkaError(ErrorCode.INVALID_RECORD, "Produce requests with version %d are only allowed to "
                              "contain record batches with magic version 2" % version)
        batches = list(itertools.islice(iter_batches(records or b""), 2))
    except ProtocolError as exc:
        return KafkaError(ErrorCode.CORRUPT_MESSAGE, str(exc))
    if not batches:
        return KafkaError(ErrorCode.INVALID_RECORD, "Produce requests with version %d must have at least one "
                          "record batch per partition" % version)
    if version < 7 and batches[0][1].compression == ZSTD:
        return KafkaError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, "Produce requests with version %d are not "
                          "allowed to use ZStandard compression" % version)
    if len(batches) > 1:
        return KafkaError(ErrorCode.INVALID_RECORD, "Produce requests with version %d are only allowed to "
                          "contain exactly one record batch per partition" % version)
    return None


def _is_transactional(records: Buffer | None) -> bool:
    """Whether the (first) batch is transactional data: the attributes' transactional bit (control
    batches, which clients may not write, are left to the log's checks)."""
    return records is not None and len(records) > ATTRIBUTES_OFFSET + 1 and (
        records[ATTRIBUTES_OFFSET + 1] & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)) == TRANSACTIONAL_FLAG_MASK


async def _produce_partition(ctx: RequestContext, partition: Partition, index: int, records: Buffer,
                             transactional_id: str | None, acks: int, timeout_ms: int) -> R.PartitionProduceResponse:
    broker = ctx.broker
    try:
        guard = None
        if _is_transactional(records):
            guard = await verify_transactional_produce(ctx, partition, parse_batch_header(records), transactional_id)
        result = await partition.append(records, guard, acks)
        code = ErrorCode.NONE
        if acks == -1 and not partition.leads_alone:
            # answered once the high watermark passes the batch (Kafka's DelayedProduce; the
            # offsets it was given stay in an answer with an error, as Kafka's do)
            required = result.base_offset + parse_batch_header(records).last_offset_delta + 1
            code = await partition.wait_replicated(required, max(timeout_ms, 0) / 1000.0)
    except RecordValidationError as exc:  # KIP-467: the client fails only the records named
        response = _partition_error(index, exc.code, exc.message)
        response.log_start_offset = exc.log_start_offset
        response.record_errors = [R.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                                  for i, m in exc.record_errors]
        return response
    except KafkaError as exc:
        return _partition_error(index, exc.code, exc.message)
    except OSError as exc:  # the disk failed the write or the fsync
        log.error("append failed", partition=repr(partition), error=str(exc))
        return _partition_error(index, ErrorCode.KAFKA_STORAGE_ERROR, str(exc))
    broker.metrics.bytes_in.inc(len(records))
    return R.PartitionProduceResponse(
        index=index, error_code=int(code), base_offset=result.base_offset, log_append_time_ms=result.log_append_time,
        log_start_offset=result.log_start_offset,
    )


@api(0)
async def handle_produce(ctx: RequestContext, request: M.ProduceRequest) -> M.ProduceResponse | None:
    broker = ctx.broker
    version = ctx.api_version
    # transactional records need the transactional id they are written for, with WRITE on it:
    # otherwise every partition fails
    tid = request.transactional_id
    fenced = (tid is None or not authorize(ctx, Op.WRITE, Res.TRANSACTIONAL_ID, tid)) and any(
        _is_transactional(p.records) for t in request.topic_data for p in t.partition_data)
    authorizer = broker.authorizer
    responses = []
    pending = []
    for topic in request.topic_data:
        name = broker.metadata.topic_name(topic.topic_id) if version >= 13 else topic.name
        out = R.TopicProduceResponse(name=topic.name, topic_id=topic.topic_id, partition_responses=[])
        responses.append(out)
        denied = authorizer is not None and name is not None and not authorize(ctx, Op.WRITE, Res.TOPIC, name)
        for p in topic.partition_data:
            # Kafka's order of checks: authorization, existence, the records, then acks
            partition = broker.partitions.get(name, p.index) if name is not None else None
            if fenced:
                out.partition_responses.append(_partition_error(p.index, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
            elif denied:
                out.partition_responses.append(_partition_error(p.index, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            elif partition is None:
                code = ErrorCode.UNKNOWN_TOPIC_ID if name is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                out.partition_responses.append(_partition_error(p.index, code))
            elif (error := check_produce_records(version, p.records)) is not None:
                out.partition_responses.append(_partition_error(p.index, error.code, error.message))
            elif request.acks not in (0, 1, -1):
                out.partition_responses.append(_partition_error(p.index, ErrorCode.INVALID_REQUIRED_ACKS))
            else:
                records = p.records
                assert records is not None  # checked: one record batch
                # a placeholder keeps the partitions in request order
                pending.append((out.partition_responses, len(out.partition_responses),
                                _produce_partition(ctx, partition, p.index, records, request.transactional_id,
                                                   request.acks, request.timeout_ms)))
                out.partition_responses.append(None)  # type: ignore[arg-type]  # replaced below
    if pending:
        if len(pending) == 1:
            results = [await pending[0][2]]
        else:
            results = await asyncio.gather(*(c for _, _, c in pending))
        for (slots, i, _), result in zip(pending, results):
            slots[i] = result
    quotas = broker.quotas
    throttle_ms = _produce_quota(ctx, quotas, request) if quotas is not None and quotas.active else 0
    if request.acks == 0:
        # no response; Kafka closes the connection when a fire-and-forget produce failed
        if any(p.error_code for t in responses for p in t.partition_responses):
            ctx.connection.close()
        throttle(ctx, None, throttle_ms)
        return None
    response = R(responses=responses, throttle_time_ms=0)
    throttle(ctx, response, throttle_ms)
    return response


def _produce_quota(ctx: RequestContext, quotas: ClientQuotas, request: M.ProduceRequest) -> int:
    """The producer_byte_rate throttle of this request (its record bytes count against the quota)."""
    size = sum(len(p.records) for t in request.topic_data for p in t.partition_data if p.records is not None)
    return int(quotas.record_produce(ctx, size))
