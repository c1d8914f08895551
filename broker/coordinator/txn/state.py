"""A transactional id's state: Kafka's TransactionState, its legal transitions as data, and
TransactionMetadata with the transitions the coordinator makes (TransactionMetadata.prepare*).

Every transition returns a new, immutable TransactionMetadata; `transition` checks it against
TRANSITIONS (Kafka's validPreviousStates) and raises IllegalTransition otherwise. What is persisted
is what `__transaction_state` holds (records.py); `last_producer_epoch` is kept in memory only and
is -1 after a load, as in Kafka.

Transaction versions (KIP-890): TV_0/TV_1 clients keep their epoch through a transaction; TV_2
clients get a new epoch at every EndTxn (the prepare step bumps it, and the markers carry it).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from protocol.errors import ErrorCode, KafkaError

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
SHORT_MAX = 32767

TV_0 = 0  # no transaction.version feature: Kafka's original protocol
TV_1 = 1  # flexible __transaction_state values
TV_2 = 2  # KIP-890 part 2: epoch bump on every EndTxn, implicit AddPartitions on produce


class TransactionState(enum.Enum):
    """Kafka's states; the value is the id persisted in TransactionLogValue.TransactionStatus."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions report."""
        return _NAMES[self]

    @classmethod
    def from_name(cls, name: str) -> TransactionState | None:
        return _BY_NAME.get(name)

    @property
    def expiration_allowed(self) -> bool:
        return self in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)

    @property
    def is_prepare(self) -> bool:
        return self in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)


S = TransactionState
_NAMES = {
    S.EMPTY: "Empty", S.ONGOING: "Ongoing", S.PREPARE_COMMIT: "PrepareCommit", S.PREPARE_ABORT: "PrepareAbort",
    S.COMPLETE_COMMIT: "CompleteCommit", S.COMPLETE_ABORT: "CompleteAbort", S.DEAD: "Dead",
    S.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_NAME = {name: state for state, name in _NAMES.items()}

# The legal transitions: target state -> the states it may be entered from (Kafka's validPreviousStates;
# transactions v2 may abort from Empty and the Complete states, when the client is unsure).
TRANSITIONS: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset([S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT]),
    S.ONGOING: frozenset([S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT]),
    S.PREPARE_COMMIT: frozenset([S.ONGOING]),
    S.PREPARE_ABORT: frozenset([S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT]),
    S.COMPLETE_COMMIT: frozenset([S.PREPARE_COMMIT]),
    S.COMPLETE_ABORT: frozenset([S.PREPARE_ABORT]),
    S.DEAD: frozenset([S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT]),
    S.PREPARE_EPOCH_FENCE: frozenset([S.ONGOING]),
}

TopicPartition = tuple[str, int]


class IllegalTransition(Exception):
    """A transition the table forbids: a bug, answered with UNKNOWN_SERVER_ERROR."""


def is_epoch_exhausted(epoch: int) -> bool:
    return epoch >= SHORT_MAX - 1


@dataclass(frozen=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    prev_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH  # in memory only
    txn_timeout_ms: int = 60000
    state: TransactionState = TransactionState.EMPTY
    partitions: frozenset[TopicPartition] = frozenset()
    txn_start_timestamp: int = -1
    txn_last_update_timestamp: int = -1
    client_transaction_version: int = TV_0

    @property
    def supports_epoch_bump(self) -> bool:
        return self.client_transaction_version >= TV_2

    @property
    def epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    @property
    def has_pending_transaction(self) -> bool:
        return self.state in (S.ONGOING, S.PREPARE_ABORT, S.PREPARE_COMMIT)

    def transition(self, state: TransactionState, **changes: object) -> TransactionMetadata:
        """The metadata in `state`, with `changes`; IllegalTransition unless the table allows it."""
        if self.state not in TRANSITIONS[state]:
            raise IllegalTransition("transactional id %r: %s -> %s is not a legal transition"
                                    % (self.transactional_id, self.state.kafka_name, state.kafka_name))
        # as Kafka's TxnTransitMetadata: the previous producer id is the one before every transition
        new = dataclasses.replace(self, state=state, prev_producer_id=self.producer_id, **changes)  # type: ignore[arg-type]
        if new.producer_id < 0 or (state is not S.DEAD and new.producer_epoch < 0):
            raise IllegalTransition("illegal producer id/epoch %d/%d for %r"
                                    % (new.producer_id, new.producer_epoch, self.transactional_id))
        return new

    # ----- the transitions Kafka's TransactionMetadata prepares ---------------------------------
    def prepare_increment_producer_epoch(self, timeout_ms: int, expected_epoch: int | None,
                                         now_ms: int) -> TransactionMetadata:
        """InitProducerId on a transactional id without a transaction in progress."""
        if self.epoch_exhausted:
            raise IllegalTransition("cannot allocate more producer epochs for producer id %d" % self.producer_id)
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            # a new producer, or one recovering after an error with nobody else initialised since
            epoch, last = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            # a retry of a call that succeeded: the epoch it got, unchanged
            epoch, last = self.producer_epoch, self.last_producer_epoch
        else:
            raise KafkaError(ErrorCode.PRODUCER_FENCED)
        return self.transition(S.EMPTY, producer_epoch=epoch, last_producer_epoch=last, txn_timeout_ms=timeout_ms,
                               partitions=frozenset(), txn_start_timestamp=-1, txn_last_update_timestamp=now_ms)

    def prepare_producer_id_rotation(self, new_producer_id: int, timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TransactionMetadata:
        """InitProducerId when the epochs of the producer id are used up: a new producer id."""
        if self.has_pending_transaction:
            raise IllegalTransition("cannot rotate producer ids while a transaction is pending")
        return self.transition(
            S.EMPTY, producer_id=new_producer_id, producer_epoch=0,
            last_producer_epoch=self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
            txn_timeout_ms=timeout_ms, partitions=frozenset(), txn_start_timestamp=-1,
            txn_last_update_timestamp=now_ms)

    def prepare_add_partitions(self, added: frozenset[TopicPartition] | set[TopicPartition], now_ms: int,
                               client_transaction_version: int) -> TransactionMetadata:
        starts = self.state in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT)
        return self.transition(
            S.ONGOING, partitions=self.partitions | frozenset(added),
            txn_start_timestamp=now_ms if starts else self.txn_start_timestamp, txn_last_update_timestamp=now_ms,
            client_transaction_version=client_transaction_version)

    def prepare_abort_or_commit(self, state: TransactionState, client_transaction_version: int,
                                next_producer_id: int, now_ms: int, no_partition_added: bool) -> TransactionMetadata:
        """EndTxn (or a fence): PrepareCommit / PrepareAbort. Transactions v2 bump the epoch here."""
        epoch, last = self.producer_epoch, self.last_producer_epoch
        if client_transaction_version >= TV_2:
            if not (self.producer_epoch == SHORT_MAX and state is S.PREPARE_ABORT):
                epoch = self.producer_epoch + 1  # never past SHORT_MAX: the callers see to it
            last = self.producer_epoch
        return self.transition(
            state, producer_epoch=epoch, last_producer_epoch=last, next_producer_id=next_producer_id,
            txn_start_timestamp=now_ms if no_partition_added else self.txn_start_timestamp,
            txn_last_update_timestamp=now_ms, client_transaction_version=client_transaction_version)

    def prepare_complete(self, now_ms: int) -> TransactionMetadata:
        """The markers are written: CompleteCommit / CompleteAbort (v2: the new producer id of an
        epoch overflow takes over here)."""
        state = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        producer_id, epoch = self.producer_id, self.producer_epoch
        if self.supports_epoch_bump and self.next_producer_id != NO_PRODUCER_ID:
            producer_id, epoch = self.next_producer_id, 0
        return self.transition(state, producer_id=producer_id, producer_epoch=epoch, next_producer_id=NO_PRODUCER_ID,
                               partitions=frozenset(), txn_last_update_timestamp=now_ms)

    def fenced(self) -> TransactionMetadata:
        """PrepareEpochFence's effect (never persisted): the epoch bumped past the producer's, so
        that the abort that follows fences it; the last epoch is forgotten."""
        if self.state is not S.ONGOING:
            raise IllegalTransition("only an ongoing transaction is fenced")
        epoch = self.producer_epoch if self.producer_epoch == SHORT_MAX else self.producer_epoch + 1
        return dataclasses.replace(self, producer_epoch=epoch, last_producer_epoch=NO_PRODUCER_EPOCH)

    def describe_partitions(self) -> dict[str, list[int]]:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(self.partitions):
            by_topic.setdefault(topic, []).append(partition)
        return by_topic
