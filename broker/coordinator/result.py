"""What a coordinator operation returns, and the response that some operations complete later.

An operation is a plain function `(shard, now_ms) -> CoordinatorResult`. Its records are
replayed into the shard (unless `replay` is False), appended to the partition's log, and only
when the append is durable is `on_durable` called and the response released.

A response that must wait for other operations (JoinGroup parks until the rebalance completes,
SyncGroup until the leader's assignment is stored) is a `Deferred`: a one-shot result holder
with no event loop attached, so handlers stay plain functions and tests need no loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")

Record = tuple[bytes, bytes | None]
"""A record of an internal topic: (key, value); a None value is a tombstone."""


class TransactionalRecord(NamedTuple):
    """A record a transactional producer wrote through the coordinator (TxnOffsetCommit), as the
    partition's log gives it back when loading."""

    producer_id: int
    key: bytes
    value: bytes | None


class TxnMarker(NamedTuple):
    """A transaction marker (COMMIT or ABORT control batch) in a coordinator's log."""

    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int = 0


LoggedItem = Record | list[Record] | TransactionalRecord | TxnMarker
"""What loading a coordinator's log gives, in log order; a list is a batch of plain records."""


class Deferred(Generic[T]):
    """A response completed later by another operation; the first completion wins."""

    __slots__ = ("_callbacks", "_done", "_result")

    def __init__(self) -> None:
        self._done = False
        self._result: Any = None
        self._callbacks: list[Callable[[T], None]] = []

    @classmethod
    def completed(cls, value: T) -> Deferred[T]:
        d: Deferred[T] = cls()
        d.complete(value)
        return d

    def done(self) -> bool:
        return self._done

    def result(self) -> T:
        if not self._done:
            raise RuntimeError("deferred response is not complete")
        return self._result  # type: ignore[no-any-return]

    def complete(self, value: T) -> bool:
        """Complete with `value`; False (and no effect) if it was already complete."""
        if self._done:
            return False
        self._done = True
        self._result = value
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(value)
        return True

    def add_done_callback(self, cb: Callable[[T], None]) -> None:
        if self._done:
            cb(self._result)
        else:
            self._callbacks.append(cb)

    async def wait(self) -> T:
        """Await completion (on the running event loop)."""
        if self._done:
            return self._result  # type: ignore[no-any-return]
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def resolve(value: T) -> None:
            if not fut.done():
                fut.set_result(value)

        self.add_done_callback(resolve)
        return await fut

    def __repr__(self) -> str:
        return "Deferred(%r)" % (self._result,) if self._done else "Deferred(<pending>)"


@dataclass
class CoordinatorResult(Generic[T]):
    """Records to make durable and the response to release once they are.

    replay: replay the records into the shard before appending them. The classic group keeps
        its live state in memory and writes GroupMetadata records as snapshots of it (as Kafka
        does), so those results set replay=False: their records are replayed only when loading.
    on_durable: called (on the shard's task) after the append succeeded, before the response is
        released; e.g. SyncGroup moves the group to Stable only once its assignment is stored.
    producer: (producer id, epoch) of a transactional producer: the records are written as its
        transactional batch (TxnOffsetCommit), to be committed or aborted by a marker.
    marker: a transaction marker to write (after the records, if any).
    """

    records: list[Record] = field(default_factory=list)
    response: T | Deferred[T] | None = None
    replay: bool = True
    on_durable: Callable[[], None] | None = None
    producer: tuple[int, int] | None = None
    marker: TxnMarker | None = None

