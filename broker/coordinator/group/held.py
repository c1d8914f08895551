"""The book of held heartbeats that KIP-848 and share groups share (consumer_wait.py, share_wait.py).

Heartbeats are held only when a user turns holds on (group.heartbeat.hold.ms; off by default, as
Kafka answers every heartbeat at once). A held heartbeat waits, per group and member, with a
deadline timer (the hold key) and, once its group changed, a timer that looks at it again (the
wake key); each kind of group says how it looks again (`wake`), what its timer keys are and what
a member that is gone is answered.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from broker.coordinator.result import CoordinatorResult, Deferred
from broker.coordinator.timer import Timer
from protocol.errors import ErrorCode

Result = CoordinatorResult[Any]

MAX_LOOKS_AT_ONCE = 8  # looks at one held heartbeat in the same millisecond before it is answered


class _Waiting(Protocol):
    deferred: Deferred[Any]


W = TypeVar("W", bound=_Waiting)


class HeldBook(Generic[W]):
    owner = ""  # the shard attribute whose `waits` this book is ("consumer", "share")

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.waiting: dict[str, dict[str, W]] = {}
        self.told: dict[tuple[str, str], int] = {}  # HeartbeatIntervalMs last given, when not the usual one
        self._looks: dict[tuple[str, str], tuple[int, int]] = {}  # (time, looks at that time)

    # what each kind of group says
    def hold_key(self, group_id: str, member_id: str) -> str:
        raise NotImplementedError

    def wake_key(self, group_id: str, member_id: str) -> str:
        raise NotImplementedError

    def gone_response(self, group_id: str, member_id: str, code: ErrorCode) -> Any:
        raise NotImplementedError

    def wake(self, group_id: str, member_id: str, now: int, final: bool, early: bool = False) -> Result:
        raise NotImplementedError

    # the book
    def park(self, group_id: str, member_id: str, waiting: W, response: Any, hold_ms: int) -> None:
        """Hold the member's heartbeat until `wake` answers it, at the latest after `hold_ms`."""
        previous = self.waiting.setdefault(group_id, {}).pop(member_id, None)
        if previous is not None:  # one request in flight per member; answer a stray one anyway
            previous.deferred.complete(response)
        self.waiting[group_id][member_id] = waiting
        owner = self.owner

        def deadline(shard: Any, now: int) -> Result:
            book: HeldBook[Any] = getattr(shard, owner).waits
            return book.wake(group_id, member_id, now, final=True)

        self.timer.schedule(self.hold_key(group_id, member_id), hold_ms, deadline)

    def group_changed(self, group_id: str, except_member: str | None = None) -> None:
        """Records were written for the group: held members look again (one operation each, so
        that each sees the records of the previous one)."""
        for member_id in self.waiting.get(group_id, {}):
            if member_id != except_member and not self.timer.is_scheduled(self.wake_key(group_id, member_id)):
                self._schedule_wake(group_id, member_id)

    def _schedule_wake(self, group_id: str, member_id: str) -> None:
        owner = self.owner

        def look_again(shard: Any, now: int) -> Result:
            book: HeldBook[Any] = getattr(shard, owner).waits
            return book.wake(group_id, member_id, now, final=False)

        self.timer.schedule(self.wake_key(group_id, member_id), 0, look_again)

    def looked_too_often(self, group_id: str, member_id: str, now: int) -> bool:
        """A backstop: held members that wake each other (a look writing records for the group)
        could look again without end at one instant; past a few looks the heartbeat is answered,
        which is always correct (Kafka answers every heartbeat at once)."""
        last_at, looks = self._looks.get((group_id, member_id), (now, 0))
        looks = looks + 1 if last_at == now else 1
        self._looks[(group_id, member_id)] = (now, looks)
        return looks > MAX_LOOKS_AT_ONCE

    def release(self, group_id: str, member_id: str) -> None:
        """The member's heartbeat is no longer held (it is being answered)."""
        self._looks.pop((group_id, member_id), None)
        members = self.waiting.get(group_id, {})
        members.pop(member_id, None)
        if not members:
            self.waiting.pop(group_id, None)
        self.timer.cancel(self.hold_key(group_id, member_id))
        self.timer.cancel(self.wake_key(group_id, member_id))

    def member_gone(self, group_id: str, member_id: str, code: ErrorCode = ErrorCode.UNKNOWN_MEMBER_ID) -> None:
        self.told.pop((group_id, member_id), None)
        waiting = self.waiting.get(group_id, {}).get(member_id)
        if waiting is not None:
            self.release(group_id, member_id)
            waiting.deferred.complete(self.gone_response(group_id, member_id, code))

    def unload(self) -> None:
        """The shard goes away: held heartbeats are answered NOT_COORDINATOR."""
        for group_id, members in list(self.waiting.items()):
            for member_id in list(members):
                self.member_gone(group_id, member_id, ErrorCode.NOT_COORDINATOR)
