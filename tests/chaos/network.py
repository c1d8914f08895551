"""A private network for network partitions (the nemesis' next step): a switch namespace holding
a bridge, and one network namespace per member (a broker, etcd, the clients) joined to the
bridge by a veth pair, with an address 10.231.<subnet>.<n>/24. Nothing is created in the
machine's own namespace, and `destroy` removes every namespace it made (their interfaces go
with them).

Faults: `isolate(member, peers)` drops every packet between the member and those peers with
iptables inside the member's namespace and theirs (a partition that can be one-sided when asked);
`cut(member)` takes the member's link down on the switch (it reaches nobody); `heal()` undoes
both. Processes join a member with `exec_prefix(member)` (`ip netns exec <ns>`, which execs the
command: the PID is the process's own, so kill -9 and SIGSTOP still apply).

A thread joins a member with `entered(member)` (setns(2): the sockets it opens, and the threads
it starts, such as librdkafka's, live in the member's network) and is back where it was after.

Root is needed (ip netns, iptables); `available()` says whether this machine can.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Sequence

_runs = itertools.count()
CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    """setns(2) of the calling thread into a network namespace (os.setns is Python 3.12's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "setns: %s" % os.strerror(errno))


@functools.cache
def available() -> bool:
    """Root, `ip` and `iptables`, and a network namespace can be made here (a container may
    forbid it even to root)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None:
        return False
    probe = "c%dprobe" % (os.getpid() % 100000)
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, timeout=10).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    return made


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=10)


class Network:
    def __init__(self, members: Sequence[str], subnet: int = 0) -> None:
        assert len(members) < 200 and len(set(members)) == len(members)
        run = "c%d%d" % (os.getpid() % 100000, next(_runs))  # short: interface names have 15 bytes
        self.prefix = run
        self.members = list(members)
        self.subnet = subnet
        self.switch = "%s-sw" % run
        self.namespaces = {m: "%s-%d" % (run, i + 1) for i, m in enumerate(self.members)}
        self.addresses = {m: "10.231.%d.%d" % (subnet, i + 1) for i, m in enumerate(self.members)}
        self._made: list[str] = []
        self._isolated: set[tuple[str, str]] = set()
        self._cut: set[str] = set()

    def _port(self, member: str) -> str:
        return "v%d" % (self.members.index(member) + 1)

    def create(self) -> Network:
        try:
            for ns in [self.switch, *self.namespaces.values()]:
                _run("ip", "netns", "add", ns)
                self._made.append(ns)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            for member, ns in self.namespaces.items():
                port = self._port(member)
                _run("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", ns, "addr", "add", "%s/24" % self.addresses[member], "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self._made.clear()

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def address(self, member: str) -> str:
        return self.addresses[member]

    def exec_prefix(self, member: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[member]]

    def namespace_path(self, member: str) -> str:
        """For setns(2) from a thread (its sockets, and threads it starts, then live in the member)."""
        return "/run/netns/%s" % self.namespaces[member]

    @contextlib.contextmanager
    def entered(self, member: str) -> Iterator[None]:
        """The calling thread in `member`'s network for the block (threads it starts meanwhile stay
        there)."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(self.namespace_path(member), os.O_RDONLY)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(home)

    # faults --------------------------------------------------------------------------------------
    def _drop(self, member: str, peer: str, action: str) -> None:
        ns, other = self.namespaces[member], self.addresses[peer]
        for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
            _run("ip", "netns", "exec", ns, "iptables", action, chain, flag, other, "-j", "DROP")

    def isolate(self, member: str, peers: Iterable[str], both_ways: bool = True) -> None:
        """No packet between `member` and each of `peers` (with both_ways False: only the member
        drops, so the peers' packets reach it and go unanswered)."""
        for peer in peers:
            if (member, peer) not in self._isolated:
                self._drop(member, peer, "-A")
                self._isolated.add((member, peer))
            if both_ways and (peer, member) not in self._isolated:
                self._drop(peer, member, "-A")
                self._isolated.add((peer, member))

    def cut(self, member: str) -> None:
        _run("ip", "-n", self.switch, "link", "set", self._port(member), "down")
        self._cut.add(member)

    def heal(self) -> None:
        for member, peer in sorted(self._isolated):
            self._drop(member, peer, "-D")
        self._isolated.clear()
        for member in sorted(self._cut):
            _run("ip", "-n", self.switch, "link", "set", self._port(member), "up")
        self._cut.clear()
