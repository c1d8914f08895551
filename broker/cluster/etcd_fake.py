"""An in-memory `Etcd` with etcd's semantics, for fast unit tests: one revision counter for the
whole keyspace, create/mod revisions and versions per key, transactions with compares (a VALUE
compare on a missing key fails), leases that expire on an injected clock and delete their keys,
watches from a past revision (EtcdCompacted below the compaction point), compaction.

Faults: `available = False` makes every call raise EtcdUnavailable and breaks open watches,
as an etcd that went away; `advance(seconds)` moves a manual clock and expires leases.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from broker.cluster.etcd import (
    Compare,
    DeleteRange,
    EtcdCompacted,
    EtcdError,
    EtcdUnavailable,
    Event,
    EventType,
    Get,
    KeyValue,
    LeaseNotFound,
    Put,
    RangeResult,
    TxnOp,
    TxnResult,
    WatchBatch,
)

MIN_LEASE_TTL = 2  # etcd's minimum with its default election timeout
_EXPIRY_POLL = 0.05  # how often an idle watch looks for expired leases (seconds)


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class _Lease:
    ttl: int
    expires: float
    keys: set[bytes] = field(default_factory=set)


@dataclass
class _Watcher:
    key: bytes
    range_end: bytes | None
    queue: asyncio.Queue[list[Event] | None]

    def covers(self, key: bytes) -> bool:
        return _in_range(key, self.key, self.range_end)


def _in_range(key: bytes, start: bytes, end: bytes | None) -> bool:
    if end is None:
        return key == start
    if end == b"\0":
        return key >= start
    return start <= key < end


class FakeEtcd:
    endpoint_description = "fake"

    def __init__(self, clock: Callable[[], float] = time.monotonic, min_lease_ttl: int = MIN_LEASE_TTL) -> None:
        self.clock = clock
        self.min_lease_ttl = min_lease_ttl
        self.available = True
        self.revision = 1  # etcd starts at 1
        self.compacted = 0
        self._kvs: dict[bytes, KeyValue] = {}
        self._sorted: list[bytes] = []
        self._history: list[Event] = []  # every event, in revision order
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(0x1000)
        self._watchers: list[_Watcher] = []
        self.requests = 0

    # faults -----------------------------------------------------------------------------------
    def set_available(self, available: bool) -> None:
        self.available = available
        if not available:
            for w in self._watchers:
                w.queue.put_nowait(None)

    def advance(self, seconds: float) -> None:
        assert isinstance(self.clock, ManualClock), "advance() needs a ManualClock"
        self.clock.now += seconds
        self._expire()

    def _check(self) -> None:
        self.requests += 1
        if not self.available:
            raise EtcdUnavailable("etcd is unreachable (fake)")
        self._expire()

    def _expire(self) -> None:
        now = self.clock()
        for lease_id, lease in list(self._leases.items()):
            if lease.expires <= now:
                self._revoke(lease_id)

    # writes -----------------------------------------------------------------------------------
    def _commit(self, events: list[Event]) -> None:
        if not events:
            return
        self._history.extend(events)
        for w in self._watchers:
            mine = [e for e in events if w.covers(e.kv.key)]
            if mine:
                w.queue.put_nowait(mine)

    def _put(self, key: bytes, value: bytes, lease: int, revision: int) -> Event:
        if lease and lease not in self._leases:
            raise LeaseNotFound("etcdserver: requested lease not found")
        old = self._kvs.get(key)
        if old is None:
            bisect.insort(self._sorted, key)
            kv = KeyValue(key, value, revision, revision, 1, lease)
        else:
            if old.lease and old.lease != lease and old.lease in self._leases:
                self._leases[old.lease].keys.discard(key)
            kv = KeyValue(key, value, old.create_revision, revision, old.version + 1, lease)
        if lease:
            self._leases[lease].keys.add(key)
        self._kvs[key] = kv
        return Event(EventType.PUT, kv)

    def _delete(self, key: bytes, range_end: bytes | None, revision: int) -> list[Event]:
        events = []
        for k in self._keys(key, range_end):
            old = self._kvs.pop(k)
            self._sorted.remove(k)
            if old.lease in self._leases:
                self._leases[old.lease].keys.discard(k)
            events.append(Event(EventType.DELETE, KeyValue(k, b"", 0, revision, 0)))
        return events

    def _keys(self, key: bytes, range_end: bytes | None) -> list[bytes]:
        if range_end is None:
            return [key] if key in self._kvs else []
        lo = bisect.bisect_left(self._sorted, key)
        hi = len(self._sorted) if range_end == b"\0" else bisect.bisect_left(self._sorted, range_end)
        return self._sorted[lo:hi]

    def _revoke(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is None or not lease.keys:
            return
        self.revision += 1
        events = []
        for key in sorted(lease.keys):
            events += self._delete(key, None, self.revision)
        self._commit(events)

    # Etcd -------------------------------------------------------------------------------------
    async def check(self) -> None:
        self._check()

    async def get(self, key: bytes) -> KeyValue | None:
        self._check()
        return self._kvs.get(key)

    async def range(self, key: bytes, range_end: bytes | None = None, *, limit: int = 0, revision: int = 0,
                    descending: bool = False) -> RangeResult:
        self._check()
        if revision and revision < self.compacted:
            raise EtcdCompacted(self.compacted, "etcdserver: mvcc: required revision has been compacted")
        if revision > self.revision:
            raise EtcdError("etcdserver: mvcc: required revision is a future revision")
        if revision and revision != self.revision:
            kvs = self._state_at(revision, key, range_end)
        else:
            kvs = [self._kvs[k] for k in self._keys(key, range_end)]
        if descending:
            kvs.reverse()
        more = bool(limit) and len(kvs) > limit
        return RangeResult(kvs[:limit] if limit else kvs, self.revision, more)

    def _state_at(self, revision: int, key: bytes, range_end: bytes | None) -> list[KeyValue]:
        """The keys as they were at `revision`, rebuilt from the history kept since compaction
        (keys untouched since then are as they are now)."""
        state = {k: kv for k, kv in self._kvs.items() if _in_range(k, key, range_end)}
        for event in reversed(self._history):
            if event.kv.mod_revision <= revision:
                break
            k = event.kv.key
            if not _in_range(k, key, range_end):
                continue
            previous = next((e for e in reversed(self._history)
                             if e.kv.key == k and e.kv.mod_revision < event.kv.mod_revision), None)
            if previous is None or previous.type is EventType.DELETE:
                state.pop(k, None)
            else:
                state[k] = previous.kv
        return [state[k] for k in sorted(state)]

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        self._check()
        self.revision += 1
        self._commit([self._put(key, value, lease, self.revision)])
        return self.revision

    async def delete_range(self, key: bytes, range_end: bytes | None = None) -> int:
        self._check()
        if not self._keys(key, range_end):
            return 0
        self.revision += 1
        events = self._delete(key, range_end, self.revision)
        self._commit(events)
        return len(events)

    async def txn(self, compares: Sequence[Compare], success: Sequence[TxnOp],
                  failure: Sequence[TxnOp] = ()) -> TxnResult:
        self._check()
        succeeded = all(c.holds(self._kvs.get(c.key)) for c in compares)
        ops = success if succeeded else failure
        for op in ops:
            if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                raise LeaseNotFound("etcdserver: requested lease not found")
        writes = any(isinstance(op, Put) or (isinstance(op, DeleteRange) and self._keys(op.key, op.range_end))
                     for op in ops)
        revision = self.revision + 1 if writes else self.revision
        events: list[Event] = []
        responses: list[list[KeyValue] | int | None] = []
        for op in ops:
            if isinstance(op, Put):
                events.append(self._put(op.key, op.value, op.lease, revision))
                responses.append(None)
            elif isinstance(op, DeleteRange):
                deleted = self._delete(op.key, op.range_end, revision)
                events += deleted
                responses.append(len(deleted))
            else:
                assert isinstance(op, Get)
                kvs = [self._kvs[k] for k in self._keys(op.key, op.range_end)]
                responses.append(kvs[:op.limit] if op.limit else kvs)
        self.revision = revision
        self._commit(events)
        return TxnResult(succeeded, revision, responses)

    async def grant_lease(self, ttl_seconds: int) -> int:
        self._check()
        ttl = max(ttl_seconds, self.min_lease_ttl)
        lease_id = next(self._lease_ids)
        self._leases[lease_id] = _Lease(ttl, self.clock() + ttl)
        return lease_id

    async def keep_alive(self, lease_id: int, timeout: float | None = None) -> int:
        self._check()
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFound("lease %x expired" % lease_id)
        lease.expires = self.clock() + lease.ttl
        return lease.ttl

    async def revoke_lease(self, lease_id: int) -> None:
        self._check()
        self._revoke(lease_id)

    async def compact(self, revision: int) -> None:
        self._check()
        if revision > self.revision:
            raise EtcdError("etcdserver: mvcc: required revision is a future revision")
        if revision <= self.compacted:
            return
        self.compacted = revision
        # keep only the events after the compaction point (the state at it is the current keys)
        self._history = [e for e in self._history if e.kv.mod_revision > revision]

    async def watch(self, key: bytes, range_end: bytes | None = None, start_revision: int = 0) -> AsyncIterator[WatchBatch]:
        self._check()
        if start_revision and start_revision < self.compacted:
            raise EtcdCompacted(self.compacted)
        watcher = _Watcher(key, range_end, asyncio.Queue())
        past = [e for e in self._history if start_revision and e.kv.mod_revision >= start_revision
                and watcher.covers(e.kv.key)]
        self._watchers.append(watcher)
        try:
            yield WatchBatch([], self.revision)
            for _, group in itertools.groupby(past, key=lambda e: e.kv.mod_revision):
                yield WatchBatch(list(group), self.revision)
            while True:
                try:
                    events = await asyncio.wait_for(watcher.queue.get(), _EXPIRY_POLL)
                except TimeoutError:
                    if self.available:
                        self._expire()
                    continue
                if events is None or not self.available:
                    raise EtcdUnavailable("etcd is unreachable (fake): watch broken")
                yield WatchBatch(events, self.revision)
        finally:
            self._watchers.remove(watcher)

    async def close(self) -> None:
        pass

    # inspection for tests ---------------------------------------------------------------------
    def keys(self, prefix: bytes = b"") -> list[bytes]:
        return [k for k in self._sorted if k.startswith(prefix)]

    def lease_ids(self) -> list[int]:
        return sorted(self._leases)
