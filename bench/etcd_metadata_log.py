"""The metadata log on etcd, measured: etcd's start, appends (latency of one fenced transaction),
the delay from an append to a watching reader, and the controller failover after kill -9.

    flock /work/notes/bench.lock python bench/etcd_metadata_log.py [--appends 300]

Uses Debian's etcd (broker/testing/etcd.py starts it on free ports in a temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.cluster.election import ControllerElection, Session, campaign  # noqa: E402
from broker.cluster.etcd_http import HttpEtcd  # noqa: E402
from broker.cluster.keys import ClusterKeys  # noqa: E402
from broker.cluster.metadata_log import MetadataLog  # noqa: E402
from broker.testing.etcd import EtcdMember  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def measure(member: EtcdMember, appends: int) -> None:
    etcd = HttpEtcd([member.client_url])
    keys = ClusterKeys("bench")
    log = MetadataLog(etcd, keys)
    leader = await campaign(etcd, keys, 1, await etcd.grant_lease(60))
    assert leader is not None
    record = b"r" * 60  # about a PartitionRecord
    arrivals: dict[int, float] = {}

    async def read() -> None:
        async for item in log.read(0):
            arrivals[item.end_offset] = time.perf_counter()

    reader = asyncio.create_task(read())
    end = 0
    latency, delivery = [], []
    for _ in range(appends):
        began = time.perf_counter()
        end = await log.append(leader, [record], end)
        done = time.perf_counter()
        latency.append(done - began)
        while end not in arrivals:
            await asyncio.sleep(0)
        delivery.append(arrivals[end] - began)
    began = time.perf_counter()
    end = await log.append(leader, [record] * 10_000, end)
    big = time.perf_counter() - began
    reader.cancel()
    await etcd.close()
    print("append of 1 record: p50 %.2f ms, p99 %.2f ms (%d appends)" % (
        statistics.median(latency) * 1e3, pct(latency, 0.99) * 1e3, appends))
    print("append -> a watching reader has it: p50 %.2f ms, p99 %.2f ms from the append's start" % (
        statistics.median(delivery) * 1e3, pct(delivery, 0.99) * 1e3))
    print("append of 10,000 records of 60 bytes (%d keys): %.1f ms" % ((10_000 * 62) // (256 * 1024) + 1, big * 1e3))


async def failover(member: EtcdMember, ttl_ms: int) -> float:
    etcd = HttpEtcd([member.client_url])
    cluster = "failover-%d-%d" % (ttl_ms, time.monotonic_ns())
    holder = subprocess.Popen([sys.executable, "-m", "tests.cluster.holder", member.client_url, cluster, "1",
                               str(ttl_ms)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert holder.stdout is not None
    while not holder.stdout.readline().startswith(b"controller"):
        pass
    session = Session(etcd, ttl_ms)
    await session.start()
    standby = ControllerElection(etcd, ClusterKeys(cluster), 2, session)
    standby.start()
    await standby.wait_for(lambda e: e.controller is not None, 10)
    killed = time.monotonic()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    await standby.wait_for(lambda e: e.leadership is not None, ttl_ms / 1000 + 10)
    took = time.monotonic() - killed
    await standby.stop()
    await session.close()
    await etcd.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--failovers", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        starts = []
        for i in range(3):
            m = EtcdMember(Path(tmp) / ("s%d" % i))
            m.start()
            starts.append(m.start_seconds)
            m.stop()
        restart = EtcdMember(Path(tmp) / "s0")
        restart.start()
        restart.stop()
        print("etcd start to healthy: fresh %s s, restart on its data %.2f s" % (
            ", ".join("%.2f" % s for s in starts), restart.start_seconds))
        member = EtcdMember(Path(tmp) / "bench")
        member.start()
        try:
            asyncio.run(measure(member, args.appends))
            for ttl_ms in (1000, 3000):
                took = [asyncio.run(failover(member, ttl_ms)) for _ in range(args.failovers)]
                print("failover after kill -9, lease %d ms: %s s" % (ttl_ms, ", ".join("%.2f" % t for t in took)))
        finally:
            member.stop()


if __name__ == "__main__":
    main()
