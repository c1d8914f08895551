"""The server with raw frames: ordering, concurrency, bad input, idle connections, ApiVersions."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from broker.apis import APIS
from protocol import frames
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient, wait_for
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    API_VERSIONS,
    METADATA,
    PRODUCE,
    BrokerThread,
    batch,
    broker_thread_fixture,
    client_fixture,
    fetch_one,
    produce,
    produce_request,
)


def api_versions_ok(c: RawClient, version: int = 3) -> bool:
    response = c.call(API_VERSIONS, version, M.ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    return response.error_code == 0 and any(k.api_key == API_VERSIONS for k in response.api_keys)


def _versions_request(name: str) -> M.ApiVersionsRequest:
    return M.ApiVersionsRequest(client_software_name=name, client_software_version="1")


def read_response_frame(c: RawClient) -> tuple[int, bytes]:
    (size,) = struct.unpack(">i", c._read(4))
    data = c._read(size)
    return struct.unpack_from(">i", data, 0)[0], data


# -- ordering and concurrency -----------------------------------------------------------------------


def test_pipelined_requests_are_answered_in_order(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("pipe", 1)
    # a long-polling fetch first: the requests behind it on the same connection must wait for it
    fetch = M.FetchRequest(
        max_wait_ms=200, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=[M.FetchRequest.FetchTopic(topic="pipe", partitions=[
            M.FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])],
    )
    kinds = [(1, 12, fetch)]
    for i in range(20):
        if i % 3 == 0:
            kinds.append((PRODUCE, 9, produce_request("pipe", 0, batch([b"v%d" % i]))))
        elif i % 3 == 1:
            kinds.append((METADATA, 12, M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(name="pipe")])))
        else:
            kinds.append((API_VERSIONS, 0, M.ApiVersionsRequest()))
    payload = b""
    first_id = client.correlation_id + 1
    for key, version, request in kinds:
        body = client.request_bytes(key, version, request)
        payload += struct.pack(">i", len(body)) + body
    client.sock.sendall(payload)  # all at once, without waiting for any response
    for i, (key, version, _) in enumerate(kinds):
        correlation_id, data = read_response_frame(client)
        assert correlation_id == first_id + i
        offset = 5 if frames.response_header_version(key, version) == 1 else 4
        M.decode_response(key, version, data[offset:])  # each decodes with its own schema
    # the produces landed in order, behind the fetch
    entry = fetch_one(client, "pipe", 0, 0)
    assert entry.high_watermark == 7


def test_a_request_that_waits_holds_back_those_behind_it(broker_thread: BrokerThread, client: RawClient) -> None:
    """A request is handled as it arrives, without a task, unless its handler waits: then it goes
    on in the connection's worker, and what arrives meanwhile queues behind it, in order."""
    server = broker_thread.broker.server
    assert api_versions_ok(client)
    assert all(c.worker is None for c in server.connections)  # answered without a task
    broker_thread.faults.delay("Metadata", 300)
    first = client.correlation_id + 1
    client.send(METADATA, 12, M.MetadataRequest(topics=[]))  # waits 300 ms in its handler
    wait_for(lambda: any(c.worker is not None for c in server.connections), 10, what="the request to wait")
    for _ in range(3):
        client.send(API_VERSIONS, 3, _versions_request("t"))
    answered = [read_response_frame(client)[0] for _ in range(4)]
    assert answered == [first, first + 1, first + 2, first + 3]
    wait_for(lambda: all(c.worker is None for c in server.connections), 10, what="the worker to finish")
    for _ in range(20):  # and the connection is served as before, request by request
        assert api_versions_ok(client)


def test_a_connection_closed_while_its_request_waits(broker_thread: BrokerThread, bystander: RawClient) -> None:
    server = broker_thread.broker.server
    broker_thread.faults.delay("Metadata", 60_000)
    c = broker_thread.client()
    c.send(METADATA, 12, M.MetadataRequest(topics=[]))
    wait_for(lambda: any(conn.worker is not None for conn in server.connections), 10, what="the request to wait")
    before = len(server.connections)
    c.close()  # the waiting request's task is cancelled with the connection
    wait_for(lambda: len(server.connections) == before - 1, 10, what="the connection to go")
    broker_thread.faults.clear()
    other = broker_thread.client()
    assert other.call(METADATA, 12, M.MetadataRequest(topics=[])).brokers
    other.close()


def test_many_connections_concurrently(broker_thread: BrokerThread) -> None:
    broker_thread.create_topic("many", 4)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            c = broker_thread.client("conn-%d" % n)
            try:
                for i in range(10):
                    r = produce(c, "many", n % 4, batch([b"%d-%d" % (n, i)]))
                    assert r.error_code == 0
                assert api_versions_ok(c)
            finally:
                c.close()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    c = broker_thread.client()
    total = sum(fetch_one(c, "many", p, 0).high_watermark for p in range(4))
    c.close()
    assert total == 320


# -- bad input: the offending connection closes, every other one keeps working --------------------


@pytest.fixture
def bystander(broker_thread: BrokerThread):  # type: ignore[no-untyped-def]
    """A connection opened before the bad input, checked after it."""
    c = broker_thread.client("bystander")
    assert api_versions_ok(c)
    yield c
    assert api_versions_ok(c)  # still served
    fresh = broker_thread.client("fresh")
    assert api_versions_ok(fresh)
    fresh.close()
    c.close()


def test_garbage_bytes_close_the_connection(broker_thread: BrokerThread, bystander: RawClient) -> None:
    bad = broker_thread.client()
    # a plausible size followed by a header that names no API and has a broken client id
    bad.send_frame(b"\x7f\xff\x00\x00\x00\x00\x00\x01\x7f\xff")
    assert bad.is_closed()
    bad.close()


def test_random_garbage_without_a_frame_boundary(broker_thread: BrokerThread, bystander: RawClient) -> None:
    bad = broker_thread.client()
    bad.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # size prefix "GET " is huge
    assert bad.is_closed()
    bad.close()


def test_truncated_frame_then_close(broker_thread: BrokerThread, bystander: RawClient) -> None:
    bad = broker_thread.client()
    body = bad.request_bytes(API_VERSIONS, 0, M.ApiVersionsRequest())
    bad.sock.sendall(struct.pack(">i", len(body) + 100) + body)  # promises more than it sends
    bad.sock.shutdown(socket.SHUT_WR)
    assert bad.is_closed()
    bad.close()


def test_truncated_body_closes_the_connection(broker_thread: BrokerThread, bystander: RawClient) -> None:
    bad = broker_thread.client()
    body = bad.request_bytes(METADATA, 12, M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(name="x")]))
    bad.send_frame(body[:-3])  # a complete frame whose body is cut short
    assert bad.is_closed()
    bad.close()


def test_oversized_frame_closes_the_connection(tmp_path: Path) -> None:
    with BrokerThread(tmp_path, **{"socket.request.max.bytes": "1000"}) as bt:
        other = bt.client("other")
        assert api_versions_ok(other)
        bad = bt.client()
        bad.sock.sendall(struct.pack(">i", 1001))  # the size alone is enough to refuse it
        assert bad.is_closed()
        bad.close()
        at_limit = bt.client()
        # the name's length prefix takes 2 bytes once it is over 126
        name = "n" * (1000 - 1 - len(at_limit.request_bytes(API_VERSIONS, 3, _versions_request(""))))
        body = at_limit.request_bytes(API_VERSIONS, 3, _versions_request(name))
        assert len(body) == 1000
        at_limit.send_frame(body)
        correlation_id, _ = read_response_frame(at_limit)  # exactly the limit is accepted
        assert correlation_id == at_limit.correlation_id
        assert api_versions_ok(other)
        at_limit.close()
        other.close()


@pytest.mark.parametrize("defined", [False, True])
def test_unknown_api_key_closes_the_connection(broker_thread: BrokerThread, bystander: RawClient,
                                               defined: bool) -> None:
    """An api key Kafka does not have, or one we have a definition for but no handler (an
    inter-broker API until cluster mode answers it): neither is advertised, both close."""
    unhandled = sorted(key for key in M.REQUESTS if key not in APIS)
    if defined and not unhandled:
        pytest.skip("every defined API has a handler")
    bad = broker_thread.client()
    bad.send_frame(struct.pack(">hhih", unhandled[0] if defined else 9999, 0, 1, -1) + b"\x00" * 8)
    assert bad.is_closed()
    bad.close()


@pytest.mark.parametrize("version", [5, 100, -1])
def test_unsupported_api_versions_version_gets_v0_body(broker_thread: BrokerThread, bystander: RawClient,
                                                        version: int) -> None:
    c = broker_thread.client()
    # a client speaking a future version: the header is v2 (tags) but we cannot know; answer with v0
    c.send_frame(struct.pack(">hhih", API_VERSIONS, version, 77, 1) + b"x" + b"\x00" + b"\x02\x01a\x02\x01b\x00")
    correlation_id, data = read_response_frame(c)
    assert correlation_id == 77
    body = M.decode_response(API_VERSIONS, 0, data[4:])  # response header v0, then a v0 body
    assert body.error_code == ErrorCode.UNSUPPORTED_VERSION
    keys = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert keys[API_VERSIONS] == (0, 4)
    assert api_versions_ok(c)  # the connection stays usable
    c.close()


def test_unsupported_version_of_other_api_closes(broker_thread: BrokerThread, bystander: RawClient) -> None:
    bad = broker_thread.client()
    bad.send_frame(frames.encode_request_header(PRODUCE, 2, 1, "old", header_version=1) + b"\x00" * 10)
    assert bad.is_closed()
    bad.close()


def test_produce_with_bad_crc_is_corrupt_message(broker_thread: BrokerThread, client: RawClient,
                                                 bystander: RawClient) -> None:
    broker_thread.create_topic("crc", 1)
    good = batch([b"a", b"b"])
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # a flipped bit in the last record: the CRC no longer matches
    r = produce(client, "crc", 0, bytes(bad))
    assert r.error_code == ErrorCode.CORRUPT_MESSAGE
    assert r.base_offset == -1
    assert fetch_one(client, "crc", 0, 0).high_watermark == 0  # nothing written
    r = produce(client, "crc", 0, good)  # the same connection goes on
    assert (r.error_code, r.base_offset) == (0, 0)


def test_produce_with_truncated_records_is_invalid_record(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("trunc", 1)
    r = produce(client, "trunc", 0, batch([b"abc"])[:-2])
    assert r.error_code == ErrorCode.INVALID_RECORD  # as Kafka: an incomplete batch is no batch at all
    assert fetch_one(client, "trunc", 0, 0).high_watermark == 0


def test_a_quiet_connection_gives_its_receive_buffer_back(broker_thread: BrokerThread) -> None:
    """issue 16: an idle connection holds no receive buffer (about 64 KB otherwise)."""
    c = broker_thread.client()
    try:
        assert api_versions_ok(c)
        server = broker_thread.broker.server

        async def sweep_later() -> list[bool]:
            holding = [conn.splitter._array is not None for conn in server.connections]
            server.sweep(time.monotonic() + 60.0, 30.0)  # as if nothing had arrived for a whole period
            return holding + [conn.splitter._array is not None for conn in server.connections]

        before_and_after = broker_thread.call(sweep_later())
        n = len(before_and_after) // 2
        assert n == 1 and before_and_after == [True, False]
        assert api_versions_ok(c)  # it reads into a fresh buffer at its next request
    finally:
        c.close()


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    with BrokerThread(tmp_path, **{"connections.max.idle.ms": "300"}) as bt:
        idle = bt.client()
        assert api_versions_ok(idle)
        wait_for(lambda: idle.is_closed(0.1), timeout=10, what="idle connection to be closed")
        idle.close()
        # a connection in a long poll is busy, not idle
        bt.create_topic("idle", 1)
        busy = bt.client()
        entry = fetch_one(busy, "idle", 0, 0, max_wait_ms=700, min_bytes=1)
        assert entry.error_code == 0
        busy.close()


def test_invalid_regular_expressions_are_answered_and_not_printed(broker_thread: BrokerThread, client: RawClient,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """issue 16: RE2 wrote every expression it could not parse to the process's stderr, around the
    broker's log lines (JSON lines no more), as random requests of every API showed."""
    capfd.readouterr()
    heartbeat = M.ConsumerGroupHeartbeatRequest(
        group_id="re", member_id="m-re", member_epoch=0, rebalance_timeout_ms=1000, subscribed_topic_regex="*",
        topic_partitions=[])

    def answered() -> Any:
        response = client.call(68, 1, heartbeat)
        return None if response.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS else response

    assert wait_for(answered, what="the group coordinator").error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
    listed = client.call(66, 2, M.ListTransactionsRequest(transactional_id_pattern="(unclosed"))
    assert listed.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
    assert api_versions_ok(client)
    assert "Error parsing" not in capfd.readouterr().err


# -- ApiVersions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_api_versions(client: RawClient, version: int) -> None:
    response = client.call(API_VERSIONS, version, M.ApiVersionsRequest(client_software_name="raw-test",
                                                                     client_software_version="1.0"))
    assert response.error_code == 0
    keys = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert keys[API_VERSIONS] == (0, 4)
    assert keys[PRODUCE][0] <= 3 and keys[PRODUCE][1] >= 10
    assert keys[1][0] <= 4 and keys[1][1] >= 12  # Fetch
    assert keys[METADATA][1] >= 12
    assert set(keys) == set(APIS)  # built from the registry: nothing advertised without a handler


def test_api_versions_flexible_response_header_is_v0(client: RawClient) -> None:
    client.send(API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="x", client_software_version="1"))
    correlation_id, data = read_response_frame(client)
    assert correlation_id == client.correlation_id
    M.decode_response(API_VERSIONS, 3, data[4:])  # no tag byte after the correlation id


# -- handler failures ----------------------------------------------------------------------------


def _replace_handler(monkeypatch: pytest.MonkeyPatch, key: int, handler: Any) -> None:
    import dataclasses

    from broker.apis import APIS

    monkeypatch.setitem(APIS, key, dataclasses.replace(APIS[key], handler=handler))


def test_unexpected_handler_error_is_unknown_server_error(broker_thread: BrokerThread, client: RawClient,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    async def boom(ctx: object, request: object) -> None:
        raise RuntimeError("a bug")

    _replace_handler(monkeypatch, METADATA, boom)
    request = M.MetadataRequest(topics=None)
    # v13 has a top-level error code: the client learns of the failure, the connection stays
    assert client.call(METADATA, 13, request).error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert api_versions_ok(client)
    # v12 cannot say it: an empty "successful" answer would mislead, so the connection closes
    client.send(METADATA, 12, request)
    assert client.is_closed()
    other = broker_thread.client()
    assert api_versions_ok(other)
    other.close()


def test_produce_handler_error_closes_instead_of_hanging(broker_thread: BrokerThread, client: RawClient,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    async def boom(ctx: object, request: object) -> None:
        raise RuntimeError("a bug")

    _replace_handler(monkeypatch, PRODUCE, boom)
    client.send(PRODUCE, 9, produce_request("t", 0, batch([b"x"]), acks=1))
    assert client.is_closed()


def test_unencodable_response_closes_the_connection(broker_thread: BrokerThread, client: RawClient,
                                                    bystander: RawClient, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(ctx: object, request: object) -> object:
        return M.MetadataResponse(brokers=[object()], topics=[])

    _replace_handler(monkeypatch, METADATA, broken)
    client.send(METADATA, 12, M.MetadataRequest(topics=None))
    assert client.is_closed()
