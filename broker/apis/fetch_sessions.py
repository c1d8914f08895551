"""Incremental fetch sessions (KIP-227): Kafka's FetchManager, FetchSession and FetchSessionCache.

A Fetch at epoch 0 (INITIAL) is a full request that asks for a session: once answered in full,
its partitions are kept in a session whose id goes back in the response (none when the cache is
full and nothing may be evicted: id 0, and the client goes on with full requests). The next
request names that id at epoch 1, then 2 ...: it carries only the partitions added or changed
(and the forgotten ones), the broker reads every partition of the session, and answers only
those with something new: records, an error, a high watermark or log start offset it has not
sent yet, a diverging epoch, a preferred read replica. A partition that returned records moves
to the end of the session's order, so that the next reads start with the others. Epoch -1
(FINAL) is a sessionless full request (a session named is closed).

Errors as Kafka's: an unknown session id FETCH_SESSION_ID_NOT_FOUND, an epoch other than the
session's next INVALID_FETCH_SESSION_EPOCH, a request version on the other side of topic ids
(13) than the session's FETCH_SESSION_TOPIC_ID_ERROR; each answered with session id 0 and no
partitions. A session that loses its last partition closes.

The cache holds `max.incremental.fetch.session.cache.slots` (1000) sessions. When full, a new
session takes the slot of one unused for two minutes, else of the smallest session that may be
evicted by it (FetchSessionCacheShard.tryEvict): a follower's (privileged) session only by
another follower's once two minutes old, a consumer's by any bigger one or a follower's.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from protocol import messages as M
from protocol.errors import ErrorCode

Q = M.FetchRequest
R = M.FetchResponse

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
EVICTION_MS = 120_000  # KafkaBroker.MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS
INT_MAX = 2**31 - 1

Key = tuple[uuid.UUID | str, int]  # (topic id, partition) from version 13, (topic name, partition) before


def next_epoch(epoch: int) -> int:
    """FetchMetadata.nextEpoch: INITIAL and FINAL stay, the rest counts up and wraps to 1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == INT_MAX else epoch + 1


def partition_key(topic: str, topic_id: uuid.UUID, partition: int, uses_topic_ids: bool) -> Key:
    return (topic_id, partition) if uses_topic_ids else (topic, partition)


@dataclass
class CachedPartition:
    """What a session remembers of a partition: the client's last fetch parameters, and the high
    watermark and log start offset last sent to it."""

    topic: str
    topic_id: uuid.UUID
    request: Q.FetchPartition
    high_watermark: int = -1
    log_start_offset: int = -1

    def must_respond(self, entry: R.PartitionData, update: bool) -> bool:
        """CachedPartition.maybeUpdateResponseData: whether an incremental response carries it."""
        respond = bool(entry.records) or bool(entry.error_code)
        if self.high_watermark != entry.high_watermark:
            respond = True
            if update:
                self.high_watermark = entry.high_watermark
        if self.log_start_offset != entry.log_start_offset:
            respond = True
            if update:
                self.log_start_offset = entry.log_start_offset
        if entry.preferred_read_replica != -1:
            respond = True
        if entry.error_code and update:
            self.high_watermark = -1
        diverging = entry.diverging_epoch
        if diverging is not None and (diverging.epoch != -1 or diverging.end_offset != -1):
            respond = True
        return respond


@dataclass
class FetchSession:
    id: int
    privileged: bool  # a follower's
    uses_topic_ids: bool
    creation_ms: int
    last_used_ms: int
    epoch: int
    partitions: dict[Key, CachedPartition] = field(default_factory=dict)  # in the session's order
    # as of the last touch (FetchSessionCacheShard's evictable sets are keyed then)
    cached_size: int = -1
    evictable_by_all: bool = False
    evictable_by_privileged: bool = False

    def update(self, wanted: Iterable[tuple[Key, str, uuid.UUID, Q.FetchPartition]], forgotten: Iterable[Key]) -> None:
        """The partitions a request adds or changes, and those it forgets."""
        for key, topic, topic_id, request in wanted:
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = CachedPartition(topic, topic_id, request)
            else:
                cached.request = request
        for key in forgotten:
            self.partitions.pop(key, None)

    def eviction_key(self) -> tuple[bool, int, int]:
        return (self.privileged, self.cached_size, self.id)


class FetchSessionCache:
    """Kafka's FetchSessionCacheShard (one shard): sessions by id, and who may take whose slot."""

    def __init__(self, max_entries: int = 1000, eviction_ms: int = EVICTION_MS,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self.clock = clock
        self.rng = rng or random.Random()
        self.sessions: dict[int, FetchSession] = {}
        self.evictions = 0

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def partitions_cached(self) -> int:
        return sum(max(s.cached_size, 0) for s in self.sessions.values())

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    def remove(self, session_id: int) -> FetchSession | None:
        return self.sessions.pop(session_id, None)

    def maybe_create(self, privileged: bool, uses_topic_ids: bool, partitions: dict[Key, CachedPartition]) -> int:
        """A new session holding `partitions`, its id; INVALID_SESSION_ID when there is no room."""
        now = self.now_ms()
        if len(self.sessions) >= self.max_entries and not self._try_evict(privileged, len(partitions), now):
            return INVALID_SESSION_ID
        session = FetchSession(self._new_id(), privileged, uses_topic_ids, now, now, next_epoch(INITIAL_EPOCH),
                               partitions)
        self.sessions[session.id] = session
        self.touch(session, now)
        return session.id

    def touch(self, session: FetchSession, now_ms: int | None = None) -> None:
        now = self.now_ms() if now_ms is None else now_ms
        session.last_used_ms = now
        session.cached_size = len(session.partitions)
        old = now - session.creation_ms > self.eviction_ms
        session.evictable_by_privileged = not session.privileged or old
        session.evictable_by_all = old

    def _new_id(self) -> int:
        while True:
            candidate = self.rng.randint(1, INT_MAX - 1)
            if candidate not in self.sessions:
                return candidate

    def _try_evict(self, privileged: bool, size: int, now: int) -> bool:
        stale = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id), default=None)
        if stale is None:
            return False
        if now - stale.last_used_ms > self.eviction_ms:
            self._evict(stale)
            return True
        evictable = [s for s in self.sessions.values()
                     if (s.evictable_by_privileged if privileged else s.evictable_by_all)]
        if not evictable:
            return False
        smallest = min(evictable, key=FetchSession.eviction_key)
        if (privileged, size, 0) < smallest.eviction_key():
            return False
        self._evict(smallest)
        return True

    def _evict(self, session: FetchSession) -> None:
        self.sessions.pop(session.id, None)
        self.evictions += 1


class FetchContext:
    """What one Fetch does with sessions (Kafka's FetchContext kinds): `error` set, a session error
    (answered with nothing else); else the partitions to read (`topics`, in the request's or the
    session's order) and, once read, `respond` picks the response's partitions and session id."""

    def __init__(self, cache: FetchSessionCache, version: int, request: Q, privileged: bool) -> None:
        self.cache = cache
        self.uses_topic_ids = version >= 13
        self.privileged = privileged
        self.error: ErrorCode | None = None
        self.session: FetchSession | None = None  # an incremental context's
        self.create = False  # a full request at epoch 0: a session is made from its answer
        self.expected_epoch = 0
        self.topics: list[Q.FetchTopic] = request.topics
        session_id, epoch = (request.session_id, request.session_epoch) if version >= 7 else (0, FINAL_EPOCH)
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):  # full
            if session_id != INVALID_SESSION_ID:
                cache.remove(session_id)
            self.create = epoch == INITIAL_EPOCH
            return
        session = cache.get(session_id)
        if session is None:
            self.error = ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        elif session.epoch != epoch:
            self.error = ErrorCode.INVALID_FETCH_SESSION_EPOCH
        elif session.uses_topic_ids != self.uses_topic_ids:
            self.error = ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
        else:
            session.update(self._wanted(request), self._forgotten(request))
            if not session.partitions:
                cache.remove(session.id)  # nothing left: a sessionless read of what was asked
                return
            cache.touch(session)
            session.epoch = next_epoch(session.epoch)
            self.expected_epoch = next_epoch(epoch)
            self.session = session
            self.topics = _as_topics(session.partitions.values())

    def _wanted(self, request: Q) -> list[tuple[Key, str, uuid.UUID, Q.FetchPartition]]:
        return [(partition_key(t.topic, t.topic_id, p.partition, self.uses_topic_ids), t.topic, t.topic_id, p)
                for t in request.topics for p in t.partitions]

    def _forgotten(self, request: Q) -> list[Key]:
        return [partition_key(t.topic, t.topic_id, p, self.uses_topic_ids)
                for t in request.forgotten_topics_data or () for p in t.partitions]

    def respond(self, parts: list[tuple[str, uuid.UUID, R.PartitionData]]
                ) -> tuple[ErrorCode, int, list[tuple[str, uuid.UUID, R.PartitionData]]]:
        """(error, session id, the partitions to answer) for what was read, in order."""
        session = self.session
        if session is not None:
            if session.epoch != self.expected_epoch:  # another request of the session came meanwhile
                return ErrorCode.INVALID_FETCH_SESSION_EPOCH, session.id, []
            out = []
            for topic, topic_id, entry in parts:
                key = partition_key(topic, topic_id, entry.partition_index, self.uses_topic_ids)
                cached = session.partitions.get(key)
                if cached is None or cached.must_respond(entry, True):
                    out.append((topic, topic_id, entry))
                    if cached is not None and entry.records:  # last in the order for the next reads
                        session.partitions[key] = session.partitions.pop(key)
            return ErrorCode.NONE, session.id, out
        if not self.create:
            return ErrorCode.NONE, INVALID_SESSION_ID, parts
        cached_partitions: dict[Key, CachedPartition] = {}
        requests = {partition_key(t.topic, t.topic_id, p.partition, self.uses_topic_ids): p
                    for t in self.topics for p in t.partitions}
        for topic, topic_id, entry in parts:
            key = partition_key(topic, topic_id, entry.partition_index, self.uses_topic_ids)
            cached_partitions[key] = CachedPartition(topic, topic_id, requests[key], entry.high_watermark,
                                                     entry.log_start_offset)
        return ErrorCode.NONE, self.cache.maybe_create(self.privileged, self.uses_topic_ids, cached_partitions), parts

    def throttled_session_id(self) -> int:
        """The session id of a response throttled by a quota (getThrottledResponse)."""
        return self.session.id if self.session is not None else INVALID_SESSION_ID


def _as_topics(partitions: Iterable[CachedPartition]) -> list[Q.FetchTopic]:
    """The session's partitions as a request's topics, consecutive partitions of a topic together."""
    topics: list[Q.FetchTopic] = []
    for cached in partitions:
        last = topics[-1] if topics else None
        if last is None or last.topic_id != cached.topic_id or last.topic != cached.topic:
            last = Q.FetchTopic(topic=cached.topic, topic_id=cached.topic_id, partitions=[])
            topics.append(last)
        last.partitions.append(cached.request)
    return topics
