"""A real cluster for tests: one etcd member and N `python -m broker` processes on 127.0.0.1, each
with its own port and log directory, all with the same `etcd.endpoints`; stopped by their PIDs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.testing.etcd import EtcdMember
from tests.harness import BrokerProcess, free_port, wait_for

FAST = {  # the cluster notices a dead node within seconds, not Kafka's 9 s
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "etcd.lease.timeout.ms": "2000",
}


class ProcessCluster:
    def __init__(self, base: Path, size: int = 3, overrides: dict[str, str] | None = None) -> None:
        self.base = base
        self.etcd = EtcdMember(base / "etcd")
        self.overrides = {**FAST, **(overrides or {})}
        self.nodes: dict[int, BrokerProcess] = {}
        for node_id in range(1, size + 1):
            self.nodes[node_id] = self._process(node_id, free_port())

    def _process(self, node_id: int, port: int) -> BrokerProcess:
        data = self.base / ("node%d" % node_id) / "data"
        data.mkdir(parents=True, exist_ok=True)
        return BrokerProcess(data, port, overrides={"node.id": str(node_id), **self.overrides})

    def start(self) -> ProcessCluster:
        self.etcd.start()
        for process in self.nodes.values():
            process.overrides["etcd.endpoints"] = self.etcd.client_url
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
        self.etcd.stop()

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
