"""The share coordinator shard: the share-partition states of one `__share_group_state` partition.

Follows Kafka's ShareCoordinatorShard. A write of a share-partition's state becomes one record: a
ShareSnapshot the first time and every `share.coordinator.snapshot.update.records.per.snapshot`
updates, a ShareUpdate (only the batches that changed) otherwise. `replay` is the only way the
state changes; snapshots replace, updates combine (state.py).

Writes are fenced like Kafka's: a state epoch or leader epoch lower than the one recorded gets
FENCED_STATE_EPOCH / FENCED_LEADER_EPOCH, a share-partition of a topic or partition that does not
exist gets UNKNOWN_TOPIC_OR_PARTITION.

The share-state RPCs (broker/apis/share_state.py) take Kafka's stricter paths: a write or read of a
share-partition without state is INVALID_REQUEST (`require_state`, `read_for_leader`; the local
persister's write creates the state instead, as our engine initializes it at first load), a read
names its leader's epoch (a newer one is recorded, an older one fenced), `read_summary` answers
defaults for a share-partition without state, and a deletion needs the partition to exist.

Pruning: `snapshot_all` writes a fresh snapshot of every share-partition, after which every record
before it is redundant; the service then moves the log start offset up to where it began.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from broker.coordinator.result import CoordinatorResult, Record
from broker.coordinator.share.records import (
    SHARE_SNAPSHOT,
    SHARE_UPDATE,
    ShareKey,
    parse_record,
    snapshot_record,
    state_batches,
    tombstones,
    update_record,
)
from broker.coordinator.share.state import (
    NO_DELIVERY_COMPLETE_COUNT,
    NO_LEADER_EPOCH,
    UNINITIALIZED_START_OFFSET,
    ShareGroupOffset,
    StateBatch,
    combine_state_batches,
)
from broker.observability.logger import get_logger
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator.share")

E = ErrorCode
Result = CoordinatorResult[Any]
PartitionExists = Callable[[uuid.UUID, int], bool]
# Kafka's ShareCoordinatorShard messages
WRITE_UNINITIALIZED = "Write operation on uninitialized share partition not allowed."
READ_UNINITIALIZED = "Read operation on uninitialized share partition not allowed."
DEFAULT_LEADER_EPOCH = 0  # Kafka's PartitionFactory.DEFAULT_LEADER_EPOCH, ShareGroupOffset.UNINITIALIZED_EPOCH


@dataclasses.dataclass(frozen=True)
class WriteState:
    """One share-partition's write (WriteShareGroupState for one partition); -1 fields: unchanged."""

    key: ShareKey
    state_epoch: int
    leader_epoch: int
    start_offset: int
    delivery_complete_count: int
    batches: tuple[StateBatch, ...]


class ShareCoordinatorShard:
    def __init__(self, snapshot_every: int = 500, partition_exists: PartitionExists | None = None) -> None:
        self.snapshot_every = snapshot_every
        self.partition_exists = partition_exists or (lambda topic_id, partition: True)
        self.states: dict[ShareKey, ShareGroupOffset] = {}
        self.updates_since_snapshot: dict[ShareKey, int] = {}
        self.records_since_prune = 0  # records replayed since the last snapshot_all (or load)

    # ----- replay -------------------------------------------------------------------------
    def replay(self, key: bytes, value: bytes | None) -> None:
        record_type, share_key, v = parse_record(key, value)
        if share_key is None:
            return
        self.records_since_prune += 1
        if record_type == SHARE_SNAPSHOT:
            if v is None:
                self.states.pop(share_key, None)
                self.updates_since_snapshot.pop(share_key, None)
                return
            self.states[share_key] = ShareGroupOffset(
                snapshot_epoch=v.snapshot_epoch, state_epoch=v.state_epoch, leader_epoch=v.leader_epoch,
                start_offset=v.start_offset, delivery_complete_count=v.delivery_complete_count,
                create_timestamp=v.create_timestamp, write_timestamp=v.write_timestamp,
                state_batches=state_batches(v))
            self.updates_since_snapshot[share_key] = 0
        elif record_type == SHARE_UPDATE and v is not None:
            known = self.states.get(share_key)
            if known is None:
                # an update without its snapshot (pruned or lost): take what it says
                known = ShareGroupOffset(snapshot_epoch=v.snapshot_epoch)
            start = known.start_offset if v.start_offset == -1 else v.start_offset
            self.states[share_key] = dataclasses.replace(
                known,
                leader_epoch=known.leader_epoch if v.leader_epoch == -1 else v.leader_epoch,
                start_offset=start,
                delivery_complete_count=(known.delivery_complete_count
                                         if v.delivery_complete_count == NO_DELIVERY_COMPLETE_COUNT
                                         else v.delivery_complete_count),
                state_batches=combine_state_batches(known.state_batches, state_batches(v), start),
            )
            self.updates_since_snapshot[share_key] = self.updates_since_snapshot.get(share_key, 0) + 1

    def on_loaded(self, now_ms: int) -> None:
        self.records_since_prune = 0

    def on_unloaded(self) -> None:
        pass

    # ----- writes -------------------------------------------------------------------------
    def _check_write(self, key: ShareKey, state_epoch: int, leader_epoch: int) -> None:
        known = self.states.get(key)
        if known is not None:
            if leader_epoch != -1 and known.leader_epoch > leader_epoch:
                raise KafkaError(E.FENCED_LEADER_EPOCH)
            if state_epoch != -1 and known.state_epoch > state_epoch:
                raise KafkaError(E.FENCED_STATE_EPOCH)
        self._check_partition(key)

    def _check_partition(self, key: ShareKey) -> None:
        if not self.partition_exists(key[1], key[2]):
            raise KafkaError(E.UNKNOWN_TOPIC_OR_PARTITION)

    def write_state(self, write: WriteState, now: int, require_state: bool = False) -> Result:
        """WriteShareGroupState for one share-partition: a ShareSnapshot or a ShareUpdate
        (`require_state`: Kafka's INVALID_REQUEST for a share-partition without state)."""
        if require_state and write.key not in self.states:
            raise KafkaError(E.INVALID_REQUEST, WRITE_UNINITIALIZED)
        self._check_write(write.key, write.state_epoch, write.leader_epoch)
        known = self.states.get(write.key)
        if known is None:
            record = snapshot_record(write.key, ShareGroupOffset(
                snapshot_epoch=0, state_epoch=max(write.state_epoch, 0), leader_epoch=write.leader_epoch,
                start_offset=write.start_offset, delivery_complete_count=write.delivery_complete_count,
                create_timestamp=now, write_timestamp=now,
                state_batches=combine_state_batches((), write.batches, write.start_offset)))
        elif self.updates_since_snapshot.get(write.key, 0) >= self.snapshot_every:
            start = known.start_offset if write.start_offset == -1 else write.start_offset
            record = snapshot_record(write.key, ShareGroupOffset(
                snapshot_epoch=known.snapshot_epoch + 1,
                state_epoch=known.state_epoch if write.state_epoch == -1 else write.state_epoch,
                leader_epoch=known.leader_epoch if write.leader_epoch == -1 else write.leader_epoch,
                start_offset=start,
                delivery_complete_count=(known.delivery_complete_count
                                         if write.delivery_complete_count == NO_DELIVERY_COMPLETE_COUNT
                                         else write.delivery_complete_count),
                create_timestamp=now, write_timestamp=now,
                state_batches=combine_state_batches(known.state_batches, write.batches, start)))
        else:
            record = update_record(write.key, known.snapshot_epoch, write.leader_epoch, write.start_offset,
                                   write.delivery_complete_count,
                                   combine_state_batches((), write.batches, write.start_offset))
        return CoordinatorResult(records=[record], response=E.NONE)

    def initialize_state(self, key: ShareKey, state_epoch: int, start_offset: int, now: int) -> Result:
        """InitializeShareGroupState: a fresh snapshot at `start_offset` (-1: decided by the first
        reader, from share.auto.offset.reset) under a new state epoch, so earlier writers are fenced."""
        self._check_write(key, state_epoch, NO_LEADER_EPOCH)
        known = self.states.get(key)
        # Kafka records leader epoch 0 for a new share-partition; a known one keeps its epoch,
        # which fences older leaders as Kafka's leader epoch map does
        record = snapshot_record(key, ShareGroupOffset(
            snapshot_epoch=0 if known is None else known.snapshot_epoch + 1, state_epoch=state_epoch,
            leader_epoch=DEFAULT_LEADER_EPOCH if known is None else known.leader_epoch,
            start_offset=start_offset, delivery_complete_count=0 if start_offset >= 0 else NO_DELIVERY_COMPLETE_COUNT,
            create_timestamp=now, write_timestamp=now))
        return CoordinatorResult(records=[record], response=E.NONE)

    def delete_state(self, keys: list[ShareKey], require_partition: bool = False) -> Result:
        """DeleteShareGroupState: tombstones for every share-partition that has state
        (`require_partition`: Kafka's UNKNOWN_TOPIC_OR_PARTITION for a partition not in the metadata)."""
        records: list[Record] = []
        for key in keys:
            if require_partition:
                self._check_partition(key)
            if key in self.states:
                records.extend(tombstones(key))
        return CoordinatorResult(records=records, response=E.NONE)

    def snapshot_all(self, now: int) -> Result:
        """A fresh snapshot of every share-partition (see the module docstring: pruning)."""
        records = [snapshot_record(key, dataclasses.replace(state, snapshot_epoch=state.snapshot_epoch + 1,
                                                            write_timestamp=now))
                   for key, state in self.states.items()]
        return CoordinatorResult(records=records, response=len(records))

    def read_for_leader(self, key: ShareKey, leader_epoch: int, now: int) -> Result:
        """ReadShareGroupState for one share-partition (Kafka's readStateAndMaybeUpdateLeaderEpoch):
        its state, read by the leader of `leader_epoch`; a newer epoch than the one recorded is
        written (an update without batches), so that writes of older leaders are fenced."""
        known = self.states.get(key)
        if known is None:
            raise KafkaError(E.INVALID_REQUEST, READ_UNINITIALIZED)
        if known.leader_epoch > leader_epoch:
            raise KafkaError(E.FENCED_LEADER_EPOCH)
        self._check_partition(key)
        if leader_epoch == NO_LEADER_EPOCH or leader_epoch == known.leader_epoch:
            return CoordinatorResult(records=[], response=known)
        epoch_only = WriteState(key, -1, leader_epoch, UNINITIALIZED_START_OFFSET, NO_DELIVERY_COMPLETE_COUNT, ())
        return CoordinatorResult(records=self.write_state(epoch_only, now).records, response=known)

    # ----- reads --------------------------------------------------------------------------
    def read_state(self, key: ShareKey) -> ShareGroupOffset | None:
        return self.states.get(key)

    def read_summary(self, key: ShareKey) -> ShareGroupOffset:
        """ReadShareGroupStateSummary for one share-partition: Kafka's defaults (start offset and
        delivery-complete count -1, epochs 0) when it has no state."""
        self._check_partition(key)
        return self.states.get(key) or ShareGroupOffset(state_epoch=0, leader_epoch=DEFAULT_LEADER_EPOCH)


__all__ = ["UNINITIALIZED_START_OFFSET", "ShareCoordinatorShard", "WriteState"]
