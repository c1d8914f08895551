"""Real etcd processes for tests and benches: one member or a cluster of several on free
127.0.0.1 ports, each with its own data directory, started and stopped by PID.

etcd comes from Debian's `etcd-server` package (/usr/bin/etcd; `.ci/run` installs it). A test
member elects itself fast (heartbeat 10 ms, election timeout 100 ms: about 0.1 s from exec to a
healthy member, against 0.6 s with etcd's defaults and 1.9 s for a restart on old data); members
of a cluster use 50/500 ms, less touchy on a busy machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ETCD_BIN = os.environ.get("ETCD_BIN", "/usr/bin/etcd")


def etcd_available() -> bool:
    return os.access(ETCD_BIN, os.X_OK) or shutil.which(ETCD_BIN) is not None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EtcdMember:
    """One etcd process. `start()` returns once the member answers /health with a leader."""

    def __init__(self, data_dir: str | Path, name: str = "default", client_port: int = 0, peer_port: int = 0,
                 heartbeat_ms: int = 10, election_ms: int = 100, extra_args: Sequence[str] = (),
                 host: str = "127.0.0.1", prefix: Sequence[str] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.name = name
        self.host = host  # where it listens (tests/chaos: its network namespace's address)
        self.prefix = list(prefix)  # runs the command elsewhere (`ip netns exec NS`, which execs it)
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.extra_args = list(extra_args)
        self.initial_cluster = "%s=%s" % (name, self.peer_url)
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0  # how long the last start took until healthy

    @property
    def client_url(self) -> str:
        return "http://%s:%d" % (self.host, self.client_port)

    @property
    def peer_url(self) -> str:
        return "http://%s:%d" % (self.host, self.peer_port)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir.with_name(self.data_dir.name + ".log")

    def command(self) -> list[str]:
        return [
            ETCD_BIN, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
            "--heartbeat-interval", str(self.heartbeat_ms), "--election-timeout", str(self.election_ms),
            "--logger", "zap", "--log-level", "warn", *self.extra_args,
        ]

    def launch(self) -> None:
        """Start the process without waiting for it to be healthy (cluster members wait together)."""
        assert self.process is None or self.process.poll() is not None, "already running"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([*self.prefix, *self.command()], stdout=subprocess.DEVNULL, stderr=log,
                                            stdin=subprocess.DEVNULL)

    def start(self, timeout: float = 15.0) -> None:
        began = time.monotonic()
        self.launch()
        self.wait_healthy(timeout)
        self.start_seconds = time.monotonic() - began

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.client_url + "/health", timeout=1) as r:
                return b'"true"' in r.read()
        except (OSError, urllib.error.URLError):
            return False

    def wait_healthy(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError("etcd exited with %s; its log: %s\n%s" % (
                    self.process.returncode, self.log_path, self._log_tail()))
            if time.monotonic() > deadline:
                raise TimeoutError("etcd at %s not healthy after %.0f s; its log: %s\n%s" % (
                    self.client_url, timeout, self.log_path, self._log_tail()))
            time.sleep(0.01)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def kill(self) -> None:
        """kill -9, and reap it."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def pause(self, timeout: float = 5.0) -> None:
        """SIGSTOP, and wait until every thread of it has stopped: kill() returns before a thread
        running on another core stops, and an answer it sends meanwhile would fool a test."""
        self.signal(signal.SIGSTOP)
        if self.process is None:
            return
        tasks = Path("/proc/%d/task" % self.process.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()]
            except OSError:
                return  # gone, or no /proc: nothing to wait for
            if all(state in ("T", "t") for state in states):
                return
            time.sleep(0.001)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def restart(self, timeout: float = 15.0) -> None:
        self.stop()
        self.start(timeout)


class EtcdCluster:
    """Several members forming one etcd cluster."""

    def __init__(self, base_dir: str | Path, size: int = 3, heartbeat_ms: int = 50, election_ms: int = 500) -> None:
        base = Path(base_dir)
        self.members = [EtcdMember(base / ("m%d" % i), name="m%d" % i, heartbeat_ms=heartbeat_ms,
                                   election_ms=election_ms) for i in range(size)]
        initial = ",".join("%s=%s" % (m.name, m.peer_url) for m in self.members)
        for m in self.members:
            m.initial_cluster = initial
        self.start_seconds = 0.0

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    def start(self, timeout: float = 20.0) -> None:
        began = time.monotonic()
        for m in self.members:
            m.launch()
        for m in self.members:
            m.wait_healthy(timeout)
        self.start_seconds = time.monotonic() - began

    def stop(self) -> None:
        for m in self.members:
            m.stop()
