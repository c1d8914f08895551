"""The private network of tests/chaos/network.py: members reach each other by TCP, isolate and
cut stop that, heal restores it, and destroy leaves no namespace behind; the machine's own
namespace is never changed (its interfaces are the same before and after)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.chaos.network import Network, available

pytestmark = pytest.mark.skipif(not available(), reason="needs root, ip and iptables")

# a TCP listener in one namespace, a connect from another: exit 0 when the connect succeeds
LISTEN = "import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 7000)); s.listen(); print('up', flush=True); " \
         "[s.accept()[0].close() for _ in iter(int, 1)]"
CONNECT = "import socket,sys; socket.create_connection((sys.argv[1], 7000), timeout=0.5).close()"


def reaches(net: Network, source: str, target: str) -> bool:
    done = subprocess.run([*net.exec_prefix(source), sys.executable, "-c", CONNECT, net.address(target)],
                          capture_output=True, timeout=10)
    return done.returncode == 0


def interfaces() -> set[str]:
    """The names of the machine's own interfaces (`ip -o link`: "N: name[@peer]: ...")."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout


@pytest.mark.timeout(60)
def test_isolate_cut_and_heal() -> None:
    before, spaces = interfaces(), namespaces()
    net = Network(["a", "b", "c"])
    with net:
        servers = [subprocess.Popen([*net.exec_prefix(m), sys.executable, "-c", LISTEN, net.address(m)],
                                    stdout=subprocess.PIPE) for m in ("a", "b")]
        try:
            for server in servers:
                assert server.stdout is not None and server.stdout.readline() == b"up\n"
            assert reaches(net, "c", "a") and reaches(net, "c", "b") and reaches(net, "a", "b")
            net.isolate("a", ["b"])
            assert not reaches(net, "a", "b") and not reaches(net, "b", "a")
            assert reaches(net, "c", "a") and reaches(net, "c", "b")  # a partial partition
            net.cut("b")
            assert not reaches(net, "c", "b") and reaches(net, "c", "a")
            net.heal()
            assert reaches(net, "a", "b") and reaches(net, "c", "b")
        finally:
            for server in servers:
                server.kill()
                server.wait(5)
        # nothing of it in the machine's namespace (others may add interfaces there meanwhile: only ours count)
        assert not (interfaces() - before) & {"br0", "eth0", "v1", "v2", "v3"}
    assert namespaces() == spaces
