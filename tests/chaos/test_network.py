"""The private network of tests/chaos/network.py: members reach each other by TCP, isolate and
cut stop that, heal restores it, and destroy leaves no namespace behind; the machine's own
namespace is never changed (its interfaces are the same before and after)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.network import Network, available
from tests.harness import wait_for

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


@pytest.mark.timeout(120)
def test_a_leader_cut_off_from_the_cluster_acknowledges_nothing_it_cannot_replicate(tmp_path: Path) -> None:
    """Split brain: the leader of a partition loses the other brokers and etcd while its clients
    still reach it. With acks=all it acknowledges nothing of what it takes meanwhile (its followers
    cannot fetch, and the controller it cannot reach would refuse its ISR shrink): a send there
    times out, as in Kafka. The cluster fences it and elects a new leader; once healed the old
    leader truncates what it took and follows, and producing goes on. Every record acknowledged
    is read back, once."""
    from confluent_kafka import Producer

    from tests.cluster.harness import ETCD_MEMBER, ProcessCluster, member_name
    from tests.cluster.nodes import create_topic, leaders, need_etcd, read_to_end, start_cluster, wait_leaders

    need_etcd()
    net = Network([member_name(n) for n in (1, 2, 3)] + [ETCD_MEMBER, "clients"])
    with net, net.entered("clients"):
        cluster: ProcessCluster = start_cluster(tmp_path / "cluster", 3, {"min.insync.replicas": "2"}, net)
        try:
            assert create_topic(cluster.node(1).port, "split", 1, 3) == (0, None)
            old = wait_leaders(cluster, "split", lambda ls: ls.get(0, -1) >= 0)[0]
            producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0,
                                 "enable.idempotence": True, "request.timeout.ms": 3000,
                                 "message.timeout.ms": 8000})
            acked: list[bytes] = []
            sent_values: list[bytes] = []

            def sent(err: Any, msg: Any) -> None:
                if err is None:
                    acked.append(msg.value())

            def produce(n: int) -> None:
                for _ in range(n):
                    value = b"v%d" % len(sent_values)
                    sent_values.append(value)
                    producer.produce("split", value, partition=0, on_delivery=sent)
                    producer.poll(0.01)

            produce(20)
            assert producer.flush(20) == 0 and len(acked) == 20
            net.isolate(member_name(old), [member_name(n) for n in (1, 2, 3) if n != old] + [ETCD_MEMBER])
            produce(20)  # the old leader takes them, and cannot have them committed
            others = [p.port for n, p in cluster.nodes.items() if n != old]
            wait_for(lambda: leaders(others[0], "split").get(0, -1) not in (-1, old), 30, what="a new leader")
            producer.flush(15)  # what went to the old leader times out (or is retried to the new one)
            net.heal()
            wait_leaders(cluster, "split", lambda ls: ls.get(0, -1) not in (-1, old))
            before = len(acked)
            produce(20)
            assert producer.flush(30) == 0 and len(acked) == before + 20, "producing did not go on after the heal"
            got = read_to_end(cluster, "split", 1, len(acked), timeout=30)
            assert set(acked) <= set(got), "acknowledged and lost: %s" % sorted(set(acked) - set(got))
            assert len(got) == len(set(got)), "read twice"
        finally:
            cluster.stop()


@pytest.mark.timeout(90)
def test_the_others_stay_live_when_the_controller_is_cut_off(tmp_path: Path) -> None:
    """The active controller loses the other brokers and etcd: another node is elected, and the
    others' heartbeats go to it at once instead of waiting on the lost one (they did, until their
    own calls timed out, and the new controller fenced every broker, itself included, leaving
    every partition without a leader); once healed, the old controller rejoins as a broker."""
    from tests.cluster.harness import ETCD_MEMBER, ProcessCluster, member_name
    from tests.cluster.nodes import (
        controller,
        create_topic,
        leaders,
        need_etcd,
        start_cluster,
        wait_leaders,
        wait_live,
    )

    need_etcd()
    net = Network([member_name(n) for n in (1, 2, 3)] + [ETCD_MEMBER, "clients"])
    with net, net.entered("clients"):
        cluster: ProcessCluster = start_cluster(tmp_path / "cluster", 3, None, net)
        try:
            old = controller(cluster.node(1).port)
            rest = [n for n in cluster.nodes if n != old]
            assert create_topic(cluster.node(rest[0]).port, "kept", 3, 3) == (0, None)
            wait_leaders(cluster, "kept", lambda ls: len(ls) == 3 and min(ls.values()) >= 0)
            net.isolate(member_name(old), [member_name(n) for n in rest] + [ETCD_MEMBER])
            port = cluster.node(rest[0]).port
            wait_for(lambda: controller(port) in rest, 20, what="a new controller")
            wait_live(cluster, rest, timeout=20)  # only the cut-off node fenced
            found = wait_leaders(cluster, "kept", lambda ls: set(ls.values()) <= set(rest), nodes=rest)
            assert len(found) == 3
            net.heal()
            wait_live(cluster, timeout=30)
            assert set(leaders(port, "kept")) == {0, 1, 2}
        finally:
            cluster.stop()
