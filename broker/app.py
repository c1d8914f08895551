"""The broker: wires configuration, storage, metadata, partitions and the server together.

Importing it imports the core every broker runs: storage, metadata, partitions, the group
coordinator, the server. What only some brokers use is imported where it is started or first
used: the transaction and share coordinators and the share-partition engine (at start), client
telemetry (the first KIP-714 request), the authorizer (when `authorizer.class.name` is set), the
HTTP endpoint and prometheus_client (when `metrics.port` is set, or metrics are first
collected), the test kit's simulated cluster and cluster mode on etcd (when configured).
tests/test_import_laziness.py keeps it so.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.apis import load_handlers
from broker.apis.context import TxnVerifier
from broker.apis.fetch_sessions import FetchSessionCache
from broker.apis.topology import SingleNode, Topology
from broker.config import BrokerConfig, read_properties
from broker.coordinator.group import GroupCoordinator, create_group_coordinator
from broker.coordinator.group.config import CONFIG_KEYS as GROUP_CONFIG_KEYS
from broker.coordinator.group.group_config import GroupConfigs
from broker.coordinator.log_writer import LogPartitionWriter, internal_topic_log_config
from broker.coordinator.timer import AsyncioClock
from broker.gc_policy import collector_paused
from broker.log import Log, LogCleaner, LogConfig, LogManager
from broker.log.handles import OPEN_FILES, descriptor_limit
from broker.metadata import RESOURCE_CLIENT_METRICS, RESOURCE_GROUP, RESOURCE_TOPIC, MetadataStore, TopicInfo
from broker.metadata.features import TRANSACTION_VERSION
from broker.metadata.image import OFFSETS_TOPIC, SHARE_STATE_TOPIC, TRANSACTION_STATE_TOPIC
from broker.metadata.local import LogMetadataLog, ensure_meta_properties, read_directory_id
from broker.metadata.quorum import QuorumState, Replica, start_new_epoch
from broker.network.server import KafkaServer
from broker.observability.logger import get_logger
from broker.observability.metrics import Metrics
from broker.observability.state_metrics import BrokerStateCollector
from broker.partition import Partition, PartitionManager
from broker.partition.log_dirs import LogDirMover
from broker.security.listeners import build_listeners
from broker.security.quotas import ClientQuotas
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.cluster.local import ClusterMode
    from broker.cluster.replication_quota import ReplicationQuota
    from broker.coordinator.share import ShareCoordinator
    from broker.coordinator.txn import TransactionCoordinator, TxnCompletion
    from broker.coordinator.txn.markers import PartitionMarkerWriter
    from broker.network.http import HttpEndpoint
    from broker.observability.telemetry import ClientTelemetry
    from broker.security.authorizer import Authorizer
    from broker.share.manager import SharePartitionManager
    from broker.share.metrics import ShareMetricsCollector
    from broker.share.persister import ShareStateRouter
    from broker.share.ports import ShareGroupSettings
    from broker.testing.faults import Faults
    from broker.testing.simulated import SimulatedCluster

log = get_logger("broker")

METADATA_TOPIC = "__cluster_metadata"
PRODUCER_EXPIRATION_CHECK_S = 600.0  # Kafka's producer.id.expiration.check.interval.ms default
TXN_WRITE_TIMEOUT_MS = 30000  # the transaction log's appends wait as long as Kafka's request.timeout.ms


class Broker:
    def __init__(self, config: BrokerConfig, clock: Callable[[], float] = time.time,
                 faults: Faults | None = None) -> None:
        self.config = config
        self.clock = clock
        self.node_id = config.node_id
        self.leader_epoch = 0
        self.metrics = Metrics()
        self._telemetry: ClientTelemetry | None = None  # made at first use: see `telemetry`
        self.cluster_id = ""
        self.default_log_config = LogConfig.from_broker_properties(config.raw)
        self.logs = LogManager(config.log_dirs, self.default_log_config, topic_config=self.topic_log_config,
                               flush_observer=self.metrics.log_flushed)
        self.metadata: MetadataStore = None  # type: ignore[assignment]  # set in start()
        self.authorizer: Authorizer | None = None  # authorizer.class.name; set in start() (None: all allowed)
        self.quotas: ClientQuotas | None = None  # client quotas; set in start()
        self.fetch_sessions = FetchSessionCache(int(self.config["max.incremental.fetch.session.cache.slots"]))
        self.group_coordinator: GroupCoordinator = None  # type: ignore[assignment]  # set in start()
        self.txn_coordinator: TransactionCoordinator = None  # type: ignore[assignment]  # set in start()
        self.share_coordinator: ShareCoordinator = None  # type: ignore[assignment]  # set in start()
        self.share_manager: SharePartitionManager = None  # type: ignore[assignment]  # set in start()
        self._share_metrics: ShareMetricsCollector | None = None
        # every group's effective settings: its group configs (in the metadata) over ours
        self.group_configs = GroupConfigs(
            self.config.get, lambda group_id: self.metadata.image.resource_configs[RESOURCE_GROUP].get(group_id, {}))
        self.partitions = PartitionManager(self.logs)
        self.partitions.local_id = self.node_id
        self.partitions.replica_lag_time_max_ms = int(config["replica.lag.time.max.ms"])
        self.log_dir_mover = LogDirMover(self.logs, self.partitions)
        self.cleaner = LogCleaner()
        self.server = KafkaServer(self, int(config["socket.request.max.bytes"]), int(config["connections.max.idle.ms"]))
        if faults is None:  # broker.testing's fault injection, consulted by the server per request
            from broker.testing.faults import Faults

            faults = Faults()
        self.faults = faults
        self.server.intercepts = self.faults.intercepts
        self.metrics.registry.register(self.faults)
        self.metrics.registry.register(BrokerStateCollector(self))
        self.http: HttpEndpoint | None = None  # /metrics and /faults on metrics.port
        count = int(config["simulated.brokers"])
        self.simulated: SimulatedCluster | None = None  # answering as N brokers
        if count > 1:
            from broker.testing.simulated import SimulatedCluster

            self.simulated = SimulatedCluster(self, count)
        self.cluster: ClusterMode | None = None  # one node of a cluster on etcd (etcd.endpoints); set in start()
        # the cluster as clients see it: this node alone, the simulated cluster, or (from start()) the
        # cluster's metadata image
        self.topology: Topology = self.simulated or SingleNode(self.node_id, self.advertised,
                                                               config["broker.rack"])
        self.share_state: ShareStateRouter | None = None  # share state on other nodes' share coordinators
        self.ports: list[int] = []
        self.listeners = build_listeners(config)  # checked and built before anything starts
        self.bound_ports: dict[str, int] = {}  # listener name -> bound port
        self._advertised: dict[str | None, tuple[str, int]] = {}  # see advertised()
        self.metadata_directory_id = uuid.UUID(int=0)  # directory.id of the metadata log's dir
        self.quorum_epoch = 0  # epoch of the metadata quorum (this node leads it)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self._stopping = False

    @property
    def telemetry(self) -> ClientTelemetry:
        """Client telemetry (KIP-714), made at the first telemetry request (or use of it): most
        clients never push metrics, and a broker need not import what serves them until one does."""
        telemetry = self._telemetry
        if telemetry is None:
            from broker.observability.telemetry import ClientTelemetry

            telemetry = self._telemetry = ClientTelemetry(
                self._client_metrics_subscriptions, lambda: int(self.clock() * 1000),
                int(self.config["telemetry.max.bytes"]))
            self.metrics.registry.register(telemetry.collector)
        return telemetry

    # lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        with collector_paused():
            await self._start()

    async def _start(self) -> None:
        load_handlers()
        cluster_id = self.config["cluster.id"]
        if self.config["etcd.endpoints"]:  # one node of a cluster: the cluster id is etcd's
            cluster_id = await self._join_cluster(cluster_id)
        for d in self.config.log_dirs:
            cluster_id = ensure_meta_properties(Path(d), self.node_id, cluster_id)
        self.cluster_id = cluster_id
        OPEN_FILES.configure(int(self.config["log.open.files.max"]))
        stats = await asyncio.to_thread(self.logs.startup)
        metadata_log = self.logs.get_or_create_log(METADATA_TOPIC, 0)
        self.metadata_directory_id = read_directory_id(Path(metadata_log.dir).parent)
        if self.cluster is not None:
            from broker.cluster.metadata_sync import ClusterMetadataStore

            self.metadata = ClusterMetadataStore(LogMetadataLog(metadata_log), self.node_id)  # its log: etcd
            directory_id = read_properties(Path(self.config.log_dirs[0]) / "meta.properties").get("directory.id", "")
            await self.cluster.start(self.metadata, directory_id)  # caught up with the metadata in etcd
            self.topology = self.cluster.view
            self.cluster.lead_followers(self.partitions)  # ISR changes to the controller, brokers' epochs
        else:
            self.metadata = MetadataStore(LogMetadataLog(metadata_log), self.node_id)
            self.quorum_epoch = await asyncio.to_thread(start_new_epoch, metadata_log.dir, self.node_id)
            self.metadata.load()
        if self.config["authorizer.class.name"]:  # None (everything allowed) unless one is configured
            from broker.security.authorizer import Authorizer

            self.authorizer = Authorizer.from_config(self.config, self.metadata.image)
        self.quotas = ClientQuotas.from_config(self.config, self.metadata.image)
        self.server.quotas = self.quotas
        if self.cluster is None:  # a cluster's first controller bootstraps its features
            self.metadata.bootstrap(self.config.static_min_insync_replicas)
        self.apply_dynamic_configs()  # logs were loaded before the metadata: give them their configs
        if self.cluster is None:
            for info in list(self.metadata.topics.values()):
                self._ensure_partitions(info)
        await self._start_group_coordinator()
        await self._start_transaction_coordinator()
        self.faults.attach(self)
        await self._start_share_groups()
        if self.cluster is not None:
            await self.cluster.follow()  # its partitions and the coordinators it leads, as the metadata says
        for listener in self.listeners:
            port = await self.server.listen(listener.host, listener.port, listener)
            self.ports.append(port)
            self.bound_ports[listener.name] = port
        if self.simulated is not None:
            await self.simulated.start()
        if self.cluster is not None:
            self._serve_cluster()
        port = int(self.config["metrics.port"])
        if port >= 0:
            from broker.network.http import HttpEndpoint

            self.http = HttpEndpoint(self)
            await self.http.start(self.config["metrics.host"], port)
        self._start_background()
        log.info("broker started", node_id=self.node_id, cluster_id=self.cluster_id, ports=self.ports,
                 log_dirs=self.config.log_dirs, topics=len(self.metadata.topics),
                 recovery_seconds=round(stats.seconds, 3), recovered_segments=stats.recovered_segments,
                 partitions=stats.logs, descriptor_limit=descriptor_limit(), open_files_max=OPEN_FILES.capacity)

    def _offsets_log_config(self) -> LogConfig:
        return internal_topic_log_config(self.default_log_config, int(self.config["offsets.topic.segment.bytes"]))

    async def _start_group_coordinator(self) -> None:
        """The coordinator's logs are `__consumer_offsets-N` (compacted). As in Kafka, the topic
        itself appears in the metadata only once a group first needs a coordinator
        (`ensure_offsets_topic`), so a fresh broker lists no topics."""
        values = {key: self.config[key] for key in GROUP_CONFIG_KEYS}
        values["offsets.topic.num.partitions"] = self._internal_partitions(OFFSETS_TOPIC, "offsets.topic.num.partitions")

        def consumer_sessions(group_id: str) -> tuple[int, int]:
            s = self.group_configs.settings(group_id)
            return s.consumer_session_timeout_ms, s.consumer_heartbeat_interval_ms

        def share_sessions(group_id: str) -> tuple[int, int]:
            s = self.group_configs.settings(group_id)
            return s.share_session_timeout_ms, s.share_heartbeat_interval_ms

        self.group_coordinator = create_group_coordinator(
            self._internal_writer(OFFSETS_TOPIC, self._offsets_log_config, int(self.config["offsets.commit.timeout.ms"])), values, AsyncioClock(),
            metadata=self.metadata, consumer_session_settings=consumer_sessions, share_session_settings=share_sessions,
        )
        await self.group_coordinator.start(load=self.cluster is None)  # a node of a cluster: where it leads

    def _transaction_log_config(self) -> LogConfig:
        config = internal_topic_log_config(self.default_log_config,
                                           int(self.config["transaction.state.log.segment.bytes"]))
        return config.with_overrides({"compression.type": "uncompressed"})

    async def _start_transaction_coordinator(self) -> None:
        """The coordinator's logs are `__transaction_state-N` (compacted), registered in the
        metadata at the first FindCoordinator for a transactional id, as Kafka does."""
        from broker.coordinator.txn import create_transaction_coordinator
        from broker.coordinator.txn.config import CONFIG_KEYS as TXN_CONFIG_KEYS
        from broker.coordinator.txn.markers import PartitionMarkerWriter

        values: dict[str, Any] = {key: self.config[key] for key in TXN_CONFIG_KEYS}
        values["transaction.state.log.num.partitions"] = self._internal_partitions(
            TRANSACTION_STATE_TOPIC, "transaction.state.log.num.partitions")
        self.txn_coordinator = create_transaction_coordinator(
            self._internal_writer(TRANSACTION_STATE_TOPIC, self._transaction_log_config, TXN_WRITE_TIMEOUT_MS), values, AsyncioClock(),
            self._marker_writer(PartitionMarkerWriter(self.partitions.get, {OFFSETS_TOPIC: self._offsets_marker})),
            self.metadata.allocate_producer_id,
            lambda: self.metadata.feature_level(TRANSACTION_VERSION),
        )
        await self.txn_coordinator.start(load=self.cluster is None)

    def _marker_writer(self, local: PartitionMarkerWriter) -> Any:
        """Markers go to the partitions' leaders: all here, unless other nodes of a cluster lead some
        (WriteTxnMarkers to them)."""
        if self.cluster is None:
            return local
        from broker.coordinator.txn.remote import RemoteMarkerWriter

        return RemoteMarkerWriter(local, self.node_id, lambda topic, index: self.topology.assignment(topic, index)[0],
                                  self.cluster.node.clients)

    def txn_coordinator_for(self, transactional_id: str) -> TxnVerifier:
        """The transaction coordinator of `transactional_id` as a partition leader asks it: this
        broker's, or another node's (AddPartitionsToTxn to it)."""
        if self.cluster is not None:
            from broker.coordinator.txn.remote import RemoteTxnCoordinator

            node = self.cluster.view.coordinator(1, transactional_id)
            if node >= 0 and node != self.node_id:
                return RemoteTxnCoordinator(self.cluster.node.clients(node))
        return self.txn_coordinator

    async def _offsets_marker(self, index: int, completion: TxnCompletion) -> None:
        await self.group_coordinator.complete_transaction(index, completion.producer_id, completion.producer_epoch,
                                                          completion.committed, completion.coordinator_epoch)

    def _internal_partitions(self, topic: str, config_key: str) -> int:
        info = self.metadata.topic(topic)
        return info.partitions if info is not None else int(self.config[config_key])

    def _internal_writer(self, topic: str, log_config: Callable[[], LogConfig], write_timeout_ms: int
                         ) -> LogPartitionWriter:
        """A coordinator's PartitionWriter over the logs `<topic>-N` (created on first write); a write
        to a replicated partition counts once committed, failing after `write_timeout_ms`."""

        def log_for(index: int) -> Log:
            partition = self.partitions.get(topic, index)
            if partition is not None:
                return partition.log
            return self.logs.get_or_create_log(topic, index, log_config())

        def on_append(index: int) -> None:
            partition = self.partitions.get(topic, index)
            if partition is not None:
                partition.notify()

        def existing_log(index: int) -> Log | None:
            return self.logs.get_log(topic, index)

        return LogPartitionWriter(log_for, on_append, existing_log, lambda index: self.partitions.get(topic, index),
                                  write_timeout_ms)

    def _share_state_log_config(self) -> LogConfig:
        """Kafka's __share_group_state: deleted by pruning, never by retention."""
        return self.default_log_config.with_overrides({
            "cleanup.policy": "delete", "retention.ms": "-1", "compression.type": "producer",
            "segment.bytes": str(self.config["share.coordinator.state.topic.segment.bytes"]),
        })

    async def _start_share_groups(self) -> None:
        """The share coordinator (`__share_group_state-N`, registered in the metadata when the first
        share group appears, as Kafka creates it on first use) and the share-partition manager."""
        from broker.coordinator.share import create_share_coordinator
        from broker.coordinator.share.coordinator import CONFIG_KEYS as SHARE_COORDINATOR_KEYS
        from broker.share.dlq import BrokerDlqCluster, DeadLetterQueue
        from broker.share.manager import SharePartitionManager
        from broker.share.metrics import ShareMetricsCollector
        from broker.share.settings import dlq_settings

        values = {key: self.config[key] for key in SHARE_COORDINATOR_KEYS}
        values["share.coordinator.state.topic.num.partitions"] = self._internal_partitions(
            SHARE_STATE_TOPIC, "share.coordinator.state.topic.num.partitions")
        writer = self._internal_writer(SHARE_STATE_TOPIC, self._share_state_log_config,
                                     int(self.config["share.coordinator.write.timeout.ms"]))

        def log_for(index: int) -> Log:
            partition = self.partitions.get(SHARE_STATE_TOPIC, index)
            if partition is not None:
                return partition.log
            return self.logs.get_or_create_log(SHARE_STATE_TOPIC, index, self._share_state_log_config())

        def partition_exists(topic_id: uuid.UUID, index: int) -> bool:
            topic = self.metadata.topic_by_id(topic_id)
            return topic is not None and 0 <= index < topic.partitions

        self.share_coordinator = create_share_coordinator(
            writer, values, AsyncioClock(), partition_exists=partition_exists,
            log_end_offset=lambda index: log_for(index).log_end_offset,
            prune_before=lambda index, offset: log_for(index).delete_records_before(offset),
        )
        await self.share_coordinator.start(load=self.cluster is None)
        persister: Any = self.share_coordinator
        if self.cluster is not None:  # a share-partition's state may be coordinated by another node
            from broker.coordinator.share.coordinator import coordinator_key
            from broker.share.persister import ShareStateRouter

            view = self.cluster.view
            persister = self.share_state = ShareStateRouter(
                self.node_id, self.share_coordinator, lambda key: view.coordinator(2, coordinator_key(key)),
                self.cluster.node.clients)
        self.dead_letter_queue = DeadLetterQueue(
            BrokerDlqCluster(self), lambda group_id: dlq_settings(self.group_configs.settings(group_id), self.config))
        self.share_manager = SharePartitionManager(
            persister, self._share_partition, self.share_group_settings, AsyncioClock(),
            max_sessions=int(self.config["group.share.max.share.sessions"]), dead_letters=self.dead_letter_queue.write)
        self.group_coordinator.delete_share_state = self._delete_share_state
        if self._share_metrics is None:  # registered once (a broker restarted in-process keeps its registry)
            self._share_metrics = ShareMetricsCollector(
                self.share_manager, lambda topic_id: getattr(self.metadata.topic_by_id(topic_id), "name", None))
            self.metrics.registry.register(self._share_metrics)
        else:
            self._share_metrics.manager = self.share_manager

    def _share_partition(self, topic_id: uuid.UUID, index: int) -> Partition | None:
        topic = self.metadata.topic_by_id(topic_id)
        return None if topic is None else self.partitions.get(topic.name, index)

    def share_group_settings(self, group_id: str) -> ShareGroupSettings:
        """A share group's settings: the broker's (group.share.*), under the group's configs."""
        from broker.share.settings import share_group_settings

        return share_group_settings(self.group_configs.settings(group_id))

    def group_configs_changed(self, group_id: str) -> None:
        """A group's configs changed: its live members and share-partitions obey them from now on."""
        self.group_configs.changed(group_id)
        if self.share_manager is not None:
            self.share_manager.settings_changed(group_id)

    async def _delete_share_state(self, group_ids: list[str]) -> None:
        if self.share_state is not None:  # the share coordinators of its keys may be other nodes
            for group_id in group_ids:
                keys = await self.group_coordinator.share_state_keys(group_id)
                if keys:
                    await self.share_state.delete_state(keys)
                self.share_manager.drop_group(group_id)
            return
        for group_id in group_ids:
            keys = await self.share_coordinator.group_keys(group_id)
            if keys:
                await self.share_coordinator.delete_state(keys)
            self.share_manager.drop_group(group_id)

    async def ensure_share_state_topic(self) -> None:
        """Register `__share_group_state` in the metadata (Kafka creates it on first use)."""
        if self.metadata.topic(SHARE_STATE_TOPIC) is not None:
            return
        configs = {"cleanup.policy": "delete", "retention.ms": "-1", "compression.type": "producer",
                   "segment.bytes": str(self.config["share.coordinator.state.topic.segment.bytes"])}
        await self.create_topic(SHARE_STATE_TOPIC, self.share_coordinator.runtime.num_partitions, configs,
                                replication_factor=self._internal_replication(
                                    "share.coordinator.state.topic.replication.factor"))

    async def ensure_offsets_topic(self) -> None:
        """Register `__consumer_offsets` in the metadata (Kafka creates it at the first
        FindCoordinator for a group); its logs already exist."""
        await self._ensure_internal_topic(OFFSETS_TOPIC, "offsets.topic", "producer")

    async def ensure_transaction_state_topic(self) -> None:
        """Register `__transaction_state` in the metadata (Kafka creates it at the first
        FindCoordinator for a transactional id); its logs already exist."""
        await self._ensure_internal_topic(TRANSACTION_STATE_TOPIC, "transaction.state.log", "uncompressed")

    async def _ensure_internal_topic(self, topic: str, prefix: str, compression: str) -> None:
        """A coordinator's compacted topic, sized by `<prefix>.num.partitions` and `.segment.bytes`."""
        if self.metadata.topic(topic) is not None:
            return
        configs = {
            "cleanup.policy": "compact",
            "compression.type": compression,
            "segment.bytes": str(self.config[prefix + ".segment.bytes"]),
        }
        await self.create_topic(topic, int(self.config[prefix + ".num.partitions"]), configs,
                                replication_factor=self._internal_replication(prefix + ".replication.factor"))

    def _internal_replication(self, config_key: str) -> int:
        if self.cluster is not None:
            configured = None if self.config.is_default(config_key) else self.config[config_key]
            return self.cluster.internal_replication(None if configured is None else int(configured))
        if self.simulated is None:
            return 1
        return self.simulated.internal_replication(config_key)

    def _start_background(self) -> None:
        loop = asyncio.get_running_loop()
        flush_ms = min(self.config.log_flush_interval_ms, 1000)
        jobs = [
            (flush_ms, self.logs.flush_dirty_logs),
            (int(self.config["log.retention.check.interval.ms"]), self.logs.run_retention),
            (int(self.config["log.flush.offset.checkpoint.interval.ms"]), self.logs.checkpoint),
        ]
        for interval_ms, job in jobs:
            self._tasks.append(loop.create_task(self._every(interval_ms / 1000.0, job)))
        if self.config["log.cleaner.enable"]:
            # the cleaner reads the last stable offsets here, on the event loop, then cleans in a thread
            backoff = int(self.config["log.cleaner.backoff.ms"]) / 1000.0
            self._tasks.append(loop.create_task(self._every(backoff, self._clean_logs, False)))
        idle_s = max(0.01, int(self.config["log.open.files.idle.ms"]) / 1000.0)
        self._tasks.append(loop.create_task(self._every(idle_s, OPEN_FILES.close_idle, False)))
        # producer state belongs to the event loop thread: this one runs there
        self._tasks.append(loop.create_task(self._every(PRODUCER_EXPIRATION_CHECK_S, self._expire_producers, False)))
        if self.cluster is not None:
            # Kafka's isr-expiration task, every half of replica.lag.time.max.ms, on the event loop
            lag_s = int(self.config["replica.lag.time.max.ms"]) / 2000.0
            self._tasks.append(loop.create_task(self._every(lag_s, self.partitions.maybe_shrink_isrs, False)))

    async def _every(self, interval: float, job: Callable[[], Any], in_thread: bool = True) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                if in_thread:
                    await asyncio.to_thread(job)
                else:
                    result = job()
                    if asyncio.iscoroutine(result):
                        await result
            except Exception:
                log.exception("background job failed", job=getattr(job, "__name__", str(job)))

    def _expire_producers(self) -> None:
        self.partitions.remove_expired_producers(int(self.clock() * 1000), int(self.config["producer.id.expiration.ms"]))

    async def _clean_logs(self) -> None:
        """A cleaning round of every compacted log, each up to its last stable offset (an open
        transaction's data is not compacted, as in Kafka)."""
        for (topic, index), log_ in list(self.logs.logs.items()):
            if log_.config.compact and not log_.closed:
                partition = self.partitions.get(topic, index)
                lso = partition.last_stable_offset if partition is not None else None
                await asyncio.to_thread(self.cleaner.clean, log_, first_unstable_offset=lso)

    def _client_metrics_subscriptions(self) -> dict[str, dict[str, str]]:
        if self.metadata is None:
            return {}
        return self.metadata.image.resource_configs[RESOURCE_CLIENT_METRICS]

    def advertised(self, listener: str | None = None) -> tuple[str, int]:
        """Host and port given to clients that came in on `listener` (None: the first advertised
        listener): its advertised address, with the bound port for :0; a listener that is not
        advertised (a controller listener) gives its own address. Worked out once the port is
        bound: Metadata and FindCoordinator ask for it every time."""
        found = self._advertised.get(listener)
        if found is not None:
            return found
        advertised = [(a.name.upper(), a.host, a.port) for a in self.config.advertised_listeners]
        bound = [(a.name, a.host, a.port) for a in self.listeners]
        wanted = (listener or "").upper()
        name, host, port = next((a for a in advertised + bound if a[0] == wanted), (advertised or bound)[0])
        host = host or "localhost"
        if host == "0.0.0.0":
            host = "localhost"
        port = port or self.bound_ports.get(name, self.ports[0] if self.ports else 0)
        if port:
            self._advertised[listener] = (host, port)
        return host, port

    # the cluster as clients see it (self.topology; broker.apis.topology) -----------------------
    async def partition_end_offset(self, topic: str, partition: int) -> int | None:
        """A partition's high watermark as its leader has it (None: no such partition, or no
        leader): this node's, or, in a cluster, asked of the leader (ListOffsets)."""
        local = self.partitions.get(topic, partition)
        leader = self.topology.assignment(topic, partition)[0]
        if local is not None and (self.cluster is None or leader == self.node_id):
            return local.high_watermark
        if self.cluster is None or leader < 0:
            return None
        return await self.cluster.latest_offset(leader, topic, partition)

    def metadata_quorum(self) -> QuorumState:
        """The metadata log's quorum (DescribeQuorum): this node alone, or the cluster's controller."""
        if self.cluster is not None:
            return self.cluster.quorum(self.metadata_directory_id)
        metadata_log = self.logs.get_log(METADATA_TOPIC, 0)
        end = metadata_log.log_end_offset if metadata_log is not None else 0
        return QuorumState(self.node_id, self.quorum_epoch, end, [Replica(self.node_id, self.metadata_directory_id, end)])

    async def move_leader(self, topic: str, partition: int, to: int) -> None:
        """The lead of a partition goes to node `to` (ElectLeaders; only a simulated cluster's
        leaders move)."""
        if self.simulated is None:
            raise KafkaError(ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.")
        await self.simulated.move_leader(topic, partition, to)

    async def move_replicas(self, topic: str, partition: int, replicas: list[int]) -> None:
        """A partition's replicas become `replicas` at once (AlterPartitionReassignments without a
        controller: only a simulated cluster has other nodes to move them to)."""
        if self.simulated is not None:
            await self.simulated.move_replicas(topic, partition, replicas)

    def leader_epoch_of(self, topic: str, partition: int) -> int:
        if self.cluster is not None:  # the metadata's, as every node answers it (not a replica's own)
            info = self.metadata.topic(topic)
            found = info.assignments.get(partition) if info is not None else None
            if found is not None:
                return found.leader_epoch
        stored = self.partitions.get(topic, partition)
        return stored.leader_epoch if stored is not None else self.leader_epoch

    def coordinators(self) -> list[tuple[str, Any]]:
        """The coordinators by kind (group, transaction, ...), each with its `runtime`."""
        found = (("group", self.group_coordinator), ("transaction", self.txn_coordinator),
                 ("share", self.share_coordinator))
        return [(kind, coordinator) for kind, coordinator in found if coordinator is not None]

    async def stop(self, clean: bool = True) -> None:
        """Stop serving. Clean: in-flight requests finish, logs are flushed and checkpointed, the
        clean-shutdown markers written. Not clean (broker.testing's restart as after `kill -9`):
        connections are cut at once and the files are let go as they are, so the next start
        recovers them as after a crash."""
        if self._stopping:
            return
        self._stopping = True
        self.faults.detach()  # delayed requests go on now
        # Every step runs even when an earlier one failed (a log dir removed under the broker must
        # not leave the listeners or the coordinators running); the first failure is raised at the
        # end, and the broker counts as stopped either way.
        failure: BaseException | None = None

        async def step(name: str, action: Callable[[], Any]) -> None:
            nonlocal failure
            try:
                result = action()
                if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                    await result
            except Exception as exc:
                log.error("shutdown step failed", step=name, error=repr(exc))
                failure = failure or exc

        if not clean:
            await step("abort connections", self.server.abort)
        elif self.cluster is not None:  # Kafka's controlled shutdown: leaderships move first
            await step("controlled shutdown", self.cluster.controlled_shutdown)
        if self.txn_coordinator is not None:
            # transactions being completed finish at the next start
            await step("transaction coordinator", self.txn_coordinator.stop)
        if self.share_manager is not None:
            await step("share fetches", self.share_manager.stop)  # long-polling share fetches answer now
        if self.group_coordinator is not None:
            # parked JoinGroup/SyncGroup answered NOT_COORDINATOR
            await step("group coordinator", self.group_coordinator.stop)
        if self.share_state is not None:
            await step("share state", self.share_state.close)
        if self.share_coordinator is not None:
            await step("share coordinator", self.share_coordinator.stop)
        await step("wake fetches", self.partitions.wake_all)  # long polls answer now with what they have
        await step("server", self.server.stop)
        if self.http is not None:
            await step("http endpoint", self.http.stop)
        await step("log dir moves", self.log_dir_mover.stop)
        if self.cluster is not None:  # a controlled shutdown first, when clean
            cluster = self.cluster
            await step("cluster", lambda: cluster.stop(clean))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if clean:  # the next start replays no producer state
            await step("producer snapshots", lambda: asyncio.to_thread(self.partitions.take_snapshots))
        await step("logs", lambda: asyncio.to_thread(self.logs.shutdown if clean else self.logs.abandon))
        self._stopped.set()
        if failure is not None:
            raise failure
        log.info("broker stopped", clean=clean)

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def leader_replication_quota(self) -> ReplicationQuota | None:
        return self.cluster.replication_quotas.leader if self.cluster is not None else None

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # cluster mode -------------------------------------------------------------------------------
    async def _join_cluster(self, pinned: str | None) -> str:
        """Reach etcd and the cluster's id (pinned by cluster.id or this node's meta.properties;
        another one in etcd: ClusterStartError, the node does not start)."""
        import broker.apis.forwarding  # noqa: F401  (registers the controller's APIs before anything listens)
        from broker.cluster.local import ClusterMode

        self.cluster = ClusterMode.for_broker(self, Path(self.config.log_dirs[0]) / (METADATA_TOPIC + "-0"))
        self.server.controller_apis = True
        return await self.cluster.connect(pinned)

    def _serve_cluster(self) -> None:
        """The listeners are bound: requests for other nodes are answered as Kafka's brokers answer
        them, metadata changes go to the controller, and the node registers with the controller."""
        from broker.apis.forwarding import forward
        from broker.apis.routing import Router

        assert self.cluster is not None
        cluster = self.cluster
        # a fenced node leads and coordinates nothing, whatever its metadata says (a restarted node
        # before it has registered again: Kafka's brokers serve clients only once unfenced)
        router = Router(cluster.view, lambda: self.metadata, lambda ctx: -1 if cluster.node.fenced else self.node_id,
                        lambda ctx, request, handler: forward(cluster.node, ctx, request, handler),
                        self._min_insync_replicas)
        self.faults.route(router.route, router.api_keys)
        cluster.serve()

    def _min_insync_replicas(self, topic: str) -> int:
        info = self.metadata.topic(topic)
        value = info.configs.get("min.insync.replicas") if info is not None else None
        return int(value if value is not None else self.config["min.insync.replicas"])

    # topics ------------------------------------------------------------------------------------
    def topic_log_config(self, topic: str) -> LogConfig | None:
        if topic == OFFSETS_TOPIC and (self.metadata is None or self.metadata.topic(topic) is None):
            return self._offsets_log_config()  # compacted even before the topic is registered
        if topic == TRANSACTION_STATE_TOPIC and (self.metadata is None or self.metadata.topic(topic) is None):
            return self._transaction_log_config()
        if topic == SHARE_STATE_TOPIC and (self.metadata is None or self.metadata.topic(topic) is None):
            return self._share_state_log_config()
        if self.metadata is None:
            return None
        info = self.metadata.topic(topic)
        if info is None or not info.configs:
            return None
        return LogConfig.from_properties(info.configs, self.default_log_config)

    def _ensure_partitions(self, info: TopicInfo) -> None:
        config = self.topic_log_config(info.name)
        for index in range(info.partitions):
            self.partitions.ensure(info.name, index, info.topic_id, config)

    def apply_dynamic_configs(self) -> None:
        """Install the dynamic broker configs of the metadata image, rebuild the broker-wide log
        defaults from them and push every topic's resulting config to its logs."""
        dynamic = self.metadata.image.broker_configs
        self.config.set_dynamic(dynamic.get("", {}), dynamic.get(str(self.node_id), {}))
        self.default_log_config = LogConfig.from_broker_properties(self.config.effective_raw)
        self.logs.default_config = self.default_log_config
        configs: dict[str, LogConfig] = {}
        for (topic, _), log_ in self.logs.logs.items():
            if topic in self.metadata.topics:
                if topic not in configs:
                    configs[topic] = self.topic_log_config(topic) or self.default_log_config
                log_.update_config(configs[topic])

    def validate_topic_configs(self, configs: dict[str, str]) -> LogConfig:
        return LogConfig.from_properties(configs, self.default_log_config)

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str], validate_only: bool = False,
        replication_factor: int | None = None, assignments: list[list[int]] | None = None,
    ) -> TopicInfo:
        """Create a topic (-1 partitions: num.partitions) with `replication_factor` replicas per
        partition (None: default.replication.factor, as for an auto-created topic) placed over
        the cluster's nodes, or the given `assignments` (replicas per partition); raises
        KafkaError with Kafka's codes."""
        if partitions == -1:
            partitions = int(self.config["num.partitions"])
        if replication_factor is None:
            replication_factor = int(self.config["default.replication.factor"])
        self.validate_topic_configs(configs)
        if validate_only:
            existing = self.metadata.topic(name)
            if existing is not None:
                raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, "Topic '%s' already exists." % name)
            from broker.metadata import validate_topic_name

            validate_topic_name(name)
            if partitions <= 0:
                raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
            return TopicInfo(name, uuid.UUID(int=0), partitions, dict(configs))
        if self.cluster is not None:  # placed over the registered brokers, by the controller
            return await self.cluster.create_topic(name, partitions, configs, replication_factor, assignments)
        info = self.metadata.create_topic(name, partitions, configs,
                                          replicas=self._placement(name, replication_factor, assignments))
        self._ensure_partitions(info)
        log.info("topic created", topic=name, partitions=partitions, topic_id=str(info.topic_id))
        await self.topics_changed(created={name})
        return info

    async def topics_changed(self, **changes: set[str]) -> None:
        """Tell the group coordinator (consumer groups follow their subscribed topics)."""
        if self.group_coordinator is not None:
            await self.group_coordinator.on_topics_changed(**changes)

    async def delete_topic(self, name: str) -> TopicInfo:
        info = self.metadata.delete_topic(name)
        if self.cluster is not None:  # every node drops it as it replays the deletion
            return info
        self.log_dir_mover.cancel_topic(name)
        await self.partitions.remove_topic(name)
        log.info("topic deleted", topic=name)
        await self.topics_changed(deleted={name})
        await self.share_topic_deleted(info.topic_id)
        return info

    async def share_topic_deleted(self, topic_id: uuid.UUID) -> None:
        """The share state of a deleted topic goes (Kafka's share coordinator and group coordinator
        clean up after a topic deletion)."""
        if self.share_coordinator is None:
            return
        try:
            keys = await self.share_coordinator.topic_keys(topic_id)
            if keys:
                await self.share_coordinator.delete_state(keys)
                self.share_manager.drop(keys)
            await self.group_coordinator.share_topics_deleted({topic_id})
        except KafkaError as exc:
            log.warning("share state of a deleted topic not cleaned up", topic_id=str(topic_id), error=repr(exc))

    async def create_partitions(self, name: str, total: int, validate_only: bool = False,
                                assignments: list[list[int]] | None = None) -> TopicInfo:
        """Add partitions up to `total`, with the topic's replication factor or the `assignments`
        of the new partitions."""
        info = self.metadata.topic(name)
        if validate_only:
            if info is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The topic '%s' does not exist." % name)
            if total <= info.partitions:
                raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Topic already has %d partition(s)." % info.partitions)
            return info
        if self.cluster is not None and info is not None:  # every node follows as it replays them
            placed = self.cluster.place_new_partitions(info, total, assignments)
            start = info.partitions
            return self.metadata.create_partitions(name, total, lambda index: list(placed[index - start]))
        factor = len(info.assignments[0].replicas) if info is not None and 0 in info.assignments else 1
        if assignments is not None and info is not None:  # those of the new partitions, by absolute index
            assignments = [[] for _ in range(info.partitions)] + assignments
        info = self.metadata.create_partitions(name, total, self._placement(name, factor, assignments))
        self._ensure_partitions(info)
        await self.topics_changed(changed={name})
        return info

    def _placement(self, topic: str, factor: int, assignments: list[list[int]] | None
                   ) -> Callable[[int], list[int]] | None:
        if assignments is not None:
            return lambda index: list(assignments[index])
        return self.topology.placement(topic, factor)

    def alter_topic_configs(self, name: str, changes: dict[str, str | None], validate_only: bool = False) -> None:
        info = self.metadata.topic(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The topic '%s' does not exist." % name)
        merged = {k: v for k, v in {**info.configs, **changes}.items() if v is not None}
        config = self.validate_topic_configs(merged)
        if validate_only:
            return
        self.metadata.set_configs(RESOURCE_TOPIC, name, changes)
        if self.cluster is None:  # a node of a cluster applies it as it replays it
            self.logs.update_topic_config(name, config)
