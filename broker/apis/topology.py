"""The cluster as clients see it: the brokers and where they listen, the controller, where each
partition and coordinator is, where new partitions go. Three topologies answer it, chosen when
the broker starts: this node alone (`SingleNode`), a simulated cluster of one process
(broker.testing.simulated, `simulated.brokers`) and a node of a cluster on etcd
(broker.cluster.view, `etcd.endpoints`). Metadata, DescribeCluster, FindCoordinator, the topic
handlers and the request router ask it, never which kind it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

Node = tuple[int, str, int]  # node id, host, port


class ClusterView(Protocol):
    """Where things are in the cluster, as one node sees it (what the request router needs)."""

    def assignment(self, topic: str, partition: int) -> tuple[int, list[int], list[int]]:
        """(leader (-1: none), replicas, in-sync replicas) of a partition."""

    def coordinator(self, key_type: int, key: str) -> int:
        """The node coordinating a group id, transactional id or share key (-1: none)."""

    def address(self, node: int, listener: str | None) -> tuple[str, int] | None:
        """Where clients of `listener` reach `node` (None: nowhere known)."""

    def rack(self, node: int) -> str | None: ...


class Topology(ClusterView, Protocol):
    """The whole of it, as the handlers use it."""

    def live_brokers(self, listener: str | None) -> list[Node]:
        """The brokers Metadata lists, as `listener` advertises them."""

    def controller_id(self) -> int:
        """The active controller (-1: none)."""

    def offline_nodes(self) -> set[int]:
        """Brokers whose replicas are offline (fenced, or a simulated node stopped)."""

    def coordinator_node(self, key_type: int, key: str, listener: str | None) -> Node | None:
        """The coordinator of a group id, transactional id or share key (key type 0, 1, 2) and
        where clients of `listener` reach it; None when it has none."""

    def broker_count(self) -> int:
        """The brokers new replicas may count on (a replication factor above it is refused)."""

    def node_ids(self) -> list[int]:
        """Every broker's id (assignments naming others are refused)."""

    def placement(self, topic: str, factor: int) -> Callable[[int], list[int]] | None:
        """The replicas of each new partition of `topic`; None: the metadata store places them."""


class SingleNode:
    """A broker on its own: it is every partition's leader and replica and every coordinator."""

    def __init__(self, node_id: int, advertised: Callable[[str | None], tuple[str, int]], rack: str | None) -> None:
        self.node_id = node_id
        self.advertised = advertised
        self._rack = rack

    def assignment(self, topic: str, partition: int) -> tuple[int, list[int], list[int]]:
        return self.node_id, [self.node_id], [self.node_id]

    def coordinator(self, key_type: int, key: str) -> int:
        return self.node_id

    def address(self, node: int, listener: str | None) -> tuple[str, int] | None:
        return self.advertised(listener) if node == self.node_id else None

    def rack(self, node: int) -> str | None:
        return self._rack

    def live_brokers(self, listener: str | None) -> list[Node]:
        return [(self.node_id, *self.advertised(listener))]

    def controller_id(self) -> int:
        return self.node_id

    def offline_nodes(self) -> set[int]:
        return set()

    def coordinator_node(self, key_type: int, key: str, listener: str | None) -> Node | None:
        return (self.node_id, *self.advertised(listener))

    def broker_count(self) -> int:
        return 1

    def node_ids(self) -> list[int]:
        return [self.node_id]

    def placement(self, topic: str, factor: int) -> Callable[[int], list[int]] | None:
        return None
