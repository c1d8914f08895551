"""Running docker/ for real with podman on a machine without a Docker engine or a registry
(../shared/reference/containers.md): podman with runc and its own containers.conf, and a stand-in
for `python:3.11-slim` built from Debian packages when the machine has none. Everything that
touches the shared image store runs under one file lock, so parallel test runs take turns."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "docker.io/library/python:3.11-slim"
IMAGE = "localhost/pykafka-broker:test"
LOCK = Path(tempfile.gettempdir()) / "pykafka-broker-podman.lock"
CONTAINERS_CONF = """\
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
"""
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


class Unavailable(Exception):
    """Podman cannot run images here (the reason says why)."""


class Podman:
    def __init__(self, workdir: Path) -> None:
        if shutil.which("podman") is None:
            raise Unavailable("podman is not installed (apt-get install podman runc debootstrap)")
        self.workdir = workdir
        conf = workdir / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.env = dict(os.environ, CONTAINERS_CONF=str(conf))
        info = self.run("info", check=False, timeout=60)
        if info.returncode != 0:
            raise Unavailable("podman cannot run here: " + info.stderr.strip()[-500:])

    def run(self, *args: str, check: bool = True, timeout: float = 120, stdin: bytes | None = None
            ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["podman", "--runtime", "runc", *args], env=self.env, capture_output=True,
                                text=stdin is None, input=stdin, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError("podman %s failed (%d): %s" % (" ".join(args[:3]), result.returncode,
                                                                 _text(result.stderr)[-3000:]))
        return result  # type: ignore[return-value]

    def compose(self, compose_file: str, project: str, *args: str, env: dict[str, str] | None = None,
                timeout: float = 600) -> subprocess.CompletedProcess[str]:
        build_args = "--format docker --network=host" + (" --volume %s:%s:ro" % (CA_BUNDLE, CA_BUNDLE)
                                                          if os.path.exists(CA_BUNDLE) else "")
        command = [sys.executable, "-m", "podman_compose", "--podman-args=--runtime runc",
                   "--podman-build-args=" + build_args, "-p", project, "-f", str(ROOT / "docker" / compose_file), *args]
        result = subprocess.run(command, env={**self.env, **(env or {})}, capture_output=True, text=True,
                                timeout=timeout, cwd=ROOT)
        if result.returncode != 0:
            raise AssertionError("podman-compose %s failed: %s" % (" ".join(args), result.stdout[-2000:] +
                                                                     result.stderr[-2000:]))
        return result

    # images --------------------------------------------------------------------------------------
    def ensure_base_image(self) -> None:
        """`python:3.11-slim`, or a stand-in under that name built from Debian's python3."""
        if self.run("image", "exists", BASE_IMAGE, check=False).returncode == 0:
            return
        if shutil.which("debootstrap") is None or os.geteuid() != 0:
            raise Unavailable("no %s image and no way to build one here (needs root and debootstrap)" % BASE_IMAGE)
        rootfs = self.workdir / "rootfs"
        built = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm",
                                str(rootfs), apt_mirror()], capture_output=True, text=True, timeout=900)
        if built.returncode != 0:
            raise Unavailable("debootstrap failed: " + built.stderr[-1000:])
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True, timeout=300)
        self.run("import", "-", "localhost/debian-python:bookworm", stdin=tar.stdout, timeout=300)
        shutil.rmtree(rootfs, ignore_errors=True)
        containerfile = self.workdir / "Containerfile.base"
        containerfile.write_text("FROM localhost/debian-python:bookworm\n"
                                 "RUN python3 -m venv /usr/local && ln -sf /usr/local/bin/python3 /usr/local/bin/python\n")
        self.run("build", "--network=host", "-t", BASE_IMAGE, "-f", str(containerfile), str(self.workdir),
                 timeout=300)

    def build_image(self) -> None:
        args = ["build", "--format", "docker", "--network=host", "-t", IMAGE, "-f", str(ROOT / "docker" / "Dockerfile")]
        if os.path.exists(CA_BUNDLE):  # pip inside reaches PyPI through the host's CA bundle
            args += ["--volume", "%s:%s:ro" % (CA_BUNDLE, CA_BUNDLE)]
        self.run(*args, str(ROOT), timeout=900)


def _text(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def apt_mirror() -> str:
    """The Debian mirror apt already uses (its `URIs:` line), else deb.debian.org."""
    for path in Path("/etc/apt/sources.list.d").glob("*.sources"):
        found = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", path.read_text(), re.M)
        if found:
            return found.group(1)
    return "http://deb.debian.org/debian"


@contextmanager
def image_store_lock() -> Iterator[None]:
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports that are free on 127.0.0.1 (and 0.0.0.0)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no %d consecutive free ports" % count)
