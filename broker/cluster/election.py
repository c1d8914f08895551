"""Who is who in a cluster on etcd: the cluster id, a node's claim on its node.id, and the
election of the active controller.

A node holds one etcd lease (`Session`), kept alive every third of its TTL; its node-id claim
and, while it is the controller, the controller key hang on it. When keep-alives fail for the
TTL (counted from the last keep-alive etcd answered) the node takes the lease as lost, stops
acting as controller, and once etcd answers again gets a new lease and claims its id anew.

The controller is whoever created `.../controller` (only if absent, with its lease), in the
same transaction that raised `.../controller-epoch` by one; every node watches that key. When
the holder dies its lease expires (at most the TTL after its last keep-alive), etcd deletes the
key, and the nodes watching race to create it: one wins with the next epoch. A deposed
controller learns it from the watch or from its lease; its writes already fail on the fence
(keys.ClusterKeys.fence).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.cluster.etcd import (
    Compare,
    DeleteRange,
    Etcd,
    EtcdCompacted,
    EtcdUnavailable,
    EventType,
    Get,
    KeyValue,
    LeaseNotFound,
    Put,
    resumable_watch,
    within,
)
from broker.cluster.keys import DEFAULT_ROOT, ClusterKeys, Leadership, root_cluster_id_key
from broker.observability.logger import get_logger

log = get_logger("broker.cluster")

DEFAULT_LEASE_TIMEOUT_MS = 3000  # `etcd.lease.timeout.ms`: a dead controller is replaced within it
RETRY_DELAY_S = 0.2


class ClusterIdMismatch(Exception):
    pass


class NodeIdInUse(Exception):
    pass


def new_cluster_id() -> str:
    """Kafka's form of a cluster id: a random UUID in URL-safe base64, unpadded."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


async def resolve_cluster_id(etcd: Etcd, root: str = DEFAULT_ROOT, wanted: str | None = None) -> str:
    """The cluster id recorded under `root`, created by the first node (`wanted`, when the node
    has one from `cluster.id` or its meta.properties, else a new one). A node that belongs to
    another cluster gets ClusterIdMismatch."""
    key = root_cluster_id_key(root)
    result = await etcd.txn([Compare.absent(key)], [Put(key, (wanted or new_cluster_id()).encode())], [Get(key)])
    if result.succeeded:
        kv = await etcd.get(key)
        assert kv is not None
        return kv.value.decode()
    existing = result.responses[0][0].value.decode()  # type: ignore[index,union-attr]
    if wanted and wanted != existing:
        raise ClusterIdMismatch(
            "this node belongs to cluster %s but the etcd at %s holds cluster %s under %s (set etcd.root or "
            "cluster.id, or start from empty log.dirs)" % (wanted, etcd.endpoint_description, existing, root))
    return existing


class Session:
    """The node's etcd lease, kept alive; renewed by itself after a loss (then `on_renew` hooks
    run with the new lease, e.g. to claim the node id again)."""

    def __init__(self, etcd: Etcd, ttl_ms: int = DEFAULT_LEASE_TIMEOUT_MS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.etcd = etcd
        self.ttl = max(1, math.ceil(ttl_ms / 1000))  # etcd's leases count whole seconds
        self.clock = clock
        self.lease = 0
        self.lost = asyncio.Event()  # set when the current lease is lost (a new Event per lease)
        self.generation = 0
        self.on_renew: list[Callable[[int], Awaitable[None]]] = []
        self.failure: BaseException | None = None  # a renewal hook's error ends the session
        self.ended = asyncio.Event()
        self._expires = 0.0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Grant the first lease (EtcdUnavailable when etcd does not answer) and keep it alive."""
        await self._grant()
        self._task = asyncio.create_task(self._run(), name="etcd-session")

    async def _grant(self) -> None:
        sent = self.clock()
        self.lease = await self.etcd.grant_lease(self.ttl)
        self._expires = sent + self.ttl
        self.lost = asyncio.Event()
        self.generation += 1

    @property
    def expires_in(self) -> float:
        """How long the lease lasts at least, by this node's clock, without another keep-alive."""
        return self._expires - self.clock()

    async def _run(self) -> None:
        try:
            while True:
                await self._keep_alive(self.lease)
                self.lost.set()
                log.warning("etcd lease lost", lease="%x" % self.lease)
                await self._renew()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a hook refused (e.g. the node id was taken): the node must stop
            self.failure = e
            self.lost.set()
            log.error("etcd session ended", error=str(e))
        finally:
            self.ended.set()

    async def _renew(self) -> None:
        """A new lease and the renewal hooks run with it. etcd away or the new lease gone before
        the hooks are done (it expired while the node was cut off: its grant went through, the
        answer came late) is tried again; a hook's refusal (the node id taken) ends the session."""
        while True:
            old = self.lease
            try:
                await self._grant()
            except EtcdUnavailable:
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            with contextlib.suppress(EtcdUnavailable, LeaseNotFound):
                await self.etcd.revoke_lease(old)  # whatever still hangs on it goes now
            try:
                for hook in self.on_renew:
                    await hook(self.lease)
                return
            except (EtcdUnavailable, LeaseNotFound) as e:
                log.warning("etcd session renewal interrupted; renewing again", error=str(e))
                await asyncio.sleep(RETRY_DELAY_S)

    async def _keep_alive(self, lease: int) -> None:
        """Returns when the lease is lost: etcd says so, or no keep-alive got through for the TTL."""
        interval = self.ttl / 3
        while True:
            sent = self.clock()
            try:
                # a member that does not answer within the interval (paused, cut off) is left for
                # the next one while the lease still runs: the bound of the whole wait alone would
                # cancel the call before the client gives that member up, and ask it again
                ttl = await within(max(0.1, self.expires_in), self.etcd.keep_alive(lease, timeout=interval))
                self._expires = sent + ttl
                await asyncio.sleep(interval)
            except LeaseNotFound:
                return
            except (EtcdUnavailable, TimeoutError):
                if self.expires_in <= 0:
                    return
                await asyncio.sleep(min(interval / 2, max(0.01, self.expires_in)))

    async def close(self, revoke: bool = True) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.lost.set()
        if revoke and self.lease:
            with contextlib.suppress(EtcdUnavailable, LeaseNotFound):
                await self.etcd.revoke_lease(self.lease)


async def claim_node_id(etcd: Etcd, keys: ClusterKeys, node_id: int, directory_id: str, lease: int,
                        ttl_seconds: int | None = None) -> None:
    """Hold `.../nodes/<node id>` with `lease`. The same node restarted (same directory.id) takes
    its claim back at once and revokes its old lease (a controller key it held goes with it);
    another node gets NodeIdInUse."""
    key = keys.node_key(node_id)
    value = json.dumps({"node_id": node_id, "directory_id": directory_id, "host": socket.gethostname(),
                        "pid": os.getpid()}).encode()
    for _ in range(10):
        result = await etcd.txn([Compare.absent(key)], [Put(key, value, lease)], [Get(key)])
        if result.succeeded:
            return
        found = result.responses[0]
        if not found:
            continue  # it expired meanwhile
        kv = found[0]  # type: ignore[index]
        holder = json.loads(kv.value)
        if holder.get("directory_id") != directory_id:
            raise NodeIdInUse(
                "node.id %d is already in use by another node (directory.id %s, on %s, pid %s)%s" % (
                    node_id, holder.get("directory_id"), holder.get("host"), holder.get("pid"),
                    "; a node killed without shutting down frees it within %d s" % ttl_seconds
                    if ttl_seconds else ""))
        retake = await etcd.txn([Compare.mod_revision_is(key, kv.mod_revision)], [Put(key, value, lease)])
        if retake.succeeded:
            if kv.lease and kv.lease != lease:
                with contextlib.suppress(LeaseNotFound):
                    await etcd.revoke_lease(kv.lease)  # the dead incarnation's lease
            return
    raise EtcdUnavailable("node.id %d: the claim kept changing under this node" % node_id)


async def campaign(etcd: Etcd, keys: ClusterKeys, node_id: int, lease: int) -> Leadership | None:
    """One attempt to become the controller: create the controller key if absent, with `lease`,
    raising the epoch in the same transaction. None when another node holds it."""
    epoch_kv = await etcd.get(keys.controller_epoch)
    won, _, _ = await _campaign(etcd, keys, node_id, lease, epoch_kv)
    return won


async def _campaign(etcd: Etcd, keys: ClusterKeys, node_id: int, lease: int,
                    epoch_kv: KeyValue | None) -> tuple[Leadership | None, int, list[KeyValue]]:
    """(the term won or None, the transaction's revision, the controller key when lost)."""
    epoch = int(epoch_kv.value) + 1 if epoch_kv is not None else 1
    value = json.dumps({"node_id": node_id, "epoch": epoch}).encode()
    result = await etcd.txn(
        [Compare.absent(keys.controller),
         Compare.mod_revision_is(keys.controller_epoch, epoch_kv.mod_revision if epoch_kv else 0)],
        [Put(keys.controller, value, lease), Put(keys.controller_epoch, b"%d" % epoch)],
        [Get(keys.controller)])
    if result.succeeded:
        return Leadership(node_id, epoch, result.revision, lease), result.revision, []
    return None, result.revision, result.responses[0]  # type: ignore[return-value]


@dataclass(frozen=True)
class ControllerInfo:
    node_id: int
    epoch: int


class ControllerElection:
    """Observes the active controller and, for a candidate, campaigns whenever there is none.
    `controller` is the last one seen; `leadership` is set while this node is the controller."""

    def __init__(self, etcd: Etcd, keys: ClusterKeys, node_id: int, session: Session,
                 candidate: bool = True) -> None:
        self.etcd = etcd
        self.keys = keys
        self.node_id = node_id
        self.session = session
        self.candidate = candidate
        self.controller: ControllerInfo | None = None
        self.leadership: Leadership | None = None
        self.listeners: list[Callable[[ControllerInfo | None, Leadership | None], None]] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="controller-election")

    async def stop(self, resign: bool = True) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if resign:
            await self.resign()

    async def resign(self, until_done: bool = False) -> None:
        """Give up the controller key, so that the others need not wait for the lease. A clean
        shutdown tries once; a term given up while running (a failed append) tries `until_done`:
        etcd away for less than a lease comes back with the key and its lease still alive, and
        no node could campaign while it stands."""
        leadership = self.leadership
        if leadership is None:
            return
        await self._set(self.controller, None)
        while True:
            try:
                await self.etcd.txn([Compare.create_revision_is(self.keys.controller, leadership.revision)],
                                    [DeleteRange(self.keys.controller)])
                return
            except EtcdUnavailable:
                if not until_done or self.session.lost.is_set():
                    return  # the lease, gone with the session, takes the key with it
                await asyncio.sleep(RETRY_DELAY_S)

    async def wait_for(self, predicate: Callable[[ControllerElection], bool], timeout: float) -> None:
        async with self._changed:
            await within(timeout, self._changed.wait_for(lambda: predicate(self)))

    async def _set(self, controller: ControllerInfo | None, leadership: Leadership | None) -> None:
        if controller == self.controller and leadership == self.leadership:
            return
        if self.leadership is not None and leadership is None:
            log.warning("no longer the controller", epoch=self.leadership.epoch, now=controller)
        elif leadership is not None and self.leadership is None:
            log.info("became the controller", epoch=leadership.epoch)
        self.controller, self.leadership = controller, leadership
        for listener in self.listeners:
            listener(controller, leadership)
        async with self._changed:
            self._changed.notify_all()

    async def _run(self) -> None:
        while True:
            try:
                await self._round()
            except (EtcdUnavailable, EtcdCompacted, LeaseNotFound) as e:
                # etcd away, history compacted, or our lease gone before the session noticed
                log.debug("election: retrying", error=str(e))
                await asyncio.sleep(RETRY_DELAY_S)

    async def _round(self) -> None:
        """Read the controller key; campaign if it is free; then follow it until it changes."""
        lease, lost = self.session.lease, self.session.lost
        if lost.is_set():
            await self._set(self.controller, None)
            await asyncio.sleep(RETRY_DELAY_S)  # the session renews its lease
            return
        seen = await self.etcd.txn([], [Get(self.keys.controller), Get(self.keys.controller_epoch)])
        controller_kvs, epoch_kvs = seen.responses
        revision = seen.revision
        if not controller_kvs and self.candidate:
            epoch_kv = epoch_kvs[0] if epoch_kvs else None  # type: ignore[index]
            won, revision, controller_kvs = await _campaign(self.etcd, self.keys, self.node_id, lease, epoch_kv)
            if won is not None:
                await self._set(ControllerInfo(self.node_id, won.epoch), won)
                await self._follow(revision, lost)
                return
        if controller_kvs:
            kv = controller_kvs[0]  # type: ignore[index]
            info = json.loads(kv.value)
            mine = self.leadership if (self.leadership is not None
                                       and self.leadership.revision == kv.create_revision) else None
            await self._set(ControllerInfo(int(info["node_id"]), int(info["epoch"])), mine)
        else:
            await self._set(None, None)
        await self._follow(revision, lost)

    async def _follow(self, revision: int, lost: asyncio.Event) -> None:
        """Wait until the controller key is deleted (or replaced) or this node's lease is lost."""
        watcher = asyncio.ensure_future(self._watch_until_gone(revision))
        lost_wait = asyncio.ensure_future(lost.wait())
        try:
            done, _ = await asyncio.wait({watcher, lost_wait}, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                watcher.result()  # EtcdCompacted: read the key again
            else:
                await self._set(self.controller, None)
        finally:
            for task in (watcher, lost_wait):
                task.cancel()
            await asyncio.gather(watcher, lost_wait, return_exceptions=True)

    async def _watch_until_gone(self, revision: int) -> None:
        async for batch in resumable_watch(self.etcd, self.keys.controller, None, revision + 1):
            for event in batch.events:
                if event.type is EventType.DELETE:
                    await self._set(None, None)
                    return
                info = json.loads(event.kv.value)
                await self._set(ControllerInfo(int(info["node_id"]), int(info["epoch"])), None)
