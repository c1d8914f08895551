"""The broker as a process (`python -m broker`): graceful shutdown on SIGTERM, log lines for
refused connections."""

from __future__ import annotations

import fcntl
import signal
import socket
import struct
import subprocess
import termios
from pathlib import Path

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import BrokerProcess, RawClient, wait_for
from tests.integration.test_server_support import (
    API_VERSIONS,
    FETCH,
    batch,
    fetch_request,
    metadata,
    produce,
)


def test_sigterm_answers_long_poll_and_writes_clean_shutdown_marker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = BrokerProcess(data, overrides={"num.partitions": "2"}).start()
    try:
        c = RawClient(proc.port)
        assert metadata(c, ["stop"]).topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # being created
        assert metadata(c, ["stop"]).topics[0].error_code == 0
        assert produce(c, "stop", 0, batch([b"before"])).error_code == 0
        poller = RawClient(proc.port)
        # a long poll on the empty partition: nothing will arrive before the shutdown
        poller.send(FETCH, 12, fetch_request([("stop", 1, 0)], max_wait_ms=60000, min_bytes=1))
        # once the broker answered a request sent after the fetch on another connection, the
        # fetch has been read and is waiting
        assert c.call(API_VERSIONS, 0, M.ApiVersionsRequest()).error_code == 0
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
        try:
            response = poller.receive(FETCH, 12)  # answered (empty) instead of waiting a minute
        except ConnectionError:
            response = None  # or the connection closed cleanly: both are what Kafka may do
        if response is not None:
            entry = response.responses[0].partitions[0]
            assert entry.error_code == 0 and bytes(entry.records) == b""
        assert proc.proc.wait(15) == 0
        assert c.is_closed()
        c.close()
        poller.close()
    finally:
        proc.stop()
    assert (data / ".kafka_cleanshutdown").exists()
    assert "broker stopped" in proc.output()
    # the data written before the stop is there after a restart, with no recovery needed
    proc = BrokerProcess(data, port=proc.port).start()
    try:
        c = RawClient(proc.port)
        response = c.call(FETCH, 12, fetch_request([("stop", 0, 0)]))
        assert response.responses[0].partitions[0].high_watermark == 1
        c.close()
    finally:
        assert proc.stop() == 0


def test_refused_connections_are_logged(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", overrides={"socket.request.max.bytes": "4096"}).start()
    try:
        big = RawClient(proc.port)
        big.sock.sendall(struct.pack(">i", 5000) + b"\x00" * 100)
        assert big.is_closed()
        big.close()
        unknown = RawClient(proc.port)
        unknown.send_frame(struct.pack(">hhih", 9999, 0, 1, -1))
        assert unknown.is_closed()
        unknown.close()
        old = RawClient(proc.port)
        old.send_frame(struct.pack(">hhih", 0, 1, 1, -1))  # Produce v1 is no longer served
        assert old.is_closed()
        old.close()
        ok = RawClient(proc.port)
        assert ok.call(API_VERSIONS, 4, M.ApiVersionsRequest(client_software_name="a", client_software_version="1")) \
            .error_code == ErrorCode.NONE
        ok.close()
        wait_for(lambda: "unsupported version" in proc.output(), timeout=10, what="log lines")
        out = proc.output()
        assert "request too large" in out and "size=5000" in out and "limit=4096" in out
        assert "unknown api key" in out and "api_key=9999" in out
    finally:
        assert proc.stop() == 0


def test_help_lists_properties() -> None:
    import sys

    from tests.harness import ROOT

    out = subprocess.run([sys.executable, "-m", "broker", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=30, check=True).stdout
    for name in ("listeners", "log.dirs", "socket.request.max.bytes", "connections.max.idle.ms", "num.partitions"):
        assert name in out


def test_failed_shutdown_logs_and_exits_non_zero(tmp_path: Path) -> None:
    """The log dir removed under the broker: the shutdown cannot write its checkpoints and markers;
    the broker says so and exits with 1 instead of hanging."""
    import shutil

    data = tmp_path / "data"
    proc = BrokerProcess(data).start()
    try:
        c = RawClient(proc.port)
        metadata(c, ["doomed"])
        wait_for(lambda: metadata(c, ["doomed"]).topics[0].error_code == 0, what="the topic")
        assert produce(c, "doomed", 0, batch([b"x"])).error_code == 0
        c.close()
        shutil.rmtree(data)
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(20) == 1
    finally:
        proc.stop()
    output = proc.output()
    assert "shutdown failed" in output and "shutdown step failed" in output


def _unread_bytes(c: RawClient) -> int:
    """Bytes the broker sent that the client has not read (FIONREAD)."""
    return int.from_bytes(fcntl.ioctl(c.sock.fileno(), termios.FIONREAD, b"\x00" * 4), "little")


def test_second_signal_ends_the_process(tmp_path: Path) -> None:
    """A shutdown that waits (here for a client that does not read its responses) ends at once
    on a second signal."""
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        c = RawClient(proc.port)
        metadata(c, ["big"])
        wait_for(lambda: metadata(c, ["big"]).topics[0].error_code == 0, what="the topic")
        assert produce(c, "big", 0, batch([b"x" * 900_000])).error_code == 0
        # fetches of ~1 MB each that are never read: the connection's writes stall, its request
        # stays in flight, and the shutdown waits for it. Sent at once (no Nagle delay for the
        # later ones), they arrive together and queue behind the first.
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = b""
        for _ in range(64):
            body = c.request_bytes(FETCH, 12, fetch_request([("big", 0, 0)]))
            payload += struct.pack(">i", len(body)) + body
        c.sock.sendall(payload)
        assert proc.proc is not None
        wait_for(lambda: _unread_bytes(c) > 0, what="the first fetch responses")  # read and being answered
        proc.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "shutting down" in proc.output(), what="the shutdown to start")
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(10) == 3  # ended by the second signal
        c.close()
    finally:
        proc.stop()
    assert "second signal" in proc.output()
