"""A simulated cluster of N brokers in one process (`simulated.brokers=N`, not a Kafka property).

The broker answers as N nodes, ids node.id .. node.id+N-1, node k listening on each configured
listener's port + k (a fresh port per node for port 0). Clients see a real cluster: Metadata lists
the live nodes, partitions have replicas and in-sync replicas for any replication factor up to N
(Kafka's PartitionRecord/PartitionChangeRecord in the metadata log), leaders and coordinators
are spread over the nodes, and a request sent to the wrong node is answered as a real cluster
answers it: NOT_LEADER_OR_FOLLOWER for a partition it does not lead, NOT_COORDINATOR for a group
or transactional id it does not coordinate (broker/apis/routing.py's Router, run by the server
through the fault injector's interception point). The data is stored once: nothing is replicated, every replica is
always in sync when its node is up.

A coordinator is the leader of its internal topic's partition (partitionFor(key) of
__consumer_offsets, __transaction_state, __share_group_state), as in Kafka: `coordinator` is the
one function that places every coordinator type, and moving or losing that partition's leader
moves the coordinator (its shard is unloaded and loaded again, as on a real move).

Faults (broker.testing.faults) change the cluster for real: `move_leader` (a new leader epoch,
clients get NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH and follow Metadata), `move_coordinator`,
`node_down` (its ports close, its connections drop, the partitions it led move to another in-sync
replica or go offline, it leaves every ISR) and `node_up` (it listens again on the same ports and
rejoins the ISRs; leadership stays where it went, as without a preferred-leader election).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from broker.apis.routing import KEY_TYPE_GROUP, KEY_TYPE_SHARE, KEY_TYPE_TRANSACTION, Router
from broker.coordinator.runtime import partition_for
from broker.observability.logger import get_logger
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.simulated")

__all__ = ["KEY_TYPE_GROUP", "KEY_TYPE_SHARE", "KEY_TYPE_TRANSACTION", "SimulatedCluster"]

# each coordinator type: its internal topic and the property giving its partition count
COORDINATOR_TOPICS = {
    KEY_TYPE_GROUP: ("__consumer_offsets", "offsets.topic.num.partitions"),
    KEY_TYPE_TRANSACTION: ("__transaction_state", "transaction.state.log.num.partitions"),
    KEY_TYPE_SHARE: ("__share_group_state", "share.coordinator.state.topic.num.partitions"),
}
DEFAULT_INTERNAL_PARTITIONS = 50


class SimulatedCluster:
    def __init__(self, broker: Any, count: int) -> None:
        if count < 1:
            raise ValueError("simulated.brokers must be at least 1")
        self.broker = broker
        self.first = broker.node_id
        self.nodes = list(range(self.first, self.first + count))
        self.down: set[int] = set()
        self.ports: dict[int, dict[str, int]] = {}  # node -> listener name -> bound port

    # placement -----------------------------------------------------------------------------------
    def place(self, topic: str, partition: int, factor: int) -> list[int]:
        """The replicas of a new partition over the live nodes, the first one its preferred leader:
        consecutive nodes from a start that moves with the partition (leaders spread), the same
        for the same topic and cluster."""
        live = self.live_nodes()
        if factor > len(live):
            raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR, "Unable to replicate the partition %d time(s): "
                             "The target replication factor of %d cannot be reached because only %d broker(s) are "
                             "registered." % (factor, factor, len(live)))
        start = zlib.crc32(topic.encode()) % len(live) + partition
        return [live[(start + i) % len(live)] for i in range(factor)]

    def internal_replication(self, config_key: str) -> int:
        """An internal topic's replication factor: as configured, else Kafka's default 3 (at most N)."""
        if not self.broker.config.is_default(config_key):
            return int(self.broker.config[config_key])
        return min(3, len(self.nodes))

    def placement(self, topic: str, factor: int) -> Callable[[int], list[int]] | None:
        return lambda index: self.place(topic, index, factor)

    # the cluster as clients see it (broker.apis.topology's Topology) -----------------------------
    def live_nodes(self) -> list[int]:
        return [n for n in self.nodes if n not in self.down]

    def live_brokers(self, listener: str | None) -> list[tuple[int, str, int]]:
        return [(n, *self.address(n, listener)) for n in self.live_nodes()]

    def controller_id(self) -> int:
        """The first live node (the controller of a simulated cluster names no real process)."""
        live = self.live_nodes()
        return live[0] if live else -1

    def offline_nodes(self) -> set[int]:
        return set(self.down)

    def broker_count(self) -> int:
        return len(self.live_nodes())

    def node_ids(self) -> list[int]:
        return list(self.nodes)

    def address(self, node: int, listener: str | None) -> tuple[str, int]:
        """Where clients reach `node`: the advertised host, and the advertised port + k (or, when
        the advertised port is the bound one, node k's own bound port)."""
        host, port = self.broker.advertised(listener)
        if node == self.first:
            return host, port
        name = listener or next(iter(self.ports.get(self.first, {})), "")
        bound = self.ports.get(node, {}).get(name)
        if bound is not None and port == self.ports.get(self.first, {}).get(name):
            return host, bound
        return host, port + node - self.first

    def assignment(self, topic: str, partition: int) -> tuple[int, list[int], list[int]]:
        """(leader, replicas, in-sync replicas): the metadata's, or where a topic not yet created
        (an internal one) would be placed."""
        info = self.broker.metadata.topic(topic)
        found = info.assignments.get(partition) if info is not None else None
        if found is not None:
            return found.leader, found.replicas, found.isr
        replicas = self.place(topic, partition, 1)
        return replicas[0], replicas, replicas

    def coordinator(self, key_type: int, key: str) -> int:
        """The node coordinating `key` (a group id, transactional id or share-partition key): the
        leader of its internal topic's partition, -1 when that has no leader."""
        topic, partitions_key = COORDINATOR_TOPICS[key_type]
        info = self.broker.metadata.topic(topic)
        if info is not None:
            count = info.partitions
        else:
            count = int(self.broker.config[partitions_key] or DEFAULT_INTERNAL_PARTITIONS)
        return self.assignment(topic, partition_for(key, count))[0]

    def coordinator_node(self, key_type: int, key: str, listener: str | None) -> tuple[int, str, int] | None:
        node = self.coordinator(key_type, key)
        return None if node < 0 else (node, *self.address(node, listener))

    # lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen as the other nodes; every node is up, so every replica is back in sync."""
        for listener in self.broker.listeners:
            self.ports.setdefault(self.first, {})[listener.name] = self.broker.bound_ports[listener.name]
        for node in self.nodes[1:]:
            await self._listen(node)
        for name, info in list(self.broker.metadata.topics.items()):
            for index, a in sorted(info.assignments.items()):
                if a.isr != a.replicas or a.leader < 0:
                    self.broker.metadata.change_partition(name, index, leader=a.replicas[0] if a.leader < 0 else None,
                                                          isr=list(a.replicas))
                self._lead(name, index)
        router = Router(self, lambda: self.broker.metadata, self._node_of, None, self._min_insync_replicas)
        self.broker.faults.route(router.route, router.api_keys)
        log.info("simulated cluster", nodes=self.nodes, ports=self.ports)

    def _node_of(self, ctx: Any) -> int:
        """The node a request came to: the one whose port its connection came in on."""
        node = ctx.connection.node
        return node if node is not None else self.first

    async def _listen(self, node: int) -> None:
        offset = node - self.first
        known = self.ports.get(node, {})
        for listener in self.broker.listeners:
            port = known.get(listener.name) or (listener.port + offset if listener.port else 0)
            bound = await self.broker.server.listen(listener.host, port, listener, node=node)
            self.ports.setdefault(node, {})[listener.name] = bound

    def rack(self, node: int) -> str | None:
        return self.broker.config["broker.rack"]  # type: ignore[no-any-return]

    def _min_insync_replicas(self, topic: str) -> int:
        info = self.broker.metadata.topic(topic)
        value = info.configs.get("min.insync.replicas") if info is not None else None
        return int(value if value is not None else self.broker.config["min.insync.replicas"])

    # faults: the cluster changes -----------------------------------------------------------------
    async def move_replicas(self, topic: str, partition: int, replicas: list[int]) -> None:
        """A reassignment, done at once (nothing is replicated): the live ones of `replicas` are
        in sync; the leader stays if it is one of them, else the first of them leads."""
        leader = self.assignment(topic, partition)[0]
        isr = [r for r in replicas if r not in self.down]
        new_leader = leader if leader in isr else (isr[0] if isr else -1)
        await self._reload(self._change(topic, partition, None if new_leader == leader else new_leader, isr,
                                        replicas))

    async def move_leader(self, topic: str, partition: int, to: int | None = None) -> int:
        """Make another in-sync replica the leader (`to`, or the next one); returns it."""
        info = self.broker.metadata.topic(topic)
        if info is None or partition not in info.assignments:
            raise ValueError("no partition %s-%d" % (topic, partition))
        leader, replicas, isr = self.assignment(topic, partition)
        candidates = [r for r in isr if r != leader and r not in self.down]
        if to is not None:
            if to not in candidates:
                raise ValueError("node %s is not an in-sync replica of %s-%d that is up and not its leader (%s)"
                                 % (to, topic, partition, candidates))
            candidates = [to]
        if not candidates:
            raise ValueError("%s-%d has no other in-sync replica to lead it (replicas %s, isr %s)"
                             % (topic, partition, replicas, isr))
        await self._reload(self._change(topic, partition, candidates[0], None))
        return candidates[0]

    async def move_coordinator(self, key: str, key_type: int = KEY_TYPE_GROUP, to: int | None = None) -> int:
        """Move the coordinator of a group (or transactional id) to another node; returns it."""
        await self._ensure_internal_topic(key_type)
        topic, _ = COORDINATOR_TOPICS[key_type]
        info = self.broker.metadata.topic(topic)
        return await self.move_leader(topic, partition_for(key, info.partitions), to)

    async def node_down(self, node: int) -> None:
        """The node stops: its ports close, its connections drop, it leaves every ISR and the
        partitions it led get a new leader among the remaining in-sync replicas (or none). The
        metadata changes at once (no request sees half of it), as the controller's one batch."""
        self._check_node(node)
        if node in self.down:
            return
        self.down.add(node)
        self.broker.server.close_node(None if node == self.first else node)
        moved = []
        for name, info in list(self.broker.metadata.topics.items()):
            for index, a in sorted(info.assignments.items()):
                if node not in a.isr and a.leader != node:
                    continue
                isr = [r for r in a.isr if r != node]
                leader = next((r for r in isr if r not in self.down), -1) if a.leader == node else None
                moved += self._change(name, index, leader, isr)
        log.warning("simulated node down", node=node)
        await self._reload(moved)

    async def node_up(self, node: int) -> None:
        """The node is back on its ports; it rejoins the ISR of its replicas and leads the
        partitions that had no leader."""
        self._check_node(node)
        if node not in self.down:
            return
        self.down.discard(node)
        moved = []
        for name, info in list(self.broker.metadata.topics.items()):
            for index, a in sorted(info.assignments.items()):
                if node in a.replicas and node not in a.isr:
                    isr = [r for r in a.replicas if r in a.isr or r == node]
                    moved += self._change(name, index, node if a.leader < 0 else None, isr)
        await self._listen(node)
        log.warning("simulated node up", node=node)
        await self._reload(moved)

    def _check_node(self, node: int) -> None:
        if node not in self.nodes:
            raise ValueError("no node %s in the simulated cluster (%s)" % (node, self.nodes))

    def _change(self, topic: str, partition: int, leader: int | None, isr: list[int] | None,
                replicas: list[int] | None = None) -> list[tuple[Any, int, bool]]:
        """Record a new leader and/or ISR, at once. A new leader starts a new leader epoch on the
        log, as Kafka's becoming leader does; returns the coordinator partitions to load again
        (runtime, partition, whether it has a leader)."""
        self.broker.metadata.change_partition(topic, partition, leader=leader, isr=isr, replicas=replicas)
        if leader is None:
            return []
        self._lead(topic, partition)
        log.info("simulated leader change", topic=topic, partition=partition, leader=leader)
        return [(coordinator.runtime, partition, leader >= 0) for kind, coordinator in self.broker.coordinators()
                if COORDINATOR_TOPICS[_KEY_TYPES[kind]][0] == topic]

    @staticmethod
    async def _reload(moved: list[tuple[Any, int, bool]]) -> None:
        """A coordinator moved: its shard is unloaded (what was in flight: NOT_COORDINATOR) and
        loaded again from its log where it has a leader."""
        for runtime, partition, led in moved:
            await runtime.unload(partition)
            if led:
                await runtime.load(partition)

    def _lead(self, topic: str, partition: int) -> None:
        """The partition's log follows the leader epoch of the metadata."""
        stored = self.broker.partitions.get(topic, partition)
        info = self.broker.metadata.topic(topic)
        if stored is not None and info is not None and partition in info.assignments:
            stored.become_leader(info.assignments[partition].leader_epoch)

    async def _ensure_internal_topic(self, key_type: int) -> None:
        if key_type == KEY_TYPE_GROUP:
            await self.broker.ensure_offsets_topic()
        elif key_type == KEY_TYPE_TRANSACTION:
            await self.broker.ensure_transaction_state_topic()
        else:
            raise ValueError("coordinators of key type %d cannot be moved" % key_type)


_KEY_TYPES = {"group": KEY_TYPE_GROUP, "transaction": KEY_TYPE_TRANSACTION, "share": KEY_TYPE_SHARE}
