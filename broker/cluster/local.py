"""The broker's side of the metadata publisher (publisher.py's LocalNode): what following the
cluster's metadata changes in one broker process (broker.app.Broker, reached as `broker`: this
module sits below the wiring)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from broker.cluster.alter_partition import ALTER_PARTITION, ALTER_PARTITION_VERSION, AlterPartitionManager
from broker.cluster.client import NodeClient
from broker.cluster.fetcher import FetcherSettings, ReplicaFetcherManager
from broker.cluster.metadata_sync import ClusterMetadataStore
from broker.cluster.node import ClusterNode, ClusterSettings
from broker.cluster.producer_ids import ProducerIdBlocks
from broker.cluster.publisher import MetadataPublisher
from broker.cluster.replication_quota import ReplicationQuotas
from broker.cluster.view import ImageView
from broker.config import read_properties
from broker.metadata import Assignment, MetadataImage, TopicInfo
from broker.metadata.image import INTERNAL_TOPICS, OFFSETS_TOPIC, SHARE_STATE_TOPIC, TRANSACTION_STATE_TOPIC
from broker.metadata.quorum import QuorumState, Replica
from broker.observability.logger import get_logger
from broker.partition.replica import BrokerStatus
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.cluster")


class LocalBroker:
    def __init__(self, broker: Any, fetchers: ReplicaFetcherManager) -> None:
        self.broker = broker
        self._background: set[asyncio.Task[None]] = set()
        self.node_id: int = broker.node_id
        self.fetchers = fetchers

    def image(self) -> MetadataImage:
        return self.broker.metadata.committed  # type: ignore[no-any-return]

    ready = True  # may this node lead what the metadata says it leads (ClusterMode: once registered)

    def host_partition(self, info: TopicInfo, index: int, assignment: Assignment, fetch: bool = True) -> None:
        """Kafka's makeLeader / makeFollower: the leader stops fetching first and leads from the
        assignment's epochs; a follower follows its leader (none: it waits for one; `fetch` False:
        it does not fetch yet). Before this node may lead (`ready`), a leadership the metadata
        gives it waits as a follower of nobody."""
        b = self.broker
        a = assignment
        tp = (info.name, index)
        partition = b.partitions.get(*tp)
        if partition is None:
            partition = b.partitions.ensure(info.name, index, info.topic_id, b.topic_log_config(info.name))
        led = partition.is_leader, partition.leader_epoch
        if a.leader == self.node_id and self.ready:
            self.fetchers.remove_partition(tp)
            partition.make_leader(a.leader_epoch, a.partition_epoch, a.replicas, a.isr)
        else:
            leader = a.leader if a.leader != self.node_id else -1
            partition.make_follower(leader, a.leader_epoch, a.partition_epoch, a.replicas, a.isr)
            if leader < 0 or not fetch:
                self.fetchers.remove_partition(tp)
            else:
                self.fetchers.add_partition(tp, info.topic_id, leader, a.leader_epoch)
        if (partition.is_leader, partition.leader_epoch) != led and b.share_manager is not None:
            b.share_manager.leadership_changed(info.topic_id, index)

    async def drop_replica(self, topic: str, index: int) -> None:
        """This node is no longer a replica of the partition (reassigned away): it stops fetching
        it and deletes its copy, as Kafka's brokers do."""
        b = self.broker
        partition = b.partitions.get(topic, index)
        if partition is None:
            return
        self.fetchers.remove_partition((topic, index))
        b.log_dir_mover.cancel(topic, index)
        await b.partitions.remove([(topic, index)])
        log.info("replica deleted: reassigned to other brokers", topic=topic, partition=index)
        if partition.is_leader and b.share_manager is not None:
            b.share_manager.leadership_changed(partition.topic_id, index)

    async def drop_topic(self, name: str, topic_id: uuid.UUID) -> None:
        b = self.broker
        self.fetchers.remove_topic(name)
        b.log_dir_mover.cancel_topic(name)
        await b.partitions.remove_topic(name)
        log.info("topic deleted", topic=name)
        await b.share_topic_deleted(topic_id)

    def local_topics(self) -> dict[str, uuid.UUID]:
        out: dict[str, uuid.UUID] = {}
        for (topic, _), partition in self.broker.partitions.partitions.items():
            out[topic] = partition.topic_id
        return out

    async def coordinator_partition(self, topic: str, index: int, lead: bool) -> None:
        runtime = self._runtime(topic)
        if runtime is None:
            return
        loaded = runtime.state(index) is not None
        if lead and not loaded and self.ready:
            log.info("coordinator partition loading", topic=topic, partition=index)
            await runtime.load(index)
        elif not lead and loaded:
            log.info("coordinator partition unloading", topic=topic, partition=index)
            await runtime.unload(index)

    def _runtime(self, topic: str) -> Any:
        b = self.broker
        coordinator = {OFFSETS_TOPIC: b.group_coordinator, TRANSACTION_STATE_TOPIC: b.txn_coordinator,
                       SHARE_STATE_TOPIC: b.share_coordinator}.get(topic)
        return coordinator.runtime if coordinator is not None else None

    async def topics_changed(self, created: set[str], deleted: set[str], changed: set[str]) -> None:
        """The group coordinator hears of it in the background, as Kafka's publisher tells it: its
        shards' writes wait to be committed, which must not hold the metadata back (a leadership
        the next records give this node, whose followers that commit may be waiting for)."""
        task = asyncio.get_running_loop().create_task(
            self.broker.topics_changed(created=created, deleted=deleted, changed=changed))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def topic_configs_changed(self, name: str) -> None:
        b = self.broker
        config = b.topic_log_config(name) or b.default_log_config
        b.logs.update_topic_config(name, config)

    def broker_configs_changed(self) -> None:
        self.broker.apply_dynamic_configs()

    def group_configs_changed(self, group_id: str) -> None:
        self.broker.group_configs_changed(group_id)


class ClusterMode(LocalBroker):
    """A broker as one node of a cluster (`etcd.endpoints` set): its ClusterNode, the publisher
    that makes it follow the metadata, and the answers the broker gives from the cluster's view."""

    def __init__(self, broker: Any, settings: ClusterSettings, metadata_dir: Path) -> None:
        node = ClusterNode(settings, broker.node_id, metadata_dir)
        config = broker.config
        self.replication_quotas = ReplicationQuotas(broker.node_id, int(config["replication.quota.window.num"]),
                                                    int(config["replication.quota.window.size.seconds"]))
        self.replication_quotas.configure(config.get)
        fetchers = ReplicaFetcherManager(broker.node_id, self._fetcher_connection, lambda: node.broker_epoch,
                                         broker.partitions.get, FetcherSettings.from_config(config),
                                         self.replication_quotas.follower)
        super().__init__(broker, fetchers)
        self.node = node
        self.publisher = MetadataPublisher(self)
        self.producer_ids: ProducerIdBlocks | None = None
        self.alter_partition: AlterPartitionManager | None = None
        # As a KRaft broker, lead partitions and coordinators only once registered and caught up
        # with the metadata past its registration (unfenced): until then the image may still name
        # this node's previous incarnation as a leader that the controller has not yet moved.
        self.ready = False
        node.unfenced_listeners.append(self._unfenced)
        self.metadata_dir = metadata_dir

    def broker_configs_changed(self) -> None:
        super().broker_configs_changed()
        self.replication_quotas.configure(self.broker.config.get)

    @classmethod
    def for_broker(cls, broker: Any, metadata_dir: Path) -> ClusterMode:
        config = broker.config
        return cls(broker, ClusterSettings.from_config(config, inter_broker_listener(config)), metadata_dir)

    @property
    def view(self) -> ImageView:
        assert self.node.view is not None
        return self.node.view

    async def connect(self, pinned: str | None) -> str:
        """The cluster id: etcd's, which cluster.id or this node's meta.properties pin."""
        meta = self.metadata_dir.parent / "meta.properties"
        recorded = read_properties(meta).get("cluster.id") if meta.exists() else None
        return await self.node.connect(pinned or recorded)

    async def start(self, store: ClusterMetadataStore, directory_id: str) -> None:
        """Join: the node id claimed (by this log directory), the image caught up with etcd, the
        node a controller candidate, the cluster's features finalized (by its first controller)."""
        await self.node.start(store, directory_id)
        await self.node.wait_for_bootstrap(self.node.settings.initial_registration_timeout_ms / 1000)
        self.producer_ids = store.producer_ids = ProducerIdBlocks(self.node.allocate_producer_ids)

    def _unfenced(self) -> None:
        if not self.ready:
            self.ready = True
            self.publisher(None)  # take up the leaderships the metadata gives this node

    async def follow(self) -> None:
        """From now on the broker follows the metadata; first, everything there is."""
        store = self.broker.metadata
        store.listeners.append(self.publisher)
        self.publisher(None)
        await self.publisher.settled()

    def serve(self) -> None:
        """The listeners are bound: register with the controller (with the advertised endpoints)
        and heartbeat."""
        b = self.broker
        listeners = []
        for a in b.config.advertised_listeners or b.listeners:
            host, port = b.advertised(a.name)
            protocol = b.config.security_protocol_map.get(a.name.upper(), "PLAINTEXT")
            listeners.append((a.name.upper(), host, port, SECURITY_PROTOCOLS.get(protocol, 0)))
        self.node.start_lifecycle(listeners)

    def lead_followers(self, partitions: Any) -> None:
        """What the partitions this node leads need of the cluster: the brokers' epochs and states
        (KIP-903, ISR eligibility) and the AlterPartition manager their ISR changes go through."""
        node = self.node

        def status(broker_id: int) -> BrokerStatus | None:
            found = self.image().brokers.get(broker_id)
            if found is None:
                return None
            return BrokerStatus(None if found.fenced else found.epoch, found.fenced, found.in_controlled_shutdown)

        async def send(request: M.AlterPartitionRequest) -> M.AlterPartitionResponse:
            controller: Any = node.controller
            return await node.to_controller(ALTER_PARTITION, ALTER_PARTITION_VERSION, request,
                                            lambda r: controller.alter_partition(r, ALTER_PARTITION_VERSION))  # type: ignore[no-any-return]

        self.alter_partition = AlterPartitionManager(self.node_id, lambda: node.broker_epoch, send)
        partitions.broker_statuses, partitions.alter_partition = status, self.alter_partition
        partitions.logs.high_watermarks = partitions.high_watermark_of  # replication-offset-checkpoint

    def _fetcher_connection(self, leader: int) -> NodeClient:
        """A replica fetcher's own connection to `leader` (a long poll holds it; Kafka's fetchers
        have theirs), on the inter-broker listener with its security."""
        node = self.node
        return NodeClient(lambda: node.view.address(leader, node.settings.inter_broker_listener)
                          if node.view is not None else None, "broker-%d-fetcher-0" % self.node_id,
                          security=node.settings.inter_broker_security, node=leader)

    async def controlled_shutdown(self) -> None:
        """The first step of a clean stop, while the broker still serves everything: its
        leaderships move to other replicas (the controller's doing), and this node follows that
        change (its partitions follow the new leaders, its coordinators unload) before it stops."""
        if await self.node.controlled_shutdown():
            await self.publisher.settled()

    async def stop(self, clean: bool) -> None:
        await self.fetchers.shutdown()  # nothing is appended to a follower's log from here on
        if self.alter_partition is not None:
            self.alter_partition.stop()
        if self.producer_ids is not None:
            self.producer_ids.stop()
        await self.node.stop(clean)
        await self.publisher.stop()

    # the cluster as clients see it (the rest is self.view, broker.apis.topology's Topology) -------
    def quorum(self, directory_id: uuid.UUID) -> QuorumState:
        """The controller leads the metadata log (its epoch, the controller epoch); the other
        registered brokers replay it (observers; what they have replayed is known here only for
        this node)."""
        image = self.image()
        end = image.records
        controller = self.node.controller_id
        me = self.node_id

        def replica(node: int) -> Replica:
            return Replica(node, directory_id if node == me else uuid.UUID(int=0), end if node == me else -1)

        voters = [replica(controller)] if controller >= 0 else []
        observers = [replica(n) for n in sorted(image.brokers) if n != controller]
        return QuorumState(controller, self.node.controller_epoch, end, voters, observers)

    def internal_replication(self, configured: int | None) -> int:
        """An internal topic's replication factor: as configured, else Kafka's default 3 at most
        the live brokers (as the simulated cluster caps it)."""
        return configured if configured is not None else max(1, min(3, len(self.view.live_nodes())))

    # topics --------------------------------------------------------------------------------------
    async def create_topic(self, name: str, partitions: int, configs: dict[str, str], factor: int,
                           assignments: list[list[int]] | None) -> TopicInfo:
        """Create a topic: here when this node is the controller, else through it (CreateTopics,
        as Kafka's brokers create topics on first use); returns it once this node has it."""
        store = self.broker.metadata
        if self.node.is_controller:
            placed = assignments if assignments is not None else self.view.place(partitions, factor)
            info = store.create_topic(name, partitions, configs, replicas=lambda index: list(placed[index]))
            await self.node.sync()
            log.info("topic created", topic=name, partitions=partitions, topic_id=str(info.topic_id))
        else:
            R = M.CreateTopicsRequest
            request = R(topics=[R.CreatableTopic(
                name=name, num_partitions=partitions, replication_factor=factor,
                assignments=[R.CreatableReplicaAssignment(partition_index=i, broker_ids=list(r))
                             for i, r in enumerate(assignments or ())],
                configs=[R.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()])],
                timeout_ms=30000, validate_only=False)
            if assignments is not None:
                request.topics[0].num_partitions = request.topics[0].replication_factor = -1
            response = await self.node.to_controller(CREATE_TOPICS, CREATE_TOPICS_VERSION, request, _unreachable)
            result = response.topics[0]
            # a coordinator's internal topic is made by whichever request needs it first (two
            # members joining at once, on one node or on two): the one made meanwhile is the one wanted
            made_meanwhile = result.error_code == ErrorCode.TOPIC_ALREADY_EXISTS and name in INTERNAL_TOPICS
            if result.error_code and not made_meanwhile:
                raise KafkaError(ErrorCode(result.error_code), result.error_message or "")  # type: ignore[call-arg]
            await self.node.caught_up_with_controller()
        await self.publisher.settled()
        info = store.topic(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The topic '%s' is not known here yet." % name)
        return info  # type: ignore[no-any-return]

    async def latest_offset(self, leader: int, topic: str, partition: int) -> int | None:
        """The high watermark of a partition another node leads (ListOffsets, latest)."""
        R = M.ListOffsetsRequest
        request = R(replica_id=-1, isolation_level=0, topics=[R.ListOffsetsTopic(name=topic, partitions=[
            R.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=-1)])])
        try:
            response = await self.node.clients(leader).call(LIST_OFFSETS, LIST_OFFSETS_VERSION, request)
        except KafkaError:
            return None
        found = response.topics[0].partitions[0]
        return None if found.error_code else int(found.offset)

    def place_new_partitions(self, info: TopicInfo, total: int, assignments: list[list[int]] | None
                             ) -> list[list[int]]:
        """Replicas of the partitions a topic grows by (their indexes info.partitions .. total-1)."""
        if assignments is not None:
            return assignments
        factor = len(info.assignments[0].replicas) if 0 in info.assignments else 1
        return self.view.place(total - info.partitions, factor)


async def _unreachable(request: Any) -> Any:
    raise KafkaError(ErrorCode.NOT_CONTROLLER, "The controller is another node.")


CREATE_TOPICS, CREATE_TOPICS_VERSION = 19, 7
LIST_OFFSETS, LIST_OFFSETS_VERSION = 2, 7
SECURITY_PROTOCOLS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}  # Kafka's ids


def inter_broker_listener(config: Any) -> str:
    """The listener brokers reach each other on: inter.broker.listener.name, else the one named as
    security.inter.broker.protocol (PLAINTEXT), else the first."""
    named = config["inter.broker.listener.name"]
    if named:
        return str(named).upper()
    wanted = str(config["security.inter.broker.protocol"] or "PLAINTEXT").upper()
    names = [a.name.upper() for a in config.listeners]
    return wanted if wanted in names else (names[0] if names else "PLAINTEXT")
