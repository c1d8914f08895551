"""Fixtures for the cluster-on-etcd tests: a real etcd (one member, or three) on free 127.0.0.1
ports with a temporary data dir, stopped by PID; clients of it; the in-memory fake."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.cluster.etcd_fake import FakeEtcd, ManualClock
from broker.cluster.etcd_http import HttpEtcd
from broker.testing.etcd import EtcdCluster, EtcdMember, etcd_available


def _need_etcd() -> None:
    if not etcd_available():
        if os.environ.get("CI"):
            pytest.fail("etcd is not installed: .ci/run installs Debian's etcd-server")
        pytest.skip("etcd is not installed (Debian: etcd-server)")


@pytest.fixture
def etcd_member(tmp_path: Path) -> Iterator[EtcdMember]:
    _need_etcd()
    member = EtcdMember(tmp_path / "etcd")
    member.start()
    try:
        yield member
    finally:
        member.stop()


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    _need_etcd()
    cluster = EtcdCluster(tmp_path / "etcd-cluster", size=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def etcd(etcd_member: EtcdMember) -> AsyncIterator[HttpEtcd]:
    client = HttpEtcd([etcd_member.client_url], timeout=2.0, watch_idle_timeout=1.0)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fake(clock: ManualClock) -> FakeEtcd:
    return FakeEtcd(clock)
