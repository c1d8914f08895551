"""Produce (key 0) and InitProducerId (key 22) for idempotent producers."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.apis.registry import api
from protocol.errors import ErrorCode, KafkaError
from protocol.messages import InitProducerIdResponse, ProduceResponse

R = ProduceResponse


def _partition_error(index: int, code: ErrorCode, message: str | None = None) -> Any:
    return R.PartitionProduceResponse(
        index=index, error_code=int(code), base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
        error_message=message,
    )


async def _produce_partition(broker: Any, topic: str | None, index: int, records: Any) -> Any:
    partition = broker.partitions.get(topic, index) if topic is not None else None
    if partition is None:
        return _partition_error(index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    if records is None or len(records) == 0:
        return _partition_error(index, ErrorCode.CORRUPT_MESSAGE, "no records")
    try:
        result = await partition.append(records)
    except KafkaError as exc:
        return _partition_error(index, exc.code, exc.message)
    broker.metrics.bytes_in.inc(len(records))
    return R.PartitionProduceResponse(
        index=index, error_code=0, base_offset=result.base_offset, log_append_time_ms=result.log_append_time,
        log_start_offset=result.log_start_offset,
    )


@api(0)
async def handle_produce(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    if request.acks not in (0, 1, -1):
        code: ErrorCode | None = ErrorCode.INVALID_REQUIRED_ACKS
    elif request.transactional_id is not None:
        code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED  # transactions are not served yet
    else:
        code = None
    responses = []
    pending = []
    for topic in request.topic_data:
        if ctx.api_version >= 13:
            info = broker.metadata.topic_by_id(topic.topic_id)
            name = info.name if info is not None else None
            missing = ErrorCode.UNKNOWN_TOPIC_ID
        else:
            name = topic.name
            missing = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        out = R.TopicProduceResponse(name=topic.name, topic_id=topic.topic_id, partition_responses=[])
        responses.append(out)
        for p in topic.partition_data:
            if code is not None:
                out.partition_responses.append(_partition_error(p.index, code))
            elif name is None:
                out.partition_responses.append(_partition_error(p.index, missing))
            else:
                pending.append((out, _produce_partition(broker, name, p.index, p.records)))
    if pending:
        if len(pending) == 1:
            results = [await pending[0][1]]
        else:
            results = await asyncio.gather(*(c for _, c in pending))
        for (out, _), result in zip(pending, results):
            out.partition_responses.append(result)
    if request.acks == 0:
        # no response; Kafka closes the connection when a fire-and-forget produce failed
        if any(p.error_code for t in responses for p in t.partition_responses):
            ctx.connection.close()
        return None
    return R(responses=responses, throttle_time_ms=0)


@api(22)
async def handle_init_producer_id(ctx: Any, request: Any) -> Any:
    if request.transactional_id is not None:
        # transactional producers need the transaction coordinator, which is not served yet
        return InitProducerIdResponse(
            error_code=int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED), producer_id=-1, producer_epoch=-1
        )
    producer_id = ctx.broker.metadata.allocate_producer_id()
    return InitProducerIdResponse(error_code=0, producer_id=producer_id, producer_epoch=0)
