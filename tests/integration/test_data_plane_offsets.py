"""ListOffsets, OffsetForLeaderEpoch and DeleteRecords with raw frames."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.harness import RawClient
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    DELETE_RECORDS,
    OFFSET_FOR_LEADER_EPOCH,
    BrokerThread,
    batch,
    broker_thread_fixture,
    client_fixture,
    fetch_one,
    list_offset,
    produce,
)

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


def produce_at(c: RawClient, topic: str, timestamps: list[int]) -> int:
    records = build_batch([(None, b"t%d" % ts, (), ts) for ts in timestamps])
    part = produce(c, topic, 0, records)
    assert part.error_code == 0
    return int(part.base_offset)


@pytest.mark.parametrize("version", range(1, 12))
def test_list_offsets_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("lo", 1)
    empty_latest = list_offset(client, "lo", 0, LATEST, version)
    assert (empty_latest.error_code, empty_latest.offset) == (0, 0)
    produce_at(client, "lo", [1000, 3000, 2000])
    produce_at(client, "lo", [4000])
    earliest = list_offset(client, "lo", 0, EARLIEST, version)
    latest = list_offset(client, "lo", 0, LATEST, version)
    assert (earliest.error_code, earliest.offset, earliest.timestamp) == (0, 0, -1)
    assert (latest.error_code, latest.offset, latest.timestamp) == (0, 4, -1)
    by_time = list_offset(client, "lo", 0, 2500, version)  # the first record at or after 2500
    assert (by_time.offset, by_time.timestamp) == (1, 3000)
    after_all = list_offset(client, "lo", 0, 5000, version)
    assert (after_all.error_code, after_all.offset, after_all.timestamp) == (0, -1, -1)
    if version >= 4:
        assert latest.leader_epoch == 0 and by_time.leader_epoch == 0
    if version >= 7:
        mx = list_offset(client, "lo", 0, MAX_TIMESTAMP, version)
        assert (mx.error_code, mx.offset, mx.timestamp) == (0, 3, 4000)


def test_max_timestamp_is_the_first_record_holding_it(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("mt", 1)
    produce_at(client, "mt", [10, 50, 20])
    produce_at(client, "mt", [50, 30])
    mx = list_offset(client, "mt", 0, MAX_TIMESTAMP)
    assert (mx.offset, mx.timestamp) == (1, 50)


def test_list_offsets_unknown_partition_and_epochs(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("lou", 1)
    assert list_offset(client, "nope", 0, LATEST).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert list_offset(client, "lou", 3, LATEST).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    R = M.ListOffsetsRequest
    request = R(replica_id=-1, isolation_level=1, topics=[R.ListOffsetsTopic(name="lou", partitions=[
        R.ListOffsetsPartition(partition_index=0, current_leader_epoch=5, timestamp=LATEST),
        R.ListOffsetsPartition(partition_index=0, current_leader_epoch=0, timestamp=LATEST),
    ])])
    parts = client.call(2, 7, request).topics[0].partitions
    assert [p.error_code for p in parts] == [ErrorCode.UNKNOWN_LEADER_EPOCH, 0]


def test_list_offsets_read_committed_latest(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("lsc", 1)
    produce(client, "lsc", 0, batch([b"a", b"b"]))
    # no transactions yet: the last stable offset is the high watermark
    assert list_offset(client, "lsc", 0, LATEST, isolation_level=1).offset == 2


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("ofle", 2)
    produce(client, "ofle", 0, batch([b"a", b"b", b"c"]))
    R = M.OffsetForLeaderEpochRequest
    request = R(replica_id=-1, topics=[
        R.OffsetForLeaderTopic(topic="ofle", partitions=[
            R.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=0),
            R.OffsetForLeaderPartition(partition=1, current_leader_epoch=0, leader_epoch=0),  # empty
            R.OffsetForLeaderPartition(partition=0, current_leader_epoch=0, leader_epoch=7),  # a future epoch
            R.OffsetForLeaderPartition(partition=0, current_leader_epoch=3, leader_epoch=0),
            R.OffsetForLeaderPartition(partition=9, current_leader_epoch=-1, leader_epoch=0),
        ]),
    ])
    parts = client.call(OFFSET_FOR_LEADER_EPOCH, version, request).topics[0].partitions
    got = [(p.error_code, p.leader_epoch, p.end_offset) for p in parts]
    assert got == [
        (0, 0, 3),
        (0, 0, 0),
        (0, -1, -1),
        (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1),
    ]


def delete_records(c: RawClient, topic: str, partition: int, offset: int, version: int = 2) -> object:
    R = M.DeleteRecordsRequest
    request = R(timeout_ms=5000, topics=[R.DeleteRecordsTopic(name=topic, partitions=[
        R.DeleteRecordsPartition(partition_index=partition, offset=offset)])])
    return c.call(DELETE_RECORDS, version, request).topics[0].partitions[0]


@pytest.mark.parametrize("version", [0, 1, 2])
def test_delete_records_then_fetch_below_is_out_of_range(broker_thread: BrokerThread, client: RawClient,
                                                         version: int) -> None:
    broker_thread.create_topic("dr", 1)
    for i in range(4):
        produce(client, "dr", 0, batch([b"%d" % i]))
    result = delete_records(client, "dr", 0, 2, version)
    assert (result.error_code, result.low_watermark) == (0, 2)  # type: ignore[attr-defined]
    assert fetch_one(client, "dr", 0, 1).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    entry = fetch_one(client, "dr", 0, 2)
    assert entry.error_code == 0 and entry.log_start_offset == 2
    assert list_offset(client, "dr", 0, EARLIEST).offset == 2
    # -1 deletes up to the high watermark; beyond it is out of range; lowering is a no-op
    result = delete_records(client, "dr", 0, -1, version)
    assert (result.error_code, result.low_watermark) == (0, 4)  # type: ignore[attr-defined]
    assert delete_records(client, "dr", 0, 9, version).error_code == ErrorCode.OFFSET_OUT_OF_RANGE  # type: ignore[attr-defined]
    assert delete_records(client, "dr", 0, 1, version).low_watermark == 4  # type: ignore[attr-defined]
    assert delete_records(client, "nope", 0, 1, version).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[attr-defined]
    # producing goes on at the log end
    assert produce(client, "dr", 0, batch([b"next"])).base_offset == 4


def test_log_start_offset_survives_restart(tmp_path: Path) -> None:
    with BrokerThread(tmp_path) as bt:
        bt.create_topic("drr", 1)
        c = bt.client()
        for i in range(5):
            produce(c, "drr", 0, batch([b"%d" % i]))
        assert delete_records(c, "drr", 0, 3).low_watermark == 3  # type: ignore[attr-defined]
        c.close()
    with BrokerThread(tmp_path) as bt:
        c = bt.client()
        assert list_offset(c, "drr", 0, EARLIEST).offset == 3
        assert list_offset(c, "drr", 0, LATEST).offset == 5
        assert fetch_one(c, "drr", 0, 2).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        c.close()
