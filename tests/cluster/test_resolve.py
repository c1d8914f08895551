"""Host names resolved once and kept: a resolver that stops answering (a container network's DNS
under load) costs a node neither etcd nor its peers, and never piles up lookups."""

from __future__ import annotations

import asyncio

import pytest

from broker.cluster.etcd_fake import ManualClock
from broker.cluster.etcd_http import HttpEtcd
from broker.cluster.resolve import Resolver
from broker.testing.etcd import EtcdMember


class FakeDns:
    """Answers, fails (EAI_AGAIN) or stalls, as told; counts the lookups."""

    def __init__(self, address: str = "10.0.0.7") -> None:
        self.address = address
        self.mode = "answer"
        self.lookups = 0
        self.stalled: list[asyncio.Future[None]] = []

    async def lookup(self, host: str, port: int) -> str:
        self.lookups += 1
        if self.mode == "fail":
            raise OSError(-3, "Temporary failure in name resolution")
        if self.mode == "stall":
            stall = asyncio.get_running_loop().create_future()
            self.stalled.append(stall)
            await stall
        return self.address


async def resolved(dns: FakeDns, clock: ManualClock | None = None) -> Resolver:
    """A resolver that has looked `etcd` up once."""
    resolver = Resolver(dns.lookup, clock=clock or ManualClock())
    assert await resolver.address("etcd", 2379, 1.0) == dns.address
    return resolver


async def test_an_address_is_kept_while_fresh_and_looked_up_again_after() -> None:
    dns, clock = FakeDns(), ManualClock()
    resolver = Resolver(dns.lookup, ttl_s=30.0, clock=clock)
    assert await resolver.address("etcd", 2379, 1.0) == "10.0.0.7"
    assert await resolver.address("etcd", 2379, 1.0) == "10.0.0.7"
    assert dns.lookups == 1
    clock.now += 31.0
    dns.address = "10.0.0.8"
    assert await resolver.address("etcd", 2379, 1.0) == "10.0.0.8"
    assert dns.lookups == 2


async def test_a_failed_connection_looks_the_name_up_again() -> None:
    dns = FakeDns()
    resolver = await resolved(dns)
    dns.address = "10.0.0.9"
    resolver.failed("etcd")
    assert await resolver.address("etcd", 2379, 1.0) == "10.0.0.9"
    assert dns.lookups == 2


async def test_a_failing_resolver_leaves_the_kept_address_in_use() -> None:
    dns, clock = FakeDns(), ManualClock()
    resolver = await resolved(dns, clock)
    dns.mode = "fail"
    clock.now += 60.0
    resolver.failed("etcd")
    assert await resolver.address("etcd", 2379, 1.0) == "10.0.0.7"
    assert await resolver.address("etcd", 2379, 1.0) == "10.0.0.7"
    assert dns.lookups == 3  # tried each time, none kept it from connecting


async def test_a_stalled_resolver_runs_one_lookup_at_a_time_and_the_kept_address_serves_meanwhile() -> None:
    dns = FakeDns()
    resolver = await resolved(dns)
    dns.mode = "stall"
    resolver.failed("etcd")
    answers = [await resolver.address("etcd", 2379, 0.01) for _ in range(5)]
    assert answers == ["10.0.0.7"] * 5
    assert dns.lookups == 2 and len(dns.stalled) == 1  # the callers waited on the one lookup under way
    dns.address = "10.0.0.8"
    dns.stalled[0].set_result(None)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert await resolver.address("etcd", 2379, 0.01) == "10.0.0.8"
    assert dns.lookups == 2


async def test_a_name_never_resolved_fails_with_the_resolvers_error_or_in_time() -> None:
    dns = FakeDns()
    resolver = Resolver(dns.lookup, clock=ManualClock())
    dns.mode = "fail"
    with pytest.raises(OSError, match="Temporary failure"):
        await resolver.address("etcd", 2379, 1.0)
    dns.mode = "stall"
    with pytest.raises(TimeoutError):
        await resolver.address("etcd", 2379, 0.01)
    resolver.close()


async def test_an_ip_address_is_not_looked_up() -> None:
    dns = FakeDns()
    resolver = Resolver(dns.lookup, clock=ManualClock())
    assert await resolver.address("127.0.0.1", 2379, 1.0) == "127.0.0.1"
    assert await resolver.address("::1", 2379, 1.0) == "::1"
    assert dns.lookups == 0


async def test_etcd_named_by_host_keeps_answering_while_the_resolver_fails(etcd_member: EtcdMember) -> None:
    url = etcd_member.client_url.replace("127.0.0.1", "etcd-host")
    dns = FakeDns("127.0.0.1")
    client = HttpEtcd([url], timeout=2.0, connect_timeout=0.5)
    client.resolver = Resolver(dns.lookup)
    try:
        await client.put(b"/r/a", b"1")
        dns.mode = "fail"
        for i in range(3):  # every call on a new connection, as after etcd closed the old ones
            await client.close()
            client.resolver.failed("etcd-host")
            await client.put(b"/r/a", b"%d" % i)
        assert (await client.get(b"/r/a")) is not None
        assert dns.lookups >= 4
    finally:
        await client.close()
