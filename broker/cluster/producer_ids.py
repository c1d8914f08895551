"""Producer ids in cluster mode: blocks of ids from the active controller (AllocateProducerIds),
as Kafka's RPCProducerIdManager takes them.

The controller hands out consecutive blocks (a ProducerIdsRecord in the metadata log keeps the
next free id, so no id is given twice, also across controllers). A node asks for the next block
once 90 % of its current one is used, so that InitProducerId rarely waits; with none at hand it
answers COORDINATOR_LOAD_IN_PROGRESS (the clients retry), as Kafka does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from broker.observability.logger import get_logger
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.cluster")

PREFETCH_AT = 0.9


class ProducerIdBlocks:
    def __init__(self, fetch: Callable[[], Awaitable[tuple[int, int]]]) -> None:
        self.fetch = fetch  # (first id, count) of a new block
        self._next = 0
        self._end = 0  # the current block is [next, end)
        self._size = 0
        self._waiting: tuple[int, int] | None = None  # a block fetched ahead
        self._task: asyncio.Task[None] | None = None

    def next_id(self) -> int:
        if self._next >= self._end and self._waiting is not None:
            (self._next, self._size), self._waiting = self._waiting, None
            self._end = self._next + self._size
        if self._next >= self._end:
            self._prefetch()
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "Producer ids are being allocated.")
        pid = self._next
        self._next += 1
        if self._waiting is None and self._end - self._next <= self._size * (1 - PREFETCH_AT):
            self._prefetch()
        return pid

    def _prefetch(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._take(), name="producer-id-block")

    async def _take(self) -> None:
        try:
            self._waiting = await self.fetch()
        except KafkaError as exc:
            log.warning("no producer id block", error=exc.message)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
