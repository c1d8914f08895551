"""The transaction coordinator service: routes each request to its `__transaction_state` shard
through the runtime, and writes the markers of decided transactions (Kafka's
TransactionCoordinator with its TransactionMarkerChannelManager, for a single node).

Ending a transaction: the shard writes the Prepare* record; once it is durable the service appends
the marker to every partition of the transaction (`MarkerWriter`, the single-node WriteTxnMarkers),
then writes the Complete* record. EndTxn is answered once the Prepare* record is durable, as Kafka
answers it, when the markers went in at once (appended synchronously, with no fsync to await and no
`__consumer_offsets` partition in the transaction): the Complete* record is then queued on the
shard's partition before the answer leaves, so whatever the producer sends next (AddPartitions,
a transactions-v2 produce, InitProducerId) runs after it and never meets the Prepare* state (no
CONCURRENT_TRANSACTIONS retries), and read_committed readers see the transaction end as soon as
EndTxn is answered. Otherwise a task awaits the markers, completes, and only then answers. A marker
or Complete* write that fails is retried in the background with a growing delay; EndTxn is answered
at the first failure, since the decision is durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from broker.coordinator.regex import RegexError
from broker.coordinator.runtime import CoordinatorRuntime, PartitionWriter, operation_error_code
from broker.coordinator.timer import Clock, Timer
from broker.coordinator.txn.config import TransactionCoordinatorConfig
from broker.coordinator.txn.shard import (
    ProducerIdAndEpoch,
    TransactionCoordinatorShard,
    TxnCompletion,
    compile_pattern,
)
from broker.coordinator.txn.state import TopicPartition, TransactionMetadata, TransactionState
from broker.observability.logger import get_logger
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator.txn")

E = ErrorCode
_RETRY_START_S = 0.05
_RETRY_MAX_S = 5.0


class MarkerWrite(NamedTuple):
    """What `MarkerWriter.append_markers` did: the partitions whose marker failed (to try again),
    and, when something is still on its way (an fsync the flush policy asks for, a marker written
    through a coordinator), the awaitable giving further partitions to try again."""

    failed: set[TopicPartition]
    pending: Awaitable[set[TopicPartition]] | None = None


class MarkerWriter(Protocol):
    def append_markers(self, completion: TxnCompletion, partitions: set[TopicPartition]) -> MarkerWrite:
        """Append the completion's COMMIT or ABORT marker to each of `partitions` now (a partition
        that no longer exists counts as written); what cannot be done synchronously is pending."""
        ...


class NoMarkers:
    """A MarkerWriter for tests of the coordinator alone: every marker is written at once."""

    def __init__(self) -> None:
        self.written: list[tuple[TxnCompletion, frozenset[TopicPartition]]] = []

    def append_markers(self, completion: TxnCompletion, partitions: set[TopicPartition]) -> MarkerWrite:
        self.written.append((completion, frozenset(partitions)))
        return MarkerWrite(set())


def _code(exc: BaseException) -> ErrorCode:
    return operation_error_code(exc, "transaction coordinator")


class TransactionCoordinator:
    def __init__(self, runtime: CoordinatorRuntime[TransactionCoordinatorShard], config: TransactionCoordinatorConfig,
                 markers: MarkerWriter) -> None:
        self.runtime = runtime
        self.config = config
        self.markers = markers
        self._completions: set[asyncio.Task[None]] = set()  # completions awaiting markers or retrying
        self._completing: set[asyncio.Future[Any]] = set()  # Complete* records queued on their partition

    async def start(self, load: bool = True) -> None:
        """Load every partition of __transaction_state (a single node coordinates them all; a node
        of a cluster loads those it leads, as it learns of them: `load` False)."""
        if load:
            await self.runtime.load_all()

    async def stop(self) -> None:
        for task in list(self._completions):
            task.cancel()
        await asyncio.gather(*self._completions, return_exceptions=True)
        await self.runtime.close()  # runs the queued Complete* records

    def partition_for(self, transactional_id: str) -> int:
        return self.runtime.partition_for(transactional_id)

    async def idle(self) -> None:
        """Wait until no transaction is being completed (tests)."""
        while self._completions or self._completing:
            await asyncio.gather(*self._completions, *self._completing, return_exceptions=True)

    # ----- requests -----------------------------------------------------------------------
    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               expected: tuple[int, int] | None = None) -> ProducerIdAndEpoch:
        try:
            result: ProducerIdAndEpoch = await self.runtime.write(
                self.partition_for(transactional_id),
                lambda s, now: s.init_producer_id(transactional_id, timeout_ms, expected, now), "init-producer-id")
            return result
        except Exception as exc:
            return ProducerIdAndEpoch(_code(exc))

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: Iterable[TopicPartition], client_transaction_version: int = 0) -> ErrorCode:
        parts = frozenset(partitions)
        try:
            code: ErrorCode = await self.runtime.write(
                self.partition_for(transactional_id),
                lambda s, now: s.add_partitions(transactional_id, producer_id, epoch, parts,
                                                client_transaction_version, now), "add-partitions")
            return code
        except Exception as exc:
            return _code(exc)

    async def verify_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                                partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        parts = list(partitions)
        try:
            result: dict[TopicPartition, ErrorCode] = await self.runtime.read_now(
                self.partition_for(transactional_id),
                lambda s: s.verify_partitions(transactional_id, producer_id, epoch, parts), "verify-partitions")
            return result
        except Exception as exc:
            code = _code(exc)
            return {tp: code for tp in parts}

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int, committed: bool,
                      client_transaction_version: int = 0) -> ProducerIdAndEpoch:
        try:
            result: ProducerIdAndEpoch = await self.runtime.write(
                self.partition_for(transactional_id),
                lambda s, now: s.end_txn(transactional_id, producer_id, epoch, committed, client_transaction_version,
                                         now), "end-txn")
            return result
        except Exception as exc:
            return ProducerIdAndEpoch(_code(exc))

    async def describe(self, transactional_id: str) -> tuple[ErrorCode, TransactionMetadata | None]:
        if not transactional_id:
            return E.INVALID_REQUEST, None
        try:
            meta = await self.runtime.read_now(self.partition_for(transactional_id),
                                               lambda s: s.describe(transactional_id), "describe-transactions")
        except Exception as exc:
            return _code(exc), None
        return (E.NONE, meta) if meta is not None else (E.TRANSACTIONAL_ID_NOT_FOUND, None)

    async def list_transactions(self, state_filters: list[str], producer_ids: list[int], duration_ms: int = -1,
                                pattern: str | None = None) -> tuple[ErrorCode, list[TransactionMetadata], list[str]]:
        """(error, transactions, unknown state filters)."""
        states = set()
        unknown = []
        for name in state_filters:
            state = TransactionState.from_name(name)
            if state is None:
                unknown.append(name)
            else:
                states.add(state)
        try:
            compiled = compile_pattern(pattern)
        except RegexError:
            return E.INVALID_REGULAR_EXPRESSION, [], unknown
        pids = set(producer_ids)
        now = self.runtime.clock.now_ms()
        out: list[TransactionMetadata] = []
        for p in range(self.runtime.num_partitions):
            try:
                out += await self.runtime.read_now(
                    p, lambda s: s.list_transactions(states, pids, duration_ms, compiled, now), "list-transactions")
            except KafkaError as exc:
                if exc.code is not E.NOT_COORDINATOR:
                    return exc.code, [], unknown
        return E.NONE, out, unknown

    # ----- completing decided transactions ---------------------------------------------------
    def on_prepared(self, partition: int, completion: TxnCompletion) -> None:
        """A Prepare* record is durable (or was found by a load), on the partition's turn: append
        the markers; when that is all, queue the Complete* record and answer, else complete in a
        task."""
        c = completion
        try:
            write = self.markers.append_markers(c, set(c.partitions)) if c.partitions else MarkerWrite(set())
        except Exception:
            log.exception("writing transaction markers failed; retrying", transactional_id=c.transactional_id)
            write = MarkerWrite(set(c.partitions))
        if write.pending is None and not write.failed:
            try:
                queued = self.runtime.submit(partition, lambda s, now: s.complete_txn(c, now), "complete-txn")
            except KafkaError:
                c.finish(None)  # the partition is going away: its next load completes the transaction
                return
            self._completing.add(queued)
            queued.add_done_callback(lambda f: self._queued_completion_done(partition, c, f))
            c.finish(None)
            return
        self._start_completion(partition, c, write)

    def _queued_completion_done(self, partition: int, c: TxnCompletion, queued: asyncio.Future[Any]) -> None:
        self._completing.discard(queued)
        if queued.cancelled():
            return
        exc = queued.exception()
        if exc is None or (isinstance(exc, KafkaError) and exc.code is E.NOT_COORDINATOR):
            return
        log.warning("completing a transaction failed; retrying", transactional_id=c.transactional_id,
                    error=exc.code.name if isinstance(exc, KafkaError) else repr(exc))
        self._start_completion(partition, c, MarkerWrite(set()), _RETRY_START_S)

    def _start_completion(self, partition: int, c: TxnCompletion, first: MarkerWrite, delay: float = 0.0) -> None:
        task = asyncio.get_running_loop().create_task(self._complete(partition, c, first, delay),
                                                      name="complete-txn-%s" % c.transactional_id)
        self._completions.add(task)
        task.add_done_callback(self._completions.discard)

    async def _complete(self, partition: int, c: TxnCompletion, first: MarkerWrite, delay: float) -> None:
        """Await the markers under way (`first`), write those still missing, then Complete*."""
        pending: set[TopicPartition] | None = None
        if delay:
            await asyncio.sleep(delay)
        else:
            delay = _RETRY_START_S
        while True:
            try:
                if pending is None:
                    pending = set(first.failed) | (await first.pending if first.pending is not None else set())
                elif pending:
                    write = self.markers.append_markers(c, pending)
                    pending = set(write.failed) | (await write.pending if write.pending is not None else set())
                if not pending:
                    meta = await self.runtime.write(partition, lambda s, now: s.complete_txn(c, now), "complete-txn")
                    c.finish(meta)
                    return
            except KafkaError as exc:
                if exc.code is E.NOT_COORDINATOR:
                    c.finish(None)  # the partition left this coordinator; its next load completes the transaction
                    return
                log.warning("completing a transaction failed; retrying", transactional_id=c.transactional_id,
                            error=exc.code.name)
            except asyncio.CancelledError:
                c.finish(None)
                raise
            except Exception:
                log.exception("completing a transaction failed; retrying", transactional_id=c.transactional_id)
            if pending is None:
                pending = set(c.partitions)  # awaiting the markers under way failed: write them all again
            c.finish(None)  # the decision is durable: answer now, go on behind the scenes
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)


def create_transaction_coordinator(writer: PartitionWriter, config_values: Mapping[str, Any], clock: Clock,
                                   markers: MarkerWriter, new_producer_id: Callable[[], int],
                                   transaction_version: Callable[[], int] | None = None) -> TransactionCoordinator:
    """A transaction coordinator over `writer` (one log per __transaction_state partition);
    `transaction_version` gives the finalized transaction.version. Call `await start()` to load
    its partitions and `await stop()` on shutdown."""
    config = TransactionCoordinatorConfig.from_values(config_values)
    holder: list[TransactionCoordinator] = []

    def shard_factory(partition: int, timer: Timer) -> TransactionCoordinatorShard:
        return TransactionCoordinatorShard(timer, config, new_producer_id,
                                           on_prepared=lambda c: holder[0].on_prepared(partition, c),
                                           transaction_version=transaction_version)

    runtime: CoordinatorRuntime[TransactionCoordinatorShard] = CoordinatorRuntime(
        writer, shard_factory, config.num_partitions, clock, name="transaction-coordinator")
    coordinator = TransactionCoordinator(runtime, config, markers)
    holder.append(coordinator)
    return coordinator
