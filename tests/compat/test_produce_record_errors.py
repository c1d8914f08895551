"""Produce record errors (KIP-467) as real clients see them: on a compacted topic a batch holding
records without a key fails with INVALID_RECORD naming those records (batch index and Kafka's
message); confluent-kafka sees the batch refused, kafka-python reports the record's own reason; a timestamp out of range is INVALID_TIMESTAMP per record."""

from __future__ import annotations

import time
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError, Producer  # noqa: E402
from kafka import KafkaProducer  # noqa: E402
from kafka.errors import InvalidRecordError  # noqa: E402

from protocol import messages as M  # noqa: E402
from protocol.errors import ErrorCode  # noqa: E402
from protocol.records import build_batch  # noqa: E402
from tests.compat.conftest import CompatBroker, create_topic  # noqa: E402
from tests.harness import RawClient  # noqa: E402

KEY_ERROR = "Compacted topic cannot accept message without key in topic partition {}"


def test_confluent_sees_the_batch_refused_and_nothing_stored(kafka: CompatBroker) -> None:
    create_topic(kafka, "kip467-c", configs={"cleanup.policy": "compact"})
    reports: list[tuple[bytes | None, KafkaError | None]] = []
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 200, "retries": 0})
    for key in (b"a", None, b"c"):
        p.produce("kip467-c", b"v", key=key, partition=0,
                  on_delivery=lambda err, msg: reports.append((msg.key(), err)))
    assert p.flush(15) == 0
    errors = {key: err for key, err in reports}
    # librdkafka 2.16 through the Python binding reports the partition's code for every record
    # of the batch (the per-record message stays inside librdkafka)
    assert errors[None] is not None and errors[None].code() == KafkaError.INVALID_RECORD
    assert all(err is not None for err in errors.values())
    delivered: list[int] = []
    p.produce("kip467-c", b"v", key=b"k", partition=0, on_delivery=lambda err, msg: delivered.append(msg.offset()))
    assert p.flush(15) == 0 and delivered == [0]  # the refused batch left nothing behind


def test_kafka_python_gets_the_brokers_message(kafka: CompatBroker) -> None:
    create_topic(kafka, "kip467-k", configs={"cleanup.policy": "compact"})
    p = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, retries=0)
    try:
        future = p.send("kip467-k", b"v", partition=0)
        with pytest.raises(InvalidRecordError) as raised:
            future.get(timeout=15)
        assert KEY_ERROR.format("kip467-k-0") in str(raised.value)  # the record's own reason
        assert p.send("kip467-k", b"v", key=b"k", partition=0).get(timeout=15).offset == 0
    finally:
        p.close(timeout=5)


def test_the_response_names_each_record_as_kafka_does(kafka: CompatBroker) -> None:
    create_topic(kafka, "kip467-raw", configs={"cleanup.policy": "compact"})
    create_topic(kafka, "kip467-time", configs={"message.timestamp.after.max.ms": "60000"})
    c = RawClient(kafka.port, "kip467")
    try:
        def produce(topic: str, records: list[tuple[Any, ...]]) -> Any:
            batch = build_batch(records)
            R = M.ProduceRequest
            request = R(transactional_id=None, acks=1, timeout_ms=5000, topic_data=[R.TopicProduceData(
                name=topic, partition_data=[R.PartitionProduceData(index=0, records=batch)])])
            return c.call(0, 11, request).responses[0].partition_responses[0]  # Produce v11

        r = produce("kip467-raw", [(b"a", b"1"), (None, b"2"), (None, b"3")])
        message = KEY_ERROR.format("kip467-raw-0")
        assert r.error_code == ErrorCode.INVALID_RECORD
        assert [(e.batch_index, e.batch_index_error_message) for e in r.record_errors] == [(1, message), (2, message)]
        assert r.error_message == (
            "One or more records have been rejected due to 2 record errors in total, and only showing the first "
            f"three errors at most: [RecordError(batchIndex=1, message='{message}'), "
            f"RecordError(batchIndex=2, message='{message}')]")
        assert r.log_start_offset == 0 and r.base_offset == -1
        future = int(time.time() * 1000) + 3_600_000
        r = produce("kip467-time", [(None, b"now"), (None, b"late", [], future)])
        assert r.error_code == ErrorCode.INVALID_TIMESTAMP
        assert r.error_message == "One or more records have been rejected due to invalid timestamp"
        (err,) = r.record_errors
        assert err.batch_index == 1 and err.batch_index_error_message.startswith(
            f"Timestamp {future} of message with offset 1 is out of range. The timestamp should be within [")
    finally:
        c.close()
