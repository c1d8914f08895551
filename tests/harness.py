"""Test harness: the broker in-process or as a subprocess on 127.0.0.1, and a raw-frame client.

A broker process may listen elsewhere (a network namespace of tests/chaos/network.py, at its
address there): `HOSTS` maps its port to that address, so the helpers that reach a broker by its
port (`connect`, `port_open`, RawClient) find it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from protocol import frames
from protocol import messages as M

ROOT = Path(__file__).resolve().parent.parent


HOSTS: dict[int, str] = {}  # port -> address of a broker listening elsewhere than 127.0.0.1


def host_of(port: int) -> str:
    return HOSTS.get(port, "127.0.0.1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    """Poll `predicate` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def port_open(port: int) -> bool:
    try:
        socket.create_connection((host_of(port), port), timeout=0.2).close()
        return True
    except OSError:
        return False


class BrokerProcess:
    """`python -m broker` as a child process, stopped by its PID only."""

    def __init__(self, data_dir: Path, port: int | None = None, overrides: dict[str, str] | None = None,
                 args: list[str] | None = None, root: Path | None = None, host: str = "127.0.0.1",
                 prefix: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.root = root or ROOT  # the checkout whose broker runs (bench: another version to compare)
        self.args = list(args or [])  # more command-line arguments (--fault ...)
        self.port = port or free_port()
        self.host = host
        self.prefix = list(prefix or [])  # runs the command elsewhere (`ip netns exec NS`, which execs it)
        if host != "127.0.0.1":
            HOSTS[self.port] = host
        self.overrides = {
            "listeners": "PLAINTEXT://%s:%d" % (host, self.port),
            "log.dirs": str(data_dir),
            "group.initial.rebalance.delay.ms": "0",
            **(overrides or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / ("broker-%d.log" % self.port)

    @property
    def bootstrap(self) -> str:
        return "%s:%d" % (self.host, self.port)

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        self.launch()
        return self.wait_listening(timeout)

    def launch(self) -> BrokerProcess:
        """The process started, without waiting for it to listen."""
        args = [*self.prefix, sys.executable, "-m", "broker"]
        for k, v in self.overrides.items():
            args += ["--override", "%s=%s" % (k, v)]
        args += self.args
        env = dict(os.environ, PYTHONPATH=str(self.root))
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, cwd=str(self.root), env=env, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def wait_listening(self, timeout: float = 20.0) -> BrokerProcess:
        assert self.proc is not None
        wait_for(lambda: port_open(self.port) or self.proc.poll() is not None, timeout, what="broker to listen")
        if self.proc.poll() is not None:
            raise RuntimeError("broker exited early:\n" + self.log_path.read_text()[-4000:])
        return self

    def stop(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return int(self.proc.returncode)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop_cleanly(self) -> str:
        """Stop; the broker must exit with 0 and have logged no traceback and no unexpected error.
        Returns what it logged."""
        rc = self.stop()
        output = self.output()
        assert rc == 0, output[-3000:]
        assert "Traceback" not in output and "unexpected error" not in output, output[-5000:]
        return output

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """A block that ended well must have kept the broker clean (stop_cleanly)."""
        if exc_type is None:
            self.stop_cleanly()
        else:
            self.stop()


def connect(port: int, attempts: int = 5) -> socket.socket:
    """A connection to 127.0.0.1:port (or where HOSTS says the port is). A refused connect is tried again a few times, as a real
    client reconnects: one in several thousand fresh listeners on a busy machine refused the
    first connection (CI), which no client test means to check."""
    for attempt in range(attempts):
        try:
            return socket.create_connection((host_of(port), port), timeout=10)
        except ConnectionRefusedError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


class RawClient:
    """A minimal blocking client speaking raw frames, for integration tests."""

    def __init__(self, port: int, client_id: str = "raw-test") -> None:
        self.sock = connect(port)
        self.client_id = client_id
        self.correlation_id = 0

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def request_bytes(self, api_key: int, version: int, request: Any) -> bytes:
        self.correlation_id += 1
        header = frames.encode_request_header(api_key, version, self.correlation_id, self.client_id)
        return header + M.encode(request, version)

    def send(self, api_key: int, version: int, request: Any) -> None:
        self.send_frame(self.request_bytes(api_key, version, request))

    def receive(self, api_key: int, version: int, correlation_id: int | None = None) -> Any:
        """The next response, which must answer `correlation_id` (default: the last request sent)."""
        size = struct.unpack(">i", self._read(4))[0]
        data = self._read(size)
        (received,) = struct.unpack_from(">i", data, 0)
        assert received == (self.correlation_id if correlation_id is None else correlation_id)
        offset = 5 if frames.response_header_version(api_key, version) == 1 else 4
        return M.decode_response(api_key, version, data[offset:])

    def call(self, api_key: int, version: int, request: Any) -> Any:
        self.send(api_key, version, request)
        return self.receive(api_key, version)

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            buf += chunk
        return bytes(buf)

    def is_closed(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def start_inprocess(tmp_path: Path, **overrides: str) -> Any:
    """Start a Broker in the running event loop on an ephemeral port; returns it."""
    from broker.app import Broker
    from broker.config import BrokerConfig

    values = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(tmp_path / "data"),
              "group.initial.rebalance.delay.ms": "0"}
    values.update({k.replace("_", "."): v for k, v in overrides.items()})
    broker = Broker(BrokerConfig(values))
    await broker.start()
    return broker


def run_in_thread_loop(coro_factory: Any) -> Any:
    return asyncio.run(coro_factory())
