"""The share-partition engine: the records one share group leases from one topic-partition.

Pure and single-threaded (the caller runs it on the event loop beside its partition), time passed
in. Follows Kafka's SharePartition:

- The in-flight records lie between the share-partition start offset (SPSO) and the end offset;
  below the SPSO every record is done, above the end offset nothing was fetched yet. They are kept
  as in-flight batches (inflight.py), whole while a request treats them as one, per offset after.
- `acquire` leases records from what was read from the log at `next_fetch_offset()`: AVAILABLE
  in-flight records first, then new ones, whole log batches at a time (batch_optimized) or exactly
  `max_records` (record_limit, KIP-1206), at most `max_record_locks` in flight; each acquisition
  counts a delivery and starts an acquisition lock.
- `acknowledge`, `release_member` (a share session closed) and `expire_locks` change records in a
  way that must be durable first: they start transitions and return them as a `Transition`; the
  caller persists `state_batches()` and then calls `complete`. Until then those records cannot be
  acquired or acknowledged again, and the SPSO does not move past them. An acknowledgement is all
  or nothing: on the first invalid batch every change of the request is rolled back.
- A record that runs out of deliveries (`delivery_count_limit`) is archived, or goes through
  ARCHIVING first when the group has a dead-letter queue (KIP-1191).
- After every completed transition the SPSO moves over the prefix of ACKNOWLEDGED/ARCHIVED
  records and the batches wholly below it are dropped.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.coordinator.share.state import StateBatch
from broker.share.inflight import NO_MEMBER, InFlightBatch, InFlightState, RecordState
from protocol.errors import ErrorCode, KafkaError

S = RecordState
GAP_BATCH_SIZE = 500  # offsets the persisted state does not know of are re-read in pieces this long


class AckType(enum.IntEnum):
    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4  # KIP-1222: extend the acquisition lock


class DeadLetterCause(enum.Enum):
    """Why a record goes to the dead-letter queue (Kafka's ShareGroupDLQ causes and messages)."""

    CLIENT_REJECT = "Offset rejected by client."
    DELIVERY_COUNT_EXCEEDED = "Offset delivery count exceeded the threshold."


class AckBatch(NamedTuple):
    first_offset: int
    last_offset: int
    types: Sequence[int]  # one type for the whole range, or one per offset


class AcquiredRecords(NamedTuple):
    first_offset: int
    last_offset: int
    delivery_count: int


class FetchedBatch(NamedTuple):
    """A record batch read from the log (only its offsets matter here)."""

    base_offset: int
    last_offset: int


@dataclass
class ShareSettings:
    """The group's settings the engine obeys (group configs over broker defaults); the owner may
    replace them at any time (a group config changed)."""

    delivery_count_limit: int = 5  # share.delivery.count.limit
    record_lock_duration_ms: int = 30000  # share.record.lock.duration.ms
    max_record_locks: int = 2000  # share.partition.max.record.locks
    dlq: bool = False  # errors.deadletterqueue.topic.name is set: ARCHIVING before ARCHIVED
    renew_enabled: bool = True  # share.renew.acknowledge.enable

    @property
    def throttle_limit(self) -> int:
        """Records delivered this often are handed out in shrinking batches (Kafka: half the limit,
        rounded up, at least 2)."""
        return max(2, -(-self.delivery_count_limit // 2))


def invalid_record_state(message: str) -> KafkaError:
    return KafkaError(ErrorCode.INVALID_RECORD_STATE, message)


@dataclass
class Transition:
    """State changes waiting to be durable: persist `state_batches()`, then `complete` them."""

    kind: str  # acknowledge, release, expire, archive
    touched: list[tuple[int, int, InFlightState, InFlightBatch]] = field(default_factory=list)
    renewed: list[tuple[InFlightState, InFlightBatch, int | None]] = field(default_factory=list)  # old deadlines
    # (first, last, cause) of the records this transition moves to ARCHIVING (for the DLQ)
    dead_letters: list[tuple[int, int, DeadLetterCause]] = field(default_factory=list)

    def add(self, first: int, last: int, state: InFlightState, batch: InFlightBatch) -> None:
        self.touched.append((first, last, state, batch))

    def __bool__(self) -> bool:
        return bool(self.touched)

    def state_batches(self) -> list[StateBatch]:
        """The changed ranges in the persisted form, adjacent equal ones joined."""
        out: list[StateBatch] = []
        for first, last, st, _ in sorted(self.touched, key=lambda t: t[0]):
            if out and out[-1].last_offset + 1 == first and out[-1].delivery_state == int(st.state) \
                    and out[-1].delivery_count == st.delivery_count:
                out[-1] = out[-1]._replace(last_offset=last)
            else:
                out.append(StateBatch(first, last, int(st.state), st.delivery_count))
        return out


_ACK_STATE = {AckType.GAP: S.ARCHIVED, AckType.ACCEPT: S.ACKNOWLEDGED, AckType.RELEASE: S.AVAILABLE,
              AckType.REJECT: S.ARCHIVED}


class SharePartition:
    def __init__(self, settings: ShareSettings | None = None) -> None:
        self.settings = settings or ShareSettings()
        self.start_offset = 0
        self.end_offset = 0  # the last in-flight offset; the next one to fetch when nothing is in flight
        self.state_epoch = 0
        self._firsts: list[int] = []  # first offsets of the batches, sorted
        self._batches: dict[int, InFlightBatch] = {}
        self._find_next = False  # some in-flight record may be AVAILABLE: look for it
        self._locks: list[tuple[int, int, InFlightBatch]] = []  # (deadline, seq, batch) heap, lazily pruned
        self._seq = itertools.count()

    # ----- loading ------------------------------------------------------------------------
    def load(self, start_offset: int, state_epoch: int, batches: Iterable[StateBatch]) -> None:
        """Take the persisted state. Offsets between the SPSO and the last state batch that no
        batch covers were in flight without a durable outcome: they are AVAILABLE again."""
        self.start_offset, self.state_epoch = start_offset, state_epoch
        self._firsts, self._batches = [], {}
        previous_last = start_offset - 1
        for sb in sorted(batches):
            if sb.last_offset < start_offset:
                continue
            first = max(sb.first_offset, start_offset)
            for gap in range(previous_last + 1, first, GAP_BATCH_SIZE):
                self._insert(InFlightBatch(gap, min(gap + GAP_BATCH_SIZE, first) - 1, InFlightState(S.AVAILABLE, 0)))
            state = S(sb.delivery_state)
            if state is S.ACQUIRED:  # not written by Kafka; an acquisition never outlives the broker
                state = S.AVAILABLE
            self._insert(InFlightBatch(first, sb.last_offset, InFlightState(state, sb.delivery_count)))
            previous_last = sb.last_offset
        if self._firsts:
            self.end_offset = previous_last
            self._find_next = True
            self._advance_start()
        else:
            self.end_offset = start_offset

    # ----- the cache of batches -----------------------------------------------------------
    def _insert(self, batch: InFlightBatch) -> None:
        bisect.insort(self._firsts, batch.first)
        self._batches[batch.first] = batch

    def _floor(self, offset: int) -> InFlightBatch | None:
        i = bisect.bisect_right(self._firsts, offset)
        return self._batches[self._firsts[i - 1]] if i else None

    def _between(self, lo: int, hi: int) -> list[InFlightBatch]:
        """Batches whose first offset is in [lo, hi]."""
        i, j = bisect.bisect_left(self._firsts, lo), bisect.bisect_right(self._firsts, hi)
        return [self._batches[k] for k in self._firsts[i:j]]

    def batches(self) -> Iterator[InFlightBatch]:
        return (self._batches[k] for k in self._firsts)

    def _last_cached(self) -> int:
        return self._batches[self._firsts[-1]].last

    # ----- queries ------------------------------------------------------------------------
    def in_flight_count(self) -> int:
        return self.end_offset - self.start_offset + 1 if self._firsts else 0

    def next_fetch_offset(self) -> int:
        fresh = not self._firsts or self.start_offset > self._last_cached()
        if fresh:
            self._find_next = False
            return self.end_offset
        if self._find_next:
            for batch in self.batches():
                for first, _last, st in batch.states():
                    if st.state is S.AVAILABLE and st.pending is None and first >= self.start_offset:
                        return first
            self._find_next = False
        return self.end_offset + 1

    def can_acquire(self) -> bool:
        """Whether a fetch may acquire anything (below the in-flight cap, or re-deliverable records)."""
        return (self.next_fetch_offset() != self.end_offset + 1
                or self.in_flight_count() < self.settings.max_record_locks)

    def state_of(self, offset: int) -> InFlightState | None:
        """The state of an in-flight offset (None: below the SPSO, not fetched yet, or a hole)."""
        batch = self._floor(offset)
        if batch is None or offset > batch.last or offset < self.start_offset:
            return None
        return batch.state_at(offset)

    def delivery_complete_count(self) -> int:
        """In-flight records already ACKNOWLEDGED or ARCHIVED (KIP-1226)."""
        count = 0
        for batch in self.batches():
            for first, last, st in batch.states():
                if st.state.terminal and last >= self.start_offset:
                    count += last - max(first, self.start_offset) + 1
        return count

    def next_lock_deadline(self) -> int | None:
        return self._locks[0][0] if self._locks else None

    # ----- acquisition --------------------------------------------------------------------
    def _lock(self, st: InFlightState, batch: InFlightBatch, member_id: str, now: int) -> None:
        st.move(S.ACQUIRED)
        st.delivery_count += 1
        st.member_id = member_id
        self._set_deadline(st, batch, now)

    def _set_deadline(self, st: InFlightState, batch: InFlightBatch, now: int) -> None:
        st.deadline = now + self.settings.record_lock_duration_ms
        heapq.heappush(self._locks, (st.deadline, next(self._seq), batch))

    def acquire(self, member_id: str, fetch_offset: int, fetched: Sequence[FetchedBatch], max_records: int,
                batch_size: int, now: int, record_limit: bool = False) -> list[AcquiredRecords]:
        """Lease records of `fetched` (read from the log at `fetch_offset`) to the member."""
        if not fetched or max_records <= 0:
            return []
        last = fetched[-1].last_offset
        max_acquire = min(max_records, self.settings.max_record_locks - self.in_flight_count())
        if max_acquire <= 0:
            if not self._firsts or fetch_offset > self.end_offset:
                return []
            # At the cap, but re-deliverable records lie inside what is in flight.
            max_acquire = min(max_records, self.end_offset - fetch_offset + 1)
            last = min(last, self.end_offset)
        fetched_base = fetched[0].base_offset
        self._archive_vanished(fetch_offset, fetched_base)
        base = max(fetched_base, self.start_offset)  # a log batch may begin below the SPSO
        floor = self._floor(base)
        if floor is not None and floor.last >= base:
            base = floor.first
        overlapping = self._between(base, last)
        if not overlapping:
            return self._acquire_new(member_id, fetched, fetched_base, last, batch_size, max_acquire, now, record_limit)
        result: list[AcquiredRecords] = []
        count = 0
        for batch in overlapping:
            if count >= max_acquire:
                break
            remaining = max_acquire - count
            full = batch.first >= fetched_base and batch.last <= last
            throttle = self._should_throttle(batch, fetched_base, last)
            if throttle and count > 0:
                max_acquire = 0  # the record(s) to isolate go alone in the next fetch
                break
            if not full or batch.offsets is not None or (record_limit and batch.size > remaining) or throttle:
                if not batch.split_if_available():
                    continue
                n = self._acquire_offsets(member_id, batch, fetched_base, last, remaining, now, record_limit, result)
                count += n
                if throttle and n:
                    max_acquire = 0
                    break
                continue
            whole = batch.whole
            assert whole is not None
            if whole.state is not S.AVAILABLE or whole.pending is not None:
                continue
            self._lock(whole, batch, member_id, now)
            result.append(AcquiredRecords(batch.first, batch.last, whole.delivery_count))
            count += batch.size
        last_cached = overlapping[-1].last
        if count < max_acquire and last_cached < last:
            result += self._acquire_new(member_id, fetched, last_cached + 1, last, batch_size, max_acquire - count,
                                        now, record_limit)
        return result

    def _should_throttle(self, batch: InFlightBatch, first: int, last: int) -> bool:
        limit = self.settings.throttle_limit
        if batch.offsets is None:
            whole = batch.whole
            assert whole is not None
            return whole.state is S.AVAILABLE and whole.pending is None and whole.delivery_count >= limit
        return any(st.delivery_count >= limit for o, st in batch.offsets.items()
                   if first <= o <= last and st.state is S.AVAILABLE)

    def _acquire_offsets(self, member_id: str, batch: InFlightBatch, first: int, last: int, remaining: int,
                         now: int, record_limit: bool, result: list[AcquiredRecords]) -> int:
        offsets = batch.offsets
        assert offsets is not None
        limit = self.settings.delivery_count_limit
        throttled_max = -1
        n = 0
        for offset, st in offsets.items():
            if offset < first or offset < self.start_offset:
                continue
            if offset > last:
                break
            if st.state is not S.AVAILABLE or st.pending is not None:
                continue
            if limit > 2 and st.delivery_count == limit - 1 and n:
                break  # its last delivery goes alone: a poison record does not take others down with it
            if st.delivery_count >= self.settings.throttle_limit and throttled_max < 0:
                throttled_max = max(1, len(offsets) >> (st.delivery_count - self.settings.throttle_limit + 1))
            self._lock(st, batch, member_id, now)
            previous = result[-1] if result else None
            if previous is not None and previous.last_offset + 1 == offset \
                    and previous.delivery_count == st.delivery_count:
                result[-1] = previous._replace(last_offset=offset)
            else:
                result.append(AcquiredRecords(offset, offset, st.delivery_count))
            n += 1
            if (limit > 2 and st.delivery_count == limit) or (record_limit and n == remaining) \
                    or n == throttled_max:
                break
        return n

    def _acquire_new(self, member_id: str, fetched: Sequence[FetchedBatch], first: int, last: int,
                     batch_size: int, max_records: int, now: int, record_limit: bool) -> list[AcquiredRecords]:
        """Records never fetched before: new in-flight batches, cut at log batch boundaries."""
        if not self._firsts:
            first = max(first, self.end_offset, self.start_offset)
        else:
            first = max(first, self._last_cached() + 1, self.start_offset)
        if first > last:
            return []
        last_acquired = last
        if max_records < last - first + 1:
            # Up to the end of the log batch holding the last record allowed (a soft limit).
            wanted = first + max_records - 1
            last_acquired = next((b.last_offset for b in fetched if b.base_offset <= wanted <= b.last_offset), wanted)
        result: list[AcquiredRecords] = []
        if record_limit and last_acquired - first + 1 > max_records:
            batch = InFlightBatch(first, last_acquired, InFlightState(S.AVAILABLE, 0))
            offsets = batch.split()
            for offset in range(first, first + max_records):
                self._lock(offsets[offset], batch, member_id, now)
            self._insert(batch)
            self._find_next = True
            result.append(AcquiredRecords(first, first + max_records - 1, 1))
        else:
            pieces = []
            current = first
            if not record_limit and last_acquired - first + 1 > batch_size:
                for b in fetched:
                    if b.base_offset > last_acquired:
                        break
                    if b.base_offset - current >= batch_size:
                        pieces.append((current, b.base_offset - 1))
                        current = b.base_offset
            pieces.append((current, last_acquired))
            for lo, hi in pieces:
                st = InFlightState(S.AVAILABLE, 0)
                batch = InFlightBatch(lo, hi, st)
                self._lock(st, batch, member_id, now)
                self._insert(batch)
                result.append(AcquiredRecords(lo, hi, 1))
        if self._firsts[0] == first:
            self.start_offset = first
        self.end_offset = max(self.end_offset, last_acquired)
        return result

    def _archive_vanished(self, fetch_offset: int, fetched_base: int) -> None:
        """The log had nothing between the fetch offset and its first batch (compaction): the
        AVAILABLE in-flight records there are archived, or the SPSO could never pass them."""
        if not self._firsts or fetch_offset >= fetched_base:
            return
        self._archive_available(fetch_offset, fetched_base)

    def _archive_available(self, lo: int, hi: int) -> bool:
        """Archive AVAILABLE records in [lo, hi) (not persisted: the next write carries them)."""
        archived = False
        floor = self._floor(lo)
        start = floor.first if floor is not None and floor.last >= lo else lo
        for batch in self._between(start, hi - 1):
            if batch.offsets is None and batch.first >= lo and batch.last < hi:
                whole = batch.whole
                assert whole is not None
                if whole.state is S.AVAILABLE and whole.pending is None:
                    whole.move(S.ARCHIVED)
                    archived = True
                continue
            if not batch.split_if_available():
                continue
            assert batch.offsets is not None
            for offset, st in batch.offsets.items():
                if lo <= offset < hi and st.state is S.AVAILABLE and st.pending is None:
                    st.move(S.ARCHIVED)
                    archived = True
        return archived

    def on_log_start(self, log_start_offset: int) -> None:
        """The log start moved (retention, DeleteRecords) past the SPSO: the records below are gone."""
        if log_start_offset <= self.start_offset:
            return
        if self._firsts:
            self._archive_available(self.start_offset, log_start_offset)
        self.start_offset = log_start_offset
        if self.end_offset < self.start_offset:
            self.end_offset = self.start_offset
        self._advance_start()

    # ----- acknowledgement ----------------------------------------------------------------
    def acknowledge(self, member_id: str, batches: Sequence[AckBatch], now: int) -> Transition:
        """Start the transitions the member's acknowledgements ask for, all or none (raises
        INVALID_RECORD_STATE or INVALID_REQUEST with nothing changed)."""
        t = Transition("acknowledge")
        try:
            for ack in batches:
                for type_ in ack.types:
                    if type_ not in AckType._value2member_map_ or (type_ == AckType.RENEW
                                                                   and not self.settings.renew_enabled):
                        raise KafkaError(ErrorCode.INVALID_REQUEST, "Invalid acknowledge type: %s" % list(ack.types))
                if ack.last_offset < self.start_offset:
                    continue  # already done with
                for batch in self._batches_for_ack(ack):
                    self._ack_batch(member_id, ack, batch, t, now)
        except KafkaError:
            for st, batch, deadline in reversed(t.renewed):
                st.deadline = deadline
                if deadline is not None:
                    heapq.heappush(self._locks, (deadline, next(self._seq), batch))
            self._finish(t, False, now)
            raise
        return t

    def _batches_for_ack(self, ack: AckBatch) -> list[InFlightBatch]:
        floor = self._floor(ack.first_offset)
        if floor is None and ack.first_offset < self.start_offset <= ack.last_offset:
            floor = self._floor(self.start_offset)
        if floor is None:
            raise invalid_record_state("Batch record not found. The request batch offsets are not found in the cache.")
        batches = self._between(floor.first, ack.last_offset)
        if batches[-1].last < ack.first_offset:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             "Batch record not found. The first offset in request is past acquired records.")
        if ack.last_offset > batches[-1].last:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             "Batch record not found. The last offset in request is past acquired records.")
        return batches

    def _ack_batch(self, member_id: str, ack: AckBatch, batch: InFlightBatch, t: Transition, now: int) -> None:
        if batch.last < self.start_offset:
            return
        if batch.offsets is None:
            whole = batch.whole
            assert whole is not None
            if whole.member_id == NO_MEMBER:
                raise invalid_record_state("The batch cannot be acknowledged. The batch is not in the acquired state.")
            if whole.member_id != member_id:
                raise invalid_record_state("Member is not the owner of batch record")
            if whole.pending is not None:
                raise invalid_record_state(
                    "The record state is invalid. The acknowledgement of delivery could not be completed.")
        full = batch.first >= ack.first_offset and batch.last <= ack.last_offset
        start_inside = batch.first < self.start_offset <= batch.last
        if full and batch.offsets is None and len(ack.types) == 1 and not start_inside:
            self._ack_whole(ack.types[0], batch, t, now)
            return
        if batch.offsets is None:
            whole = batch.whole
            assert whole is not None
            if whole.state is not S.ACQUIRED:
                raise invalid_record_state(
                    "The batch cannot be acknowledged. The subset batch is not in the acquired state.")
            batch.split()
        assert batch.offsets is not None
        for offset, st in batch.offsets.items():
            if offset < ack.first_offset or offset < self.start_offset:
                continue
            if offset > ack.last_offset:
                break
            if st.state is not S.ACQUIRED:
                raise invalid_record_state("The offset cannot be acknowledged. The offset is not acquired.")
            if st.pending is not None:
                raise invalid_record_state(
                    "The record state is invalid. The acknowledgement of delivery could not be completed.")
            if st.member_id != member_id:
                raise invalid_record_state("Member is not the owner of offset")
            type_ = ack.types[offset - ack.first_offset] if len(ack.types) > 1 else ack.types[0]
            self._ack_state(type_, offset, offset, st, batch, t, now)

    def _ack_whole(self, type_: int, batch: InFlightBatch, t: Transition, now: int) -> None:
        whole = batch.whole
        assert whole is not None
        if whole.state is not S.ACQUIRED:
            raise invalid_record_state("The batch cannot be acknowledged. The batch is not in the acquired state.")
        self._ack_state(type_, batch.first, batch.last, whole, batch, t, now)

    def _ack_state(self, type_: int, first: int, last: int, st: InFlightState, batch: InFlightBatch,
                   t: Transition, now: int) -> None:
        if type_ == AckType.RENEW:
            t.renewed.append((st, batch, st.deadline))  # nothing durable changes; undone if the request fails
            self._set_deadline(st, batch, now)
            return
        new = _ACK_STATE[AckType(type_)]
        if type_ == AckType.REJECT and self.settings.dlq:
            new = S.ARCHIVING
            t.dead_letters.append((first, last, DeadLetterCause.CLIENT_REJECT))
        elif new is S.AVAILABLE and st.delivery_count >= self.settings.delivery_count_limit:
            new = S.ARCHIVING if self.settings.dlq else S.ARCHIVED
            if self.settings.dlq:
                t.dead_letters.append((first, last, DeadLetterCause.DELIVERY_COUNT_EXCEEDED))
        st.start(new, st.delivery_count)
        t.add(first, last, st, batch)

    # ----- release and expiry -------------------------------------------------------------
    def release_member(self, member_id: str, now: int) -> Transition:
        """The member's share session ended: its acquired records are AVAILABLE again, their
        delivery not counted (Kafka: DeliveryCountOps.DECREASE, they never reached the application)."""
        t = Transition("release")
        for batch in list(self.batches()):
            if batch.offsets is None:
                whole = batch.whole
                assert whole is not None
                if whole.state is not S.ACQUIRED or whole.member_id != member_id or whole.pending is not None:
                    continue
                if not batch.first < self.start_offset <= batch.last:
                    new = S.ARCHIVED if batch.last < self.start_offset else S.AVAILABLE
                    whole.start(new, max(0, whole.delivery_count - 1))
                    t.add(batch.first, batch.last, whole, batch)
                    continue
                batch.split()
            assert batch.offsets is not None
            for offset, st in batch.offsets.items():
                if st.state is S.ACQUIRED and st.member_id == member_id and st.pending is None:
                    st.start(S.ARCHIVED if offset < self.start_offset else S.AVAILABLE, max(0, st.delivery_count - 1))
                    t.add(offset, offset, st, batch)
        return t

    def expire_locks(self, now: int) -> Transition:
        """Acquisition locks that ran out: the records are AVAILABLE again (their delivery counted),
        or archived when out of deliveries."""
        t = Transition("expire")
        due: dict[int, InFlightBatch] = {}
        while self._locks and self._locks[0][0] <= now:
            _, _, batch = heapq.heappop(self._locks)
            if self._batches.get(batch.first) is batch:
                due[batch.first] = batch
        for batch in due.values():
            if batch.offsets is None:
                whole = batch.whole
                assert whole is not None
                if not self._expired(whole, now):
                    continue
                if not batch.first < self.start_offset <= batch.last:
                    self._expire(whole, batch.first, batch.last, batch, t)
                    continue
                batch.split()
            assert batch.offsets is not None
            for offset, st in batch.offsets.items():
                if self._expired(st, now):
                    self._expire(st, offset, offset, batch, t)
        return t

    @staticmethod
    def _expired(st: InFlightState, now: int) -> bool:
        return st.state is S.ACQUIRED and st.pending is None and st.deadline is not None and st.deadline <= now

    def _expire(self, st: InFlightState, first: int, last: int, batch: InFlightBatch, t: Transition) -> None:
        if last < self.start_offset:
            new = S.ARCHIVED
        elif st.delivery_count >= self.settings.delivery_count_limit:
            new = S.ARCHIVING if self.settings.dlq else S.ARCHIVED
            if self.settings.dlq:
                t.dead_letters.append((first, last, DeadLetterCause.DELIVERY_COUNT_EXCEEDED))
        else:
            new = S.AVAILABLE
        st.start(new, st.delivery_count)
        t.add(first, last, st, batch)

    # ----- the dead-letter queue ----------------------------------------------------------
    def archiving(self) -> list[AcquiredRecords]:
        """Records waiting in ARCHIVING (for the dead-letter queue), with their delivery counts
        (the cause is in the Transition that moved them there; after a restart, a delivery count
        at the limit says the deliveries ran out, a lower one that the client rejected them)."""
        out: list[AcquiredRecords] = []
        for batch in self.batches():
            for first, last, st in batch.states():
                if st.state is S.ARCHIVING and st.pending is None:
                    if out and out[-1].last_offset + 1 == first and out[-1].delivery_count == st.delivery_count:
                        out[-1] = out[-1]._replace(last_offset=last)
                    else:
                        out.append(AcquiredRecords(first, last, st.delivery_count))
        return out

    def archived(self, first: int, last: int) -> Transition:
        """Records first..last reached the dead-letter queue (or were given up on): ARCHIVED."""
        return self._archive(first, last, lambda st: st.state is S.ARCHIVING)

    def archive_acquired(self, member_id: str, first: int, last: int) -> Transition:
        """Records just acquired by the member that belong to aborted transactions (read_committed):
        ARCHIVED, never delivered (Kafka's maybeFilterAbortedTransactionalAcquiredRecords)."""
        return self._archive(first, last, lambda st: st.state is S.ACQUIRED and st.member_id == member_id)

    def _archive(self, first: int, last: int, eligible: Callable[[InFlightState], bool]) -> Transition:
        """Start ARCHIVED for the records first..last that are `eligible` and not in a transition."""
        t = Transition("archive")
        floor = self._floor(first)
        for batch in self._between(floor.first if floor is not None else first, last):
            if batch.offsets is None and not (batch.first >= first and batch.last <= last):
                whole = batch.whole
                assert whole is not None
                if not eligible(whole) or whole.pending is not None:
                    continue
                batch.split()
            for lo, hi, st in batch.states():
                if lo >= first and hi <= last and eligible(st) and st.pending is None:
                    st.start(S.ARCHIVED, st.delivery_count)
                    t.add(lo, hi, st, batch)
        return t

    # ----- completion ---------------------------------------------------------------------
    def complete(self, t: Transition, durable: bool, now: int) -> bool:
        """The transition's records were made durable: keep the changes; or not: roll them back
        (an expired lock is expired again at the next `expire_locks`). Returns whether the SPSO moved."""
        return self._finish(t, durable, now)

    def _finish(self, t: Transition, commit: bool, now: int) -> bool:
        for _first, _last, st, batch in t.touched:
            st.complete(commit)
            if st.state is S.AVAILABLE:
                self._find_next = True
            elif st.state is S.ACQUIRED and st.deadline is not None and st.deadline <= now:
                heapq.heappush(self._locks, (st.deadline, next(self._seq), batch))
        return self._advance_start()

    def _advance_start(self) -> bool:
        """Move the SPSO over the ACKNOWLEDGED/ARCHIVED prefix; drop the batches wholly below it."""
        if not self._firsts:
            return False
        last_done = -1
        for batch in self.batches():
            if batch.offsets is None:
                whole = batch.whole
                assert whole is not None
                if whole.pending is not None or not whole.state.terminal:
                    break
                last_done = batch.last
                continue
            stop = False
            for offset, st in batch.offsets.items():
                if offset < self.start_offset:
                    continue
                if st.pending is not None or not st.state.terminal:
                    stop = True
                    break
                last_done = offset
            if stop:
                break
        if last_done < self.start_offset:
            return False
        drop = bisect.bisect_right(self._firsts, last_done)
        while drop and self._batches[self._firsts[drop - 1]].last > last_done:
            drop -= 1
        for key in self._firsts[:drop]:
            del self._batches[key]
        del self._firsts[:drop]
        if not self._firsts:
            self.start_offset = self.end_offset = last_done + 1
            return True
        following = self._batches[self._firsts[0]]
        self.start_offset = max(self.start_offset, last_done + 1 if following.first <= last_done else following.first)
        return True
