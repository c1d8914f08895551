"""Shared helpers for the integration tests (no tests here): a broker running in-process in a
background thread (broker.testing.EmbeddedBroker) and request builders for raw frames sent with
tests.harness.RawClient.

A test module registers the fixtures by importing them (`broker_thread_fixture`, `client_fixture`);
the tests then ask for `broker_thread` and `client`. The `*_fixture` names keep ruff's F811 quiet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.testing import EmbeddedBroker
from protocol import messages as M
from protocol.records import build_batch
from tests.harness import RawClient

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
DELETE_RECORDS, INIT_PRODUCER_ID, OFFSET_FOR_LEADER_EPOCH, API_VERSIONS = 21, 22, 23, 18


class BrokerThread(EmbeddedBroker):
    """broker.testing's EmbeddedBroker with its data in `tmp_path/data` (kept when it stops, for
    tests that start a second broker on it) and a RawClient factory.

    `overrides` are broker properties (`log_retention_hours="2"` or `**{"log.retention.hours": "2"}`).
    `__consumer_offsets` gets 1 partition unless asked otherwise. It serves on asyncio's event loop
    (test_server_zero_copy runs some tests on uvloop's too).
    """

    loop_factory = staticmethod(asyncio.new_event_loop)

    def __init__(self, tmp_path: Path, **overrides: str) -> None:
        self.tmp_path = tmp_path
        super().__init__({"log.dirs": str(tmp_path / "data"), "offsets.topic.num.partitions": "1"}, **overrides)

    def create_topic(self, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> Any:  # type: ignore[override]
        return self.call(self.broker.create_topic(name, partitions, configs or {}))

    def client(self, client_id: str = "raw-test") -> RawClient:
        return RawClient(self.port, client_id)


@pytest.fixture(name="broker_thread")
def broker_thread_fixture(tmp_path: Path) -> Iterator[BrokerThread]:
    """A fresh broker per test (import `broker_thread_fixture`; tests ask for `broker_thread`)."""
    with BrokerThread(tmp_path) as bt:
        yield bt


@pytest.fixture(name="client")
def client_fixture(broker_thread: BrokerThread) -> Iterator[RawClient]:
    """A RawClient connected to `broker_thread`."""
    with broker_thread.client() as c:
        yield c


# -- request builders ------------------------------------------------------------------------------


def batch(values: list[bytes | None], **kwargs: Any) -> bytes:
    """A RecordBatch v2 holding `values` (keys None) with build_batch's keyword options."""
    return build_batch([(None, v) for v in values], **kwargs)


def produce_request(
    topic: str, partition: int, records: bytes | None, acks: int = -1, topic_id: Any = None,
    transactional_id: str | None = None,
) -> Any:
    R = M.ProduceRequest
    data = R.TopicProduceData(name=topic, partition_data=[R.PartitionProduceData(index=partition, records=records)])
    if topic_id is not None:
        data.topic_id = topic_id
    return R(transactional_id=transactional_id, acks=acks, timeout_ms=30000, topic_data=[data])


def produce(
    client: RawClient, topic: str, partition: int, records: bytes, version: int = 9, acks: int = -1
) -> Any:
    """One partition's produce response."""
    response = client.call(PRODUCE, version, produce_request(topic, partition, records, acks))
    return response.responses[0].partition_responses[0]


def fetch_request(
    partitions: list[tuple[str, int, int]], max_wait_ms: int = 0, min_bytes: int = 0,
    max_bytes: int = 50 * 1024 * 1024, partition_max_bytes: int = 1024 * 1024, isolation_level: int = 0,
    topic_ids: dict[str, Any] | None = None,
) -> Any:
    """A full fetch (no session) of (topic, partition, offset) triples, grouped by topic in order."""
    R = M.FetchRequest
    topics: list[Any] = []
    for topic, partition, offset in partitions:
        if not topics or topics[-1].topic != topic:
            t = R.FetchTopic(topic=topic, partitions=[])
            if topic_ids is not None:
                t.topic_id = topic_ids[topic]
            topics.append(t)
        topics[-1].partitions.append(
            R.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=partition_max_bytes)
        )
    return R(
        max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=isolation_level,
        session_id=0, session_epoch=-1, topics=topics,
    )


def fetch_one(client: RawClient, topic: str, partition: int, offset: int, version: int = 12, **kwargs: Any) -> Any:
    """The single partition entry of a fetch of one partition."""
    response = client.call(FETCH, version, fetch_request([(topic, partition, offset)], **kwargs))
    assert response.error_code == 0
    return response.responses[0].partitions[0]


def list_offset(
    client: RawClient, topic: str, partition: int, timestamp: int, version: int = 7, isolation_level: int = 0
) -> Any:
    R = M.ListOffsetsRequest
    request = R(
        replica_id=-1, isolation_level=isolation_level,
        topics=[R.ListOffsetsTopic(name=topic, partitions=[
            R.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=timestamp)
        ])],
    )
    return client.call(LIST_OFFSETS, version, request).topics[0].partitions[0]


def metadata(client: RawClient, topics: list[str] | None, version: int = 12, allow_auto: bool = True) -> Any:
    R = M.MetadataRequest
    wanted = None if topics is None else [R.MetadataRequestTopic(name=t) for t in topics]
    return client.call(METADATA, version, R(topics=wanted, allow_auto_topic_creation=allow_auto))


def init_producer_id(client: RawClient, version: int = 4) -> tuple[int, int]:
    response = client.call(INIT_PRODUCER_ID, version, M.InitProducerIdRequest(transactional_id=None,
                                                                              transaction_timeout_ms=60000))
    assert response.error_code == 0
    return int(response.producer_id), int(response.producer_epoch)


def records_of(data: Any) -> list[Any]:
    """Every record in a fetched records field."""
    from protocol.records import decode_batch, iter_batches

    out: list[Any] = []
    raw = bytes(data)
    for pos, _ in iter_batches(raw):
        out.extend(decode_batch(raw, pos)[1])
    return out
