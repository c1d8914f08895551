"""Keyed timers for coordinator shards, on an injected clock.

Shards see the `Timer` protocol: `schedule(key, delay_ms, op)` replaces any timer with the same
key, `cancel(key)` removes it. On expiry the op is submitted to the shard's event queue and runs
as a normal write operation, `(shard, now_ms) -> CoordinatorResult`. An expiry that was already
submitted but is superseded (the key rescheduled or cancelled before the op ran) does nothing.

Clocks: `AsyncioClock` (wall-clock milliseconds, callbacks on the event loop) in production,
`ManualClock` (time moves only when told) in tests.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol

from broker.coordinator.result import CoordinatorResult

Op = Callable[[Any, int], CoordinatorResult[Any]]


class Cancellable(Protocol):
    def cancel(self) -> Any: ...


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def timer_ms(self) -> int:
        """The time call_later counts in (never steps back, unlike the wall clock), in ms."""
        ...

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Cancellable: ...


class Timer(Protocol):
    """What a shard uses to schedule its own future operations."""

    def schedule(self, key: str, delay_ms: int, op: Op) -> None: ...

    def cancel(self, key: str) -> None: ...

    def is_scheduled(self, key: str) -> bool: ...


class AsyncioClock:
    """Wall-clock time in ms (commit timestamps are epoch ms, as in Kafka); loop callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def timer_ms(self) -> int:
        return int(self._running_loop().time() * 1000)

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Cancellable:
        return self._running_loop().call_later(max(delay_ms, 0) / 1000.0, callback)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()  # once: each call costs a getpid() in 3.11
        return self._loop


class _ManualHandle:
    __slots__ = ("callback", "cancelled", "deadline")

    def __init__(self, deadline: int, callback: Callable[[], None]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock for tests: `advance(ms)` moves time and fires due callbacks in deadline order."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms
        self._heap: list[tuple[int, int, _ManualHandle]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        return self._now

    def timer_ms(self) -> int:
        return self._now

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Cancellable:
        handle = _ManualHandle(self._now + max(delay_ms, 0), callback)
        heapq.heappush(self._heap, (handle.deadline, next(self._seq), handle))
        return handle

    def next_deadline(self) -> int | None:
        """The earliest pending deadline, or None."""
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def advance(self, ms: int, on_fire: Callable[[], None] | None = None) -> None:
        """Move time forward by `ms`, firing each due callback at its own deadline; `on_fire`
        runs after each one (tests use it to run the submitted operation before the next timer)."""
        target = self._now + ms
        while True:
            deadline = self.next_deadline()
            if deadline is None or deadline > target:
                break
            _, _, handle = heapq.heappop(self._heap)
            self._now = max(self._now, deadline)
            handle.callback()
            if on_fire is not None:
                on_fire()
        self._now = target


class _Entry:
    __slots__ = ("armed_for", "deadline", "handle", "op")

    def __init__(self, op: Op, deadline: int) -> None:
        self.op = op
        self.deadline = deadline  # when the op is due (the clock's timer_ms)
        self.armed_for = deadline  # the deadline the clock's callback was set for
        self.handle: Cancellable | None = None  # None once fired (then a schedule makes a new entry)


class CoordinatorTimer:
    """Keyed timers of one shard; expiries are handed to `submit` as operations.

    Pushing a timer back (a member's session timer, at every heartbeat) leaves the clock's
    callback as it is: when it fires before the new deadline it sets itself again for the rest,
    so a heartbeat costs no timer cancelled and made anew (most never fire at all)."""

    def __init__(self, clock: Clock, submit: Callable[[Op], None]) -> None:
        self._clock = clock
        self._submit = submit
        self._entries: dict[str, _Entry] = {}

    def schedule(self, key: str, delay_ms: int, op: Op) -> None:
        delay_ms = max(delay_ms, 0)
        deadline = self._clock.timer_ms() + delay_ms
        entry = self._entries.get(key)
        if entry is not None and entry.handle is not None and entry.armed_for <= deadline:
            entry.op, entry.deadline = op, deadline
            return
        self.cancel(key)
        entry = self._entries[key] = _Entry(op, deadline)
        self._arm(key, entry, delay_ms)

    def _arm(self, key: str, entry: _Entry, delay_ms: int) -> None:
        entry.armed_for = entry.deadline
        entry.handle = self._clock.call_later(delay_ms, lambda: self._fire(key, entry))

    def cancel(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None and entry.handle is not None:
            entry.handle.cancel()

    def cancel_all(self) -> None:
        for key in list(self._entries):
            self.cancel(key)

    def is_scheduled(self, key: str) -> bool:
        return key in self._entries

    def keys(self) -> list[str]:
        return list(self._entries)

    def _fire(self, key: str, entry: _Entry) -> None:
        if self._entries.get(key) is not entry:
            return
        early = entry.deadline - self._clock.timer_ms()
        if early > 0:  # pushed back since it was set (or the clock's callback came early)
            self._arm(key, entry, early)
            return
        entry.handle = None

        def run(shard: Any, now_ms: int) -> CoordinatorResult[Any]:
            if self._entries.get(key) is not entry:
                return CoordinatorResult()  # rescheduled or cancelled after it fired
            del self._entries[key]
            return entry.op(shard, now_ms)

        self._submit(run)
