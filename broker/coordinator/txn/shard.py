"""The transaction coordinator shard: the transactional ids of one `__transaction_state`
partition, Kafka's TransactionCoordinator checks as plain handlers, and `replay`.

A handler validates, computes the new TransactionMetadata (state.py), applies it and returns its
record; `replay` applies a decoded record the same way (only `last_producer_epoch`, which Kafka
does not persist either, differs after a load).

Ending a transaction takes three steps, as in Kafka: the Prepare* record (the decision, durable
before anything else happens), the markers written to every partition of the transaction (outside
the shard: `on_prepared` hands a TxnCompletion to the service once the Prepare* record is durable),
then the Complete* record (`complete_txn`). A load finds the transactions left in Prepare* and
hands them over again. Timed-out transactions are fenced and aborted by a timer operation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from broker.coordinator.regex import compile_re2
from broker.coordinator.result import CoordinatorResult, Deferred, Record
from broker.coordinator.timer import Timer
from broker.coordinator.txn.config import TransactionCoordinatorConfig
from broker.coordinator.txn.records import parse_key, parse_value, tombstone, transaction_record
from broker.coordinator.txn.state import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    SHORT_MAX,
    TV_2,
    IllegalTransition,
    TopicPartition,
    TransactionMetadata,
    TransactionState,
)
from broker.observability.logger import get_logger
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator.txn")

E = ErrorCode
S = TransactionState
ABORT_TIMED_OUT_KEY = "abort-timed-out-transactions"
EXPIRE_IDS_KEY = "expire-transactional-ids"


class ProducerIdAndEpoch(NamedTuple):
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(eq=False)
class TxnCompletion:
    """A decided transaction whose markers are to be written: what the service needs for that,
    and who waits for the result (`done`, completed with `answer(metadata after completion)`, or
    `answer(None)` when answered before the Complete* record)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int  # the epoch the markers carry
    committed: bool
    partitions: frozenset[TopicPartition]
    transaction_version: int
    coordinator_epoch: int = 0
    done: Deferred[Any] | None = None
    answer: Callable[[TransactionMetadata | None], Any] | None = None

    def finish(self, meta: TransactionMetadata | None) -> None:
        if self.done is not None:
            self.done.complete(self.answer(meta) if self.answer is not None else meta)


def _error(code: ErrorCode) -> CoordinatorResult[Any]:
    return CoordinatorResult(response=ProducerIdAndEpoch(code))


class TransactionCoordinatorShard:
    def __init__(
        self,
        timer: Timer,
        config: TransactionCoordinatorConfig | None = None,
        new_producer_id: Callable[[], int] | None = None,
        on_prepared: Callable[[TxnCompletion], None] | None = None,
        transaction_version: Callable[[], int] | None = None,
    ) -> None:
        self.timer = timer
        self.config = config or TransactionCoordinatorConfig()
        self.new_producer_id = new_producer_id or _counter()
        self.on_prepared = on_prepared or (lambda completion: None)
        # the finalized transaction.version: the protocol of the coordinator's own aborts and the
        # version of the records it writes
        self.transaction_version = transaction_version or (lambda: self.config.transaction_version)
        self.txns: dict[str, TransactionMetadata] = {}

    # ----- replay and lifecycle -----------------------------------------------------------
    def replay(self, key: bytes, value: bytes | None) -> None:
        transactional_id = parse_key(key)
        if value is None:
            self.txns.pop(transactional_id, None)
        else:
            self.txns[transactional_id] = parse_value(transactional_id, value)

    def on_loaded(self, now_ms: int) -> None:
        self._schedule_abort_timed_out()
        self._schedule_expiration()
        # Decided before the coordinator stopped: write the markers (again) and complete.
        for meta in self.txns.values():
            if meta.state.is_prepare:
                self.on_prepared(self._completion(meta))

    def on_unloaded(self) -> None:
        pass

    def _apply(self, meta: TransactionMetadata, response: Any = None,
               on_durable: Callable[[], None] | None = None) -> CoordinatorResult[Any]:
        """Make `meta` the transactional id's state and return its record (applied here, from the
        metadata it was made of: the in-memory last epoch survives, which a decode would lose)."""
        self.txns[meta.transactional_id] = meta
        return CoordinatorResult(records=[transaction_record(meta, self.transaction_version())], response=response,
                                 replay=False,
                                 on_durable=on_durable)

    def _completion(self, meta: TransactionMetadata, done: Deferred[Any] | None = None,
                    answer: Callable[[TransactionMetadata | None], Any] | None = None) -> TxnCompletion:
        return TxnCompletion(meta.transactional_id, meta.producer_id, meta.producer_epoch,
                             meta.state is S.PREPARE_COMMIT, meta.partitions, meta.client_transaction_version,
                             done=done, answer=answer)

    def _prepared(self, meta: TransactionMetadata, answer: Callable[[TransactionMetadata | None], Any]
                  ) -> CoordinatorResult[Any]:
        """Write a Prepare* record; once durable the markers go out, and the response (a Deferred)
        is `answer(...)` of the completed transaction, or `answer(None)` when the service answers
        before the Complete* record is written (TxnCompletion.finish)."""
        done: Deferred[Any] = Deferred()
        completion = self._completion(meta, done, answer)
        return self._apply(meta, response=done, on_durable=lambda: self.on_prepared(completion))

    # ----- InitProducerId -----------------------------------------------------------------
    def init_producer_id(self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None,
                         now_ms: int) -> CoordinatorResult[Any]:
        """`expected`: the (producer id, epoch) the request carries (v3+, KIP-360), or None."""
        if not transactional_id:
            return _error(E.INVALID_REQUEST)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return _error(E.INVALID_TRANSACTION_TIMEOUT)
        meta = self.txns.get(transactional_id)
        if meta is None:
            meta = TransactionMetadata(transactional_id, self.new_producer_id(), txn_timeout_ms=timeout_ms,
                                       txn_last_update_timestamp=now_ms)
        if expected is not None and not self._valid_expected(meta, *expected):
            return _error(E.PRODUCER_FENCED)
        state = meta.state
        if state.is_prepare:
            return _error(E.CONCURRENT_TRANSACTIONS)
        if state is S.ONGOING:
            # Fence the current producer: abort its transaction with a bumped epoch; the caller retries
            # (CONCURRENT_TRANSACTIONS), by when the epoch is bumped once more, for it.
            return self._fence_and_abort(meta, now_ms, lambda _meta: ProducerIdAndEpoch(E.CONCURRENT_TRANSACTIONS))
        if state not in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT):
            raise IllegalTransition("transactional id %r is %s" % (transactional_id, state.kafka_name))
        if meta.epoch_exhausted and (expected is None or expected[1] == meta.producer_epoch):
            new = meta.prepare_producer_id_rotation(self.new_producer_id(), timeout_ms, now_ms, expected is not None)
        else:
            try:
                new = meta.prepare_increment_producer_epoch(timeout_ms, None if expected is None else expected[1],
                                                            now_ms)
            except KafkaError as exc:
                return _error(exc.code)
        log.info("initialized transactional id", transactional_id=transactional_id, producer_id=new.producer_id,
                 producer_epoch=new.producer_epoch)
        return self._apply(new, response=ProducerIdAndEpoch(E.NONE, new.producer_id, new.producer_epoch))

    @staticmethod
    def _valid_expected(meta: TransactionMetadata, producer_id: int, epoch: int) -> bool:
        # Kafka's isValidProducerId: a just-created id, the current producer id (its epoch is checked
        # with the bump), or the previous one retrying after the bump that exhausted its epochs.
        return (meta.producer_epoch == NO_PRODUCER_EPOCH or producer_id == meta.producer_id
                or (producer_id == meta.prev_producer_id and epoch >= SHORT_MAX - 1))

    # ----- AddPartitionsToTxn / AddOffsetsToTxn -------------------------------------------
    def _check_producer(self, transactional_id: str, producer_id: int, epoch: int) -> TransactionMetadata:
        if not transactional_id:
            raise KafkaError(E.INVALID_REQUEST)
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            raise KafkaError(E.INVALID_PRODUCER_ID_MAPPING)
        if meta.producer_epoch != epoch:
            raise KafkaError(E.PRODUCER_FENCED)
        if meta.state.is_prepare:
            raise KafkaError(E.CONCURRENT_TRANSACTIONS)
        return meta

    def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                       partitions: Iterable[TopicPartition], client_transaction_version: int,
                       now_ms: int) -> CoordinatorResult[ErrorCode]:
        try:
            meta = self._check_producer(transactional_id, producer_id, epoch)
        except KafkaError as exc:
            return CoordinatorResult(response=exc.code)
        added = frozenset(partitions)
        if meta.state is S.ONGOING and added <= meta.partitions:
            return CoordinatorResult(response=E.NONE)  # nothing new: no record
        return self._apply(meta.prepare_add_partitions(added, now_ms, client_transaction_version), response=E.NONE)

    def verify_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn with VerifyOnly (KIP-890 part 1): is each partition in the transaction?"""
        try:
            meta = self._check_producer(transactional_id, producer_id, epoch)
        except KafkaError as exc:
            return {tp: exc.code for tp in partitions}
        return {tp: E.NONE if tp in meta.partitions else E.TRANSACTION_ABORTABLE for tp in partitions}

    # ----- EndTxn -------------------------------------------------------------------------
    def end_txn(self, transactional_id: str, producer_id: int, epoch: int, committed: bool,
                client_transaction_version: int, now_ms: int) -> CoordinatorResult[Any]:
        """Answers a ProducerIdAndEpoch (a Deferred one when a Prepare* record is written: the
        service completes it once the markers are written)."""
        if not transactional_id:
            return _error(E.INVALID_REQUEST)
        meta = self.txns.get(transactional_id)
        if meta is None:
            return _error(E.INVALID_PRODUCER_ID_MAPPING)
        if client_transaction_version >= TV_2:
            return self._end_txn_v2(meta, producer_id, epoch, committed, now_ms)
        if meta.producer_id != producer_id:
            return _error(E.INVALID_PRODUCER_ID_MAPPING)
        if epoch != meta.producer_epoch:
            return _error(E.PRODUCER_FENCED)
        state = meta.state
        if state is S.ONGOING:
            target = S.PREPARE_COMMIT if committed else S.PREPARE_ABORT
            new = meta.prepare_abort_or_commit(target, 0, NO_PRODUCER_ID, now_ms, no_partition_added=False)
            return self._prepared(new, lambda _meta: ProducerIdAndEpoch(E.NONE))
        return _error(self._end_txn_without_prepare(meta, committed, retry=True))

    @staticmethod
    def _end_txn_without_prepare(meta: TransactionMetadata, committed: bool, retry: bool) -> ErrorCode:
        """EndTxn in a state that writes nothing: a retry of a completed end (NONE), an end in
        progress (CONCURRENT_TRANSACTIONS), or the wrong end (INVALID_TXN_STATE)."""
        state = meta.state
        if state is (S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT):
            return E.NONE if retry else E.INVALID_TXN_STATE
        if state is (S.PREPARE_COMMIT if committed else S.PREPARE_ABORT):
            return E.CONCURRENT_TRANSACTIONS
        if state in (S.DEAD, S.PREPARE_EPOCH_FENCE):
            raise IllegalTransition("transactional id %r is %s" % (meta.transactional_id, state.kafka_name))
        log.warning("EndTxn in the wrong state", transactional_id=meta.transactional_id, state=state.kafka_name,
                    committed=committed)
        return E.INVALID_TXN_STATE

    def _end_txn_v2(self, meta: TransactionMetadata, producer_id: int, epoch: int, committed: bool,
                    now_ms: int) -> CoordinatorResult[Any]:
        """Transactions v2: every end bumps the epoch, so a retry is told apart by its epoch."""
        retry_on_overflow = (meta.prev_producer_id == producer_id and epoch == SHORT_MAX - 1
                             and meta.producer_epoch == 0)
        retry_on_bump = meta.producer_epoch == epoch + 1
        state = meta.state
        if state.is_prepare:
            valid = retry_on_bump
        elif state.is_complete:
            valid = retry_on_bump or retry_on_overflow or epoch == meta.producer_epoch
        else:
            valid = epoch == meta.producer_epoch
        retry = retry_on_bump or retry_on_overflow
        if meta.producer_id != producer_id and not retry_on_overflow:
            return _error(E.INVALID_PRODUCER_ID_MAPPING)
        if not valid:
            return _error(E.PRODUCER_FENCED)
        if state is S.ONGOING:
            return self._end_v2(meta, S.PREPARE_COMMIT if committed else S.PREPARE_ABORT, now_ms, False)
        if not committed and not retry and state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            # the client was unsure whether a transaction is open: abort one with no partition
            return self._end_v2(meta, S.PREPARE_ABORT, now_ms, True)
        if committed and state is S.COMPLETE_COMMIT and not retry or state is S.EMPTY:
            return _error(E.INVALID_TXN_STATE)
        code = self._end_txn_without_prepare(meta, committed, retry)
        if code is E.NONE:
            return CoordinatorResult(response=ProducerIdAndEpoch(E.NONE, meta.producer_id, meta.producer_epoch))
        return _error(code)

    def _end_v2(self, meta: TransactionMetadata, target: TransactionState, now_ms: int,
                no_partition_added: bool) -> CoordinatorResult[Any]:
        next_pid = self.new_producer_id() if meta.epoch_exhausted else NO_PRODUCER_ID
        new = meta.prepare_abort_or_commit(target, TV_2, next_pid, now_ms, no_partition_added)

        def answer(done: TransactionMetadata | None) -> ProducerIdAndEpoch:
            # the producer id and epoch to go on with: those of the completed transaction (a new
            # producer id after an epoch overflow), or of the prepared one if completion is late
            if done is None or done.producer_id not in (new.producer_id, new.next_producer_id):
                if new.next_producer_id != NO_PRODUCER_ID:
                    return ProducerIdAndEpoch(E.NONE, new.next_producer_id, 0)
                return ProducerIdAndEpoch(E.NONE, new.producer_id, new.producer_epoch)
            return ProducerIdAndEpoch(E.NONE, done.producer_id, done.producer_epoch)

        return self._prepared(new, answer)

    def _fence_and_abort(self, meta: TransactionMetadata, now_ms: int,
                         answer: Callable[[TransactionMetadata | None], Any]) -> CoordinatorResult[Any]:
        """Abort an ongoing transaction on behalf of the coordinator (a new producer with the same
        transactional id, or the transaction timed out), with an epoch the old producer cannot use."""
        fenced = meta.fenced()
        tv = self.transaction_version()
        if tv >= TV_2:
            next_pid = self.new_producer_id() if fenced.epoch_exhausted else NO_PRODUCER_ID
        else:
            next_pid = NO_PRODUCER_ID
        new = fenced.prepare_abort_or_commit(S.PREPARE_ABORT, tv, next_pid, now_ms, no_partition_added=False)
        return self._prepared(new, answer)

    # ----- completion (after the markers) ---------------------------------------------------
    def complete_txn(self, completion: TxnCompletion, now_ms: int) -> CoordinatorResult[Any]:
        """The markers of `completion` are written: CompleteCommit / CompleteAbort. Nothing is
        written when the transaction is no longer the one prepared (completed already)."""
        meta = self.txns.get(completion.transactional_id)
        expected = S.PREPARE_COMMIT if completion.committed else S.PREPARE_ABORT
        if (meta is None or meta.state is not expected or meta.producer_id != completion.producer_id
                or meta.producer_epoch != completion.producer_epoch):
            return CoordinatorResult(response=meta)
        new = meta.prepare_complete(now_ms)
        return self._apply(new, response=new)

    # ----- timers ---------------------------------------------------------------------------
    def _schedule_abort_timed_out(self) -> None:
        self.timer.schedule(ABORT_TIMED_OUT_KEY, self.config.abort_timed_out_interval_ms,
                            lambda shard, now: shard.abort_timed_out_transactions(now))

    def _schedule_expiration(self) -> None:
        self.timer.schedule(EXPIRE_IDS_KEY, self.config.remove_expired_interval_ms,
                            lambda shard, now: shard.expire_transactional_ids(now))

    def abort_timed_out_transactions(self, now_ms: int) -> CoordinatorResult[Any]:
        """transaction.timeout.ms: an ongoing transaction older than its timeout is fenced and aborted."""
        self._schedule_abort_timed_out()
        records: list[Record] = []
        prepared: list[Callable[[], None]] = []
        for meta in list(self.txns.values()):
            if meta.state is S.ONGOING and meta.txn_start_timestamp + meta.txn_timeout_ms < now_ms:
                log.info("aborting timed out transaction", transactional_id=meta.transactional_id,
                         producer_id=meta.producer_id, timeout_ms=meta.txn_timeout_ms)
                result = self._fence_and_abort(meta, now_ms, lambda m: m)
                records += result.records
                if result.on_durable is not None:
                    prepared.append(result.on_durable)

        def on_durable() -> None:
            for callback in prepared:
                callback()

        return CoordinatorResult(records=records, replay=False, on_durable=on_durable if prepared else None)

    def expire_transactional_ids(self, now_ms: int) -> CoordinatorResult[Any]:
        """transactional.id.expiration.ms: forget ids without a transaction, idle that long."""
        self._schedule_expiration()
        horizon = now_ms - self.config.transactional_id_expiration_ms
        records: list[Record] = []
        for tid, meta in list(self.txns.items()):
            if meta.state.expiration_allowed and meta.txn_last_update_timestamp <= horizon:
                records.append(tombstone(tid))
                del self.txns[tid]
        if records:
            log.info("expired transactional ids", count=len(records))
        return CoordinatorResult(records=records, replay=False)

    # ----- reads ----------------------------------------------------------------------------
    def describe(self, transactional_id: str) -> TransactionMetadata | None:
        meta = self.txns.get(transactional_id)
        return None if meta is None or meta.state is S.DEAD else meta

    def list_transactions(self, states: set[TransactionState], producer_ids: set[int], duration_ms: int,
                          pattern: Any, now_ms: int) -> list[TransactionMetadata]:
        """ListTransactions' filters: states, producer ids, running longer than `duration_ms` (-1:
        any), transactional ids matching `pattern` (a compiled expression or None)."""
        out = []
        for meta in self.txns.values():
            if meta.state is S.DEAD:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if states and meta.state not in states:
                continue
            if duration_ms >= 0 and now_ms - meta.txn_start_timestamp <= duration_ms:
                continue
            if pattern is not None and not pattern.fullmatch(meta.transactional_id):
                continue
            out.append(meta)
        return out


def compile_pattern(pattern: str | None) -> Any:
    """ListTransactions v2's TransactionalIdPattern (a Java regular expression, matched in full);
    None or empty: no filter. RegexError for an invalid expression."""
    if not pattern:
        return None
    return compile_re2(pattern)


def _counter() -> Callable[[], int]:
    """Producer ids for tests: 1000, 1001, ..."""
    state = [999]

    def next_id() -> int:
        state[0] += 1
        return state[0]

    return next_id
