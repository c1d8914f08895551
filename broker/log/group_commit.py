"""Group commit: many appenders wait for one fsync.

The log's `flush()` is blocking; this helper runs it in a worker thread (asyncio.to_thread) and
lets every waiter whose data was written before the fsync started share it. Appenders that
arrive while an fsync is running wait for the next one, which then covers all of them: with
`flush.messages=1` a burst of N concurrent produce requests costs two fsyncs, not N.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class GroupCommit:
    """`await commit(end_offset)` returns once `flush()` has made every offset below it durable.

    `flush` is the log's blocking flush: it syncs everything written so far and returns the new
    recovery point (the first offset not yet durable). Exceptions propagate to every waiter of
    that round; the next waiter starts a new round.
    """

    __slots__ = ("_flush", "durable", "_round", "_round_id", "rounds")

    def __init__(self, flush: Callable[[], int], durable: int = 0) -> None:
        self._flush = flush
        self.durable = durable
        self._round: asyncio.Future[int] | None = None
        self._round_id = 0
        self.rounds = 0  # fsyncs started (for tests and metrics)

    async def commit(self, end_offset: int) -> int:
        """Wait until offsets below `end_offset` are durable; returns the durable offset.

        `end_offset` must not exceed what was written before the call (the append's next offset).
        """
        fresh = self.rounds + 1  # rounds numbered >= this started after our data was written
        while self.durable < end_offset:
            if self._round is None:
                self.rounds += 1
                self._round_id = self.rounds
                self._round = asyncio.ensure_future(self._run())
            round_id, current = self._round_id, self._round
            # shield: a cancelled waiter must not cancel the fsync others wait on.
            await asyncio.shield(current)
            if round_id >= fresh and self.durable < end_offset:
                raise ValueError(f"offset {end_offset} was not written before commit() was called")
        return self.durable

    async def idle(self) -> None:
        """Until no fsync is running (none starts before the caller's next await)."""
        while self._round is not None:
            await asyncio.shield(self._round)

    def retarget(self, flush: Callable[[], int], durable: int) -> None:
        """Flush another log from now on (the partition moved to another log dir); call when idle."""
        self._flush = flush
        self.durable = durable

    def reset(self, durable: int) -> None:
        """After the log was truncated (the recovery point went down), forget the old high mark."""
        self.durable = durable

    async def _run(self) -> int:
        try:
            durable = await asyncio.to_thread(self._flush)
            self.durable = max(self.durable, durable)
            return self.durable
        finally:
            self._round = None
