"""The coordinator runtime: one shard per internal-topic partition, one event queue and one task each.

Modelled on Kafka's CoordinatorRuntime. A write operation `(shard, now_ms) -> CoordinatorResult`
runs on the partition's task, so shards need no locks. The task takes every queued operation
(up to `max_batch`), runs them one after the other, replays their records into the shard, makes
all their records durable with one `PartitionWriter.append`, and only then releases their
responses in order. If the append fails, the shard is rebuilt from its log (the operations'
effects are gone) and every operation of the batch fails with the error Kafka maps the append
error to (NOT_COORDINATOR for a storage error).

Read operations queue like writes, so they see only state whose records are durable.

Loading replays the partition's log into a fresh shard; meanwhile its operations get
COORDINATOR_LOAD_IN_PROGRESS. A partition this runtime does not host answers NOT_COORDINATOR.
"""

from __future__ import annotations

import asyncio
import enum
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import structlog

from broker.coordinator.result import CoordinatorResult, Deferred, Record
from broker.coordinator.timer import Clock, CoordinatorTimer, Op, Timer
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("broker.coordinator")

_INT32_MIN = -(2**31)


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


def partition_for(key: str, num_partitions: int) -> int:
    """The internal-topic partition of a group id or transactional id, exactly as Kafka."""
    return java_abs(java_string_hashcode(key)) % num_partitions


class PartitionWriter(Protocol):
    """Where a runtime keeps its records: one log per internal-topic partition."""

    async def append(self, partition: int, records: Sequence[Record]) -> int:
        """Append the records; return the log end offset once they are durable under the flush
        policy. Raises (KafkaError or OSError) if they could not be written."""
        ...

    def read(self, partition: int) -> Iterable[Record]:
        """Every record of the partition's log in order, for loading."""
        ...


class InMemoryWriter:
    """A PartitionWriter in memory, for tests; `fail_next` makes the next append raise."""

    def __init__(self) -> None:
        self.logs: dict[int, list[Record]] = defaultdict(list)
        self.fail_next: BaseException | None = None
        self.appends = 0

    async def append(self, partition: int, records: Sequence[Record]) -> int:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        self.appends += 1
        log_ = self.logs[partition]
        log_.extend(records)
        return len(log_)

    def read(self, partition: int) -> Iterable[Record]:
        return list(self.logs[partition])


class CoordinatorShard(Protocol):
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


class PartitionState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"
    CLOSED = "closed"


class _Event:
    __slots__ = ("future", "name", "op")

    def __init__(self, op: Op, future: asyncio.Future[Any] | None, name: str) -> None:
        self.op = op
        self.future = future  # None for timer expiries: nobody waits for them
        self.name = name


class _Partition(Generic[S]):
    def __init__(self, index: int) -> None:
        self.index = index
        self.state = PartitionState.LOADING
        self.shard: S | None = None
        self.queue: asyncio.Queue[_Event | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.timer: CoordinatorTimer | None = None


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
        return part.queue.qsize() if part else 0

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
        part.task = asyncio.get_running_loop().create_task(
            self._run(part), name="%s-%d" % (self.name, partition)
        )

    async def load_all(self) -> None:
        for p in range(self.num_partitions):
            await self.load(p)

    async def unload(self, partition: int) -> None:
        """Stop hosting `partition`: pending operations and parked responses get NOT_COORDINATOR."""
        part = self._partitions.pop(partition, None)
        if part is None:
            return
        part.state = PartitionState.CLOSED
        if part.task is not None:
            part.queue.put_nowait(None)
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
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        part.queue.put_nowait(_Event(op, fut, name))
        response = await fut
        if isinstance(response, Deferred):
            return await response.wait()
        return response

    async def read(self, partition: int, fn: Callable[[S], Any], name: str = "read") -> Any:
        """Run `fn(shard)` on the partition's task; it sees only durable state."""
        return await self.write(partition, lambda shard, _now: CoordinatorResult(response=fn(shard)), name)

    def _active(self, partition: int) -> _Partition[S]:
        part = self._partitions.get(partition)
        if part is None or part.state in (PartitionState.FAILED, PartitionState.CLOSED):
            raise KafkaError(ErrorCode.NOT_COORDINATOR, "this broker does not host partition %d" % partition)
        if part.state is PartitionState.LOADING:
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return part

    def _submit_timer_op(self, part: _Partition[S], op: Op) -> None:
        if part.state is PartitionState.ACTIVE:
            part.queue.put_nowait(_Event(op, None, "timer"))

    # ----- the partition's task -----------------------------------------------------------
    async def _run(self, part: _Partition[S]) -> None:
        queue = part.queue
        while True:
            first = await queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch and not queue.empty():
                ev = queue.get_nowait()
                if ev is None:
                    stop = True
                    break
                batch.append(ev)
            try:
                await self._process(part, batch)
            except Exception:  # a bug in the runtime itself: keep the partition alive
                log.exception("coordinator batch failed", coordinator=self.name, partition=part.index)
                for ev in batch:
                    self._finish(ev, None, KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR))
            if stop:
                return
            if part.state is PartitionState.FAILED:
                self._fail_queued(part, ErrorCode.NOT_COORDINATOR)
                return

    async def _process(self, part: _Partition[S], batch: list[_Event]) -> None:
        shard = part.shard
        assert shard is not None
        now = self.clock.now_ms()
        done: list[tuple[_Event, CoordinatorResult[Any] | None, BaseException | None]] = []
        records: list[Record] = []
        for ev in batch:
            try:
                res = ev.op(shard, now)
                if res.replay:
                    for key, value in res.records:
                        shard.replay(key, value)
                records.extend(res.records)
                done.append((ev, res, None))
            except KafkaError as exc:
                done.append((ev, None, exc))
            except Exception as exc:
                log.exception("coordinator operation failed", coordinator=self.name, partition=part.index, op=ev.name)
                done.append((ev, None, KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))))

        if records:
            try:
                await self.writer.append(part.index, records)
            except Exception as exc:
                code = append_error_code(exc)
                log.warning(
                    "coordinator append failed; reloading the partition",
                    coordinator=self.name, partition=part.index, error=repr(exc), code=code.name,
                )
                await self._reload(part)
                error = KafkaError(code, "append to the coordinator log failed: %s" % exc)
                for ev, _result, err in done:
                    self._finish(ev, None, err or error)
                return

        for ev, result, err in done:
            if result is not None and result.on_durable is not None:
                try:
                    result.on_durable()
                except Exception as exc:
                    log.exception("coordinator on_durable failed", coordinator=self.name, partition=part.index)
                    err = KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))
            self._finish(ev, result.response if result is not None else None, err)

    async def _build_shard(self, part: _Partition[S]) -> S:
        assert part.timer is not None
        shard = self.shard_factory(part.index, part.timer)
        count = skipped = 0
        for key, value in self.writer.read(part.index):
            try:
                shard.replay(key, value)
            except Exception as exc:  # a record we cannot apply must not keep the coordinator down
                skipped += 1
                log.error("skipping coordinator record", coordinator=self.name, partition=part.index, error=repr(exc))
            count += 1
            if count % self.load_yield_every == 0:
                await asyncio.sleep(0)
        log.debug("coordinator partition loaded", coordinator=self.name, partition=part.index,
                 records=count, skipped=skipped)
        return shard

    async def _reload(self, part: _Partition[S]) -> None:
        part.state = PartitionState.LOADING
        assert part.timer is not None
        part.timer.cancel_all()
        self._unload_shard(part)
        try:
            part.shard = await self._build_shard(part)
        except Exception:
            part.state = PartitionState.FAILED
            log.exception("coordinator partition failed to reload", coordinator=self.name, partition=part.index)
            return
        part.state = PartitionState.ACTIVE
        part.shard.on_loaded(self.clock.now_ms())

    def _unload_shard(self, part: _Partition[S]) -> None:
        shard, part.shard = part.shard, None
        if shard is not None:
            try:
                shard.on_unloaded()
            except Exception:
                log.exception("coordinator shard unload failed", coordinator=self.name, partition=part.index)

    def _fail_queued(self, part: _Partition[S], code: ErrorCode) -> None:
        while not part.queue.empty():
            ev = part.queue.get_nowait()
            if ev is not None:
                self._finish(ev, None, KafkaError(code))

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
