"""Record states of a share-partition and the in-flight batches that hold them (Kafka's RecordState,
InFlightState and InFlightBatch).

A record is AVAILABLE (may be acquired), ACQUIRED (leased to one member until its lock deadline),
ACKNOWLEDGED (done), ARCHIVING (on its way to the dead-letter queue) or ARCHIVED (done without
being processed). The legal transitions are the table `TRANSITIONS`.

An in-flight batch is a range of offsets that share one state until a request touches only part of
it; then it keeps one state per offset from then on (Kafka's offset state map). A state change that
must be made durable first is a *pending transition*: the state shows where it is going, the
previous state is kept to roll back to, and nothing else may touch the record until it is
completed (persist, then commit).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RecordState(enum.IntEnum):
    """Kafka's delivery states; the values are what ShareSnapshot/ShareUpdate records store."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVING = 3
    ARCHIVED = 4

    @property
    def terminal(self) -> bool:
        return self in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


S = RecordState

TRANSITIONS: dict[RecordState, frozenset[RecordState]] = {
    S.AVAILABLE: frozenset([S.ACQUIRED, S.ARCHIVED]),  # ARCHIVED: the log start moved past it
    S.ACQUIRED: frozenset([S.AVAILABLE, S.ACKNOWLEDGED, S.ARCHIVING, S.ARCHIVED]),
    S.ARCHIVING: frozenset([S.ARCHIVED]),  # written to the dead-letter queue (or given up on)
    S.ACKNOWLEDGED: frozenset(),
    S.ARCHIVED: frozenset(),
}

NO_MEMBER = ""


class InvalidTransition(Exception):
    pass


@dataclass(slots=True)
class Previous:
    """What a pending transition rolls back to."""

    state: RecordState
    delivery_count: int
    member_id: str
    deadline: int | None


@dataclass(slots=True)
class InFlightState:
    state: RecordState
    delivery_count: int
    member_id: str = NO_MEMBER
    deadline: int | None = None  # acquisition lock deadline (ms), while ACQUIRED
    pending: Previous | None = None  # a transition waiting to be made durable

    def move(self, new: RecordState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise InvalidTransition("%s -> %s" % (self.state.name, new.name))
        self.state = new

    def start(self, new: RecordState, delivery_count: int, member_id: str = NO_MEMBER) -> None:
        """Begin a transition to be made durable: `complete` ends it."""
        previous = Previous(self.state, self.delivery_count, self.member_id, self.deadline)
        self.move(new)
        self.delivery_count = delivery_count
        self.member_id = member_id
        self.pending = previous

    def complete(self, commit: bool) -> None:
        """End the pending transition: keep the new state, or roll back to the previous one
        exactly (an expired lock is then expired again, durably, by the usual path)."""
        previous, self.pending = self.pending, None
        if previous is None:
            return
        if commit:
            self.deadline = None
            return
        self.state, self.delivery_count = previous.state, previous.delivery_count
        self.member_id, self.deadline = previous.member_id, previous.deadline

    def copy(self) -> InFlightState:
        return InFlightState(self.state, self.delivery_count, self.member_id, self.deadline, None)


class InFlightBatch:
    """Offsets first..last with one state (`whole`), or one per offset (`offsets`) once split."""

    __slots__ = ("first", "last", "whole", "offsets")

    def __init__(self, first: int, last: int, state: InFlightState) -> None:
        self.first = first
        self.last = last
        self.whole: InFlightState | None = state
        self.offsets: dict[int, InFlightState] | None = None

    def __repr__(self) -> str:
        if self.offsets is None:
            return "InFlightBatch(%d-%d %r)" % (self.first, self.last, self.whole)
        return "InFlightBatch(%d-%d per offset)" % (self.first, self.last)

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def split(self) -> dict[int, InFlightState]:
        """Track the batch per offset from now on."""
        if self.offsets is None:
            whole = self.whole
            assert whole is not None and whole.pending is None, "a batch is split only between transitions"
            self.offsets = {offset: whole.copy() for offset in range(self.first, self.last + 1)}
            self.whole = None
        return self.offsets

    def split_if_available(self) -> bool:
        """Per-offset states for a batch still tracked whole only when it is AVAILABLE and in no
        transition; False when it is not (nothing in it may be acquired or archived now)."""
        if self.offsets is None:
            whole = self.whole
            assert whole is not None
            if whole.state is not S.AVAILABLE or whole.pending is not None:
                return False
            self.split()
        return True

    def states(self) -> list[tuple[int, int, InFlightState]]:
        """(first, last, state) pieces: the whole batch, or one piece per offset."""
        if self.offsets is None:
            assert self.whole is not None
            return [(self.first, self.last, self.whole)]
        return [(o, o, s) for o, s in self.offsets.items()]

    def state_at(self, offset: int) -> InFlightState:
        if self.offsets is None:
            assert self.whole is not None
            return self.whole
        return self.offsets[offset]
