"""The leader epoch cache of a partition: (epoch, start offset) pairs, persisted in
`leader-epoch-checkpoint` (Kafka's LeaderEpochFileCache semantics, without the async flush)."""

from __future__ import annotations

import os

from broker.log.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    CheckpointError,
    read_leader_epochs,
    write_leader_epochs,
)

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    __slots__ = ("path", "entries", "_written")

    def __init__(self, directory: str, entries: list[tuple[int, int]] | None = None) -> None:
        self.path = os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
        self.entries: list[tuple[int, int]] = list(entries or [])
        self._written: list[tuple[int, int]] | None = None  # what the file holds, when known

    @classmethod
    def load(cls, directory: str, exists: bool | None = None) -> LeaderEpochCache:
        """The cache of the checkpoint in `directory`; `exists`: whether the file exists, when the
        caller knows (the loader lists the directory)."""
        entries: list[tuple[int, int]] = []
        if exists is not False:
            try:
                entries = read_leader_epochs(os.path.join(directory, LEADER_EPOCH_CHECKPOINT))
            except CheckpointError:
                pass  # rebuilt from the batches' epochs by recovery when needed
        cache = cls(directory, sorted(entries))
        cache._written = list(cache.entries)
        return cache

    def write(self) -> None:
        if os.path.isdir(os.path.dirname(self.path)):
            write_leader_epochs(self.path, self.entries)
            self._written = list(self.entries)

    @property
    def pending(self) -> bool:
        """Whether the file lags the entries: recovery changed them (see `recovered`)."""
        return self._written is not None and self.entries != self._written

    def recovered(self) -> None:
        """After recovery: the file is written at the log's next flush (`write_pending`), not now.
        What recovery derives from batches past the recovery point it derives again after
        another crash, as long as the recovery point has not moved past them (a start-up after a
        crash would otherwise create a new file per partition; Kafka too writes the truncations
        of recovery later, in the background)."""
        if self._written is None:
            self._written = []

    def write_pending(self) -> None:
        if self.pending:
            self.write()

    @property
    def latest_epoch(self) -> int | None:
        return self.entries[-1][0] if self.entries else None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`; True when the cache changed."""
        if epoch < 0 or start_offset < 0:
            return False
        if self.entries:
            last_epoch, last_start = self.entries[-1]
            if epoch == last_epoch and start_offset >= last_start:
                return False
        # Drop entries that would break monotonicity (newer or equal epochs, or later start offsets).
        while self.entries and (self.entries[-1][0] >= epoch or self.entries[-1][1] >= start_offset):
            self.entries.pop()
        self.entries.append((epoch, start_offset))
        return True

    def epoch_for_offset(self, offset: int) -> int | None:
        previous = None
        for epoch, start in self.entries:
            if start == offset:
                return epoch
            if start > offset:
                return previous
            previous = epoch
        return previous

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (epoch, end offset) as Kafka's endOffsetFor answers."""
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if self.entries and self.entries[-1][0] == requested_epoch:
            return requested_epoch, log_end_offset
        higher = next(((e, s) for e, s in self.entries if e > requested_epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        floor = [(e, s) for e, s in self.entries if e <= requested_epoch]
        if not floor:
            return requested_epoch, higher[1]
        return floor[-1][0], higher[1]

    def truncate_from_end(self, end_offset: int) -> bool:
        """Forget epochs starting at or after `end_offset` (the log was truncated there)."""
        before = len(self.entries)
        while self.entries and self.entries[-1][1] >= end_offset:
            self.entries.pop()
        return len(self.entries) != before

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at `start_offset`: keep the epoch covering it, starting there."""
        removed = [(e, s) for e, s in self.entries if s <= start_offset]
        if not removed:
            return False
        kept = [(e, s) for e, s in self.entries if s > start_offset]
        first = (removed[-1][0], start_offset)
        changed = removed != [first]
        self.entries = [first, *kept]
        return changed

    def clear(self) -> None:
        self.entries = []
