"""The server's copy-free paths: requests received in place, Fetch records sent with os.sendfile.

On both event loops the broker runs on: plain asyncio (like the other in-process tests) and uvloop
(which `python -m broker` uses). A fetch response must be byte for byte the same whether its
records go out with sendfile or are copied, stay whole and in order when the client reads slowly
(the socket fills up mid-sendfile), and a client leaving mid-response must cost nothing but its
own connection.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import uvloop
from prometheus_client import generate_latest

from broker.apis import APIS
from broker.network import server as server_module
from protocol import messages as M
from protocol.records import decode_batch, iter_batches
from tests.harness import RawClient, wait_for
from tests.integration.test_server_support import (
    API_VERSIONS,
    FETCH,
    METADATA,
    PRODUCE,
    BrokerThread,
    batch,
    fetch_request,
    produce,
    produce_request,
)


class UvloopBrokerThread(BrokerThread):
    loop_factory = staticmethod(uvloop.new_event_loop)


@pytest.fixture(params=["asyncio", "uvloop"])
def bt(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerThread]:
    cls = UvloopBrokerThread if request.param == "uvloop" else BrokerThread
    with cls(tmp_path) as broker_thread:
        broker_thread.broker.server.sendfile_on_loopback = True  # the tests' peers are all on 127.0.0.1
        yield broker_thread


def value(partition: int, i: int, size: int) -> bytes:
    stamp = b"%d-%d:" % (partition, i)
    return (stamp * (size // len(stamp) + 1))[:size]


def fill(bt: BrokerThread, topic: str, sizes: dict[int, list[int]]) -> dict[int, list[bytes]]:
    """One batch (one record) per entry of `sizes`, per partition; returns the values written."""
    bt.create_topic(topic, max(sizes) + 1)
    c = bt.client("filler")
    written: dict[int, list[bytes]] = {}
    for partition, lengths in sizes.items():
        for i, size in enumerate(lengths):
            v = value(partition, i, size)
            assert produce(c, topic, partition, batch([v])).error_code == 0
            written.setdefault(partition, []).append(v)
    c.close()
    return written


def values_of(records: Any) -> list[bytes | None]:
    out: list[bytes | None] = []
    for pos, _ in iter_batches(records, strict=True):
        out.extend(r.value for r in decode_batch(records, pos)[1])
    return out


def slow_client(port: int, client_id: str = "slow") -> RawClient:
    """A client with a small receive buffer, so that a large response fills the socket."""
    client = RawClient(port, client_id)
    client.sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    client.sock = sock
    return client


def read_frame(c: RawClient) -> tuple[int, bytes]:
    (size,) = struct.unpack(">i", c._read(4))
    data = c._read(size)
    return struct.unpack_from(">i", data, 0)[0], data


def connection_of(bt: BrokerThread, c: RawClient) -> Any:
    """The broker's side of the client's connection."""
    port = c.sock.getsockname()[1]
    (conn,) = [conn for conn in list(bt.broker.server.connections) if conn.peer[1] == port]
    return conn


def api_versions_ok(c: RawClient) -> bool:
    request = M.ApiVersionsRequest(client_software_name="t", client_software_version="1")
    return bool(c.call(API_VERSIONS, 3, request).error_code == 0)


def sendfile_bytes(bt: BrokerThread) -> int:
    return int(bt.broker.metrics.sendfile_bytes.value)


def sendfile_waits(bt: BrokerThread) -> int:
    return int(bt.broker.metrics.sendfile_waits.value)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- Fetch: sendfile and copy give the same bytes ----------------------------------------------------


def test_fetch_response_is_the_same_with_and_without_sendfile(bt: BrokerThread) -> None:
    # partition 0: two slices' worth of large batches, 1: small ones (copied), 2: one large batch
    written = fill(bt, "z", {0: [300_000, 200_000], 1: [1000, 10, 2000], 2: [100_000]})
    c = bt.client()
    request = fetch_request([("z", 0, 0), ("z", 1, 0), ("z", 2, 0)], partition_max_bytes=1 << 20)
    responses = []
    for threshold in (server_module.SENDFILE_MIN_BYTES, sys.maxsize):
        bt.broker.server.sendfile_min_bytes = threshold
        before = sendfile_bytes(bt)
        c.send(FETCH, 12, request)
        correlation_id, data = read_frame(c)
        assert correlation_id == c.correlation_id
        responses.append((data[4:], sendfile_bytes(bt) - before))
    (with_sendfile, sent), (copied, none_sent) = responses
    assert with_sendfile == copied
    assert none_sent == 0
    response = M.decode_response(FETCH, 12, copied[1:])  # response header v1: a tag buffer
    entries = {p.partition_index: p for t in response.responses for p in t.partitions}
    assert sent == len(entries[0].records) + len(entries[2].records)  # the small slices were copied
    for partition, values in written.items():
        assert entries[partition].error_code == 0
        assert values_of(entries[partition].records) == values
    exposition = generate_latest(bt.broker.metrics.registry).decode()
    assert 'kafka_requests_total{api="Fetch"} 2.0' in exposition
    assert "kafka_sendfile_bytes_total %s" % float(sent) in exposition
    c.close()


def test_every_fetch_version_with_sendfile(bt: BrokerThread) -> None:
    written = fill(bt, "v", {0: [150_000, 120_000]})
    c = bt.client()
    topic_id = bt.broker.metadata.topic("v").topic_id
    fetch_api = APIS[FETCH]
    for version in range(fetch_api.min_version, fetch_api.max_version + 1):
        ids = {"v": topic_id} if version >= 13 else None
        response = c.call(FETCH, version, fetch_request([("v", 0, 0)], topic_ids=ids))
        entry = response.responses[0].partitions[0]
        assert entry.error_code == 0 and entry.high_watermark == 2
        assert values_of(entry.records) == written[0], version
    c.close()


# -- a slow reader: the socket fills up in the middle of a sendfile ----------------------------------


def test_slow_reader_gets_the_whole_response_then_the_pipelined_ones_in_order(bt: BrokerThread) -> None:
    written = fill(bt, "slow", {p: [900_000] for p in range(10)})
    c = slow_client(bt.port)
    waits = sendfile_waits(bt)
    kinds: list[tuple[int, int, Any]] = [
        (FETCH, 12, fetch_request([("slow", p, 0) for p in range(10)])),
        (API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="t", client_software_version="1")),
        (PRODUCE, 9, produce_request("slow", 0, batch([b"after the fetch"]))),
        (METADATA, 12, M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(name="slow")])),
        (FETCH, 12, fetch_request([("slow", 0, 1)])),
    ]
    first_id = c.correlation_id + 1
    payload = b""
    for key, version, request in kinds:
        body = c.request_bytes(key, version, request)
        payload += struct.pack(">i", len(body)) + body
    c.sock.sendall(payload)
    # 9 MB cannot fit in the sockets' buffers: the broker waits for room, the rest queued behind
    wait_for(lambda: sendfile_waits(bt) > waits, what="a sendfile to find the socket full")
    decoded = []
    for i, (key, version, _) in enumerate(kinds):
        correlation_id, data = read_frame(c)
        assert correlation_id == first_id + i
        offset = 4 if key == API_VERSIONS else 5
        decoded.append(M.decode_response(key, version, data[offset:]))
    entries = {p.partition_index: p for t in decoded[0].responses for p in t.partitions}
    assert {p: values_of(e.records) for p, e in entries.items()} == written
    assert decoded[2].responses[0].partition_responses[0].base_offset == 1  # produced after the fetch
    assert values_of(decoded[4].responses[0].partitions[0].records) == [b"after the fetch"]
    c.close()


def test_sendfile_waits_for_the_bytes_buffered_before_it(
    bt: BrokerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copied slice fills the transport's buffer; the large slice after it must not overtake it."""
    drains = []
    drain = server_module.Connection._drain

    async def counting_drain(self: server_module.Connection) -> None:
        drains.append(self.transport.get_write_buffer_size() if self.transport else 0)
        await drain(self)

    monkeypatch.setattr(server_module.Connection, "_drain", counting_drain)
    written = fill(bt, "order", {0: [900_000, 900_000], 1: [900_000, 900_000, 900_000]})
    bt.broker.server.sendfile_min_bytes = 2_000_000  # partition 0 (1.8 MB) is copied, 1 (2.7 MB) sent
    c = slow_client(bt.port)
    assert api_versions_ok(c)
    conn = connection_of(bt, c)
    # a small fixed send buffer: most of the copied slice stays in the transport
    conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
    before = sendfile_bytes(bt)
    response = c.call(FETCH, 12, fetch_request([("order", 0, 0), ("order", 1, 0)], partition_max_bytes=4 << 20))
    entries = {p.partition_index: p for t in response.responses for p in t.partitions}
    assert {p: values_of(e.records) for p, e in entries.items()} == written
    assert sendfile_bytes(bt) - before == len(entries[1].records)
    assert drains and drains[0] > 0
    assert api_versions_ok(c)
    c.close()


def test_client_leaving_mid_sendfile_costs_only_its_connection(bt: BrokerThread) -> None:
    fill(bt, "gone", {p: [900_000] for p in range(10)})
    bystander = bt.client("bystander")
    assert produce(bystander, "gone", 0, batch([b"x"])).error_code == 0
    fds = open_fds()
    waits = sendfile_waits(bt)
    c = slow_client(bt.port)
    c.send(FETCH, 12, fetch_request([("gone", p, 0) for p in range(10)]))
    wait_for(lambda: sendfile_waits(bt) > waits, what="a sendfile to find the socket full")
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()  # a reset, in the middle of the response
    wait_for(lambda: len(bt.broker.server.connections) == 1, what="the broker to drop the connection")
    wait_for(lambda: open_fds() <= fds, what="the connection's descriptors to be closed")
    assert produce(bystander, "gone", 0, batch([b"y"])).error_code == 0
    entry = bystander.call(FETCH, 12, fetch_request([("gone", 0, 0)])).responses[0].partitions[0]
    assert len(values_of(entry.records)) == 3
    bystander.close()


# -- receiving in place ------------------------------------------------------------------------------


def test_pipelined_large_produces_are_received_in_place(bt: BrokerThread) -> None:
    """Frames of 1 MB sent back to back (reading pauses and resumes on the queued bytes), each
    received into its own buffer, whose records are appended intact."""
    bt.create_topic("in", 1)
    c = bt.client()
    values = [value(0, i, 1_000_000) for i in range(7)]
    first_id = c.correlation_id + 1
    payload = b""
    for v in values:
        body = c.request_bytes(PRODUCE, 9, produce_request("in", 0, batch([v])))
        payload += struct.pack(">i", len(body)) + body
    c.sock.sendall(payload + payload[: len(payload) // 3])  # and a third of them again, split mid-frame
    c.sock.sendall(payload[len(payload) // 3 :])
    for i in range(2 * len(values)):
        correlation_id, data = read_frame(c)
        assert correlation_id == first_id + i % len(values)  # the same frames twice
        response = M.decode_response(PRODUCE, 9, data[5:]).responses[0].partition_responses[0]
        assert (response.error_code, response.base_offset) == (0, i)
    for offset in range(2 * len(values)):
        entry = c.call(FETCH, 12, fetch_request([("in", 0, offset)], partition_max_bytes=1)).responses[0]
        assert values_of(entry.partitions[0].records) == [values[offset % len(values)]]
    c.close()


# -- the per-request debug line ----------------------------------------------------------------------


def test_debug_flag_follows_the_log_level() -> None:
    try:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger("INFO"))
        assert not server_module._debug_enabled()
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger("DEBUG"))
        assert server_module._debug_enabled()
    finally:
        structlog.reset_defaults()


def test_loops_are_what_they_claim(bt: BrokerThread) -> None:
    """The uvloop variant really serves on uvloop (a transport whose socket sendfile can use)."""

    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert bt.call(kind()).split(".")[0] in ("asyncio", "uvloop")
    c = bt.client()
    c.call(API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    assert connection_of(bt, c).socket_fd >= 0
    c.close()


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.5", False), ("::ffff:10.0.0.5", False), ("fe80::1%eth0", False), ("", False),
])
def test_loopback_peers_are_told_apart(host: str, loopback: bool) -> None:
    assert server_module.is_loopback(host) is loopback


def test_a_loopback_peer_gets_copies_by_default(tmp_path: Path) -> None:
    """Over loopback a copy costs the broker less CPU than sendfile: a local client's large
    fetch is written from the process, byte for byte the same."""
    with BrokerThread(tmp_path) as broker_thread:
        written = fill(broker_thread, "local", {0: [300_000, 200_000]})
        c = broker_thread.client()
        assert api_versions_ok(c)  # the broker's side of the connection exists
        assert connection_of(broker_thread, c).socket_fd == -1
        response = c.call(FETCH, 12, fetch_request([("local", 0, 0)], partition_max_bytes=1 << 20))
        entry = response.responses[0].partitions[0]
        assert entry.error_code == 0 and values_of(entry.records) == written[0]
        assert sendfile_bytes(broker_thread) == 0
        c.close()
