"""The transaction coordinator service: routes each request to its `__transaction_state` shard
through the runtime, and writes the markers of decided transactions (Kafka's
TransactionCoordinator with its TransactionMarkerChannelManager, for a single node).

Ending a transaction: the shard writes the Prepare* record; once it is durable the service writes
the marker to every partition of the transaction (`MarkerWriter`, the single-node WriteTxnMarkers),
then the Complete* record, and only then answers EndTxn (Kafka answers after the Prepare* record;
answering after the markers costs one local write per partition and spares the producer the
CONCURRENT_TRANSACTIONS retries of its next transaction). A marker write that fails is retried in
the background with a growing delay; EndTxn is answered at the first failure, since the decision
is durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import structlog

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
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("broker.coordinator.txn")

E = ErrorCode
TRANSACTION_STATE_TOPIC = "__transaction_state"
_RETRY_START_S = 0.05
_RETRY_MAX_S = 5.0


class MarkerWriter(Protocol):
    async def write_markers(self, completion: TxnCompletion, partitions: set[TopicPartition]) -> set[TopicPartition]:
        """Write the completion's COMMIT or ABORT marker to each of `partitions` (a partition that
        no longer exists counts as written); returns those to try again."""
        ...


class NoMarkers:
    """A MarkerWriter for tests of the coordinator alone: every marker is written at once."""

    def __init__(self) -> None:
        self.written: list[tuple[TxnCompletion, frozenset[TopicPartition]]] = []

    async def write_markers(self, completion: TxnCompletion, partitions: set[TopicPartition]) -> set[TopicPartition]:
        self.written.append((completion, frozenset(partitions)))
        return set()


def _code(exc: BaseException) -> ErrorCode:
    return operation_error_code(exc, "transaction coordinator")


class TransactionCoordinator:
    def __init__(self, runtime: CoordinatorRuntime[TransactionCoordinatorShard], config: TransactionCoordinatorConfig,
                 markers: MarkerWriter) -> None:
        self.runtime = runtime
        self.config = config
        self.markers = markers
        self._completions: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Load every partition of __transaction_state (this single node coordinates them all)."""
        await self.runtime.load_all()

    async def stop(self) -> None:
        for task in list(self._completions):
            task.cancel()
        await asyncio.gather(*self._completions, return_exceptions=True)
        await self.runtime.close()

    def partition_for(self, transactional_id: str) -> int:
        return self.runtime.partition_for(transactional_id)

    async def idle(self) -> None:
        """Wait until no transaction is being completed (tests)."""
        while self._completions:
            await asyncio.gather(*list(self._completions), return_exceptions=True)

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
        except Exception:
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
        """A Prepare* record is durable (or was found by a load): write the markers, then complete."""
        task = asyncio.get_running_loop().create_task(self._complete(partition, completion),
                                                      name="complete-txn-%s" % completion.transactional_id)
        self._completions.add(task)
        task.add_done_callback(self._completions.discard)

    async def _complete(self, partition: int, c: TxnCompletion) -> None:
        pending = set(c.partitions)
        delay = _RETRY_START_S
        while True:
            try:
                if pending:
                    pending = await self.markers.write_markers(c, pending)
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
