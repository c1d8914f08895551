"""A node's metadata in cluster mode: the image follows the metadata log in etcd, and the active
controller's changes go into it.

Every node replays the log (`MetadataLoader`): the batches from where its image stands, then
each new one as the controller appends it; listeners hear of every replayed record. A node that
starts loads its last local snapshot first, and a node that is behind the log's start loads the
snapshot in etcd (the image is replaced; listeners are told to reconcile everything).

The active controller changes the metadata as a single node does (`MetadataStore`: validate,
make the records durable, replay them), through `ControllerLog`: a change is replayed into the
controller's image at once, so that the next one is validated against it, and appended to etcd
in the order made, each append fenced by the controller's term and by the log's end the records
were validated at. `sync()` waits until every change made so far is durable: whoever answers a
client about a change awaits it first (a response is released once its records are committed).
When an append fails (the term ended, etcd gone with the outcome unknown) the changes not yet
durable may or may not be in the log: the node stops writing, fails every waiting change, and
reloads its image from etcd (`reload`), as a restarting node would.

What the node itself does with the metadata (the publisher: which partitions it leads, the
coordinators it loads; where it routes requests) follows only committed records, as a KRaft
broker's metadata cache does: the controller's changes join `store.committed`, and the listeners
hear of them, once durable. A controller that lost its term while paused (SIGSTOP) and changes
the metadata on waking (fencing brokers it stopped hearing from, electing itself) must not act on
those changes: its appends fail and its image is reloaded, and nothing was led meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.cluster.etcd import EtcdUnavailable, within
from broker.cluster.keys import Leadership, NotController
from broker.cluster.metadata_log import (
    Batch,
    LocalSnapshots,
    MetadataLog,
    MetadataLogError,
    Snapshot,
    StaleEndOffset,
)
from broker.cluster.snapshot import image_from_records, image_records
from broker.metadata import MetadataImage, MetadataStore, decode_record, encode_record
from broker.observability.logger import get_logger
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.cluster")

RELOAD_RETRY_S = 0.2  # how often a node whose image must be reloaded asks an absent etcd again


def not_controller(message: str) -> KafkaError:
    return KafkaError(ErrorCode.NOT_CONTROLLER, message)


@dataclass
class _Append:
    expected_end: int
    values: list[bytes]
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ControllerLog:
    """The MetadataLog of a node's MetadataStore in cluster mode: writable only while this node is
    the active controller and its image is current; appends go to etcd in order."""

    def __init__(self, mlog: MetadataLog, image: Callable[[], MetadataImage], on_failure: Callable[[], None]) -> None:
        self.mlog = mlog
        self.image = image
        self.on_failure = on_failure  # an append failed: the image must be reloaded
        self.leadership: Leadership | None = None  # set while this node may write
        self._queue: asyncio.Queue[_Append] = asyncio.Queue()
        self._last: asyncio.Future[None] | None = None
        self.appended_bytes = 0  # of the records appended by this node (the controller snapshots by it)
        self._task: asyncio.Task[None] | None = None

    # MetadataLog -------------------------------------------------------------------------------
    def append(self, values: list[bytes]) -> None:
        if self.leadership is None:
            raise not_controller("This node is not the active controller.")
        entry = _Append(self.image().records, list(values))
        self.appended_bytes += sum(len(v) for v in values)
        self._last = entry.done
        self._queue.put_nowait(entry)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._write(), name="metadata-writer")

    def when_durable(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the last append is durable (in the order of the appends; never
        if it fails: the image is reloaded then)."""
        last = self._last
        assert last is not None

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is None:
                callback()

        last.add_done_callback(done)

    def read_all(self) -> Iterable[bytes]:
        return ()  # the image comes from the loader

    # durability -------------------------------------------------------------------------------
    async def sync(self) -> None:
        """Every change made so far is durable in etcd (KafkaError NOT_CONTROLLER if not)."""
        last = self._last
        if last is not None:
            await asyncio.shield(last)

    async def _write(self) -> None:
        while not self._queue.empty():
            entry = self._queue.get_nowait()
            leadership = self.leadership
            try:
                if leadership is None:
                    raise NotController("no longer the controller")
                await self.mlog.append(leadership, entry.values, entry.expected_end)
            except (NotController, StaleEndOffset, EtcdUnavailable, MetadataLogError) as exc:
                log.warning("metadata change not written", error=repr(exc), offset=entry.expected_end)
                self._fail(entry, exc)
                return
            if not entry.done.done():
                entry.done.set_result(None)

    def _fail(self, first: _Append, exc: BaseException) -> None:
        """The append failed with its outcome perhaps unknown: nothing more is written until the
        image is reloaded from etcd; every waiting change fails (retriable for the client)."""
        self.leadership = None
        error = not_controller("The metadata change could not be made durable: %s" % exc)
        for entry in [first, *self._drain()]:
            if not entry.done.done():
                entry.done.set_exception(error)
                entry.done.exception()  # retrieved: no warning when nobody waits for it
        self.on_failure()

    def _drain(self) -> list[_Append]:
        out = []
        while not self._queue.empty():
            out.append(self._queue.get_nowait())
        return out

    def stop(self) -> None:
        self.leadership = None
        if self._task is not None:
            self._task.cancel()


class MetadataLoader:
    """Keeps `store.image` replaying the metadata log in etcd; the store's listeners hear of every
    change."""

    def __init__(self, store: MetadataStore, mlog: MetadataLog, local: LocalSnapshots,
                 snapshot_bytes: int = 20 * 1024 * 1024) -> None:
        self.store = store
        self.mlog = mlog
        self.local = local
        self.snapshot_bytes = snapshot_bytes  # bytes of records replayed between two local snapshots
        self._since_snapshot = 0
        self._task: asyncio.Task[None] | None = None
        self._position_changed = asyncio.Condition()
        self._reload = False
        self._stopping = False

    def load_local(self) -> None:
        """The image of the last local snapshot, if any (before `start`)."""
        snapshot = self.local.latest()
        if snapshot is not None:
            self.store.image = image_from_records(snapshot.records, snapshot.end_offset)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="metadata-loader")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def reload(self) -> None:
        """Load the image anew from etcd (what this node's image holds may not be durable)."""
        self._reload = True
        if self._task is not None:
            self._task.cancel()

    async def wait_for_offset(self, offset: int, timeout_s: float) -> None:
        """Until the image has replayed the log up to `offset` (its next offset)."""
        async with self._position_changed:
            await within(timeout_s, self._position_changed.wait_for(lambda: self.store.image.records >= offset))

    async def _run(self) -> None:
        while True:
            try:
                if self._reload:
                    await self._load_anew()
                async for item in self.mlog.read(self.store.image.records):
                    if isinstance(item, Snapshot):
                        self.store.image = image_from_records(item.records, item.end_offset)
                        self._notify(None)
                    else:
                        self._replay(item)
                    await self._advanced()
            except asyncio.CancelledError:
                if not self._reload or self._stopping:
                    raise
            except MetadataLogError as exc:
                log.error("the metadata log in etcd cannot continue this node's image; loading it anew",
                          error=str(exc))
                self._reload = True
                await asyncio.sleep(1.0)

    async def _load_anew(self) -> None:
        """The image rebuilt aside from etcd (its snapshot, then the log) and put in place once it
        reaches the log's end. Until then the node keeps the image it has and serves with it,
        however long etcd is away: an empty image in between would tell the listeners that every
        topic is gone, and they would delete its partitions' logs."""
        while True:
            try:
                end = await self.mlog.end_offset()
                break
            except EtcdUnavailable:
                await asyncio.sleep(RELOAD_RETRY_S)
        image = MetadataImage()
        if end > 0:
            async with contextlib.aclosing(self.mlog.read(0)) as reader:
                async for item in reader:
                    if isinstance(item, Snapshot):
                        image = image_from_records(item.records, item.end_offset)
                    else:
                        _replay_into(image, item)
                    if image.records >= end:
                        break
        self._reload = False
        self.store.image = image
        self._notify(None)
        await self._advanced()

    def _replay(self, batch: Batch) -> None:
        store = self.store
        if isinstance(store, ClusterMetadataStore):
            store.catch_up_committed(batch)
        if store.image.records >= batch.end_offset:
            return  # replayed already (the controller's own changes)
        replayed = _replay_into(store.image, batch)
        self._since_snapshot += sum(len(v) for v in batch.records)
        if replayed:
            self._notify(replayed)

    def _notify(self, records: list[Any] | None) -> None:
        notify_listeners(self.store, records)

    async def _advanced(self) -> None:
        async with self._position_changed:
            self._position_changed.notify_all()
        if self._since_snapshot >= self.snapshot_bytes:
            self._since_snapshot = 0
            image = self.store.image
            await asyncio.to_thread(self.local.save, Snapshot(image.records, 0, image_records(image)))


def notify_listeners(store: MetadataStore, records: list[Any] | None) -> None:
    """The store's listeners hear of replayed records (None: a replaced image); one that fails is
    logged, not let through to whoever replayed them."""
    try:
        store.replayed(records)
    except Exception:
        log.exception("a metadata listener failed")


def _replay_into(image: MetadataImage, batch: Batch) -> list[Any]:
    """Replay what `image` lacks of `batch` (the controller replayed its own changes already);
    returns the records replayed."""
    skip = image.records - batch.base_offset
    replayed: list[Any] = []
    for value in batch.records[max(skip, 0):]:
        record = decode_record(value)
        if record is None:
            image.records += 1
        else:
            image.replay(record)
            replayed.append(record)
    return replayed


class ClusterMetadataStore(MetadataStore):
    """The metadata store of a node in cluster mode. Producer ids come in blocks from the
    controller (producer_ids.py). A new partition's in-sync replicas are its live replicas
    (registered, unfenced, not shutting down) and its leader the first of them, as Kafka's
    ReplicationControlManager creates them."""

    producer_ids: Any = None  # producer_ids.ProducerIdBlocks, once the node has joined
    # what is durable, while this node's image holds changes of its own not yet appended (the
    # controller's); None: the image itself
    _committed: MetadataImage | None = None

    @property  # type: ignore[override]
    def image(self) -> MetadataImage:
        return self._image

    @image.setter
    def image(self, image: MetadataImage) -> None:
        """A new image (loaded from a snapshot, reloaded from etcd) is all durable."""
        self._image = image
        self._committed = None

    @property
    def committed(self) -> MetadataImage:
        return self._committed if self._committed is not None else self._image

    def _commit(self, records: list[Any]) -> None:
        """The controller's change: validated against the image and replayed into it now, the
        listeners told once it is durable."""
        log_ = self.log
        if not isinstance(log_, ControllerLog):
            super()._commit(records)
            return
        log_.append([encode_record(r) for r in records])
        if self._committed is None:
            self._committed = image_from_records(image_records(self._image), self._image.records)
        base = self._image.records
        for r in records:
            self._image.replay(r)
        log_.when_durable(lambda: self._durable(base, records))

    def _durable(self, base: int, records: list[Any]) -> None:
        committed = self._committed
        if committed is not None:
            for r in records[max(committed.records - base, 0):]:  # the loader may have brought some
                committed.replay(r)
        if self.listeners:
            notify_listeners(self, records)

    def catch_up_committed(self, batch: Batch) -> None:
        """The committed image follows the log as the image does (a change of this node's that
        is in the log already joins it here if its own callback has not come yet)."""
        if self._committed is not None and self._committed.records < batch.end_offset:
            _replay_into(self._committed, batch)

    def allocate_producer_id(self) -> int:
        if self.producer_ids is None:
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "Producer ids are being allocated.")
        return int(self.producer_ids.next_id())

    def _partition_record(self, topic_id: uuid.UUID, index: int,
                          replicas: Callable[[int], list[int]] | None = None) -> Any:
        record = super()._partition_record(topic_id, index, replicas)
        brokers = self.image.brokers
        live = [r for r in record.replicas
                if r in brokers and not brokers[r].fenced and not brokers[r].in_controlled_shutdown]
        if not live:
            raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR,
                             "Unable to replicate the partition %d time(s): All brokers are currently fenced or "
                             "in controlled shutdown." % len(record.replicas))
        record.isr = live
        record.leader = live[0]
        return record
