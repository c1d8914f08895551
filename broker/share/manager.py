"""The share-partition manager: engines beside their partitions, their durable state, share sessions.

Kafka's SharePartitionManager and DelayedShareFetch, on the event loop. One engine (engine.py) per
(group, topic id, partition). When a member is first assigned a share-partition without state,
its state is written at once, the start offset from the group's `share.auto.offset.reset` (the
group coordinator's InitializeShareGroupState); the engine itself loads that state from the
persister (the share coordinator) at the first ShareFetch naming it, as Kafka's SharePartition
loads in maybeInitialize. Every change that must be durable (acknowledgements, releases, lock
expiries, dead-letter completions) is written through the persister before the engine commits it
(persist, then commit).

What one ShareFetch returns (Kafka's DelayedShareFetch, ShareFetchUtils.processFetchResponse):

1. Its partitions are the share session's, rotated by the request's ShareSessionEpoch
   (fetch_strategy.rotate_round_robin: PartitionRotateStrategy.ROUND_ROBIN). A fetch asking for
   no records or no bytes answers at once with none (SharePartitionManager.processShareFetch).
2. Only loaded share-partitions take part, and only those below their in-flight limit
   (acquirablePartitions: the fetch lock of a SharePartition that is ACTIVE, canAcquireRecords).
   A share-partition still loading is not waited for once another has what the fetch needs.
3. The fetch completes when those partitions hold MinBytes between their next fetch offset and
   the high watermark (or last stable offset), each counted up to its part of MaxBytes
   (isMinBytesSatisfied: an estimate that takes all of it as acquirable), else it waits, never
   polling, for an append, for records released (acknowledgement, closed session, lock expiry)
   or for a share-partition to load, up to MaxWaitMs. Each load completing is one try, with the
   share-partitions loaded up to it (Kafka's tryComplete, run by each initialization): so the
   first fetch of a fresh session answers with the first share-partition that loads with
   records, and the others join the next fetches. At MaxWaitMs it answers with what the loaded
   partitions have (onComplete); unlike Kafka a fetch whose partitions have not loaded yet waits
   for the first of them (ours read the in-process share coordinator, Kafka's take a round trip
   to it and would answer empty), so that a fetch with MaxWaitMs 0 still serves one partition.
4. Then it acquires partition by partition in that order. Each partition is read with an equal
   part of MaxBytes (fetch_strategy.uniform_partition_max_bytes: PartitionMaxBytesStrategy
   .UNIFORM), at most what the partitions read before it left of MaxBytes, and the first one
   read gives at least one batch (ReplicaManager.readFromLog's minOneMessage). Each acquires at
   most the MaxRecords the partitions before it left (SharePartition.acquire: a soft limit of
   whole batches, or exact with ShareAcquireMode record_limit; in AcquiredRecords of BatchSize).
   Once the first partitions have taken MaxRecords the others give nothing: the rotation serves
   them first in later fetches.

A fetch reads only what the acquisition can use, not its part of MaxBytes of log (tens of MB for a
few hundred records): a window of 1 MiB that grows until it holds the records wanted or the log's
end; the records go out as FileSlices of the log (no copy). Each engine's next lock deadline has
one timer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from broker.coordinator.group.group_config import parse_auto_offset_reset
from broker.coordinator.share.records import ShareKey
from broker.coordinator.share.shard import WriteState
from broker.coordinator.timer import Cancellable, Clock
from broker.log.segment import FileSlice
from broker.observability.logger import get_logger
from broker.share.dlq import DeadLetter, DeadLetterWriter
from broker.share.engine import (
    AckBatch,
    AcquiredRecords,
    DeadLetterCause,
    FetchedBatch,
    SharePartition,
    Transition,
)
from broker.share.fetch_strategy import rotate_round_robin, uniform_partition_max_bytes
from broker.share.ports import (
    READ_COMMITTED,
    LeaderPersister,
    PartitionLike,
    PartitionResult,
    Persister,
    ShareGroupSettings,
    ShareMetrics,
)
from broker.share.session import INITIAL_EPOCH, ShareSession, ShareSessionCache, TopicIdPartition
from protocol.errors import ErrorCode, KafkaError
from protocol.records import BatchHeader, iter_batches

log = get_logger("broker.share")

EXPIRY_RETRY_MS = 1000  # a lock expiry whose write failed is tried again this much later
READ_WINDOW = 1 << 20  # bytes of log a share fetch reads first for one partition


class _Entry:
    """One share-partition: its engine, partition, lock timer and waiting fetches."""

    __slots__ = ("key", "engine", "partition", "leader_epoch", "ready", "loaded", "timer", "timer_deadline", "waiters",
                 "dlq_causes", "dlq_running")

    def __init__(self, key: ShareKey, engine: SharePartition, partition: PartitionLike) -> None:
        self.key = key
        self.engine = engine
        self.partition = partition
        # the leader epoch it was made in (Kafka's SharePartition.leaderEpoch): its state writes
        # name it, so that the share coordinator fences those of a leader that was replaced
        self.leader_epoch = partition.leader_epoch
        self.ready: asyncio.Future[None] | None = None
        self.loaded = 0  # the number of its load among all loads (their order), 0 until loaded
        self.timer: Cancellable | None = None
        self.timer_deadline: int | None = None
        self.waiters: set[asyncio.Future[None]] = set()
        self.dlq_causes: list[tuple[int, int, DeadLetterCause]] = []  # why records are in ARCHIVING
        self.dlq_running = False


class SharePartitionManager:
    def __init__(self, persister: Persister, partition_of: Callable[[uuid.UUID, int], PartitionLike | None],
                 settings_of: Callable[[str], ShareGroupSettings], clock: Clock, max_sessions: int = 2000,
                 wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 dead_letters: DeadLetterWriter | None = None) -> None:
        self.persister = persister
        self.dead_letters = dead_letters
        self.partition_of = partition_of
        self.settings_of = settings_of
        self.clock = clock
        self.wall_clock_ms = wall_clock_ms
        self.sessions = ShareSessionCache(max_sessions)
        self.entries: dict[ShareKey, _Entry] = {}
        self.metrics = ShareMetrics()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loads = 0  # share-partitions loaded so far: the number of the last load
        self._load_marks: dict[asyncio.Future[None], int] = {}  # fetch waiter -> the load that woke it
        self._initialized: set[ShareKey] = set()  # state written at assignment, engine not loaded yet
        self._initializing: dict[ShareKey, asyncio.Future[None]] = {}
        self._stopping = False

    # ----- engines ------------------------------------------------------------------------
    async def entry(self, group_id: str, tp: TopicIdPartition) -> _Entry:
        """The share-partition, loaded (raises KafkaError UNKNOWN_TOPIC_OR_PARTITION, or the
        persister's error)."""
        entry = self._start(group_id, tp)
        assert entry.ready is not None
        if not entry.ready.done():
            await asyncio.shield(entry.ready)
        entry.ready.result()  # a load that failed raises its error
        return entry

    def _start(self, group_id: str, tp: TopicIdPartition) -> _Entry:
        """The share-partition, its load begun if it is not loaded (raises KafkaError
        UNKNOWN_TOPIC_OR_PARTITION, or NOT_LEADER_OR_FOLLOWER where this broker does not lead
        the partition: a share-partition lives with its partition's leader)."""
        topic_id, index = tp
        assert isinstance(topic_id, uuid.UUID)
        key = (group_id, topic_id, index)
        entry = self.entries.get(key)
        if entry is not None and (entry.partition.deleted or self._fenced(entry)):
            self.drop([key])
            entry = None
        if entry is None:
            partition = self.partition_of(topic_id, index)
            if partition is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            if not partition.is_leader:
                raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            entry = _Entry(key, SharePartition(self.settings_of(group_id).engine), partition)
            self.entries[key] = entry
            entry.ready = asyncio.get_running_loop().create_future()
            self._spawn(self._load_entry(entry))
        elif entry.loaded:
            entry.engine.settings = self.settings_of(group_id).engine
        return entry

    async def _load_entry(self, entry: _Entry) -> None:
        """Load on its own (Kafka's SharePartition.maybeInitialize): a fetch waiting on several
        share-partitions sees them load one by one."""
        assert entry.ready is not None
        try:
            initializing = self._initializing.get(entry.key)
            if initializing is not None:
                await asyncio.shield(initializing)  # the state written at assignment, then read here
            await self._load(entry)
        except BaseException as exc:
            if self.entries.get(entry.key) is entry:
                del self.entries[entry.key]
            entry.ready.set_exception(exc if isinstance(exc, KafkaError)
                                      else KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)))
            entry.ready.exception()  # retrieved: only the waiters care
            self._wake(entry)
            if not isinstance(exc, Exception):
                raise
            return
        self._loads += 1
        entry.loaded = self._loads
        entry.ready.set_result(None)
        for waiter in entry.waiters:
            if not waiter.done():
                self._load_marks[waiter] = entry.loaded
                waiter.set_result(None)
        entry.waiters.clear()

    async def _load(self, entry: _Entry) -> None:
        engine, partition = entry.engine, entry.partition
        if isinstance(self.persister, LeaderPersister):
            state = await self.persister.read_state_as_leader(entry.key, entry.leader_epoch)
        else:
            state = await self.persister.read_state(entry.key)
        if state is None or state.start_offset < 0:
            settings = self.settings_of(entry.key[0])
            start = self._initial_offset(partition, settings)
            epoch = 0 if state is None else state.state_epoch
            await self.persister.write_state(WriteState(entry.key, epoch, entry.leader_epoch, start, 0, ()))
            engine.load(start, epoch, ())
        else:
            engine.load(state.start_offset, state.state_epoch, state.state_batches)
        engine.on_log_start(partition.log_start_offset)
        if engine.archiving():
            self._kick_dead_letters(entry)  # written to the DLQ before a restart, or not: (again) now
        log.debug("share partition loaded", group_id=entry.key[0], topic_id=str(entry.key[1]),
                  partition=entry.key[2], start_offset=engine.start_offset)

    def _initial_offset(self, partition: PartitionLike, settings: ShareGroupSettings) -> int:
        try:
            reset, duration = parse_auto_offset_reset(settings.auto_offset_reset)
        except KafkaError:
            reset, duration = "latest", None
        if reset == "earliest":
            return partition.log_start_offset
        if duration is not None:
            found = partition.offset_for_timestamp(self.wall_clock_ms() - duration)
            if found is not None:
                return max(found.offset, partition.log_start_offset)
        return partition.fetch_bound(settings.isolation_level)

    @staticmethod
    def _fenced(entry: _Entry) -> bool:
        """Its partition is no longer led here, or led in a newer epoch (Kafka's
        SharePartitionListener onBecomingFollower, and the leader epoch check of
        DelayedShareFetch): what it holds in memory (acquisitions, locks) is another leader's
        business now, whose state loads from the share coordinator."""
        partition = entry.partition
        return not partition.is_leader or partition.leader_epoch != entry.leader_epoch

    def leadership_changed(self, topic_id: uuid.UUID, index: int) -> None:
        """The partition became a follower, or leads in a new epoch: forget its share-partitions
        (their timers too), as Kafka's SharePartitionListener does."""
        self.drop([k for k, e in self.entries.items() if k[1] == topic_id and k[2] == index and self._fenced(e)])

    def drop(self, keys: Iterable[ShareKey]) -> None:
        """Forget share-partitions (topic or group deleted, offsets altered): reloaded when next used."""
        for key in list(keys):
            self._initialized.discard(key)
            entry = self.entries.pop(key, None)
            if entry is None:
                continue
            if entry.timer is not None:
                entry.timer.cancel()
            self._wake(entry)

    def drop_group(self, group_id: str) -> None:
        self.drop([k for k in (*self.entries, *self._initialized) if k[0] == group_id])

    def settings_changed(self, group_id: str) -> None:
        """The group's configs changed: its loaded share-partitions obey them at once (an
        acknowledgement, a renewal or a lock expiry may come before the next fetch)."""
        engine_settings = None
        for (group, _, _), entry in self.entries.items():
            if group == group_id:
                engine_settings = engine_settings or self.settings_of(group_id).engine
                entry.engine.settings = engine_settings

    # ----- fetching -----------------------------------------------------------------------
    async def fetch(self, group_id: str, member_id: str, parts: Sequence[TopicIdPartition], max_wait_ms: int,
                    min_bytes: int, max_bytes: int, max_records: int, batch_size: int, record_limit: bool,
                    session_epoch: int = INITIAL_EPOCH) -> dict[TopicIdPartition, PartitionResult]:
        """One ShareFetch of `parts` (the session's partitions, in session order): the rule is in
        the module's docstring."""
        results: dict[TopicIdPartition, PartitionResult] = {}
        entries: list[tuple[TopicIdPartition, _Entry]] = []
        min_bytes = min(min_bytes, max_bytes)  # KafkaApis' fetchMinBytes
        if max_records > 0 and max_bytes > 0:
            for tp in rotate_round_robin(parts, session_epoch):
                try:
                    entries.append((tp, self._start(group_id, tp)))
                except KafkaError as exc:
                    results[tp] = PartitionResult(exc.code, exc.message)
        isolation = self.settings_of(group_id).isolation_level
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(max_wait_ms, 0) / 1000.0
        seen = self._loads  # a try sees the share-partitions loaded up to this load
        while entries and not self._stopping:
            entries = self._without_failed_loads(entries, results)
            ready = [(tp, e) for tp, e in entries if 0 < e.loaded <= seen]
            if ready and self._min_bytes_met(ready, min_bytes, max_bytes, isolation):
                break
            later = [e.loaded for _, e in entries if e.loaded > seen]
            if later:
                seen = min(later)  # the next load's own try
                continue
            timeout: float | None = deadline - loop.time()
            if timeout is not None and timeout <= 0:
                if ready or not entries:
                    break
                timeout = None  # nothing loaded yet: wait for the first load
            seen = await self._wait(entries, timeout)
        entries = self._without_failed_loads(entries, results)
        if not self._stopping:
            ready = [(tp, e) for tp, e in entries if 0 < e.loaded <= seen]
            self._acquire_all(member_id, ready, results, max_bytes, max_records, batch_size, record_limit)
        for tp in parts:
            results.setdefault(tp, PartitionResult())
        return results

    @staticmethod
    def _without_failed_loads(entries: list[tuple[TopicIdPartition, _Entry]],
                              results: dict[TopicIdPartition, PartitionResult]) -> list[tuple[TopicIdPartition, _Entry]]:
        """The entries whose load did not fail; those that did answer with its error."""
        kept = []
        for tp, entry in entries:
            assert entry.ready is not None
            error = entry.ready.exception() if entry.ready.done() else None
            if error is None:
                kept.append((tp, entry))
            else:
                results[tp] = PartitionResult(getattr(error, "code", ErrorCode.UNKNOWN_SERVER_ERROR),
                                              getattr(error, "message", None))
        return kept

    def _acquirable(self, ready: list[tuple[TopicIdPartition, _Entry]]) -> list[tuple[TopicIdPartition, _Entry]]:
        """Kafka's acquirablePartitions: those that may acquire now (below the in-flight limit)."""
        out = []
        for tp, entry in ready:
            if entry.partition.deleted or self.entries.get(entry.key) is not entry:
                out.append((tp, entry))  # its error is answered by the acquisition
                continue
            self._follow_log_start(entry)
            if entry.engine.can_acquire():
                out.append((tp, entry))
        return out

    def _min_bytes_met(self, ready: list[tuple[TopicIdPartition, _Entry]], min_bytes: int, max_bytes: int,
                       isolation: int) -> bool:
        """Kafka's isMinBytesSatisfied: the bytes from each acquirable partition's next fetch
        offset to its bound, each counted up to its part of MaxBytes, reach MinBytes."""
        acquirable = self._acquirable(ready)
        if not acquirable:
            return False
        total = 0
        for (_, entry), cap in zip(acquirable, uniform_partition_max_bytes(max_bytes, len(acquirable))):
            if total >= min_bytes:
                break
            if entry.partition.deleted or self.entries.get(entry.key) is not entry:
                return True  # an error to answer
            total += self._available(entry, cap, min_bytes - total, isolation)
        return total >= min_bytes

    @staticmethod
    def _available(entry: _Entry, cap: int, wanted: int, isolation: int) -> int:
        """The bytes of log at the share-partition's next fetch offset, up to `cap` (at least as
        many as `wanted` when there are; 1 when only whether there are any matters)."""
        offset = entry.engine.next_fetch_offset()
        bound = entry.partition.fetch_bound(isolation)
        if offset >= bound:
            return 0
        if wanted <= 1:
            return 1
        limit = min(cap, wanted)
        try:
            info = entry.partition.read(offset, limit, isolation, False)
        except (KafkaError, OSError):
            return wanted  # a read error completes the fetch (Kafka: anyPartitionHasLogReadError)
        size = len(info.records)
        next_offset = getattr(info, "next_offset", -1)
        if size == 0 or 0 <= next_offset < bound:
            return limit  # a batch beyond `limit` (or on a later segment) is there
        return size

    def _acquire_all(self, member_id: str, ready: list[tuple[TopicIdPartition, _Entry]],
                     results: dict[TopicIdPartition, PartitionResult], max_bytes: int, max_records: int,
                     batch_size: int, record_limit: bool) -> None:
        """Acquire partition by partition, in fetch order, each with its part of MaxBytes and what
        MaxRecords the ones before it left (ShareFetchUtils.processFetchResponse)."""
        acquirable = self._acquirable(ready)
        left_bytes, left_records, min_one = max_bytes, max_records, True
        for (tp, entry), part_bytes in zip(acquirable, uniform_partition_max_bytes(max_bytes, len(acquirable))):
            if entry.partition.deleted or self.entries.get(entry.key) is not entry:
                results[tp] = PartitionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            if self._fenced(entry):  # led elsewhere (or anew) since the fetch began to wait
                self.drop([entry.key])
                results[tp] = PartitionResult(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                continue
            if left_records <= 0:
                continue  # SharePartition.acquire: nothing past MaxRecords
            try:
                got, records, read = self._acquire(member_id, entry, min(part_bytes, left_bytes), left_records,
                                                   batch_size, record_limit, min_one)
            except KafkaError as exc:
                results[tp] = PartitionResult(exc.code, exc.message)
                continue
            except OSError as exc:
                log.error("share fetch read failed", partition=str(entry.key), error=str(exc))
                results[tp] = PartitionResult(ErrorCode.KAFKA_STORAGE_ERROR)
                continue
            if read:
                min_one = False  # readFromLog: past the first partition read, the limits hold
                left_bytes = max(left_bytes - read, 0)
            if got:
                results[tp] = PartitionResult(records=records, acquired=got)
                left_records -= sum(a.last_offset - a.first_offset + 1 for a in got)

    def _follow_log_start(self, entry: _Entry) -> None:
        if entry.partition.log_start_offset > entry.engine.start_offset:
            entry.engine.on_log_start(entry.partition.log_start_offset)

    def _acquire(self, member_id: str, entry: _Entry, max_bytes: int, max_records: int, batch_size: int,
                 record_limit: bool, min_one: bool = True) -> tuple[list[AcquiredRecords], FileSlice | bytes, int]:
        """Read and acquire: (the records acquired, the whole batches holding them, bytes read)."""
        engine, partition = entry.engine, entry.partition
        self._follow_log_start(entry)
        if not engine.can_acquire():
            return [], b"", 0
        offset = engine.next_fetch_offset()
        isolation = self.settings_of(entry.key[0]).isolation_level
        bound = partition.fetch_bound(isolation)
        if offset >= bound:
            return [], b"", 0
        # Read what the acquisition can use, not MaxBytes of log (tens of MB a fetch for a few
        # hundred records): a window that grows until it holds `wanted` offsets or the log's end.
        wanted = min(max_records, engine.settings.max_record_locks)
        window = min(max_bytes, READ_WINDOW)
        while True:
            info = partition.read(offset, window, isolation, min_one)
            records = info.records
            if not len(records):
                return [], b"", 0
            positions = []
            fetched = []
            headers = []
            # Only the batch headers are read: the records go out as the log holds them (a
            # FileSlice, sent like a Fetch's), never copied through this process here.
            batches = records.batches() if isinstance(records, FileSlice) else iter_batches(records)
            for pos, header in batches:
                positions.append(pos)
                headers.append(header)
                fetched.append(FetchedBatch(header.base_offset, header.last_offset))
            if not fetched:
                return [], b"", 0
            last = fetched[-1].last_offset
            if window >= max_bytes or last + 1 >= bound or last - offset + 1 >= wanted:
                break
            window = min(max_bytes, window * 8)
        now = self.clock.now_ms()
        got = engine.acquire(member_id, offset, fetched, max_records, batch_size, now, record_limit)
        if got and isolation == READ_COMMITTED:
            got = self._drop_aborted(member_id, entry, got, headers)
        self._arm(entry)
        read = len(records)
        if not got:
            return [], b"", read
        for a in got:
            n = a.last_offset - a.first_offset + 1
            self.metrics.acquired += n
            if a.delivery_count > 1:
                self.metrics.redelivered += n
        # Only the whole batches holding acquired records go back, as Kafka's maybeSliceFetchRecords
        # (the client drops the records of a batch outside its AcquiredRecords).
        lo, hi = got[0].first_offset, max(a.last_offset for a in got)
        first = next(i for i, b in enumerate(fetched) if b.last_offset >= lo)
        last = max(i for i, b in enumerate(fetched) if b.base_offset <= hi)
        end = positions[last + 1] if last + 1 < len(positions) else positions[last] + headers[last].size
        if isinstance(records, FileSlice):
            return got, records.sub(positions[first], end), read
        return got, bytes(records[positions[first]:end]), read

    def _drop_aborted(self, member_id: str, entry: _Entry, got: list[AcquiredRecords], headers: list[BatchHeader]
                      ) -> list[AcquiredRecords]:
        """read_committed: the acquired records of aborted transactions are archived at once (in
        the background, persisted like any change) and not handed out."""
        aborted_txns = entry.partition.aborted_transactions(got[0].first_offset, max(a.last_offset for a in got) + 1)
        if not aborted_txns:
            return got
        aborted = [(h.base_offset, h.last_offset) for h in headers
                   if h.is_transactional and not h.is_control and any(
                       t.producer_id == h.producer_id and t.first_offset <= h.base_offset <= t.last_offset
                       for t in aborted_txns)]
        if not aborted:
            return got
        for first, last in aborted:
            t = entry.engine.archive_acquired(member_id, first, last)
            if t:
                self._spawn(self._persist_quietly(entry, t))
        return subtract_ranges(got, aborted)

    async def _persist_quietly(self, entry: _Entry, t: Transition) -> None:
        try:
            await self._persist(entry, t)
        except KafkaError:
            pass  # rolled back: acquired until the lock runs out, then archived again when fetched

    async def _wait(self, entries: list[tuple[TopicIdPartition, _Entry]], timeout: float | None) -> int:
        """Until a partition has new data or released records, a share-partition loads, or the
        timeout: the number of the load that ended the wait, else of the last load."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for _, entry in entries:
            entry.partition.add_waiter(waiter)
            entry.waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            for _, entry in entries:
                entry.partition.remove_waiter(waiter)
                entry.waiters.discard(waiter)
            mark = self._load_marks.pop(waiter, None)
        return self._loads if mark is None else mark

    @staticmethod
    def _wake(entry: _Entry) -> None:
        for waiter in entry.waiters:
            if not waiter.done():
                waiter.set_result(None)
        entry.waiters.clear()

    # ----- acknowledgements ---------------------------------------------------------------
    async def acknowledge(self, group_id: str, member_id: str, acks: dict[TopicIdPartition, list[AckBatch]]
                          ) -> dict[TopicIdPartition, tuple[ErrorCode, str | None]]:
        """Each partition's acknowledgement, durable before it is answered (all partitions at once)."""
        async def one(tp: TopicIdPartition, batches: list[AckBatch]) -> tuple[ErrorCode, str | None]:
            topic_id, index = tp
            entry = self.entries.get((group_id, topic_id, index))  # type: ignore[arg-type]
            if entry is not None and self._fenced(entry):
                self.drop([entry.key])
                return ErrorCode.NOT_LEADER_OR_FOLLOWER, None
            if entry is None:
                partition = self.partition_of(topic_id, index)  # type: ignore[arg-type]
                if partition is not None and not partition.is_leader:
                    return ErrorCode.NOT_LEADER_OR_FOLLOWER, None
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
            if entry.ready is not None and not entry.ready.done():
                await asyncio.shield(entry.ready)
            try:
                t = entry.engine.acknowledge(member_id, batches, self.clock.now_ms())
            except KafkaError as exc:
                return exc.code, exc.message
            self._count_acks(batches)
            try:
                await self._persist(entry, t)
            except KafkaError as exc:
                return exc.code, exc.message
            return ErrorCode.NONE, None

        items = list(acks.items())
        results = await asyncio.gather(*(one(tp, b) for tp, b in items))
        return dict(zip((tp for tp, _ in items), results))

    def _count_acks(self, batches: list[AckBatch]) -> None:
        m = self.metrics
        for b in batches:
            if len(b.types) == 1:
                counts = {b.types[0]: b.last_offset - b.first_offset + 1}
            else:
                counts = {t: b.types.count(t) for t in set(b.types)}
            m.acknowledged += counts.get(1, 0)
            m.released += counts.get(2, 0)
            m.rejected += counts.get(3, 0)

    async def _persist(self, entry: _Entry, t: Transition) -> None:
        """Make the transition durable, then commit it (roll it back when the write fails)."""
        engine = entry.engine
        if not t:
            engine.complete(t, True, self.clock.now_ms())
            self._arm(entry)
            return
        write = WriteState(entry.key, engine.state_epoch, entry.leader_epoch, engine.start_offset,
                           engine.delivery_complete_count(), tuple(t.state_batches()))
        error: KafkaError | None = None
        try:
            await self.persister.write_state(write)
        except KafkaError as exc:
            error = exc
        archived_before = self._archived_count(t)
        engine.complete(t, error is None, self.clock.now_ms())
        if error is None:
            self.metrics.archived += archived_before
            if t.dead_letters:
                entry.dlq_causes.extend(t.dead_letters)
                self._kick_dead_letters(entry)
        self._wake(entry)  # records may be available again, or the SPSO moved
        self._arm(entry)
        if error is not None:
            log.warning("share state write failed", group_id=entry.key[0], partition=entry.key[2], error=repr(error))
            raise KafkaError(_persister_error(error.code), error.message)

    @staticmethod
    def _archived_count(t: Transition) -> int:
        from broker.share.inflight import RecordState

        return sum(last - first + 1 for first, last, st, _ in t.touched
                   if st.state in (RecordState.ARCHIVED, RecordState.ARCHIVING) and t.kind != "archive")

    # ----- the dead-letter queue ----------------------------------------------------------
    def _kick_dead_letters(self, entry: _Entry) -> None:
        if self.dead_letters is not None and not entry.dlq_running:
            entry.dlq_running = True
            self._spawn(self._run_dead_letters(entry))

    async def _run_dead_letters(self, entry: _Entry) -> None:
        """Write the ARCHIVING records to the group's dead-letter topic, then archive them (also
        when the write failed: Kafka gives up on them too); one loop per share-partition."""
        assert self.dead_letters is not None
        group_id, topic_id, index = entry.key
        try:
            while self.entries.get(entry.key) is entry and not self._stopping:
                pending = entry.engine.archiving()
                if not pending:
                    break
                for r in pending:
                    count = r.last_offset - r.first_offset + 1
                    causes = [c for c in entry.dlq_causes if c[1] >= r.first_offset and c[0] <= r.last_offset]
                    letter = DeadLetter(group_id, topic_id, index, r.first_offset, r.last_offset, r.delivery_count,
                                        causes)
                    try:
                        await self.dead_letters(letter)
                        self.metrics.dead_lettered += count
                    except Exception as exc:
                        self.metrics.dead_letter_failed += count
                        log.warning("dead-letter write failed", group_id=group_id, topic_id=str(topic_id),
                                    partition=index, first_offset=r.first_offset, last_offset=r.last_offset,
                                    error=getattr(exc, "message", None) or repr(exc))
                    if self.entries.get(entry.key) is not entry:
                        return
                    try:
                        await self._persist(entry, entry.engine.archived(r.first_offset, r.last_offset))
                    except KafkaError:
                        self.clock.call_later(EXPIRY_RETRY_MS, lambda: self._kick_dead_letters(entry))
                        return
                start = entry.engine.start_offset
                done = {(r.first_offset, r.last_offset) for r in pending}
                entry.dlq_causes = [c for c in entry.dlq_causes if c[1] >= start and not any(
                    f <= c[0] and c[1] <= last for f, last in done)]
        finally:
            entry.dlq_running = False

    # ----- sessions -----------------------------------------------------------------------
    async def release_session(self, group_id: str, member_id: str) -> None:
        """The member's share session ends: its acquired records go back, not counted as delivered."""
        session = self.sessions.remove((group_id, member_id))
        if session is not None:
            await self.release_records(session)

    async def release_records(self, session: ShareSession) -> None:
        """Release what the (removed) session's member holds on the session's partitions."""
        group_id, member_id = session.key
        for topic_id, index in list(session.partitions):
            entry = self.entries.get((group_id, topic_id, index))  # type: ignore[arg-type]
            if entry is None:
                continue
            t = entry.engine.release_member(member_id, self.clock.now_ms())
            try:
                await self._persist(entry, t)
            except KafkaError:
                pass  # the records stay acquired until their locks run out

    def close_session(self, group_id: str, member_id: str) -> None:
        """Epoch -1: the session is gone now; its records are released in the background."""
        session = self.sessions.remove((group_id, member_id))
        if session is not None:
            self._spawn(self.release_records(session))

    def initialize(self, group_id: str, parts: Iterable[TopicIdPartition]) -> None:
        """Newly assigned share-partitions without state get it now (the group coordinator's
        InitializeShareGroupState): their start offset is fixed at assignment. Their engines load
        it at the first ShareFetch naming them."""
        for topic_id, index in parts:
            assert isinstance(topic_id, uuid.UUID)
            key = (group_id, topic_id, index)
            if key in self.entries or key in self._initialized or key in self._initializing:
                continue
            self._initializing[key] = asyncio.get_running_loop().create_future()
            self._spawn(self._initialize(key))

    async def _initialize(self, key: ShareKey) -> None:
        try:
            state = await self.persister.read_state(key)
            partition = self.partition_of(key[1], key[2])
            if (state is None or state.start_offset < 0) and partition is not None and not partition.deleted:
                start = self._initial_offset(partition, self.settings_of(key[0]))
                epoch = 0 if state is None else state.state_epoch
                await self.persister.write_state(WriteState(key, epoch, partition.leader_epoch, start, 0, ()))
            self._initialized.add(key)
        except KafkaError as exc:
            log.debug("share partition not initialized", group_id=key[0], topic_id=str(key[1]), partition=key[2],
                      error=repr(exc))
        finally:
            self._initializing.pop(key).set_result(None)

    def on_connection_closed(self, connection: object) -> None:
        for session in self.sessions.on_connection_closed(connection):
            self._spawn(self.release_records(session))

    # ----- lock expiry --------------------------------------------------------------------
    def _arm(self, entry: _Entry, not_before: int | None = None) -> None:
        deadline = entry.engine.next_lock_deadline()
        if deadline is not None and not_before is not None:
            deadline = max(deadline, not_before)
        if deadline == entry.timer_deadline:
            return
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        entry.timer_deadline = deadline
        if deadline is not None:
            entry.timer = self.clock.call_later(deadline - self.clock.now_ms(),
                                                lambda: self._spawn(self._expire(entry)))

    async def _expire(self, entry: _Entry) -> None:
        entry.timer, entry.timer_deadline = None, None
        if self.entries.get(entry.key) is not entry:
            return
        if self._fenced(entry):
            self.drop([entry.key])
            return
        now = self.clock.now_ms()
        t = entry.engine.expire_locks(now)
        if not t:
            self._arm(entry)
            return
        self.metrics.lock_expired += sum(last - first + 1 for first, last, _, _ in t.touched)
        try:
            await self._persist(entry, t)
        except KafkaError:
            self._arm(entry, not_before=self.clock.now_ms() + EXPIRY_RETRY_MS)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- lifecycle and reads ------------------------------------------------------------
    def lock_duration_ms(self, group_id: str) -> int:
        return self.settings_of(group_id).engine.record_lock_duration_ms

    async def stop(self) -> None:
        self._stopping = True
        for entry in self.entries.values():
            if entry.timer is not None:
                entry.timer.cancel()
            self._wake(entry)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def live_offsets(self, key: ShareKey) -> tuple[int, int] | None:
        """(start offset, delivery complete count) of a loaded share-partition: fresher than its
        persisted state, whose start offset trails by one write (written before the SPSO moves)."""
        entry = self.entries.get(key)
        if entry is None or entry.ready is None or not entry.ready.done() or entry.ready.exception() is not None:
            return None
        return entry.engine.start_offset, entry.engine.delivery_complete_count()

    def in_flight(self) -> dict[ShareKey, int]:
        return {k: e.engine.in_flight_count() for k, e in self.entries.items()}


def subtract_ranges(got: list[AcquiredRecords], removed: list[tuple[int, int]]) -> list[AcquiredRecords]:
    """The acquired ranges without the offsets in `removed` (sorted, non-overlapping ranges)."""
    out: list[AcquiredRecords] = []
    for a in got:
        lo = a.first_offset
        for first, last in removed:
            if last < lo or first > a.last_offset:
                continue
            if first > lo:
                out.append(AcquiredRecords(lo, first - 1, a.delivery_count))
            lo = max(lo, last + 1)
        if lo <= a.last_offset:
            out.append(AcquiredRecords(lo, a.last_offset, a.delivery_count))
    return out


def _persister_error(code: ErrorCode) -> ErrorCode:
    """Kafka's SharePartition.fetchPersisterError: what a failed state write becomes."""
    if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
        return code
    if code in (ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.FENCED_STATE_EPOCH):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.UNKNOWN_SERVER_ERROR
