"""Fetch (v4-v18) with raw frames: long polling, size limits, errors, isolation, topic ids."""

from __future__ import annotations

import uuid

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    FETCH,
    BrokerThread,
    batch,
    broker_thread_fixture,
    client_fixture,
    fetch_one,
    fetch_request,
    produce,
    records_of,
)


def values(entry: object) -> list[bytes | None]:
    return [r.value for r in records_of(entry.records)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", range(4, 19))
def test_fetch_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    info = broker_thread.create_topic("f", 2)
    for i in range(3):
        assert produce(client, "f", 1, batch([b"%d" % i, None])).error_code == 0
    ids = {"f": info.topic_id} if version >= 13 else None
    request = fetch_request([("f", 0, 0), ("f", 1, 2)], topic_ids=ids)
    response = client.call(FETCH, version, request)
    if version >= 7:
        assert (response.error_code, response.session_id) == (0, 0)  # sessions declined
    [topic] = response.responses
    if version >= 13:
        assert topic.topic_id == info.topic_id
    else:
        assert topic.topic == "f"
    p0, p1 = topic.partitions
    assert (p0.partition_index, p0.error_code, p0.high_watermark, bytes(p0.records)) == (0, 0, 0, b"")
    assert (p1.partition_index, p1.error_code, p1.high_watermark) == (1, 0, 6)
    assert p1.last_stable_offset == 6
    if version >= 5:
        assert p1.log_start_offset == 0
    assert values(p1) == [b"1", None, b"2", None]
    assert [r.offset for r in records_of(p1.records)] == [2, 3, 4, 5]
    assert p1.aborted_transactions is None  # read_uncommitted
    assert p1.preferred_read_replica == -1 if version >= 11 else True


def test_records_are_never_null(broker_thread: BrokerThread, client: RawClient) -> None:
    info = broker_thread.create_topic("nn", 1)
    ids = {"nn": info.topic_id, "absent": uuid.uuid4()}
    for version in (4, 11, 12, 16):
        request = fetch_request([("nn", 0, 0), ("nn", 7, 0), ("absent", 0, 0)], topic_ids=ids)
        client.send(FETCH, version, request)
        size, raw = _raw_response(client)
        assert size > 0
        response = M.decode_response(FETCH, version, raw[5 if version >= 12 else 4:])
        entries = [p for t in response.responses for p in t.partitions]
        absent = ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert [e.error_code for e in entries] == [0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, absent]
        assert all(e.records is not None and bytes(e.records) == b"" for e in entries)
        # an error partition reports no offsets, as Kafka does
        assert [e.high_watermark for e in entries] == [0, -1, -1]


def _raw_response(c: RawClient) -> tuple[int, bytes]:
    import struct

    (size,) = struct.unpack(">i", c._read(4))
    return size, c._read(size)


def test_fetch_unknown_topic_id(broker_thread: BrokerThread, client: RawClient) -> None:
    info = broker_thread.create_topic("ids", 1)
    stranger = uuid.uuid4()
    request = fetch_request([("ids", 0, 0), ("x", 0, 0)], topic_ids={"ids": info.topic_id, "x": stranger})
    response = client.call(FETCH, 13, request)
    by_id = {t.topic_id: t.partitions[0].error_code for t in response.responses}
    assert by_id == {info.topic_id: 0, stranger: ErrorCode.UNKNOWN_TOPIC_ID}


def test_every_requested_partition_is_in_the_response(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("a", 3)
    broker_thread.create_topic("b", 2)
    for p in range(3):
        produce(client, "a", p, batch([b"x" * 500]))
    wanted = [("a", 2, 0), ("b", 1, 0), ("a", 0, 0), ("a", 1, 5), ("b", 0, 0)]
    # a tiny max_bytes: only the first partition with data returns any, the rest come back empty
    response = client.call(FETCH, 12, fetch_request(wanted, max_bytes=10))
    got = [(t.topic, p.partition_index) for t in response.responses for p in t.partitions]
    assert got == [(t, p) for t, p, _ in wanted]
    entries = [p for t in response.responses for p in t.partitions]
    assert [len(values(e)) for e in entries] == [1, 0, 0, 0, 0]
    assert [e.error_code for e in entries] == [0, 0, 0, ErrorCode.OFFSET_OUT_OF_RANGE, 0]


# -- long polling ------------------------------------------------------------------------------------


def test_long_poll_is_woken_by_a_produce(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("lp", 2)
    poller = broker_thread.client("poller")
    # max_wait far beyond the socket timeout (10 s): only a wake-up can answer it in time
    poller.send(FETCH, 12, fetch_request([("lp", 0, 0), ("lp", 1, 0)], max_wait_ms=120_000, min_bytes=1))
    assert produce(client, "lp", 1, batch([b"wake"])).error_code == 0
    response = poller.receive(FETCH, 12)
    p0, p1 = response.responses[0].partitions
    assert values(p0) == [] and values(p1) == [b"wake"]
    poller.close()


def test_long_poll_waits_for_min_bytes(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("mb", 1)
    first, second = batch([b"a" * 100]), batch([b"b" * 100])
    poller = broker_thread.client("poller")
    poller.send(FETCH, 12, fetch_request([("mb", 0, 0)], max_wait_ms=120_000, min_bytes=len(first) + 1))
    assert produce(client, "mb", 0, first).error_code == 0
    # the fetch could have answered with the first batch alone only by ignoring min_bytes
    assert produce(client, "mb", 0, second).error_code == 0
    response = poller.receive(FETCH, 12)
    assert values(response.responses[0].partitions[0]) == [b"a" * 100, b"b" * 100]
    poller.close()


def test_long_poll_times_out_empty(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("to", 1)
    entry = fetch_one(client, "to", 0, 0, max_wait_ms=50, min_bytes=1)
    assert (entry.error_code, bytes(entry.records), entry.high_watermark) == (0, b"", 0)


def test_long_poll_answers_at_once_on_error(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("err", 1)
    request = fetch_request([("err", 0, 0), ("err", 0, 99)], max_wait_ms=120_000, min_bytes=1)
    response = client.call(FETCH, 12, request)  # well within the socket timeout
    assert [p.error_code for p in response.responses[0].partitions] == [0, ErrorCode.OFFSET_OUT_OF_RANGE]


def test_long_poll_of_many_fetchers(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("fan", 1)
    pollers = [broker_thread.client("p%d" % i) for i in range(8)]
    for p in pollers:
        p.send(FETCH, 11, fetch_request([("fan", 0, 0)], max_wait_ms=120_000, min_bytes=1))
    assert produce(client, "fan", 0, batch([b"all"])).error_code == 0
    for p in pollers:
        assert values(p.receive(FETCH, 11).responses[0].partitions[0]) == [b"all"]
        p.close()


# -- sizes, offsets, isolation ------------------------------------------------------------------------


def test_partition_max_bytes_returns_at_least_one_batch(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("pmb", 1)
    for i in range(3):
        produce(client, "pmb", 0, batch([b"%d" % i + b"x" * 1000]))
    one = fetch_one(client, "pmb", 0, 0, partition_max_bytes=10)  # the first batch, though larger
    assert len(values(one)) == 1
    two = fetch_one(client, "pmb", 0, 0, partition_max_bytes=2500)
    assert len(values(two)) == 2  # whole batches only: the third does not fit
    rest = fetch_one(client, "pmb", 0, 1, max_bytes=10)
    assert [(v or b"")[:1] for v in values(rest)] == [b"1"]


def test_max_bytes_across_partitions(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("mx", 3)
    for p in range(3):
        for _ in range(2):
            produce(client, "mx", p, batch([b"y" * 1000]))
    size = len(batch([b"y" * 1000]))
    response = client.call(FETCH, 12, fetch_request([("mx", p, 0) for p in range(3)], max_bytes=3 * size))
    counts = [len(values(p)) for p in response.responses[0].partitions]
    assert counts == [2, 1, 0]


@pytest.mark.parametrize("offset", [-1, 4, 1000])
def test_fetch_offset_out_of_range(broker_thread: BrokerThread, client: RawClient, offset: int) -> None:
    broker_thread.create_topic("oor", 1)
    produce(client, "oor", 0, batch([b"a", b"b", b"c"]))
    entry = fetch_one(client, "oor", 0, offset)
    assert entry.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert bytes(entry.records) == b""
    assert fetch_one(client, "oor", 0, 3).error_code == 0  # the log end offset itself is in range


def test_fetch_from_the_middle_of_a_batch(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("mid", 1)
    produce(client, "mid", 0, batch([b"a", b"b", b"c"]))
    # the whole batch comes back; the client skips the records before its offset
    assert [r.offset for r in records_of(fetch_one(client, "mid", 0, 2).records)] == [0, 1, 2]


@pytest.mark.parametrize("isolation", [0, 1])
def test_isolation_levels(broker_thread: BrokerThread, client: RawClient, isolation: int) -> None:
    broker_thread.create_topic("iso", 1)
    produce(client, "iso", 0, batch([b"a"]))
    entry = fetch_one(client, "iso", 0, 0, isolation_level=isolation)
    assert entry.last_stable_offset == entry.high_watermark == 1
    assert values(entry) == [b"a"]
    assert entry.aborted_transactions == ([] if isolation == 1 else None)


def test_fetch_with_leader_epochs(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("ep", 1)
    produce(client, "ep", 0, batch([b"a"]))
    R = M.FetchRequest
    for epoch, code in [(-1, 0), (0, 0), (1, ErrorCode.UNKNOWN_LEADER_EPOCH)]:
        request = fetch_request([("ep", 0, 0)])
        request.topics[0].partitions[0].current_leader_epoch = epoch
        assert isinstance(request, R)
        entry = client.call(FETCH, 12, request).responses[0].partitions[0]
        assert entry.error_code == code


@pytest.mark.parametrize(("session_id", "epoch", "code"), [
    (12345, 1, ErrorCode.FETCH_SESSION_ID_NOT_FOUND),  # an incremental fetch of a session we never made
    (0, 3, ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
    (12345, -1, 0),  # closing a session: a full, sessionless answer
])
def test_fetch_session_epochs(broker_thread: BrokerThread, client: RawClient, session_id: int, epoch: int,
                              code: int) -> None:
    broker_thread.create_topic("se", 1)
    request = fetch_request([("se", 0, 0)])
    request.session_id, request.session_epoch = session_id, epoch
    response = client.call(FETCH, 12, request)
    assert (response.error_code, response.session_id) == (code, 0)
    assert len(response.responses) == (0 if code else 1)


@pytest.mark.parametrize("session_id", [0, 12345])
def test_a_full_fetch_at_epoch_0_opens_a_session(broker_thread: BrokerThread, client: RawClient,
                                                 session_id: int) -> None:
    # kafka-python opens a session with id 0 / epoch 0 (an unknown id is closed first, as Kafka does)
    broker_thread.create_topic("sess", 1)
    produce(client, "sess", 0, batch([b"s"]))
    request = fetch_request([("sess", 0, 0)])
    request.session_id, request.session_epoch = session_id, 0
    response = client.call(FETCH, 12, request)
    assert response.error_code == 0 and response.session_id not in (0, session_id)
    assert values(response.responses[0].partitions[0]) == [b"s"]


def test_long_poll_answers_when_its_topic_is_deleted(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("doomed", 1)
    broker_thread.create_topic("kept", 1)
    poller = broker_thread.client("poller")
    poller.send(FETCH, 12, fetch_request([("kept", 0, 0), ("doomed", 0, 0)], max_wait_ms=120_000, min_bytes=1))
    assert produce(client, "doomed", 5, batch([b"x"])).error_code  # a round trip: the fetch is waiting
    broker_thread.call(broker_thread.broker.delete_topic("doomed"))
    kept, doomed = [p for t in poller.receive(FETCH, 12).responses for p in t.partitions]
    assert (kept.error_code, doomed.error_code) == (0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    poller.close()
