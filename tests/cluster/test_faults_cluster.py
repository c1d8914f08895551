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
from typing import Any

import pytest
from confluent_kafka import Producer

from broker.testing.etcd import EtcdMember
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.cluster.harness import FAST, ProcessCluster
from tests.cluster.nodes import (
    GROUP,
    create_topic,
    find_coordinator,
    key_coordinated_by,
    live_brokers,
    need_etcd,
    read_to_end,
    roles,
    shared_cluster,
    spread,
    start_cluster,
    wait_live,
)
from tests.cluster.nodes import (
    leaders as leaders_of,
)
from tests.harness import ROOT, BrokerProcess, RawClient, free_port, wait_for

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
    out, err = data.with_name(data.name + ".out"), data.with_name(data.name + ".err")
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen(args, cwd=str(ROOT), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            raise AssertionError("the broker did not exit within %.0f s; its output:\n%s\n%s" % (
                timeout, out.read_text()[-3000:], err.read_text()[-3000:])) from None
    return subprocess.CompletedProcess(args, code, out.read_text(), err.read_text())


# at start -----------------------------------------------------------------------------------------
def test_etcd_unreachable_at_start(tmp_path: Path) -> None:
    dead = "http://127.0.0.1:%d" % free_port()
    began = time.monotonic()
    done = run_broker(tmp_path / "data", 30, **{"node.id": "1", "etcd.endpoints": dead,
                                               "initial.broker.registration.timeout.ms": "1500"})
    assert done.returncode != 0
    assert 1.5 <= time.monotonic() - began < 20  # it waited for etcd, as long as it was told
    assert "waiting for etcd" in done.stdout + done.stderr
    assert "error: etcd is unreachable (%s)" % dead in done.stderr, done.stderr


def test_a_node_started_before_etcd_waits_for_it(tmp_path: Path) -> None:
    """Compose files start the brokers beside etcd (podman-compose does not wait for its health
    check): a node that finds etcd not answering yet joins once it does, as a Kafka broker waits
    for its controller quorum."""
    need_etcd()
    etcd = EtcdMember(tmp_path / "etcd")
    data = tmp_path / "node1" / "data"
    data.mkdir(parents=True)
    node = BrokerProcess(data, overrides={"node.id": "1", "etcd.endpoints": etcd.client_url, **FAST}).launch()
    try:
        wait_for(lambda: "waiting for etcd" in node.output(), 30, what="the node to wait for etcd")
        assert node.proc is not None and node.proc.poll() is None
        etcd.start()
        node.wait_listening(40)
        wait_for(lambda: live_brokers(node.port) == {1}, 30, what="the node to serve as a live broker")
    finally:
        node.stop()
        etcd.stop()


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


class Acks:
    """A producer (acks=all) and what it got acknowledged."""

    def __init__(self, cluster: ProcessCluster, idempotent: bool) -> None:
        self.producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": idempotent,
                                  "acks": "all", "message.timeout.ms": 20000, "linger.ms": 5})
        self.acked: list[bytes] = []
        self.errors: list[object] = []

    def _delivered(self, err: object, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.append(msg.value())

    def send(self, topic: str, partitions: int, tag: str, n: int = 5) -> None:
        """n records to each partition, every one acknowledged."""
        for i in range(n):
            for partition in range(partitions):
                self.producer.produce(topic, value=b"%s-%d-%d" % (tag.encode(), partition, i), partition=partition,
                                      on_delivery=self._delivered)
        assert self.producer.flush(30) == 0
        assert not self.errors, self.errors


def refused_in_time(cluster: ProcessCluster, prefix: str) -> None:
    """Without etcd: on every node a metadata change is refused retriably and a coordinator that
    needs a new internal topic is not available, both answered at once (not after a timeout)."""
    for node in cluster.nodes:
        port = cluster.node(node).port
        began = time.monotonic()
        code, message = create_topic(port, "%s-%d" % (prefix, node), 3, timeout=5)
        assert code == ErrorCode.NOT_CONTROLLER, (node, code, message)
        assert find_coordinator(port, GROUP, "%s-group" % prefix) == (ErrorCode.COORDINATOR_NOT_AVAILABLE, -1)
        assert time.monotonic() - began < 2, (node, time.monotonic() - began)


@pytest.mark.timeout(150)
def test_etcd_lost_while_running_and_back(fresh: ProcessCluster) -> None:
    """Without etcd the nodes serve produce and fetch for what they lead, metadata changes get a
    retriable error (not a hang), and once etcd is back everything resumes by itself; nothing
    acknowledged is lost (a reload of the controller's image once emptied it and its logs)."""
    partitions = 6
    port = fresh.node(1).port
    assert create_topic(port, "before", partitions) == (0, None)
    leaders = spread(fresh, "before", partitions)
    idempotent = Acks(fresh, idempotent=True)
    idempotent.send("before", partitions, "a")

    fresh.etcd.kill()
    lost = time.monotonic()
    idempotent.send("before", partitions, "b")  # its producer id was given before
    plain = Acks(fresh, idempotent=False)  # a new idempotent producer needs an id block from the controller
    plain.send("before", partitions, "p")
    refused_in_time(fresh, "during")
    # serving on, past the lease and the broker session timeout: nobody fences anybody
    session = int(fresh.overrides["broker.session.timeout.ms"]) / 1000
    rounds = 0
    while time.monotonic() - lost < session + 1:
        idempotent.send("before", partitions, "c%d" % rounds, n=1)
        rounds += 1
        time.sleep(0.2)  # a producer's pace, not a wait for anything
    for node in fresh.nodes:
        assert live_brokers(fresh.node(node).port) == set(fresh.nodes)
        assert leaders_of(fresh.node(node).port, "before") == leaders
    refused_in_time(fresh, "later")  # the leases are lost by now: no node calls itself the controller
    every = idempotent.acked + plain.acked
    assert sorted(read_to_end(fresh, "before", partitions, len(every))) == sorted(every)

    fresh.etcd.start()
    back = time.monotonic()
    wait_for(lambda: create_topic(port, "after", partitions, timeout=5)[0] in (0, ErrorCode.TOPIC_ALREADY_EXISTS),
             40, interval=0.2, what="CreateTopics to work again")
    recovered = time.monotonic() - back
    wait_live(fresh, timeout=30)
    spread(fresh, "after", partitions)
    fresh_producer = Acks(fresh, idempotent=True)
    fresh_producer.send("after", partitions, "d")
    assert sorted(read_to_end(fresh, "after", partitions, len(fresh_producer.acked))) == sorted(fresh_producer.acked)
    assert sorted(read_to_end(fresh, "before", partitions, len(every))) == sorted(every)
    print("etcd back: CreateTopics works again after %.2f s" % recovered)
