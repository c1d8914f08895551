"""The cluster as one node sees it in cluster mode, read off its metadata image: the registered
brokers and where they listen, where each partition and coordinator is, and where new partitions
go. Kafka's brokers answer Metadata, FindCoordinator and routing questions from the same image.

A broker is live when it is registered and not fenced; Metadata lists only live brokers. A
coordinator is the leader of its internal partition (partitionFor(key) of __consumer_offsets,
__transaction_state, __share_group_state); none (-1) while that topic does not exist or the
partition has no leader.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from broker.cluster.placement import UsableBroker, place_partitions
from broker.coordinator.runtime import partition_for
from broker.metadata import MetadataImage
from broker.metadata.image import OFFSETS_TOPIC, SHARE_STATE_TOPIC, TRANSACTION_STATE_TOPIC

COORDINATOR_TOPICS = {0: OFFSETS_TOPIC, 1: TRANSACTION_STATE_TOPIC, 2: SHARE_STATE_TOPIC}


class ImageView:
    """broker.apis.topology's Topology of a node of a cluster."""

    def __init__(self, image: Callable[[], MetadataImage], node_id: int, rnd: random.Random | None = None,
                 controller: Callable[[], int] = lambda: -1) -> None:
        self.image = image
        self.node_id = node_id
        self.rnd = rnd or random.Random()
        self.controller = controller  # the active controller's id, from etcd (-1: none)

    # brokers -----------------------------------------------------------------------------------
    def live_nodes(self) -> list[int]:
        return sorted(n for n, b in self.image().brokers.items() if not b.fenced)

    def address(self, node: int, listener: str | None) -> tuple[str, int] | None:
        found = self.image().brokers.get(node)
        endpoint = found.endpoint(listener) if found is not None else None
        return (endpoint.host, endpoint.port) if endpoint is not None else None

    def rack(self, node: int) -> str | None:
        found = self.image().brokers.get(node)
        return found.rack if found is not None else None

    def live_brokers(self, listener: str | None) -> list[tuple[int, str, int]]:
        """(id, host, port) of the live brokers for clients of `listener`."""
        out = []
        for node in self.live_nodes():
            address = self.address(node, listener)
            if address is not None:
                out.append((node, *address))
        return out

    def offline_nodes(self) -> set[int]:
        """Registered brokers that are fenced (their replicas are offline)."""
        return {n for n, b in self.image().brokers.items() if b.fenced}

    def controller_id(self) -> int:
        return self.controller()

    def broker_count(self) -> int:
        """The registered brokers, fenced ones too (as Kafka's controller counts them)."""
        return len(self.image().brokers)

    def node_ids(self) -> list[int]:
        return sorted(self.image().brokers)

    # partitions and coordinators ----------------------------------------------------------------
    def assignment(self, topic: str, partition: int) -> tuple[int, list[int], list[int]]:
        info = self.image().topics.get(topic)
        found = info.assignments.get(partition) if info is not None else None
        if found is None:
            return -1, [], []
        return found.leader, found.replicas, found.isr  # read only: the image's own lists

    def coordinator_partition(self, key_type: int, key: str) -> tuple[str, int] | None:
        topic = COORDINATOR_TOPICS[key_type]
        info = self.image().topics.get(topic)
        if info is None or info.partitions == 0:
            return None
        return topic, partition_for(key, info.partitions)

    def coordinator(self, key_type: int, key: str) -> int:
        found = self.coordinator_partition(key_type, key)
        if found is None:
            return -1
        return self.assignment(*found)[0]

    def coordinator_node(self, key_type: int, key: str, listener: str | None) -> tuple[int, str, int] | None:
        node = self.coordinator(key_type, key)
        address = self.address(node, listener) if node >= 0 else None
        return None if address is None else (node, *address)

    # placement ---------------------------------------------------------------------------------
    def usable_brokers(self) -> list[UsableBroker]:
        """Brokers new replicas may go to: registered and not shutting down (fenced ones last)."""
        return [UsableBroker(b.node_id, b.rack, b.fenced) for b in sorted(self.image().brokers.values(),
                                                                          key=lambda b: b.node_id)
                if not b.in_controlled_shutdown]

    def place(self, partitions: int, factor: int) -> list[list[int]]:
        return place_partitions(self.usable_brokers(), partitions, factor, self.rnd)

    def placement(self, topic: str, factor: int) -> Callable[[int], list[int]] | None:
        return None  # the controller places new partitions (`place`)
