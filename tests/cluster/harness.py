"""A real cluster for tests: one etcd member and N `python -m broker` processes on 127.0.0.1, each
with its own port and log directory, all with the same `etcd.endpoints`; stopped by their PIDs.

With a `network` (tests/chaos/network.py, its members named by `member_name`) each broker and
etcd run in a network namespace of their own, at its address, so that the fault runs can cut
them apart; whoever talks to them must then be in the network too (the chaos runner enters its
"clients" member)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.testing.etcd import EtcdCluster, EtcdMember
from tests.harness import HOSTS, BrokerProcess, free_port, wait_for

if TYPE_CHECKING:
    from tests.chaos.network import Network

ETCD_MEMBER = "etcd"


def member_name(node_id: int) -> str:
    return "node%d" % node_id

FAST = {  # the cluster notices a dead node within seconds, not Kafka's 9 s
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "etcd.lease.timeout.ms": "2000",
}


class ProcessCluster:
    """`etcd_members` above one: an etcd cluster of that many members (on 127.0.0.1; not with a
    `network`), every node given all their endpoints; `etcd` is the first of them."""

    def __init__(self, base: Path, size: int = 3, overrides: dict[str, str] | None = None,
                 network: Network | None = None, node_overrides: dict[int, dict[str, str]] | None = None,
                 etcd_members: int = 1) -> None:
        self.base = base
        self.network = network
        if network is None and etcd_members > 1:
            self.etcd_members = EtcdCluster(base / "etcd", etcd_members).members
        elif network is None:
            self.etcd_members = [EtcdMember(base / "etcd")]
        elif etcd_members == 1:
            self.etcd_members = [EtcdMember(base / "etcd", client_port=2379, peer_port=2380,
                                            host=network.address(ETCD_MEMBER), prefix=network.exec_prefix(ETCD_MEMBER))]
        else:
            raise ValueError("a cluster in a network of its own has one etcd member")
        self.etcd = self.etcd_members[0]
        self.overrides = {**FAST, **(overrides or {})}
        self.nodes: dict[int, BrokerProcess] = {}
        for node_id in range(1, size + 1):
            self.nodes[node_id] = self._process(node_id, free_port())
            self.nodes[node_id].overrides.update((node_overrides or {}).get(node_id, {}))

    def _process(self, node_id: int, port: int) -> BrokerProcess:
        data = self.base / ("node%d" % node_id) / "data"
        data.mkdir(parents=True, exist_ok=True)
        overrides = {"node.id": str(node_id), **self.overrides}
        if self.network is None:
            return BrokerProcess(data, port, overrides=overrides)
        member = member_name(node_id)
        return BrokerProcess(data, port, overrides=overrides, host=self.network.address(member),
                             prefix=self.network.exec_prefix(member))

    @property
    def etcd_endpoints(self) -> str:
        return ",".join(m.client_url for m in self.etcd_members)

    def start(self) -> ProcessCluster:
        for member in self.etcd_members:  # all launched before any is waited on: they need each other
            member.launch()
        for member in self.etcd_members:
            member.wait_healthy(20)
        for process in self.nodes.values():
            process.overrides["etcd.endpoints"] = self.etcd_endpoints
            process.start(timeout=40)
        return self

    @property
    def bootstrap(self) -> str:
        return ",".join(p.bootstrap for p in self.nodes.values())

    def node(self, node_id: int) -> BrokerProcess:
        return self.nodes[node_id]

    def restart(self, node_id: int) -> BrokerProcess:
        """Start a stopped or killed node again, on its port and log directory."""
        process = self.nodes[node_id]
        process.start(timeout=40)
        return process

    def stop(self) -> None:
        for process in self.nodes.values():
            if process.proc is not None and process.proc.poll() is None:
                process.stop()
        for member in self.etcd_members:
            member.stop()
        for process in self.nodes.values():
            HOSTS.pop(process.port, None)  # the port may serve on 127.0.0.1 in a later test

    def logs(self) -> str:
        return "\n".join("--- node %d ---\n%s" % (n, p.output()[-6000:]) for n, p in self.nodes.items())


def controller_of(admin: Any, timeout: float = 30.0) -> int:
    """The controller id an AdminClient (confluent-kafka) sees, once one is active."""
    found: list[int] = []

    def known() -> bool:
        cluster = admin.describe_cluster().result(10)
        found[:] = [cluster.controller.id if cluster.controller is not None else -1]
        return found[0] >= 0

    wait_for(known, timeout, what="an active controller")
    return found[0]
