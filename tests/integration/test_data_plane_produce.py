"""Produce (v3-v13) and idempotent producers with raw frames against an in-process broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from protocol import messages as M
from protocol.compression import ZSTD
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.harness import RawClient
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    API_VERSIONS,
    PRODUCE,
    BrokerThread,
    batch,
    broker_thread_fixture,
    client_fixture,
    fetch_one,
    init_producer_id,
    produce,
    produce_request,
    records_of,
)


def fetched_values(c: RawClient, topic: str, partition: int = 0, offset: int = 0) -> list[bytes | None]:
    return [r.value for r in records_of(fetch_one(c, topic, partition, offset).records)]


@pytest.mark.parametrize("version", range(3, 14))
def test_produce_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    info = broker_thread.create_topic("p", 2)
    request = produce_request("p" if version < 13 else "", 1, batch([b"a", b"b"]), topic_id=info.topic_id)
    response = client.call(PRODUCE, version, request)
    topic = response.responses[0]
    if version >= 13:
        assert topic.topic_id == info.topic_id
    else:
        assert topic.name == "p"
    part = topic.partition_responses[0]
    assert (part.index, part.error_code, part.base_offset) == (1, 0, 0)
    assert part.log_append_time_ms == -1  # CreateTime topic
    if version >= 5:
        assert part.log_start_offset == 0
    assert client.call(PRODUCE, version, request).responses[0].partition_responses[0].base_offset == 2
    assert fetched_values(client, "p", 1) == [b"a", b"b", b"a", b"b"]


def test_produce_unknown_topic_and_partition(broker_thread: BrokerThread, client: RawClient) -> None:
    info = broker_thread.create_topic("known", 1)
    assert produce(client, "nope", 0, batch([b"x"])).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert produce(client, "known", 5, batch([b"x"])).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    import uuid

    request = produce_request("", 0, batch([b"x"]), topic_id=uuid.uuid4())
    part = client.call(PRODUCE, 13, request).responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.UNKNOWN_TOPIC_ID
    request = produce_request("", 0, batch([b"x"]), topic_id=info.topic_id)
    assert client.call(PRODUCE, 13, request).responses[0].partition_responses[0].error_code == 0


def test_produce_many_partitions_in_one_request(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("multi", 3)
    R = M.ProduceRequest
    request = R(acks=-1, timeout_ms=1000, topic_data=[
        R.TopicProduceData(name="multi", partition_data=[
            R.PartitionProduceData(index=p, records=batch([b"v%d" % p] * (p + 1))) for p in (2, 0, 1)
        ]),
        R.TopicProduceData(name="missing", partition_data=[R.PartitionProduceData(index=0, records=batch([b"x"]))]),
    ])
    response = client.call(PRODUCE, 9, request)
    parts = response.responses[0].partition_responses
    assert [(p.index, p.error_code, p.base_offset) for p in parts] == [(2, 0, 0), (0, 0, 0), (1, 0, 0)]
    assert response.responses[1].partition_responses[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert [fetch_one(client, "multi", p, 0).high_watermark for p in range(3)] == [1, 2, 3]


@pytest.mark.parametrize("acks", [1, -1])
def test_produce_acks(broker_thread: BrokerThread, client: RawClient, acks: int) -> None:
    broker_thread.create_topic("acks", 1)
    assert produce(client, "acks", 0, batch([b"x"]), acks=acks).error_code == 0
    assert fetched_values(client, "acks") == [b"x"]


def test_produce_acks_zero_sends_no_response(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("acks0", 1)
    for i in range(3):
        client.send(PRODUCE, 9, produce_request("acks0", 0, batch([b"%d" % i]), acks=0))
    # the next response on the connection is the ApiVersions one: the produces had none
    assert client.call(API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="t", client_software_version="1")) \
        .error_code == 0
    assert fetched_values(client, "acks0") == [b"0", b"1", b"2"]


def test_produce_acks_zero_failure_closes_the_connection(broker_thread: BrokerThread, client: RawClient) -> None:
    client.send(PRODUCE, 9, produce_request("no-such-topic", 0, batch([b"x"]), acks=0))
    assert client.is_closed()  # the only way a fire-and-forget producer learns of the error


@pytest.mark.parametrize("acks", [2, -2, 3])
def test_produce_invalid_acks(broker_thread: BrokerThread, client: RawClient, acks: int) -> None:
    broker_thread.create_topic("bad-acks", 1)
    part = produce(client, "bad-acks", 0, batch([b"x"]), acks=acks)
    assert part.error_code == ErrorCode.INVALID_REQUIRED_ACKS
    assert fetch_one(client, "bad-acks", 0, 0).high_watermark == 0


@pytest.mark.parametrize(
    ("records", "code"),
    [
        (None, ErrorCode.INVALID_RECORD),
        (b"", ErrorCode.INVALID_RECORD),
        (batch([b"a"]) + batch([b"b"]), ErrorCode.INVALID_RECORD),  # exactly one batch per partition
        (build_batch([(None, b"a")], base_offset=5), ErrorCode.INVALID_RECORD),
        (batch([b"a"])[:40], ErrorCode.INVALID_RECORD),  # incomplete: no batch at all
        (b"\x00" * 8 + b"\x00\x00\x00\x05\x00\x00\x00\x00\x02" + b"\x00" * 60, ErrorCode.CORRUPT_MESSAGE),  # bad size
    ],
)
def test_produce_invalid_records(broker_thread: BrokerThread, client: RawClient, records: bytes | None,
                                 code: ErrorCode) -> None:
    broker_thread.create_topic("inv", 1)
    assert produce(client, "inv", 0, records).error_code == code  # type: ignore[arg-type]
    assert fetch_one(client, "inv", 0, 0).high_watermark == 0


def test_zstd_needs_produce_v7(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("zstd", 1)
    records = build_batch([(None, b"z" * 100)], compression=ZSTD)
    assert produce(client, "zstd", 0, records, version=6).error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert produce(client, "zstd", 0, records, version=7).error_code == 0
    assert fetched_values(client, "zstd") == [b"z" * 100]


def test_message_too_large(tmp_path: Path) -> None:
    with BrokerThread(tmp_path, **{"message.max.bytes": "100000"}) as bt:
        bt.create_topic("big", 1, {"max.message.bytes": "2000"})
        bt.create_topic("default", 1)  # the broker's message.max.bytes applies
        c = bt.client()
        now = int(time.time() * 1000)

        def sized(total: int) -> bytes:
            return next(b for n in range(total - 100, total)
                        if len(b := build_batch([(None, b"x" * n, (), now)])) == total)

        for topic, limit in (("big", 2000), ("default", 100_000)):
            at_limit, over = sized(limit), sized(limit + 1)  # the whole batch counts, as in Kafka
            assert produce(c, topic, 0, over).error_code == ErrorCode.MESSAGE_TOO_LARGE
            assert produce(c, topic, 0, at_limit).error_code == 0
        c.close()


# -- idempotent producers ------------------------------------------------------------------------------


def idem(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    return build_batch([(None, v) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_init_producer_id_versions(client: RawClient) -> None:
    ids = {init_producer_id(client, v)[0] for v in range(0, 6)}
    assert len(ids) == 6  # a new id every time
    response = client.call(22, 4, M.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1000,
                                                          producer_id=-1, producer_epoch=-1))
    assert response.error_code == 0 and response.producer_epoch == 0


def test_idempotent_sequence_checks(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("idem", 1)
    pid, epoch = init_producer_id(client)
    assert produce(client, "idem", 0, idem([b"a"], pid, epoch, 0)).base_offset == 0
    assert produce(client, "idem", 0, idem([b"b", b"c"], pid, epoch, 1)).base_offset == 1
    # a retry of either batch (lost response) is answered with the original offset, not written again
    dup = produce(client, "idem", 0, idem([b"a"], pid, epoch, 0))
    assert (dup.error_code, dup.base_offset) == (0, 0)
    assert produce(client, "idem", 0, idem([b"b", b"c"], pid, epoch, 1)).base_offset == 1
    # a gap, or a sequence overlapping a batch differently, is out of order
    assert produce(client, "idem", 0, idem([b"x"], pid, epoch, 5)).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(client, "idem", 0, idem([b"x"], pid, epoch, 2)).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(client, "idem", 0, idem([b"d"], pid, epoch, 3)).base_offset == 3
    # a bumped epoch starts again at sequence 0; the old epoch is then fenced
    assert produce(client, "idem", 0, idem([b"e"], pid, epoch + 1, 1)).error_code == \
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(client, "idem", 0, idem([b"e"], pid, epoch + 1, 0)).base_offset == 4
    assert produce(client, "idem", 0, idem([b"f"], pid, epoch, 4)).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    # other producers are independent
    other, _ = init_producer_id(client)
    assert produce(client, "idem", 0, idem([b"g"], other, 0, 0)).base_offset == 5
    assert fetched_values(client, "idem") == [b"a", b"b", b"c", b"d", b"e", b"g"]


def test_only_the_last_five_batches_are_deduplicated(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("five", 1)
    pid, epoch = init_producer_id(client)
    for seq in range(7):
        assert produce(client, "five", 0, idem([b"%d" % seq], pid, epoch, seq)).base_offset == seq
    for seq in range(2, 7):
        assert produce(client, "five", 0, idem([b"%d" % seq], pid, epoch, seq)).base_offset == seq
    for seq in (0, 1):
        part = produce(client, "five", 0, idem([b"%d" % seq], pid, epoch, seq))
        assert part.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert fetch_one(client, "five", 0, 0).high_watermark == 7


def test_corrupt_idempotent_batch_is_corrupt_message(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("idem-crc", 1)
    pid, epoch = init_producer_id(client)
    assert produce(client, "idem-crc", 0, idem([b"a"], pid, epoch, 0)).error_code == 0
    bad = bytearray(idem([b"b"], pid, epoch, 7))  # out of order AND corrupt: corruption is reported
    bad[-1] ^= 1
    assert produce(client, "idem-crc", 0, bytes(bad)).error_code == ErrorCode.CORRUPT_MESSAGE
    assert produce(client, "idem-crc", 0, idem([b"b"], pid, epoch, 1)).base_offset == 1


def test_producer_state_is_rebuilt_after_restart(tmp_path: Path) -> None:
    with BrokerThread(tmp_path) as bt:
        bt.create_topic("durable-idem", 2)
        c = bt.client()
        pid, epoch = init_producer_id(c)
        for seq in range(3):
            assert produce(c, "durable-idem", 1, idem([b"%d" % seq, b"x"], pid, epoch, seq * 2)).error_code == 0
        c.close()
    with BrokerThread(tmp_path) as bt:
        c = bt.client()
        # retries of batches acknowledged before the restart: the original offsets, nothing new
        assert produce(c, "durable-idem", 1, idem([b"2", b"x"], pid, epoch, 4)).base_offset == 4
        assert produce(c, "durable-idem", 1, idem([b"1", b"x"], pid, epoch, 2)).base_offset == 2
        assert produce(c, "durable-idem", 1, idem([b"z"], pid, epoch, 9)).error_code == \
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(c, "durable-idem", 1, idem([b"3"], pid, epoch, 6)).base_offset == 6
        assert fetch_one(c, "durable-idem", 1, 0).high_watermark == 7
        # new producer ids do not reuse the ones handed out before the restart
        assert init_producer_id(c)[0] != pid
        c.close()


def test_log_append_time_topic(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("lat", 1, {"message.timestamp.type": "LogAppendTime"})
    records = build_batch([(None, b"a", (), 1000), (None, b"b", (), 2000)])
    part = produce(client, "lat", 0, records)
    assert part.error_code == 0 and part.log_append_time_ms > 1000
    got = records_of(fetch_one(client, "lat", 0, 0).records)
    assert [r.timestamp for r in got] == [part.log_append_time_ms] * 2


def test_idle_producers_expire(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("expire", 1)
    pid, epoch = init_producer_id(client)
    two_days_ago = int(time.time() * 1000) - 2 * 86_400_000
    old = build_batch([(None, b"old", (), two_days_ago)], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    assert produce(client, "expire", 0, old).base_offset == 0
    assert produce(client, "expire", 0, idem([b"gap"], pid, epoch, 5)).error_code == \
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER

    async def expire() -> None:  # the broker's periodic job, run now on its loop
        broker_thread.broker._expire_producers()

    broker_thread.call(expire())
    # forgotten (producer.id.expiration.ms is a day): its next sequence is accepted as a new producer's
    assert produce(client, "expire", 0, idem([b"gap"], pid, epoch, 5)).base_offset == 1


def test_disk_errors_are_kafka_storage_errors(broker_thread: BrokerThread, client: RawClient,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    broker_thread.create_topic("disk", 1)
    partition = broker_thread.broker.partitions.get("disk", 0)

    def failing(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(partition, "append_records", failing)
    monkeypatch.setattr(partition, "read", failing)
    assert produce(client, "disk", 0, batch([b"x"])).error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert fetch_one(client, "disk", 0, 0).error_code == ErrorCode.KAFKA_STORAGE_ERROR
    monkeypatch.undo()
    assert produce(client, "disk", 0, batch([b"x"])).base_offset == 0  # the same connection goes on
