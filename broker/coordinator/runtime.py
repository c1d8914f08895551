"""The coordinator runtime: one shard per internal-topic partition, one event queue and one task each.

Modelled on Kafka's CoordinatorRuntime. A write operation `(shard, now_ms) -> CoordinatorResult`
runs while it holds its partition, so shards need no locks. Operations of a partition run one
after the other in arrival order: each replays its records into the shard, the records are
written to the partition's log, and the responses are released, in order, only once the records
are durable under the flush policy. If the write fails, the shard is rebuilt from its log (the
operations' effects are gone) and every operation concerned fails with the error Kafka maps the
append error to (NOT_COORDINATOR for a storage error).

Two ways through, with the same order and durability:
- the fast path: when the partition is idle (nothing queued, nothing in flight) the operation runs
  at once in the caller's task. With the usual flush policy the log write reaches the OS
  synchronously, so the response is ready without a single event-loop hop; when an fsync must be
  awaited (or the write failed), that tail runs in a task of its own, holding the partition, so a
  cancelled caller cannot cut it short;
- the queue: otherwise the operation queues, and the partition's task takes every queued operation
  (up to `max_batch`), runs them, makes all their records durable with one write, then releases
  their responses in order.

Read operations queue (a read is also a barrier: it answers after what was submitted before
it), so they see only state whose records are durable. `read_now` (the request path's reads)
answers at once when the partition is idle, which is durable state too.

Loading replays the partition's log into a fresh shard; meanwhile its operations get
COORDINATOR_LOAD_IN_PROGRESS. A partition this runtime does not host answers NOT_COORDINATOR.
"""

from __future__ import annotations

import asyncio
import enum
import functools
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from broker.coordinator.result import (
    CoordinatorResult,
    Deferred,
    LoggedItem,
    Record,
    TransactionalRecord,
    TxnMarker,
)
from broker.coordinator.timer import Clock, CoordinatorTimer, Op, Timer
from broker.gc_policy import collector_paused
from broker.observability.logger import get_logger
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator")

_INT32_MIN = -(2**31)
_PARTITION_CACHE_SIZE = 8192
_FAST_PATH_BURST = 32


def java_string_hashcode(s: str) -> int:
    """Java's String.hashCode: over UTF-16 code units, 32-bit signed arithmetic."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def java_abs(n: int) -> int:
    """Kafka's Utils.abs: like Math.abs, but Integer.MIN_VALUE maps to 0."""
    return 0 if n == _INT32_MIN else abs(n)


@functools.lru_cache(maxsize=_PARTITION_CACHE_SIZE)
def partition_for(key: str, num_partitions: int) -> int:
    """The internal-topic partition of a group id or transactional id, exactly as Kafka.
    Cached (bounded LRU): every request of a group asks again."""
    return java_abs(java_string_hashcode(key)) % num_partitions


class PartitionWriter(Protocol):
    """Where a runtime keeps its records: one log per internal-topic partition."""

    def write(self, partition: int, records: Sequence[Record],
              producer: tuple[int, int] | None = None) -> Awaitable[Any] | None:
        """Append the records to the partition's log now, past the process (they survive `kill -9`),
        as one batch (a transactional one of `producer`, (id, epoch), when given). Returns None
        when they are as durable as the flush policy asks, else an awaitable that completes once
        they are (raising if the flush failed). Raises (KafkaError or OSError) if they could not
        be written. Synchronous, so the usual case costs no await."""
        ...

    def write_marker(self, partition: int, marker: TxnMarker) -> Awaitable[Any] | None:
        """Append a transaction marker, as `write` does."""
        ...

    def read(self, partition: int) -> Iterable[LoggedItem]:
        """Every record of the partition's log in order, for loading: plain records as (key,
        value), transactional ones as TransactionalRecord, and the markers."""
        ...


class InMemoryWriter:
    """A PartitionWriter in memory, for tests; `fail_next` makes the next write raise."""

    def __init__(self) -> None:
        self.logs: dict[int, list[LoggedItem]] = defaultdict(list)
        self.fail_next: BaseException | None = None
        self.appends = 0

    def _check(self) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        self.appends += 1

    def write(self, partition: int, records: Sequence[Record],
              producer: tuple[int, int] | None = None) -> Awaitable[Any] | None:
        self._check()
        if producer is None:
            self.logs[partition].extend(records)
        else:
            self.logs[partition].extend(TransactionalRecord(producer[0], k, v) for k, v in records)
        return None

    def write_marker(self, partition: int, marker: TxnMarker) -> Awaitable[Any] | None:
        self._check()
        self.logs[partition].append(marker)
        return None

    def read(self, partition: int) -> Iterable[LoggedItem]:
        return list(self.logs[partition])


class CoordinatorShard(Protocol):
    """A shard whose log holds transactional records (the group coordinator's) also has
    `replay_transactional(producer_id, key, value)` and `replay_end_transaction(producer_id,
    committed)`; for other shards such records replay as plain ones and markers are skipped.
    When loading, a shard with `replay_batch(records, replay)` is given each batch of plain
    records at once: it must have the effect of `replay(key, value)` on each in order (that
    `replay` is the shard's, with the runtime's skipping of a record that fails)."""

    def replay(self, key: bytes, value: bytes | None) -> None: ...

    def on_loaded(self, now_ms: int) -> None: ...

    def on_unloaded(self) -> None: ...


S = TypeVar("S", bound=CoordinatorShard)
ShardFactory = Callable[[int, Timer], S]

# Kafka's translation of append errors into coordinator errors (CoordinatorOperationExceptionHelper).
_APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.UNKNOWN_SERVER_ERROR,
}


def append_error_code(exc: BaseException) -> ErrorCode:
    code = exc.code if isinstance(exc, KafkaError) else ErrorCode.KAFKA_STORAGE_ERROR
    return _APPEND_ERRORS.get(code, code)


def operation_error_code(exc: BaseException, coordinator: str) -> ErrorCode:
    """The error code a failed coordinator operation answers; an unexpected exception is logged
    and answered UNKNOWN_SERVER_ERROR."""
    if isinstance(exc, KafkaError):
        return exc.code
    log.error("coordinator operation failed", coordinator=coordinator, error=repr(exc))
    return ErrorCode.UNKNOWN_SERVER_ERROR


class PartitionState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"
    CLOSED = "closed"


class _Event:
    __slots__ = ("future", "name", "op")

    def __init__(self, op: Op, future: asyncio.Future[Any] | None, name: str) -> None:
        self.op = op
        self.future = future  # None for timer expiries (nobody waits) and fast-path operations
        self.name = name


# What running an operation gave: its result, or the error its caller gets.
_Outcome = tuple[CoordinatorResult[Any] | None, BaseException | None]
# What the operations of a turn write, batch by batch: plain records, a transactional producer's
# records (its (id, epoch)), or a marker.
_Chunk = tuple[tuple[int, int] | None, list[Record] | TxnMarker]


class _Partition(Generic[S]):
    def __init__(self, index: int) -> None:
        self.index = index
        self.state = PartitionState.LOADING
        self.shard: S | None = None
        self.queue: deque[_Event] = deque()
        self.busy = False  # operations are running (fast path or the task): others queue
        self.wakeup: asyncio.Future[None] | None = None  # the idle task waits on it
        self.task: asyncio.Task[None] | None = None
        self.tail: asyncio.Task[None] | None = None  # a fast-path operation's fsync or reload
        self.timer: CoordinatorTimer | None = None


class _Tail:
    """What the fast path returns when its operation still waits (see _write_now)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future


class CoordinatorRuntime(Generic[S]):
    def __init__(
        self,
        writer: PartitionWriter,
        shard_factory: ShardFactory[S],
        num_partitions: int,
        clock: Clock,
        *,
        name: str = "coordinator",
        max_batch: int = 512,
        load_yield_every: int = 2000,
    ) -> None:
        if num_partitions < 1:
            raise ValueError("num_partitions must be at least 1")
        self.writer = writer
        self.shard_factory = shard_factory
        self.num_partitions = num_partitions
        self.clock = clock
        self.name = name
        self.max_batch = max_batch
        self.load_yield_every = load_yield_every
        self._partitions: dict[int, _Partition[S]] = {}
        self._burst_task: asyncio.Task[Any] | None = None  # the last task to take the fast path
        self._burst = 0  # how many fast-path writes it made since it last gave the loop a turn
        self._loop: asyncio.AbstractEventLoop | None = None  # set by the first load

    # ----- routing and inspection --------------------------------------------------------
    def partition_for(self, key: str) -> int:
        return partition_for(key, self.num_partitions)

    def state(self, partition: int) -> PartitionState | None:
        part = self._partitions.get(partition)
        return part.state if part else None

    def active_partitions(self) -> list[int]:
        return sorted(p for p, part in self._partitions.items() if part.state is PartitionState.ACTIVE)

    def queue_size(self, partition: int) -> int:
        part = self._partitions.get(partition)
        return len(part.queue) if part else 0

    def shard(self, partition: int) -> S:
        part = self._partitions.get(partition)
        if part is None or part.shard is None:
            raise KafkaError(ErrorCode.NOT_COORDINATOR, "partition %d is not loaded" % partition)
        return part.shard

    def timer(self, partition: int) -> CoordinatorTimer:
        part = self._partitions[partition]
        assert part.timer is not None
        return part.timer

    # ----- lifecycle ----------------------------------------------------------------------
    async def load(self, partition: int) -> None:
        """Become the coordinator of `partition`: replay its log into a new shard."""
        if not 0 <= partition < self.num_partitions:
            raise ValueError("no partition %d" % partition)
        existing = self._partitions.get(partition)
        if existing is not None and existing.state in (PartitionState.LOADING, PartitionState.ACTIVE):
            return
        part: _Partition[S] = _Partition(partition)
        self._partitions[partition] = part
        part.timer = CoordinatorTimer(self.clock, lambda op: self._submit_timer_op(part, op))
        try:
            part.shard = await self._build_shard(part)
        except Exception:
            part.state = PartitionState.FAILED
            log.exception("coordinator partition failed to load", coordinator=self.name, partition=partition)
            raise
        part.state = PartitionState.ACTIVE
        part.shard.on_loaded(self.clock.now_ms())
        self._loop = asyncio.get_running_loop()
        part.task = self._loop.create_task(self._run(part), name="%s-%d" % (self.name, partition))

    async def load_all(self) -> None:
        with collector_paused():  # not resumed between the partitions
            for p in range(self.num_partitions):
                await self.load(p)

    async def unload(self, partition: int) -> None:
        """Stop hosting `partition`: operations queued before run, then later ones and parked
        responses get NOT_COORDINATOR."""
        part = self._partitions.pop(partition, None)
        if part is None:
            return
        part.state = PartitionState.CLOSED
        if part.task is not None:  # it runs what was queued, after any fast-path operation in flight
            self._wake(part)
            await part.task
        self._fail_queued(part, ErrorCode.NOT_COORDINATOR)
        if part.timer is not None:
            part.timer.cancel_all()
        if part.shard is not None:
            self._unload_shard(part)

    async def close(self) -> None:
        for p in list(self._partitions):
            await self.unload(p)

    # ----- operations ---------------------------------------------------------------------
    async def write(self, partition: int, op: Op, name: str = "write") -> Any:
        """Run `op` on the partition's shard; returns its response once its records are durable
        (and, for a Deferred response, once that is complete). Raises KafkaError."""
        part = self._active(partition)
        if part.busy or part.queue:
            response = await self._enqueue(part, op, name)
        else:
            response = self._write_now(part, _Event(op, None, name))
            if response.__class__ is _Tail:
                response = await response.future
            if self._burst_ends():
                await asyncio.sleep(0)
        if isinstance(response, Deferred):
            return await response.wait()
        return response

    def submit(self, partition: int, op: Op, name: str = "write") -> asyncio.Future[Any]:
        """Queue `op` without waiting for it: it runs after every operation submitted before it and
        before any submitted later, so a caller may answer at once what must only be seen after
        the op (the transaction coordinator's Complete* record, queued from an on_durable). The
        future gives its response once its records are durable. Raises KafkaError."""
        return self._enqueue(self._active(partition), op, name)

    async def read(self, partition: int, fn: Callable[[S], Any], name: str = "read") -> Any:
        """Run `fn(shard)` in turn with the partition's writes; it sees only durable state.

        A read always queues, never takes the fast path: it answers on a later turn of the event
        loop, after the operations submitted meanwhile, so callers may use it as a barrier."""
        part = self._active(partition)
        response = await self._enqueue(part, lambda shard, _now: CoordinatorResult(response=fn(shard)), name)
        if isinstance(response, Deferred):
            return await response.wait()
        return response

    async def read_now(self, partition: int, fn: Callable[[S], Any], name: str = "read") -> Any:
        """`read`, answered in the caller's turn when the partition is idle (nothing queued, no
        write waiting for durability: what the shard holds is durable), queued otherwise. Not a
        barrier: for reads on the request path (OffsetFetch)."""
        part = self._active(partition)
        if part.busy or part.queue:
            return await self.read(partition, fn, name)
        assert part.shard is not None
        response = fn(part.shard)
        if isinstance(response, Deferred):
            return await response.wait()
        return response

    def _burst_ends(self) -> bool:
        """Whether a fast-path write should give the event loop a turn now. The fast path never
        gives one: a task writing in a row (a connection working through pipelined commits)
        gives one every _FAST_PATH_BURST writes, so that it cannot starve the other connections;
        a task per request never pays, nor does a request handled in the server's read callback
        (no task: the loop turns before the next one)."""
        task = asyncio.current_task(self._loop)
        if task is None:
            return False
        if task is not self._burst_task:
            self._burst_task, self._burst = task, 1
        elif self._burst < _FAST_PATH_BURST:
            self._burst += 1
        else:
            self._burst = 0
            return True
        return False

    def _enqueue(self, part: _Partition[S], op: Op, name: str) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        part.queue.append(_Event(op, fut, name))
        if not part.busy:
            self._wake(part)
        return fut

    def _active(self, partition: int) -> _Partition[S]:
        part = self._partitions.get(partition)
        if part is not None and part.state is PartitionState.ACTIVE:
            return part
        if part is None or part.state in (PartitionState.FAILED, PartitionState.CLOSED):
            raise KafkaError(ErrorCode.NOT_COORDINATOR, "this broker does not host partition %d" % partition)
        if part.state is PartitionState.LOADING:
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return part

    def _submit_timer_op(self, part: _Partition[S], op: Op) -> None:
        if part.state is PartitionState.ACTIVE:
            part.queue.append(_Event(op, None, "timer"))
            if not part.busy:
                self._wake(part)

    # ----- the fast path ------------------------------------------------------------------
    def _write_now(self, part: _Partition[S], ev: _Event) -> Any:
        """Run one operation on an idle partition, now: its response, or a _Tail whose future
        gives it once an fsync is done (or a failed write has reloaded the shard)."""
        part.busy = True
        try:
            outcome, chunks = self._run_one(part, ev)
            result = outcome[0]
            if result is None:  # the operation failed: nothing to write
                waiting, failure = None, None
            elif chunks is None:  # plain records (or none)
                waiting, failure = self._write_plain(part, result.records)
            else:
                waiting, failure = self._write_records(part, chunks)
        except BaseException:
            self._release(part)
            raise
        if waiting is None and failure is None:
            try:
                response, error = self._released(part, outcome)
            finally:
                self._release(part)
            if error is not None:
                raise error
            return response
        # An fsync to await or a failed write: finish in a task of its own, holding the partition.
        if failure is not None:
            part.state = PartitionState.LOADING  # from now on, as the task reloads the shard
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        ev.future = fut
        part.tail = loop.create_task(self._finish_tail(part, [ev], [outcome], waiting, failure))
        return _Tail(fut)

    def _run_one(self, part: _Partition[S], ev: _Event) -> tuple[_Outcome, list[_Chunk] | None]:
        """`_run_ops` of one operation (the fast path's), without the lists of a batch when its
        records are plain (the usual case: then no chunks, the result's records are written)."""
        shard = part.shard
        assert shard is not None
        try:
            res = ev.op(shard, self.clock.now_ms())
            if res.producer is None and res.marker is None:
                if res.replay:
                    for key, value in res.records:
                        shard.replay(key, value)
                return (res, None), None
            chunks: list[_Chunk] = []
            self._transactional(shard, res, chunks)
            return (res, None), chunks
        except KafkaError as exc:
            return (None, exc), None
        except Exception as exc:
            log.exception("coordinator operation failed", coordinator=self.name, partition=part.index, op=ev.name)
            return (None, KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))), None

    def _write_plain(self, part: _Partition[S], records: list[Record]
                     ) -> tuple[Awaitable[Any] | None, BaseException | None]:
        """`_write_records` of one operation's plain records."""
        if not records:
            return None, None
        try:
            return self.writer.write(part.index, records), None
        except Exception as exc:
            return None, exc

    async def _finish_tail(self, part: _Partition[S], batch: list[_Event], outcomes: list[_Outcome],
                           waiting: Awaitable[Any] | None, failure: BaseException | None) -> None:
        try:
            await self._complete(part, batch, outcomes, waiting, failure)
        except Exception:  # a bug in the runtime itself
            log.exception("coordinator operation failed", coordinator=self.name, partition=part.index)
            for ev in batch:
                self._finish(ev, None, KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR))
        finally:
            part.tail = None
            self._release(part)

    def _release(self, part: _Partition[S]) -> None:
        part.busy = False
        if part.queue or part.state is not PartitionState.ACTIVE:
            self._wake(part)

    def _wake(self, part: _Partition[S]) -> None:
        if part.wakeup is not None and not part.wakeup.done():
            part.wakeup.set_result(None)

    # ----- the partition's task -----------------------------------------------------------
    async def _run(self, part: _Partition[S]) -> None:
        loop = asyncio.get_running_loop()
        queue = part.queue
        while True:
            if part.busy:
                pass  # a fast-path operation holds the partition: its release wakes us
            elif part.state is PartitionState.FAILED:
                self._fail_queued(part, ErrorCode.NOT_COORDINATOR)
                return
            elif queue:
                batch = [queue.popleft() for _ in range(min(len(queue), self.max_batch))]
                part.busy = True
                try:
                    await self._process(part, batch)
                except Exception:  # a bug in the runtime itself: keep the partition alive
                    log.exception("coordinator batch failed", coordinator=self.name, partition=part.index)
                    for ev in batch:
                        self._finish(ev, None, KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR))
                finally:
                    part.busy = False
                continue
            elif part.state is PartitionState.CLOSED:
                return
            part.wakeup = loop.create_future()
            try:
                await part.wakeup
            finally:
                part.wakeup = None

    async def _process(self, part: _Partition[S], batch: list[_Event]) -> None:
        outcomes, chunks = self._run_ops(part, batch)
        waiting, failure = self._write_records(part, chunks)
        await self._complete(part, batch, outcomes, waiting, failure)

    # ----- the steps of both paths --------------------------------------------------------
    def _run_ops(self, part: _Partition[S], batch: Sequence[_Event]) -> tuple[list[_Outcome], list[_Chunk]]:
        """Run the operations one after the other, replaying their records; returns each one's
        outcome and what they write (consecutive plain records make one batch)."""
        shard = part.shard
        assert shard is not None
        now = self.clock.now_ms()
        outcomes: list[_Outcome] = []
        chunks: list[_Chunk] = []
        for ev in batch:
            try:
                res = ev.op(shard, now)
                if res.producer is None and res.marker is None:
                    if res.replay:
                        for key, value in res.records:
                            shard.replay(key, value)
                    if res.records:
                        if chunks and chunks[-1][0] is None and isinstance(chunks[-1][1], list):
                            chunks[-1][1].extend(res.records)
                        else:
                            chunks.append((None, list(res.records)))
                else:
                    self._transactional(shard, res, chunks)
                outcomes.append((res, None))
            except KafkaError as exc:
                outcomes.append((None, exc))
            except Exception as exc:
                log.exception("coordinator operation failed", coordinator=self.name, partition=part.index, op=ev.name)
                outcomes.append((None, KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))))
        return outcomes, chunks

    @staticmethod
    def _transactional(shard: Any, res: CoordinatorResult[Any], chunks: list[_Chunk]) -> None:
        """A result with a transactional producer's records or a marker: its own batches."""
        if res.records:
            if res.replay:
                for key, value in res.records:
                    if res.producer is not None:
                        shard.replay_transactional(res.producer[0], key, value)
                    else:
                        shard.replay(key, value)
            chunks.append((res.producer, list(res.records)))
        if res.marker is not None:
            if res.replay:
                shard.replay_end_transaction(res.marker.producer_id, res.marker.committed)
            chunks.append((None, res.marker))

    def _write_records(self, part: _Partition[S], chunks: list[_Chunk]
                       ) -> tuple[Awaitable[Any] | None, BaseException | None]:
        """Write the batches (synchronously); returns what durability still waits on, or the error."""
        if not chunks:
            return None, None
        waiting: list[Awaitable[Any]] = []
        try:
            for producer, item in chunks:
                if isinstance(item, TxnMarker):
                    w = self.writer.write_marker(part.index, item)
                else:
                    w = self.writer.write(part.index, item) if producer is None else \
                        self.writer.write(part.index, item, producer)
                if w is not None:
                    waiting.append(w)
        except Exception as exc:
            return None, exc
        if len(waiting) > 1:
            return asyncio.gather(*waiting), None
        return (waiting[0] if waiting else None), None

    async def _complete(self, part: _Partition[S], batch: Sequence[_Event], outcomes: list[_Outcome],
                        waiting: Awaitable[Any] | None, failure: BaseException | None) -> None:
        """Wait for durability, then release the responses in order; on a failure reload the shard
        and fail the operations."""
        if waiting is not None:
            try:
                await waiting
            except Exception as exc:
                failure = exc
        if failure is not None:
            code = append_error_code(failure)
            log.warning(
                "coordinator append failed; reloading the partition",
                coordinator=self.name, partition=part.index, error=repr(failure), code=code.name,
            )
            await self._reload(part)
            error = KafkaError(code, "append to the coordinator log failed: %s" % failure)
            for ev, (_result, err) in zip(batch, outcomes):
                self._finish(ev, None, err or error)
            return
        for ev, outcome in zip(batch, outcomes):
            response, err = self._released(part, outcome)
            self._finish(ev, response, err)

    def _released(self, part: _Partition[S], outcome: _Outcome) -> tuple[Any, BaseException | None]:
        """Once durable: the operation's on_durable, then its response (or error)."""
        result, err = outcome
        if result is None:
            return None, err
        if result.on_durable is not None:
            try:
                result.on_durable()
            except Exception as exc:
                log.exception("coordinator on_durable failed", coordinator=self.name, partition=part.index)
                return None, KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))
        return result.response, err

    # ----- loading ------------------------------------------------------------------------
    async def _build_shard(self, part: _Partition[S]) -> S:
        assert part.timer is not None
        shard = self.shard_factory(part.index, part.timer)
        # the collector would walk the offsets again and again as they pile up (40 % of loading
        # 1,000,000), to find no garbage
        with collector_paused():
            count, skipped = await self._replay_log(part, shard)
        log.debug("coordinator partition loaded", coordinator=self.name, partition=part.index,
                 records=count, skipped=skipped)
        return shard

    async def _replay_log(self, part: _Partition[S], shard: S) -> tuple[int, int]:
        """Replay the partition's log into `shard`: (records, records skipped)."""
        count = skipped = 0
        replay_batch = getattr(shard, "replay_batch", None)
        replay_transactional = getattr(shard, "replay_transactional", None)
        replay_end_transaction = getattr(shard, "replay_end_transaction", None)

        def guarded(apply: Callable[..., None], *args: Any) -> None:
            nonlocal skipped
            try:
                apply(*args)
            except Exception as exc:  # a record we cannot apply must not keep the coordinator down
                skipped += 1
                log.error("skipping coordinator record", coordinator=self.name, partition=part.index, error=repr(exc))

        def replay(key: bytes, value: bytes | None) -> None:
            guarded(shard.replay, key, value)

        next_yield = self.load_yield_every
        for item in self.writer.read(part.index):
            if isinstance(item, list):  # a batch of plain records: the shard may replay it at once
                if replay_batch is not None:
                    replay_batch(item, replay)
                else:
                    for key, value in item:
                        replay(key, value)
                count += len(item)
            elif isinstance(item, TransactionalRecord):
                if replay_transactional is not None:
                    guarded(replay_transactional, item.producer_id, item.key, item.value)
                else:
                    replay(item.key, item.value)
                count += 1
            elif isinstance(item, TxnMarker):
                if replay_end_transaction is not None:
                    guarded(replay_end_transaction, item.producer_id, item.committed)
                count += 1
            else:
                replay(item[0], item[1])
                count += 1
            if count >= next_yield:
                next_yield = count + self.load_yield_every
                await asyncio.sleep(0)
        return count, skipped

    async def _reload(self, part: _Partition[S]) -> None:
        """Rebuild the shard from the log after a failed append, unless the partition is being
        unloaded (typically the failure's cause: this node no longer leads it). A reload must
        never bring a closing partition back to ACTIVE: its task would run on, and the unload
        waiting for that task (the metadata publisher's) would wait forever."""
        assert part.timer is not None
        part.timer.cancel_all()
        self._unload_shard(part)
        if part.state is PartitionState.CLOSED:
            self._fail_queued(part, ErrorCode.NOT_COORDINATOR)
            return
        part.state = PartitionState.LOADING
        try:
            shard = await self._build_shard(part)
        except Exception:
            part.state = PartitionState.FAILED
            log.exception("coordinator partition failed to reload", coordinator=self.name, partition=part.index)
            return
        if part.state is PartitionState.CLOSED:  # unloaded while it replayed
            part.shard = shard
            self._unload_shard(part)
            self._fail_queued(part, ErrorCode.NOT_COORDINATOR)
            return
        part.shard = shard
        part.state = PartitionState.ACTIVE
        shard.on_loaded(self.clock.now_ms())

    def _unload_shard(self, part: _Partition[S]) -> None:
        shard, part.shard = part.shard, None
        if shard is not None:
            try:
                shard.on_unloaded()
            except Exception:
                log.exception("coordinator shard unload failed", coordinator=self.name, partition=part.index)

    def _fail_queued(self, part: _Partition[S], code: ErrorCode) -> None:
        while part.queue:
            self._finish(part.queue.popleft(), None, KafkaError(code))

    def _finish(self, ev: _Event, response: Any, error: BaseException | None) -> None:
        if ev.future is None:
            if error is not None and not (isinstance(error, KafkaError) and error.code in _QUIET):
                log.warning("coordinator timer operation failed", coordinator=self.name, error=repr(error))
            return
        if ev.future.done():
            return
        if error is not None:
            ev.future.set_exception(error)
        else:
            ev.future.set_result(response)


_QUIET = frozenset([ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS])
