"""Idempotent producer state of one partition: sequence checks and duplicate detection.

Kafka keeps, per producer id, its epoch and the metadata of its last five batches. A produced
batch is a duplicate when it matches one of them (the client retried after a lost response) and
is answered with the original offsets; otherwise its first sequence must follow the last one
(OUT_OF_ORDER_SEQUENCE_NUMBER), and an older epoch is fenced (INVALID_PRODUCER_EPOCH).
The state is rebuilt from the batch headers of the log at startup.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol.errors import ErrorCode, KafkaError
from protocol.records import BatchHeader

NUM_BATCHES_TO_RETAIN = 5
INT_MAX = 2147483647
NO_EPOCH = -1


@dataclass(frozen=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass
class ProducerEntry:
    producer_id: int
    epoch: int = NO_EPOCH
    batches: collections.deque[BatchMetadata] = field(
        default_factory=lambda: collections.deque(maxlen=NUM_BATCHES_TO_RETAIN)
    )
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


def _last_seq(header: BatchHeader) -> int:
    # sequences wrap at INT_MAX like the client's
    seq = header.base_sequence + header.last_offset_delta
    return seq - INT_MAX - 1 if seq > INT_MAX else seq


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT_MAX)


class ProducerStateManager:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

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
        return None

    def update(self, header: BatchHeader) -> None:
        """Record a batch written to the log (its header carries the assigned base offset)."""
        pid = header.producer_id
        if pid < 0 or header.is_control:
            return
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerEntry(pid)
        if header.producer_epoch != entry.epoch:
            entry.epoch = header.producer_epoch
            entry.batches.clear()
        if header.base_sequence >= 0:
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence, _last_seq(header), header.base_offset, header.last_offset,
                    header.max_timestamp,
                )
            )
        entry.last_timestamp = header.max_timestamp

    def rebuild(self, headers: Iterable[BatchHeader]) -> None:
        self.producers.clear()
        for header in headers:
            self.update(header)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> None:
        """producer.id.expiration.ms: forget producers idle that long."""
        expired = [pid for pid, e in self.producers.items() if e.last_timestamp >= 0 and now_ms - e.last_timestamp > expiration_ms]
        for pid in expired:
            del self.producers[pid]
