"""One node of a cluster (`etcd.endpoints` set): its place in etcd, its metadata, its controller
candidacy and its life as a registered broker.

Start-up, in order (`connect`, then `start`, then `start_lifecycle` once the listeners are bound):
etcd must answer within `initial.broker.registration.timeout.ms` (the node waits for it, as a
Kafka broker waits for its controller quorum; then it gives up and does not start); the cluster
id is the one in etcd, made by the first node (`cluster.id` or meta.properties pin it; a node of
another cluster refuses to start);
the node takes a lease and claims its node.id (a second process with the same id refuses to
start); its image is its last local snapshot caught up with the log in etcd; it becomes a
candidate for the controller; once it listens it registers with the active controller
(BrokerRegistration) and heartbeats (BrokerHeartbeat, every `broker.heartbeat.interval.ms`) until
it is unfenced, and then on. Stopping is a controlled shutdown: the controller fences it and
moves what it leads before it goes, and it hands over the controller term if it holds it.

While etcd is away the node keeps serving what it leads with the metadata it has; metadata
changes are refused with NOT_CONTROLLER (retriable) until etcd is back, and everything resumes by
itself: the lease is taken again, the node id claimed again, the log read on from where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.cluster.client import NodeClients
from broker.cluster.controller import ActiveController, ControllerSettings, supported_levels
from broker.cluster.election import (
    ClusterIdMismatch,
    ControllerElection,
    ControllerInfo,
    NodeIdInUse,
    Session,
    claim_node_id,
    resolve_cluster_id,
)
from broker.cluster.errors import ClusterStartError
from broker.cluster.etcd import EtcdUnavailable, within
from broker.cluster.etcd_http import HttpEtcd
from broker.cluster.keys import ClusterKeys, Leadership
from broker.cluster.metadata_log import LocalSnapshots, MetadataLog
from broker.cluster.metadata_sync import ControllerLog, MetadataLoader, not_controller
from broker.cluster.view import ImageView
from broker.metadata import MetadataStore
from broker.observability.logger import get_logger
from broker.security.interbroker import InterBrokerSecurity, inter_broker_security
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.cluster")

BROKER_REGISTRATION, BROKER_HEARTBEAT, ALLOCATE_PRODUCER_IDS = 62, 63, 67
REGISTRATION_VERSION, HEARTBEAT_VERSION = 4, 1
FENCED_HEARTBEAT_MS = 100  # how often a fenced broker heartbeats until it is unfenced
CONTROLLED_SHUTDOWN_TIMEOUT_S = 5.0  # how long a stopping broker waits for its leaderships to move
ETCD_START_RETRY_S = 0.5  # between a starting node's attempts to reach etcd
CONTROLLED_SHUTDOWN_POLL_S = 0.05  # between its heartbeats asking to shut down


@dataclass(frozen=True)
class ClusterSettings:
    endpoints: list[str]
    root: str
    lease_timeout_ms: int
    session_timeout_ms: int
    heartbeat_interval_ms: int
    inter_broker_listener: str
    rack: str | None
    snapshot_bytes: int  # metadata.log.max.record.bytes.between.snapshots
    static_min_insync_replicas: int
    # how this node connects to the others' inter-broker listener (TLS, SASL); None: plain TCP
    inter_broker_security: InterBrokerSecurity | None = None
    unclean_leader_election: bool = False  # unclean.leader.election.enable
    auto_leader_rebalance: bool = True  # auto.leader.rebalance.enable
    leader_imbalance_check_interval_ms: int = 300_000  # leader.imbalance.check.interval.seconds
    initial_registration_timeout_ms: int = 60_000  # initial.broker.registration.timeout.ms

    @classmethod
    def from_config(cls, config: Any, inter_broker_listener: str) -> ClusterSettings:
        """The settings of a node (SecurityConfigError: the inter-broker listener's security
        cannot work as configured)."""
        endpoints = [e.strip() for e in str(config["etcd.endpoints"]).split(",") if e.strip()]
        return cls(endpoints, str(config["etcd.root"]), int(config["etcd.lease.timeout.ms"]),
                   int(config["broker.session.timeout.ms"]), int(config["broker.heartbeat.interval.ms"]),
                   inter_broker_listener, config["broker.rack"],
                   int(config["metadata.log.max.record.bytes.between.snapshots"]),
                   config.static_min_insync_replicas, inter_broker_security(config, inter_broker_listener),
                   bool(config["unclean.leader.election.enable"]), bool(config["auto.leader.rebalance.enable"]),
                   int(config["leader.imbalance.check.interval.seconds"]) * 1000,
                   int(config["initial.broker.registration.timeout.ms"]))


class ClusterNode:
    def __init__(self, settings: ClusterSettings, node_id: int, metadata_dir: Path,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.settings = settings
        self.node_id = node_id
        self.directory_id = ""  # of its first log directory: the node's identity in its id claim
        self.metadata_dir = metadata_dir
        self.clock_ms = clock_ms or (lambda: int(time.monotonic() * 1000))
        self.etcd = HttpEtcd(settings.endpoints)
        self.cluster_id = ""
        self.keys: ClusterKeys | None = None
        self.session: Session | None = None
        self.store: MetadataStore | None = None
        self.mlog: MetadataLog | None = None
        self.clog: ControllerLog | None = None
        self.loader: MetadataLoader | None = None
        self.controller: ActiveController | None = None
        self.election: ControllerElection | None = None
        self.view: ImageView | None = None
        self.clients = NodeClients(self._inter_broker_address, "broker-%d" % node_id, settings.inter_broker_security)
        self.incarnation_id = uuid.uuid4()
        self.broker_epoch = -1
        self.fenced = True
        self.listeners: list[M.BrokerRegistrationRequest.Listener] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._becoming: asyncio.Task[None] | None = None
        self._resigning: asyncio.Task[None] | None = None  # a term given up after a failed append
        self.unfenced_listeners: list[Callable[[], None]] = []  # told each time this broker is unfenced
        self._stopping = False
        self._shut_down = False  # the controller let it go (controlled shutdown complete)
        self._shutdown_tried = False
        # completed (and replaced) each time the controller changes: calls to the old one give up
        self._controller_moved: asyncio.Future[None] | None = None

    # start -------------------------------------------------------------------------------------
    async def connect(self, wanted_cluster_id: str | None) -> str:
        """Reach etcd and learn the cluster id (ClusterStartError when the node cannot join). etcd
        not answering yet (started beside the node, as compose files do) is waited for."""
        deadline = self.clock_ms() + self.settings.initial_registration_timeout_ms
        waiting = False
        while True:
            try:
                await self.etcd.check()
                self.cluster_id = await resolve_cluster_id(self.etcd, self.settings.root, wanted_cluster_id)
                break
            except EtcdUnavailable as exc:
                if self.clock_ms() >= deadline:
                    await self.etcd.close()
                    raise ClusterStartError("etcd is unreachable (%s): %s" % (
                        ", ".join(self.settings.endpoints), exc)) from None
                if not waiting:
                    waiting = True
                    log.warning("waiting for etcd", endpoints=self.settings.endpoints, error=str(exc),
                                timeout_ms=self.settings.initial_registration_timeout_ms)
                await asyncio.sleep(ETCD_START_RETRY_S)
            except ClusterIdMismatch as exc:
                await self.etcd.close()
                raise ClusterStartError(str(exc)) from None
        self.keys = ClusterKeys(self.cluster_id, self.settings.root)
        return self.cluster_id

    async def start(self, store: MetadataStore, directory_id: str, catch_up_timeout_s: float = 60.0) -> None:
        """Lease, node id, image, candidacy. `store` becomes this node's metadata in cluster mode."""
        assert self.keys is not None
        self.directory_id = directory_id
        keys = self.keys
        self.session = Session(self.etcd, self.settings.lease_timeout_ms)
        try:
            await self.session.start()
            await claim_node_id(self.etcd, keys, self.node_id, self.directory_id, self.session.lease,
                                self.session.ttl)
        except NodeIdInUse as exc:
            await self._close_etcd()
            raise ClusterStartError(str(exc)) from None
        except EtcdUnavailable as exc:
            await self._close_etcd()
            raise ClusterStartError("etcd is unreachable: %s" % exc) from None

        async def claim_again(lease: int) -> None:
            await claim_node_id(self.etcd, keys, self.node_id, self.directory_id, lease, self.session.ttl
                                if self.session is not None else 0)

        self.session.on_renew.append(claim_again)
        self.store = store
        self.mlog = MetadataLog(self.etcd, keys, LocalSnapshots(self.metadata_dir))
        self.loader = MetadataLoader(store, self.mlog, LocalSnapshots(self.metadata_dir),
                                     snapshot_bytes=self.settings.snapshot_bytes)
        self.clog = ControllerLog(self.mlog, lambda: store.image, self._append_failed)
        store.log = self.clog
        self.view = ImageView(lambda: store.committed, self.node_id, controller=lambda: self.controller_id)
        self.loader.load_local()
        self.loader.start()
        end = await self.mlog.end_offset()
        await self.loader.wait_for_offset(end, catch_up_timeout_s)
        self.controller = ActiveController(
            self.node_id, store, self.clog, self.loader, self.mlog,
            ControllerSettings(self.cluster_id, self.settings.session_timeout_ms, self.settings.heartbeat_interval_ms,
                               self.settings.snapshot_bytes, self.settings.static_min_insync_replicas,
                               static_unclean_leader_election=self.settings.unclean_leader_election,
                               auto_leader_rebalance=self.settings.auto_leader_rebalance,
                               leader_imbalance_check_interval_ms=self.settings.leader_imbalance_check_interval_ms),
            self.clock_ms)
        self.election = ControllerElection(self.etcd, keys, self.node_id, self.session)
        self.election.listeners.append(self._controller_changed)
        self.election.start()
        log.info("joined the cluster", cluster_id=self.cluster_id, node_id=self.node_id, metadata_offset=end,
                 etcd=self.settings.endpoints)

    async def wait_for_bootstrap(self, timeout_s: float = 60.0) -> None:
        """Until the cluster's features are finalized (its first controller does it)."""
        assert self.store is not None and self.loader is not None
        store = self.store
        deadline = time.monotonic() + timeout_s
        while not store.image.features:
            if time.monotonic() > deadline:
                raise ClusterStartError("no controller finalized the cluster's features within %.0f s" % timeout_s)
            await asyncio.sleep(0.02)

    def start_lifecycle(self, listeners: list[tuple[str, str, int, int]]) -> None:
        """Register with the controller and heartbeat (listeners: name, host, port, protocol id)."""
        L = M.BrokerRegistrationRequest.Listener
        self.listeners = [L(name=n, host=h, port=p, security_protocol=s) for n, h, p, s in listeners]
        self._tasks.append(asyncio.get_running_loop().create_task(self._lifecycle(), name="broker-lifecycle"))

    # the controller -----------------------------------------------------------------------------
    @property
    def controller_id(self) -> int:
        info = self.election.controller if self.election is not None else None
        return info.node_id if info is not None else -1

    @property
    def controller_epoch(self) -> int:
        info = self.election.controller if self.election is not None else None
        return info.epoch if info is not None else -1

    @property
    def is_controller(self) -> bool:
        return self.controller is not None and self.controller.active

    def _controller_changed(self, info: ControllerInfo | None, leadership: Leadership | None) -> None:
        controller = self.controller
        assert controller is not None
        moved = self._controller_moved
        if moved is not None and not moved.done():
            moved.set_result(None)
        self._controller_moved = None
        if leadership is not None and controller.leadership != leadership:
            if self._becoming is not None:
                self._becoming.cancel()
            self._becoming = asyncio.get_running_loop().create_task(self._become(leadership))
        elif leadership is None and controller.leadership is not None:
            controller.resign()

    async def _become(self, leadership: Leadership) -> None:
        assert self.controller is not None
        try:
            await self.controller.become_active(leadership)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("could not take up the controller term; resigning", error=repr(exc))
            if self.election is not None:
                await self.election.resign(until_done=True)

    def _append_failed(self) -> None:
        """A metadata append failed: the image may hold what is not durable; reload it from etcd,
        and give the term up (another node, or this one again, starts afresh)."""
        if self.controller is not None:
            self.controller.resign()
        if self.loader is not None:
            self.loader.reload()
        if self.election is not None and (self._resigning is None or self._resigning.done()):
            self._resigning = asyncio.get_running_loop().create_task(self.election.resign(until_done=True))

    async def sync(self) -> None:
        """Every metadata change this node made so far is durable (NOT_CONTROLLER if not)."""
        if self.clog is not None:
            await self.clog.sync()

    def controller_client_call(self, api_key: int, version: int, request: Any) -> Awaitable[Any]:
        """A request to the active controller, another node (KafkaError NOT_CONTROLLER if none)."""
        if self.controller_id == self.node_id:
            # elected but not active yet, or its lease lost: a call to itself would wait on its own
            # connection (one request at a time) until it timed out, and everything behind it
            raise not_controller("This node is not the active controller yet, or no longer.")
        return self.clients(self.controller_id).call(api_key, version, request, unreachable=ErrorCode.NOT_CONTROLLER)

    async def to_controller(self, api_key: int, version: int, request: Any,
                            local: Callable[[Any], Awaitable[Any]]) -> Any:
        """A request to the active controller: served here when this node is it."""
        if self.is_controller:
            return await local(request)
        if self.controller_id < 0:
            raise not_controller("No controller is active.")
        return await self._unless_controller_moves(self.controller_client_call(api_key, version, request))

    async def _unless_controller_moves(self, call: Awaitable[Any]) -> Any:
        """The answer of a call to the controller, unless another node becomes the controller
        first (NOT_CONTROLLER: the caller asks again, the new one). A controller cut off from
        the network does not answer, and its calls would wait out their timeout: meanwhile this
        node's heartbeats would reach nobody, and the new controller would fence it."""
        if self._controller_moved is None:
            self._controller_moved = asyncio.get_running_loop().create_future()
        moved = self._controller_moved
        task = asyncio.ensure_future(call)
        try:
            await asyncio.wait({task, moved}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not task.done():
            task.cancel()
            raise not_controller("The controller changed while the request was in flight.")
        return task.result()

    async def caught_up_with_controller(self, timeout_s: float = 5.0) -> None:
        """Until this node's image holds what the log held just now (the client's next request
        here sees its change), at most `timeout_s`."""
        if self.mlog is None or self.loader is None:
            return
        with contextlib.suppress(EtcdUnavailable, TimeoutError):
            end = await self.mlog.end_offset()
            await self.loader.wait_for_offset(end, timeout_s)

    # broker lifecycle ---------------------------------------------------------------------------
    async def _lifecycle(self) -> None:
        backoff = 0.05
        while not self._stopping:
            try:
                if self.broker_epoch < 0:
                    await self._register()
                await self._heartbeat()
                backoff = 0.05
                wait = FENCED_HEARTBEAT_MS if self.fenced else self.settings.heartbeat_interval_ms
                await asyncio.sleep(wait / 1000.0)
            except KafkaError as exc:
                if exc.code in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
                    log.warning("registering again", reason=exc.code.name)
                    self.broker_epoch = -1
                elif exc.code is ErrorCode.DUPLICATE_BROKER_REGISTRATION:
                    # an earlier incarnation of this node (killed) still has a session: as Kafka's
                    # brokers, wait until the controller lets it lapse
                    log.info("registration refused until the previous incarnation's session ends",
                             node_id=self.node_id)
                elif exc.code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
                    security = self.settings.inter_broker_security
                    log.error("the controller refused this broker: the principal it authenticates as on the "
                              "inter-broker listener needs CLUSTER_ACTION on the cluster (super.users)",
                              listener=self.settings.inter_broker_listener,
                              user=security.credentials.get("username") if security is not None else None)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("broker lifecycle step failed")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _register(self) -> None:
        R = M.BrokerRegistrationRequest
        request = R(broker_id=self.node_id, cluster_id=self.cluster_id, incarnation_id=self.incarnation_id,
                    listeners=self.listeners, rack=self.settings.rack, log_dirs=[], previous_broker_epoch=-1,
                    features=[R.Feature(name=n, min_supported_version=lo, max_supported_version=hi)
                              for n, (lo, hi) in sorted(supported_levels().items())])
        assert self.controller is not None
        response = await self.to_controller(BROKER_REGISTRATION, REGISTRATION_VERSION, request,
                                            lambda r: self.controller.register(r))  # type: ignore[union-attr]
        if response.error_code:
            raise KafkaError(ErrorCode(response.error_code), "registration refused")  # type: ignore[call-arg]
        self.broker_epoch = response.broker_epoch
        self.fenced = True
        log.info("registered with the controller", broker_epoch=self.broker_epoch, controller=self.controller_id)

    async def _heartbeat(self, want_shut_down: bool = False) -> Any:
        assert self.store is not None and self.controller is not None
        request = M.BrokerHeartbeatRequest(broker_id=self.node_id, broker_epoch=self.broker_epoch,
                                           current_metadata_offset=self.store.image.records, want_fence=False,
                                           want_shut_down=want_shut_down, offline_log_dirs=[])
        response = await self.to_controller(BROKER_HEARTBEAT, HEARTBEAT_VERSION, request,
                                            lambda r: self.controller.heartbeat(r))  # type: ignore[union-attr]
        if response.error_code:
            raise KafkaError(ErrorCode(response.error_code), "heartbeat refused")  # type: ignore[call-arg]
        unfenced = self.fenced and not response.is_fenced
        self.fenced = response.is_fenced
        if unfenced:
            log.info("unfenced: serving as a live broker", broker_epoch=self.broker_epoch)
            for listener in self.unfenced_listeners:
                listener()
        return response

    async def allocate_producer_ids(self) -> tuple[int, int]:
        """A new block of producer ids from the controller: (first id, count)."""
        assert self.controller is not None
        request = M.AllocateProducerIdsRequest(broker_id=self.node_id, broker_epoch=self.broker_epoch)
        response = await self.to_controller(ALLOCATE_PRODUCER_IDS, 0, request,
                                            lambda r: self.controller.allocate_producer_ids(r))  # type: ignore
        if response.error_code:
            raise KafkaError(ErrorCode(response.error_code), "no producer ids")  # type: ignore[call-arg]
        return response.producer_id_start, response.producer_id_len

    # stop ---------------------------------------------------------------------------------------
    async def controlled_shutdown(self, timeout_s: float = CONTROLLED_SHUTDOWN_TIMEOUT_S) -> bool:
        """Kafka's controlled shutdown, while the broker still serves: heartbeats asking to shut
        down until the controller says it may (its leaderships moved, every live broker knowing
        the new leaders), at most `timeout_s`. True when it may; False leaves it to the session
        timeout (no controller, one unreachable)."""
        if self._shutdown_tried or self.broker_epoch < 0:
            return self._shut_down
        self._shutdown_tried = True
        await self._stop_lifecycle()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                response = await within(max(deadline - time.monotonic(), 0.01), self._heartbeat(want_shut_down=True))
                if response.should_shut_down:
                    self._shut_down = True
                    log.info("controlled shutdown complete: its leaderships moved", broker_epoch=self.broker_epoch)
                    return True
            except (KafkaError, TimeoutError, EtcdUnavailable) as exc:
                log.info("controlled shutdown: heartbeat failed", error=repr(exc))
            await asyncio.sleep(CONTROLLED_SHUTDOWN_POLL_S)
        log.warning("controlled shutdown did not complete; the broker goes anyway", timeout_s=timeout_s)
        return False

    async def _stop_lifecycle(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    async def stop(self, clean: bool = True, shutdown_timeout_s: float = CONTROLLED_SHUTDOWN_TIMEOUT_S) -> None:
        await self._stop_lifecycle()
        if clean:
            await self.controlled_shutdown(shutdown_timeout_s)
        for pending in (self._becoming, self._resigning):
            if pending is not None:
                pending.cancel()
        if self.controller is not None:
            await self.controller.stop()
        if self.election is not None:
            with contextlib.suppress(Exception):
                await self.election.stop(resign=clean)
        if self.clog is not None:
            self.clog.stop()
        if self.loader is not None:
            await self.loader.stop()
        self.clients.close()
        await self._close_etcd(revoke=clean)

    async def _close_etcd(self, revoke: bool = True) -> None:
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.close(revoke=revoke)
        with contextlib.suppress(Exception):
            await self.etcd.close()

    def _inter_broker_address(self, node: int) -> tuple[str, int] | None:
        if self.view is None:
            return None
        return self.view.address(node, self.settings.inter_broker_listener)
