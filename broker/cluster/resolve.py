"""Host names of etcd and of the other nodes, resolved once and kept.

A container network's resolver can stop answering for a minute on a loaded machine (podman's
aardvark-dns in CI answered "Temporary failure in name resolution" to one broker while the others
ran on). A node that looked a name up at every connection then lost etcd with it: its lease, its
controller, its metadata. So an address is kept once resolved, as the JVM keeps one (30 s,
`networkaddress.cache.ttl`'s default), and looked up again after that or after a connection to
it failed; while the lookup fails or takes longer than the caller may wait, the last address
serves. One lookup per name runs at a time, so a stalled resolver never piles up lookups (each
holds a thread of the lookup pool until the resolver's own timeout).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from broker.observability.logger import get_logger

log = get_logger("broker.cluster")

CACHE_TTL_S = 30.0

Lookup = Callable[[str, int], Awaitable[str]]


async def getaddrinfo_lookup(host: str, port: int) -> str:
    """The first address the system's resolver gives for `host` (as a connection would try first)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError("no address for %s" % host)
    return str(infos[0][4][0])


@dataclass
class _Entry:
    address: str
    resolved_at: float
    stale: bool = False


class Resolver:
    """Addresses of host names: the kept one while fresh, a new lookup after, the kept one again
    when that lookup fails or is late."""

    def __init__(self, lookup: Lookup = getaddrinfo_lookup, ttl_s: float = CACHE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lookup = lookup
        self.ttl_s = ttl_s
        self.clock = clock
        self._kept: dict[str, _Entry] = {}
        self._pending: dict[str, asyncio.Task[str]] = {}

    async def address(self, host: str, port: int, timeout: float) -> str:
        """An address to connect to for `host`; OSError or TimeoutError when there is none yet."""
        if _is_literal(host):
            return host
        entry = self._kept.get(host)
        if entry is not None and not entry.stale and self.clock() - entry.resolved_at < self.ttl_s:
            return entry.address
        task = self._pending.get(host)
        if task is None:
            task = self._pending[host] = asyncio.get_running_loop().create_task(self._resolve(host, port))
            task.add_done_callback(self._settled)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(task)
        except (OSError, TimeoutError) as exc:
            if entry is None:
                raise
            log.debug("resolving failed: using the address kept", host=host, address=entry.address, error=repr(exc))
            return entry.address

    async def open_connection(self, host: str, port: int, timeout: float,
                              **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """asyncio.open_connection to `host`'s address; one that fails (refused, no answer in
        time) has the name looked up again next time: it may point elsewhere now."""
        address = await self.address(host, port, timeout)
        try:
            return await asyncio.open_connection(address, port, **kwargs)
        except BaseException:
            self.failed(host)
            raise

    def failed(self, host: str) -> None:
        """A connection to `host`'s kept address failed: look it up again at the next connection."""
        entry = self._kept.get(host)
        if entry is not None:
            entry.stale = True

    async def _resolve(self, host: str, port: int) -> str:
        address = await self.lookup(host, port)
        self._kept[host] = _Entry(address, self.clock())
        return address

    def _settled(self, task: asyncio.Task[str]) -> None:
        for host, pending in list(self._pending.items()):
            if pending is task:
                del self._pending[host]
        if not task.cancelled():
            task.exception()  # retrieved: a lookup its callers stopped waiting for fails quietly

    def close(self) -> None:
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
