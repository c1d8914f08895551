"""Bad input and faults of a cluster of broker processes on etcd (issue 22): etcd unreachable at
start, two nodes with one node.id, a node of another cluster, etcd lost while the nodes run and
back; and the bugs the cluster tests found (a controller that did not stop on SIGTERM, two share
consumers joining at once refused with TOPIC_ALREADY_EXISTS)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import messages as M
from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    GROUP,
    create_topic,
    key_coordinated_by,
    live_brokers,
    need_etcd,
    roles,
    shared_cluster,
    start_cluster,
    wait_live,
)
from tests.harness import ROOT, RawClient, free_port

SHARE_GROUP_HEARTBEAT = 76


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    yield from shared_cluster(tmp_path_factory.mktemp("cluster"))


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[ProcessCluster]:
    """A cluster of its own, for a test that stops nodes or etcd."""
    need_etcd()
    made = start_cluster(tmp_path / "fresh")
    try:
        yield made
    finally:
        made.stop()


def run_broker(data: Path, timeout: float, **overrides: str) -> subprocess.CompletedProcess[str]:
    """`python -m broker` with these properties, expected to exit by itself within `timeout`."""
    data.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "broker"]
    props = {"listeners": "PLAINTEXT://127.0.0.1:%d" % free_port(), "log.dirs": str(data), **overrides}
    for key, value in props.items():
        args += ["--override", "%s=%s" % (key.replace("_", "."), value)]
    return subprocess.run(args, cwd=str(ROOT), capture_output=True, text=True, timeout=timeout,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


# at start -----------------------------------------------------------------------------------------
def test_etcd_unreachable_at_start(tmp_path: Path) -> None:
    dead = "http://127.0.0.1:%d" % free_port()
    began = time.monotonic()
    done = run_broker(tmp_path / "data", 30, **{"node.id": "1", "etcd.endpoints": dead})
    assert done.returncode != 0
    assert time.monotonic() - began < 20
    assert "error: etcd is unreachable (%s)" % dead in done.stderr, done.stderr


def test_a_second_node_with_the_same_node_id_refuses_to_start(cluster: ProcessCluster, tmp_path: Path) -> None:
    done = run_broker(tmp_path / "twin", 30, **{"node.id": "2", "etcd.endpoints": cluster.etcd.client_url,
                                               "broker.session.timeout.ms": "3000",
                                               "etcd.lease.timeout.ms": "2000"})
    assert done.returncode != 0
    assert "error: node.id 2 is already in use by another node" in done.stderr, done.stderr
    # the node that holds the id is not disturbed
    assert live_brokers(cluster.node(2).port) == set(cluster.nodes)
    assert cluster.node(2).proc is not None and cluster.node(2).proc.poll() is None


def test_a_node_of_another_cluster_refuses_to_start(cluster: ProcessCluster, tmp_path: Path) -> None:
    data = tmp_path / "stranger"
    data.mkdir()
    other = "OtherClusterIdAAAAAAAAA"[:22]
    (data / "meta.properties").write_text("cluster.id=%s\ndirectory.id=%s\nnode.id=4\nversion=1\n"
                                          % (other, "B" * 22))
    done = run_broker(data, 30, **{"node.id": "4", "etcd.endpoints": cluster.etcd.client_url})
    assert done.returncode != 0
    assert "error: this node belongs to cluster %s but the etcd at %s holds cluster" % (
        other, cluster.etcd.client_url) in done.stderr, done.stderr
    assert live_brokers(cluster.node(1).port) == set(cluster.nodes)


# while running ------------------------------------------------------------------------------------
def test_sigterm_of_the_controller_stops_it_cleanly(fresh: ProcessCluster) -> None:
    """The controller's fencing timer was left running by its stop, which then awaited it for
    ever: SIGTERM ended in kill -9 after 20 s."""
    active, other = roles(fresh)
    began = time.monotonic()
    assert fresh.node(active).stop(timeout=10) == 0
    assert time.monotonic() - began < 5
    survivors = set(fresh.nodes) - {active}
    wait_live(fresh, survivors, timeout=15)


def test_share_consumers_joining_at_once_on_a_node_that_is_not_the_controller(fresh: ProcessCluster) -> None:
    """Two members joining a share group at once, before __share_group_state exists, on a
    coordinator that is not the controller: both asked the controller to create the topic, and the
    second was answered TOPIC_ALREADY_EXISTS (fatal to librdkafka's ShareConsumer)."""
    active, other = roles(fresh)
    port = fresh.node(other).port
    assert create_topic(port, "shared", 3) == (0, None)
    group = key_coordinated_by(port, GROUP, other, "share-join")
    R = M.ShareGroupHeartbeatRequest
    clients = [RawClient(port, "share-join-%d" % i) for i in range(2)]
    try:
        for client in clients:  # both sent before either is answered
            client.send(SHARE_GROUP_HEARTBEAT, 1, R(group_id=group, member_id=uuid.uuid4().hex, member_epoch=0,
                                                    subscribed_topic_names=["shared"]))
        answers = [client.receive(SHARE_GROUP_HEARTBEAT, 1) for client in clients]
    finally:
        for client in clients:
            client.close()
    assert [(a.error_code, a.error_message) for a in answers] == [(0, None), (0, None)]
