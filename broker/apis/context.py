"""What a handler is given besides its request: the RequestContext, and the two sides it reaches
through it, typed here below the layers that provide them.

`BrokerServices` names exactly what the handlers use of the broker (broker.app.Broker, a layer
above them, satisfies it: mypy checks that where the server is built). `ClientConnection` is
what they use of the connection the request came in on (broker.network.server.Connection).
`TxnVerifier` is what the produce path asks of a transactional id's coordinator, this broker's
or another node's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from broker.apis.topology import Node, Topology

if TYPE_CHECKING:
    from broker.apis.fetch_sessions import FetchSessionCache
    from broker.cluster.replication_quota import ReplicationQuota
    from broker.config import BrokerConfig
    from broker.coordinator.group import GroupCoordinator
    from broker.coordinator.share import ShareCoordinator
    from broker.coordinator.txn import TransactionCoordinator
    from broker.coordinator.txn.state import TopicPartition
    from broker.log import LogConfig, LogManager
    from broker.metadata import MetadataStore, TopicInfo
    from broker.metadata.quorum import QuorumState
    from broker.observability.metrics import Metrics
    from broker.observability.telemetry import ClientTelemetry
    from broker.partition import PartitionManager
    from broker.partition.log_dirs import LogDirMover
    from broker.security.authorizer import Authorizer
    from broker.security.listeners import Listener
    from broker.security.quotas import ClientQuotas
    from broker.share.manager import SharePartitionManager
    from broker.share.persister import ShareStateRouter
    from protocol.errors import ErrorCode



class TxnVerifier(Protocol):
    """The transaction coordinator of a transactional id as a partition leader asks it before a
    transactional batch opens a transaction there (KIP-890)."""

    async def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                partitions: list[TopicPartition], /) -> dict[TopicPartition, ErrorCode]: ...

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: list[TopicPartition], transaction_version: int, /) -> ErrorCode: ...


class BrokerServices(Protocol):
    """The broker as the request handlers (and the server) use it."""

    node_id: int
    cluster_id: str
    config: BrokerConfig
    metadata: MetadataStore
    metadata_directory_id: uuid.UUID  # directory.id of the metadata log's dir
    quorum_epoch: int
    logs: LogManager
    partitions: PartitionManager
    log_dir_mover: LogDirMover
    authorizer: Authorizer | None  # None: every operation is allowed
    quotas: ClientQuotas | None
    metrics: Metrics
    fetch_sessions: FetchSessionCache  # incremental fetch sessions (KIP-227)

    @property
    def telemetry(self) -> ClientTelemetry: ...  # made at the first telemetry request

    # set once the broker has started them (the handlers answer COORDINATOR_NOT_AVAILABLE before)
    @property
    def group_coordinator(self) -> GroupCoordinator | None: ...

    @property
    def txn_coordinator(self) -> TransactionCoordinator | None: ...

    @property
    def share_coordinator(self) -> ShareCoordinator | None: ...

    @property
    def share_manager(self) -> SharePartitionManager | None: ...

    @property
    def share_state(self) -> ShareStateRouter | None: ...  # a cluster: each key's share coordinator

    async def partition_end_offset(self, topic: str, partition: int) -> int | None: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def leader_replication_quota(self) -> ReplicationQuota | None: ...  # a node of a cluster: its throttle

    # the cluster as clients see it (one node, a simulated cluster, or a node of a cluster)
    topology: Topology

    def advertised(self, listener: str | None = None) -> tuple[str, int]: ...

    def metadata_quorum(self) -> QuorumState: ...

    def leader_epoch_of(self, topic: str, partition: int) -> int: ...

    def txn_coordinator_for(self, transactional_id: str) -> TxnVerifier | None: ...

    async def move_leader(self, topic: str, partition: int, to: int) -> None: ...

    async def move_replicas(self, topic: str, partition: int, replicas: list[int]) -> None: ...

    # internal topics, registered on first use
    async def ensure_offsets_topic(self) -> None: ...

    async def ensure_transaction_state_topic(self) -> None: ...

    async def ensure_share_state_topic(self) -> None: ...

    # topics and configs
    async def create_topic(self, name: str, partitions: int, configs: dict[str, str], validate_only: bool = False,
                           replication_factor: int | None = None,
                           assignments: list[list[int]] | None = None) -> TopicInfo: ...

    async def delete_topic(self, name: str) -> TopicInfo: ...

    async def create_partitions(self, name: str, total: int, validate_only: bool = False,
                                assignments: list[list[int]] | None = None) -> TopicInfo: ...

    def validate_topic_configs(self, configs: dict[str, str]) -> LogConfig: ...

    def alter_topic_configs(self, name: str, changes: dict[str, str | None], validate_only: bool = False) -> None: ...

    def apply_dynamic_configs(self) -> None: ...

    def group_configs_changed(self, group_id: str) -> None: ...


class ClientConnection(Protocol):
    """The connection a request came in on, as handlers and security use it."""

    principal: str  # who the client is ("User:ANONYMOUS" without authentication)
    listener: Listener | None  # None: a bare test server
    node: int | None  # the simulated node the client connected to (None: this broker's own)
    client_software: tuple[str, str]  # name and version from ApiVersions v3+
    throttled_until: float  # a quota's throttle: no request is taken before (monotonic seconds)
    share_watched: bool  # its share sessions end with it (broker/apis/share.py)
    on_close: list[Callable[[], None]]

    def close(self) -> None: ...

    def hold(self, release: Callable[[], None]) -> None: ...


@dataclass(slots=True)
class RequestContext:
    """What a handler knows about the request beyond its body."""

    broker: BrokerServices
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    client_port: int
    connection: ClientConnection
    received: float = field(default_factory=time.monotonic)
    # set by a cluster's router for a Fetch: why this node may not serve a partition (None: it may)
    partition_error: Callable[[str, int], ErrorCode | None] | None = None

    def release_on_next_request(self, release: Callable[[], None]) -> None:
        """The handler holds its response back (a long-polled heartbeat): `release` is called,
        once, when the connection has another request waiting behind it, closes, or the broker
        stops, so that nothing waits behind a held response."""
        self.connection.hold(release)


__all__ = ["BrokerServices", "ClientConnection", "Node", "RequestContext", "TxnVerifier"]

