"""The durable state of one share-partition, as the share coordinator keeps it.

A share-partition's state is its start offset (SPSO), state epoch, leader epoch, delivery-complete
count (KIP-1226) and a list of non-overlapping state batches: offset ranges with a delivery state
and a delivery count. Offsets below the start offset are done with; offsets at or after it that no
batch covers have never been delivered.

`combine_state_batches` merges a newer write into what is known (Kafka's
PersisterStateBatchCombiner): batches below the start offset are pruned, and where batches overlap
the one further along wins, by delivery count first, then by delivery state (the states only move
forward: AVAILABLE 0 < ACKNOWLEDGED 2 < ARCHIVING 3 < ARCHIVED 4).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

UNINITIALIZED_START_OFFSET = -1
DEFAULT_STATE_EPOCH = 0
NO_LEADER_EPOCH = -1
NO_DELIVERY_COMPLETE_COUNT = -1  # a write that does not know it (older writers)


class StateBatch(NamedTuple):
    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int

    def rank(self) -> tuple[int, int]:
        return self.delivery_count, self.delivery_state


@dataclass(frozen=True)
class ShareGroupOffset:
    """What ShareSnapshot and ShareUpdate records describe, combined."""

    snapshot_epoch: int = 0
    state_epoch: int = DEFAULT_STATE_EPOCH
    leader_epoch: int = NO_LEADER_EPOCH
    start_offset: int = UNINITIALIZED_START_OFFSET
    delivery_complete_count: int = NO_DELIVERY_COMPLETE_COUNT
    create_timestamp: int = -1
    write_timestamp: int = -1
    state_batches: tuple[StateBatch, ...] = field(default_factory=tuple)


def _prune(batches: Iterable[StateBatch], start_offset: int) -> list[StateBatch]:
    if start_offset < 0:
        return list(batches)
    out = []
    for b in batches:
        if b.last_offset < start_offset:
            continue
        out.append(b if b.first_offset >= start_offset else b._replace(first_offset=start_offset))
    return out


def combine_state_batches(known: Sequence[StateBatch], new: Sequence[StateBatch],
                          start_offset: int) -> tuple[StateBatch, ...]:
    """`known` and `new` merged into sorted, non-overlapping batches, adjacent equal ones joined."""
    batches = _prune([*known, *new], start_offset)
    if len(batches) < 2:
        return tuple(batches)
    # Cut the offsets at every batch boundary; each piece takes the highest-ranked batch over it.
    cuts = sorted({b.first_offset for b in batches} | {b.last_offset + 1 for b in batches})
    batches.sort(key=lambda b: b.first_offset)
    out: list[StateBatch] = []
    active: list[StateBatch] = []
    i = 0
    for lo, hi in zip(cuts, cuts[1:]):
        while i < len(batches) and batches[i].first_offset <= lo:
            active.append(batches[i])
            i += 1
        active = [b for b in active if b.last_offset >= lo]
        if not active:
            continue
        best = max(active, key=StateBatch.rank)
        piece = StateBatch(lo, hi - 1, best.delivery_state, best.delivery_count)
        if out and out[-1].last_offset + 1 == lo and out[-1].rank() == piece.rank():
            out[-1] = out[-1]._replace(last_offset=hi - 1)
        else:
            out.append(piece)
    return tuple(out)
