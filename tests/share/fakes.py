"""An in-memory log partition for the share-partition manager's tests: batches of 10 records,
reads and append waiters recorded."""

from __future__ import annotations

import asyncio
from typing import Any

from protocol.records import build_batch

VALUE = b"x" * 100


class Read:
    def __init__(self, records: Any, next_offset: int = -1) -> None:
        self.records = records
        self.next_offset = next_offset


class LogPartition:
    """A partition of `batches` batches of 10 records of `value` (more come with `append`)."""

    leader_epoch = 0
    is_leader = True
    deleted = False
    log_start_offset = 0

    def __init__(self, batches: int = 0, value: bytes = VALUE) -> None:
        self.value = value
        self.batches: list[bytes] = []
        self.reads: list[int] = []
        self.waiters: set[asyncio.Future[None]] = set()
        self.append(batches)

    @property
    def high_watermark(self) -> int:
        return 10 * len(self.batches)

    def append(self, batches: int) -> None:
        for _ in range(batches):
            self.batches.append(build_batch([(None, self.value)] * 10, base_offset=10 * len(self.batches)))
        for w in self.waiters:
            if not w.done():
                w.set_result(None)

    def fetch_bound(self, isolation_level: int) -> int:
        return self.high_watermark

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[Any]:
        return []

    def read(self, offset: int, max_bytes: int, isolation_level: int, min_one_message: bool = True) -> Read:
        """Whole batches from `offset`'s, within max_bytes (the first whatever its size when
        min_one_message)."""
        self.reads.append(max_bytes)
        out, end = b"", offset // 10
        for b in self.batches[offset // 10:]:
            if len(out) + len(b) > max_bytes and (out or not min_one_message):
                break
            out += b
            end += 1
        return Read(out, 10 * end if out else -1)

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        self.waiters.add(waiter)

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self.waiters.discard(waiter)
