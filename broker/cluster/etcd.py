"""What the broker needs from etcd, as a narrow interface: KV ranges, puts and deletes,
transactions with compares, leases, prefix watches resumable from a revision, compaction.

Two implementations have the same semantics: `broker.cluster.etcd_http.HttpEtcd` (a real
etcd, over its v3 JSON gateway) and `broker.cluster.etcd_fake.FakeEtcd` (in memory, for fast
unit tests). Errors are two kinds a caller acts on: `EtcdUnavailable` (etcd unreachable, no
leader, timed out: retry later; the outcome of a write that failed so is unknown) and
`EtcdCompacted` (a revision asked for is gone: read the current state again). A lease that
expired is `LeaseNotFound`. Anything else is an `EtcdError` (a bug or a misconfiguration).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar


class EtcdError(Exception):
    """etcd refused a request for a reason retrying will not fix."""


class EtcdUnavailable(EtcdError):
    """etcd cannot be reached or cannot answer now (retriable); a write's outcome is unknown."""


class EtcdCompacted(EtcdError):
    """The revision asked for was compacted away; `compact_revision` is the oldest one kept."""

    def __init__(self, compact_revision: int, message: str = "") -> None:
        super().__init__(message or "revision compacted (oldest kept: %d)" % compact_revision)
        self.compact_revision = compact_revision


class LeaseNotFound(EtcdError):
    """The lease expired or was revoked (its keys are gone)."""


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


class Target(enum.Enum):
    """What a transaction compare looks at (etcd's Compare.CompareTarget)."""

    VERSION = "VERSION"
    CREATE = "CREATE"  # create_revision
    MOD = "MOD"  # mod_revision
    VALUE = "VALUE"
    LEASE = "LEASE"


class Op(enum.Enum):
    EQUAL = "EQUAL"
    NOT_EQUAL = "NOT_EQUAL"
    LESS = "LESS"
    GREATER = "GREATER"


@dataclass(frozen=True)
class Compare:
    """A transaction guard on one key. On a missing key the numbers are 0 and a VALUE compare
    always fails, as etcd does."""

    key: bytes
    target: Target
    op: Op
    operand: int | bytes

    @staticmethod
    def absent(key: bytes) -> Compare:
        return Compare(key, Target.VERSION, Op.EQUAL, 0)

    @staticmethod
    def value_is(key: bytes, value: bytes) -> Compare:
        return Compare(key, Target.VALUE, Op.EQUAL, value)

    @staticmethod
    def version_is(key: bytes, version: int) -> Compare:
        return Compare(key, Target.VERSION, Op.EQUAL, version)

    @staticmethod
    def mod_revision_is(key: bytes, revision: int) -> Compare:
        return Compare(key, Target.MOD, Op.EQUAL, revision)

    @staticmethod
    def create_revision_is(key: bytes, revision: int) -> Compare:
        return Compare(key, Target.CREATE, Op.EQUAL, revision)

    def holds(self, kv: KeyValue | None) -> bool:
        if self.target is Target.VALUE:
            if kv is None:
                return False
            left: int | bytes = kv.value
        elif kv is None:
            left = 0
        else:
            left = {Target.VERSION: kv.version, Target.CREATE: kv.create_revision, Target.MOD: kv.mod_revision,
                    Target.LEASE: kv.lease}[self.target]
        right = self.operand
        if self.op is Op.EQUAL:
            return left == right
        if self.op is Op.NOT_EQUAL:
            return left != right
        if self.op is Op.LESS:
            return left < right  # type: ignore[operator]
        return left > right  # type: ignore[operator]


@dataclass(frozen=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class DeleteRange:
    key: bytes
    range_end: bytes | None = None  # None: the key alone


@dataclass(frozen=True)
class Get:
    key: bytes
    range_end: bytes | None = None
    limit: int = 0


TxnOp = Put | DeleteRange | Get


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction
    # one entry per op of the branch taken: a Get's key-values, a DeleteRange's count, None for a Put
    responses: list[list[KeyValue] | int | None] = field(default_factory=list)


@dataclass(frozen=True)
class RangeResult:
    kvs: list[KeyValue]
    revision: int  # the revision the range was read at
    more: bool = False  # a limit cut the answer


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True)
class Event:
    type: EventType
    kv: KeyValue  # for a DELETE: key and mod_revision (the revision of the deletion) only


@dataclass(frozen=True)
class WatchBatch:
    """Events of one or more revisions, in revision order; `revision` is the store's revision
    when it was sent (a progress notice when `events` is empty)."""

    events: list[Event]
    revision: int


class Etcd(Protocol):
    """The operations the broker uses. Every call may raise EtcdUnavailable."""

    endpoint_description: str

    async def check(self) -> None:
        """Raise EtcdUnavailable with a clear message when no endpoint answers."""

    async def get(self, key: bytes) -> KeyValue | None: ...

    async def range(self, key: bytes, range_end: bytes | None = None, *, limit: int = 0, revision: int = 0,
                    descending: bool = False) -> RangeResult:
        """Keys in [key, range_end) sorted by key (descending if asked), read at `revision`
        (0: the newest); EtcdCompacted when that revision is gone."""

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Returns the revision of the put."""

    async def delete_range(self, key: bytes, range_end: bytes | None = None) -> int:
        """Returns how many keys were deleted."""

    async def txn(self, compares: Sequence[Compare], success: Sequence[TxnOp],
                  failure: Sequence[TxnOp] = ()) -> TxnResult: ...

    async def grant_lease(self, ttl_seconds: int) -> int:
        """A new lease id; etcd may raise the TTL to its minimum."""

    async def keep_alive(self, lease_id: int, timeout: float | None = None) -> int:
        """Refresh the lease; returns its TTL in seconds; LeaseNotFound when it expired.
        `timeout`: a member that does not answer within it is given up for the next one
        (EtcdUnavailable), so that the lease is kept alive elsewhere before it runs out."""

    async def revoke_lease(self, lease_id: int) -> None: ...

    def watch(self, key: bytes, range_end: bytes | None = None, start_revision: int = 0) -> AsyncIterator[WatchBatch]:
        """Events from `start_revision` (0: from now on). Raises EtcdCompacted when that revision
        is gone, EtcdUnavailable when the stream breaks (resume with `resumable_watch`)."""

    async def compact(self, revision: int) -> None:
        """Forget the history before `revision` (the whole keyspace, as etcd does)."""

    async def close(self) -> None: ...


def prefix_end(prefix: bytes) -> bytes:
    """The range end covering every key that starts with `prefix` (etcd's convention)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


async def resumable_watch(etcd: Etcd, key: bytes, range_end: bytes | None, start_revision: int,
                          retry_delay: float = 0.2, max_retry_delay: float = 2.0) -> AsyncGenerator[WatchBatch, None]:
    """A watch that reconnects by itself after EtcdUnavailable, resuming after the last revision
    delivered (not the batch's stamp: etcd stamps catch-up batches with its newest revision), so
    no event is lost or repeated; it ends only with EtcdCompacted (history gone while away) or
    when cancelled. Implementations yield an empty batch when a watch is created."""
    next_revision = start_revision
    delay = retry_delay
    while True:
        try:
            async for batch in etcd.watch(key, range_end, next_revision):
                delay = retry_delay
                if batch.events:
                    next_revision = batch.events[-1].kv.mod_revision + 1
                    yield batch
                elif next_revision == 0:
                    next_revision = batch.revision + 1  # "from now": the watch's creation fixed it
        except EtcdUnavailable:
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_retry_delay)


T = TypeVar("T")


async def within(seconds: float | None, awaitable: Awaitable[T]) -> T:
    """`awaitable`'s result, or TimeoutError after `seconds`: asyncio.wait_for, but a cancellation
    is never lost (Python 3.11's wait_for returns the result when it comes in the same instant as
    the cancel, and the cancelled task runs on: a session or a watch that cannot be stopped).
    Outside a task (the server runs a request's first steps without one) it is wait_for, which
    makes one."""
    if asyncio.current_task() is None:
        return await asyncio.wait_for(awaitable, seconds)
    async with asyncio.timeout(seconds):
        return await awaitable
