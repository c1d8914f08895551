"""Producer state of one partition: sequence checks, duplicate detection and open transactions.

Kafka keeps, per producer id, its epoch, the metadata of its last five batches, the epoch of the
coordinator that wrote its last marker and the first offset of its open transaction. A produced
batch is a duplicate when it matches one of the remembered batches (the client retried after a
lost response) and is answered with the original offsets; otherwise its first sequence must follow
the last one (OUT_OF_ORDER_SEQUENCE_NUMBER), an older epoch is fenced (INVALID_PRODUCER_EPOCH) and
a producer with a transaction open may only write transactional batches (INVALID_TXN_STATE).

The open transactions, by first offset, give the last stable offset: the first offset of the
oldest open transaction (the high watermark when there is none). A marker (control batch) closes
the producer's transaction; an ABORT marker yields the CompletedTxn that goes to the aborted
transaction index (.txnindex).

The state is rebuilt from the log at startup, from the latest producer snapshot (snapshot.py)
when there is one.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from protocol.errors import ErrorCode, KafkaError
from protocol.records import BatchHeader

NUM_BATCHES_TO_RETAIN = 5
INT_MAX = 2147483647
NO_EPOCH = -1
TV_2 = 2


@dataclass(frozen=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


class CompletedTxn(NamedTuple):
    """A transaction closed by a marker at `last_offset` (Kafka's CompletedTxn)."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass
class ProducerEntry:
    producer_id: int
    epoch: int = NO_EPOCH
    batches: collections.deque[BatchMetadata] = field(
        default_factory=lambda: collections.deque(maxlen=NUM_BATCHES_TO_RETAIN)
    )
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1  # -1: no transaction open in this partition

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    @property
    def in_transaction(self) -> bool:
        return self.current_txn_first_offset >= 0

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches.clear()


def _last_seq(header: BatchHeader) -> int:
    # sequences wrap at INT_MAX like the client's
    seq = header.base_sequence + header.last_offset_delta
    return seq - INT_MAX - 1 if seq > INT_MAX else seq


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT_MAX)


class ProducerStateManager:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # first offset -> producer id of each open transaction; appends start transactions at
        # increasing offsets, so insertion order is offset order (the first key is the oldest)
        self.ongoing: dict[int, int] = {}

    # ----- data batches -------------------------------------------------------------------
    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """Validate a client batch before it is written: the duplicate it repeats, if any."""
        pid = header.producer_id
        if pid < 0:
            return None
        entry = self.producers.get(pid)
        if entry is None:
            return None  # unknown producer (new, or its state was removed): any sequence is accepted
        epoch = header.producer_epoch
        if epoch < entry.epoch:
            raise KafkaError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                "Epoch of producer %d is %d, which is smaller than the last seen epoch %d"
                % (pid, epoch, entry.epoch),
            )
        first_seq = header.base_sequence
        duplicate = entry.find_duplicate(epoch, first_seq, _last_seq(header))
        if duplicate is not None:
            return duplicate
        if epoch != entry.epoch:
            if first_seq != 0 and entry.epoch != NO_EPOCH:
                raise KafkaError(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    "Invalid sequence number for new epoch of producer %d in partition: "
                    "%d (request epoch), %d (seq. number), %d (current producer epoch)"
                    % (pid, epoch, first_seq, entry.epoch),
                )
        elif entry.epoch != NO_EPOCH and not in_sequence(entry.last_seq, first_seq):
            raise KafkaError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                "Out of order sequence number for producer %d in partition: "
                "%d (incoming seq. number), %d (current end sequence number)" % (pid, first_seq, entry.last_seq),
            )
        if entry.in_transaction and not header.is_transactional:
            raise KafkaError(ErrorCode.INVALID_TXN_STATE,
                             "Expected transactional write from producer %d in partition" % pid)
        return None

    def update(self, header: BatchHeader) -> None:
        """Record a data batch written to the log (its header carries the assigned base offset)."""
        pid = header.producer_id
        if pid < 0 or header.is_control:
            return
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerEntry(pid)
        entry.set_epoch(header.producer_epoch)
        if header.base_sequence >= 0:
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence, _last_seq(header), header.base_offset, header.last_offset,
                    header.max_timestamp,
                )
            )
        entry.last_timestamp = header.max_timestamp
        if header.is_transactional and not entry.in_transaction:
            entry.current_txn_first_offset = header.base_offset
            self.ongoing[header.base_offset] = pid

    def has_state(self, producer_id: int) -> bool:
        """Whether batches of the producer are remembered here (Kafka: its entry is not empty)."""
        entry = self.producers.get(producer_id)
        return entry is not None and bool(entry.batches)

    def in_transaction(self, producer_id: int, epoch: int) -> bool:
        """Whether the producer has a transaction open here with this epoch (no verification needed)."""
        entry = self.producers.get(producer_id)
        return entry is not None and entry.in_transaction and entry.epoch == epoch

    # ----- markers ------------------------------------------------------------------------
    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int, transaction_version: int) -> None:
        """A marker the transaction coordinator is about to write: INVALID_PRODUCER_EPOCH for an
        epoch older than the producer's (TV2: not newer, unless it repeats a marker already
        written), TRANSACTION_COORDINATOR_FENCED for an older coordinator."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        current = entry.epoch
        stale = epoch <= current if transaction_version >= TV_2 else epoch < current
        if stale and not (transaction_version >= TV_2 and epoch == current and not entry.in_transaction):
            raise KafkaError(ErrorCode.INVALID_PRODUCER_EPOCH,
                             "marker epoch %d of producer %d is stale (current %d)" % (epoch, producer_id, current))
        if entry.coordinator_epoch > coordinator_epoch:
            raise KafkaError(ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                             "coordinator epoch %d of producer %d is older than %d"
                             % (coordinator_epoch, producer_id, entry.coordinator_epoch))

    def apply_marker(self, producer_id: int, epoch: int, coordinator_epoch: int, offset: int, timestamp: int,
                     aborted: bool) -> CompletedTxn | None:
        """A marker written at `offset`: the producer's transaction here is closed. Returns it
        (None when the producer had none open: the marker changes no offset)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id)
        completed = None
        if entry.in_transaction:
            completed = CompletedTxn(producer_id, entry.current_txn_first_offset, offset, aborted)
            self.ongoing.pop(entry.current_txn_first_offset, None)
        entry.set_epoch(epoch)
        entry.coordinator_epoch = coordinator_epoch
        entry.current_txn_first_offset = -1
        entry.last_timestamp = timestamp
        return completed

    # ----- offsets --------------------------------------------------------------------------
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction, or None."""
        for first in self.ongoing:
            return first
        return None

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The LSO once `completed` is closed (what the aborted-transaction index records): the first
        offset of the oldest other open transaction, else the offset after the marker."""
        for first, pid in self.ongoing.items():
            if pid != completed.producer_id:
                return first
        return completed.last_offset + 1

    # ----- loading ------------------------------------------------------------------------
    def load_entries(self, entries: Iterable[ProducerEntry]) -> None:
        """Start from a snapshot's entries."""
        self.producers.clear()
        self.ongoing.clear()
        for entry in sorted(entries, key=lambda e: e.current_txn_first_offset):
            self.producers[entry.producer_id] = entry
            if entry.in_transaction:
                self.ongoing[entry.current_txn_first_offset] = entry.producer_id

    def clear(self) -> None:
        self.producers.clear()
        self.ongoing.clear()

    def remove_expired(self, now_ms: int, expiration_ms: int) -> None:
        """producer.id.expiration.ms: forget producers idle that long (never one in a transaction)."""
        expired = [pid for pid, e in self.producers.items()
                   if not e.in_transaction and e.last_timestamp >= 0 and now_ms - e.last_timestamp > expiration_ms]
        for pid in expired:
            del self.producers[pid]
